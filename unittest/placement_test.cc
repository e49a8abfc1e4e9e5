// placement_test.cc — what a cut learns from Placement (remoting/driver/placement.h) about the order
// the job will touch its allocations in, against a stub driver that grants every VMM call.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "remoting/driver/placement.h"
#include "remoting/driver/snapshot.h"

namespace pos::driver {
namespace {

CUresult get_device(CUdevice* d) {
  *d = 0;
  return kSuccess;
}
CUresult reserve(CUdeviceptr* p, size_t, size_t, CUdeviceptr addr, unsigned long long) {
  *p = addr;
  return kSuccess;
}
CUresult address_free(CUdeviceptr, size_t) { return kSuccess; }
CUresult create(CUmemGenericAllocationHandle* h, size_t, const CUmemAllocationProp*, unsigned long long) {
  static CUmemGenericAllocationHandle next = 1;
  *h = next++;
  return kSuccess;
}
CUresult release(CUmemGenericAllocationHandle) { return kSuccess; }
CUresult map(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) { return kSuccess; }
CUresult unmap(CUdeviceptr, size_t) { return kSuccess; }
CUresult set_access(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { return kSuccess; }
CUresult granularity(size_t* g, const CUmemAllocationProp*, int) {
  *g = 2 << 20;
  return kSuccess;
}
CUresult synchronize() { return kSuccess; }

VmmCalls stub() {
  VmmCalls c;
  c.ctx_get_device = get_device;
  c.reserve = reserve;
  c.address_free = address_free;
  c.create = create;
  c.release = release;
  c.map = map;
  c.unmap = unmap;
  c.set_access = set_access;
  c.granularity = granularity;
  c.synchronize = synchronize;
  return c;
}

// The allocations (by index into `at`) in the order a cut's copies would take them.
std::vector<int> copy_order(Placement& p, const std::vector<CUdeviceptr>& at) {
  const std::vector<Placement::Region> regions = p.cut();
  std::vector<int> out;
  for (size_t i : CopyAhead::copy_order(regions))
    out.push_back(static_cast<int>(std::find(at.begin(), at.end(), regions[i].addr) - at.begin()));
  return out;
}

TEST(Placement, ACutExpectsTheJobToTouchItsAllocationsInTheOrderItsPreviousStepFirstTouchedThem) {
  Placement p(stub(), uint64_t{1} << 45, uint64_t{1} << 36);
  std::vector<CUdeviceptr> at(4);
  bool placed = false;
  for (auto& a : at) ASSERT_EQ(p.alloc(&a, 4 << 20, &placed), kSuccess);
  ASSERT_TRUE(placed);
  // A step: C and A first (A twice), then D, then B; the step ends by waiting for the device.
  const auto touch = [&](int i) {
    const uint64_t w = at[i] + 4096;
    p.mark_written(&w, 1);
  };
  p.new_epoch();
  for (int i : {2, 0, 3, 0, 1}) touch(i);
  p.new_epoch();
  // Cut at the step's end: the next step will touch them as this one did.
  EXPECT_EQ(copy_order(p, at), (std::vector<int>{2, 0, 3, 1}));
  // Halfway through the next step (C, then A, touched again; by a range and by a launch): D and B
  // come next, then what this step touched already, in its order the step before.
  const uint64_t c = at[2];
  p.mark_range_written(c, 100);
  touch(0);
  EXPECT_EQ(copy_order(p, at), (std::vector<int>{3, 1, 2, 0}));
  // A step in another order is the next cut's guide: B, D, A, C.
  p.new_epoch();
  for (int i : {1, 3, 0, 2}) touch(i);
  p.new_epoch();
  EXPECT_EQ(copy_order(p, at), (std::vector<int>{1, 3, 0, 2}));
  // Everything touched at once (an unreadable launch): one touch, in address order.
  p.new_epoch();
  p.mark_all_written();
  p.new_epoch();
  EXPECT_EQ(copy_order(p, at), (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace pos::driver
