// driver_hooks_test.cc — the in-process driver interception layer (remoting/driver) without a GPU:
// the hook table and cuGetProcAddress's rules, the resolver and the census on their own, then
// libpos_driver.so preloaded into a probe program whose "driver" is a fake (fake_cuda.cc), reached
// by direct linking, dlopen + dlsym and cuGetProcAddress, and `pos run` starting it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/crc32c.h"
#include "remoting/common/usage_region.h"
#include "remoting/common/job_control.h"
#include "remoting/driver/device_image.h"
#include "remoting/driver/driver_hooks.h"
#include "remoting/driver/launch_params.h"
#include "unittest/run_program.h"

namespace pos::driver {
namespace {

TEST(DriverHookTable, EveryExportNameFindsItsOwnHookAndOtherNamesFindNone) {
  for (size_t i = 0; i < kHookCount; ++i) {
    const auto id = static_cast<HookId>(i);
    ASSERT_EQ(hook_by_export(hook_info(id).name), id) << hook_info(id).name;
  }
  EXPECT_FALSE(hook_by_export("cuCtxGetDevice"));
  EXPECT_FALSE(hook_by_export("cuMemAlloc"));  // the base name is no export of the v2 ABI
  EXPECT_FALSE(hook_by_export(""));
  EXPECT_TRUE(hooked_base("cuMemAlloc"));
  EXPECT_FALSE(hooked_base("cuDevicePrimaryCtxGetState"));
}

TEST(DriverHookTable, CuGetProcAddressRulesPickTheVariantTheDriverWouldReturn) {
  EXPECT_EQ(hook_by_rule("cuMemAlloc", 13000, 0), HookId::cuMemAlloc_v2);
  EXPECT_FALSE(hook_by_rule("cuMemAlloc", 3000, 0));  // the old 32-bit ABI: no hook, passes through
  EXPECT_EQ(hook_by_rule("cuMemAlloc", 13000, kProcAddressPerThread), HookId::cuMemAlloc_v2);  // no per-thread one
  EXPECT_EQ(hook_by_rule("cuLaunchKernel", 13000, 0), HookId::cuLaunchKernel);
  EXPECT_EQ(hook_by_rule("cuLaunchKernel", 13000, kProcAddressPerThread), HookId::cuLaunchKernel_ptsz);
  EXPECT_EQ(hook_by_rule("cuMemcpyHtoDAsync", 12080, kProcAddressPerThread), HookId::cuMemcpyHtoDAsync_v2_ptsz);
  EXPECT_EQ(hook_by_rule("cuGetProcAddress", 11080, 0), HookId::cuGetProcAddress);
  EXPECT_EQ(hook_by_rule("cuGetProcAddress", 12000, 0), HookId::cuGetProcAddress_v2);
  EXPECT_EQ(hook_by_rule("cuStreamDestroy", 13000, 0), HookId::cuStreamDestroy_v2);
  EXPECT_FALSE(hook_by_rule("cuCtxGetDevice", 13000, 0));
}

int a_real, b_real, a_hook, b_hook, internal;
std::array<void*, kHookCount> table(void* alloc, void* launch) {
  std::array<void*, kHookCount> t{};
  t[static_cast<size_t>(HookId::cuMemAlloc_v2)] = alloc;
  t[static_cast<size_t>(HookId::cuLaunchKernel)] = launch;
  return t;
}

TEST(DriverResolver, ADriverAnswerBecomesTheHookOfTheSameExportByAddressOrElseByRule) {
  Resolver r;
  r.set_real(table(&a_real, &b_real), table(&a_hook, &b_hook));
  auto a = r.substitute("cuMemAlloc", 13000, 0, &a_real);
  EXPECT_EQ(a.fn, &a_hook);
  EXPECT_FALSE(a.by_rule);
  // The hook's own address (a driver that takes its exports' addresses through its GOT gets the
  // preload's): the hook, by address.
  a = r.substitute("cuMemAlloc", 13000, 0, &a_hook);
  EXPECT_EQ(a.fn, &a_hook);
  EXPECT_FALSE(a.by_rule);
  // An internal address the driver hands out for a hooked name: matched by name and version.
  a = r.substitute("cuLaunchKernel", 13000, 0, &internal);
  EXPECT_EQ(a.fn, &b_hook);
  EXPECT_TRUE(a.by_rule);
  // The rule names a variant with no hook here (no real export was found for it): passes through.
  EXPECT_EQ(r.substitute("cuLaunchKernel", 13000, kProcAddressPerThread, &internal).fn, &internal);
  // Names no hook stands for, and old ABIs, pass through untouched.
  EXPECT_EQ(r.substitute("cuCtxGetDevice", 13000, 0, &internal).fn, &internal);
  EXPECT_EQ(r.substitute("cuMemAlloc", 3000, 0, &internal).fn, &internal);
  EXPECT_EQ(r.substitute("cuMemAlloc", 13000, 0, nullptr).fn, nullptr);
}

TEST(DriverResolver, DlsymGetsTheHookOnlyForTheDriversOwnExport) {
  Resolver r;
  r.set_real(table(&a_real, &b_real), table(&a_hook, &b_hook));
  EXPECT_EQ(r.for_dlsym("cuMemAlloc_v2", &a_real).fn, &a_hook);
  EXPECT_EQ(r.for_dlsym("cuMemAlloc_v2", &a_hook).fn, &a_hook);      // the preload's own export, found first
  EXPECT_EQ(r.for_dlsym("cuMemAlloc_v2", &internal).fn, &internal);  // some other library's function of that name
  EXPECT_EQ(r.for_dlsym("cuCtxGetDevice", &internal).fn, &internal);
  EXPECT_EQ(r.for_dlsym("cuMemAlloc_v2", nullptr).fn, nullptr);
}

TEST(DriverCensus, DeviceMemoryIsCountedLiveAndPeakAndUnknownFreesAreNamed) {
  Census c;
  c.device_alloc(0x1000, 100);
  c.device_alloc(0x2000, 300);
  c.device_free(0x1000);
  c.device_free(0x9000);  // allocated before the hooks saw it
  c.device_alloc(0x3000, 50);
  const Census::Memory m = c.memory();
  EXPECT_EQ(m.allocations, 3u);
  EXPECT_EQ(m.frees, 2u);
  EXPECT_EQ(m.unknown_frees, 1u);
  EXPECT_EQ(m.live, 2u);
  EXPECT_EQ(m.live_bytes, 350u);
  EXPECT_EQ(m.peak_bytes, 400u);
  EXPECT_EQ(c.allocation_at(0x2000), 300u);
  EXPECT_EQ(c.allocation_at(0x1000), 0u);
  c.count(HookId::cuLaunchKernel);
  c.count(HookId::cuLaunchKernel);
  c.resolved("cuLaunchKernel", "proc", {nullptr, HookId::cuLaunchKernel, true});
  c.resolved("odd\"name\x01", "dlsym", {nullptr, std::nullopt, false});
  const std::string j = c.json("/x/libcuda.so.1");
  EXPECT_NE(j.find("\"cuLaunchKernel\":2"), std::string::npos) << j;
  EXPECT_NE(j.find("\"cuLaunchKernel\":{\"n\":1,\"via\":\"proc\",\"hooked\":true,\"by_rule\":true}"), std::string::npos)
      << j;
  EXPECT_NE(j.find("\"odd\\\"name\\\\x01\""), std::string::npos) << j;  // escaped, never raw
  EXPECT_NE(j.find("\"live_bytes\":350,\"peak_bytes\":400"), std::string::npos) << j;
}

// ---- what a launch may write: its parameters scanned (launch_params.h) ----

// Function handles for the scanner's tests: pointers to these. `kernel` ones answer only
// cuKernelGetParamInfo, as a CUkernel launched as a function does on a driver.
struct TestKernel {
  bool kernel;
  std::vector<std::pair<size_t, size_t>> params;
  mutable int asked = 0;
};
CUresult func_info(CUfunction f, size_t i, size_t* off, size_t* size) {
  const auto* k = static_cast<const TestKernel*>(f);
  ++k->asked;
  if (k->kernel) return 400;  // CUDA_ERROR_INVALID_HANDLE
  if (i >= k->params.size()) return 1;
  *off = k->params[i].first;
  *size = k->params[i].second;
  return kSuccess;
}
CUresult kernel_info(void* f, size_t i, size_t* off, size_t* size) {
  const auto* k = static_cast<const TestKernel*>(f);
  ++k->asked;
  if (!k->kernel) return 400;
  if (i >= k->params.size()) return 1;
  *off = k->params[i].first;
  *size = k->params[i].second;
  return kSuccess;
}
ParamInfoCalls info_calls() { return ParamInfoCalls{&func_info, &kernel_info}; }

std::vector<uint64_t> words_of(LaunchScanner& s, const TestKernel* k, void** params, void** extra, bool* read) {
  std::vector<uint64_t> w;
  *read = s.scan(const_cast<TestKernel*>(k), params, extra, [&](uint64_t v) { w.push_back(v); });
  return w;
}

TEST(LaunchScanner, EveryAlignedWordOfEveryParameterThatCanHoldAPointerIsSeenInsideStructsToo) {
  LaunchScanner s(info_calls());
  // (ptr), (int), (struct of three words), (char at an odd offset), (16 bytes at an offset of 4)
  const TestKernel k{false, {{0, 8}, {8, 4}, {16, 24}, {40, 1}, {44, 16}}};
  uint64_t ptr = 0x200000001000ull;
  int32_t n = 42;
  uint64_t st[3] = {7, 0x200000400000ull, 0x200000800010ull};
  char c = 'x';
  uint64_t odd[2] = {0x200000000000ull, 0x200000000000ull};
  void* params[5] = {&ptr, &n, st, &c, odd};
  bool read = false;
  const std::vector<uint64_t> w = words_of(s, &k, params, nullptr, &read);
  EXPECT_TRUE(read);
  EXPECT_EQ(w, (std::vector<uint64_t>{0x200000001000ull, 7, 0x200000400000ull, 0x200000800010ull}));
  EXPECT_EQ(s.stats().scanned, 1u);
}

TEST(LaunchScanner, ALayoutIsAskedOnceAndAKernelHandleGetsItFromCuKernelGetParamInfo) {
  LaunchScanner s(info_calls());
  const TestKernel f{false, {{0, 8}}}, k{true, {{0, 8}, {8, 8}}};
  uint64_t a = 1, b = 2;
  void* params[2] = {&a, &b};
  bool read = false;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(words_of(s, &f, params, nullptr, &read), (std::vector<uint64_t>{1}));
  EXPECT_EQ(f.asked, 2);  // index 0, then 1 past the end: once
  EXPECT_EQ(words_of(s, &k, params, nullptr, &read), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(read);
  EXPECT_EQ(k.asked, 4);  // refused by cuFuncGetParamInfo, then three answers of cuKernelGetParamInfo
  EXPECT_EQ(s.stats().layouts, 2u);
  s.forget();  // code unloaded: the layouts are asked again
  (void)words_of(s, &f, params, nullptr, &read);
  EXPECT_EQ(f.asked, 4);
}

TEST(LaunchScanner, AParameterBufferIsScannedWholeAndOneThatCannotBeReadSaysSo) {
  LaunchScanner s(info_calls());
  const TestKernel none{false, {}};
  unsigned char buf[20] = {};
  const uint64_t p0 = 0x200000000000ull, p1 = 0x200000600000ull;
  std::memcpy(buf, &p0, 8);
  std::memcpy(buf + 8, &p1, 8);
  size_t size = sizeof(buf);
  void* extra[5] = {reinterpret_cast<void*>(1), buf, reinterpret_cast<void*>(2), &size, nullptr};
  bool read = false;
  EXPECT_EQ(words_of(s, &none, nullptr, extra, &read), (std::vector<uint64_t>{p0, p1}));  // bytes 16..19: no word
  EXPECT_TRUE(read);
  // No size, an unknown key, a size past the limit: the buffer is not trusted.
  void* no_size[3] = {reinterpret_cast<void*>(1), buf, nullptr};
  void* unknown[5] = {reinterpret_cast<void*>(1), buf, reinterpret_cast<void*>(9), &size, nullptr};
  size_t huge = kMaxParamBytes + 8;
  void* too_big[5] = {reinterpret_cast<void*>(1), buf, reinterpret_cast<void*>(2), &huge, nullptr};
  for (void** e : {no_size, unknown, too_big}) {
    EXPECT_TRUE(words_of(s, &none, nullptr, e, &read).empty());
    EXPECT_FALSE(read);
  }
  EXPECT_EQ(s.stats().unparsed, 3u);
}

TEST(LaunchScanner, WithoutALayoutTheLaunchIsUnreadableAndWithoutParametersThereIsNothingToRead) {
  const TestKernel big{false, {{0, kMaxParamBytes + 1}}};
  uint64_t a = 1;
  void* params[1] = {&a};
  bool read = true;
  LaunchScanner s(info_calls());
  EXPECT_TRUE(words_of(s, &big, params, nullptr, &read).empty());
  EXPECT_FALSE(read);  // a layout past the driver's limit is not trusted
  LaunchScanner no_calls(ParamInfoCalls{});
  const TestKernel k{false, {{0, 8}}};
  EXPECT_TRUE(words_of(no_calls, &k, params, nullptr, &read).empty());
  EXPECT_FALSE(read);
  EXPECT_TRUE(words_of(no_calls, &k, nullptr, nullptr, &read).empty());
  EXPECT_TRUE(read);
}

// ---- libpos_driver.so preloaded into the probe ----

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) ADD_FAILURE() << name << " is not set (meson sets it)";
  return v != nullptr ? v : "";
}

std::map<std::string, std::string> parse(const std::string& out) {
  std::map<std::string, std::string> m;
  size_t at = 0;
  while (at < out.size()) {
    const size_t nl = out.find('\n', at);
    const std::string line = out.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (const size_t eq = line.find('='); eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return m;
}

class Preloaded : public ::testing::Test {
 protected:
  std::string census_file() const {
    return ::testing::TempDir() + "driver_census_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  // The probe with libpos_driver preloaded (unless `preload` is false), its census in census_file().
  std::map<std::string, std::string> probe(const std::string& what, bool preload = true, const std::string& extra = "") {
    std::filesystem::remove(census_file());
    std::string prefix = "FAKE_CUDA=" + env("POS_FAKE_CUDA") + " POS_REAL_LIBCUDA=" + env("POS_FAKE_CUDA") +
                         " POS_DRIVER_CENSUS=" + census_file() + " POS_JOBS_DIR=" + jobs_dir() + " " + extra + " ";
    if (preload) prefix += "LD_PRELOAD=" + env("POS_DRIVER_LIB") + " ";
    int code = -1;
    const std::string out = test::run_program("POS_DRIVER_PROBE", prefix, {what}, &code);
    EXPECT_EQ(code, 0) << out;
    return parse(out);
  }
  // Where the probes' control sockets go (never the user's own jobs directory).
  static std::string jobs_dir() { return ::testing::TempDir() + "pos-driver-test-jobs-" + std::to_string(::getpid()); }
  std::string census() const {
    std::ifstream f(census_file());
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
};

TEST_F(Preloaded, WithoutThePreloadEveryFunctionIsTheFakeDriversOwn) {
  auto m = probe("dlsym", false);
  EXPECT_EQ(m["alloc"], "fake");
  EXPECT_EQ(m["ctx"], "fake");
  EXPECT_EQ(census(), "");
}

TEST_F(Preloaded, ADirectlyLinkedCallGoesThroughTheHookToTheDriverAndIsCounted) {
  auto m = probe("direct");
  EXPECT_EQ(m["rc"], "0");
  EXPECT_EQ(m["where"], "pos_driver");
  EXPECT_EQ(m["fake_alloc"], "3");
  EXPECT_EQ(m["fake_free"], "1");
  const std::string c = census();
  EXPECT_NE(c.find("\"cuMemAlloc_v2\":3"), std::string::npos) << c;
  EXPECT_NE(c.find("\"cuMemFree_v2\":1"), std::string::npos) << c;
  // 1000, 3 MiB and 5 bytes handed out, the 3 MiB freed.
  EXPECT_NE(c.find("\"allocations\":3,\"frees\":1,\"unknown_frees\":0,\"live\":2,\"live_bytes\":1005,"
                   "\"peak_bytes\":3146733"),
            std::string::npos)
      << c;
}

TEST_F(Preloaded, DlsymOfAHookedSymbolGivesTheHookAndOfAnyOtherTheDriversOwn) {
  auto m = probe("dlsym");
  EXPECT_EQ(m["rc"], "0");
  EXPECT_EQ(m["alloc"], "pos_driver");
  EXPECT_EQ(m["ctx"], "fake");  // not hooked: the driver's own function, no cost
  EXPECT_EQ(m["missing"], "null");
  EXPECT_EQ(m["fake_alloc"], "1");
  EXPECT_EQ(m["fake_ctx"], "1");
  const std::string c = census();
  EXPECT_NE(c.find("\"cuMemAlloc_v2\":{\"n\":1,\"via\":\"dlsym\",\"hooked\":true"), std::string::npos) << c;
  EXPECT_NE(c.find("\"cuCtxGetDevice\":{\"n\":1,\"via\":\"dlsym\",\"hooked\":false"), std::string::npos) << c;
}

TEST_F(Preloaded, CuGetProcAddressAnswersWithHooksForHookedNamesAndPassesTheRestThrough) {
  for (const char* indirect : {"FAKE_CUDA_INDIRECT=0", "FAKE_CUDA_INDIRECT=1"}) {
    SCOPED_TRACE(indirect);
    auto m = probe("proc", true, indirect);
    EXPECT_EQ(m["rc"], "0");
    EXPECT_EQ(m["gpa"], "pos_driver");
    EXPECT_EQ(m["alloc"], "pos_driver");
    EXPECT_EQ(m["free"], "pos_driver");
    EXPECT_EQ(m["launch"], "pos_driver");
    EXPECT_EQ(m["launch_pt"], "pos_driver");
    EXPECT_EQ(m["self"], "pos_driver");  // asking cuGetProcAddress for itself gives the hook again
    EXPECT_EQ(m["ctx"], "fake");
    EXPECT_EQ(m["missing_rc"], "500");  // the driver's own error, untouched
    EXPECT_EQ(m["missing_status"], "1");
    // The calls reached the right variants of the driver.
    EXPECT_EQ(m["fake_alloc"], "1");
    EXPECT_EQ(m["fake_launch"], "1");
    EXPECT_EQ(m["fake_launch_pt"], "1");
    const std::string c = census();
    EXPECT_NE(c.find("\"cuLaunchKernel\":1"), std::string::npos) << c;
    EXPECT_NE(c.find("\"cuLaunchKernel_ptsz\":1"), std::string::npos) << c;
    EXPECT_NE(c.find("\"allocations\":1,\"frees\":1"), std::string::npos) << c;
    const bool by_rule = std::string(indirect).back() == '1';
    EXPECT_NE(c.find(std::string("\"cuLaunchKernel\":{\"n\":2,\"via\":\"proc\",\"hooked\":true,\"by_rule\":") +
                     (by_rule ? "true" : "false")),
              std::string::npos)
        << c;
  }
}

TEST_F(Preloaded, WhatPosCannotCheckpointYetIsNamedInTheCensus) {
  auto m = probe("features");
  EXPECT_EQ(m["rc"], "0");  // the 64-byte IPC handle went through the hook by value, whole
  EXPECT_EQ(m["opened"], "7e0000000000");
  EXPECT_EQ(m["where"], "pos_driver");
  const std::string c = census();
  EXPECT_NE(c.find("\"devices\":[0,1]"), std::string::npos) << c;
  // Graphs are counted, not refused: NVIDIA's checkpoint takes them with the driver's state.
  EXPECT_NE(c.find("\"cuda_graphs\":{\"captures\":1,\"launches\":1},\"not_checkpointable\":[\"CUDA IPC memory "
                   "handles (2 calls)\",\"several GPUs (0, 1)\"]"),
            std::string::npos)
      << c;
  // A job that used none of it has nothing to name.
  probe("direct");
  EXPECT_NE(census().find("\"devices\":[],\"cuda_graphs\":{\"captures\":0,\"launches\":0},\"not_checkpointable\":[]"),
            std::string::npos)
      << census();
}

TEST_F(Preloaded, NamesThatOnlyLookLikeTheDriversNeitherLoadItNorStartTheRuntime) {
  const std::string dir = jobs_dir() + "-other";
  std::filesystem::remove_all(dir);
  auto m = probe("other", true, "POS_JOBS_DIR=" + dir);
  EXPECT_EQ(m["found"], "0");
  EXPECT_EQ(census(), "{\"driver\":null}\n");  // no runtime was made
  EXPECT_FALSE(std::filesystem::exists(dir));   // so no control socket either
}

TEST_F(Preloaded, DlsymWithRtldNextStillSearchesAfterTheCaller) {
  // The fake preloaded ahead of libpos_driver: RTLD_NEXT from the probe finds the fake's
  // probe_symbol; resolved relative to libpos_driver instead, it would find none.
  const std::string both = "LD_PRELOAD=" + env("POS_FAKE_CUDA") + ":" + env("POS_DRIVER_LIB");
  EXPECT_EQ(probe("next", false, both)["next"], "2");
  EXPECT_EQ(probe("next", false, "LD_PRELOAD=" + env("POS_FAKE_CUDA"))["next"], "2");
}

TEST_F(Preloaded, WithNoDriverToLoadHookedCallsFailAsWithoutADriverAndTheCensusSaysWhy) {
  auto m = probe("direct", true, "POS_REAL_LIBCUDA=/nonexistent/libcuda.so.1");
  EXPECT_EQ(m["rc"], "3");  // CUDA_ERROR_NOT_INITIALIZED
  EXPECT_EQ(m["fake_alloc"], "0");
  EXPECT_NE(census().find("\"error\":"), std::string::npos) << census();
}

TEST_F(Preloaded, WithPlacementOnDeviceMemoryLivesAtPosChosenAddressesAndFreedRangesAreReused) {
  auto m = probe("place", true, "POS_DRIVER_PLACE=1 POS_DRIVER_VA_BASE=300000000000");
  EXPECT_EQ(m["rc"], "0");
  // First fit from the range's base at the 2 MiB granularity: the same addresses in every run.
  EXPECT_EQ(m["a"], "300000000000");
  EXPECT_EQ(m["b"], "300000200000");
  EXPECT_EQ(m["c"], "300000600000");
  EXPECT_EQ(m["d"], "300000200000");       // the freed 4 MiB range's start
  EXPECT_EQ(m["mapped_mib"], "10");        // 2 + 6 + 2 MiB mapped in the driver
  EXPECT_EQ(m["mapped_after"], "0");       // every free unmapped
  EXPECT_EQ(m["fake_alloc"], "0");         // the driver's own allocator never asked
  EXPECT_EQ(m["fake_free"], "0");
  EXPECT_EQ(m["fake_sync"], "4");          // each free waits for the device, as cuMemFree does
  const std::string c = census();
  EXPECT_NE(c.find("\"placement\":{\"base\":52776558133248,\"span\":1099511627776,\"devices\":[0],\"placed\":4,"
                   "\"freed\":4,\"live\":0,\"live_bytes\":0,\"peak_bytes\":12582912,\"error\":\"\"}"),
            std::string::npos)
      << c;
  EXPECT_NE(c.find("\"allocations\":4,\"frees\":4,\"unknown_frees\":0"), std::string::npos) << c;
}

// Stream-ordered memory (cuMemAllocAsync, PyTorch's backend:cudaMallocAsync) from the device's
// default pool comes out of placed segments: the driver's pool is never asked, a block freed on a
// stream is the next one that stream gets, and a trim gives the segments back.
TEST_F(Preloaded, WithPlacementStreamOrderedMemoryComesFromPlacedSegments) {
  auto m = probe("async-place", true, "POS_DRIVER_PLACE=1 POS_DRIVER_VA_BASE=300000000000");  // on by default
  EXPECT_EQ(m["rc"], "0");
  EXPECT_EQ(m["a"], "300000000000");  // the first segment, at the range's base
  EXPECT_EQ(m["b"], m["a"]);          // freed on stream 7, reused by stream 7
  EXPECT_EQ(m["c"], "300000100000");  // beside it, in the same 32 MiB segment
  EXPECT_EQ(m["mapped_mib"], "32");
  EXPECT_EQ(m["bad_free"], "1");      // CUDA_ERROR_INVALID_VALUE, as the driver says
  EXPECT_EQ(m["mapped_after"], "0");  // the trim gave the segment back
  EXPECT_EQ(m["fake_alloc_async"], "0");
  EXPECT_EQ(m["fake_free_async"], "0");
  EXPECT_EQ(m["fake_trim"], "1");     // the driver trims its own pool too
  const std::string c = census();
  EXPECT_NE(c.find("\"allocations\":3,\"frees\":3,"), std::string::npos) << c;
}

// A pool the job made itself stays the driver's (so does memory allocated inside a graph capture).
TEST_F(Preloaded, StreamOrderedMemoryFromAnotherPoolIsLeftToTheDriver) {
  auto m = probe("async-place", true, "POS_DRIVER_PLACE=1 POS_DRIVER_PLACE_ASYNC=1 FAKE_CUDA_OTHER_POOL=1");
  EXPECT_EQ(m["mapped_mib"], "0");
  EXPECT_EQ(m["fake_alloc_async"], "3");
  EXPECT_EQ(m["fake_free_async"], "3");  // the bad free among them: the driver's to refuse
}

// POS_DRIVER_PLACE_ASYNC=0: the driver's own pool serves stream-ordered memory.
TEST_F(Preloaded, WithPlaceAsyncOffStreamOrderedMemoryIsTheDrivers) {
  auto m = probe("async-place", true, "POS_DRIVER_PLACE=1 POS_DRIVER_PLACE_ASYNC=0");
  EXPECT_EQ(m["mapped_mib"], "0");
  EXPECT_EQ(m["fake_alloc_async"], "3");
}

TEST_F(Preloaded, WhenItsRangeIsTakenPlacementStandsAsideAndTheDriverAllocatesAsUsual) {
  auto m = probe("place", true, "POS_DRIVER_PLACE=1 FAKE_CUDA_VA_MOVE=1");
  EXPECT_EQ(m["rc"], "0");
  EXPECT_EQ(m["fake_alloc"], "4");
  EXPECT_EQ(m["fake_free"], "4");
  EXPECT_EQ(m["mapped_mib"], "0");
  const std::string c = census();
  EXPECT_NE(c.find("\"placed\":0,"), std::string::npos) << c;
  EXPECT_NE(c.find("its range was reserved elsewhere than asked"), std::string::npos) << c;
}

TEST_F(Preloaded, AnUnusablePlacementSettingLeavesPlacementOffAndSaysWhy) {
  for (const char* bad : {"POS_DRIVER_PLACE=yes", "POS_DRIVER_PLACE=1 POS_DRIVER_VA_BASE=zz",
                          "POS_DRIVER_PLACE=1 POS_DRIVER_VA_BASE=300000000001",
                          "POS_DRIVER_PLACE=1 POS_DRIVER_VA_BASE=900000000000"}) {
    SCOPED_TRACE(bad);
    auto m = probe("place", true, bad);
    EXPECT_EQ(m["rc"], "0");
    EXPECT_EQ(m["fake_alloc"], "4");  // the driver allocated, as without placement
    const std::string c = census();
    EXPECT_NE(c.find("\"placement_error\":\"POS_DRIVER_"), std::string::npos) << c;
    EXPECT_EQ(c.find("\"placement\":{"), std::string::npos) << c;
  }
}

// A probe that stays running ("wait") with the layer preloaded, until it is stopped.
struct RunningProbe {
  pid_t pid = -1;
  int in = -1;  // its stdin: closing it ends the probe
  FILE* out = nullptr;
  explicit RunningProbe(const std::string& jobs_dir, const char* mode = "wait",
                        std::vector<std::pair<std::string, std::string>> extra_env = {}) {
    int to[2], from[2];
    // Close-on-exec: a probe started later must not hold this one's stdin open (its EOF ends it).
    if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      ::dup2(to[0], 0);
      ::dup2(from[1], 1);
      ::close(to[1]);
      ::close(from[0]);
      ::setenv("LD_PRELOAD", env("POS_DRIVER_LIB").c_str(), 1);
      ::setenv("POS_REAL_LIBCUDA", env("POS_FAKE_CUDA").c_str(), 1);
      ::setenv("POS_JOBS_DIR", jobs_dir.c_str(), 1);
      ::setenv("POS_JOB_NAME", "probe-job", 1);
      for (const auto& [k, v] : extra_env) ::setenv(k.c_str(), v.c_str(), 1);
      const std::string probe = env("POS_DRIVER_PROBE");
      ::execl(probe.c_str(), probe.c_str(), mode, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    in = to[1];
    out = ::fdopen(from[0], "r");
  }
  bool ready() {
    char line[64];
    while (out != nullptr && std::fgets(line, sizeof(line), out) != nullptr)
      if (std::string(line) == "ready\n") return true;
    return false;
  }
  // Its next output line, if one comes within `ms`; else empty.
  std::string line_within(int ms) {
    pollfd p{::fileno(out), POLLIN, 0};
    if (out == nullptr || ::poll(&p, 1, ms) != 1) return "";
    char line[256];
    return std::fgets(line, sizeof(line), out) != nullptr ? line : "";
  }
  void say(const std::string& text) { (void)!::write(in, text.data(), text.size()); }
  int stop() {
    if (in >= 0) ::close(std::exchange(in, -1));
    int st = -1;
    if (pid > 0) ::waitpid(std::exchange(pid, -1), &st, 0);
    if (out != nullptr) std::fclose(std::exchange(out, nullptr));
    return st;
  }
  ~RunningProbe() {
    if (pid > 0) ::kill(pid, SIGKILL);
    stop();
  }
};

TEST_F(Preloaded, PosCliPsListsARunningJobThroughItsControlSocketAndForgetsItWhenItEnds) {
  const std::string dir = jobs_dir() + "-ps";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir);
  ASSERT_TRUE(job.ready());
  const std::string sock = pos::job_socket_path(dir, job.pid);
  EXPECT_TRUE(std::filesystem::is_socket(sock));
  EXPECT_EQ(std::filesystem::status(dir).permissions() & std::filesystem::perms::all, std::filesystem::perms::owner_all);
  // The job answers for itself: its pid, name and census.
  auto a = pos::ask_job(sock, "ps");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_NE(a->find("\"pid\":" + std::to_string(job.pid) + ","), std::string::npos) << *a;
  EXPECT_NE(a->find("\"job\":\"probe-job\""), std::string::npos) << *a;
  EXPECT_NE(a->find("\"cuMemAlloc_v2\":2"), std::string::npos) << *a;
  auto bad = pos::ask_job(sock, "format-disk");
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad->find("\"error\":\"unknown command 'format-disk'"), std::string::npos) << *bad;
  EXPECT_FALSE(pos::ask_job(sock, "ps\nps").ok());  // one line, or nothing is sent
  // A socket left by a job killed earlier: its pid is gone, so the scan removes it.
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  { std::ofstream(pos::job_socket_path(dir, dead)); }
  // pos-cli ps with no posd: the in-process job alone, in both forms.
  int code = -1;
  const std::string cli = env("POS_CLI") + " ps --socket " + dir + "/no-posd.sock --jobs-dir " + dir;
  std::string out = test::run_shell(cli + " --json", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("{\"posd_error\":"), std::string::npos) << out;
  EXPECT_NE(out.find("\"inproc_jobs\":[{\"pid\":" + std::to_string(job.pid)), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(pos::job_socket_path(dir, dead)));
  out = test::run_shell(cli, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find(std::to_string(job.pid) + " "), std::string::npos) << out;
  EXPECT_NE(out.find("probe-job"), std::string::npos) << out;
  EXPECT_NE(out.find("4194304"), std::string::npos) << out;  // 1 + 3 MiB live
  EXPECT_NE(out.find("1 in-process job(s) in " + dir), std::string::npos) << out;
  // The job ends: its socket goes with it, and ps has nothing left to show.
  EXPECT_EQ(job.stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(sock));
  (void)test::run_shell(cli, &code);
  EXPECT_EQ(code, 1);
  std::filesystem::remove_all(dir);
}

// ---- dump and resume of a job's device memory (the in-process half of pos-cli dump) ----

TEST_F(Preloaded, ADumpSavesPlacedMemoryHoldsTheJobsCallsAndAResumeBringsTheSameBytesBack) {
  const std::string dir = jobs_dir() + "-dump", img = dir + "-img";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(img);
  std::filesystem::create_directories(img);
  RunningProbe job(dir, "memory", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  job.say("check\n");
  EXPECT_EQ(job.line_within(5000), "rc=0 same=1\n");
  const std::string sock = pos::job_socket_path(dir, job.pid);
  auto saved = pos::ask_job(sock, "dump-save " + img, 10000);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  EXPECT_NE(saved->find("\"ok\":true,\"bytes\":10485760,\"regions\":2,"), std::string::npos) << *saved;  // 4 + 6 MiB
  auto table = read_region_table(img);
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  ASSERT_EQ(table->regions.size(), 2u);
  EXPECT_EQ(table->regions[0].addr, 0x200000000000ull);
  EXPECT_EQ(table->regions[1].addr, 0x200000400000ull);
  // One memory file per copy lane, each chunk (8 MiB) in turn: a's 4 MiB in the first, b's 6 in the second.
  EXPECT_EQ(table->files, 2u);
  EXPECT_EQ(std::filesystem::file_size(img + "/memory.0.bin"), 4u << 20);
  EXPECT_EQ(std::filesystem::file_size(img + "/memory.1.bin"), 6u << 20);
  // The job's next driver call waits while the dump holds its memory; ps is still answered.
  job.say("check\n");
  EXPECT_EQ(job.line_within(300), "");
  auto ps = pos::ask_job(sock, "ps");
  EXPECT_TRUE(ps.ok()) << ps.status().to_string();
  auto again = pos::ask_job(sock, "dump-save " + img, 10000);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->find("a dump holds this job already"), std::string::npos) << *again;
  // A damaged image is refused by its checksum and the job stays held; the good one resumes it.
  {
    std::fstream f(img + "/memory.1.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1 << 20);
    f.put('\x5a');
  }
  auto bad = pos::ask_job(sock, "dump-resume " + img, 10000);
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad->find("fails its checksum"), std::string::npos) << *bad;
  EXPECT_EQ(job.line_within(200), "");
  {
    std::fstream f(img + "/memory.1.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1 << 20);
    f.put(static_cast<char>((1 << 20) * 13 + 5));  // the pattern's byte there (b's)
  }
  auto resumed = pos::ask_job(sock, "dump-resume " + img, 10000);
  ASSERT_TRUE(resumed.ok());
  EXPECT_NE(resumed->find("\"ok\":true,\"bytes\":10485760"), std::string::npos) << *resumed;
  EXPECT_EQ(job.line_within(5000), "rc=0 same=1\n");  // the held call ran, on the same bytes
  auto twice = pos::ask_job(sock, "dump-resume", 10000);
  ASSERT_TRUE(twice.ok());
  EXPECT_NE(twice->find("nothing to resume"), std::string::npos) << *twice;
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(img);
}

// A memory limit (POS_MEMORY_LIMIT, as `pos run --memory` sets it): allocations of every kind that
// would pass it get CUDA_ERROR_OUT_OF_MEMORY without reaching the driver, frees and releases give
// room back, cuMemGetInfo reports the limit; `limit memory=N` changes it on the running job, and
// bad values (not a number, more than the GPUs have, no key) are refused with the limit unchanged.
TEST_F(Preloaded, AMemoryLimitRefusesWhatWouldPassItAsTheDriverWouldAndCanBeChangedWhileTheJobRuns) {
  const std::string dir = jobs_dir() + "-limit";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir, "limit", {{"POS_MEMORY_LIMIT", "10MiB"}});
  std::string seen;
  char line[256];
  while (job.out != nullptr && std::fgets(line, sizeof(line), job.out) != nullptr && std::string(line) != "ready\n")
    seen += line;
  EXPECT_EQ(seen,
            "a=0\nover=2\nasync=0\ninfo=0 free_mib=2 total_mib=10\nfree_a=0\nb=0\ncreate_over=2\nfree_async=0\n"
            "create=0\nd=2\nrelease=0\nd_after_release=0\ninfo=0 free_mib=0 total_mib=10\n");
  const std::string sock = pos::job_socket_path(dir, job.pid);
  auto shown = pos::ask_job(sock, "limit", 10000);
  ASSERT_TRUE(shown.ok()) << shown.status().to_string();
  EXPECT_NE(shown->find("\"memory\":10485760,\"memory_used\":10485760,\"memory_refused\":3"), std::string::npos) << *shown;
  auto ps = pos::ask_job(sock, "ps", 10000);
  ASSERT_TRUE(ps.ok());
  EXPECT_NE(ps->find("\"limits\":{\"memory\":10485760,"), std::string::npos) << *ps;
  job.say("try\n");
  EXPECT_EQ(job.line_within(5000), "rc=2\n");  // 8 MiB more does not fit in 10
  auto raised = pos::ask_job(sock, "limit memory=" + std::to_string(20u << 20), 10000);
  ASSERT_TRUE(raised.ok());
  EXPECT_NE(raised->find("\"ok\":true,\"limits\":{\"memory\":20971520,"), std::string::npos) << *raised;
  job.say("try\n");
  EXPECT_EQ(job.line_within(5000), "rc=0\n");
  for (const std::string& bad : std::vector<std::string>{"limit memory=abc", "limit memory=" + std::to_string(100ull << 30),
                                                        "limit cpu=1", "limit memory="}) {
    auto r = pos::ask_job(sock, bad, 10000);
    ASSERT_TRUE(r.ok()) << bad;
    EXPECT_NE(r->find("\"ok\":false"), std::string::npos) << bad << ": " << *r;
  }
  auto big = pos::ask_job(sock, "limit memory=" + std::to_string(100ull << 30), 10000);
  EXPECT_NE(big->find("more than the job's GPUs have"), std::string::npos) << *big;
  job.say("try\n");
  EXPECT_EQ(job.line_within(5000), "rc=0\n");  // still 20 MiB
  auto none = pos::ask_job(sock, "limit memory=0", 10000);  // 0: no limit
  ASSERT_TRUE(none.ok());
  EXPECT_NE(none->find("\"memory\":0,"), std::string::npos) << *none;
  EXPECT_EQ(job.stop(), 0);
  // A limit that does not parse is no limit, and the job says why.
  RunningProbe loose(dir, "limit", {{"POS_MEMORY_LIMIT", "lots"}});
  seen.clear();
  while (loose.out != nullptr && std::fgets(line, sizeof(line), loose.out) != nullptr && std::string(line) != "ready\n")
    seen += line;
  EXPECT_NE(seen.find("over=0\n"), std::string::npos) << seen;
  auto why = pos::ask_job(pos::job_socket_path(dir, loose.pid), "ps", 10000);
  ASSERT_TRUE(why.ok());
  EXPECT_NE(why->find("\"memory_error\":\"POS_MEMORY_LIMIT='lots'"), std::string::npos) << *why;
  EXPECT_EQ(loose.stop(), 0);
  std::filesystem::remove_all(dir);
}

// #24's SM limit (POS_SM_LIMIT, as `pos run --sms` sets it; docs/limits.md): the job's primary
// context is a green context of the SMs asked for, made once: retained, set current through the
// hook, or made current the runtime's own way and found by the next hooked call. The
// multiprocessor count says so before any context exists; ps and limit show it. A limit larger than the GPU, one that does not
// parse, and a driver without green contexts are each said, and the job runs on the whole GPU.
TEST_F(Preloaded, AnSmLimitGivesTheJobAGreenContextAndSaysWhyWhenItCannot) {
  const std::string dir = jobs_dir() + "-sms";
  std::filesystem::remove_all(dir);
  const auto lines = [](RunningProbe& p) {
    std::string seen;
    char line[256];
    while (p.out != nullptr && std::fgets(line, sizeof(line), p.out) != nullptr && std::string(line) != "ready\n")
      seen += line;
    return seen;
  };
  {
    RunningProbe job(dir, "sms", {{"POS_SM_LIMIT", "36"}});  // rounded up to the group size: 40
    EXPECT_EQ(lines(job),
              "attr=0 sms=40\ngreen_before=0\nalloc=0 adopted ctx=7000\nretain=0 ctx=7000\nretain=0 ctx=7000\n"
              "set=0 ctx=7000\nattr=0 threads=1024\ngreen=1 real_retains=3\n");
    auto shown = pos::ask_job(pos::job_socket_path(dir, job.pid), "limit", 10000);
    ASSERT_TRUE(shown.ok()) << shown.status().to_string();
    EXPECT_NE(shown->find("\"sms\":36,\"sms_granted\":40,\"sms_total\":132"), std::string::npos) << *shown;
    EXPECT_EQ(shown->find("sms_error"), std::string::npos) << *shown;
    auto row = pos::ask_job(pos::job_socket_path(dir, job.pid), "ps-row", 10000);
    ASSERT_TRUE(row.ok());
    EXPECT_NE(row->find("    40 "), std::string::npos) << *row;
    EXPECT_EQ(job.stop(), 0);
  }
  struct Case {
    std::vector<std::pair<std::string, std::string>> env;
    const char* error;  // what ps says; nullptr: nothing
    int sms;            // the multiprocessor count the job sees
  };
  for (const Case& c : std::vector<Case>{
           {{{"POS_SM_LIMIT", "200"}}, "POS_SM_LIMIT=200 on GPU 0: the GPU has 132 SMs: it runs on all its SMs", 132},
           {{{"POS_SM_LIMIT", "forty"}}, "POS_SM_LIMIT='forty': not a number of SMs from 1 to 100000", 132},
           {{{"POS_SM_LIMIT", "0"}}, "POS_SM_LIMIT='0': not a number of SMs", 132},
           {{{"POS_SM_LIMIT", "16"}, {"FAKE_CUDA_NO_GREEN", "1"}},
            "POS_SM_LIMIT=16 on GPU 0: cuGreenCtxCreate failed (CUresult 801): it runs on all its SMs", 16},
           {{{"POS_SM_LIMIT", "132"}}, nullptr, 132}}) {
    RunningProbe job(dir, "sms", c.env);
    const std::string seen = lines(job);
    // The primary context itself (0x1000 + device), every time.
    EXPECT_NE(seen.find("attr=0 sms=" + std::to_string(c.sms) + "\n"), std::string::npos) << c.env[0].second << ": " << seen;
    EXPECT_NE(seen.find("adopted ctx=1000\nretain=0 ctx=1000\nretain=0 ctx=1000\nset=0 ctx=1000\n"), std::string::npos)
        << c.env[0].second << ": " << seen;
    auto ps = pos::ask_job(pos::job_socket_path(dir, job.pid), "ps", 10000);
    ASSERT_TRUE(ps.ok());
    if (c.error != nullptr) EXPECT_NE(ps->find("\"sms_error\":\"" + std::string(c.error)), std::string::npos) << *ps;
    else EXPECT_EQ(ps->find("sms_error"), std::string::npos) << *ps;
    EXPECT_EQ(job.stop(), 0);
  }
  std::filesystem::remove_all(dir);
}

// POS_USAGE_REGION (docs/limits.md): an in-process job joins the region posd keeps for several
// users instead of its user's own, and says which in ps; one that does not exist is not made by the
// job (it runs without a region and says why).
TEST_F(Preloaded, AJobJoinsTheUsageRegionPosdKeepsWhenItsEnvironmentNamesIt) {
  const std::string dir = jobs_dir() + "-kept";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string kept = dir + "/kept-usage";
  ASSERT_TRUE(pos::UsageRegion::keep(kept, -1).ok());
  {
    RunningProbe job(dir, "limit", {{"POS_USAGE_REGION", kept}});
    ASSERT_TRUE(job.ready());
    auto ps = pos::ask_job(pos::job_socket_path(dir, job.pid), "ps", 10000);
    ASSERT_TRUE(ps.ok());
    EXPECT_NE(ps->find("\"usage_region\":\"" + kept + "\""), std::string::npos) << *ps;
    auto region = pos::UsageRegion::open(kept);
    ASSERT_TRUE(region.ok());
    bool listed = false;
    for (const auto& e : (*region)->list()) listed |= e.pid == static_cast<uint32_t>(job.pid);
    EXPECT_TRUE(listed);
    EXPECT_FALSE(std::filesystem::exists(pos::usage_region_path(dir)));  // not its own
    EXPECT_EQ(job.stop(), 0);
  }
  RunningProbe lost(dir, "limit", {{"POS_USAGE_REGION", dir + "/none"}});
  ASSERT_TRUE(lost.ready());
  auto ps = pos::ask_job(pos::job_socket_path(dir, lost.pid), "ps", 10000);
  ASSERT_TRUE(ps.ok());
  EXPECT_NE(ps->find("\"usage_error\":\"cannot open the usage region " + dir + "/none"), std::string::npos) << *ps;
  EXPECT_FALSE(std::filesystem::exists(dir + "/none"));
  EXPECT_EQ(lost.stop(), 0);
  std::filesystem::remove_all(dir);
}

// #24's GPU-time shares among in-process jobs on one GPU (docs/limits.md): two jobs that always want
// the GPU get its time in the ratio of their shares (here: launches that each stand for 100 µs of
// it); a share that would make the GPU's shares pass 100 % is refused with the share unchanged; a
// job alone is never held back.
TEST_F(Preloaded, JobsWithGpuSharesLaunchInTheRatioOfTheirSharesAndAJobAloneIsNotHeldBack) {
  const std::string dir = jobs_dir() + "-shares";
  std::filesystem::remove_all(dir);
  RunningProbe big(dir, "share", {{"POS_GPU_SHARE", "70%"}});
  RunningProbe small(dir, "share", {{"POS_GPU_SHARE", "30%"}});
  ASSERT_TRUE(big.ready());
  ASSERT_TRUE(small.ready());
  const auto launches = [](RunningProbe& p) {
    const std::string l = p.line_within(30000);
    return l.rfind("launches=", 0) == 0 ? std::atol(l.c_str() + 9) : -1L;
  };
  big.say("go 3000\n");
  small.say("go 3000\n");
  const long a = launches(big), b = launches(small);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  EXPECT_NEAR(double(a) / double(a + b), 0.70, 0.08) << a << " " << b;
  // Both waited for turns; the job's answer says so, with the share in force.
  auto shown = pos::ask_job(pos::job_socket_path(dir, small.pid), "limit", 10000);
  ASSERT_TRUE(shown.ok());
  EXPECT_NE(shown->find("\"gpu_share\":300,\"gpu_share_asked\":300"), std::string::npos) << *shown;
  EXPECT_EQ(shown->find("\"turn_waits\":0,"), std::string::npos) << *shown;
  // 30 % + 80 % is more than the GPU: refused, the share unchanged; 20 % fits.
  const std::string sock = pos::job_socket_path(dir, small.pid);
  auto over = pos::ask_job(sock, "limit share=800", 10000);
  ASSERT_TRUE(over.ok());
  EXPECT_NE(over->find("\"ok\":false"), std::string::npos) << *over;
  EXPECT_NE(over->find("already shared out"), std::string::npos) << *over;
  for (const std::string bad : {"limit share=abc", "limit share=1001", "limit share="}) {
    auto r = pos::ask_job(sock, bad, 10000);
    ASSERT_TRUE(r.ok());
    EXPECT_NE(r->find("\"ok\":false"), std::string::npos) << bad << ": " << *r;
  }
  auto fits = pos::ask_job(sock, "limit share=200", 10000);
  ASSERT_TRUE(fits.ok());
  EXPECT_NE(fits->find("\"ok\":true,\"limits\":{"), std::string::npos) << *fits;
  EXPECT_NE(fits->find("\"gpu_share\":200,"), std::string::npos) << *fits;
  // pos-cli ps lists both processes' shares from the shared region.
  int code = -1;
  const std::string ps = pos::test::run_shell(env("POS_CLI") + " ps --json --socket " + dir + "/none.sock --jobs-dir " + dir, &code);
  EXPECT_NE(ps.find("\"gpu_share\":700,"), std::string::npos) << ps;
  EXPECT_NE(ps.find("\"gpu_share\":200,"), std::string::npos) << ps;
  // The big job ends: the small one, alone, launches about as fast as a job with no share at all
  // (held to its share it would make 30 %; the bound leaves room for a loaded CI machine).
  EXPECT_EQ(big.stop(), 0);
  small.say("go 1000\n");
  const long alone = launches(small);
  RunningProbe free_job(dir, "share");
  ASSERT_TRUE(free_job.ready());
  free_job.say("go 1000\n");
  const long unshared = launches(free_job);
  ASSERT_GT(unshared, 0);
  EXPECT_GT(double(alone) / double(unshared), 0.6) << alone << " " << unshared;
  EXPECT_EQ(small.stop(), 0);
  EXPECT_EQ(free_job.stop(), 0);
  // A share that does not parse is none, said in ps; the job runs.
  RunningProbe loose(dir, "share", {{"POS_GPU_SHARE", "lots"}});
  ASSERT_TRUE(loose.ready());
  auto why = pos::ask_job(pos::job_socket_path(dir, loose.pid), "limit", 10000);
  ASSERT_TRUE(why.ok());
  EXPECT_NE(why->find("\"gpu_share_error\":\"POS_GPU_SHARE='lots'"), std::string::npos) << *why;
  EXPECT_EQ(loose.stop(), 0);
  std::filesystem::remove_all(dir);
}

// The hand-off (dump-share, dump-release, dump-take): the job's memory leaves as descriptors, its
// calls wait, and it comes back only with as many descriptors as it has allocations, the checksum
// of its allocation list and the dump's cut (memory of another cut is not taken, nor a resume of
// another cut done); the bytes are the ones that left.
TEST_F(Preloaded, AHandOffSendsTheMemoryAwayAsDescriptorsAndTakesItBackOnlyWhenTheyAreItsOwn) {
  const std::string dir = jobs_dir() + "-share";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir, "memory", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  const std::string sock = pos::job_socket_path(dir, job.pid);
  auto shared = pos::ask_job_fds(sock, "dump-share", {}, 10000);
  ASSERT_TRUE(shared.ok()) << shared.status().to_string();
  EXPECT_NE(shared->text.find("\"ok\":true,\"share\":true,\"device\":0,\"bytes\":10485760,\"count\":2,"), std::string::npos)
      << shared->text;
  EXPECT_NE(shared->text.find("\"regions\":[[35184372088832,4194304,1],[35184376283136,6291456,1]]"), std::string::npos)
      << shared->text;
  ASSERT_EQ(shared->fds.size(), 2u);
  const std::string list = std::to_string(static_cast<uint64_t>(
      std::stoull(shared->text.substr(shared->text.find("\"list\":") + 7))));
  const uint64_t cut_id = std::stoull(shared->text.substr(shared->text.find("\"cut\":") + 6));
  const std::string cut = std::to_string(cut_id), other_cut = std::to_string(cut_id ^ 1);
  job.say("check\n");
  EXPECT_EQ(job.line_within(300), "");  // held
  auto twice = pos::ask_job_fds(sock, "dump-share", {}, 10000);
  ASSERT_TRUE(twice.ok());
  EXPECT_NE(twice->text.find("a dump holds this job already"), std::string::npos) << twice->text;
  EXPECT_TRUE(twice->fds.empty());
  auto released = pos::ask_job(sock, "dump-release", 10000);
  ASSERT_TRUE(released.ok());
  EXPECT_NE(released->find("\"ok\":true"), std::string::npos) << *released;
  // Only the descriptors here hold the memory now: no image to resume from, and wrong offers refused.
  auto no_dir = pos::ask_job(sock, "dump-resume", 10000);
  ASSERT_TRUE(no_dir.ok());
  EXPECT_NE(no_dir->find("dump-take brings it back"), std::string::npos) << *no_dir;
  const std::vector<int> both = {shared->fds[0].get(), shared->fds[1].get()};
  for (const auto& [cmd, fds] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"dump-take 1 " + list + " " + cut, {both[0]}},
           {"dump-take 2 12345 " + cut, both},
           {"dump-take 2 " + list, both},  // no cut
           {"dump-take 2 " + list + " " + other_cut, both}}) {
    auto bad = pos::ask_job_fds(sock, cmd, fds, 10000);
    ASSERT_TRUE(bad.ok()) << cmd;
    EXPECT_NE(bad->text.find("\"ok\":false"), std::string::npos) << cmd << ": " << bad->text;
    EXPECT_EQ(job.line_within(100), "") << cmd;  // still held
  }
  auto other = pos::ask_job(sock, "dump-resume @" + other_cut, 10000);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->find("does not hold this job"), std::string::npos) << *other;
  EXPECT_EQ(job.line_within(100), "");  // still held
  auto taken = pos::ask_job_fds(sock, "dump-take 2 " + list + " " + cut, both, 10000);
  ASSERT_TRUE(taken.ok());
  EXPECT_NE(taken->text.find("\"ok\":true,\"count\":2"), std::string::npos) << taken->text;
  EXPECT_EQ(job.line_within(5000), "rc=0 same=1\n");  // the held call ran, on the bytes that left
  // A second round sends the descriptors the job kept (its memory is an import now).
  auto again = pos::ask_job_fds(sock, "dump-share", {}, 10000);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->fds.size(), 2u) << again->text;
  auto back = pos::ask_job(sock, "dump-resume", 10000);  // never released: nothing left, the gate opens
  ASSERT_TRUE(back.ok());
  EXPECT_NE(back->find("\"ok\":true"), std::string::npos) << *back;
  job.say("check\n");
  EXPECT_EQ(job.line_within(5000), "rc=0 same=1\n");
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
}

