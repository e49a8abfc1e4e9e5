// cuda_emulation.h — lets a kernel source written for nvcc compile with g++ into the host kernel library.
// Include it (instead of CUDA headers) only when !__CUDACC__; kernels must not use shared memory or barriers.
#pragma once

#ifndef __CUDACC__
#include "pos/backends/host/host_kernels.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__

using dim3 = ::pos::host::emu::Dim3;
using ::pos::host::emu::blockDim;
using ::pos::host::emu::blockIdx;
using ::pos::host::emu::gridDim;
using ::pos::host::emu::threadIdx;
#endif
