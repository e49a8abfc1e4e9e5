// mlp_kernels.cuh — the MLP training job's CUDA kernels, written once for nvcc and for the host backend.
// mlp_train.cu launches them on a GPU (or through POS); mlp_host_kernels.cc and mlp_reference.cc compile them with g++.
//
// Rules that keep one source valid in both worlds: plain __global__ functions at global scope (their
// mangled names are the registry keys), no shared memory, barriers, atomics or __device__ globals (the
// host emulator runs one thread at a time), grid-stride loops over 64-bit indices (tensors can exceed
// 2^31 elements), and every reduction done by a single thread in a fixed order (deterministic anywhere).
#pragma once

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include "pos/backends/host/cuda_emulation.h"
// Several host translation units include these definitions (the host kernel library and the reference
// run, sometimes in one binary); inline makes them one COMDAT function instead of an ODR clash.
#pragma push_macro("__global__")
#undef __global__
#define __global__ inline
// g++ fuses a*b+c into an FMA whenever the target has one (-march=native), even in ISO C++ mode.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
// A program that runs POS in-process links nvcc's host stubs for these kernels, which carry the
// same mangled names: the host versions live in their own namespace so the two never collide (the
// host kernel library is keyed by the nvcc name strings, not by these symbols).
namespace mlp_host_kernels {
#endif

// A product that is never fused into a following add: nvcc contracts a*b+c into an FMA by default;
// __fmul_rn pins the GPU to the host's rounding for these expressions (and the pragma above pins g++).
__device__ __forceinline__ float mlp_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

__device__ __forceinline__ unsigned long long mlp_splitmix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ long long mlp_first_index() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long mlp_grid_stride() {
  return static_cast<long long>(blockDim.x) * gridDim.x;
}

// p[i] = uniform in [-scale, scale) from a counter-based hash of (seed, i): any launch geometry, and any
// device, yields the same bits, so tens of GiB of parameters are initialized without a host copy.
// The value is an exact 24-bit integer times 2^-23, then one rounding multiply by scale.
__global__ void mlp_init_uniform(float* p, long long n, unsigned long long seed, float scale) {
  for (long long i = mlp_first_index(); i < n; i += mlp_grid_stride()) {
    const unsigned long long h = mlp_splitmix64(seed ^ mlp_splitmix64(static_cast<unsigned long long>(i)));
    const long long centered = static_cast<long long>(h >> 40) - (1ll << 23);  // [-2^23, 2^23)
    const float unit = static_cast<float>(centered) * (1.0f / 8388608.0f);      // exact
    p[i] = mlp_mul(unit, scale);
  }
}

// Hidden layer epilogue, in place: act = max(act + bias[row], 0). act is rows x cols column-major.
__global__ void mlp_bias_relu_forward(float* act, const float* bias, int rows, int cols) {
  const long long n = static_cast<long long>(rows) * cols;
  for (long long i = mlp_first_index(); i < n; i += mlp_grid_stride()) {
    const float v = act[i] + bias[i % rows];
    act[i] = v > 0.0f ? v : 0.0f;
  }
}

// Output layer epilogue, in place: act += bias[row].
__global__ void mlp_bias_add_forward(float* act, const float* bias, int rows, int cols) {
  const long long n = static_cast<long long>(rows) * cols;
  for (long long i = mlp_first_index(); i < n; i += mlp_grid_stride()) {
    act[i] = act[i] + bias[i % rows];
  }
}

// grad *= (act > 0), where act is the ReLU's output (positive exactly where the input was).
__global__ void mlp_relu_backward(float* grad, const float* act, long long n) {
  for (long long i = mlp_first_index(); i < n; i += mlp_grid_stride()) {
    grad[i] = act[i] > 0.0f ? grad[i] : 0.0f;
  }
}

// db[r] = sum over the batch of delta[r, c], one thread per row, columns in order.
__global__ void mlp_bias_grad(float* db, const float* delta, int rows, int cols) {
  for (long long r = mlp_first_index(); r < rows; r += mlp_grid_stride()) {
    float acc = 0.0f;
    for (long long c = 0; c < cols; ++c) acc = acc + delta[r + c * rows];
    db[r] = acc;
  }
}

// MSE: grad = (out - target) * grad_scale (grad_scale = 2 / (rows*cols)), and the per-sample sum of
// squared errors. One thread per sample (column), rows in order.
__global__ void mlp_mse_output_grad(float* grad, float* sample_loss, const float* out, const float* target,
                                    int rows, int cols, float grad_scale) {
  for (long long c = mlp_first_index(); c < cols; c += mlp_grid_stride()) {
    float acc = 0.0f;
    for (long long r = 0; r < rows; ++r) {
      const long long i = r + c * rows;
      const float d = out[i] - target[i];
      grad[i] = mlp_mul(d, grad_scale);
      acc = acc + mlp_mul(d, d);
    }
    sample_loss[c] = acc;
  }
}

// *loss = scale * sum of sample_loss[0..cols), summed in order. Launched with grid 1, block 1, so the
// GPU sums in exactly the host's order.
__global__ void mlp_loss_sum(float* loss, const float* sample_loss, int cols, float scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  float acc = 0.0f;
  for (int c = 0; c < cols; ++c) acc = acc + sample_loss[c];
  *loss = mlp_mul(acc, scale);
}

// Plain SGD: w -= lr * g.
__global__ void mlp_sgd_update(float* w, const float* g, long long n, float lr) {
  for (long long i = mlp_first_index(); i < n; i += mlp_grid_stride()) {
    w[i] = w[i] - mlp_mul(lr, g[i]);
  }
}

#ifndef __CUDACC__
}  // namespace mlp_host_kernels
using namespace mlp_host_kernels;  // NOLINT: kernels read as plain names in host code
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
#pragma pop_macro("__global__")
#endif
