// pipeline_test.cc — the workspace → parser → worker pipeline itself: sync and async return paths,
// versions and dirty sets (DAG edges), commands at a cut, many clients, shutdown that drains.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "unittest/api_fixture.h"

namespace pos::test {
namespace {

class PipelineTest : public ApiTest {
 protected:
  std::shared_ptr<POSClient> client_ptr(size_t i = 0) { return ws_->find_client(client(i).uuid); }
  std::vector<DirtyRecord> collect_dirty(size_t i = 0, uint64_t* cut = nullptr) {
    Command cmd;
    cmd.type = CommandType::kCollectDirty;
    Status s = ws_->run_command(client(i).uuid, cmd);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (cut != nullptr) *cut = cmd.cut_pc;
    return cmd.dirty;
  }
  static const DirtyRecord* find(const std::vector<DirtyRecord>& v, uint64_t addr) {
    for (const auto& r : v)
      if (r.client_addr == addr) return &r;
    return nullptr;
  }
};

TEST_F(PipelineTest, ParseReturnableCallsReturnBeforeTheWorkerRunsThem) {
  auto c = client_ptr();
  const uint64_t executed_before = c->stats().calls_executed;
  c->set_worker_paused(true);
  uint64_t p = 0;
  // cudaMalloc's result comes from the parser: it returns although the worker is held.
  ASSERT_TRUE(api().malloc(&p, 1024).ok());
  EXPECT_NE(p, 0u);
  ASSERT_TRUE(api().memset(p, 7, 1024).ok());
  EXPECT_EQ(c->stats().calls_executed, executed_before);
  c->set_worker_paused(false);
  // A sync call waits for the worker and sees the async work done.
  EXPECT_EQ(download<uint8_t>(p, 4), std::vector<uint8_t>(4, 7));
  EXPECT_GE(c->stats().calls_executed, executed_before + 3);
}

TEST_F(PipelineTest, SyncCallsWaitForTheWorkerResult) {
  auto c = client_ptr();
  c->set_worker_paused(true);
  std::atomic<bool> returned{false};
  int32_t n = 0;
  const uint64_t submitted = c->stats().calls_submitted;
  std::thread t([&] {
    EXPECT_TRUE(api().get_device_count(&n).ok());
    returned = true;
  });
  // Once submitted, a held worker means the sync call cannot return; release and it completes.
  while (c->stats().calls_submitted == submitted) std::this_thread::yield();
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  EXPECT_FALSE(returned.load());
  c->set_worker_paused(false);
  t.join();
  EXPECT_TRUE(returned.load());
  EXPECT_GE(n, 1);
}

TEST_F(PipelineTest, WritersBumpVersionsAndEnterTheDirtySet) {
  collect_dirty();  // start clean
  const uint64_t x = alloc(256), y = alloc(256), z = alloc(256);
  auto first = collect_dirty();
  // Created buffers are dirty (new state to capture).
  EXPECT_NE(find(first, x), nullptr);
  EXPECT_NE(find(first, y), nullptr);
  EXPECT_NE(find(first, z), nullptr);
  EXPECT_TRUE(collect_dirty().empty());

  // axpy(y, x): y is InOut, x is read-only (In). A D2H copy of z reads it only.
  auto p = args(client().axpy, y, x, 1.0f, 64);
  ASSERT_TRUE(api().launch_kernel(client().axpy.handle, dims(1, 64), 0, p).ok());
  download<float>(z, 4);
  uint64_t cut = 0;
  auto second = collect_dirty(0, &cut);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].client_addr, y);
  EXPECT_EQ(second[0].type, ResourceType::kMemory);
  // The launch was the call two before the command's cut (launch, memcpy, then the cut).
  EXPECT_EQ(second[0].version, cut - 2);
}

TEST_F(PipelineTest, StructPointersAreInOutEdges) {
  const uint64_t d = alloc(256);
  collect_dirty();
  ScaleArgs sa{reinterpret_cast<float*>(d), 64, 2.0f};
  auto p = args(client().scale_struct, sa);
  ASSERT_TRUE(api().launch_kernel(client().scale_struct.handle, dims(1, 64), 0, p).ok());
  auto dirty = collect_dirty();
  ASSERT_EQ(dirty.size(), 1u);
  EXPECT_EQ(dirty[0].client_addr, d);
}

