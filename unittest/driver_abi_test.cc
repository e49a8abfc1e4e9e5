// driver_abi_test.cc — the driver layer spells the driver's ABI itself (remoting/driver/driver_api.h,
// placement.h) so that it builds without the toolkit; here, where the toolkit is, every struct,
// enum value and handle type it passes is checked against cuda.h, so a mismatch fails the build.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

// Ours first: cuda.h renames driver functions by macro (cuGetProcAddress → _v2), which would
// rename the hook table's entries too.
#include "remoting/driver/driver_api.h"
#include "remoting/driver/graph_touches.h"
#include "remoting/driver/placement.h"
#include "remoting/driver/snapshot.h"
// Then the toolkit's, declaring every versioned export by its own name (cuMemAlloc_v2,
// cuLaunchKernel_ptsz, cuGetProcAddress and cuGetProcAddress_v2), as the driver exports them.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <type_traits>

namespace d = pos::driver;

#define SAME_LAYOUT(ours, theirs, ...) static_assert(offsetof(ours, __VA_ARGS__) == offsetof(theirs, __VA_ARGS__))
static_assert(sizeof(d::CUmemLocation) == sizeof(CUmemLocation));
SAME_LAYOUT(d::CUmemLocation, CUmemLocation, type);
SAME_LAYOUT(d::CUmemLocation, CUmemLocation, id);
static_assert(sizeof(d::CUmemAllocationProp) == sizeof(CUmemAllocationProp));
SAME_LAYOUT(d::CUmemAllocationProp, CUmemAllocationProp, type);
SAME_LAYOUT(d::CUmemAllocationProp, CUmemAllocationProp, requestedHandleTypes);
SAME_LAYOUT(d::CUmemAllocationProp, CUmemAllocationProp, location);
SAME_LAYOUT(d::CUmemAllocationProp, CUmemAllocationProp, win32HandleMetaData);
SAME_LAYOUT(d::CUmemAllocationProp, CUmemAllocationProp, allocFlags);
static_assert(sizeof(d::CUmemAccessDesc) == sizeof(CUmemAccessDesc));
SAME_LAYOUT(d::CUmemAccessDesc, CUmemAccessDesc, location);
SAME_LAYOUT(d::CUmemAccessDesc, CUmemAccessDesc, flags);
// What graph_touches.h reads from a graph's nodes.
static_assert(sizeof(d::KernelNodeParams) == sizeof(CUDA_KERNEL_NODE_PARAMS_v2));
SAME_LAYOUT(d::KernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, func);
static_assert(offsetof(d::KernelNodeParams, grid) == offsetof(CUDA_KERNEL_NODE_PARAMS_v2, gridDimX));
static_assert(offsetof(d::KernelNodeParams, shared_bytes) == offsetof(CUDA_KERNEL_NODE_PARAMS_v2, sharedMemBytes));
static_assert(offsetof(d::KernelNodeParams, kernel_params) == offsetof(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams));
SAME_LAYOUT(d::KernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, extra);
SAME_LAYOUT(d::KernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, kern);
SAME_LAYOUT(d::KernelNodeParams, CUDA_KERNEL_NODE_PARAMS_v2, ctx);
static_assert(sizeof(d::Memcpy3D) == sizeof(CUDA_MEMCPY3D));
static_assert(offsetof(d::Memcpy3D, dst_x_bytes) == offsetof(CUDA_MEMCPY3D, dstXInBytes) &&
              offsetof(d::Memcpy3D, dst_y) == offsetof(CUDA_MEMCPY3D, dstY) &&
              offsetof(d::Memcpy3D, dst_z) == offsetof(CUDA_MEMCPY3D, dstZ) &&
              offsetof(d::Memcpy3D, dst_memory_type) == offsetof(CUDA_MEMCPY3D, dstMemoryType) &&
              offsetof(d::Memcpy3D, dst_host) == offsetof(CUDA_MEMCPY3D, dstHost) &&
              offsetof(d::Memcpy3D, dst_device) == offsetof(CUDA_MEMCPY3D, dstDevice) &&
              offsetof(d::Memcpy3D, dst_pitch) == offsetof(CUDA_MEMCPY3D, dstPitch) &&
              offsetof(d::Memcpy3D, dst_height) == offsetof(CUDA_MEMCPY3D, dstHeight) &&
              offsetof(d::Memcpy3D, width_bytes) == offsetof(CUDA_MEMCPY3D, WidthInBytes) &&
              offsetof(d::Memcpy3D, height) == offsetof(CUDA_MEMCPY3D, Height) &&
              offsetof(d::Memcpy3D, depth) == offsetof(CUDA_MEMCPY3D, Depth));