// One GPU-only checkpoint of the "writes" probe: which of its three allocations were written since
// the previous cut, and the bytes of each at the cut (read from the shadow the job sent).
struct Snap {
  std::string text;
  std::vector<int> written;           // per allocation: 1 written since the last cut
  std::vector<std::string> contents;  // per allocation, from the shadow
};
Snap snap_of(const std::string& sock, const std::string& cmd = "snap-cut") {
  Snap out;
  auto a = pos::ask_job_fds(sock, cmd, {}, 10000);
  if (!a.ok()) {
    out.text = a.status().to_string();
    return out;
  }
  out.text = a->text;
  const size_t at = a->text.find("\"regions\":[");
  if (at == std::string::npos || a->fds.size() != 1) return out;
  std::vector<std::pair<uint64_t, uint64_t>> regions;
  const char* p = a->text.c_str() + at + 11;
  unsigned long long addr = 0, size = 0;
  int w = 0, used = 0;
  while (std::sscanf(p, "[%llu,%llu,%d]%n", &addr, &size, &w, &used) == 3) {
    regions.emplace_back(addr, size);
    out.written.push_back(w);
    p += used;
    if (*p == ',') ++p;
  }
  uint64_t total = 0;
  for (const auto& r : regions) total += r.second;
  void* m = ::mmap(nullptr, total, PROT_READ, MAP_SHARED, a->fds[0].get(), 0);
  if (m == MAP_FAILED) return out;
  uint64_t off = 0;
  for (const auto& r : regions) {
    out.contents.emplace_back(static_cast<const char*>(m) + off, r.second);
    off += r.second;
  }
  ::munmap(m, total);
  auto released = pos::ask_job(sock, "snap-release", 10000);
  if (!released.ok() || released->find("\"ok\":true") == std::string::npos) out.text += " (not released)";
  return out;
}