TEST_F(PipelineTest, QuiesceCommandCutsAfterEveryEarlierCall) {
  const int n = 1 << 18;
  const uint64_t d = alloc(n * 4);
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create_with_flags(&s, cuda::kStreamNonBlocking).ok());
  for (int i = 0; i < 8; ++i) {
    auto p = args(client().fill, d, static_cast<unsigned>(i), n);
    ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(n / 256, 256), s, p).ok());
  }
  Command cmd;
  cmd.type = CommandType::kQuiesce;
  ASSERT_TRUE(ws_->run_command(client().uuid, cmd).ok());
  // At the cut every earlier call has run on the device: the stream is idle.
  EXPECT_TRUE(api().stream_query(s).ok());
  auto out = download<uint32_t>(d, 2);
  EXPECT_EQ(out[1], 8u);
}

TEST_F(PipelineTest, ASecondConcurrentCommandIsBusy) {
  auto c = client_ptr();
  c->set_worker_paused(true);
  Command first;
  first.type = CommandType::kQuiesce;
  std::thread t([&] { EXPECT_TRUE(ws_->run_command(client().uuid, first).ok()); });
  // Wait until the first command is admitted (it holds the client until the worker runs it).
  while (!c->command_in_flight()) std::this_thread::yield();
  Command cmd;
  Status second = ws_->run_command(client().uuid, cmd);
  EXPECT_EQ(second.code(), Code::kBusy);
  c->set_worker_paused(false);
  t.join();
  EXPECT_GT(first.cut_pc, 0u);
}

TEST_F(PipelineTest, WithTheVerdictLookedForLateEveryCallerStillGetsItsOwnVerdict) {
  // `delayed_verdict: on` forces the path a machine with cores to spare takes (CI has two): each
  // caller reads the parser's verdict only after an adaptive delay. Two app threads share one
  // client and interleave good and bad launches: every bad one must report its error, every good
  // one success, and the data must show every good launch ran in order.
  Config c = test_config();
  c.delayed_verdict = VerdictLook::kDelayed;
  make_workspace(c);
  const int n = 1024;
  const uint64_t d0 = alloc(n * 4), d1 = alloc(n * 4);
  std::atomic<int> wrong{0};
  auto run = [&](uint64_t d, unsigned base) {
    for (unsigned it = 0; it < 300; ++it) {
      auto p = args(client().fill, d, base + it, n);
      if (!api().launch_kernel(client().fill.handle, dims(n / 256, 256), 0, p).ok()) ++wrong;
      const Status bad = api().launch_kernel(client().fill.handle, dims(n / 256, 2048), 0, p);  // > 1024 threads
      if (bad.ok() || bad.api_error() != cuda::kErrorInvalidConfiguration) ++wrong;
    }
  };
  std::thread t([&] { run(d1, 5000); });
  run(d0, 0);
  t.join();
  EXPECT_EQ(wrong.load(), 0);
  ASSERT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(download<uint32_t>(d0, 2), (std::vector<uint32_t>{299, 300}));
  EXPECT_EQ(download<uint32_t>(d1, 2), (std::vector<uint32_t>{5299, 5300}));
}