static_assert(sizeof(d::MemsetNodeParams) == sizeof(CUDA_MEMSET_NODE_PARAMS));
static_assert(offsetof(d::MemsetNodeParams, dst) == offsetof(CUDA_MEMSET_NODE_PARAMS, dst) &&
              offsetof(d::MemsetNodeParams, pitch) == offsetof(CUDA_MEMSET_NODE_PARAMS, pitch) &&
              offsetof(d::MemsetNodeParams, element_size) == offsetof(CUDA_MEMSET_NODE_PARAMS, elementSize) &&
              offsetof(d::MemsetNodeParams, width) == offsetof(CUDA_MEMSET_NODE_PARAMS, width) &&
              offsetof(d::MemsetNodeParams, height) == offsetof(CUDA_MEMSET_NODE_PARAMS, height));
static_assert(d::kNodeKernel == CU_GRAPH_NODE_TYPE_KERNEL && d::kNodeMemcpy == CU_GRAPH_NODE_TYPE_MEMCPY &&
              d::kNodeMemset == CU_GRAPH_NODE_TYPE_MEMSET && d::kNodeHost == CU_GRAPH_NODE_TYPE_HOST &&
              d::kNodeChildGraph == CU_GRAPH_NODE_TYPE_GRAPH && d::kNodeEmpty == CU_GRAPH_NODE_TYPE_EMPTY &&
              d::kNodeWaitEvent == CU_GRAPH_NODE_TYPE_WAIT_EVENT && d::kNodeEventRecord == CU_GRAPH_NODE_TYPE_EVENT_RECORD &&
              d::kNodeSemaphoreSignal == CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL &&
              d::kNodeSemaphoreWait == CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT && d::kNodeMemAlloc == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
              d::kNodeMemFree == CU_GRAPH_NODE_TYPE_MEM_FREE);
static_assert(d::kMemoryHost == CU_MEMORYTYPE_HOST && d::kMemoryDevice == CU_MEMORYTYPE_DEVICE &&
              d::kMemoryUnified == CU_MEMORYTYPE_UNIFIED);
static_assert(sizeof(d::CUipcMemHandle) == sizeof(CUipcMemHandle));
static_assert(sizeof(d::CUdeviceptr) == sizeof(CUdeviceptr));
static_assert(sizeof(d::CUmemGenericAllocationHandle) == sizeof(CUmemGenericAllocationHandle));
static_assert(sizeof(d::CUresult) == sizeof(CUresult));
static_assert(sizeof(d::CUdevice) == sizeof(CUdevice));
static_assert(sizeof(d::cuuint64_t) == sizeof(cuuint64_t));
static_assert(d::kSuccess == CUDA_SUCCESS && d::kErrorNotInitialized == CUDA_ERROR_NOT_INITIALIZED);
static_assert(d::kProcAddressPerThread == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
static_assert(offsetof(CUlaunchConfig, hStream) == d::kLaunchConfigStreamOffset);
static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == 1 && CU_MEM_LOCATION_TYPE_DEVICE == 1 &&
              CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3 && CU_MEM_ALLOC_GRANULARITY_MINIMUM == 0);

// Every hook's signature against cuda.h's declaration of the export it stands in for: the same
// number of parameters, and each parameter and the result passed alike (same size; pointer,
// integer/enum or struct alike). The layer spells handles as void* and enums as int: same ABI.
namespace pos::driver {
template <typename A, typename B>
constexpr bool same_arg() {
  if constexpr (std::is_pointer_v<A> || std::is_pointer_v<B>) return std::is_pointer_v<A> && std::is_pointer_v<B>;
  else if constexpr (std::is_class_v<A> || std::is_class_v<B>) return std::is_class_v<A> && std::is_class_v<B> && sizeof(A) == sizeof(B);
  else return sizeof(A) == sizeof(B) && (std::is_integral_v<A> || std::is_enum_v<A>) == (std::is_integral_v<B> || std::is_enum_v<B>);
}
template <typename F, typename G>
struct SameAbi;
template <typename R1, typename... A1, typename R2, typename... A2>
struct SameAbi<R1 (*)(A1...), R2 (*)(A2...)> {
  static constexpr bool check() {
    if constexpr (sizeof...(A1) != sizeof...(A2)) return false;
    else return same_arg<R1, R2>() && (same_arg<A1, A2>() && ...);
  }
};
#define POS_ABI_CHECK(name, base, per_thread, min_version, role, R, params, args, size_idx) \
  static_assert(SameAbi<R(*) params, decltype(&::name)>::check(), #name ": the hook's signature is not cuda.h's");
POS_DRIVER_HOOKS(POS_ABI_CHECK)
#undef POS_ABI_CHECK
}  // namespace pos::driver

TEST(DriverAbi, TheLayersStructsAndConstantsAreTheDriversAsCudaHDeclaresThem) {
  d::CUmemAllocationProp p{};
  p.type = 1;
  p.location.type = 1;
  p.location.id = 3;
  CUmemAllocationProp q{};
  static_assert(sizeof(p) == sizeof(q));
  std::memcpy(&q, &p, sizeof(p));
  EXPECT_EQ(q.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(q.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(q.location.id, 3);
}

TEST(DriverAbi, ThePerThreadStreamHandleIsTheOneCudaHDefines) { EXPECT_EQ(d::kPerThreadStream, CU_STREAM_PER_THREAD); }