// What allocation i of the "writes" probe holds: its fill, with the first 4 KiB overwritten by v
// (or none).
std::string holds(int i, int v = -1) {
  const size_t sizes[3] = {2 << 20, 4 << 20, 2 << 20};
  std::string s(sizes[i], static_cast<char>('a' + i));
  if (v >= 0) std::fill(s.begin(), s.begin() + 4096, static_cast<char>(v));
  return s;
}

TEST_F(Preloaded, AGpuOnlyCheckpointTakesTheMemoryAtItsCutAndNamesWhatWasWrittenSinceTheLastOne) {
  const std::string dir = jobs_dir() + "-snap";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  const std::string sock = pos::job_socket_path(dir, job.pid);
  Snap s = snap_of(sock);  // everything is new
  ASSERT_EQ(s.written, (std::vector<int>{1, 1, 1})) << s.text;
  EXPECT_NE(s.text.find("\"ok\":true,\"device\":0,\"since\":"), std::string::npos) << s.text;
  EXPECT_NE(s.text.find("\"bytes\":8388608,\"count\":3,\"written\":3,"), std::string::npos)
      << s.text;
  EXPECT_NE(s.text.find("\"streams\":2,"), std::string::npos) << s.text;  // the legacy one and the probe's
  EXPECT_NE(s.text.find("\"ahead\":true,\"ahead_waits\":0,"), std::string::npos) << s.text;  // copies ran ahead
  ASSERT_EQ(s.contents.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.contents[i] == holds(i)) << i;
  const Snap again = snap_of(sock);
  EXPECT_EQ(again.written, (std::vector<int>{0, 0, 0}));  // nothing since
  // Each cut names the one its marks are relative to: the previous cut.
  const auto field = [](const std::string& t, const char* key) {
    const size_t at = t.find(std::string("\"") + key + "\":");
    return at == std::string::npos ? std::string() : t.substr(at, t.find(',', at) - at).substr(std::strlen(key) + 3);
  };
  EXPECT_FALSE(field(s.text, "cut").empty());
  EXPECT_EQ(field(again.text, "since"), field(s.text, "cut"));
  EXPECT_NE(field(again.text, "cut"), field(s.text, "cut"));
  // Each way of writing marks what it writes (a struct's second address too: the kernel may use
  // either), and the copy holds the bytes at the cut.
  int v0 = -1, v1 = -1, v2 = -1;
  for (const auto& [cmd, marks] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"launch 1 120", {0, 1, 0}}, {"kernel 2 121", {0, 0, 1}}, {"struct 0 122", {1, 1, 0}},
           {"extra 2 123", {0, 0, 1}}, {"memset 0 124", {1, 0, 0}}, {"nop", {0, 0, 0}}}) {
    job.say(cmd + "\n");
    ASSERT_EQ(job.line_within(5000), "done rc=0\n") << cmd;
    int x = -1, v = -1;
    char how[16];
    if (std::sscanf(cmd.c_str(), "%15s %d %d", how, &x, &v) == 3) (x == 0 ? v0 : x == 1 ? v1 : v2) = v;
    s = snap_of(sock);
    EXPECT_EQ(s.written, marks) << cmd << ": " << s.text;
    ASSERT_EQ(s.contents.size(), 3u) << cmd;
    EXPECT_TRUE(s.contents[0] == holds(0, v0) && s.contents[1] == holds(1, v1) && s.contents[2] == holds(2, v2)) << cmd;
  }
  // A CUDA graph capture in progress defers the cut (the job runs on); after it, cuts go on, and
  // the graph work counts as written.
  job.say("capture\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  s = snap_of(sock);
  EXPECT_NE(s.text.find("a CUDA graph capture is in progress"), std::string::npos) << s.text;
  job.say("endcapture\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  EXPECT_EQ(snap_of(sock).written, (std::vector<int>{0, 0, 0}));
  // A copy whose release would fall into a capture is kept until the next cut (which lets it go).
  auto kept = pos::ask_job_fds(sock, "snap-cut", {}, 10000);
  ASSERT_TRUE(kept.ok());
  EXPECT_NE(kept->text.find("\"ok\":true"), std::string::npos) << kept->text;
  job.say("capture\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  auto deferred = pos::ask_job(sock, "snap-release", 10000);
  ASSERT_TRUE(deferred.ok());
  EXPECT_NE(deferred->find("\"deferred\":\"a CUDA graph capture is in progress"), std::string::npos) << *deferred;
  job.say("endcapture\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  EXPECT_EQ(snap_of(sock).written, (std::vector<int>{0, 0, 0}));
  // A kernel whose parameters cannot be read: everything counts as written.
  job.say("blind 1 125\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  EXPECT_EQ(snap_of(sock).written, (std::vector<int>{1, 1, 1}));
  auto ps = pos::ask_job(sock, "ps", 10000);
  ASSERT_TRUE(ps.ok());
  EXPECT_NE(ps->find("\"writes\":{\"launches_scanned\":5,\"launches_unparsed\":1,\"layouts\":5,\"addresses\":5,"), std::string::npos) << *ps;
  // Nothing left to release; a checkpoint while a dump holds the job is refused, and the job runs on.
  auto twice = pos::ask_job(sock, "snap-release", 10000);
  ASSERT_TRUE(twice.ok());
  EXPECT_NE(twice->find("nothing to release"), std::string::npos) << *twice;
  auto held = pos::ask_job_fds(sock, "dump-share", {}, 10000);
  ASSERT_TRUE(held.ok());
  s = snap_of(sock);
  EXPECT_NE(s.text.find("a dump holds this job"), std::string::npos) << s.text;
  auto back = pos::ask_job(sock, "dump-resume", 10000);
  ASSERT_TRUE(back.ok());
  job.say("launch 2 9\n");
  EXPECT_EQ(job.line_within(5000), "done rc=0\n");
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
}

// While a cut's copies run ahead of the job (the fake's event waits made slow, so that the job calls
// in meanwhile), each of the job's calls that may touch memory of the cut waits for its copy on its
// own stream, once per stream; one that touches none waits for nothing; the copy holds the bytes at
// the cut. With `order=all` the copies are ordered before all later work instead.
TEST_F(Preloaded, WhileACutsCopiesRunTheJobsCallsWaitOnlyForTheCopiesOfWhatTheyTouch) {
  for (const std::string ahead : {"1", "0"}) {
    const std::string dir = jobs_dir() + "-snap-ahead" + ahead;
    std::filesystem::remove_all(dir);
    RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "1"}, {"FAKE_CUDA_EVENT_SYNC_MS", "700"}});
    ASSERT_TRUE(job.ready());
    const std::string sock = pos::job_socket_path(dir, job.pid);
    Snap s;
    std::thread cut([&] { s = snap_of(sock, ahead == "1" ? "snap-cut" : "snap-cut order=all"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the cut is waiting for its copies now
    for (const char* cmd : {"launch 1 140\n", "launch 1 141\n", "nop\n", "memset 2 142\n"}) {
      job.say(cmd);
      EXPECT_EQ(job.line_within(5000), "done rc=0\n") << cmd;
    }
    cut.join();
    ASSERT_EQ(s.contents.size(), 3u) << s.text;
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.contents[i] == holds(i)) << ahead << " " << i;
    if (ahead == "1") {
      // The launches on the probe's stream: one wait; the memset on the legacy stream: another.
      EXPECT_NE(s.text.find("\"ahead\":true,\"ahead_waits\":2,"), std::string::npos) << s.text;
    } else {
      EXPECT_NE(s.text.find("\"ahead\":false,\"ahead_waits\":0,"), std::string::npos) << s.text;
    }
    // The writes during the cut are marked for the next one.
    EXPECT_EQ(snap_of(sock).written, (std::vector<int>{0, 1, 1}));
    EXPECT_EQ(job.stop(), 0);
    std::filesystem::remove_all(dir);
  }
}

// A CUDA graph is read when the job instantiates it: its launches mark only the memory its kernel
// nodes name, and the copy holds what it wrote. An executable graph changed after instantiation is
// no longer known, so its launches mark everything, as they do with POS_GRAPH_WRITES=0; the census
// counts both.
TEST_F(Preloaded, AGraphLaunchMarksWhatItsGraphWasReadToWriteUntilTheGraphIsChanged) {
  for (const std::string read : {"1", "0"}) {
    const std::string dir = jobs_dir() + "-snap-graph" + read;
    std::filesystem::remove_all(dir);
    RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "1"}, {"POS_GRAPH_WRITES", read}});
    ASSERT_TRUE(job.ready());
    const std::string sock = pos::job_socket_path(dir, job.pid);
    (void)snap_of(sock);  // everything is new; from here on, only what the job writes
    job.say("gmake 1 130\n");
    ASSERT_EQ(job.line_within(5000), "done rc=0\n");
    EXPECT_EQ(snap_of(sock).written, (std::vector<int>{0, 0, 0})) << read;  // made, not run
    job.say("glaunch 1 0\n");
    ASSERT_EQ(job.line_within(5000), "done rc=0\n");
    Snap s = snap_of(sock);
    const std::vector<int> marked = read == "1" ? std::vector<int>{0, 1, 0} : std::vector<int>{1, 1, 1};
    EXPECT_EQ(s.written, marked) << s.text;
    ASSERT_EQ(s.contents.size(), 3u) << s.text;
    EXPECT_TRUE(s.contents[0] == holds(0) && s.contents[1] == holds(1, 130) && s.contents[2] == holds(2)) << read;
    // The executable's node now writes allocation 2: the layer cannot know it, so all of it counts.
    job.say("gset 1 2\n");
    ASSERT_EQ(job.line_within(5000), "done rc=0\n");
    job.say("glaunch 1 0\n");
    ASSERT_EQ(job.line_within(5000), "done rc=0\n");
    s = snap_of(sock);
    EXPECT_EQ(s.written, (std::vector<int>{1, 1, 1})) << s.text;
    ASSERT_EQ(s.contents.size(), 3u) << s.text;
    EXPECT_TRUE(s.contents[2] == holds(2, 130)) << read;
    auto ps = pos::ask_job(sock, "ps", 10000);
    ASSERT_TRUE(ps.ok());
    if (read == "1") {
      EXPECT_NE(ps->find("\"graph_writes\":{\"graphs_read\":1,\"graphs_unread\":0,\"launches_read\":1,"
                         "\"launches_unread\":1}"),
                std::string::npos)
          << *ps;
    } else {
      EXPECT_NE(ps->find("\"graph_writes\":{\"graphs_read\":0,\"graphs_unread\":1,\"launches_read\":0,"
                         "\"launches_unread\":2,\"last_unread\":\"POS_GRAPH_WRITES=0\"}"),
                std::string::npos)
          << *ps;
    }
    EXPECT_EQ(job.stop(), 0);
    std::filesystem::remove_all(dir);
  }
}