TEST_F(PipelineTest, ManyClientsRunConcurrentlyWithoutInterference) {
  for (int i = 1; i < 4; ++i) add_client("c" + std::to_string(i));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (size_t ci = 0; ci < 4; ++ci) {
    threads.emplace_back([&, ci] {
      const int n = 4096;
      uint64_t d = 0;
      if (!api(ci).malloc(&d, n * 4).ok()) ++failures;
      for (int it = 0; it < 200; ++it) {
        auto p = args(client(ci).fill, d, static_cast<unsigned>(ci * 1000 + it), n);
        if (!api(ci).launch_kernel(client(ci).fill.handle, dims(n / 256, 256), 0, p).ok()) ++failures;
      }
      std::vector<uint32_t> out(n);
      if (!api(ci).memcpy(reinterpret_cast<uint64_t>(out.data()), d, n * 4, cuda::kMemcpyDeviceToHost).ok()) ++failures;
      for (int i = 0; i < n; ++i)
        if (out[i] != ci * 1000 + 199 + i) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(ws_->list_clients().size(), 4u);
}

TEST_F(PipelineTest, ManyThreadsOfOneClientShareItsPipeline) {
  const int threads = 4, per = 300;
  std::vector<uint64_t> bufs(threads);
  for (auto& b : bufs) b = alloc(64);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per; ++i) {
        uint32_t v = static_cast<uint32_t>(i);
        EXPECT_TRUE(api().memcpy(bufs[t], reinterpret_cast<uint64_t>(&v), 4, cuda::kMemcpyHostToDevice).ok());
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int t = 0; t < threads; ++t) EXPECT_EQ(download<uint32_t>(bufs[t], 1)[0], static_cast<uint32_t>(per - 1));
  EXPECT_GE(client_ptr()->stats().calls_submitted, static_cast<uint64_t>(threads * per));
}

TEST_F(PipelineTest, RemovingAClientDrainsItsWorkAndFreesItsMemory) {
  auto& b = add_client("victim");
  uint64_t before_free = 0, total = 0;
  ASSERT_TRUE(api(0).mem_get_info(&before_free, &total).ok());
  uint64_t d = 0;
  ASSERT_TRUE(b.api->malloc(&d, 64 << 20).ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(b.api->memset(d, i, 64 << 20).ok());
  uint64_t during = 0;
  ASSERT_TRUE(api(0).mem_get_info(&during, &total).ok());
  EXPECT_EQ(before_free - during, 64u << 20);
  ASSERT_TRUE(ws_->remove_client(b.uuid).ok());
  uint64_t after = 0;
  ASSERT_TRUE(api(0).mem_get_info(&after, &total).ok());
  EXPECT_EQ(after, before_free);
  EXPECT_EQ(b.api->memset(d, 0, 1).code(), Code::kNotFound);
}

TEST_F(PipelineTest, AClientsSlotIsNotHandedOutAgainBeforeItsRemovalIsComplete) {
  // A stop checkpoint (its drain held here) keeps its client's removal waiting for the outcome,
  // with the client already out of its slot. Meanwhile the slot must not go to a new client: the
  // old client's calls may still be inside, and its backend client still holds the slot's range.
  auto& b = add_client("victim");
  const uint64_t slot = b.uuid & 0xffff;
  std::shared_ptr<POSClient> victim = ws_->find_client(b.uuid);
  ASSERT_TRUE(victim);
  std::atomic<bool> hold{true}, cut{false};
  ckpt::MemoryImage image(ckpt::HostAllocator::plain());
  CheckpointRequest r;
  r.memory = &image;
  r.stop = true;
  r.hold_drain = &hold;
  r.on_cut = [&](uint64_t) { cut.store(true); };
  StatusOr<CheckpointResult> stopped = Status::Internal("not run");
  std::thread stopper([&] { stopped = victim->checkpoint(std::move(r)); });
  while (!cut.load()) std::this_thread::yield();
  std::atomic<bool> removed{false};
  std::thread remover([&] {
    EXPECT_TRUE(ws_->remove_client(b.uuid).ok());
    removed.store(true);
  });
  while (ws_->find_client(b.uuid)) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(removed.load()) << "the removal must wait for the stop checkpoint's outcome";
  auto during = ws_->create_client("during");
  EXPECT_TRUE(during.ok()) << during.status().to_string();  // not ASSERT: the threads must be joined
  if (during.ok()) {
    EXPECT_NE(*during & 0xffff, slot) << "a slot still being freed was handed to a new client";
  }
  hold.store(false);
  stopper.join();
  remover.join();
  EXPECT_TRUE(stopped.ok()) << stopped.status().to_string();
  EXPECT_TRUE(removed.load());
  auto after = ws_->create_client("after");
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  EXPECT_EQ(*after & 0xffff, slot) << "the freed slot (the lowest) must be handed out again";
}

TEST_F(PipelineTest, ContextsAreRecycledAcrossManyCalls) {
  Config c = test_config();
  c.queue_depth = 16;  // forces the pool and the back-pressure paths
  make_workspace(c);
  const uint64_t d = alloc(64);
  for (int i = 0; i < 5000; ++i) ASSERT_TRUE(api().memset(d, i & 0xff, 64).ok());
  EXPECT_EQ(download<uint8_t>(d, 1)[0], (4999 & 0xff));
}

TEST_F(PipelineTest, LatencyIsRecordedWhenEnabled) {
  Config c = test_config();
  c.record_latency = true;
  make_workspace(c);
  const uint64_t d = alloc(64);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(api().memset(d, 1, 64).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  const auto& h = client_ptr()->latency();
  EXPECT_GE(h.count(), 100u);
  EXPECT_GT(h.percentile_ns(0.5), 0u);
  EXPECT_LE(h.percentile_ns(0.5), h.percentile_ns(0.99));
}

// Thread names of this process (/proc/self/task/*/comm).
std::multiset<std::string> thread_names() {
  std::multiset<std::string> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    if (std::getline(f, comm)) out.insert(comm);
  }
  closedir(d);
  return out;
}

TEST_F(PipelineTest, EachClientsParserAndWorkerThreadsAreNamedAfterItsSlot) {
  add_client("second");
  // A call through the pipeline: both threads have run (and named themselves) by its answer.
  (void)alloc(64, 0);
  (void)alloc(64, 1);
  ASSERT_TRUE(api(0).device_synchronize().ok());
  ASSERT_TRUE(api(1).device_synchronize().ok());
  const auto names = thread_names();
  for (size_t i = 0; i < 2; ++i) {
    const std::string slot = std::to_string(client_ptr(i)->slot());
    EXPECT_EQ(names.count("pos-parse-" + slot), 1u) << "client " << i;
    EXPECT_EQ(names.count("pos-work-" + slot), 1u) << "client " << i;
  }
}

// ---- APIContext: parameters and the call's state word ----

std::vector<std::byte> bytes_of(uint64_t n, int seed) {
  std::vector<std::byte> b(n);
  for (uint64_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((seed * 31 + i) & 0xff);
  return b;
}

TEST(APIContext, ParametersBeyondTheInlineOnesKeepTheirSizesOffsetsAndBytes) {
  const std::vector<uint64_t> sizes = {8, 0, 3, 16, 1, 7, 12, 5, 24};  // more than kInlineParams
  ASSERT_GT(sizes.size(), APIContext::kInlineParams);
  std::vector<std::vector<std::byte>> data;
  std::vector<Param> ps;
  for (size_t i = 0; i < sizes.size(); ++i) data.push_back(bytes_of(sizes[i], static_cast<int>(i)));
  for (size_t i = 0; i < sizes.size(); ++i) ps.push_back(Param{data[i].data(), sizes[i]});
  auto c = std::make_unique<APIContext>();
  c->set_params(ps);
  ASSERT_EQ(c->param_count(), sizes.size());
  uint64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(c->param_size_of(i), sizes[i]) << i;
    EXPECT_EQ(c->param_offset(i), off) << i;
    EXPECT_EQ(c->param_offset(i) % 8, 0u) << i;
    const auto b = c->param_bytes(i);
    ASSERT_EQ(b.size(), sizes[i]);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), data[i].begin())) << i;
    off += (sizes[i] + 7) / 8 * 8;
  }
  EXPECT_EQ(c->param_size, off);
  uint64_t v = 0;
  EXPECT_TRUE(c->get(0, &v).ok());
  EXPECT_EQ(std::memcmp(&v, data[0].data(), 8), 0);
  const Status wrong = c->get(8, &v);  // 24 bytes, not 8
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("parameter 8 has 24 bytes, expected 8"), std::string::npos) << wrong.to_string();
  EXPECT_FALSE(c->get(9, &v).ok());
  EXPECT_FALSE(c->expect_params(2).ok());
  // Reused for a short call: nothing of the long one is left.
  c->recycle();
  EXPECT_EQ(c->param_count(), 0u);
  const uint64_t a = 7, b = 9;
  const Param two[] = {param_of(a), param_of(b)};
  c->set_params(two);
  ASSERT_TRUE(c->expect_params(2).ok());
  EXPECT_TRUE(c->get(1, &v).ok());
  EXPECT_EQ(v, 9u);
  EXPECT_TRUE(c->param_sizes_more.empty());
}

