// staged_copy_test.cc — the staging decision, chunk planning and the slot pipeline
// (pos/staged_copy.h) against a fake device whose DMAs run only when the pipeline waits for them
// (the latest a real stream may run them): a slot refilled or read before its fence shows as
// wrong bytes. Faults injected at any DMA, fence or wait must fail the copy with that error and
// leave no DMA queued.
#include "pos/backends/staged_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "pos/base/cuda_errors.h"

namespace pos {
namespace {

std::vector<uint8_t> pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + i / 251 + seed);
  return v;
}

// A stream with one fence per slot. Lazy: queued operations run when somebody waits (the latest
// legal moment); eager: at once (the earliest).
class FakeDevice final : public StagingDevice {
 public:
  static constexpr uint64_t kBase = 0x7000000000;
  FakeDevice(uint64_t bytes, bool lazy) : mem(bytes, 0), lazy_(lazy) {}

  Status to_device(uint64_t dst, const void* slot, uint64_t n) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    ++dmas;
    max_dma = std::max(max_dma, n);
    return push(Op{Op::kToDevice, dst, const_cast<void*>(slot), n, 0});
  }
  Status to_host(void* slot, uint64_t src, uint64_t n) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    ++dmas;
    max_dma = std::max(max_dma, n);
    return push(Op{Op::kToHost, src, slot, n, 0});
  }
  Status fence(unsigned slot) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    return push(Op{Op::kFence, 0, nullptr, 0, slot});
  }
  Status wait(unsigned slot) override {
    POS_RETURN_IF_ERROR(maybe_fail());
    bool found = false;
    for (const Op& o : ops_) found = found || (o.kind == Op::kFence && o.slot == slot);
    if (!found) return Status::Ok();  // its fence has passed (or it never had one): an event does the same
    // Run up to and including the slot's last fence.
    size_t last = 0;
    for (size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].kind == Op::kFence && ops_[i].slot == slot) last = i;
    for (size_t i = 0; i <= last; ++i) run_front();
    return Status::Ok();
  }
  Status drain() override {
    ++drains;
    while (!ops_.empty()) run_front();
    return Status::Ok();
  }

  size_t queued() const { return ops_.size(); }
  uint8_t* at(uint64_t addr) { return mem.data() + (addr - kBase); }

  std::vector<uint8_t> mem;
  int fail_at = -1;  // the fail_at-th call (0-based) to to_device/to_host/fence/wait fails
  int calls = 0;
  uint64_t dmas = 0, max_dma = 0;
  int drains = 0;

 private:
  struct Op {
    enum Kind { kToDevice, kToHost, kFence } kind;
    uint64_t dev;
    void* host;
    uint64_t n;
    unsigned slot;
  };
  Status maybe_fail() {
    if (calls++ == fail_at) return Status::Cuda(cuda::kErrorIllegalAddress, "injected device fault");
    return Status::Ok();
  }
  Status push(Op o) {
    ops_.push_back(o);
    if (!lazy_) run_front();
    return Status::Ok();
  }
  void run_front() {
    const Op o = ops_.front();
    ops_.pop_front();
    if (o.kind == Op::kToDevice) std::memcpy(at(o.dev), o.host, o.n);
    if (o.kind == Op::kToHost) std::memcpy(o.host, at(o.dev), o.n);
  }
  std::deque<Op> ops_;
  bool lazy_;
};

