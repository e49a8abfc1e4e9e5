// test_kernels.h — small kernels the API tests launch, written once for nvcc and the host library.
// Their mangled names are what nvcc emits for these signatures (host and GPU suites share them).
#pragma once

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include "pos/backends/host/cuda_emulation.h"
#endif

struct ScaleArgs {
  float* data;  // a pointer inside a struct parameter: the parser must find it
  int n;
  float factor;
};
#ifndef __CUDACC__
// The host library runs the kernel inside posd: its launch check must know the member is a pointer.
POS_HOST_POINTER_MEMBERS(ScaleArgs, offsetof(ScaleArgs, data));
#endif

// Definitions only where kernels are compiled (test_kernels.cc, or an nvcc build of them).
#if defined(POS_TEST_KERNELS_DEFINE) || defined(__CUDACC__)
#ifndef __CUDACC__
namespace pos_test_kernels {  // host versions must not collide with nvcc stubs of the same name
#endif
__global__ void test_axpy(float* y, const float* x, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void test_scale_struct(ScaleArgs args) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < args.n) args.data[i] *= args.factor;
}

__global__ void test_fill(unsigned* out, unsigned value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + static_cast<unsigned>(i);
}

__global__ void test_noop(int) {}

// A hostile tenant's kernels: they compute an address (here: undo an XOR) from an integer, which no
// parameter check can see (docs/isolation.md). Only a boundary around the session (its own process
// and context) holds.
#define POS_TEST_HIDE_MASK 0xffff000000000000ull
__global__ void test_peek(unsigned* out, unsigned long long hidden, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = reinterpret_cast<const volatile unsigned*>(hidden ^ POS_TEST_HIDE_MASK)[i];
}

__global__ void test_poke(unsigned long long hidden, unsigned value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) reinterpret_cast<volatile unsigned*>(hidden ^ POS_TEST_HIDE_MASK)[i] = value;
}

// Writes to the address it is given (the tests give 8): an illegal address on a GPU, a segmentation
// fault on the host backend (so it runs only where its session has a process of its own).
__global__ void test_fault(int at) { *reinterpret_cast<volatile int*>(static_cast<unsigned long long>(at)) = 1; }
#ifdef __CUDACC__
__device__ float coeffs[16];  // the symbol-copy tests' variable (the host backend just allocates it)
#endif
#ifndef __CUDACC__
}  // namespace pos_test_kernels
using namespace pos_test_kernels;  // NOLINT
#endif
#endif

inline constexpr const char* kTestAxpyName = "_Z9test_axpyPfPKffi";
inline constexpr const char* kTestScaleStructName = "_Z17test_scale_struct9ScaleArgs";
inline constexpr const char* kTestFillName = "_Z9test_fillPjji";
inline constexpr const char* kTestNoopName = "_Z9test_noopi";
// test_peek / test_poke take an address XORed with this.
inline constexpr unsigned long long kTestHideMask = 0xffff000000000000ull;
inline constexpr const char* kTestPeekName = "_Z9test_peekPjyi";
inline constexpr const char* kTestPokeName = "_Z9test_pokeyji";
inline constexpr const char* kTestFaultName = "_Z10test_faulti";