// `snap-cut align=MS`: a cut of a job with stream-ordered memory waits for the job's step boundary
// (its return from a synchronizing call) while the job is busy, and no longer than MS; an idle job
// is cut at once, and so is one without such memory. The cut holds what the job's step wrote. Bad
// arguments are refused by name and change nothing.
TEST_F(Preloaded, ACutWaitsForTheJobsStepBoundaryWhileItWorksButNotForAnIdleJob) {
  const std::string dir = jobs_dir() + "-snap-align";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  const std::string sock = pos::job_socket_path(dir, job.pid);
  for (const char* bad : {"snap-cut align=x", "snap-cut align=60001", "snap-cut align=", "snap-cut bogus",
                          "snap-cut align=5 order=none", "snap-cut "}) {
    auto a = pos::ask_job_fds(sock, bad, {}, 10000);
    ASSERT_TRUE(a.ok()) << bad;
    EXPECT_NE(a->text.find("snap-cut takes order=all and align=MS (0 to 60000)"), std::string::npos) << bad << ": " << a->text;
    EXPECT_TRUE(a->fds.empty()) << bad;
  }
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // Without stream-ordered memory there is nothing to wait for.
  EXPECT_NE(snap_of(sock, "snap-cut align=5000").text.find("\"align\":\"none\",\"align_s\":0.000000"), std::string::npos);
  job.say("palloc 0 9\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  // Idle: cut without waiting out the 5 s.
  auto t0 = std::chrono::steady_clock::now();
  Snap s = snap_of(sock, "snap-cut align=5000");
  EXPECT_LT(since(t0), 2.5);
  EXPECT_NE(s.text.find("\"align\":\"idle\""), std::string::npos) << s.text;
  EXPECT_EQ(s.written, (std::vector<int>{0, 0, 0, 1})) << s.text;  // the new stream-ordered block's piece
  // Busy: the cut waits through the job's work, and goes at its step's end.
  std::atomic<bool> done{false};
  job.say("busy 0 500\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread cut([&] {
    s = snap_of(sock, "snap-cut align=5000");
    done = true;
  });
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  EXPECT_FALSE(done.load());  // still waiting: no step boundary yet
  job.say("launch 1 170\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  const auto synced = std::chrono::steady_clock::now();
  job.say("sync\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  cut.join();
  EXPECT_LT(since(synced), 2.5);  // the sync ended the wait, not the 5 s
  EXPECT_NE(s.text.find("\"align\":\"sync\""), std::string::npos) << s.text;
  EXPECT_EQ(s.written, (std::vector<int>{0, 1, 0, 0})) << s.text;
  ASSERT_EQ(s.contents.size(), 4u) << s.text;
  EXPECT_TRUE(s.contents[0] == holds(0) && s.contents[1] == holds(1, 170) && s.contents[2] == holds(2));
  // A job busy past MS is cut at MS; align=0 does not wait.
  std::thread late([&] { s = snap_of(sock, "snap-cut align=150"); });
  job.say("busy 0 600\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  late.join();
  EXPECT_NE(s.text.find("\"align\":\"timeout\",\"align_s\":0.1"), std::string::npos) << s.text;
  EXPECT_NE(snap_of(sock, "snap-cut align=0").text.find("\"align\":\"off\",\"align_s\":0.000000"), std::string::npos);
  // A job that captures CUDA graphs: a capture that begins while the cut waits (held back by it)
  // ends the wait, and begins once the cut is done.
  for (const char* cmd : {"capture\n", "endcapture\n"}) {
    job.say(cmd);
    ASSERT_EQ(job.line_within(5000), "done rc=0\n") << cmd;
  }
  job.say("busycapture 0 400\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  t0 = std::chrono::steady_clock::now();
  s = snap_of(sock, "snap-cut align=5000");
  EXPECT_LT(since(t0), 2.5);
  EXPECT_NE(s.text.find("\"align\":\"capture\""), std::string::npos) << s.text;
  EXPECT_EQ(job.line_within(5000), "done rc=0\n");  // the capture began
  job.say("endcapture\n");
  EXPECT_EQ(job.line_within(5000), "done rc=0\n");
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
}

// Of the stream-ordered pool's segments a cut copies only what live blocks hold: a block the job
// freed before the cut is dead at it. The pieces hold the live blocks' bytes.
TEST_F(Preloaded, ACutCopiesOnlyTheLiveBlocksOfStreamOrderedMemory) {
  const std::string dir = jobs_dir() + "-snap-pool";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  const std::string sock = pos::job_socket_path(dir, job.pid);
  for (const char* cmd : {"palloc 0 120\n", "palloc 1 121\n", "palloc 2 122\n", "pfree 1 0\n"}) {
    job.say(cmd);
    ASSERT_EQ(job.line_within(5000), "done rc=0\n") << cmd;
  }
  Snap s = snap_of(sock, "snap-cut align=0");
  // The three allocations, then slots 0 and 2 of one 32 MiB segment (slot 1 between them is free).
  ASSERT_EQ(s.contents.size(), 5u) << s.text;
  EXPECT_NE(s.text.find("\"bytes\":10485760,\"count\":5,"), std::string::npos) << s.text;
  EXPECT_NE(s.text.find("\"pool_free_bytes\":31457280,"), std::string::npos) << s.text;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.contents[i] == holds(i)) << i;
  EXPECT_TRUE(s.contents[3] == std::string(1 << 20, static_cast<char>(120)));
  EXPECT_TRUE(s.contents[4] == std::string(1 << 20, static_cast<char>(122)));
  // Slot 0 freed too, slot 1 allocated again (where slot 0 was: the first fit) with new bytes;
  // slots 1 and 2 together again, beside each other: one piece.
  for (const char* cmd : {"pfree 0 0\n", "palloc 1 123\n", "palloc 0 124\n"}) {
    job.say(cmd);
    ASSERT_EQ(job.line_within(5000), "done rc=0\n") << cmd;
  }
  s = snap_of(sock, "snap-cut align=0");
  ASSERT_EQ(s.contents.size(), 4u) << s.text;
  EXPECT_EQ(s.written, (std::vector<int>{0, 0, 0, 1})) << s.text;
  EXPECT_NE(s.text.find("\"pool_free_bytes\":30408704,"), std::string::npos) << s.text;
  ASSERT_EQ(s.contents[3].size(), 3u << 20) << s.text;
  EXPECT_TRUE(s.contents[3] == std::string(1 << 20, static_cast<char>(123)) + std::string(1 << 20, static_cast<char>(124)) +
                                   std::string(1 << 20, static_cast<char>(122)));
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
}

// A reader that wrote its copy and let go of it with `snap-release keep` leaves the shadow to the
// job: the next cut copies into it (and holds the new bytes); a shadow let go of plainly, or never
// let go of (its reader may still be writing), is not copied into again.
TEST_F(Preloaded, AShadowItsReaderKeptIsCopiedIntoAgainAndNoOtherIs) {
  const std::string dir = jobs_dir() + "-snap-keep";
  std::filesystem::remove_all(dir);
  RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  const std::string sock = pos::job_socket_path(dir, job.pid);
  const auto cut = [&] {
    auto a = pos::ask_job_fds(sock, "snap-cut", {}, 10000);
    return a.ok() ? a->text : a.status().to_string();
  };
  const auto release = [&](const char* how) {
    auto a = pos::ask_job(sock, how, 10000);
    return a.ok() ? *a : a.status().to_string();
  };
  EXPECT_NE(cut().find("\"shadow_reused\":false"), std::string::npos);  // the first
  EXPECT_EQ(release("snap-release keep"), "{\"ok\":true,\"kept\":8388608}");
  EXPECT_NE(cut().find("\"shadow_reused\":true"), std::string::npos);
  EXPECT_NE(cut().find("\"shadow_reused\":false"), std::string::npos);  // the last one was never let go of
  EXPECT_EQ(release("snap-release"), "{\"ok\":true}");
  EXPECT_NE(release("snap-release keep").find("nothing to release"), std::string::npos);
  EXPECT_NE(cut().find("\"shadow_reused\":false"), std::string::npos);
  EXPECT_EQ(release("snap-release keep"), "{\"ok\":true,\"kept\":8388608}");
  // Copied into again, the shadow holds the bytes of the new cut.
  job.say("launch 1 150\n");
  ASSERT_EQ(job.line_within(5000), "done rc=0\n");
  const Snap s = snap_of(sock);
  EXPECT_NE(s.text.find("\"shadow_reused\":true"), std::string::npos) << s.text;
  EXPECT_EQ(s.written, (std::vector<int>{0, 1, 0}));
  ASSERT_EQ(s.contents.size(), 3u);
  EXPECT_TRUE(s.contents[0] == holds(0) && s.contents[1] == holds(1, 150) && s.contents[2] == holds(2));
  // A dump lets go of a kept shadow (NVIDIA's checkpoint must not take it).
  EXPECT_NE(cut().find("\"ok\":true"), std::string::npos);
  EXPECT_EQ(release("snap-release keep"), "{\"ok\":true,\"kept\":8388608}");
  auto held = pos::ask_job_fds(sock, "dump-share", {}, 10000);
  ASSERT_TRUE(held.ok());
  auto back = pos::ask_job(sock, "dump-resume", 10000);
  ASSERT_TRUE(back.ok());
  EXPECT_NE(cut().find("\"shadow_reused\":false"), std::string::npos);
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
}

TEST_F(Preloaded, AGpuOnlyCheckpointRefusesAJobWithoutPlacementAndTakesMemoryTheJobMapsItselfAsWritten) {
  const std::string dir = jobs_dir() + "-snap-vmm";
  std::filesystem::remove_all(dir);
  {
    RunningProbe job(dir, "writes", {{"POS_DRIVER_PLACE", "0"}});
    ASSERT_TRUE(job.ready());
    const Snap s = snap_of(pos::job_socket_path(dir, job.pid));
    EXPECT_NE(s.text.find("placement is off"), std::string::npos) << s.text;
    job.say("nop\n");
    EXPECT_EQ(job.line_within(5000), "done rc=0\n");  // running on
  }
  {
    // One placed allocation (3 MiB of a pattern in 4) and two 4 MiB mappings the job made itself.
    RunningProbe job(dir, "vmm", {{"POS_DRIVER_PLACE", "1"}});
    ASSERT_TRUE(job.ready());
    const std::string sock = pos::job_socket_path(dir, job.pid);
    std::string p1(4 << 20, '\0'), p2(4 << 20, '\0'), p3(3 << 20, '\0');
    for (size_t i = 0; i < p1.size(); ++i) p1[i] = static_cast<char>(i * 3 + 1), p2[i] = static_cast<char>(i * 5 + 2);
    for (size_t i = 0; i < p3.size(); ++i) p3[i] = static_cast<char>(i * 11 + 7);
    for (int round = 0; round < 2; ++round) {
      const Snap s = snap_of(sock);
      EXPECT_NE(s.text.find("\"regions\":[[35184372088832,4194304," + std::string(round == 0 ? "1" : "0") +
                            "],[52776558133248,4194304,1],[52776562327552,4194304,1]]"),
                std::string::npos)
          << s.text;  // the job's own mappings always count as written: no scan marks them
      // ... nor sees what touches them: every later work waits for all the copies.
      EXPECT_NE(s.text.find("\"ahead\":false,"), std::string::npos) << s.text;
      ASSERT_EQ(s.contents.size(), 3u) << s.text;
      EXPECT_TRUE(s.contents[0].substr(0, p3.size()) == p3);
      EXPECT_TRUE(s.contents[1] == p1);
      EXPECT_TRUE(s.contents[2] == p2);
    }
    job.say("check\n");
    EXPECT_EQ(job.line_within(5000), "rc=0 same=1\n");
  }
  std::filesystem::remove_all(dir);
}

// Descriptors ride the control socket in batches (250 on a byte), both ways; a line too short to
// carry its descriptors is refused before anything is sent.
TEST(JobControl, DescriptorsTravelBothWaysInBatchesAndAShortLineCannotCarryMore) {
  const std::string dir = ::testing::TempDir() + "pos-jc-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto server = pos::JobControlServer::start_with_fds(dir, [](pos::ControlMessage& m) {
    pos::ControlMessage out;
    size_t open = 0;
    for (const pos::UniqueFd& f : m.fds) open += ::fcntl(f.get(), F_GETFD) >= 0 ? 1 : 0;
    out.text = m.text + " got " + std::to_string(m.fds.size()) + " open " + std::to_string(open);
    for (int i = 0; i < 300; ++i) out.fds.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return out;
  });
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  std::vector<pos::UniqueFd> mine;
  std::vector<int> send;
  for (int i = 0; i < 600; ++i) {
    mine.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    send.push_back(mine.back().get());
  }
  auto a = pos::ask_job_fds((*server)->path(), "take these", send, 5000);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->text, "take these got 600 open 600");
  ASSERT_EQ(a->fds.size(), 300u);
  for (const pos::UniqueFd& f : a->fds) EXPECT_GE(::fcntl(f.get(), F_GETFD), 0);
  // Three batches need three bytes: "ab" cannot carry them.
  auto shortline = pos::ask_job_fds((*server)->path(), "ab", send, 5000);
  EXPECT_EQ(shortline.status().code(), pos::Code::kInvalidArgument) << shortline.status().to_string();
  // Without descriptors it is the plain one-line exchange.
  auto plain = pos::ask_job((*server)->path(), "hello", 5000);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->substr(0, 18), "hello got 0 open 0");
  server->reset();
  std::filesystem::remove_all(dir);
}

