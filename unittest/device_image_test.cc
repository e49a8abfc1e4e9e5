// device_image_test.cc — save_regions / load_regions (remoting/driver/device_image.h) against a
// fake of the driver's copy calls whose "device memory" is this process's memory: a round trip of
// bytes, and the copy threads' CPU priority (CopyOptions::nice) while the caller's stays as it was.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <vector>

#include "remoting/driver/device_image.h"

namespace {
namespace fs = std::filesystem;
using namespace pos::driver;

CUresult ok_retain(CUcontext* c, CUdevice) { *c = reinterpret_cast<CUcontext>(0x1); return kSuccess; }
CUresult ok_release(CUdevice) { return kSuccess; }
CUresult ok_set(CUcontext) { return kSuccess; }
CUresult ok_sync() { return kSuccess; }
CUresult ok_stream_create(CUstream* s, unsigned int) { *s = reinterpret_cast<CUstream>(0x2); return kSuccess; }
CUresult ok_stream(CUstream) { return kSuccess; }
CUresult host_alloc(void** p, size_t n, unsigned int) { *p = std::malloc(n); return *p != nullptr ? kSuccess : 2; }
CUresult free_host(void* p) { std::free(p); return kSuccess; }
// Synchronous copies: the fake's streams are always idle.
CUresult dtoh(void* dst, CUdeviceptr src, size_t n, CUstream) { std::memcpy(dst, reinterpret_cast<const void*>(src), n); return kSuccess; }
CUresult htod(CUdeviceptr dst, const void* src, size_t n, CUstream) { std::memcpy(reinterpret_cast<void*>(dst), src, n); return kSuccess; }

CopyCalls fake_calls() {
  CopyCalls c;
  c.primary_ctx_retain = ok_retain, c.primary_ctx_release = ok_release, c.ctx_set_current = ok_set;
  c.ctx_synchronize = ok_sync, c.stream_create = ok_stream_create, c.stream_destroy = ok_stream;
  c.stream_synchronize = ok_stream, c.host_alloc = host_alloc, c.free_host = free_host;
  c.dtoh_async = dtoh, c.htod_async = htod;
  return c;
}

TEST(DeviceImage, SavedRegionsLoadBackByteForByteAndTheCopyThreadsRunAtTheNiceValueAskedTheCallerAtItsOwn) {
  const fs::path dir = fs::temp_directory_path() / ("pos-di-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Two "allocations" of 4 MiB and 6 MiB, 4 KiB-aligned, with a pattern.
  const size_t a = 4u << 20, b = 6u << 20;
  std::vector<unsigned char>* mem = new std::vector<unsigned char>(a + b + 8192);
  const uint64_t base = (reinterpret_cast<uint64_t>(mem->data()) + 4095) / 4096 * 4096;
  for (size_t i = 0; i < a + b; ++i) reinterpret_cast<unsigned char*>(base)[i] = static_cast<unsigned char>(i * 31 + 7);
  std::vector<SavedRegion> regions = {SavedRegion{0, base, a, 0, {}, {}}, SavedRegion{0, base + a, b, 0, {}, {}}};
  const int mine = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  std::mutex mu;
  std::set<int> seen;  // the nice values the progress callback, on the copy threads, found
  CopyOptions o;
  o.threads = 4;
  o.chunk = 1u << 20;
  o.nice = 7;
  o.progress = [&](uint64_t, uint64_t) {
    std::lock_guard<std::mutex> lk(mu);
    seen.insert(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())));
  };
  auto saved = save_regions(fake_calls(), 0, regions, dir.string(), o);
  ASSERT_TRUE(saved.ok()) << saved.status().message();
  EXPECT_EQ(saved->bytes, a + b);
  // An absolute value; one below the process's own takes root (else the thread stays as it was).
  EXPECT_EQ(seen, std::set<int>{mine <= 7 || ::geteuid() == 0 ? 7 : mine});
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())), mine);
  // The bytes change, and loading the image puts the saved ones back.
  std::memset(reinterpret_cast<void*>(base), 0, a + b);
  CopyOptions lo;
  lo.chunk = 1u << 20;
  auto loaded = load_regions(fake_calls(), 0, regions, dir.string(), lo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  bool same = true;
  for (size_t i = 0; i < a + b && same; ++i) same = reinterpret_cast<unsigned char*>(base)[i] == static_cast<unsigned char>(i * 31 + 7);
  EXPECT_TRUE(same);
  delete mem;
  fs::remove_all(dir);
}

}  // namespace
