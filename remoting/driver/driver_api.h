// driver_api.h — the CUDA driver entry points the in-process runtime intercepts, as one X-macro
// list with their exact C signatures; everything else a process resolves passes straight through.
//
// The list spells the driver's ABI with its own minimal types instead of including cuda.h: cuda.h
// renames functions by macro (cuMemAlloc → cuMemAlloc_v2, cuLaunchKernel → cuLaunchKernel_ptsz
// under per-thread streams), which would rename our definitions too, and the interception layer and
// its tests must build without the toolkit. Every type here has the ABI of the driver's (handles
// are pointers, enums are int, CUdeviceptr is unsigned long long); the signatures were taken from
// CUDA 13.0's cuda.h, and every exported name below exists in its libcuda stub (docs/driver_runtime.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pos::driver {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
using CUfunction = void*;
using CUmodule = void*;
using CUlibrary = void*;
using CUevent = void*;
using CUgraphExec = void*;
using CUgraph = void*;
using CUgraphNode = void*;
using CUcontext = void*;
using CUdevice = int;
using CUstreamCaptureMode = int;
struct CUipcMemHandle {  // passed by value: the layout must be the driver's (CU_IPC_HANDLE_SIZE bytes)
  char reserved[64];
};
using CUmemoryPool = void*;
using CUmemGenericAllocationHandle = unsigned long long;
using CUjit_option = int;
using CUlibraryOption = int;
using CUdriverProcAddressQueryResult = int;
using cuuint64_t = uint64_t;
struct CUlaunchConfig;       // only passed by pointer
struct CUgraphInstantiateParams;  // only passed by pointer (CUDA_GRAPH_INSTANTIATE_PARAMS)
struct CUgraphExecUpdateResultInfo;  // only passed by pointer
struct CUgraphNodeParams;            // only passed by pointer
struct CUmemAllocationProp;  // only passed by pointer
struct CUmemAccessDesc;      // only passed by pointer

inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorNotInitialized = 3;
inline constexpr CUresult kErrorOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY: what a job over its limit gets
inline constexpr uint64_t kProcAddressPerThread = 1u << 1;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

// What a hook does beyond counting its calls.
enum class Role : uint8_t {
  kCount,        // counted, then passed to the driver
  kDeviceAlloc,  // returns a device allocation through its first parameter (address, size = bytes)
  kDeviceFree,   // frees the device allocation named by its first parameter
  kLaunch,       // a kernel launch
  kProcAddress,  // cuGetProcAddress: its result is itself substituted
  kDeviceUse,    // uses the device named by its second parameter (a context for it)
};

