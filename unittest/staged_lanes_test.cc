// staged_lanes_test.cc — the checkpoint copier's lanes (pos/backends/staged_lanes.h) against a fake
// device whose DMAs run only when their lane waits for them (the latest a stream may run them):
// a slot read before its fence, or reused before it was read, shows as wrong bytes. Faults at any
// call must fail the batch with that error and leave no lane with a DMA queued.
#include "pos/backends/staged_lanes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "pos/backends/staged_copy.h"
#include "pos/base/cuda_errors.h"

namespace pos {
namespace {

class FakeLanes final : public LaneDevice {
 public:
  static constexpr uint64_t kBase = 0x7000000000;
  FakeLanes(uint64_t bytes, unsigned lanes, bool lazy) : mem(bytes), queues_(lanes), lazy_(lazy) {
    for (uint64_t i = 0; i < bytes; ++i) mem[i] = static_cast<uint8_t>(i * 13 + i / 509 + 1);
  }

  Status enter(unsigned) override {
    std::lock_guard<std::mutex> lk(mu_);
    threads_.insert(std::this_thread::get_id());
    return maybe_fail();
  }
  Status to_host(unsigned lane, void* slot, uint64_t src, uint64_t n) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    if (src < kBase || src + n > kBase + mem.size()) return Status::InvalidArgument("copy outside the fake device");
    dmas.fetch_add(1);
    return push(lane, Op{false, slot, src, n, 0});
  }
  Status fence(unsigned lane, unsigned slot) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    return push(lane, Op{true, nullptr, 0, 0, slot});
  }
  Status wait(unsigned lane, unsigned slot) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    auto& q = queues_[lane];
    size_t last = q.size();
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i].fence && q[i].index == slot) last = i;
    if (last == q.size()) return Status::Ok();
    for (size_t i = 0; i <= last; ++i) run_front(lane);
    return Status::Ok();
  }
  Status drain(unsigned lane) override {
    while (!queues_[lane].empty()) run_front(lane);
    return Status::Ok();
  }
  size_t queued() const {
    size_t n = 0;
    for (const auto& q : queues_) n += q.size();
    return n;
  }
  size_t threads_seen() {
    std::lock_guard<std::mutex> lk(mu_);
    return threads_.size();
  }

  std::vector<uint8_t> mem;
  std::atomic<int> fail_at{-1};
  std::atomic<int> calls{0};
  std::atomic<int> dmas{0};

 private:
  struct Op {
    bool fence;
    void* slot;     // a DMA's destination
    uint64_t src, n;
    unsigned index;  // a fence's slot
  };
  Status push(unsigned lane, Op o) {
    if (!lazy_ && !o.fence) {
      std::memcpy(o.slot, mem.data() + (o.src - kBase), o.n);
      return Status::Ok();
    }
    queues_[lane].push_back(o);
    return Status::Ok();
  }
  void run_front(unsigned lane) {
    Op o = queues_[lane].front();
    queues_[lane].pop_front();
    if (!o.fence) std::memcpy(o.slot, mem.data() + (o.src - kBase), o.n);
  }
  Status maybe_fail() {
    if (calls.fetch_add(1) == fail_at.load()) return Status::Cuda(cuda::kErrorIllegalAddress, "injected device fault");
    return Status::Ok();
  }

  std::vector<std::deque<Op>> queues_;
  const bool lazy_;
  std::mutex mu_;
  std::set<std::thread::id> threads_;
};

struct Slots {
  Slots(unsigned lanes, uint64_t bytes) : bytes_(2ull * lanes * bytes) {
    for (unsigned i = 0; i < 2 * lanes; ++i) ptrs.push_back(bytes_.data() + i * bytes);
  }
  std::vector<std::byte> bytes_;
  std::vector<std::byte*> ptrs;
};

// Host spans at odd offsets and lengths, covering the device's bytes in a shuffled order.
std::vector<HostSpan> spans_over(std::vector<std::byte>& host, uint64_t bytes) {
  std::vector<HostSpan> s;
  const uint64_t cuts[] = {0, 3, 70001, 70001, 300000, 1000003, bytes};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const uint64_t a = std::min(cuts[i], bytes), b = std::min(cuts[i + 1], bytes);
    s.push_back(HostSpan{host.data() + 5 + a, FakeLanes::kBase + a, b - a});  // +5: unaligned host
  }
  std::swap(s[1], s[4]);
  return s;
}

TEST(StagedLanes, CopyEveryByteOfEverySpanWithAnyNumberOfLanesWhetherDmasRunEarlyOrLate) {
  const uint64_t bytes = 1'600'000, slot = 64 << 10;
  for (bool lazy : {true, false})
    for (unsigned lanes : {1u, 2u, 3u, 8u}) {
      FakeLanes dev(bytes, lanes, lazy);
      Slots slots(lanes, slot);
      StagedLanes sl(lanes, slots.ptrs, slot);
      for (int round = 0; round < 2; ++round) {  // the same lanes again: helpers are reused
        std::vector<std::byte> host(bytes + 16, std::byte{0xee});
        auto spans = spans_over(host, bytes);
        ASSERT_TRUE(sl.d2h(dev, spans).ok());
        EXPECT_EQ(std::memcmp(host.data() + 5, dev.mem.data(), bytes), 0) << "lanes " << lanes << " lazy " << lazy;
        EXPECT_EQ(host[4], std::byte{0xee});  // nothing written outside the spans
        EXPECT_EQ(host[5 + bytes], std::byte{0xee});
        EXPECT_EQ(dev.queued(), 0u);
      }
      EXPECT_EQ(sl.helpers_started(), lanes - 1);
      EXPECT_LE(dev.threads_seen(), lanes);
    }
}

