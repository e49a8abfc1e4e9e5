// driver_abi_test.cc — the driver layer spells the driver's ABI itself (remoting/driver/driver_api.h,
// placement.h) so that it builds without the toolkit; here, where the toolkit is, every struct,
// enum value and handle type it passes is checked against cuda.h, so a mismatch fails the build.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

// Ours first: cuda.h renames driver functions by macro (cuGetProcAddress → _v2), which would
// rename the hook table's entries too.
#include "remoting/driver/driver_api.h"
#include "remoting/driver/placement.h"
// Then the toolkit's.
#include <cuda.h>

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
static_assert(sizeof(d::CUipcMemHandle) == sizeof(CUipcMemHandle));
static_assert(sizeof(d::CUdeviceptr) == sizeof(CUdeviceptr));
static_assert(sizeof(d::CUmemGenericAllocationHandle) == sizeof(CUmemGenericAllocationHandle));
static_assert(sizeof(d::CUresult) == sizeof(CUresult));
static_assert(sizeof(d::CUdevice) == sizeof(CUdevice));
static_assert(sizeof(d::cuuint64_t) == sizeof(cuuint64_t));
static_assert(d::kSuccess == CUDA_SUCCESS && d::kErrorNotInitialized == CUDA_ERROR_NOT_INITIALIZED);
static_assert(d::kProcAddressPerThread == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == 1 && CU_MEM_LOCATION_TYPE_DEVICE == 1 &&
              CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3 && CU_MEM_ALLOC_GRANULARITY_MINIMUM == 0);

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
