// fake_cuda.h — the fake driver's kernels (unittest/fake_cuda.cc), shared with the probe that
// launches them: a "function handle" is a pointer to a FakeKernel, which says its parameter layout
// and, when launched, writes one 4 KiB page at the device address it is given; and the parameters
// of the kernel nodes of its CUDA graphs.
#pragma once

#include <cstdint>

// kFakeFunc: cuFuncGetParamInfo answers; kFakeKernel: only cuKernelGetParamInfo does (a CUkernel
// launched as a function); anything else: neither answers (no layout).
inline constexpr uint32_t kFakeFunc = 0x46554e43, kFakeKernel = 0x4b45524e;

struct FakeKernel {
  uint32_t magic;
  uint32_t n;             // parameters
  uint32_t off[8], size[8];
  // Where a launch finds what it writes: the device address at byte ptr_at of parameter ptr_param
  // (or of the `extra` buffer), and the byte value at byte val_at of parameter val_param (or of the
  // buffer). ptr_param < 0: the kernel writes nothing.
  int32_t ptr_param;
  uint32_t ptr_at;
  int32_t val_param;
  uint32_t val_at;
};

// CUDA_KERNEL_NODE_PARAMS_v2's layout: the fake's graph calls and the probe that makes graphs.
struct FakeKernelNodeParams {
  void* func;
  unsigned grid[3], block[3], shared_bytes;
  void** kernel_params;
  void** extra;
  void* kern;
  void* ctx;
};
