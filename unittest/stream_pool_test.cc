// stream_pool_test.cc — the stream-ordered sub-allocator of in-process jobs (remoting/driver/
// stream_pool.h) against a stub driver whose events complete when the test says so.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "remoting/driver/stream_pool.h"

namespace pos::driver {
namespace {

// The stub driver: events complete only when the test completes them; the device is settable.
struct Stub {
  int device = 0;
  int next_event = 1;
  std::map<CUevent, bool> done;  // live events -> complete
  std::map<CUevent, CUstream> recorded_on;
  int syncs = 0, destroyed = 0;
  bool fail_events = false;
};
Stub* g = nullptr;

CUresult get_device(CUdevice* d) {
  *d = g->device;
  return kSuccess;
}
CUresult event_create(CUevent* e, unsigned int) {
  if (g->fail_events) return 2;
  *e = reinterpret_cast<CUevent>(static_cast<uintptr_t>(g->next_event++));
  g->done[*e] = false;
  return kSuccess;
}
CUresult event_record(CUevent e, CUstream s) {
  g->recorded_on[e] = s;
  return kSuccess;
}
CUresult event_query(CUevent e) { return g->done.at(e) ? kSuccess : 600; }  // CUDA_ERROR_NOT_READY
CUresult event_destroy(CUevent e) {
  ++g->destroyed;
  g->done.erase(e);
  return kSuccess;
}
CUresult synchronize() {
  ++g->syncs;
  for (auto& [e, d] : g->done) d = true;
  return kSuccess;
}

CUstream stream(uintptr_t v) { return reinterpret_cast<CUstream>(v); }

class StreamPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g = &stub_;
    StreamPoolCalls c;
    c.ctx_get_device = get_device, c.event_create = event_create, c.event_record = event_record;
    c.event_query = event_query, c.event_destroy = event_destroy, c.synchronize = synchronize;
    ASSERT_TRUE(c.complete());
    SegmentSource src;
    src.alloc = [this](CUdeviceptr* out, size_t bytes, bool* placed) {
      *placed = placing_;
      if (!placing_) return kSuccess;
      if (segment_bytes_ + bytes > budget_) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
      *out = next_ + stub_.device * (1ull << 40);
      next_ += bytes;
      segment_bytes_ += bytes;
      segments_.insert(*out);
      return kSuccess;
    };
    src.free = [this](CUdeviceptr p) {
      segments_.erase(p);
      ++segment_frees_;
      return kSuccess;
    };
    pool_ = std::make_unique<StreamPool>(c, src);
  }
  void TearDown() override {
    pool_.reset();
    g = nullptr;
  }
  CUdeviceptr alloc(size_t n, uintptr_t s, bool per_thread = false) {
    CUdeviceptr p = 0;
    bool placed = false;
    EXPECT_EQ(pool_->alloc(&p, n, stream(s), per_thread, &placed), kSuccess);
    EXPECT_TRUE(placed);
    return p;
  }
  void free_on(CUdeviceptr p, uintptr_t s, bool per_thread = false) {
    bool ours = false;
    EXPECT_EQ(pool_->free_async(p, stream(s), per_thread, &ours), kSuccess);
    EXPECT_TRUE(ours);
  }

  Stub stub_;
  std::unique_ptr<StreamPool> pool_;
  bool placing_ = true;
  uint64_t budget_ = 1ull << 40, segment_bytes_ = 0, next_ = 0x300000000000ull;
  std::set<CUdeviceptr> segments_;
  int segment_frees_ = 0;
};

TEST_F(StreamPoolTest, AllocationsComeFromOnePlacedSegmentRoundedTo512Bytes) {
  const CUdeviceptr a = alloc(100, 7), b = alloc(1000, 7), c = alloc(512, 7);
  EXPECT_EQ(segments_.size(), 1u);
  EXPECT_EQ(a, *segments_.begin());
  EXPECT_EQ(b, a + 512);
  EXPECT_EQ(c, b + 1024);
  EXPECT_TRUE(pool_->owns(a) && pool_->owns(c + 511));
  EXPECT_FALSE(pool_->owns(a + StreamPool::kSegmentBytes));
  const auto st = pool_->stats();
  EXPECT_EQ(st.reserved, StreamPool::kSegmentBytes);
  EXPECT_EQ(st.used, 2048u);
}