// X(export name, base name, per-thread variant, lowest cudaVersion that resolves to it, role,
//   return type, (parameters), (arguments), index of the size argument or -1)
// `base name` is what cuGetProcAddress is asked for; `export name` is the versioned symbol the
// driver exports. The size index names the parameter holding the bytes of an allocation.
#define POS_DRIVER_HOOKS(X)                                                                                        \
  X(cuGetProcAddress, cuGetProcAddress, false, 0, kProcAddress, CUresult,                                         \
    (const char* symbol, void** pfn, int version, cuuint64_t flags), (symbol, pfn, version, flags), -1)            \
  X(cuGetProcAddress_v2, cuGetProcAddress, false, 12000, kProcAddress, CUresult,                                  \
    (const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status),      \
    (symbol, pfn, version, flags, status), -1)                                                                     \
  X(cuMemAlloc_v2, cuMemAlloc, false, 3020, kDeviceAlloc, CUresult, (CUdeviceptr * dptr, size_t bytes),           \
    (dptr, bytes), 1)                                                                                              \
  X(cuMemAllocPitch_v2, cuMemAllocPitch, false, 3020, kCount, CUresult,                                            \
    (CUdeviceptr * dptr, size_t* pitch, size_t width, size_t height, unsigned int elem),                          \
    (dptr, pitch, width, height, elem), -1)                                                                        \
  X(cuMemAllocManaged, cuMemAllocManaged, false, 6000, kDeviceAlloc, CUresult,                                     \
    (CUdeviceptr * dptr, size_t bytes, unsigned int flags), (dptr, bytes, flags), 1)                              \
  X(cuMemFree_v2, cuMemFree, false, 3020, kDeviceFree, CUresult, (CUdeviceptr dptr), (dptr), -1)                  \
  X(cuMemAllocAsync, cuMemAllocAsync, false, 11020, kDeviceAlloc, CUresult,                                        \
    (CUdeviceptr * dptr, size_t bytes, CUstream s), (dptr, bytes, s), 1)                                          \
  X(cuMemAllocAsync_ptsz, cuMemAllocAsync, true, 11020, kDeviceAlloc, CUresult,                                    \
    (CUdeviceptr * dptr, size_t bytes, CUstream s), (dptr, bytes, s), 1)                                          \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, false, 11020, kDeviceAlloc, CUresult,                        \
    (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream s), (dptr, bytes, pool, s), 1)                 \
  X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, true, 11020, kDeviceAlloc, CUresult,                    \
    (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream s), (dptr, bytes, pool, s), 1)                 \
  X(cuMemFreeAsync, cuMemFreeAsync, false, 11020, kDeviceFree, CUresult, (CUdeviceptr dptr, CUstream s),          \
    (dptr, s), -1)                                                                                                 \
  X(cuMemFreeAsync_ptsz, cuMemFreeAsync, true, 11020, kDeviceFree, CUresult, (CUdeviceptr dptr, CUstream s),      \
    (dptr, s), -1)                                                                                                 \
  X(cuMemCreate, cuMemCreate, false, 10020, kCount, CUresult,                                                      \
    (CUmemGenericAllocationHandle * h, size_t size, const CUmemAllocationProp* prop, unsigned long long flags),   \
    (h, size, prop, flags), -1)                                                                                    \
  X(cuMemRelease, cuMemRelease, false, 10020, kCount, CUresult, (CUmemGenericAllocationHandle h), (h), -1)        \
  X(cuMemMap, cuMemMap, false, 10020, kCount, CUresult,                                                            \
    (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags),      \
    (ptr, size, offset, h, flags), -1)                                                                             \
  X(cuMemUnmap, cuMemUnmap, false, 10020, kCount, CUresult, (CUdeviceptr ptr, size_t size), (ptr, size), -1)      \
  X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, false, 10020, kCount, CUresult,                    \
    (void* shareable, CUmemGenericAllocationHandle h, int type, unsigned long long flags), (shareable, h, type, flags), \
    -1)                                                                                                            \
  X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, false, 10020, kCount, CUresult,                \
    (CUmemGenericAllocationHandle * h, void* os_handle, int type), (h, os_handle, type), -1)                        \
  X(cuMemSetAccess, cuMemSetAccess, false, 10020, kCount, CUresult,                                                \
    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count), (ptr, size, desc, count), -1)      \
  X(cuMemPoolTrimTo, cuMemPoolTrimTo, false, 11020, kCount, CUresult, (CUmemoryPool pool, size_t keep),            \
    (pool, keep), -1)                                                                                              \
  X(cuMemGetInfo_v2, cuMemGetInfo, false, 3020, kCount, CUresult, (size_t * free_bytes, size_t * total_bytes),     \
    (free_bytes, total_bytes), -1)                                                                                 \
  X(cuMemAllocHost_v2, cuMemAllocHost, false, 3020, kCount, CUresult, (void** pp, size_t bytes), (pp, bytes), -1) \
  X(cuMemHostAlloc, cuMemHostAlloc, false, 2020, kCount, CUresult, (void** pp, size_t bytes, unsigned int flags), \
    (pp, bytes, flags), -1)                                                                                        \
  X(cuMemFreeHost, cuMemFreeHost, false, 2000, kCount, CUresult, (void* p), (p), -1)                               \
  X(cuLaunchKernel, cuLaunchKernel, false, 4000, kLaunch, CUresult,                                                \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,            \
     unsigned int bz, unsigned int smem, CUstream s, void** params, void** extra),                                 \
    (f, gx, gy, gz, bx, by, bz, smem, s, params, extra), -1)                                                       \
  X(cuLaunchKernel_ptsz, cuLaunchKernel, true, 7000, kLaunch, CUresult,                                            \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,            \
     unsigned int bz, unsigned int smem, CUstream s, void** params, void** extra),                                 \
    (f, gx, gy, gz, bx, by, bz, smem, s, params, extra), -1)                                                       \
  X(cuLaunchKernelEx, cuLaunchKernelEx, false, 11060, kLaunch, CUresult,                                           \
    (const CUlaunchConfig* config, CUfunction f, void** params, void** extra), (config, f, params, extra), -1)    \
  X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, true, 11060, kLaunch, CUresult,                                       \
    (const CUlaunchConfig* config, CUfunction f, void** params, void** extra), (config, f, params, extra), -1)    \
  X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, false, 9000, kLaunch, CUresult,                          \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,            \
     unsigned int bz, unsigned int smem, CUstream s, void** params),                                               \
    (f, gx, gy, gz, bx, by, bz, smem, s, params), -1)                                                              \
  X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, true, 9000, kLaunch, CUresult,                      \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,            \
     unsigned int bz, unsigned int smem, CUstream s, void** params),                                               \
    (f, gx, gy, gz, bx, by, bz, smem, s, params), -1)                                                              \
  X(cuModuleLoadData, cuModuleLoadData, false, 2000, kCount, CUresult, (CUmodule * m, const void* image),         \
    (m, image), -1)                                                                                                \
  X(cuModuleLoadDataEx, cuModuleLoadDataEx, false, 2010, kCount, CUresult,                                         \
    (CUmodule * m, const void* image, unsigned int n, CUjit_option* opts, void** vals), (m, image, n, opts, vals), \
    -1)                                                                                                            \
  X(cuModuleLoadFatBinary, cuModuleLoadFatBinary, false, 2000, kCount, CUresult,                                   \
    (CUmodule * m, const void* fatbin), (m, fatbin), -1)                                                           \
  X(cuModuleLoad, cuModuleLoad, false, 2000, kCount, CUresult, (CUmodule * m, const char* path), (m, path), -1)    \
  X(cuModuleUnload, cuModuleUnload, false, 2000, kCount, CUresult, (CUmodule m), (m), -1)                          \
  X(cuLibraryLoadFromFile, cuLibraryLoadFromFile, false, 12000, kCount, CUresult,                                  \
    (CUlibrary * lib, const char* path, CUjit_option* jit_opts, void** jit_vals, unsigned int n_jit,               \
     CUlibraryOption* lib_opts, void** lib_vals, unsigned int n_lib),                                              \
    (lib, path, jit_opts, jit_vals, n_jit, lib_opts, lib_vals, n_lib), -1)                                         \
  X(cuStreamBeginCapture_v2, cuStreamBeginCapture, false, 10010, kCount, CUresult,                               \
    (CUstream s, CUstreamCaptureMode mode), (s, mode), -1)                                                         \
  X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, true, 10010, kCount, CUresult,                           \
    (CUstream s, CUstreamCaptureMode mode), (s, mode), -1)                                                         \
  X(cuIpcGetMemHandle, cuIpcGetMemHandle, false, 4010, kCount, CUresult, (CUipcMemHandle * h, CUdeviceptr p),     \
    (h, p), -1)                                                                                                    \
  X(cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle, false, 11000, kCount, CUresult,                                     \
    (CUdeviceptr * p, CUipcMemHandle h, unsigned int flags), (p, h, flags), -1)                                    \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, false, 7000, kDeviceUse, CUresult,                        \
    (CUcontext * ctx, CUdevice dev), (ctx, dev), -1)                                                               \
  X(cuCtxSetCurrent, cuCtxSetCurrent, false, 4000, kCount, CUresult, (CUcontext ctx), (ctx), -1)                  \
  X(cuCtxPushCurrent_v2, cuCtxPushCurrent, false, 4000, kCount, CUresult, (CUcontext ctx), (ctx), -1)            \
  X(cuDeviceGetAttribute, cuDeviceGetAttribute, false, 2000, kCount, CUresult, (int* pi, int attrib, CUdevice dev), \
    (pi, attrib, dev), -1)                                                                                         \
  X(cuGraphLaunch, cuGraphLaunch, false, 10000, kCount, CUresult, (CUgraphExec g, CUstream s), (g, s), -1)        \
  X(cuGraphLaunch_ptsz, cuGraphLaunch, true, 10000, kCount, CUresult, (CUgraphExec g, CUstream s), (g, s), -1)    \
  X(cuGraphInstantiateWithFlags, cuGraphInstantiate, false, 12000, kCount, CUresult,                               \
    (CUgraphExec * e, CUgraph g, unsigned long long flags), (e, g, flags), -1)                                     \
  X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, false, 12000, kCount, CUresult,                   \
    (CUgraphExec * e, CUgraph g, CUgraphInstantiateParams * p), (e, g, p), -1)                                     \
  X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, true, 12000, kCount, CUresult,               \
    (CUgraphExec * e, CUgraph g, CUgraphInstantiateParams * p), (e, g, p), -1)                                     \
  X(cuGraphExecDestroy, cuGraphExecDestroy, false, 10000, kCount, CUresult, (CUgraphExec e), (e), -1)              \
  X(cuGraphExecUpdate, cuGraphExecUpdate, false, 10020, kCount, CUresult,                                          \
    (CUgraphExec e, CUgraph g, CUgraphNode * error_node, int* result), (e, g, error_node, result), -1)            \
  X(cuGraphExecUpdate_v2, cuGraphExecUpdate, false, 12000, kCount, CUresult,                                       \
    (CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo * info), (e, g, info), -1)                              \
  X(cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams, false, 10010, kCount, CUresult,                \
    (CUgraphExec e, CUgraphNode n, const void* p), (e, n, p), -1)                                                  \
  X(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams, false, 12000, kCount, CUresult,             \
    (CUgraphExec e, CUgraphNode n, const void* p), (e, n, p), -1)                                                  \
  X(cuGraphExecMemcpyNodeSetParams, cuGraphExecMemcpyNodeSetParams, false, 10020, kCount, CUresult,                \
    (CUgraphExec e, CUgraphNode n, const void* p, CUcontext c), (e, n, p, c), -1)                                  \
  X(cuGraphExecMemsetNodeSetParams, cuGraphExecMemsetNodeSetParams, false, 10020, kCount, CUresult,                \
    (CUgraphExec e, CUgraphNode n, const void* p, CUcontext c), (e, n, p, c), -1)                                  \
  X(cuGraphExecChildGraphNodeSetParams, cuGraphExecChildGraphNodeSetParams, false, 11010, kCount, CUresult,        \
    (CUgraphExec e, CUgraphNode n, CUgraph child), (e, n, child), -1)                                              \
  X(cuGraphExecBatchMemOpNodeSetParams, cuGraphExecBatchMemOpNodeSetParams, false, 11070, kCount, CUresult,        \
    (CUgraphExec e, CUgraphNode n, const void* p), (e, n, p), -1)                                                  \
  X(cuGraphExecNodeSetParams, cuGraphExecNodeSetParams, false, 12020, kCount, CUresult,                            \
    (CUgraphExec e, CUgraphNode n, CUgraphNodeParams * p), (e, n, p), -1)                                          \
  X(cuStreamSynchronize, cuStreamSynchronize, false, 2000, kCount, CUresult, (CUstream s), (s), -1)               \
  X(cuStreamSynchronize_ptsz, cuStreamSynchronize, true, 7000, kCount, CUresult, (CUstream s), (s), -1)           \
  X(cuEventSynchronize, cuEventSynchronize, false, 2000, kCount, CUresult, (CUevent e), (e), -1)                   \
  X(cuCtxSynchronize, cuCtxSynchronize, false, 2000, kCount, CUresult, (), (), -1)                                \
  X(cuCtxSynchronize_v2, cuCtxSynchronize, false, 13000, kCount, CUresult, (CUcontext ctx), (ctx), -1)            \
  X(cuLibraryLoadData, cuLibraryLoadData, false, 12000, kCount, CUresult,                                          \
    (CUlibrary * lib, const void* code, CUjit_option* jit_opts, void** jit_vals, unsigned int n_jit,               \
     CUlibraryOption* lib_opts, void** lib_vals, unsigned int n_lib),                                              \
    (lib, code, jit_opts, jit_vals, n_jit, lib_opts, lib_vals, n_lib), -1)                                         \
  X(cuLibraryUnload, cuLibraryUnload, false, 12000, kCount, CUresult, (CUlibrary lib), (lib), -1)                  \
  X(cuStreamCreate, cuStreamCreate, false, 2000, kCount, CUresult, (CUstream * s, unsigned int flags), (s, flags), \
    -1)                                                                                                            \
  X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, false, 5050, kCount, CUresult,                         \
    (CUstream * s, unsigned int flags, int priority), (s, flags, priority), -1)                                    \
  X(cuStreamDestroy_v2, cuStreamDestroy, false, 4000, kCount, CUresult, (CUstream s), (s), -1)                     \
  X(cuEventCreate, cuEventCreate, false, 2000, kCount, CUresult, (CUevent * e, unsigned int flags), (e, flags), -1) \
  X(cuEventDestroy_v2, cuEventDestroy, false, 4000, kCount, CUresult, (CUevent e), (e), -1)                        \
  X(cuMemcpyAsync, cuMemcpyAsync, false, 4000, kCount, CUresult,                                                   \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), -1)                                \
  X(cuMemcpyAsync_ptsz, cuMemcpyAsync, true, 7000, kCount, CUresult,                                               \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), -1)                                \
  X(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync, false, 3020, kCount, CUresult,                                        \
    (CUdeviceptr dst, const void* src, size_t n, CUstream s), (dst, src, n, s), -1)                                \
  X(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync, true, 7000, kCount, CUresult,                                    \
    (CUdeviceptr dst, const void* src, size_t n, CUstream s), (dst, src, n, s), -1)                                \
  X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, false, 3020, kCount, CUresult,                                        \
    (void* dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), -1)                                      \
  X(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync, true, 7000, kCount, CUresult,                                    \
    (void* dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), -1)                                      \
  X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync, false, 3020, kCount, CUresult,                                        \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), -1)                                \
  X(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync, true, 7000, kCount, CUresult,                                    \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), -1)                                \
  X(cuMemcpy, cuMemcpy, false, 4000, kCount, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), \
    -1)                                                                                                            \
  X(cuMemcpy_ptds, cuMemcpy, true, 7000, kCount, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n),          \
    (dst, src, n), -1)                                                                                             \
  X(cuMemcpyHtoD_v2, cuMemcpyHtoD, false, 3020, kCount, CUresult, (CUdeviceptr dst, const void* src, size_t n),   \
    (dst, src, n), -1)                                                                                             \
  X(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD, true, 7000, kCount, CUresult,                                              \
    (CUdeviceptr dst, const void* src, size_t n), (dst, src, n), -1)                                               \
  X(cuMemcpyDtoH_v2, cuMemcpyDtoH, false, 3020, kCount, CUresult, (void* dst, CUdeviceptr src, size_t n),         \
    (dst, src, n), -1)                                                                                             \
  X(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH, true, 7000, kCount, CUresult, (void* dst, CUdeviceptr src, size_t n),     \
    (dst, src, n), -1)                                                                                             \
  X(cuMemcpyDtoD_v2, cuMemcpyDtoD, false, 3020, kCount, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n),   \
    (dst, src, n), -1)                                                                                             \
  X(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD, true, 7000, kCount, CUresult,                                              \
    (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), -1)                                               \
  X(cuMemsetD8_v2, cuMemsetD8, false, 3020, kCount, CUresult, (CUdeviceptr dst, unsigned char v, size_t n),       \
    (dst, v, n), -1)                                                                                               \
  X(cuMemsetD8_v2_ptds, cuMemsetD8, true, 7000, kCount, CUresult, (CUdeviceptr dst, unsigned char v, size_t n),   \
    (dst, v, n), -1)                                                                                               \
  X(cuMemsetD32_v2, cuMemsetD32, false, 3020, kCount, CUresult, (CUdeviceptr dst, unsigned int v, size_t n),      \
    (dst, v, n), -1)                                                                                               \
  X(cuMemsetD32_v2_ptds, cuMemsetD32, true, 7000, kCount, CUresult, (CUdeviceptr dst, unsigned int v, size_t n),  \
    (dst, v, n), -1)                                                                                               \
  X(cuMemsetD8Async, cuMemsetD8Async, false, 3020, kCount, CUresult,                                               \
    (CUdeviceptr dst, unsigned char v, size_t n, CUstream s), (dst, v, n, s), -1)                                  \
  X(cuMemsetD8Async_ptsz, cuMemsetD8Async, true, 7000, kCount, CUresult,                                           \
    (CUdeviceptr dst, unsigned char v, size_t n, CUstream s), (dst, v, n, s), -1)                                  \
  X(cuMemsetD32Async, cuMemsetD32Async, false, 3020, kCount, CUresult,                                             \
    (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), (dst, v, n, s), -1)                                   \
  X(cuMemsetD32Async_ptsz, cuMemsetD32Async, true, 7000, kCount, CUresult,                                         \
    (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), (dst, v, n, s), -1)

// Dense ids, in list order.
enum class HookId : uint16_t {
#define POS_DRIVER_HOOK_ID(name, ...) name,
  POS_DRIVER_HOOKS(POS_DRIVER_HOOK_ID)
#undef POS_DRIVER_HOOK_ID
  kCount
};
inline constexpr size_t kHookCount = static_cast<size_t>(HookId::kCount);

// Whether a hook is a per-thread default stream variant (_ptsz / _ptds): its null stream is the
// calling thread's own.
constexpr bool per_thread_hook(HookId id) {
  switch (id) {
#define POS_DRIVER_HOOK_PT(name, base, per_thread, ...) \
  case HookId::name:                                    \
    return per_thread;
    POS_DRIVER_HOOKS(POS_DRIVER_HOOK_PT)
#undef POS_DRIVER_HOOK_PT
    default:
      return false;
  }
}

}  // namespace pos::driver