// Page-aligned slots, as cuMemHostAlloc gives.
struct Slots {
  Slots(unsigned count, uint64_t bytes) {
    for (unsigned i = 0; i < count; ++i) {
      mem.emplace_back(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
      ptrs.push_back(mem.back().get());
    }
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<std::byte, Free>> mem;
  std::vector<std::byte*> ptrs;
};

TEST(StagingDecision, CopyThreadsDefaultToFourAtMostTheCoreCount) {
  EXPECT_EQ(copy_threads_from_env(nullptr, 16).value(), 4u);
  EXPECT_EQ(copy_threads_from_env("", 2).value(), 2u);
  EXPECT_EQ(copy_threads_from_env(nullptr, 0).value(), 1u);  // unknown core count
  EXPECT_EQ(copy_threads_from_env("0", 8).value(), 0u);      // staging off
  EXPECT_EQ(copy_threads_from_env("7", 2).value(), 7u);      // asked for: not capped by cores
  EXPECT_EQ(copy_threads_from_env("64", 2).value(), 64u);
}

TEST(StagingDecision, ABadCopyThreadsValueIsRefusedWithTheVariableNamed) {
  for (const char* bad : {"65", "-1", "four", "3x", " 2"}) {
    auto r = copy_threads_from_env(bad, 4);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().api_error(), cuda::kErrorInvalidValue);
    EXPECT_NE(r.status().message().find("POS_COPY_THREADS"), std::string::npos) << r.status().message();
  }
}

TEST(StagingDecision, OnlyLargeCopiesFromPageableMemoryAreStagedAndSmallOnesAskTheDriverNothing) {
  StagingOptions o;
  int asked = 0;
  auto pageable = [&] { return ++asked, false; };
  auto pinned = [&] { return ++asked, true; };
  EXPECT_FALSE(should_stage(o.min_bytes - 1, o, pageable));
  EXPECT_FALSE(should_stage(4096, o, pageable));
  EXPECT_EQ(asked, 0);
  EXPECT_TRUE(should_stage(o.min_bytes, o, pageable));
  EXPECT_TRUE(should_stage(64ull << 20, o, pageable));
  EXPECT_FALSE(should_stage(64ull << 20, o, pinned));
  EXPECT_EQ(asked, 3);
  o.threads = 0;  // POS_COPY_THREADS=0: the driver's path for everything
  EXPECT_FALSE(should_stage(64ull << 20, o, pageable));
  EXPECT_EQ(asked, 3);
}

TEST(StagingPlan, ChunksCoverTheCopyExactlyAndCycleThroughTheSlots) {
  const uint64_t slot = 1000;
  EXPECT_EQ(staged_chunk_count(1, slot), 1u);
  EXPECT_EQ(staged_chunk_count(slot, slot), 1u);
  EXPECT_EQ(staged_chunk_count(slot + 1, slot), 2u);
  const uint64_t n = 9 * slot + 5;
  const uint64_t chunks = staged_chunk_count(n, slot);
  ASSERT_EQ(chunks, 10u);
  uint64_t next = 0;
  for (uint64_t i = 0; i < chunks; ++i) {
    const StagedChunk c = staged_chunk(i, n, slot, 4);
    EXPECT_EQ(c.offset, next);
    EXPECT_EQ(c.slot, i % 4);
    EXPECT_GT(c.bytes, 0u);
    EXPECT_LE(c.bytes, slot);
    next += c.bytes;
  }
  EXPECT_EQ(next, n);
  EXPECT_EQ(staged_chunk(chunks - 1, n, slot, 4).bytes, 5u);
}

class StagingPipelineTest : public ::testing::TestWithParam<bool> {};  // param: lazy device

TEST_P(StagingPipelineTest, PageableBytesRoundTripAtOddSizesAndOffsetsAndNothingAroundThemChanges) {
  const uint64_t slot = 256 << 10;
  Slots slots(4, slot);
  ParallelCopier copier(3, 0);
  StagingPipeline p(slots.ptrs, slot, &copier);
  FakeDevice dev(16ull << 20, GetParam());
  for (uint64_t n : {uint64_t{1}, slot - 1, slot, slot + 1, 4 * slot, 4 * slot + 1, 9 * slot + 12345}) {
    for (uint64_t off : {uint64_t{0}, uint64_t{7}, uint64_t{4095}}) {
      const std::vector<uint8_t> src = pattern(n + off, static_cast<uint8_t>(n + off));
      const uint64_t dst = FakeDevice::kBase + 3 + off;
      std::fill(dev.mem.begin(), dev.mem.end(), 0xee);
      ASSERT_TRUE(p.h2d(dev, dst, src.data() + off, n).ok());
      EXPECT_EQ(dev.queued(), 0u) << "a slot is still in use when h2d returns";
      ASSERT_EQ(std::memcmp(dev.at(dst), src.data() + off, n), 0) << n << " bytes at offset " << off;
      EXPECT_EQ(dev.at(dst)[-1], 0xee);
      EXPECT_EQ(dev.at(dst)[n], 0xee);

      std::vector<uint8_t> back(n + off + 2, 0x5a);
      ASSERT_TRUE(p.d2h(dev, back.data() + off + 1, dst, n).ok());
      EXPECT_EQ(dev.queued(), 0u) << "a slot is still in use when d2h returns";
      ASSERT_EQ(std::memcmp(back.data() + off + 1, src.data() + off, n), 0) << n << " bytes at offset " << off;
      for (uint64_t i = 0; i <= off; ++i) ASSERT_EQ(back[i], 0x5a);
      ASSERT_EQ(back[off + 1 + n], 0x5a);
    }
  }
  EXPECT_EQ(dev.max_dma, slot);
  EXPECT_EQ(dev.drains, 0);
}

TEST_P(StagingPipelineTest, ACopyOf64MiBAndSomeAtAnOddOffsetGoesThroughTheDefaultSlotsWhole) {
  const StagingOptions o;
  Slots slots(o.slots, o.slot_bytes);
  ParallelCopier copier(4, 0);
  StagingPipeline p(slots.ptrs, o.slot_bytes, &copier);
  const uint64_t n = (64ull << 20) + 12345;
  FakeDevice dev(n + 4096, GetParam());
  const std::vector<uint8_t> src = pattern(n + 7, 3);
  ASSERT_TRUE(p.h2d(dev, FakeDevice::kBase + 512, src.data() + 7, n).ok());
  std::vector<uint8_t> back(n + 7, 0);
  ASSERT_TRUE(p.d2h(dev, back.data() + 7, FakeDevice::kBase + 512, n).ok());
  EXPECT_EQ(std::memcmp(back.data() + 7, src.data() + 7, n), 0);
  EXPECT_EQ(dev.dmas, 2 * staged_chunk_count(n, o.slot_bytes));
}

TEST_P(StagingPipelineTest, AFaultAtAnyStepFailsTheCopyWithItsErrorAndLeavesNoSlotInUse) {
  const uint64_t slot = 64 << 10;
  Slots slots(3, slot);
  ParallelCopier copier(2, 0);
  StagingPipeline p(slots.ptrs, slot, &copier);
  const uint64_t n = 7 * slot + 99;
  FakeDevice dev(n + 1024, GetParam());
  const std::vector<uint8_t> src = pattern(n, 9);
  for (bool to_device : {true, false}) {
    // A clean run counts the device calls; then a fault at each of them in turn.
    dev.calls = 0;
    std::vector<uint8_t> out(n);
    ASSERT_TRUE((to_device ? p.h2d(dev, FakeDevice::kBase, src.data(), n) : p.d2h(dev, out.data(), FakeDevice::kBase, n)).ok());
    const int steps = dev.calls;
    ASSERT_GT(steps, 8);
    for (int k = 0; k < steps; ++k) {
      dev.calls = 0;
      dev.fail_at = k;
      dev.drains = 0;
      const Status st = to_device ? p.h2d(dev, FakeDevice::kBase, src.data(), n) : p.d2h(dev, out.data(), FakeDevice::kBase, n);
      ASSERT_FALSE(st.ok()) << "fault at step " << k;
      EXPECT_EQ(st.api_error(), cuda::kErrorIllegalAddress);
      EXPECT_EQ(dev.queued(), 0u) << "fault at step " << k << ": a DMA still uses a slot";
      EXPECT_EQ(dev.drains, 1);
    }
    // The pipeline holds no state from the failures: the next copy succeeds and is whole.
    dev.fail_at = -1;
    ASSERT_TRUE(p.h2d(dev, FakeDevice::kBase, src.data(), n).ok());
    ASSERT_TRUE(p.d2h(dev, out.data(), FakeDevice::kBase, n).ok());
    EXPECT_EQ(out, src);
  }
}

INSTANTIATE_TEST_SUITE_P(DmaTiming, StagingPipelineTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Lazy" : "Eager"; });

}  // namespace
}  // namespace pos
