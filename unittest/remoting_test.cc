// remoting_test.cc — posd sessions end to end inside one process: handshake, the frame codec,
// posted calls and their deferred errors, arena and pageable copies, isolation (hostile copies and
// kernel arguments), quotas, bad frames, admission (who may connect), the devices a session sees.
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

#include "ckpt/image.h"
#include "ckpt/inspect.h"
#include "pos/base/cuda_errors.h"
#include "pos/base/hex.h"
#include "pos/base/text.h"
#include "pos/base/thread.h"
#include "unittest/api_fixture.h"
#include "pos/runtime.h"
#include "remoting/common/handshake.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"
#include "remoting/inproc/inproc_transport.h"
#include "remoting/server/control_client.h"
#include "unittest/stderr_capture.h"

namespace pos::test {
namespace {

class Posd : public ::testing::Test {
 protected:
  void SetUp() override { start(test_config()); }
  void TearDown() override {
    sessions_.clear();
    server_.reset();
  }
  void start(Config c) {
    apis_.clear();
    sessions_.clear();
    server_.reset();
    // A directory of its own (posd makes it, 0700, and removes it): posd refuses one others can write.
    c.posd_socket = ::testing::TempDir() + "posd-test-" + std::to_string(::getpid()) + "/posd.sock";
    c.posd_arena_bytes = 8ull << 20;  // staging slots of 512 KiB: copies below cross several chunks
    // A session process runs its client's host kernels: it loads them as a library.
    if (c.posd_isolation == Isolation::kProcess && c.backend == "host" && c.host_kernel_libraries.empty())
      if (const char* m = std::getenv("POS_TEST_KERNEL_MODULE"); m != nullptr && *m != '\0')
        c.host_kernel_libraries = {m};
    auto s = PosdServer::start(c);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server_ = std::move(s.value());
  }
  // posd.isolation: shared, for tests that look into posd's workspace or its session threads.
  void start_shared(Config c = test_config()) {
    c.posd_isolation = Isolation::kShared;
    start(c);
  }
  ShmSession& connect(const std::string& job = "test") {
    auto s = ShmSession::connect(server_->socket_path(), job);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) std::abort();
    sessions_.push_back(std::move(s.value()));
    apis_.push_back(std::make_unique<ApiClient>(sessions_.back().get()));
    return *sessions_.back();
  }
  ApiClient& api(size_t i = 0) { return *apis_[i]; }
  uint64_t alloc(uint64_t n, size_t i = 0) {
    uint64_t p = 0;
    Status s = api(i).malloc(&p, n);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return p;
  }
  // Waits (bounded, no sleep) until posd lists exactly `n` sessions.
  bool wait_sessions(size_t n) {
    for (int i = 0; i < 2'000'000; ++i) {
      if (server_->sessions().size() == n) return true;
      std::this_thread::yield();
    }
    return false;
  }

  std::unique_ptr<PosdServer> server_;
  std::vector<std::unique_ptr<ShmSession>> sessions_;
  std::vector<std::unique_ptr<ApiClient>> apis_;
};

int connect_raw(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Bounded wait (no sleep) for a condition another thread makes true.
template <typename F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(WireFormat, AFrameRoundTripsThroughTheDecoder) {
  uint64_t a = 7;
  const char text[] = "hello";
  std::array<Param, 2> p{Param{&a, 8}, Param{text, 5}};
  std::array<uint64_t, 2> sizes{8, 5};
  std::vector<std::byte> buf(wire::frame_bytes(sizes));
  wire::encode_frame(buf.data(), 0x203, wire::kFlagReply, 42, 16, p, sizes);
  wire::DecodedFrame f;
  ASSERT_TRUE(wire::decode_frame(buf.data(), buf.size(), nullptr, 0, &f).ok());
  EXPECT_EQ(f.h.api_id, 0x203u);
  EXPECT_EQ(f.h.seq, 42u);
  ASSERT_EQ(f.nparams, 2u);
  EXPECT_EQ(std::memcmp(f.params[0].data, &a, 8), 0);
  EXPECT_EQ(f.params[1].size, 5u);
  EXPECT_EQ(std::memcmp(f.params[1].data, text, 5), 0);
}

TEST(WireFormat, TheDecoderRefusesLengthsCountsAndArenaReferencesThatDoNotFit) {
  uint64_t a = 7;
  std::array<Param, 1> p{Param{&a, 8}};
  std::array<uint64_t, 1> sizes{8};
  std::vector<std::byte> good(wire::frame_bytes(sizes));
  wire::encode_frame(good.data(), 0x203, 0, 1, 0, p, sizes);
  wire::DecodedFrame f;
  EXPECT_EQ(wire::decode_frame(good.data(), good.size() - 8, nullptr, 0, &f).code(), Code::kCorrupt);  // truncated
  auto bad = good;
  bad[0] = std::byte{0};
  EXPECT_EQ(wire::decode_frame(bad.data(), bad.size(), nullptr, 0, &f).code(), Code::kCorrupt);  // magic
  bad = good;
  uint16_t many = 200;
  std::memcpy(bad.data() + 12, &many, 2);
  EXPECT_EQ(wire::decode_frame(bad.data(), bad.size(), nullptr, 0, &f).code(), Code::kCorrupt);  // nparams
  bad = good;
  uint64_t huge = 1ull << 40;
  std::memcpy(bad.data() + 32, &huge, 8);
  EXPECT_EQ(wire::decode_frame(bad.data(), bad.size(), nullptr, 0, &f).code(), Code::kCorrupt);  // size
  // An indirect parameter must lie inside the arena.
  std::vector<std::byte> arena(4096);
  uint64_t off = 4000;
  std::array<Param, 1> ip{Param{&off, 8}};
  std::array<uint64_t, 1> isz{200 | wire::kIndirect};
  std::vector<std::byte> ind(wire::frame_bytes(isz));
  wire::encode_frame(ind.data(), 0x203, 0, 1, 0, ip, isz);
  EXPECT_EQ(wire::decode_frame(ind.data(), ind.size(), arena.data(), arena.size(), &f).code(), Code::kCorrupt);
  off = 96;
  wire::encode_frame(ind.data(), 0x203, 0, 1, 0, ip, isz);
  ASSERT_TRUE(wire::decode_frame(ind.data(), ind.size(), arena.data(), arena.size(), &f).ok());
  EXPECT_EQ(f.params[0].data, arena.data() + 96);
}

TEST_F(Posd, WithoutADaemonConnectingFailsAtOnceWithAnInitializationError) {
  auto s = ShmSession::connect(::testing::TempDir() + "no-such-posd.sock", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().api_error(), cuda::kErrorInitializationError);
  EXPECT_NE(s.status().message().find("posd"), std::string::npos);
}

TEST_F(Posd, PageableAndArenaCopiesOfSeveralChunksRoundTrip) {
  connect();
  const uint64_t n = 3 * (1u << 20) + 12345;  // 3+ staging chunks
  std::vector<uint8_t> src(n), back(n);
  std::iota(src.begin(), src.end(), 0);
  const uint64_t d = alloc(n);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(src.data()), n, cuda::kMemcpyHostToDevice).ok());
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data()), d, n, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(src, back);
  // From cudaMallocHost memory (the arena): no staging, the daemon's DMA reads it in place.
  void* pinned = nullptr;
  ASSERT_TRUE(sessions_[0]->host_alloc(n, &pinned).ok());
  std::memset(pinned, 0x5a, n);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(pinned), n, cuda::kMemcpyDefault).ok());
  std::memset(pinned, 0, n);
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create(&s).ok());
  ASSERT_TRUE(api().memcpy_async(reinterpret_cast<uint64_t>(pinned), d, n, cuda::kMemcpyDeviceToHost, s).ok());
  ASSERT_TRUE(api().stream_synchronize(s).ok());
  EXPECT_EQ(static_cast<uint8_t*>(pinned)[0], 0x5a);
  EXPECT_EQ(static_cast<uint8_t*>(pinned)[n - 1], 0x5a);
  // Host to host never leaves the process.
  std::vector<uint8_t> h2(16, 1);
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(h2.data()), reinterpret_cast<uint64_t>(src.data()), 16,
                           cuda::kMemcpyHostToHost).ok());
  EXPECT_EQ(h2[5], src[5]);
  EXPECT_TRUE(sessions_[0]->host_free(pinned).ok());
  EXPECT_EQ(sessions_[0]->host_free(src.data()).api_error(), cuda::kErrorInvalidValue);
}

TEST_F(Posd, AsyncHostToDeviceCopiesOfEverySizeArriveInOrder) {
  connect();
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create(&s).ok());
  for (uint64_t n : {uint64_t{100}, uint64_t{200000}, uint64_t{3u << 20}}) {  // inline, arena block, too big
    std::vector<uint8_t> src(n, static_cast<uint8_t>(n)), back(n);
    const uint64_t d = alloc(n);
    ASSERT_TRUE(api().memcpy_async(d, reinterpret_cast<uint64_t>(src.data()), n, cuda::kMemcpyHostToDevice, s).ok());
    std::fill(src.begin(), src.end(), 0);  // staged at the call: changing the source now is harmless
    ASSERT_TRUE(api().stream_synchronize(s).ok());
    ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data()), d, n, cuda::kMemcpyDeviceToHost).ok());
    EXPECT_EQ(back[0], static_cast<uint8_t>(n)) << n;
    EXPECT_EQ(back[n - 1], static_cast<uint8_t>(n)) << n;
  }
}

TEST_F(Posd, APostedCallsErrorSurfacesAtTheNextSynchronousCall) {
  connect();
  const uint64_t d = alloc(4096);
  // A memset past the allocation's end is posted (returns at once); the sync reports it.
  EXPECT_TRUE(api().memset_async(d, 0, 8192, 0).ok());
  Status s = api().device_synchronize();
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidValue) << s.to_string();
  EXPECT_TRUE(api().device_synchronize().ok());  // reported once
}

TEST_F(Posd, APostedGetLastErrorTakesTheWorkersErrorAndTheNextReplyHandsItOverOnce) {
  ShmSession& s = connect();
  uint64_t h = 0;
  ASSERT_TRUE(api().cublas_create(&h).ok());
  const uint64_t d = alloc(1024);
  GemmArgs g{};
  g.entry = kGemmEntryGemmEx;
  g.m = g.n = g.k = 4, g.lda = g.ldb = g.ldc = 4, g.alpha = 1, g.a = g.b = g.c = d, g.batch = 1;
  g.a_type = g.b_type = g.c_type = 3;  // int8 in and out, float compute: only the worker refuses it
  g.compute_type = kCublasCompute32F;
  ASSERT_TRUE(api().cublas_gemm_ex(h, g).ok());  // posted
  const int32_t e = api().device_synchronize().api_error();  // the worker has run it; kept
  ASSERT_NE(e, 0);
  // cudaGetLastError's frame is posted: no round trip, the error it takes rides on the next reply.
  EXPECT_TRUE(api().get_last_error().ok());
  EXPECT_EQ(s.peek_async_error(), 0);
  EXPECT_TRUE(api().device_synchronize().ok());  // taken: no longer reported by syncs
  EXPECT_EQ(s.peek_async_error(), e);
  EXPECT_EQ(s.take_async_error(), e);
  EXPECT_EQ(s.take_async_error(), 0);
  EXPECT_TRUE(api().get_last_error().ok());
  EXPECT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(s.take_async_error(), 0);  // nothing new was taken
}