// Memory the job maps itself (expandable_segments' way) is saved, released, made anew at the same
// addresses with the same access, and the job's own handle values still work afterwards.
TEST_F(Preloaded, MemoryTheJobMapsItselfIsDumpedWithPlacedMemoryAndItsHandlesStillWorkAfterTheResume) {
  const std::string dir = jobs_dir() + "-vmm", img = dir + "-img";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(img);
  std::filesystem::create_directories(img);
  RunningProbe job(dir, "vmm", {{"POS_DRIVER_PLACE", "1"}});
  ASSERT_TRUE(job.ready());
  job.say("check\n");
  ASSERT_EQ(job.line_within(5000), "rc=0 same=1\n");
  const std::string sock = pos::job_socket_path(dir, job.pid);
  auto saved = pos::ask_job(sock, "dump-save " + img, 10000);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  // The placed 3 MiB (4 with rounding) and the job's two 4 MiB mappings.
  EXPECT_NE(saved->find("\"ok\":true,\"bytes\":12582912,\"regions\":3,"), std::string::npos) << *saved;
  auto table = read_region_table(img);
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  ASSERT_EQ(table->regions.size(), 3u);
  EXPECT_EQ(table->regions[0].addr, 0x200000000000ull);  // placed
  EXPECT_EQ(table->regions[1].addr, 0x300000000000ull);  // the job's
  EXPECT_EQ(table->regions[2].addr, 0x300000400000ull);
  job.say("check\n");
  EXPECT_EQ(job.line_within(300), "");  // held
  auto resumed = pos::ask_job(sock, "dump-resume", 10000);
  ASSERT_TRUE(resumed.ok());
  EXPECT_NE(resumed->find("\"ok\":true"), std::string::npos) << *resumed;
  EXPECT_EQ(job.line_within(5000), "rc=0 same=1\n");
  job.say("shrink\n");  // unmap + cuMemRelease of the handle value from before the dump
  EXPECT_EQ(job.line_within(5000), "rc=0\n");
  EXPECT_EQ(job.stop(), 0);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(img);
}

