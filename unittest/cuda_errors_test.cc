// cuda_errors_test.cc — POS's copies of cudaError_t / cublasStatus_t / flag values equal the
// toolkit's (the core is built without CUDA headers, so drift would silently change app behaviour).
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "pos/base/api_types.h"
#include "pos/base/cuda_errors.h"
#include "pos/base/status.h"

namespace pos {
namespace {

TEST(CudaErrors, RuntimeErrorCodesMatchTheToolkit) {
  EXPECT_EQ(cuda::kErrorInvalidValue, cudaErrorInvalidValue);
  EXPECT_EQ(cuda::kErrorMemoryAllocation, cudaErrorMemoryAllocation);
  EXPECT_EQ(cuda::kErrorInitializationError, cudaErrorInitializationError);
  EXPECT_EQ(cuda::kErrorInvalidConfiguration, cudaErrorInvalidConfiguration);
  EXPECT_EQ(cuda::kErrorInvalidSymbol, cudaErrorInvalidSymbol);
  EXPECT_EQ(cuda::kErrorInvalidDevicePointer, cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cuda::kErrorInvalidMemcpyDirection, cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cuda::kErrorDevicesUnavailable, cudaErrorDevicesUnavailable);
  EXPECT_EQ(cuda::kErrorInvalidDeviceFunction, cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cuda::kErrorNoDevice, cudaErrorNoDevice);
  EXPECT_EQ(cuda::kErrorInvalidDevice, cudaErrorInvalidDevice);
  EXPECT_EQ(cuda::kErrorInvalidKernelImage, cudaErrorInvalidKernelImage);
  EXPECT_EQ(cuda::kErrorEccUncorrectable, cudaErrorECCUncorrectable);
  EXPECT_EQ(cuda::kErrorInvalidResourceHandle, cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cuda::kErrorNotReady, cudaErrorNotReady);
  EXPECT_EQ(cuda::kErrorIllegalAddress, cudaErrorIllegalAddress);
  EXPECT_EQ(cuda::kErrorLaunchOutOfResources, cudaErrorLaunchOutOfResources);
  EXPECT_EQ(cuda::kErrorLaunchFailure, cudaErrorLaunchFailure);
  EXPECT_EQ(cuda::kErrorNotPermitted, cudaErrorNotPermitted);
  EXPECT_EQ(cuda::kErrorNotSupported, cudaErrorNotSupported);
  EXPECT_EQ(cuda::kErrorUnknown, cudaErrorUnknown);
}

TEST(CudaErrors, CublasStatusAndEnumsMatchTheToolkit) {
  EXPECT_EQ(cuda::kCublasNotInitialized, CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cuda::kCublasAllocFailed, CUBLAS_STATUS_ALLOC_FAILED);
  EXPECT_EQ(cuda::kCublasInvalidValue, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cuda::kCublasArchMismatch, CUBLAS_STATUS_ARCH_MISMATCH);
  EXPECT_EQ(cuda::kCublasMappingError, CUBLAS_STATUS_MAPPING_ERROR);
  EXPECT_EQ(cuda::kCublasExecutionFailed, CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(cuda::kCublasInternalError, CUBLAS_STATUS_INTERNAL_ERROR);
  EXPECT_EQ(cuda::kCublasNotSupported, CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(kCudaR32F, CUDA_R_32F);
  EXPECT_EQ(kCublasCompute32F, CUBLAS_COMPUTE_32F);
  EXPECT_EQ(kCublasCompute32FFastTF32, CUBLAS_COMPUTE_32F_FAST_TF32);
  EXPECT_EQ(kCublasTF32TensorOpMath, CUBLAS_TF32_TENSOR_OP_MATH);
  EXPECT_EQ(static_cast<int>(cuda::kStreamNonBlocking), cudaStreamNonBlocking);
  EXPECT_EQ(static_cast<int>(cuda::kEventDisableTiming), cudaEventDisableTiming);
  EXPECT_EQ(static_cast<int>(cuda::kEventInterprocess), cudaEventInterprocess);
  EXPECT_EQ(cuda::kMemcpyDefault, cudaMemcpyDefault);
  EXPECT_EQ(cuda::kMemoryTypeDevice, cudaMemoryTypeDevice);
}

TEST(CudaErrors, StatusCarriesTheApiErrorAndACategory) {
  Status s = Status::Cuda(cuda::kErrorMemoryAllocation, "out of memory");
  EXPECT_EQ(s.code(), Code::kOutOfMemory);
  EXPECT_EQ(s.api_error(), cudaErrorMemoryAllocation);
  Status c = s.with_context("cudaMalloc");
  EXPECT_EQ(c.message(), "cudaMalloc: out of memory");
  EXPECT_EQ(c.api_error(), s.api_error());
  EXPECT_TRUE(Status::Cuda(0, "").ok());
  EXPECT_EQ(Status::Cublas(cuda::kCublasInvalidValue, "x").code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace pos