TEST(APIContext, SmallParametersStayInsideTheContextAndBigOnesGoToTheHeap) {
  auto c = std::make_unique<APIContext>();
  const auto small = bytes_of(APIContext::kInlineParamBytes, 1);
  const Param one[] = {Param{small.data(), small.size()}};
  c->set_params(one);
  EXPECT_EQ(c->param_base, c->param_inline);
  c->recycle();
  const auto big = bytes_of(APIContext::kInlineParamBytes + 1, 2);
  const Param other[] = {Param{big.data(), big.size()}};
  c->set_params(other);
  EXPECT_EQ(c->param_base, c->param_heap.data());
  const auto got = c->param_bytes(0);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), big.begin()));
  // An async copy takes the bytes with it; the context keeps none of them.
  const std::vector<std::byte> taken = c->take_params();
  EXPECT_EQ(taken.size(), (big.size() + 7) / 8 * 8);
  EXPECT_TRUE(std::equal(big.begin(), big.end(), taken.begin()));
}

TEST(APIContext, AFailedCallEndsInAStateOfItsOwnAndEachUseStartsAboveTheLast) {
  auto c = std::make_unique<APIContext>();
  const uint32_t base = c->state_base;
  c->advance(kParsed);
  EXPECT_EQ(c->state.load(), base + kParsed);
  EXPECT_FALSE(c->failed(c->state.load()));
  c->advance(kDone);  // ok status: done
  EXPECT_EQ(c->state.load(), base + kDone);
  EXPECT_FALSE(c->failed(c->state.load()));
  c->recycle();
  c->begin_parse();
  const uint32_t next = c->state_base;
  EXPECT_EQ(next, base + kStatesPerUse);
  // The word the last use left is below every value of this one: a waiter does not pass early.
  EXPECT_LT(static_cast<int32_t>(c->state.load() - (next + kParsed)), 0);
  c->status = Status::Cuda(cuda::kErrorInvalidValue, "bad");
  c->advance(kDone);  // a failed call: kFailed, which still counts as parsed and done
  const uint32_t seen = c->state.wait_at_least(next + kDone, 0);
  EXPECT_EQ(seen, next + kFailed);
  EXPECT_TRUE(c->failed(seen));
  EXPECT_GE(static_cast<int32_t>(seen - (next + kParsed)), 0);
}