// Memory POS did not place stays mapped for NVIDIA's checkpoint to copy: the dump goes through and
// says so. What it cannot take (IPC, several GPUs) is refused by name and the job runs on.
TEST_F(Preloaded, ADumpTakesUnplacedMemoryThroughTheDriverSayingSoAndRefusesWhatItCannotTakeByName) {
  const std::string dir = jobs_dir() + "-noplace", img = dir + "-img";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(img);
  std::filesystem::create_directories(img);
  {
    RunningProbe job(dir, "memory", {{"POS_DRIVER_PLACE", "0"}});
    ASSERT_TRUE(job.ready());
    const std::string sock = pos::job_socket_path(dir, job.pid);
    auto r = pos::ask_job(sock, "dump-save " + img, 10000);
    ASSERT_TRUE(r.ok());
    EXPECT_NE(r->find("\"ok\":true,\"bytes\":0,\"regions\":0,"), std::string::npos) << *r;
    EXPECT_NE(r->find("placement is off (POS_DRIVER_PLACE=0): NVIDIA's checkpoint copies all device memory"),
              std::string::npos)
        << *r;
    auto rel = pos::ask_job(sock, "dump-resume relative/dir", 10000);
    ASSERT_TRUE(rel.ok());
    EXPECT_NE(rel->find("\"ok\":false"), std::string::npos) << *rel;  // a relative path: refused, still held
    auto back = pos::ask_job(sock, "dump-resume", 10000);
    ASSERT_TRUE(back.ok());
    EXPECT_NE(back->find("\"ok\":true"), std::string::npos) << *back;
    job.say("check\n");
    EXPECT_NE(job.line_within(5000).rfind("rc=", 0), std::string::npos);  // it runs (the fake's own memory is not backed)
    EXPECT_EQ(job.stop(), 0);
  }
  {
    std::filesystem::remove_all(img);
    std::filesystem::create_directories(img);
    RunningProbe job(dir, "features-wait", {{"POS_DRIVER_PLACE", "1"}, {"FAKE_CUDA", env("POS_FAKE_CUDA")}});
    ASSERT_TRUE(job.ready());
    auto r = pos::ask_job(pos::job_socket_path(dir, job.pid), "dump-save " + img, 10000);
    ASSERT_TRUE(r.ok());
    EXPECT_NE(r->find("\"ok\":false,\"error\":\"this job cannot be dumped: CUDA IPC memory handles (2 calls); several "
                      "GPUs (0, 1)"),
              std::string::npos)
        << *r;
    EXPECT_FALSE(std::filesystem::exists(img + "/regions"));
    EXPECT_EQ(job.stop(), 0);
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(img);
}

TEST(DriverDeviceImage, ARegionTableReadsBackAsWrittenAndEveryDamageIsNamed) {
  RegionTable t;
  t.chunk = 8192;
  t.files = 2;
  t.regions.push_back(SavedRegion{0, 0x200000000000ull, 16384, 0, {0x1234abcd, 0x0}});
  t.regions.push_back(SavedRegion{0, 0x200000200000ull, 4096, 16384, {0xffffffff}});
  const std::string text = region_table_text(t);
  auto back = parse_region_table(text);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->regions.size(), 2u);
  EXPECT_EQ(back->regions[1].addr, 0x200000200000ull);
  EXPECT_EQ(back->regions[0].crcs, (std::vector<uint32_t>{0x1234abcd, 0x0}));
  EXPECT_EQ(back->bytes(), 20480u);
  EXPECT_EQ(back->files, 2u);
  // Chunks go to the files in turn: 8 KiB, 8 KiB of the first region, then the second's 4 KiB.
  const std::vector<ChunkPlace> places = chunk_places(*back);
  ASSERT_EQ(places.size(), 3u);
  EXPECT_EQ(places[1].file, 1u);
  EXPECT_EQ(places[1].file_off, 0u);
  EXPECT_EQ(places[2].file, 0u);
  EXPECT_EQ(places[2].file_off, 8192u);
  EXPECT_EQ(file_sizes(*back), (std::vector<uint64_t>{12288, 8192}));
  EXPECT_EQ(region_table_text(*back), text);
  const auto damaged = [&](size_t at, char c) {
    std::string d = text;
    d[at] = c;
    return parse_region_table(d).status();
  };
  for (size_t i = 0; i < text.size(); i += 7) {  // any byte changed: refused (the checksum, if nothing else)
    if (text[i] == '\n') continue;
    const Status st = damaged(i, text[i] == '1' ? '2' : '1');
    EXPECT_EQ(st.code(), Code::kCorrupt) << "byte " << i;
  }
  EXPECT_EQ(parse_region_table("").status().code(), Code::kCorrupt);
  EXPECT_EQ(parse_region_table(text.substr(0, text.size() - 1)).status().code(), Code::kCorrupt);
  // Regions out of order, or bytes not where they should be, are named even with a right checksum.
  RegionTable o = t;
  std::swap(o.regions[0].addr, o.regions[1].addr);
  EXPECT_NE(parse_region_table(region_table_text(o)).status().message().find("out of order"), std::string::npos);
  RegionTable g = t;
  g.regions[1].offset = 20000;
  EXPECT_NE(parse_region_table(region_table_text(g)).status().message().find("not where"), std::string::npos);
  RegionTable c = t;
  c.regions[0].crcs.pop_back();
  EXPECT_NE(parse_region_table(region_table_text(c)).status().message().find("one checksum per chunk"), std::string::npos);
}