TEST_F(Posd, AClientCannotReachAnotherClientsMemoryOrTheDaemonsOwn) {
  connect("a");
  connect("b");
  const uint64_t a = alloc(4096, 0);
  std::vector<uint32_t> v(1024, 0xabcdef01u), w(1024, 0);
  ASSERT_TRUE(api(0).memcpy(a, reinterpret_cast<uint64_t>(v.data()), 4096, cuda::kMemcpyHostToDevice).ok());
  // b names a's buffer: an error, and a's bytes stay.
  Status s = api(1).memcpy(reinterpret_cast<uint64_t>(w.data()), a, 4096, cuda::kMemcpyDeviceToHost);
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(api(1).memset(a, 0, 4096).ok() && api(1).device_synchronize().ok(), false);
  ASSERT_TRUE(api(0).memcpy(reinterpret_cast<uint64_t>(w.data()), a, 4096, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(w, v);
  // A hostile client sends daemon addresses outside its arena as host pointers: refused by posd.
  const uint64_t bbuf = alloc(4096, 1);
  const uint64_t outside = sessions_[1]->welcome().daemon_arena_addr - 8192;
  const uint64_t other_arena = sessions_[0]->welcome().daemon_arena_addr;
  for (uint64_t host : {outside, other_arena}) {
    uint64_t n = 4096;
    int32_t kind = cuda::kMemcpyDeviceToHost;
    uint64_t src = bbuf;
    std::array<Param, 4> p{Param{&host, 8}, Param{&src, 8}, Param{&n, 8}, Param{&kind, 4}};
    EXPECT_EQ(sessions_[1]->call_untranslated_for_test(ApiId::kMemcpy, p).api_error(), cuda::kErrorInvalidValue);
    kind = cuda::kMemcpyHostToDevice;
    std::array<Param, 4> q{Param{&src, 8}, Param{&host, 8}, Param{&n, 8}, Param{&kind, 4}};
    EXPECT_EQ(sessions_[1]->call_untranslated_for_test(ApiId::kMemcpy, q).api_error(), cuda::kErrorInvalidValue);
  }
}

// Hole 1 of "Tenant isolation and daemon hardening": a kernel argument outside the POS window is
// no pointer to the parser, and the host kernel runs inside posd, where another session's pinned
// arena is mapped. The host backend refuses every pointer parameter that is not the client's own.
TEST_F(Posd, AKernelArgumentIntoAnotherSessionsArenaOrAtAWildAddressIsRefusedAndPosdServesOn) {
  if (backend_name() != "host")
    GTEST_SKIP() << "the pointer check is the host backend's; isolating clients on a GPU is separate work";
  ShmSession& victim = connect("victim");
  connect("hostile");
  const std::vector<std::byte> fatbin = test_fatbin();
  std::array<uint64_t, 2> module{};
  std::array<RegisteredFunction, 2> fill{};
  for (size_t i : {size_t{0}, size_t{1}}) {
    ASSERT_TRUE(api(i).register_fatbin(&module[i], fatbin).ok());
    ASSERT_TRUE(api(i).register_function(&fill[i], module[i], kTestFillName).ok());
    ASSERT_TRUE(fill[i].found);
  }
  auto fill_args = [&](uint64_t out, unsigned value, int n) {
    std::vector<std::byte> p(fill[1].param_bytes);
    std::memcpy(p.data() + fill[1].params[0].offset, &out, sizeof out);
    std::memcpy(p.data() + fill[1].params[1].offset, &value, sizeof value);
    std::memcpy(p.data() + fill[1].params[2].offset, &n, sizeof n);
    return p;
  };
  const LaunchDims dims{{4, 1, 1}, {256, 1, 1}, 0};
  // The victim's pinned block and its address in posd: the arena's first block after the staging
  // slots. Proven by the victim's own untranslated copy to that address, which lands in the block.
  void* pinned = nullptr;
  ASSERT_TRUE(victim.host_alloc(4096, &pinned).ok());
  const uint64_t in_posd = victim.welcome().daemon_arena_addr + ShmSession::kStageSlots * victim.stage_bytes();
  const uint64_t d = alloc(4096, 0);
  ASSERT_TRUE(api(0).memset(d, 0x11, 4096).ok());
  {
    uint64_t dst = in_posd, src = d, n = 4096;
    int32_t kind = cuda::kMemcpyDeviceToHost;
    std::array<Param, 4> p{Param{&dst, 8}, Param{&src, 8}, Param{&n, 8}, Param{&kind, 4}};
    ASSERT_TRUE(victim.call_untranslated_for_test(ApiId::kMemcpy, p).ok());
    ASSERT_EQ(static_cast<const uint8_t*>(pinned)[4095], 0x11) << "the block is not at " << hex(in_posd) << " in posd";
  }
  std::vector<uint8_t> secret(4096);
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(i * 13 + 5);
  std::memcpy(pinned, secret.data(), secret.size());

  // The hostile session launches its own registered kernel at the victim's block, then at a wild
  // address: each launch is posted, each sync reports an illegal address, and nothing ran.
  for (uint64_t bad : {in_posd, uint64_t{0x1000}}) {
    SCOPED_TRACE(hex(bad));
    auto p = fill_args(bad, 7u, 1024);
    ASSERT_TRUE(api(1).launch_kernel(fill[1].handle, dims, 0, p).ok());
    Status s = api(1).device_synchronize();
    EXPECT_EQ(s.api_error(), cuda::kErrorIllegalAddress) << s.to_string();
    EXPECT_NE(s.message().find(hex(bad)), std::string::npos) << s.message();
    (void)api(1).get_last_error();
    EXPECT_TRUE(api(1).device_synchronize().ok());
  }
  EXPECT_EQ(std::memcmp(pinned, secret.data(), secret.size()), 0) << "the victim's arena was written";

  // posd serves both sessions on: each runs a correct kernel and gets the right result.
  EXPECT_EQ(server_->sessions().size(), 2u);
  for (size_t i : {size_t{0}, size_t{1}}) {
    const uint64_t out = alloc(1024 * sizeof(unsigned), i);
    auto p = fill_args(out, 100u, 1024);
    ASSERT_TRUE(api(i).launch_kernel(fill[i].handle, dims, 0, p).ok());
    ASSERT_TRUE(api(i).device_synchronize().ok());
    std::vector<unsigned> got(1024);
    ASSERT_TRUE(api(i).memcpy(reinterpret_cast<uint64_t>(got.data()), out, 4096, cuda::kMemcpyDeviceToHost).ok());
    for (unsigned k = 0; k < 1024; ++k) ASSERT_EQ(got[k], 100u + k) << "session " << i << " element " << k;
  }
  EXPECT_EQ(std::memcmp(pinned, secret.data(), secret.size()), 0);
  ASSERT_TRUE(victim.host_free(pinned).ok());
}

// ---------------- session processes (posd.isolation: process) ----------------

// Sanitizer runtimes catch a segmentation fault themselves and end the process their own way.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

// A kernel's parameter buffer from values in the order of its parameters.
template <typename... A>
std::vector<std::byte> kernel_args(const RegisteredFunction& f, A... a) {
  EXPECT_EQ(f.params.size(), sizeof...(A));
  std::vector<std::byte> p(f.param_bytes);
  size_t i = 0;
  ((std::memcpy(p.data() + f.params[i].offset, &a, sizeof a), ++i), ...);
  return p;
}

// The test kernels of one session, by name.
struct Kernels {
  RegisteredFunction fill, peek, poke, fault;
};
Kernels register_kernels(ApiClient& api) {
  uint64_t module = 0;
  EXPECT_TRUE(api.register_fatbin(&module, test_fatbin()).ok());
  Kernels k;
  for (auto [f, name] : {std::pair{&k.fill, kTestFillName}, std::pair{&k.peek, kTestPeekName},
                         std::pair{&k.poke, kTestPokeName}, std::pair{&k.fault, kTestFaultName}}) {
    EXPECT_TRUE(api.register_function(f, module, name).ok());
    EXPECT_TRUE(f->found) << name;
  }
  return k;
}

// fill(out, base, n) and a check of the n values it wrote: the victim's proof that it computes right.
void expect_fill_works(ApiClient& api, const Kernels& k, unsigned base) {
  uint64_t out = 0;
  ASSERT_TRUE(api.malloc(&out, 1024 * sizeof(unsigned)).ok());
  const LaunchDims dims{{4, 1, 1}, {256, 1, 1}, 0};
  ASSERT_TRUE(api.launch_kernel(k.fill.handle, dims, 0, kernel_args(k.fill, out, base, 1024)).ok());
  ASSERT_TRUE(api.device_synchronize().ok());
  std::vector<unsigned> got(1024);
  ASSERT_TRUE(api.memcpy(reinterpret_cast<uint64_t>(got.data()), out, 4096, cuda::kMemcpyDeviceToHost).ok());
  for (unsigned i = 0; i < 1024; ++i) ASSERT_EQ(got[i], base + i) << "element " << i;
  ASSERT_TRUE(api.free(out).ok());
}

TEST_F(Posd, EachSessionRunsInAProcessOfItsOwnThatPsNames) {
  connect("one");
  connect("two");
  (void)alloc(4096, 0);
  (void)alloc(8192, 1);
  const auto all = server_->sessions();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_NE(all[0].server_pid, all[1].server_pid);
  for (const auto& s : all) {
    EXPECT_NE(s.server_pid, static_cast<uint32_t>(::getpid())) << s.job;
    EXPECT_EQ(::kill(static_cast<pid_t>(s.server_pid), 0), 0) << s.job;
    EXPECT_FALSE(s.ending) << s.job;
    EXPECT_EQ(s.stats.memory_in_use, s.job == "one" ? 4096u : 8192u) << s.job;
  }
  EXPECT_NE(all[0].uuid, all[1].uuid);  // one posd, distinct sessions, though each process has one client
  auto json = posd_control(server_->socket_path(), "ps");
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  EXPECT_NE(json->find("\"isolation\":\"process\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"server_pid\":" + std::to_string(all[0].server_pid)), std::string::npos) << *json;
}

// Hole 1 on every backend: a hostile kernel computes an address (from an integer parameter, which
// no parameter check can see through) into the victim's device buffer and its pinned arena, reads there, then
// writes there. In its own session process the address is the hostile's own memory or nothing:
// it never sees the victim's bytes, the victim's memory is unchanged, and the victim computes on.
// With posd.isolation: shared the same read does reach the victim: the documented cost of that mode.
TEST_F(Posd, AKernelThatComputesAnAddressReachesNoOtherSessionsMemoryWithASessionProcess) {
  // Under ThreadSanitizer the shared leg's cross-tenant read is reported for what it is, a read of
  // another client's memory with no ordering to that client's writes: the process leg runs alone.
  std::vector<Isolation> modes{Isolation::kProcess};
  if (!kThreadSanitizer) modes.push_back(Isolation::kShared);
  for (const Isolation mode : modes) {
    SCOPED_TRACE(mode == Isolation::kProcess ? "process" : "shared");
    Config c = test_config();
    c.posd_isolation = mode;
    start(c);
    ShmSession& victim = connect("victim");
    connect("hostile");
    const Kernels kv = register_kernels(api(0)), kh = register_kernels(api(1));
    std::vector<unsigned> secret(1024), pinned_secret(1024);
    for (unsigned i = 0; i < 1024; ++i) secret[i] = 0x5ec0000u + i * 7, pinned_secret[i] = 0xa7e0000u + i * 3;
    const uint64_t v = alloc(4096, 0);
    ASSERT_TRUE(api(0).memcpy(v, reinterpret_cast<uint64_t>(secret.data()), 4096, cuda::kMemcpyHostToDevice).ok());
    void* pinned = nullptr;
    ASSERT_TRUE(victim.host_alloc(4096, &pinned).ok());
    std::memcpy(pinned, pinned_secret.data(), 4096);
    // Where the victim's pinned block is in the process that serves it (after the staging slots).
    const uint64_t arena_block = victim.welcome().daemon_arena_addr + ShmSession::kStageSlots * victim.stage_bytes();

    const uint64_t out = alloc(4096, 1);
    const LaunchDims dims{{4, 1, 1}, {256, 1, 1}, 0};
    bool hostile_alive = true;
    for (const auto& [target, guarded] : {std::pair{v, &secret}, std::pair{arena_block, &pinned_secret}}) {
      if (!hostile_alive) break;
      SCOPED_TRACE(hex(target));
      ASSERT_TRUE(api(1).memset(out, 0, 4096).ok());
      (void)api(1).launch_kernel(kh.peek.handle, dims, 0, kernel_args(kh.peek, out, target ^ kTestHideMask, 1024));
      std::vector<unsigned> seen(1024, 0);
      const Status r = api(1).device_synchronize();
      const bool read = r.ok() &&
          api(1).memcpy(reinterpret_cast<uint64_t>(seen.data()), out, 4096, cuda::kMemcpyDeviceToHost).ok();
      if (mode == Isolation::kShared) {
        // One address space and one context for every client: the hostile read the victim's bytes.
        ASSERT_TRUE(read) << r.to_string();
        EXPECT_EQ(seen, *guarded);
        continue;
      }
      // Its own memory, or a fault that ended its own session: never the victim's bytes.
      if (read) EXPECT_NE(seen, *guarded);
      else hostile_alive = false;
      if (!hostile_alive) break;
      (void)api(1).launch_kernel(kh.poke.handle, dims, 0, kernel_args(kh.poke, target ^ kTestHideMask, 0xbadu, 1024));
      if (!api(1).device_synchronize().ok()) hostile_alive = false;
    }
    std::vector<unsigned> back(1024);
    ASSERT_TRUE(api(0).memcpy(reinterpret_cast<uint64_t>(back.data()), v, 4096, cuda::kMemcpyDeviceToHost).ok());
    EXPECT_EQ(back, secret) << "the victim's device buffer was written";
    EXPECT_EQ(std::memcmp(pinned, pinned_secret.data(), 4096), 0) << "the victim's arena was written";
    expect_fill_works(api(0), kv, 40u);
    ASSERT_TRUE(victim.host_free(pinned).ok());
  }
}

// A kernel that faults ends (or poisons) its own session only: the other session computes on,
// posd serves a new one, and with the host backend posd says which session process died and how.
TEST_F(Posd, AClientWhoseKernelFaultsEndsAloneAndTheOtherFinishesWithTheRightResult) {
  test::StderrCapture cap("posd_fault");
  connect("victim");
  connect("faulty");
  const Kernels kv = register_kernels(api(0)), kf = register_kernels(api(1));
  expect_fill_works(api(0), kv, 1u);
  const uint32_t faulty_server = [&] {
    for (const auto& s : server_->sessions())
      if (s.job == "faulty") return s.server_pid;
    return 0u;
  }();
  ASSERT_NE(faulty_server, 0u);
  const LaunchDims one{{1, 1, 1}, {1, 1, 1}, 0};
  (void)api(1).launch_kernel(kf.fault.handle, one, 0, kernel_args(kf.fault, 8));
  const Status s = api(1).device_synchronize();
  EXPECT_FALSE(s.ok());
  // Everything after fails too: a GPU context that faulted is lost, as natively; a host session
  // process that faulted is gone.
  uint64_t p = 0;
  EXPECT_FALSE(api(1).malloc(&p, 4096).ok() && api(1).device_synchronize().ok());
  expect_fill_works(api(0), kv, 2u);
  connect("next");
  const Kernels kn = register_kernels(api(2));
  expect_fill_works(api(2), kn, 3u);
  expect_fill_works(api(0), kv, 4u);
  if (backend_name() == "host") {
    ASSERT_TRUE(eventually([&] { return ::kill(static_cast<pid_t>(faulty_server), 0) != 0; }));
    ASSERT_TRUE(eventually([&] { return cap.text().find("no other session is affected") != std::string::npos; }));
    cap.stop();
    const std::string t = cap.text();
    EXPECT_NE(t.find("'faulty'): its session process " + std::to_string(faulty_server) +
                     (kSanitized ? " " : " was killed by signal 11")),
              std::string::npos) << t;
    const auto left = server_->sessions();
    EXPECT_EQ(left.size(), 2u);
    for (const auto& x : left) EXPECT_NE(x.job, "faulty");
  }
}

// ---------------- dumps of a running job's GPU state (pos-cli dump --leave-running) ----------------

// The bytes an image holds for the buffer at `addr` (empty if it holds none).
std::vector<uint8_t> image_bytes(const std::string& dir, uint64_t addr) {
  auto img = ckpt::ImageReader::open_dir(dir);
  EXPECT_TRUE(img.ok()) << img.status().to_string();
  if (!img.ok()) return {};
  for (const auto& h : (*img)->client().handles()) {
    if (!h.has_memory() || h.addr() != addr) continue;
    auto where = (*img)->resolve(h);
    EXPECT_TRUE(where.ok());
    if (!where.ok()) return {};
    const auto& [owner, ref] = *where;
    std::vector<uint8_t> out(ref->length());
    for (uint64_t off = 0; off < ref->length(); off += ref->chunk_size()) {
      const uint64_t n = std::min<uint64_t>(ref->chunk_size(), ref->length() - off);
      EXPECT_TRUE(owner->read_chunk(*ref, off, n, reinterpret_cast<std::byte*>(out.data() + off)).ok());
    }
    return out;
  }
  return {};
}

std::string dump_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "posd-dump-" + std::to_string(::getpid()) + "-" + name;
  std::filesystem::remove_all(d);
  return d;
}

TEST_F(Posd, ADumpThatLeavesTheJobRunningSavesItsGpuStateAtOneCutAndTheJobRunsOn) {
  connect("trainer");
  const uint64_t d = alloc(1 << 20);
  std::vector<uint8_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 31 + 7);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(pattern.data()), pattern.size(), cuda::kMemcpyHostToDevice).ok());
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string dir = dump_dir(async ? "async" : "sync");
    uint64_t last_done = 0, calls = 0;
    auto r = posd_checkpoint(server_->socket_path(), static_cast<uint32_t>(::getpid()), dir, async,
                             [&](uint64_t done, uint64_t total) {
                               EXPECT_LE(done, total);
                               last_done = done, ++calls;
                             });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->image, dir + "/gpu");
    EXPECT_GE(r->bytes_stored, pattern.size());
    EXPECT_GT(r->handles, 0u);
    EXPECT_GT(r->cut_pc, 0u);
    EXPECT_EQ(image_bytes(dir + "/gpu", d), pattern);
    // The image passes every check pos-cli inspect makes, every checksum included.
    auto img = ckpt::ImageReader::open_dir(dir + "/gpu");
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    auto v = ckpt::verify_image(**img);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_GE(v->bytes, pattern.size());
    // The job runs on: it writes and reads its buffer as before.
    ASSERT_TRUE(api().memset(d, async ? 0x5a : 0x33, 4096).ok());
    std::vector<uint8_t> back(4096);
    ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data()), d, 4096, cuda::kMemcpyDeviceToHost).ok());
    EXPECT_EQ(back, std::vector<uint8_t>(4096, async ? 0x5a : 0x33));
    std::fill(pattern.begin(), pattern.begin() + 4096, async ? 0x5a : 0x33);
    // A second dump into the same directory is refused before posd is asked: the image stays.
    auto again = posd_checkpoint(server_->socket_path(), static_cast<uint32_t>(::getpid()), dir, async);
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.status().message().find("already holds an image"), std::string::npos) << again.status().message();
    std::filesystem::remove_all(dir);
  }
  EXPECT_EQ(server_->sessions().size(), 1u);
}

