// snapshot_test.cc — the cut of an in-process job's GPU-only checkpoint whose copies run ahead of the
// job (remoting/driver/snapshot.h, CopyAhead), against a stub driver that writes down every call.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "remoting/driver/snapshot.h"

namespace pos::driver {
namespace {

// The stub driver: each call appended to a trace, as text; events are numbered as they are made.
struct Stub {
  std::vector<std::string> trace;
  int next_event = 1;
  int fail_record_at = -1;  // the n-th cuEventRecord (from 0) fails
  int records = 0;
};
Stub* g = nullptr;

std::string name(const void* p) { return std::to_string(reinterpret_cast<uintptr_t>(p)); }
CUresult event_create(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(static_cast<uintptr_t>(1000 + g->next_event++));
  return kSuccess;
}
CUresult event_destroy(CUevent) { return kSuccess; }
CUresult event_record(CUevent e, CUstream s) {
  if (g->records++ == g->fail_record_at) return 700;
  g->trace.push_back("record " + name(e) + " on " + name(s));
  return kSuccess;
}
CUresult stream_wait_event(CUstream s, CUevent e, unsigned int) {
  g->trace.push_back("wait " + name(s) + " for " + name(e));
  return kSuccess;
}
CUresult dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  g->trace.push_back("copy " + std::to_string(src) + " to " + std::to_string(dst) + " n " + std::to_string(n) + " on " +
                     name(s));
  return kSuccess;
}

SnapCalls stub_calls() {
  SnapCalls c;
  c.event_create = event_create;
  c.event_destroy = event_destroy;
  c.event_record = event_record;
  c.stream_wait_event = stream_wait_event;
  c.dtod_async = dtod_async;
  return c;
}

CUstream stream(uintptr_t n) { return reinterpret_cast<CUstream>(n); }
CUevent event(uintptr_t n) { return reinterpret_cast<CUevent>(n); }
// The trace lines of one kind ("copy", "wait", "record").
std::vector<std::string> lines(const char* kind) {
  std::vector<std::string> out;
  for (const std::string& l : g->trace)
    if (l.rfind(kind, 0) == 0) out.push_back(l);
  return out;
}

class CopyAheadTest : public ::testing::Test {
 protected:
  void SetUp() override { g = &stub_; }
  void TearDown() override { g = nullptr; }
  Stub stub_;
  const CUstream copy_ = stream(77);
  const CUevent done_ = event(99);
  const uint64_t shadow_ = 1 << 30;
};

// Four allocations by address; the job is expected to touch B first, then D, A and C.
std::vector<Placement::Region> four() {
  return {{0, 0x10000, 0x1000, true, 5}, {0, 0x20000, 0x1000, true, 2}, {0, 0x30000, 0x2000, true, 9},
          {0, 0x50000, 0x1000, false, 3}};
}

TEST_F(CopyAheadTest, WhatTheJobIsExpectedToTouchFirstIsCopiedFirstEachToItsPlaceInTheShadowAfterEveryStreamsWork) {
  auto a = CopyAhead::create(stub_calls());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(CopyAhead::copy_order(four()), (std::vector<size_t>{1, 3, 0, 2}));
  ASSERT_EQ((*a)->enqueue(copy_, {stream(5), stream(6)}, four(), shadow_, done_), kSuccess);
  // First the copy stream waits for where the legacy stream and each of the job's stand now.
  ASSERT_GE(g->trace.size(), 6u);
  // (create() made events 1001-1064 for the batches; these marks are the next ones.)
  EXPECT_EQ(std::vector<std::string>(g->trace.begin(), g->trace.begin() + 6),
            (std::vector<std::string>{"record 1065 on 0", "wait 77 for 1065", "record 1066 on 5", "wait 77 for 1066",
                                      "record 1067 on 6", "wait 77 for 1067"}));
  // Then the copies in that order, each region at its offset in address order.
  const uint64_t base = shadow_;
  EXPECT_EQ(lines("copy"), (std::vector<std::string>{
                               "copy 131072 to " + std::to_string(base + 0x1000) + " n 4096 on 77",
                               "copy 327680 to " + std::to_string(base + 0x4000) + " n 4096 on 77",
                               "copy 65536 to " + std::to_string(base + 0x0) + " n 4096 on 77",
                               "copy 196608 to " + std::to_string(base + 0x2000) + " n 8192 on 77",
                           }));
  // Four regions, four batches, an event after each, then `done`; no stream of the job waits.
  EXPECT_EQ((*a)->batches(), 4u);
  const std::vector<std::string> records = lines("record");
  ASSERT_EQ(records.size(), 3u + 4u + 1u);
  EXPECT_EQ(records.back(), "record 99 on 77");
  for (const std::string& w : lines("wait")) EXPECT_EQ(w.rfind("wait 77 ", 0), 0u) << w;
  EXPECT_EQ((*a)->waits(), 0u);
}

TEST_F(CopyAheadTest, TheJobsLaterWorkWaitsOnlyForTheCopiesOfWhatItTouchesAndEachStreamOnlyOnce) {
  auto made = CopyAhead::create(stub_calls());
  ASSERT_TRUE(made.ok());
  CopyAhead& a = **made;
  ASSERT_EQ(a.enqueue(copy_, {}, four(), shadow_, done_), kSuccess);
  // The batches' events, in copy order: B, D, A, C.
  const std::vector<std::string> records = lines("record");
  ASSERT_EQ(records.size(), 1u + 4u + 1u);
  std::vector<std::string> batch_event;
  for (size_t i = 1; i <= 4; ++i) batch_event.push_back(records[i].substr(7, records[i].find(" on") - 7));
  g->trace.clear();
  const auto waits = [] { return lines("wait"); };
  const uint64_t in_b = 0x20010, in_c = 0x31000, in_a = 0x10fff, outside = 0x40000;
  ASSERT_EQ(a.before_touch(stream(5), &in_b, 1), kSuccess);
  EXPECT_EQ(waits(), (std::vector<std::string>{"wait 5 for " + batch_event[0]}));
  ASSERT_EQ(a.before_touch(stream(5), &in_b, 1), kSuccess);  // waited already
  ASSERT_EQ(a.before_touch(stream(5), &outside, 1), kSuccess);  // in no region of the cut
  EXPECT_EQ(waits().size(), 1u);
  const uint64_t both[2] = {in_a, in_c};
  ASSERT_EQ(a.before_touch(stream(5), both, 2), kSuccess);  // the later batch covers the earlier
  EXPECT_EQ(waits().back(), "wait 5 for " + batch_event[3]);
  ASSERT_EQ(a.before_touch(stream(5), &in_a, 1), kSuccess);  // A's batch is before C's: covered
  EXPECT_EQ(waits().size(), 2u);
  ASSERT_EQ(a.before_touch(stream(6), &in_a, 1), kSuccess);  // another stream waits for itself
  EXPECT_EQ(waits().back(), "wait 6 for " + batch_event[2]);
  // A range: every region it overlaps (the end of A up to the start of D, but not D).
  ASSERT_EQ(a.before_range(stream(7), 0x10fff, 0x50000 - 0x10fff), kSuccess);
  EXPECT_EQ(waits().back(), "wait 7 for " + batch_event[3]);
  ASSERT_EQ(a.before_range(stream(8), 0x4ffff, 1), kSuccess);  // only the gap before D
  EXPECT_EQ(waits().size(), 4u);
  ASSERT_EQ(a.before_range(stream(8), 0x4ffff, 2), kSuccess);  // D's first byte
  EXPECT_EQ(waits().back(), "wait 8 for " + batch_event[1]);
  ASSERT_EQ(a.before_all(stream(9)), kSuccess);
  EXPECT_EQ(waits().back(), "wait 9 for " + batch_event[3]);
  // The per-thread stream is each thread's own: both threads' streams wait.
  ASSERT_EQ(a.before_touch(kPerThreadStream, &in_b, 1), kSuccess);
  std::thread([&] { ASSERT_EQ(a.before_touch(kPerThreadStream, &in_b, 1), kSuccess); }).join();
  ASSERT_EQ(a.before_touch(kPerThreadStream, &in_b, 1), kSuccess);
  EXPECT_EQ(waits().size(), 8u);
  EXPECT_EQ(waits()[6], "wait 2 for " + batch_event[0]);
  EXPECT_EQ(waits()[7], "wait 2 for " + batch_event[0]);
  EXPECT_EQ(a.waits(), 8u);
}

TEST_F(CopyAheadTest, ManyRegionsGoInAtMostSixtyFourBatchesNeighboursInOneCopy) {
  // 130 allocations back to back, in address order: 3 per batch, 44 batches, each one copy.
  std::vector<Placement::Region> regions;
  for (uint64_t i = 0; i < 130; ++i) regions.push_back({0, 0x100000 + i * 0x1000, 0x1000, true, i});
  auto a = CopyAhead::create(stub_calls());
  ASSERT_TRUE(a.ok());
  ASSERT_EQ((*a)->enqueue(copy_, {}, regions, shadow_, done_), kSuccess);
  EXPECT_EQ((*a)->batches(), 44u);
  const std::vector<std::string> copies = lines("copy");
  ASSERT_EQ(copies.size(), 44u);
  EXPECT_EQ(copies[0], "copy 1048576 to " + std::to_string(shadow_) + " n 12288 on 77");
  EXPECT_EQ(copies[43], "copy " + std::to_string(0x100000 + 129 * 0x1000) + " to " +
                            std::to_string(shadow_ + 129 * 0x1000) + " n 4096 on 77");
  // In reverse: the same regions, last first, none merged across the reversed order.
  for (auto& r : regions) r.order = 1000 - r.order;
  g->trace.clear();
  auto b = CopyAhead::create(stub_calls());
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)->enqueue(copy_, {}, regions, shadow_, done_), kSuccess);
  EXPECT_EQ(lines("copy").size(), 130u);
  EXPECT_EQ(lines("copy")[0].rfind("copy " + std::to_string(0x100000 + 129 * 0x1000) + " ", 0), 0u) << lines("copy")[0];
}

TEST_F(CopyAheadTest, ADriverErrorPartWayIsReturnedAndNothingAfterItIsEnqueued) {
  stub_.fail_record_at = 2;  // the legacy stream's mark, the first batch's event, then this one
  auto a = CopyAhead::create(stub_calls());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->enqueue(copy_, {}, four(), shadow_, done_), 700);
  EXPECT_EQ(lines("copy").size(), 2u);  // the first two batches' copies, then the failed record
  EXPECT_EQ((*a)->batches(), 1u);
  for (const std::string& r : lines("record")) EXPECT_EQ(r.find("record 99"), std::string::npos) << r;
}

}  // namespace
}  // namespace pos::driver