// A table's text with the right end line (counts and checksum) for `body`, so that a test can
// reach the checks behind the checksum.
std::string with_end(const std::string& body, size_t regions, uint64_t bytes) {
  char end[64];
  std::snprintf(end, sizeof(end), "end %zu %llu %08x\n", regions, static_cast<unsigned long long>(bytes),
                ckpt::crc32c(body.data(), body.size()));
  return body + end;
}

TEST(DriverDeviceImage, AnIncrementalTableNamesWhatItInheritsAndEveryMisplacedInheritIsNamed) {
  RegionTable t;
  t.chunk = 8192;
  t.files = 1;
  t.regions.push_back(SavedRegion{0, 0x200000200000ull, 8192, 0, {0x11111111}});
  t.inherited.push_back(SavedRegion{0, 0x200000000000ull, 2 << 20, 0, {}});
  t.inherited.push_back(SavedRegion{0, 0x200000400000ull, 4096, 0, {}});
  const std::string text = region_table_text(t);
  EXPECT_EQ(text.rfind("pos-driver-memory 2\n", 0), 0u) << text;
  auto back = parse_region_table(text);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->bytes(), 8192u);  // only what it stores
  ASSERT_EQ(back->inherited.size(), 2u);
  const std::vector<SavedRegion> all = back->allocations();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].addr, 0x200000000000ull);
  EXPECT_EQ(all[1].addr, 0x200000200000ull);
  EXPECT_EQ(all[2].addr, 0x200000400000ull);
  EXPECT_EQ(region_table_text(*back), text);
  EXPECT_EQ(file_sizes(*back), (std::vector<uint64_t>{8192}));
  // Nothing inherited: format 1, as before.
  RegionTable whole = t;
  whole.inherited.clear();
  EXPECT_EQ(region_table_text(whole).rfind("pos-driver-memory 1\n", 0), 0u);
  const std::string head2 = "pos-driver-memory 2\nchunk 8192\nfiles 1\n", head1 = "pos-driver-memory 1\nchunk 8192\nfiles 1\n";
  const std::string region = "region 0 0x200000200000 8192 0 11111111\n";
  const auto refused = [](const std::string& txt, const char* why) {
    const Status st = parse_region_table(txt).status();
    EXPECT_EQ(st.code(), Code::kCorrupt) << txt;
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  };
  refused(with_end(head1 + "inherit 0 0x200000000000 2097152\n" + region, 1, 8192), "bad inherit line");
  refused(with_end(head2 + region + "inherit 0 0x200000000000 2097152\n", 1, 8192), "bad inherit line");
  refused(with_end(head2 + region, 1, 8192), "inherits nothing");
  refused(with_end(head2 + "inherit 0 0x200000200000 4096\n" + region, 1, 8192), "overlapping an inherited one");
  refused(with_end(head2 + "inherit 0 0x200000400000 4096\ninherit 0 0x200000000000 4096\n" + region, 1, 8192),
          "inherited regions out of order");
  refused(with_end(head2 + "inherit 0 0x200000000001 4096\n" + region, 1, 8192), "bad device, address or size");
  refused(with_end(head2 + "inherit 0 0x200000000000 4096 extra\n" + region, 1, 8192), "bad inherit line");
  // Chunks a stored region leaves to the previous image (` same A-B,...`): read back, their bytes
  // not counted as stored; and every malformed list named.
  RegionTable c;
  c.chunk = 4096;
  c.files = 1;
  c.regions.push_back(SavedRegion{0, 0x200000000000ull, 5 * 4096, 0, {1, 2, 3, 4, 5}, {true, false, true, true, false}});
  const std::string ctext = region_table_text(c);
  EXPECT_NE(ctext.find(" same 0-0,2-3\n"), std::string::npos) << ctext;
  auto cback = parse_region_table(ctext);
  ASSERT_TRUE(cback.ok()) << cback.status().to_string();
  EXPECT_TRUE(cback->incremental());
  EXPECT_EQ(cback->same_bytes(), 3u * 4096);
  EXPECT_TRUE(cback->regions[0].chunk_same(3) && !cback->regions[0].chunk_same(4));
  const std::string h2 = "pos-driver-memory 2\nchunk 4096\nfiles 1\n", h1 = "pos-driver-memory 1\nchunk 4096\nfiles 1\n";
  const std::string r5 = "region 0 0x200000000000 20480 0 00000001,00000002,00000003,00000004,00000005";
  refused(with_end(h1 + r5 + " same 0-0\n", 1, 20480), "in format 1");
  for (const char* bad : {" same 0-5", " same 1-0", " same 0-1,1-2", " same 0-0,", " same ", " same x-1", " same 0-0;1-1"})
    refused(with_end(h2 + r5 + bad + "\n", 1, 20480), "chunks left to the previous image");
}