TEST_F(Posd, AnEstimateAgainstAnEarlierDumpTellsTheBytesWrittenSinceAndWritesNothing) {
  connect("trainer");
  const uint64_t a = alloc(1 << 20), b = alloc(256 << 10);
  ASSERT_TRUE(api().memset(a, 1, 1 << 20).ok());
  ASSERT_TRUE(api().memset(b, 2, 256 << 10).ok());
  const auto pid = static_cast<uint32_t>(::getpid());
  const std::string dir = dump_dir("est-base");
  auto base = posd_checkpoint(server_->socket_path(), pid, dir, /*async=*/true);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  ASSERT_TRUE(api().memset(b, 3, 4096).ok());
  auto e = posd_estimate_increment(server_->socket_path(), pid, dir);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->bytes_stored, 256u << 10);  // b was written since, a was not
  EXPECT_GE(e->bytes_referenced, 1u << 20);
  EXPECT_GT(e->cut_pc, base->cut_pc);
  EXPECT_TRUE(e->image.empty());
  // Flag 32: what was written from a call on, rewrites included. Nothing yet since e's point;
  // then b rewritten: counted in the window, while against the image it is the same 256 KiB.
  auto none = posd_estimate_increment(server_->socket_path(), pid, dir, e->cut_pc);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->bytes_stored, 0u);
  ASSERT_TRUE(api().memset(b, 4, 4096).ok());
  auto window = posd_estimate_increment(server_->socket_path(), pid, dir, e->cut_pc);
  ASSERT_TRUE(window.ok()) << window.status().to_string();
  EXPECT_EQ(window->bytes_stored, 256u << 10);
  EXPECT_GT(window->cut_pc, e->cut_pc);
  auto later = posd_estimate_increment(server_->socket_path(), pid, dir, window->cut_pc);
  ASSERT_TRUE(later.ok()) << later.status().to_string();
  EXPECT_EQ(later->bytes_stored, 0u);
  auto against_image = posd_estimate_increment(server_->socket_path(), pid, dir);
  ASSERT_TRUE(against_image.ok());
  EXPECT_EQ(against_image->bytes_stored, e->bytes_stored);
  // Nothing was written beside the earlier image.
  size_t entries = 0;
  for (const auto& x : std::filesystem::directory_iterator(dir)) entries += x.path().filename() != "gpu";
  EXPECT_EQ(entries, 0u);
  // Another user (not root) may not ask it either.
  server_->set_caller_uid_for_test(static_cast<int64_t>(::getuid()) + 4242);
  auto other = posd_estimate_increment(server_->socket_path(), pid, dir);
  server_->set_caller_uid_for_test(-1);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("may not dump"), std::string::npos) << other.status().message();
  // Flag 16 with anything but flag 1 (and 32) is refused by posd; so are flag 32 without 16, or
  // without a call number, and a call number without flag 32.
  const uint32_t since_flags = wire::kCheckpointEstimate | wire::kCheckpointIncremental | wire::kCheckpointSince;
  const std::vector<std::tuple<uint32_t, uint64_t, const char*>> refused{
      {wire::kCheckpointEstimate, 0, "an estimate (flag 16)"},
      {wire::kCheckpointEstimate | wire::kCheckpointIncremental | wire::kCheckpointWrites, 0, "an estimate (flag 16)"},
      {wire::kCheckpointIncremental | wire::kCheckpointSince, 5, "flag 32"},
      {since_flags, 0, "flag 32"},
      {wire::kCheckpointEstimate | wire::kCheckpointIncremental, 5, "flag 32"}};
  for (const auto& [flags, since, why] : refused) {
    SCOPED_TRACE(std::to_string(flags) + " since " + std::to_string(since));
    wire::Hello hello;
    hello.kind = static_cast<uint32_t>(wire::HelloKind::kControl);
    wire::put_cstr(hello.command, sizeof(hello.command), "checkpoint");
    auto fd = open_posd_socket(server_->socket_path(), hello);
    ASSERT_TRUE(fd.ok());
    wire::CheckpointBody body;
    body.target_pid = pid;
    body.flags = flags;
    body.since_call = since;
    if ((flags & wire::kCheckpointIncremental) != 0) wire::put_cstr(body.parent_path, sizeof(body.parent_path), "gpu");
    const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(d, 0);
    if ((flags & wire::kCheckpointIncremental) != 0) (void)send_with_fds(*fd, &body, sizeof(body), {d, d});
    else (void)send_with_fds(*fd, &body, sizeof(body), {d});
    ::close(d);
    wire::Welcome w;
    ASSERT_TRUE(recv_all(*fd, &w, sizeof(w)).ok());
    ::close(*fd);
    EXPECT_NE(w.code, 0);
    EXPECT_NE(std::string(w.message).find(why), std::string::npos) << w.message;
  }
  // The job is untouched, and a real incremental dump stores what was estimated.
  const std::string next = dump_dir("est-next");
  auto inc = posd_checkpoint(server_->socket_path(), pid, next, /*async=*/true, {}, {}, dir);
  ASSERT_TRUE(inc.ok()) << inc.status().to_string();
  EXPECT_EQ(inc->bytes_stored, e->bytes_stored);
  std::filesystem::remove_all(next);
  std::filesystem::remove_all(dir);
}

