// status.cc — Status helpers: names, formatting, and the CUDA-error → category mapping.
// Kept tiny: the hot path never builds a Status with a message.
#include "pos/base/status.h"

namespace pos {

std::string_view code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid-argument";
    case Code::kNotFound: return "not-found";
    case Code::kOutOfMemory: return "out-of-memory";
    case Code::kBusy: return "busy";
    case Code::kUnavailable: return "unavailable";
    case Code::kFailedPrecondition: return "failed-precondition";
    case Code::kOutOfRange: return "out-of-range";
    case Code::kNotReady: return "not-ready";
    case Code::kCorrupt: return "corrupt";
    case Code::kUnsupported: return "unsupported";
    case Code::kInternal: return "internal";
  }
  return "?";
}

Status Status::Cuda(int32_t e, std::string m) {
  Code c = Code::kInternal;
  switch (e) {
    case cuda::kSuccess: c = Code::kOk; break;
    case cuda::kErrorInvalidValue:
    case cuda::kErrorInvalidConfiguration:
    case cuda::kErrorInvalidMemcpyDirection:
    case cuda::kErrorInvalidDevicePointer:
    case cuda::kErrorInvalidDevice:
    case cuda::kErrorInvalidKernelImage: c = Code::kInvalidArgument; break;
    case cuda::kErrorMemoryAllocation: c = Code::kOutOfMemory; break;
    case cuda::kErrorInvalidResourceHandle:
    case cuda::kErrorInvalidSymbol:
    case cuda::kErrorInvalidDeviceFunction: c = Code::kNotFound; break;
    case cuda::kErrorNotReady: c = Code::kNotReady; break;
    case cuda::kErrorDevicesUnavailable: c = Code::kUnavailable; break;
    case cuda::kErrorIllegalAddress: c = Code::kOutOfRange; break;
    case cuda::kErrorNotSupported: c = Code::kUnsupported; break;
    case cuda::kErrorNotPermitted: c = Code::kFailedPrecondition; break;
    default: c = Code::kInternal; break;
  }
  return Status(c, e, std::move(m));
}

Status Status::Cublas(int32_t e, std::string m) {
  Code c = Code::kInternal;
  switch (e) {
    case cuda::kCublasSuccess: c = Code::kOk; break;
    case cuda::kCublasInvalidValue: c = Code::kInvalidArgument; break;
    case cuda::kCublasNotInitialized: c = Code::kNotFound; break;
    case cuda::kCublasAllocFailed: c = Code::kOutOfMemory; break;
    case cuda::kCublasNotSupported: c = Code::kUnsupported; break;
    default: c = Code::kInternal; break;
  }
  return Status(c, e, std::move(m));
}

const std::string& Status::empty_message() {
  static const std::string kEmpty;
  return kEmpty;
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string s(code_name(code_));
  s += " (api error ";
  s += std::to_string(api_error_);
  s += "): ";
  s += message();
  return s;
}

Status Status::with_context(std::string_view ctx) const {
  if (ok()) return *this;
  std::string m(ctx);
  m += ": ";
  m += message();
  return Status(code_, api_error_, std::move(m));
}

namespace cuda {
std::string_view error_name(int32_t e) {
  switch (e) {
    case kSuccess: return "cudaSuccess";
    case kErrorInvalidValue: return "cudaErrorInvalidValue";
    case kErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case kErrorInitializationError: return "cudaErrorInitializationError";
    case kErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case kErrorInvalidSymbol: return "cudaErrorInvalidSymbol";
    case kErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case kErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case kErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    case kErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case kErrorNoDevice: return "cudaErrorNoDevice";
    case kErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case kErrorInvalidKernelImage: return "cudaErrorInvalidKernelImage";
    case kErrorEccUncorrectable: return "cudaErrorECCUncorrectable";
    case kErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case kErrorNotReady: return "cudaErrorNotReady";
    case kErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case kErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case kErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case kErrorNotPermitted: return "cudaErrorNotPermitted";
    case kErrorNotSupported: return "cudaErrorNotSupported";
    case kErrorUnknown: return "cudaErrorUnknown";
    default: return "cudaError(unknown)";
  }
}
}  // namespace cuda

}  // namespace pos
