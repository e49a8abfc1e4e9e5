// cuda_errors.h — the numeric cudaError_t / cublasStatus_t values POS returns, without CUDA headers.
// The core builds with no CUDA toolkit; these constants match the toolkit's enums (checked in a test).
#pragma once

#include <cstdint>
#include <string_view>

namespace pos::cuda {

inline constexpr int32_t kSuccess = 0;
inline constexpr int32_t kErrorInvalidValue = 1;
inline constexpr int32_t kErrorMemoryAllocation = 2;
inline constexpr int32_t kErrorInitializationError = 3;
inline constexpr int32_t kErrorInvalidConfiguration = 9;
inline constexpr int32_t kErrorInvalidSymbol = 13;
inline constexpr int32_t kErrorInvalidDevicePointer = 17;
inline constexpr int32_t kErrorInvalidMemcpyDirection = 21;
inline constexpr int32_t kErrorDevicesUnavailable = 46;
inline constexpr int32_t kErrorInvalidDeviceFunction = 98;
inline constexpr int32_t kErrorNoDevice = 100;
inline constexpr int32_t kErrorInvalidDevice = 101;
inline constexpr int32_t kErrorInvalidKernelImage = 200;
inline constexpr int32_t kErrorEccUncorrectable = 214;  // also: a lazily restored buffer failed its checksum
inline constexpr int32_t kErrorInvalidResourceHandle = 400;
inline constexpr int32_t kErrorNotReady = 600;
inline constexpr int32_t kErrorIllegalAddress = 700;
inline constexpr int32_t kErrorLaunchOutOfResources = 701;
inline constexpr int32_t kErrorLaunchFailure = 719;
inline constexpr int32_t kErrorNotPermitted = 800;
inline constexpr int32_t kErrorNotSupported = 801;
inline constexpr int32_t kErrorUnknown = 999;

// cublasStatus_t
inline constexpr int32_t kCublasSuccess = 0;
inline constexpr int32_t kCublasNotInitialized = 1;
inline constexpr int32_t kCublasAllocFailed = 3;
inline constexpr int32_t kCublasInvalidValue = 7;
inline constexpr int32_t kCublasArchMismatch = 8;
inline constexpr int32_t kCublasMappingError = 11;
inline constexpr int32_t kCublasExecutionFailed = 13;
inline constexpr int32_t kCublasInternalError = 14;
inline constexpr int32_t kCublasNotSupported = 15;

// cudaMemcpyKind
inline constexpr int32_t kMemcpyHostToHost = 0;
inline constexpr int32_t kMemcpyHostToDevice = 1;
inline constexpr int32_t kMemcpyDeviceToHost = 2;
inline constexpr int32_t kMemcpyDeviceToDevice = 3;
inline constexpr int32_t kMemcpyDefault = 4;

// Flags the parser must understand.
inline constexpr uint32_t kStreamNonBlocking = 0x1;
inline constexpr uint32_t kEventBlockingSync = 0x1;
inline constexpr uint32_t kEventDisableTiming = 0x2;
inline constexpr uint32_t kEventInterprocess = 0x4;
inline constexpr uint64_t kStreamLegacy = 0x1;
inline constexpr uint64_t kStreamPerThread = 0x2;

// cudaMemoryType for cudaPointerGetAttributes
inline constexpr int32_t kMemoryTypeUnregistered = 0;
inline constexpr int32_t kMemoryTypeHost = 1;
inline constexpr int32_t kMemoryTypeDevice = 2;

std::string_view error_name(int32_t cuda_error);

}  // namespace pos::cuda