TEST_F(Posd, ADumpOfAnotherUsersJobAnUnknownPidOrAnAmbiguousOneIsRefusedAndChangesNothing) {
  connect("job");
  const uint64_t d = alloc(4096);
  ASSERT_TRUE(api().memset(d, 1, 4096).ok());
  const auto pid = static_cast<uint32_t>(::getpid());
  const std::string dir = dump_dir("refused");
  // Another user (not root): refused with who and why; nothing is written.
  server_->set_caller_uid_for_test(static_cast<int64_t>(::getuid()) + 4242);
  auto r = posd_checkpoint(server_->socket_path(), pid, dir, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("may not dump a job of uid " + std::to_string(::getuid())), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/gpu"));
  server_->set_caller_uid_for_test(-1);
  // A pid posd serves no session for.
  r = posd_checkpoint(server_->socket_path(), 0x7ffffff0u, dir, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has no session on this posd"), std::string::npos) << r.status().message();
  // Two sessions of one pid: which one is meant is not guessed.
  connect("second");
  r = posd_checkpoint(server_->socket_path(), pid, dir, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has 2 sessions"), std::string::npos) << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/gpu"));
  // The job is untouched.
  EXPECT_TRUE(api(0).device_synchronize().ok());
  EXPECT_EQ(server_->sessions().size(), 2u);
  std::filesystem::remove_all(dir);
}

TEST_F(Posd, APosdWithSharedIsolationRefusesADumpSayingWhy) {
  start_shared();
  connect("job");
  auto r = posd_checkpoint(server_->socket_path(), static_cast<uint32_t>(::getpid()), dump_dir("shared"), false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("posd.isolation: shared"), std::string::npos) << r.status().message();
}

TEST(Admission, OnlyRootAndTheJobsOwnUserMayDumpIt) {
  EXPECT_TRUE(authorize_job_control(0, 1000, "dump").ok());
  EXPECT_TRUE(authorize_job_control(1000, 1000, "dump").ok());
  Status s = authorize_job_control(1001, 1000, "dump");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("uid 1001 may not dump a job of uid 1000"), std::string::npos) << s.message();
}

// ---------------- detach and re-attach (docs/dump_restore.md) ----------------

std::string maps_text() {
  std::ifstream f("/proc/self/maps");
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

TEST_F(Posd, ADetachedJobsCallsWaitAndItComesBackWithEveryByteOfItsDeviceAndPinnedMemory) {
  ShmSession& s = connect("detacher");
  const uint64_t d = alloc(1 << 20);
  std::vector<uint8_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(pattern.data()), pattern.size(), cuda::kMemcpyHostToDevice).ok());
  void* pinned = nullptr;
  ASSERT_TRUE(s.host_alloc(4096, &pinned).ok());
  for (int i = 0; i < 4096; ++i) static_cast<uint8_t*>(pinned)[i] = static_cast<uint8_t>(255 - i % 251);
  const std::vector<uint8_t> pinned_before(static_cast<uint8_t*>(pinned), static_cast<uint8_t*>(pinned) + 4096);

  const std::string permit = ::testing::TempDir() + "posd-permit-" + std::to_string(::getpid());
  std::filesystem::remove(permit);
  auto token = posd_detach(server_->socket_path(), static_cast<uint32_t>(::getpid()), permit, 60000);
  ASSERT_TRUE(token.ok()) << token.status().to_string();
  EXPECT_EQ(token->size(), 32u);
  // Detached: the session memory stays mapped (CRIU dumps it with the process), so the pinned bytes
  // never move; no descriptor of posd is left (the socket and the eventfd are closed).
  EXPECT_NE(maps_text().find("pos-session"), std::string::npos);
  EXPECT_EQ(std::memcmp(pinned, pinned_before.data(), 4096), 0);
  EXPECT_EQ(server_->sessions().size(), 1u);  // the session and its GPU state stay
  // A call waits at its start until the job is back.
  std::atomic<bool> done{false};
  std::vector<uint8_t> back(pattern.size());
  Status late;
  std::thread caller([&] {
    late = api().memcpy(reinterpret_cast<uint64_t>(back.data()), d, back.size(), cuda::kMemcpyDeviceToHost);
    done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(done.load()) << "a call ran while the job was detached";
  ASSERT_TRUE(grant_reattach(permit).ok());
  caller.join();
  ASSERT_TRUE(late.ok()) << late.to_string();
  EXPECT_EQ(back, pattern);
  EXPECT_EQ(s.detaches(), 1u);
  EXPECT_FALSE(std::filesystem::exists(permit));  // used once
  // The pinned block is in the new session memory: posd reads it at the same address.
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(pinned), 4096, cuda::kMemcpyHostToDevice).ok());
  std::vector<uint8_t> head(4096);
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(head.data()), d, 4096, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(head, pinned_before);
  // Twice more, the second time without a permit: the job comes back by itself after the timeout.
  token = posd_detach(server_->socket_path(), static_cast<uint32_t>(::getpid()), permit, 60000);
  ASSERT_TRUE(token.ok()) << token.status().to_string();
  // While detached, another detach is refused: one dump at a time.
  auto second = posd_detach(server_->socket_path(), static_cast<uint32_t>(::getpid()), permit, 60000);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("detached already"), std::string::npos) << second.status().message();
  ASSERT_TRUE(grant_reattach(permit).ok());
  ASSERT_TRUE(eventually([&] { return s.detaches() == 2; }));
  token = posd_detach(server_->socket_path(), static_cast<uint32_t>(::getpid()), permit, 200);
  ASSERT_TRUE(token.ok()) << token.status().to_string();
  ASSERT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(s.detaches(), 3u);
  ASSERT_TRUE(s.host_free(pinned).ok());
}

// A training step's shape (pinned input copied in, work on the device, the result copied back into
// pinned memory, a stream sync) in a loop, while the job is detached and re-attached again and
// again at whatever point of the step it is: every step's result is right.
TEST_F(Posd, DetachesAtAnyPointOfAStepLoseNoCopyIntoOrOutOfPinnedMemory) {
  ShmSession& s = connect("stepper");
  const Kernels k = register_kernels(api());
  constexpr int kN = 1 << 16;
  void* in = nullptr;
  void* out = nullptr;
  ASSERT_TRUE(s.host_alloc(kN * sizeof(unsigned), &in).ok());
  ASSERT_TRUE(s.host_alloc(kN * sizeof(unsigned), &out).ok());
  const uint64_t d_in = alloc(kN * sizeof(unsigned)), d_out = alloc(kN * sizeof(unsigned));
  uint64_t stream = 0;
  ASSERT_TRUE(api().stream_create(&stream).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{-1}, steps{0};
  Status failed;
  std::thread job([&] {
    auto* pin = static_cast<unsigned*>(in);
    auto* pout = static_cast<unsigned*>(out);
    const LaunchDims dims{{kN / 256, 1, 1}, {256, 1, 1}, 0};
    for (unsigned step = 0; !stop.load() && bad.load() < 0; ++step) {
      for (int i = 0; i < kN; ++i) pin[i] = step * 7 + static_cast<unsigned>(i);
      Status st = api().memcpy_async(d_in, reinterpret_cast<uint64_t>(pin), kN * sizeof(unsigned), cuda::kMemcpyHostToDevice, stream);
      if (st.ok()) st = api().memcpy_async(d_out, d_in, kN * sizeof(unsigned), cuda::kMemcpyDeviceToDevice, stream);
      if (st.ok()) st = api().launch_kernel(k.fill.handle, dims, stream, kernel_args(k.fill, d_in, step, kN));
      if (st.ok()) st = api().memcpy_async(reinterpret_cast<uint64_t>(pout), d_out, kN * sizeof(unsigned), cuda::kMemcpyDeviceToHost, stream);
      if (st.ok()) st = api().stream_synchronize(stream);
      if (!st.ok()) {
        failed = st;
        bad.store(static_cast<int>(step));
        break;
      }
      for (int i = 0; i < kN; ++i)
        if (pout[i] != step * 7 + static_cast<unsigned>(i)) {
          failed = Status::Corrupt("element " + std::to_string(i) + " is " + std::to_string(pout[i]) + ", not " +
                                   std::to_string(step * 7 + static_cast<unsigned>(i)));
          bad.store(static_cast<int>(step));
          break;
        }
      steps.fetch_add(1);
    }
  });
  // However the loop below ends (an assertion returns early), the job thread is stopped and joined.
  struct Joiner {
    std::atomic<bool>* stop;
    std::thread* t;
    ~Joiner() {
      stop->store(true);
      if (t->joinable()) t->join();
    }
  } joiner{&stop, &job};
  const std::string permit = ::testing::TempDir() + "posd-permit3-" + std::to_string(::getpid());
  for (int round = 0; round < 20 && bad.load() < 0; ++round) {
    const uint64_t before = s.detaches();
    std::filesystem::remove(permit);
    auto t = posd_detach(server_->socket_path(), static_cast<uint32_t>(::getpid()), permit, 60000);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(grant_reattach(permit).ok());
    ASSERT_TRUE(eventually([&] { return s.detaches() == before + 1; }));
    const int at = steps.load();
    ASSERT_TRUE(eventually([&] { return steps.load() > at || bad.load() >= 0; }));
  }
  stop.store(true);
  if (job.joinable()) job.join();
  EXPECT_EQ(bad.load(), -1) << "step " << bad.load() << " came out wrong " << failed.to_string() << " after "
                            << s.detaches() << " detaches";
  EXPECT_EQ(s.detaches(), 20u);
}

TEST_F(Posd, AReattachWithAnUnknownOrUsedTokenAndADetachByAnotherUserAreRefused) {
  connect("job");
  ASSERT_TRUE(api().device_synchronize().ok());
  const std::string permit = ::testing::TempDir() + "posd-permit2-" + std::to_string(::getpid());
  server_->set_caller_uid_for_test(static_cast<int64_t>(::getuid()) + 4242);
  auto t = posd_detach(server_->socket_path(), static_cast<uint32_t>(::getpid()), permit, 60000);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("may not dump"), std::string::npos) << t.status().message();
  server_->set_caller_uid_for_test(-1);
  // A made-up token opens nothing.
  wire::Hello hello;
  hello.kind = static_cast<uint32_t>(wire::HelloKind::kReattach);
  hello.arena_bytes = 8ull << 20;
  wire::put_cstr(hello.command, sizeof(hello.command), "00112233445566778899aabbccddeeff");
  auto fd = open_posd_socket(server_->socket_path(), hello);
  ASSERT_TRUE(fd.ok());
  wire::Welcome w;
  ASSERT_TRUE(recv_all(*fd, &w, sizeof(w)).ok());
  ::close(*fd);
  EXPECT_NE(w.code, 0);
  EXPECT_NE(std::string(w.message).find("no detached session"), std::string::npos) << w.message;
  EXPECT_TRUE(api().device_synchronize().ok());
}