TEST_F(StreamPoolTest, ABlockFreedOnAStreamIsReusedAtOnceOnThatStreamButElsewhereOnlyAfterItsEvent) {
  const CUdeviceptr a = alloc(1 << 20, 7);
  free_on(a, 7);
  EXPECT_EQ(stub_.recorded_on.size(), 0u);  // no event until another stream asks
  // Another stream may not take it while the free's event is pending.
  const CUdeviceptr other = alloc(1 << 20, 8);
  EXPECT_NE(other, a);
  ASSERT_EQ(stub_.recorded_on.size(), 1u);  // recorded on the freeing stream when stream 8 asked
  EXPECT_EQ(stub_.recorded_on.begin()->second, stream(7));
  free_on(other, 8);
  // The same stream takes the same bytes back.
  EXPECT_EQ(alloc(1 << 20, 7), a);
  EXPECT_EQ(pool_->stats().reused_same_stream, 1u);
}

TEST_F(StreamPoolTest, OnceTheFreesEventCompletesAnyStreamReusesTheBlock) {
  // A segment exactly as large as the request: nothing is left beside the block to fall back on.
  const CUdeviceptr a = alloc(StreamPool::kSegmentBytes, 7);
  free_on(a, 7);
  const CUdeviceptr pending = alloc(StreamPool::kSegmentBytes, 8);
  EXPECT_NE(pending, a);  // a second segment
  EXPECT_EQ(segments_.size(), 2u);
  for (auto& [e, d] : stub_.done) d = true;
  free_on(pending, 8);
  EXPECT_EQ(alloc(StreamPool::kSegmentBytes, 9), a);
  EXPECT_EQ(pool_->stats().reused_after_event, 1u);
  EXPECT_EQ(segments_.size(), 2u);  // no third segment
}

// The legacy default stream is named by a null handle in both calls: a job on it reuses its own
// frees at once. (Before 7ca6ff0 the allocation named it otherwise than the free, so
// such a job grew new segments while its frees' events were pending: the likely cause of the 43 %
// the H200 measured.)
TEST_F(StreamPoolTest, AJobOnTheDefaultStreamReusesItsOwnFreesAtOnce) {
  const CUdeviceptr a = alloc(StreamPool::kSegmentBytes, 0);
  free_on(a, 0);
  EXPECT_EQ(alloc(StreamPool::kSegmentBytes, 0), a);
  EXPECT_EQ(segments_.size(), 1u);
  EXPECT_EQ(pool_->stats().reused_same_stream, 1u);
  EXPECT_EQ(pool_->stats().events_recorded, 0u);
}

TEST_F(StreamPoolTest, PerThreadDefaultStreamsAreNeverMatchedByIdentity) {
  const CUdeviceptr a = alloc(4096, 0, true);
  free_on(a, 0, true);
  EXPECT_EQ(stub_.recorded_on.begin()->second, stream(StreamPool::kStreamPerThread));
  // Another thread's per-thread stream has the same value: only the event may order it.
  EXPECT_NE(alloc(4096, 0, true), a);
}

TEST_F(StreamPoolTest, FreeNeighboursMergeAndALargeRequestFitsTheirUnion) {
  const CUdeviceptr a = alloc(1 << 20, 7), b = alloc(1 << 20, 7);
  (void)alloc(1 << 20, 7);  // keeps the rest of the segment apart from a and b
  free_on(a, 7);
  free_on(b, 7);
  // a and b merged (same stream): a 2 MiB request on that stream lands at a.
  EXPECT_EQ(alloc(2 << 20, 7), a);
}