TEST_F(Preloaded, WithPosControlOffTheJobMakesNoSocket) {
  const std::string dir = jobs_dir() + "-off";
  std::filesystem::remove_all(dir);
  probe("direct", true, "POS_CONTROL=0 POS_JOBS_DIR=" + dir);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// ---- pos run ----

TEST(PosRun, StartsACommandWithTheDriverLayerPreloadedAndItsCensusWhereAsked) {
  const std::string file = ::testing::TempDir() + "pos_run_census";
  std::filesystem::remove(file);
  int code = -1;
  const std::string out = test::run_program(
      "POS_RUN",
      "FAKE_CUDA=" + env("POS_FAKE_CUDA") + " POS_REAL_LIBCUDA=" + env("POS_FAKE_CUDA") + " POS_CONTROL=0 ",
      {"run", "--census", file, "--", env("POS_DRIVER_PROBE"), "direct"}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("where=pos_driver"), std::string::npos) << out;
  std::ifstream f(file);
  const std::string c((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(c.find("\"cuMemAlloc_v2\":3"), std::string::npos) << c;
}

TEST(PosRun, HelpSucceedsAndAMissingCommandOrAnUnknownOneIsNamed) {
  int code = -1;
  std::string err;
  std::string out = test::run_program("POS_RUN", "", {"--help"}, &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(out.find("run"), std::string::npos) << out;
  (void)test::run_program("POS_RUN", "", {"run"}, &code, &err);
  EXPECT_EQ(code, 2);
  EXPECT_NE(err.find("command"), std::string::npos) << err;
  (void)test::run_program("POS_RUN", "", {"bogus"}, &code, &err);
  EXPECT_NE(code, 0);
  EXPECT_NE(err.find("bogus"), std::string::npos) << err;
  (void)test::run_program("POS_RUN", "", {"run", "--bogus-option", "true"}, &code, &err);
  EXPECT_EQ(code, 2);
  EXPECT_NE(err.find("--bogus-option"), std::string::npos) << err;
  (void)test::run_program("POS_RUN", "POS_DRIVER_LIB=/nonexistent/libpos_driver.so ", {"run", "--", "true"}, &code,
                          &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("/nonexistent/libpos_driver.so"), std::string::npos) << err;
  (void)test::run_program("POS_RUN", "", {"run", "--", "/nonexistent/program"}, &code, &err);
  EXPECT_EQ(code, 127);
  EXPECT_NE(err.find("/nonexistent/program"), std::string::npos) << err;
}

}  // namespace
}  // namespace pos::driver