TEST_F(Posd, AMalformedFrameEndsThatSessionOnlyAndFreesItsMemory) {
  for (const Isolation mode : {Isolation::kProcess, Isolation::kShared}) {
    SCOPED_TRACE(mode == Isolation::kProcess ? "process" : "shared");
    Config c = test_config();
    c.posd_isolation = mode;
    start(c);
    connect("good");
    connect("bad");
    (void)alloc(1 << 20, 1);
    const auto before = server_->sessions();
    ASSERT_EQ(before.size(), 2u);
    const uint32_t bad_server = before[0].job == "bad" ? before[0].server_pid : before[1].server_pid;
    const uint64_t junk[8] = {0x1234, 0xffffffffffffffffull, 3, 4, 5, 6, 7, 8};
    ASSERT_TRUE(sessions_[1]->send_raw_for_test(junk, sizeof(junk)).ok());
    ASSERT_TRUE(wait_sessions(1));
    EXPECT_EQ(server_->sessions()[0].job, "good");
    Status s = api(1).device_synchronize();
    EXPECT_FALSE(s.ok());
    // The other session runs on; the bad one's megabyte went back to the device (with its own
    // process, the process is gone: nothing of the session is left anywhere).
    EXPECT_TRUE(api(0).device_synchronize().ok());
    if (mode == Isolation::kShared) {
      EXPECT_EQ(server_->workspace()->backend().reserved_bytes(), 0u);
    } else {
      EXPECT_NE(bad_server, static_cast<uint32_t>(::getpid()));
      EXPECT_TRUE(eventually([&] { return ::kill(static_cast<pid_t>(bad_server), 0) != 0 && errno == ESRCH; }));
    }
  }
}

// Hole 6 of "Tenant isolation and daemon hardening": a session posd closed for a malformed frame
// must not hold its slot (and the slot's device range) against the job's reconnect. Fifty times
// the session sends junk and a new one is opened at once, while posd may still be tearing the
// old one down: every reconnect is served, and its memory works.
TEST_F(Posd, ASessionOpenedRightAfterAMalformedFrameEndedTheLastOneIsServedEveryTime) {
  const uint64_t junk[8] = {0x1234, 0xffffffffffffffffull, 3, 4, 5, 6, 7, 8};
  auto s = ShmSession::connect(server_->socket_path(), "reconnect");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  int served = 0;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE((*s)->send_raw_for_test(junk, sizeof(junk)).ok());
    auto next = ShmSession::connect(server_->socket_path(), "reconnect");
    if (!next.ok()) {
      ADD_FAILURE() << "reconnect " << i << " refused: " << next.status().to_string();
      continue;  // the old session is closed either way; junk on it again changes nothing
    }
    ApiClient api(next->get());
    uint64_t d = 0;
    const Status m = api.malloc(&d, 1 << 20);
    EXPECT_TRUE(m.ok()) << "reconnect " << i << ": " << m.to_string();
    served += m.ok() ? 1 : 0;
    s = std::move(next);
  }
  EXPECT_EQ(served, 50);
}

TEST_F(Posd, AClosedSessionIsRemovedWithAllItsDeviceMemory) {
  start_shared();
  connect("leaver");
  (void)alloc(8 << 20);
  EXPECT_GT(server_->workspace()->backend().reserved_bytes(), 0u);
  apis_.clear();
  sessions_.clear();  // the process "exits": the socket closes
  ASSERT_TRUE(wait_sessions(0));
  EXPECT_EQ(server_->workspace()->backend().reserved_bytes(), 0u);
  EXPECT_TRUE(server_->workspace()->list_clients().empty());
}

TEST_F(Posd, TheQuotaBoundsCudaMallocAndIsWhatCudaMemGetInfoReports) {
  Config c = test_config();
  c.memory_quota = 8ull << 20;
  start(c);
  connect();
  uint64_t p = 0;
  EXPECT_TRUE(api().malloc(&p, 6 << 20).ok());
  EXPECT_EQ(api().malloc(&p, 4 << 20).api_error(), cuda::kErrorMemoryAllocation);
  uint64_t free = 0, total = 0;
  ASSERT_TRUE(api().mem_get_info(&free, &total).ok());
  EXPECT_EQ(total, 8ull << 20);
  EXPECT_LE(free, 2ull << 20);
}

TEST_F(Posd, PsListsEverySessionWithItsJobAndMemory) {
  connect("job-one");
  connect("job \"two\"");
  (void)alloc(2 << 20, 0);
  // cudaMalloc is answered by the parser; the memory is counted once the worker has run it (and
  // the session process has reported): under a sanitizer that can take a moment.
  auto json = posd_control(server_->socket_path(), "ps");
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       json.ok() && json->find("\"memory_bytes\":2097152") == std::string::npos &&
       std::chrono::steady_clock::now() < deadline;
       json = posd_control(server_->socket_path(), "ps"))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  EXPECT_NE(json->find("\"job\":\"job-one\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"job\":\"job \\\"two\\\"\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"pid\":" + std::to_string(::getpid())), std::string::npos);
  EXPECT_NE(json->find("\"memory_bytes\":2097152"), std::string::npos) << *json;
  auto table = posd_control(server_->socket_path(), "ps-table");
  ASSERT_TRUE(table.ok());
  EXPECT_NE(table->find("2 session(s)"), std::string::npos) << *table;
  EXPECT_EQ(posd_control(server_->socket_path(), "reboot").status().api_error(), cuda::kErrorInvalidValue);
}

TEST_F(Posd, PsShowsAJobNameOfEscapesControlsAndBadBytesEscapedInTheTableAndAsValidJson) {
  // A tenant's job name that would clear an operator's screen, ring, break the line and is not UTF-8.
  const std::string hostile = "evil\x1b[2J\a\nline2\xe9";
  const std::string shown = "evil\\x1b[2J\\x07\\x0aline2\\xe9";
  connect(hostile);
  auto table = posd_control(server_->socket_path(), "ps-table");
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  for (char raw : {'\x1b', '\a', '\xe9'}) EXPECT_EQ(table->find(raw), std::string::npos) << *table;
  EXPECT_EQ(std::count(table->begin(), table->end(), '\n'), 3) << *table;  // header, the session, the summary
  EXPECT_TRUE(is_utf8(*table)) << *table;
  EXPECT_NE(table->find(shown.substr(0, 24) + " "), std::string::npos) << *table;  // the 24-column JOB cell

  auto json = posd_control(server_->socket_path(), "ps");
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  EXPECT_TRUE(is_utf8(*json)) << *json;
  for (size_t i = 0; i + 1 < json->size(); ++i)
    EXPECT_GE(static_cast<unsigned char>((*json)[i]), 0x20) << "raw control byte at " << i << ": " << *json;
  // A real JSON parser reads it (python3's, which CI has: tools/test.sh uses it), and the one
  // session's job is the escaped text.
  const std::string path = ::testing::TempDir() + "ps_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(path, std::ios::binary);
    out << *json;
  }
  const std::string cmd = "python3 -c 'import json,sys; d=json.load(open(sys.argv[1], encoding=\"utf-8\")); "
                          "s=d[\"sessions\"]; print(len(s)); print(s[0][\"job\"], end=\"\")' " + path;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string parsed;
  char buf[512];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) parsed.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << "python3 could not parse: " << *json;
  std::remove(path.c_str());
  EXPECT_EQ(parsed, "1\n" + shown) << *json;
}

// posd's own log lines name the job too: the session's start and end, a malformed frame, a
// refusal. An operator reads them on a terminal, so they carry the name as the hello made it:
// printable text, never the tenant's escape sequence.
TEST_F(Posd, AJobNameWithAnEscapeSequenceReachesPosdsLogOnlyAsPrintableText) {
  const int level_before = g_log_level.load();
  Config c = test_config();
  c.log_level = LogLevel::kInfo;  // the session's start and end lines are at info
  c.max_clients = 2;
  start_shared(c);  // its slots are filled with in-process clients of posd's workspace below
  const std::string hostile = "evil\x1b[2J\a";
  const std::string shown = "evil\\x1b[2J\\x07";
  test::StderrCapture cap("posd_job_name");
  ShmSession& s = connect(hostile);
  const uint64_t junk[8] = {0x1234, 0xffffffffffffffffull, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(s.send_raw_for_test(junk, sizeof(junk)).ok());  // posd logs the error, then the end
  ASSERT_TRUE(wait_sessions(0));
  // Every slot taken by in-process clients: posd refuses the session and logs why, naming the job.
  auto a = server_->workspace()->create_client("in-process-a");
  auto b = server_->workspace()->create_client("in-process-b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto refused = ShmSession::connect(server_->socket_path(), hostile);
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(server_->workspace()->remove_client(*a).ok());
  EXPECT_TRUE(server_->workspace()->remove_client(*b).ok());
  // The end line comes after the client's removal: wait for it before reading.
  const bool ended = eventually([&] { return cap.text().find(" ended: ") != std::string::npos; });
  cap.stop();
  set_log_level(static_cast<LogLevel>(level_before));
  const std::string text = cap.text();
  ASSERT_TRUE(ended) << text;
  for (char raw : {'\x1b', '\a'}) EXPECT_EQ(text.find(raw), std::string::npos) << text;
  EXPECT_NE(text.find("job '" + shown + "'"), std::string::npos) << text;         // the session's start
  EXPECT_NE(text.find("'" + shown + "'): "), std::string::npos) << text;          // the malformed frame
  EXPECT_NE(text.find("'" + shown + "') ended"), std::string::npos) << text;      // its end
  EXPECT_NE(text.find("(" + shown + ") refused"), std::string::npos) << text;     // the refusal
}

TEST_F(Posd, AClientOfAnotherProtocolVersionIsRefusedWithAMessage) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, server_->socket_path().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  wire::Hello h;
  h.version = 99;
  ASSERT_EQ(::send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  wire::Welcome w;
  ASSERT_EQ(::recv(fd, &w, sizeof(w), MSG_WAITALL), static_cast<ssize_t>(sizeof(w)));
  ::close(fd);
  EXPECT_NE(w.code, 0);
  EXPECT_NE(std::string(w.message).find("protocol version 99"), std::string::npos) << w.message;
  EXPECT_TRUE(server_->sessions().empty());
}

TEST_F(Posd, ASecondPosdsLivenessProbeIsLoggedAtDebugAndNotAsABadClient) {
  const int level_before = g_log_level.load();
  Config c = test_config();
  c.log_level = LogLevel::kDebug;  // so that the probe's line, at debug, is there to be seen
  start(c);
  test::StderrCapture cap("posd_probe");
  Config second = c;
  second.posd_socket = server_->socket_path();
  auto refused = PosdServer::start(second);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kBusy);
  EXPECT_NE(refused.status().message().find("another posd is listening"), std::string::npos);
  const bool seen = eventually([&] { return server_->probes_seen() == 1; });
  cap.stop();
  set_log_level(static_cast<LogLevel>(level_before));
  ASSERT_TRUE(seen) << "the running posd never saw the probe; stderr: " << cap.text();
  EXPECT_TRUE(cap.lines_at("warn").empty()) << cap.text();
  EXPECT_TRUE(cap.lines_at("error").empty()) << cap.text();
  const auto debug = cap.lines_at("debug");
  const std::string who = "posd: pid " + std::to_string(::getpid());
  EXPECT_TRUE(std::any_of(debug.begin(), debug.end(), [&](const std::string& l) {
    return l.find(who) != std::string::npos && l.find("liveness probe") != std::string::npos;
  })) << cap.text();
}

// The other side of the probe rule: a peer that sends part of a hello and hangs up is still a
// client gone wrong, and said so at warn.
TEST_F(Posd, APeerThatHangsUpMidHelloIsStillWarnedAboutAndIsNoProbe) {
  test::StderrCapture cap("posd_partial_hello");
  const int fd = connect_raw(server_->socket_path());
  ASSERT_GE(fd, 0);
  const uint32_t part = wire::kHelloMagic;
  ASSERT_EQ(::send(fd, &part, sizeof(part), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(part)));
  ::close(fd);
  const bool warned = eventually([&] { return !cap.lines_at("warn").empty(); });
  cap.stop();
  ASSERT_TRUE(warned) << "no warning; stderr: " << cap.text();
  EXPECT_NE(cap.lines_at("warn")[0].find("posd: pid " + std::to_string(::getpid()) + " sent no valid hello"),
            std::string::npos)
      << cap.text();
  EXPECT_EQ(server_->probes_seen(), 0u);
}

TEST_F(Posd, ManySessionsRunConcurrentlyEachOnItsOwnData) {
  constexpr int kSessions = 4;
  for (int i = 0; i < kSessions; ++i) connect("c" + std::to_string(i));
  std::vector<std::thread> threads;
  std::vector<int> ok(kSessions, 0);
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      const uint64_t n = 1 << 20;
      std::vector<uint8_t> src(n, static_cast<uint8_t>(i + 1)), back(n);
      uint64_t d = 0;
      if (!api(i).malloc(&d, n).ok()) return;
      for (int round = 0; round < 5; ++round) {
        if (!api(i).memcpy(d, reinterpret_cast<uint64_t>(src.data()), n, cuda::kMemcpyHostToDevice).ok()) return;
        if (!api(i).memcpy(reinterpret_cast<uint64_t>(back.data()), d, n, cuda::kMemcpyDeviceToHost).ok()) return;
        if (back != src) return;
      }
      ok[i] = 1;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(ok[i], 1) << "session " << i;
}

// ---------------- pageable copies through the staging slots ----------------

// Bytes no power-of-two stride repeats, so a chunk or piece landing one slot off shows.
std::vector<uint8_t> pattern(uint64_t n) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + i / 251 + 1);
  return v;
}