TEST(APIContext, TheCallersReleaseFlagHasALineThatNoParserOrWorkerFieldShares) {
  // The submitter writes it after every call; on a line the parser or worker writes (the state
  // word's, as before), each store had to take that line back from them.
  constexpr size_t flag = offsetof(pos::APIContext, caller_released);
  EXPECT_EQ(flag % 64, 0u);
  EXPECT_GE(flag, offsetof(pos::APIContext, t_done_ns) + sizeof(uint64_t));
  EXPECT_GE(flag, offsetof(pos::APIContext, state) + 64);
  EXPECT_LE(sizeof(pos::APIContext) - flag, 64u);  // nothing after it
}

TEST(APIContext, TheFieldsEveryCallWritesSitOnTheParserBlocksFirstTwoLines) {
  // The parser and worker prefetch only these two lines of their block (client.cc).
  using pos::APIContext;
  constexpr size_t first = offsetof(APIContext, status);
  EXPECT_EQ(first % 64, 0u);
  for (size_t f : {offsetof(APIContext, h), offsetof(APIContext, ret_size), offsetof(APIContext, skip_worker),
                   offsetof(APIContext, ret_grown)})
    EXPECT_LT(f, first + 64);
  EXPECT_EQ(offsetof(APIContext, edges), first + 64);
  // The edge count comes first in InlineVec, so it shares that line with the first edge.
  auto c = std::make_unique<APIContext>();
  pos::Handle h;
  c->add_edge(&h, pos::EdgeKind::kIn);
  const auto* line = reinterpret_cast<const char*>(&c->edges);
  const auto* e0 = reinterpret_cast<const char*>(&c->edges[0]);
  EXPECT_LE(e0 + sizeof(pos::Edge), line + 64);
}

TEST(APIContext, SmallParametersOfEverySizeArriveWordForWord) {
  // The inline fast path copies whole words, then a 4-byte or shorter tail.
  for (uint64_t n = 0; n <= 40; ++n) {
    const auto a = bytes_of(n, static_cast<int>(n)), b = bytes_of(3, 7);
    const Param ps[] = {Param{a.data(), a.size()}, Param{b.data(), b.size()}};
    auto c = std::make_unique<APIContext>();
    c->set_params(ps);
    ASSERT_EQ(c->param_base, c->param_inline) << n;
    ASSERT_EQ(c->param_size_of(0), n);
    const auto got = c->param_bytes(0), got_b = c->param_bytes(1);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), a.begin())) << n;
    EXPECT_TRUE(std::equal(got_b.begin(), got_b.end(), b.begin())) << n;
    EXPECT_EQ(c->param_size, (n + 7) / 8 * 8 + 8) << n;
  }
}