TEST_F(StreamPoolTest, ALargeRequestGetsASegmentOfItsOwnRoundedTo2MiB) {
  const CUdeviceptr a = alloc((64 << 20) + 1, 7);
  EXPECT_EQ(pool_->stats().reserved, (64ull << 20) + (2 << 20));
  EXPECT_TRUE(segments_.count(a));
}

TEST_F(StreamPoolTest, AFreeOfAPointerNotStartingALiveBlockIsRefusedAndChangesNothing) {
  const CUdeviceptr a = alloc(4096, 7);
  bool ours = false;
  EXPECT_EQ(pool_->free_async(a + 512, stream(7), false, &ours), 1);  // CUDA_ERROR_INVALID_VALUE
  EXPECT_TRUE(ours);
  free_on(a, 7);
  EXPECT_EQ(pool_->free_async(a, stream(7), false, &ours), 1);  // a second free
  EXPECT_EQ(pool_->free_async(0x1234, stream(7), false, &ours), kSuccess);
  EXPECT_FALSE(ours);  // not this pool's: the caller passes it to the driver
  EXPECT_EQ(pool_->stats().used, 0u);
}

TEST_F(StreamPoolTest, TrimSynchronizesAndGivesBackOnlyWhollyFreeSegmentsDownToWhatItKeeps) {
  const CUdeviceptr a = alloc(StreamPool::kSegmentBytes, 7);
  const CUdeviceptr b = alloc(StreamPool::kSegmentBytes, 7);
  const CUdeviceptr c = alloc(4096, 7);  // a third segment, still in use
  free_on(a, 7);
  free_on(b, 8);
  ASSERT_EQ(segments_.size(), 3u);
  EXPECT_EQ(pool_->trim(StreamPool::kSegmentBytes * 2), kSuccess);
  EXPECT_EQ(stub_.syncs, 1);
  EXPECT_EQ(segments_.size(), 2u);  // one free segment went; holding 2 segments is allowed
  EXPECT_EQ(pool_->trim(0), kSuccess);
  EXPECT_EQ(segments_.size(), 1u);  // the one in use stays
  EXPECT_TRUE(pool_->owns(c));
  EXPECT_EQ(pool_->stats().reserved, StreamPool::kSegmentBytes);
  pool_.reset();
  EXPECT_EQ(stub_.done.size(), 0u);  // every event destroyed with the pool
}

TEST_F(StreamPoolTest, AJobOnOneStreamRecordsNoEvents) {
  for (int i = 0; i < 100; ++i) {
    const CUdeviceptr a = alloc(4096 * (1 + i % 7), 7), b = alloc(100000, 7);
    free_on(b, 7);
    free_on(a, 7);
  }
  EXPECT_EQ(pool_->stats().events_recorded, 0u);
  EXPECT_EQ(stub_.recorded_on.size(), 0u);
  EXPECT_EQ(pool_->stats().used, 0u);
}

TEST_F(StreamPoolTest, AStreamAboutToBeDestroyedGetsItsFreesEventsFirst) {
  const CUdeviceptr a = alloc(StreamPool::kSegmentBytes, 7);
  free_on(a, 7);
  pool_->stream_ending(stream(7));
  ASSERT_EQ(stub_.recorded_on.size(), 1u);
  EXPECT_EQ(stub_.recorded_on.begin()->second, stream(7));
  // A new stream that reuses the handle value does not count as the freeing stream: its event does.
  EXPECT_NE(alloc(StreamPool::kSegmentBytes, 7), a);
}

TEST_F(StreamPoolTest, ABlockFreedInACaptureIsNotReusedBeforeATrim) {
  const CUdeviceptr a = alloc(StreamPool::kSegmentBytes, 7);
  bool ours = false;
  EXPECT_EQ(pool_->free_deferred(a, &ours), kSuccess);
  EXPECT_TRUE(ours);
  EXPECT_NE(alloc(StreamPool::kSegmentBytes, 7), a);
  EXPECT_EQ(pool_->trim(1ull << 40), kSuccess);  // keeps everything, but the block is back
  EXPECT_EQ(alloc(StreamPool::kSegmentBytes, 7), a);
}