TEST_F(Posd, LargePageableCopiesAtOddSizesAndOffsetsArriveWhole) {
  connect();
  sessions_[0]->set_copy_threads(3);
  const uint64_t stage = sessions_[0]->stage_bytes();  // 512 KiB with this arena
  ASSERT_GE(stage, 64u << 10);
  const uint64_t cap = 11 * stage + 8192;
  const std::vector<uint8_t> bytes = pattern(cap);
  const uint64_t d = alloc(cap);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(bytes.data()), cap, cuda::kMemcpyHostToDevice).ok());
  auto check_d2h = [&](uint64_t n, uint64_t src_off, uint64_t dst_off, const char* how) {
    std::vector<uint8_t> back(n + 64, 0xee);
    ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data() + dst_off), d + src_off, n,
                             cuda::kMemcpyDeviceToHost).ok());
    ASSERT_EQ(std::memcmp(back.data() + dst_off, bytes.data() + src_off, n), 0)
        << how << ": " << n << " bytes from +" << src_off << " to +" << dst_off;
    for (uint64_t i = 0; i < dst_off; ++i) ASSERT_EQ(back[i], 0xee);
    for (uint64_t i = dst_off + n; i < back.size(); ++i) ASSERT_EQ(back[i], 0xee) << how << ": past " << n;
  };
  // Around one slot, around all four (posd runs that far ahead), and many chunks with a short tail.
  for (uint64_t n : {stage - 1, stage, stage + 1, 4 * stage - 3, 4 * stage, 4 * stage + 5, 9 * stage + 4097,
                     11 * stage + 1}) {
    for (uint64_t src_off : {uint64_t{0}, uint64_t{5}}) {
      for (uint64_t dst_off : {uint64_t{0}, uint64_t{3}}) check_d2h(n, src_off, dst_off, "posted chunks");
    }
  }
  // Host to device from an odd offset of a pageable buffer, read back whole.
  std::vector<uint8_t> shifted(cap + 3, 0);
  std::memcpy(shifted.data() + 3, bytes.data(), cap - 1);
  ASSERT_TRUE(api().memcpy(d + 1, reinterpret_cast<uint64_t>(shifted.data() + 3), cap - 1,
                           cuda::kMemcpyHostToDevice).ok());
  std::vector<uint8_t> whole(cap);
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(whole.data()), d, cap, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(std::memcmp(whole.data() + 1, bytes.data(), cap - 1), 0);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(bytes.data()), cap, cuda::kMemcpyHostToDevice).ok());
  // Device to pageable memory with cudaMemcpyAsync (staged the same way, after the stream).
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create(&s).ok());
  std::vector<uint8_t> back(cap - 7, 0);
  ASSERT_TRUE(api().memcpy_async(reinterpret_cast<uint64_t>(back.data()), d + 7, cap - 7, cuda::kMemcpyDeviceToHost, s)
                  .ok());
  EXPECT_EQ(std::memcmp(back.data(), bytes.data() + 7, cap - 7), 0);
  // A copy running past the buffer's end fails, whether the failing chunks were posted or not.
  std::vector<uint8_t> big(cap);
  EXPECT_EQ(api().memcpy(reinterpret_cast<uint64_t>(big.data()), d + 2 * stage + 8192, cap, cuda::kMemcpyDeviceToHost)
                .api_error(),
            cuda::kErrorInvalidValue);
  EXPECT_TRUE(api().device_synchronize().ok());  // reported once
  // One thread, and every chunk waiting for its verdict (POS_CLIENT_POST=0): the same bytes.
  sessions_[0]->set_copy_threads(1);
  check_d2h(9 * stage + 4097, 5, 3, "one copy thread");
  sessions_[0]->set_post_async(false);
  sessions_[0]->set_copy_threads(2);
  check_d2h(9 * stage + 4097, 5, 3, "no posted calls");
  EXPECT_EQ(api().memcpy(reinterpret_cast<uint64_t>(big.data()), d + 2 * stage + 8192, cap, cuda::kMemcpyDeviceToHost)
                .api_error(),
            cuda::kErrorInvalidValue);
}

// ---------------- where posd listens (hole 2: socket squatting) ----------------

// A directory of the test's own (mkdtemp: 0700), removed with everything in it at the end.
class TempDirectory {
 public:
  explicit TempDirectory(const std::string& tag) {
    std::string t = ::testing::TempDir() + tag + "-XXXXXX";
    if (::mkdtemp(t.data()) != nullptr) path_ = t;
    EXPECT_FALSE(path_.empty()) << "mkdtemp " << t << ": " << std::strerror(errno);
  }
  ~TempDirectory() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets (or, with nullptr, unsets) an environment variable for a scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old, had_ = true;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv(name, value.c_str()) {}
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A listening socket that is not posd, as a local user who bound the path first would run it: it
// accepts every connection and counts what it is sent (each connection until the peer hangs up or
// is silent for 200 ms, then closed).
class Squatter {
 public:
  explicit Squatter(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    EXPECT_EQ(::listen(fd_, 16), 0);
    thread_ = std::thread([this] { run(); });
  }
  ~Squatter() {
    stop_.store(true);
    thread_.join();
    ::close(fd_);
  }
  uint64_t connections() const { return connections_.load(); }
  uint64_t bytes() const { return bytes_.load(); }

 private:
  void run() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      for (;;) {
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 200) <= 0) break;
        char buf[512];
        const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        bytes_.fetch_add(static_cast<uint64_t>(n));
      }
      ::close(c);
      connections_.fetch_add(1);  // after its bytes: whoever sees the count sees them
    }
  }
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> connections_{0}, bytes_{0};
  std::thread thread_;
};

bool is_private_default(const std::string& path, uint32_t uid) {
  const std::string u = std::to_string(uid);
  return path == "/run/user/" + u + "/pos/posd.sock" || path == "/tmp/pos-" + u + "/posd.sock";
}

TEST(SocketPath, TheDefaultSocketLivesInADirectoryOnlyItsUserOrRootCanWrite) {
  struct stat st {};
  if (::stat("/run", &st) == 0 && st.st_uid == 0) {
    EXPECT_EQ(private_socket_path(0, "/anything"), "/run/pos/posd.sock");
  }
  // Another user's socket is under $XDG_RUNTIME_DIR when that is a directory of theirs with mode 0700.
  TempDirectory xdg("pos-xdg");
  ASSERT_FALSE(xdg.path().empty());
  uint32_t uid = ::geteuid();
  if (uid == 0) {  // root plays another user: the directory becomes that user's
    uid = 4242;
    ASSERT_EQ(::chown(xdg.path().c_str(), uid, static_cast<gid_t>(-1)), 0);
  }
  EXPECT_EQ(private_socket_path(uid, xdg.path().c_str()), xdg.path() + "/pos/posd.sock");
  EXPECT_EQ(private_socket_path(uid, (xdg.path() + "/").c_str()), xdg.path() + "/pos/posd.sock");
  // Not when others may enter it, nor when it is someone else's, nor when it is no absolute path:
  // then /run/user/<uid>/pos if the user has /run/user/<uid>, else /tmp/pos-<uid>.
  EXPECT_TRUE(is_private_default(private_socket_path(uid, nullptr), uid)) << private_socket_path(uid, nullptr);
  EXPECT_TRUE(is_private_default(private_socket_path(uid + 1, xdg.path().c_str()), uid + 1));
  EXPECT_TRUE(is_private_default(private_socket_path(uid, "relative/dir"), uid));
  ASSERT_EQ(::chmod(xdg.path().c_str(), 0755), 0);
  EXPECT_TRUE(is_private_default(private_socket_path(uid, xdg.path().c_str()), uid));
  // Without POS_SOCKET a process's default is its own user's private socket: never a name that
  // anyone could take first in /tmp itself.
  ScopedEnv no_socket("POS_SOCKET", nullptr);
  const std::string d = default_socket_path();
  EXPECT_EQ(d, private_socket_path(::geteuid(), std::getenv("XDG_RUNTIME_DIR")));
  EXPECT_NE(d.substr(0, d.rfind('/')), "/tmp") << d;
  ScopedEnv given("POS_SOCKET", "/somewhere/posd.sock");
  EXPECT_EQ(default_socket_path(), "/somewhere/posd.sock");
}

