// handle_test.cc — handle managers: mocked allocation at final addresses, containment lookups,
// deletion states, range reuse and coalescing, opaque handle slots.
#include <gtest/gtest.h>

#include "pos/handle.h"

namespace pos {
namespace {

constexpr uint64_t kBase = 0x110000000000ull;

TEST(HandleManager, AllocatesDistinctGranularityAlignedRanges) {
  HandleManager m(ResourceType::kMemory, kBase, 1 << 30, 4096);
  auto a = m.allocate_mocked_resource(100, {}, 1);
  auto b = m.allocate_mocked_resource(5000, {}, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->client_addr, kBase);
  EXPECT_EQ((*a)->reserved_size, 4096u);
  EXPECT_EQ((*b)->client_addr, kBase + 4096);
  EXPECT_EQ((*b)->reserved_size, 8192u);
  EXPECT_EQ((*b)->created_pc, 2u);
  EXPECT_EQ(m.active_count(), 2u);
  EXPECT_EQ(m.bytes_reserved(), 12288u);
}

TEST(HandleManager, FindsTheBufferContainingAnyInteriorAddress) {
  HandleManager m(ResourceType::kMemory, kBase, 1 << 30, 4096);
  Handle* a = m.allocate_mocked_resource(100, {}, 1).value();
  Handle* b = m.allocate_mocked_resource(5000, {}, 2).value();
  uint64_t off = 0;
  EXPECT_EQ(m.find_containing(kBase + 99, &off), a);
  EXPECT_EQ(off, 99u);
  EXPECT_EQ(m.find_containing(kBase + 100, &off), nullptr);  // past the requested size
  EXPECT_EQ(m.find_containing(b->client_addr + 4999, &off), b);
  EXPECT_EQ(m.find_containing(kBase - 1, &off), nullptr);
  EXPECT_EQ(m.latest_used_handle(), b);
}

TEST(HandleManager, DeletedHandlesAreInvisibleAndReusedOnlyAfterRelease) {
  HandleManager m(ResourceType::kMemory, kBase, 1 << 30, 4096);
  Handle* a = m.allocate_mocked_resource(4000, {}, 1).value();
  m.mark_deleted(a);
  EXPECT_EQ(m.get(kBase), nullptr);
  EXPECT_EQ(m.find_containing(kBase, nullptr), nullptr);
  EXPECT_EQ(m.find_any_containing(kBase), a);  // still reserved: a double free is recognisable
  Handle* b = m.allocate_mocked_resource(4000, {}, 2).value();
  EXPECT_NE(b->client_addr, kBase);  // not reused while pending
  m.release(a);
  Handle* c = m.allocate_mocked_resource(4000, {}, 3).value();
  EXPECT_EQ(c->client_addr, kBase);
}

TEST(HandleManager, FreedNeighboursCoalesceIntoOneRange) {
  HandleManager m(ResourceType::kMemory, kBase, 16 * 4096, 4096);
  std::vector<Handle*> hs;
  for (int i = 0; i < 16; ++i) hs.push_back(m.allocate_mocked_resource(4000, {}, i).value());
  EXPECT_FALSE(m.allocate_mocked_resource(1, {}, 99).ok());  // full
  for (int i : {3, 5, 4}) {
    m.mark_deleted(hs[i]);
    m.release(hs[i]);
  }
  auto big = m.allocate_mocked_resource(3 * 4096 - 1, {}, 100);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)->client_addr, kBase + 3 * 4096);
}

TEST(HandleManager, ExhaustionIsAnAllocationError) {
  HandleManager m(ResourceType::kMemory, kBase, 8192, 4096);
  auto r = m.allocate_mocked_resource(1 << 20, {}, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().api_error(), cuda::kErrorMemoryAllocation);
  EXPECT_FALSE(m.allocate_mocked_resource(~0ull - 10, {}, 1).ok());  // overflow when rounding
}

TEST(HandleManager, OpaqueHandlesGetDistinctNonZeroSlots) {
  HandleManager m(ResourceType::kStream, kBase, 1 << 20, 1);
  Handle* a = m.allocate_mocked_resource(0, {}, 1).value();
  Handle* b = m.allocate_mocked_resource(0, {}, 2).value();
  EXPECT_NE(a->client_addr, 0u);
  EXPECT_NE(a->client_addr, b->client_addr);
  EXPECT_EQ(m.get(a->client_addr), a);
  EXPECT_EQ(m.get(a->client_addr + 1), nullptr);
}

TEST(HandleManager, AdoptAtPlacesAHandleAtAChosenFreeAddress) {
  HandleManager m(ResourceType::kMemory, kBase, 1 << 20, 4096);
  auto a = m.adopt_at(kBase + 8 * 4096, 4000, {}, 7);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(m.adopt_at(kBase + 8 * 4096, 4000, {}, 8).ok());
  auto b = m.allocate_mocked_resource(8 * 4096 - 1, {}, 9);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->client_addr, kBase);  // the gap before the adopted range is still usable
}

TEST(HandleManager, OnePastTheEndOfABufferIsNeverAnotherBuffersStart) {
  HandleManager m(ResourceType::kMemory, kBase, 1 << 20, 4096);
  Handle* a = m.allocate_mocked_resource(4096, {}, 1).value();
  Handle* b = m.allocate_mocked_resource(4096, {}, 2).value();
  EXPECT_EQ(a->reserved_size, 8192u);
  EXPECT_NE(a->client_addr + a->size, b->client_addr);
  EXPECT_EQ(m.find_containing(a->client_addr + a->size, nullptr), nullptr);
}

TEST(HandleManager, ParentsAreRecorded) {
  HandleManager mods(ResourceType::kModule, kBase, 1 << 20, 1);
  HandleManager fns(ResourceType::kFunction, kBase + (1 << 20), 1 << 20, 1);
  Handle* m = mods.allocate_mocked_resource(0, {}, 1).value();
  Handle* f = fns.allocate_mocked_resource(0, {m}, 2).value();
  ASSERT_EQ(f->parents.size(), 1u);
  EXPECT_EQ(f->parents[0], m);
  EXPECT_EQ(f->type, ResourceType::kFunction);
}

}  // namespace
}  // namespace pos