TEST(APIContext, ABigResultBufferIsGivenBackWhenTheContextIsNextParsed) {
  auto c = std::make_unique<APIContext>();
  const auto big = bytes_of(APIContext::kKeptRetBytes + 1, 3);
  c->set_ret_bytes(big.data(), big.size());
  EXPECT_TRUE(c->ret_grown);
  c->begin_parse();
  EXPECT_FALSE(c->ret_grown);
  EXPECT_EQ(c->ret.capacity(), 0u);
  EXPECT_EQ(c->ret_size, 0u);
  c->set_ret<uint64_t>(5);  // a small result keeps its buffer
  c->begin_parse();
  EXPECT_GE(c->ret.capacity(), sizeof(uint64_t));
}

TEST(StatusType, MessagesSurviveCopiesAndMovesAndAnOkStatusCarriesNone) {
  const Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_TRUE(ok.message().empty());
  Status e = Status::NotFound("no such stream");
  Status copy = e;
  EXPECT_EQ(copy.message(), "no such stream");
  EXPECT_EQ(copy.api_error(), e.api_error());
  Status moved = std::move(copy);
  EXPECT_EQ(moved.message(), "no such stream");
  EXPECT_EQ(moved.code(), Code::kNotFound);
  moved = ok;  // an error overwritten by ok has no message left
  EXPECT_TRUE(moved.ok());
  EXPECT_TRUE(moved.message().empty());
  moved = Status::Internal("x");
  moved = moved;  // self-assignment keeps it
  EXPECT_EQ(moved.message(), "x");
  EXPECT_EQ(e.with_context("cudaStreamQuery").message(), "cudaStreamQuery: no such stream");
  EXPECT_EQ(Status(Code::kBusy, 1, "").message(), "");  // an empty message allocates nothing
}

TEST_F(PipelineTest, AFailedCallStillReturnsItsErrorAndTheNextCallSucceeds) {
  // The caller reads a call's status only when the state says it failed: both answers must arrive.
  const uint64_t d = alloc(64);
  for (int i = 0; i < 100; ++i) {
    const Status bad = api().memset(d + 32, 0, 64);  // past the end of the buffer
    ASSERT_FALSE(bad.ok()) << i;
    EXPECT_EQ(bad.api_error(), cuda::kErrorInvalidValue) << bad.to_string();
    ASSERT_TRUE(api().memset(d, i & 0xff, 64).ok()) << i;
  }
  EXPECT_EQ(download<uint8_t>(d, 1)[0], 99);
}

TEST(CallProfile, CountsCallsPerApiAndReportsTimesAndTheWorkersShare) {
  CallProfile p;
  const auto launch = static_cast<uint32_t>(ApiId::kLaunchKernel), sync = static_cast<uint32_t>(ApiId::kDeviceSynchronize);
  for (int i = 0; i < 4; ++i) {
    p.add_submit(launch, 2'000);
    p.add_parse(launch, 500);
    p.add_work(launch, 3'000);
  }
  p.add_submit(sync, 90'000);
  p.add_parse(sync, 1'000);
  p.add_work(sync, 80'000);
  p.add_worker_idle(7'000);   // before the first call: not counted
  p.worker_seen(1'000'000);
  p.add_worker_idle(50'000);  // between calls: counted
  p.worker_seen(1'200'000);
  const std::string r = p.report("test");
  // By worker time: the synchronize (80 us) above the launches (4 x 3 us).
  const size_t s = r.find("cudaDeviceSynchronize"), l = r.find("cudaLaunchKernel");
  ASSERT_NE(s, std::string::npos) << r;
  ASSERT_NE(l, std::string::npos) << r;
  EXPECT_LT(s, l);
  EXPECT_NE(r.find("cudaLaunchKernel                            4        2.000        0.500        3.000"),
            std::string::npos) << r;
  EXPECT_NE(r.find("0.200 ms from first to last call; in worker functions 0.092 ms (46.0 %), waiting for calls "
                   "0.050 ms (25.0 %)"), std::string::npos) << r;
  EXPECT_EQ(r.find("cudaMalloc"), std::string::npos);  // never called: no row
}

}  // namespace
}  // namespace pos::test