TEST_F(Posd, PosdRefusesASocketDirectoryOthersCanWriteOrThatIsALinkOrSomeoneElses) {
  TempDirectory base("posd-dirs");
  Config c = test_config();
  auto refused = [&](const std::string& dir, const std::string& why) {
    c.posd_socket = dir + "/posd.sock";
    auto s = PosdServer::start(c);
    ASSERT_FALSE(s.ok()) << dir;
    EXPECT_EQ(s.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status().message();
    EXPECT_NE(::access(c.posd_socket.c_str(), F_OK), 0) << "posd bound " << c.posd_socket;
  };
  const std::string open = base.path() + "/open";
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  refused(open, open + " can be written by its group or others (mode 0777)");
  ASSERT_EQ(::chmod(open.c_str(), 0770), 0);
  refused(open, open + " can be written by its group or others (mode 0770)");
  const std::string good = base.path() + "/good", link = base.path() + "/link";
  ASSERT_EQ(::mkdir(good.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(good.c_str(), link.c_str()), 0);
  refused(link, link + " is a symbolic link");
  const std::string me = std::to_string(::geteuid());
  if (::geteuid() == 0) {  // only root can give a directory away
    ASSERT_EQ(::chown(good.c_str(), 4242, static_cast<gid_t>(-1)), 0);
    refused(good, good + " belongs to uid 4242, not to uid 0 (posd's)");
  }
  // The rule itself, for a user who cannot give a directory away: posd expects another owner.
  const Status other = check_socket_dir(base.path(), {::geteuid() + 1}, "uid " + std::to_string(::geteuid() + 1));
  EXPECT_EQ(other.code(), Code::kFailedPrecondition);
  EXPECT_NE(other.message().find(base.path() + " belongs to uid " + me + ", not to uid " +
                                 std::to_string(::geteuid() + 1)),
            std::string::npos)
      << other.message();
  EXPECT_TRUE(check_socket_dir(base.path(), {::geteuid()}, "uid " + me).ok());
}

TEST_F(Posd, PosdCreatesItsSocketDirectoryPrivateAndRemovesItAndTheSocketOnExit) {
  TempDirectory base("posd-mkdir");
  const std::string dir = base.path() + "/pos";
  Config c = test_config();
  c.posd_socket = dir + "/posd.sock";
  auto s = PosdServer::start(c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat(c.posd_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  (*s)->stop();
  EXPECT_NE(::access(c.posd_socket.c_str(), F_OK), 0);
  EXPECT_NE(::access(dir.c_str(), F_OK), 0) << "posd made " << dir << " and should remove it";
  s->reset();
  // With posd.group its members must reach the socket: search (x) on the directory, rw on the
  // socket. Nothing more: they need not list the directory.
  c.posd_group = std::to_string(::getgid());
  s = PosdServer::start(c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
  EXPECT_EQ(st.st_gid, ::getgid());
  ASSERT_EQ(::stat(c.posd_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  s->reset();
  // A directory that was there before posd is left there; the socket goes.
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  c.posd_group.clear();
  s = PosdServer::start(c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  s->reset();
  EXPECT_NE(::access(c.posd_socket.c_str(), F_OK), 0);
  EXPECT_EQ(::access(dir.c_str(), F_OK), 0);
}

TEST_F(Posd, WithNoSocketConfiguredPosdAndItsClientsMeetInTheUsersPrivateDirectory) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root's default is /run/pos/posd.sock, a system directory; "
                    "SocketPath.TheDefaultSocketLivesInADirectoryOnlyItsUserOrRootCanWrite covers it";
  TempDirectory xdg("pos-xdg");
  ScopedEnv runtime("XDG_RUNTIME_DIR", xdg.path());
  ScopedEnv no_socket("POS_SOCKET", nullptr);
  Config c = test_config();
  c.posd_socket.clear();
  auto s = PosdServer::start(c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ((*s)->socket_path(), xdg.path() + "/pos/posd.sock");
  auto session = ShmSession::connect(default_socket_path(), "default");
  ASSERT_TRUE(session.ok()) << session.status().to_string();
  ApiClient api(session->get());
  EXPECT_TRUE(api.device_synchronize().ok());
  session->reset();
  // A default directory another user could write is refused by the client before it connects.
  s->reset();
  const std::string dir = xdg.path() + "/pos";
  ASSERT_EQ(::mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  auto refused = ShmSession::connect(default_socket_path(), "default");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(dir + " can be written by its group or others"), std::string::npos)
      << refused.status().message();
}

TEST_F(Posd, AClientSendsNothingToASocketWhoseOwnerItDoesNotTrust) {
  TempDirectory dir("pos-squat");
  const std::string path = dir.path() + "/posd.sock";
  Squatter squatter(path);
  const std::string me = std::to_string(::geteuid()), other = std::to_string(::geteuid() + 1);
  {
    // POS_DAEMON_UID names the uid posd must run as: another one makes this test's own sockets foreign.
    ScopedEnv daemon_uid("POS_DAEMON_UID", other);
    auto s = ShmSession::connect(path, "victim");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().api_error(), cuda::kErrorInitializationError);
    EXPECT_NE(s.status().message().find("posd at " + path + " runs as uid " + me + ", expected uid " + other +
                                        " (POS_DAEMON_UID): refusing to send it this job"),
              std::string::npos)
        << s.status().message();
    auto ps = posd_control(path, "ps");
    ASSERT_FALSE(ps.ok());
    EXPECT_NE(ps.status().message().find("refusing to send it this request"), std::string::npos)
        << ps.status().message();
    auto real = ShmSession::connect(server_->socket_path(), "victim");  // posd itself, as seen by it
    ASSERT_FALSE(real.ok());
    EXPECT_NE(real.status().message().find("runs as uid " + me), std::string::npos) << real.status().message();
  }
  ASSERT_TRUE(eventually([&] { return squatter.connections() == 2; })) << squatter.connections();
  EXPECT_EQ(squatter.bytes(), 0u) << "the client sent the squatter its hello";
  EXPECT_TRUE(server_->sessions().empty());
  // By default a client trusts its own uid (and root): the same squatter, as this user, gets the
  // hello. So the count above would have seen one.
  auto trusted = ShmSession::connect(path, "victim");
  EXPECT_FALSE(trusted.ok());  // the squatter sends no welcome
  EXPECT_TRUE(eventually([&] { return squatter.bytes() == sizeof(wire::Hello); })) << squatter.bytes();
  connect("owner");  // and posd, this user's, serves it
  EXPECT_TRUE(api().device_synchronize().ok());
  // A POS_DAEMON_UID that is no uid is an error that names it.
  ScopedEnv bad("POS_DAEMON_UID", "pos");
  auto b = ShmSession::connect(server_->socket_path(), "x");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("POS_DAEMON_UID"), std::string::npos) << b.status().message();
}

// ---------------- bounded resources (hole 5: connection flood) ----------------

// This process's threads: posd's, and the test's own clients'.
size_t thread_count() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

// A welcome read off a raw connection: 0 bytes if posd closed it or said nothing within 2 s.
ssize_t read_welcome(int fd, wire::Welcome* w) {
  timeval tv{2, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const ssize_t n = ::recv(fd, w, sizeof(*w), MSG_WAITALL);
  return n < 0 ? 0 : n;
}

TEST_F(Posd, TwoHundredIdleConnectionsCostPosdNoThreadAndASessionStillOpensMeanwhile) {
  Config c = test_config();
  c.posd_max_pending = 256;  // every one of them is let wait for its hello
  start(c);
  connect("before");
  const uint64_t d = alloc(4096);
  const size_t before = thread_count();
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 200; ++i) {
    idle.emplace_back(connect_raw(server_->socket_path()));
    ASSERT_TRUE(idle.back()) << "connection " << i;
  }
  ASSERT_TRUE(eventually([&] { return server_->handshakes_waiting() == 200; })) << server_->handshakes_waiting();
  EXPECT_LE(thread_count(), before + 1) << "posd made threads for idle connections";
  // A real session opens meanwhile and costs its own threads only (posd's, its parser, its worker).
  connect("during");
  const uint64_t d2 = alloc(4096, 1);
  EXPECT_TRUE(api(1).memset(d2, 2, 4096).ok());
  EXPECT_TRUE(api(1).device_synchronize().ok());
  EXPECT_TRUE(api(0).memset(d, 1, 4096).ok());
  EXPECT_TRUE(api(0).device_synchronize().ok());
  EXPECT_LE(thread_count(), before + 3 + 1);
  idle.clear();
  EXPECT_TRUE(eventually([&] { return server_->handshakes_waiting() == 0; })) << server_->handshakes_waiting();
}

TEST_F(Posd, AConnectionThatSendsNoHelloIsClosedAtTheDeadline) {
  server_->set_hello_timeout_for_test(std::chrono::milliseconds(100));
  test::StderrCapture cap("posd_hello_deadline");
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 3; ++i) idle.emplace_back(connect_raw(server_->socket_path()));
  const uint32_t part = wire::kHelloMagic;  // a hello begun and never finished is held to it too
  ASSERT_EQ(::send(idle[2].get(), &part, sizeof(part), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(part)));
  for (auto& fd : idle) {
    wire::Welcome w;
    EXPECT_EQ(read_welcome(fd.get(), &w), 0) << "posd kept a silent connection open past its deadline";
  }
  ASSERT_TRUE(eventually([&] { return server_->handshakes_waiting() == 0; }));
  cap.stop();
  const auto warns = cap.lines_at("warn");
  EXPECT_TRUE(std::any_of(warns.begin(), warns.end(), [](const std::string& l) {
    return l.find("sent no hello within 100 ms; closed") != std::string::npos;
  })) << cap.text();
  connect("after");  // posd serves on
  EXPECT_TRUE(api().device_synchronize().ok());
}

TEST_F(Posd, ConnectionsBeyondMaxPendingAreRefusedAtOnceWithAMessage) {
  Config c = test_config();
  c.posd_max_pending = 4;
  start(c);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) idle.emplace_back(connect_raw(server_->socket_path()));
  ASSERT_TRUE(eventually([&] { return server_->handshakes_waiting() == 4; })) << server_->handshakes_waiting();
  UniqueFd fifth(connect_raw(server_->socket_path()));
  wire::Welcome w;
  ASSERT_EQ(read_welcome(fifth.get(), &w), static_cast<ssize_t>(sizeof(w))) << "no refusal for the fifth connection";
  EXPECT_EQ(w.code, static_cast<int32_t>(Code::kBusy));
  EXPECT_NE(std::string(w.message).find("too many connections waiting"), std::string::npos) << w.message;
  auto refused = ShmSession::connect(server_->socket_path(), "late");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("posd refused the session: too many connections waiting"),
            std::string::npos)
      << refused.status().message();
  idle.clear();
  ASSERT_TRUE(eventually([&] { return server_->handshakes_waiting() == 0; }));
  connect("after");
  EXPECT_TRUE(api().device_synchronize().ok());
}

TEST_F(Posd, ASessionBeyondTheMostPosdServesIsRefusedSayingSoAndOneAfterAnEndIsServed) {
  Config c = test_config();
  c.max_clients = 2;
  start(c);
  connect("one");
  connect("two");
  auto third = ShmSession::connect(server_->socket_path(), "three");
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().api_error(), cuda::kErrorInitializationError);
  EXPECT_NE(third.status().message().find("posd refused the session: posd has 2 sessions, the most it serves"),
            std::string::npos)
      << third.status().message();
  apis_[0].reset();
  sessions_[0].reset();  // "one" ends
  ASSERT_TRUE(wait_sessions(1));
  ShmSession& four = connect("four");
  ApiClient api4(&four);
  EXPECT_TRUE(api4.device_synchronize().ok());
}

TEST_F(Posd, AThreadPosdCannotStartRefusesThatSessionAndPosdServesOn) {
  start_shared();  // session threads, and the test hook that fails them, are posd's own with shared
  connect("before");
  test::StderrCapture cap("posd_no_thread");
  fail_thread_starts_for_test("posd's session thread", 1);
  auto refused = ShmSession::connect(server_->socket_path(), "no-thread");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cannot start posd's session thread: Resource temporarily unavailable"),
            std::string::npos)
      << refused.status().message();
  // The client's own threads are refused the same way: the session, not posd, fails.
  fail_thread_starts_for_test("the client's worker thread", 1);
  auto no_worker = ShmSession::connect(server_->socket_path(), "no-worker");
  ASSERT_FALSE(no_worker.ok());
  EXPECT_NE(no_worker.status().message().find("cannot start the client's worker thread"), std::string::npos)
      << no_worker.status().message();
  fail_thread_starts_for_test("", 0);
  cap.stop();
  const auto warns = cap.lines_at("warn");
  EXPECT_TRUE(std::any_of(warns.begin(), warns.end(), [](const std::string& l) {
    return l.find("(no-thread) refused: ") != std::string::npos && l.find("posd's session thread") != std::string::npos;
  })) << cap.text();
  EXPECT_EQ(server_->sessions().size(), 1u);
  EXPECT_EQ(server_->workspace()->list_clients().size(), 1u);  // nothing of the refused ones is left
  connect("after");
  const uint64_t d = alloc(4096, 1);
  EXPECT_TRUE(api(1).memset(d, 0, 4096).ok());
  EXPECT_TRUE(api(1).device_synchronize().ok());
  EXPECT_TRUE(api(0).device_synchronize().ok());
}

TEST_F(Posd, APosdThatCannotStartItsAcceptorFailsToStartAndLeavesNoSocketBehind) {
  Config c = test_config();
  const std::string dir = ::testing::TempDir() + "posd-noacceptor-" + std::to_string(::getpid());
  c.posd_socket = dir + "/posd.sock";
  fail_thread_starts_for_test("posd's acceptor thread", 1);
  auto s = PosdServer::start(c);
  fail_thread_starts_for_test("", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot start posd's acceptor thread"), std::string::npos)
      << s.status().message();
  EXPECT_NE(::access(c.posd_socket.c_str(), F_OK), 0) << "a failed start left its socket behind";
  EXPECT_NE(::access(dir.c_str(), F_OK), 0) << "a failed start left the directory it made";
}

// ---------------- admission ----------------

TEST(Admission, TheOwnerIsAlwaysAdmitted) {
  EXPECT_TRUE(admit({1000, 1000, {}}, 1000, -1).ok());
  EXPECT_TRUE(admit({1000, 5, {6}}, 1000, 44).ok());
}

TEST(Admission, AnotherUidOutsideTheGroupIsRefusedWithWhoItIsAndWhoMayConnect) {
  Status s = admit({1001, 1001, {27}}, 1000, -1);
  EXPECT_EQ(s.api_error(), cuda::kErrorInitializationError);
  EXPECT_NE(s.message().find("uid 1001 (gid 1001) may not use this posd"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("only uid 1000"), std::string::npos) << s.message();
  s = admit({1001, 1001, {27}}, 1000, 44);
  EXPECT_EQ(s.api_error(), cuda::kErrorInitializationError);
  EXPECT_NE(s.message().find("members of group 44"), std::string::npos) << s.message();
  // Without posd.group no group admits anyone, group 0 included.
  EXPECT_FALSE(admit({1001, 0, {0}}, 1000, -1).ok());
}

TEST(Admission, AMemberOfPosdGroupIsAdmittedByItsPrimaryOrASupplementaryGroup) {
  EXPECT_TRUE(admit({1001, 44, {}}, 1000, 44).ok());
  EXPECT_TRUE(admit({1001, 1001, {27, 44}}, 1000, 44).ok());
  EXPECT_FALSE(admit({1001, 1001, {27, 45}}, 1000, 44).ok());
}

TEST(Admission, PosdGroupIsAGidOrAGroupNameAndAnUnknownNameIsAnError) {
  EXPECT_EQ(resolve_group("").value(), -1);
  EXPECT_EQ(resolve_group("44").value(), 44);
  EXPECT_FALSE(resolve_group("4294967296").ok());
  auto unknown = resolve_group("pos-no-such-group-5f3759df");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no group named 'pos-no-such-group-5f3759df'"), std::string::npos)
      << unknown.status().message();
  if (const group* g = ::getgrgid(::getgid()); g != nullptr) {
    EXPECT_EQ(resolve_group(g->gr_name).value(), ::getgid());
  }
}

TEST_F(Posd, TheSocketIsTheOwnersAloneWithoutAGroupAndTheGroupsTooWithOne) {
  struct stat st {};
  ASSERT_EQ(::stat(server_->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Config c = test_config();
  c.posd_group = std::to_string(::getgid());  // this user's own group: posd may give the socket to it
  start(c);
  ASSERT_EQ(::stat(server_->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, ::getgid());
  EXPECT_EQ(server_->group_gid(), static_cast<int64_t>(::getgid()));
}

TEST_F(Posd, AnUnknownGroupNameIsAStartErrorThatNamesIt) {
  Config c = test_config();
  c.posd_socket = ::testing::TempDir() + "posd-badgroup-" + std::to_string(::getpid()) + "/posd.sock";
  c.posd_group = "pos-no-such-group-5f3759df";
  auto s = PosdServer::start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("posd.group: no group named 'pos-no-such-group-5f3759df'"), std::string::npos)
      << s.status().message();
  EXPECT_NE(::access(c.posd_socket.c_str(), F_OK), 0);  // refused before binding anything
}

TEST_F(Posd, AForeignUidIsRefusedWithAMessageWhilePosdServesTheOthersOn) {
  connect("owner");
  const uint64_t d = alloc(4096);
  server_->set_owner_uid_for_test(::geteuid() + 1);  // from posd's point of view this process is foreign now
  auto refused = ShmSession::connect(server_->socket_path(), "intruder");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().api_error(), cuda::kErrorInitializationError);
  EXPECT_NE(refused.status().message().find("posd refused the session: uid " + std::to_string(::geteuid())),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("may not use this posd"), std::string::npos);
  EXPECT_FALSE(posd_control(server_->socket_path(), "ps").ok());  // nor may it look at the sessions
  // The session admitted before runs on; nothing of the refused one exists.
  EXPECT_TRUE(api().memset(d, 1, 4096).ok());
  EXPECT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(server_->sessions().size(), 1u);
  server_->set_owner_uid_for_test(::geteuid());
  connect("owner-again");
  EXPECT_TRUE(api(1).device_synchronize().ok());
}

TEST_F(Posd, AForeignUidIsAdmittedAsAMemberOfPosdGroup) {
  Config c = test_config();
  c.posd_group = std::to_string(::getgid());
  start(c);
  server_->set_owner_uid_for_test(::geteuid() + 1);
  connect("member");
  const uint64_t d = alloc(4096);
  EXPECT_TRUE(api().memset(d, 0, 4096).ok());
  EXPECT_TRUE(api().device_synchronize().ok());
}

// ---------------- devices ----------------

TEST_F(Posd, ASessionSeesOnlyTheListedDevicesRenumberedFromZero) {
  if (backend_name() != "host") GTEST_SKIP() << "needs three devices: the host backend presents them";
  Config c = test_config();
  c.host_device_count = 3;
  c.posd_devices = {2, 0};
  start_shared(c);  // an in-process client of posd's workspace is compared below
  connect("two-of-three");
  int32_t count = 0;
  ASSERT_TRUE(api().get_device_count(&count).ok());
  EXPECT_EQ(count, 2);
  // The host backend's PCI device id is the device's index: the session's 0 is device 2, its 1 device 0.
  DeviceProps p{};
  ASSERT_TRUE(api().get_device_properties(&p, 0).ok());
  EXPECT_EQ(p.pci_device_id, 2);
  ASSERT_TRUE(api().get_device_properties(&p, 1).ok());
  EXPECT_EQ(p.pci_device_id, 0);
  int32_t v = -1;
  constexpr int32_t kPciDeviceId = 34;  // cudaDevAttrPciDeviceId
  ASSERT_TRUE(api().device_get_attribute(&v, kPciDeviceId, 0).ok());
  EXPECT_EQ(v, 2);
  // Numbers past the list do not exist for the session, though the backend has a device 2.
  EXPECT_EQ(api().set_device(2).api_error(), cuda::kErrorInvalidDevice);
  EXPECT_EQ(api().get_device_properties(&p, 2).api_error(), cuda::kErrorInvalidDevice);
  EXPECT_EQ(api().device_get_attribute(&v, kPciDeviceId, 2).api_error(), cuda::kErrorInvalidDevice);
  EXPECT_EQ(api().set_device(-1).api_error(), cuda::kErrorInvalidDevice);
  ASSERT_TRUE(api().set_device(1).ok());
  int32_t cur = -1;
  ASSERT_TRUE(api().get_device(&cur).ok());
  EXPECT_EQ(cur, 1);
  uint64_t free = 0, total = 0;
  EXPECT_TRUE(api().mem_get_info(&free, &total).ok());
  // Its state lives on its first listed device until it selects another before holding any: the
  // session's 1 is the backend's device 0, which posd reports.
  const std::vector<uint8_t> bytes = pattern(1 << 20);
  std::vector<uint8_t> back(bytes.size());
  const uint64_t d = alloc(bytes.size());
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(bytes.data()), bytes.size(), cuda::kMemcpyHostToDevice).ok());
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data()), d, back.size(), cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(back, bytes);
  const auto info = server_->sessions();
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].device, 0);
  auto json = posd_control(server_->socket_path(), "ps");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"device\":0"), std::string::npos) << *json;
  // With memory, another selection changes the number only.
  ASSERT_TRUE(api().set_device(0).ok());
  ASSERT_TRUE(api().get_device(&cur).ok());
  EXPECT_EQ(cur, 0);
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data()), d, back.size(), cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(back, bytes);
  EXPECT_EQ(server_->sessions().at(0).device, 0);
  // A client of the same workspace that is no posd session sees every device, as they are.
  auto uuid = server_->workspace()->create_client("in-process");
  ASSERT_TRUE(uuid.ok()) << uuid.status().to_string();
  InProcessTransport t(server_->workspace(), *uuid);
  ApiClient local(&t);
  ASSERT_TRUE(local.get_device_count(&count).ok());
  EXPECT_EQ(count, 3);
  ASSERT_TRUE(local.get_device_properties(&p, 1).ok());
  EXPECT_EQ(p.pci_device_id, 1);
  EXPECT_EQ(server_->workspace()->find_client(*uuid)->device(), 0);
  EXPECT_TRUE(server_->workspace()->remove_client(*uuid).ok());
}