// What a cut copies of the pool: each segment's live blocks, rounded out and merged; freed ones
// left out, but not those freed inside a capture (the graph may still use them).
TEST_F(StreamPoolTest, LivePiecesAreTheLiveBlocksRoundedOutToTheAlignmentAndMerged) {
  const CUdeviceptr a = alloc(100, 7), b = alloc(1 << 20, 7), c = alloc(70000, 7), d = alloc(4096, 7);
  const CUdeviceptr seg = *segments_.begin();
  ASSERT_EQ(a, seg);
  free_on(b, 7);
  auto p = pool_->live_pieces(64 << 10);
  ASSERT_EQ(p.size(), 1u);
  // a: [seg, 64K); c and d, after b's 1 MiB: one piece from c rounded down to d's end rounded up.
  const uint64_t c_lo = c & ~uint64_t{0xffff}, d_hi = (d + 4096 + 0xffff) & ~uint64_t{0xffff};
  EXPECT_EQ(p[seg], (std::vector<std::pair<uint64_t, uint64_t>>{{seg, seg + (64 << 10)}, {c_lo, d_hi}}));
  // Freed inside a capture, c still counts; freed plainly, d does not.
  bool ours = false;
  ASSERT_EQ(pool_->free_deferred(c, &ours), kSuccess);
  free_on(d, 7);
  free_on(a, 7);
  p = pool_->live_pieces(64 << 10);
  EXPECT_EQ(p[seg], (std::vector<std::pair<uint64_t, uint64_t>>{{c_lo, (c + 70000 + 0xffff) & ~uint64_t{0xffff}}}));
  // A segment with no live block (c back after a trim that keeps everything): an empty list; given
  // back, none.
  ASSERT_EQ(pool_->trim(1ull << 40), kSuccess);
  p = pool_->live_pieces(64 << 10);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[seg].empty());
  ASSERT_EQ(pool_->trim(0), kSuccess);
  EXPECT_TRUE(pool_->live_pieces(64 << 10).empty());
}

TEST_F(StreamPoolTest, WithoutAnEventTheFreeWaitsForTheDeviceAndTheBlockIsFreeAnywhere) {
  const CUdeviceptr a = alloc(StreamPool::kSegmentBytes, 7);
  stub_.fail_events = true;
  free_on(a, 7);
  EXPECT_EQ(stub_.syncs, 0);
  EXPECT_EQ(alloc(StreamPool::kSegmentBytes, 8), a);  // asked for the event, got a synchronize
  EXPECT_EQ(stub_.syncs, 1);
}

TEST_F(StreamPoolTest, DevicesKeepTheirOwnSegments) {
  const CUdeviceptr a = alloc(4096, 7);
  stub_.device = 1;
  const CUdeviceptr b = alloc(4096, 7);
  EXPECT_EQ(b - a, (1ull << 40) + StreamPool::kSegmentBytes);  // a segment of its own, in device 1's range
  free_on(b, 7);
  stub_.device = 0;
  EXPECT_EQ(alloc(4096, 7), a + 512 * 8);  // device 0's segment, not device 1's free block
}

TEST_F(StreamPoolTest, WithPlacementOffOrOutOfMemoryTheAnswerSaysSo) {
  CUdeviceptr p = 0;
  bool placed = true;
  placing_ = false;
  EXPECT_EQ(pool_->alloc(&p, 4096, stream(7), false, &placed), kSuccess);
  EXPECT_FALSE(placed);  // the driver's own pool serves it
  placing_ = true;
  budget_ = 0;
  EXPECT_EQ(pool_->alloc(&p, 4096, stream(7), false, &placed), 2);
  EXPECT_TRUE(placed);
  EXPECT_EQ(pool_->stats().used, 0u);
}

}  // namespace
}  // namespace pos::driver