TEST(StagedLanes, PiecesNeverCrossASlotBoundaryOfHostAddressesNorExceedASlot) {
  const uint64_t slot = 1 << 16;
  alignas(1 << 16) static std::byte host[5 << 16];
  const HostSpan spans[] = {{host + 100, 0x1000, 3 * slot}, {host + 4 * slot, 0x900000, 0}, {host + 4 * slot + 7, 0x50000, 9}};
  const auto pieces = StagedLanes::plan(spans, slot);
  uint64_t total = 0;
  for (const HostSpan& p : pieces) {
    const uint64_t a = reinterpret_cast<uintptr_t>(p.host);
    EXPECT_GT(p.n, 0u);
    EXPECT_LE(p.n, slot);
    EXPECT_EQ(a / slot, (a + p.n - 1) / slot) << "piece at " << a << " of " << p.n;
    total += p.n;
  }
  EXPECT_EQ(total, 3 * slot + 9);
  ASSERT_EQ(pieces.size(), 5u);  // 3 slots from an offset of 100: 4 pieces; then 9 bytes
  EXPECT_EQ(pieces[1].dev, 0x1000u + (slot - 100));
}

TEST(StagedLanes, AFaultAtAnyCallFailsTheBatchWithThatErrorAndLeavesNoDmaQueued) {
  const uint64_t bytes = 700'000, slot = 32 << 10;
  for (unsigned lanes : {1u, 4u}) {
    int calls = 0;
    {
      FakeLanes dev(bytes, lanes, true);
      Slots slots(lanes, slot);
      StagedLanes sl(lanes, slots.ptrs, slot);
      std::vector<std::byte> host(bytes + 16);
      auto spans = spans_over(host, bytes);
      ASSERT_TRUE(sl.d2h(dev, spans).ok());
      calls = dev.calls.load();
    }
    ASSERT_GT(calls, 20);
    for (int k = 0; k < calls; k += (k < 12 ? 1 : 7)) {
      FakeLanes dev(bytes, lanes, true);
      Slots slots(lanes, slot);
      StagedLanes sl(lanes, slots.ptrs, slot);
      std::vector<std::byte> host(bytes + 16);
      auto spans = spans_over(host, bytes);
      dev.fail_at = k;
      Status st = sl.d2h(dev, spans);
      ASSERT_FALSE(st.ok()) << "fault at call " << k << " with " << lanes << " lanes";
      EXPECT_EQ(st.api_error(), cuda::kErrorIllegalAddress) << st.to_string();
      EXPECT_EQ(dev.queued(), 0u) << "fault at call " << k;
      // The lanes stay usable: the next batch copies everything.
      dev.fail_at = -1;
      ASSERT_TRUE(sl.d2h(dev, spans).ok());
      EXPECT_EQ(std::memcmp(host.data() + 5, dev.mem.data(), bytes), 0);
    }
  }
}

TEST(StagedLanes, AnEmptyBatchCopiesNothingAndStartsNoThread) {
  FakeLanes dev(16, 4, true);
  Slots slots(4, 4096);
  StagedLanes sl(4, slots.ptrs, 4096);
  EXPECT_TRUE(sl.d2h(dev, {}).ok());
  EXPECT_EQ(sl.helpers_started(), 0u);
  EXPECT_EQ(dev.dmas.load(), 0);
}

TEST(PlanLanes, SlotsArePowersOfTwoWithinTheStagingAndLanesShrinkToFitIt) {
  LanePlan p = plan_lanes(0, 32ull << 20, 16);
  EXPECT_EQ(p.lanes, 8u);
  EXPECT_EQ(p.slot_bytes, 2ull << 20);
  p = plan_lanes(0, 32ull << 20, 2);  // auto: one per core, up to 8
  EXPECT_EQ(p.lanes, 2u);
  EXPECT_EQ(p.slot_bytes, 8ull << 20);
  p = plan_lanes(6, 20ull << 20, 16);  // 20 MiB / 12 slots: 1.67 MiB -> 1 MiB slots
  EXPECT_EQ(p.lanes, 6u);
  EXPECT_EQ(p.slot_bytes, 1ull << 20);
  p = plan_lanes(16, 1ull << 20, 16);  // too small for 16 lanes of 256 KiB slots: 2 lanes
  EXPECT_EQ(p.lanes, 2u);
  EXPECT_EQ(p.slot_bytes, 256ull << 10);
  EXPECT_EQ(plan_lanes(1, 256ull << 10, 16).lanes, 0u);  // not even one lane
}

}  // namespace
}  // namespace pos