TEST_F(Posd, PosdRefusesToStartWithADeviceTheBackendDoesNotHave) {
  if (backend_name() != "host") GTEST_SKIP() << "the host backend's device count is configurable";
  Config c = test_config();
  c.host_device_count = 2;
  c.posd_devices = {0, 3};
  c.posd_socket = ::testing::TempDir() + "posd-baddev-" + std::to_string(::getpid()) + "/posd.sock";
  auto s = PosdServer::start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("posd.devices lists device 3, but the host backend has 2 device(s) (0..1)"),
            std::string::npos)
      << s.status().message();
}

TEST(ClientDevices, AWorkspaceRefusesAClientOnADeviceItDoesNotHave) {
  Config c = test_config();
  c.host_device_count = 2;
  if (c.backend != "host") GTEST_SKIP() << "the host backend's device count is configurable";
  auto ws = create_workspace(c);
  ASSERT_TRUE(ws.ok());
  ClientOptions o;
  o.devices = {1, 2};
  auto bad = (*ws)->create_client("x", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().api_error(), cuda::kErrorInvalidDevice);
  o.devices = {1, 1};
  EXPECT_FALSE((*ws)->create_client("x", o).ok());
  o.devices = {1};
  auto good = (*ws)->create_client("x", o);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ((*ws)->find_client(*good)->device(), 1);
  EXPECT_TRUE((*ws)->list_clients().size() == 1);
}

}  // namespace
}  // namespace pos::test
