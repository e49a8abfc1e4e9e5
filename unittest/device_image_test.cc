// device_image_test.cc — save_regions / load_regions (remoting/driver/device_image.h) against a
// fake of the driver's copy calls whose "device memory" is this process's memory: a round trip of
// bytes, the copy threads' CPU priority (CopyOptions::nice, ::idle) while the caller's stays as it
// was, and chunks written in pieces (CopyOptions::piece).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

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

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(DeviceImage, ChunksWrittenInPiecesUnderSchedIdleGiveTheSameImageAndAChunkFoundUnchangedIsPunchedOut) {
  const fs::path root = fs::temp_directory_path() / ("pos-dp-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path whole = root / "whole", pieces = root / "pieces", inc = root / "inc";
  for (const fs::path& d : {whole, pieces, inc}) fs::create_directories(d);
  const size_t a = 3u << 20, b = (2u << 20) + 8192;  // the last chunk of each region is short
  std::vector<unsigned char>* mem = new std::vector<unsigned char>(a + b + 8192);
  const uint64_t base = (reinterpret_cast<uint64_t>(mem->data()) + 4095) / 4096 * 4096;
  for (size_t i = 0; i < a + b; ++i) reinterpret_cast<unsigned char*>(base)[i] = static_cast<unsigned char>(i * 13 + (i >> 12));
  const std::vector<SavedRegion> regions = {SavedRegion{0, base, a, 0, {}, {}}, SavedRegion{0, base + a, b, 0, {}, {}}};
  CopyOptions o;
  o.threads = 3;
  o.chunk = 1u << 20;
  ASSERT_TRUE(save_regions(fake_calls(), 0, regions, whole.string(), o).ok());
  std::mutex mu;
  std::set<int> policies;  // what the copy threads ran under
  o.piece = 64u << 10;
  o.idle = true;
  o.progress = [&](uint64_t, uint64_t) {
    std::lock_guard<std::mutex> lk(mu);
    policies.insert(::sched_getscheduler(0));
  };
  auto saved = save_regions(fake_calls(), 0, regions, pieces.string(), o);
  ASSERT_TRUE(saved.ok()) << saved.status().message();
  EXPECT_EQ(policies, std::set<int>{SCHED_IDLE});
  EXPECT_EQ(::sched_getscheduler(0), SCHED_OTHER);  // the caller's own thread untouched
  // The same table (checksums included) and the same memory files as whole chunks give.
  EXPECT_EQ(file_bytes(whole / "regions"), file_bytes(pieces / "regions"));
  for (uint32_t f = 0; f < 3; ++f)
    EXPECT_EQ(file_bytes(whole / memory_file_name(f)), file_bytes(pieces / memory_file_name(f))) << f;
  // Incremental, in pieces: chunk 1 of the first region is "in the previous image": it is marked
  // same and its bytes, written before that was known, are gone from the file (a hole reads zeros).
  o.progress = nullptr;
  const uint64_t first = base;
  o.unchanged = [first](uint64_t addr, uint64_t, size_t index, uint32_t, const void*, uint64_t) {
    return addr == first && index == 1;
  };
  auto inc_saved = save_regions(fake_calls(), 0, regions, inc.string(), o);
  ASSERT_TRUE(inc_saved.ok()) << inc_saved.status().message();
  EXPECT_EQ(inc_saved->same_bytes, 1u << 20);
  auto table = pos::ckpt::read_region_table(inc.string());
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->regions.size(), 2u);
  ASSERT_EQ(table->regions[0].same.size(), 3u);
  EXPECT_TRUE(table->regions[0].same[1]);
  EXPECT_FALSE(table->regions[0].same[0]);
  bool punched = false, others_kept = true;
  for (const ChunkPlace& k : chunk_places(*table)) {
    const std::string got = file_bytes(inc / memory_file_name(k.file)).substr(k.file_off, k.n);
    const std::string want(reinterpret_cast<const char*>(table->regions[k.region].addr + k.off), k.n);
    if (k.region == 0 && k.off == (1u << 20)) punched = got == std::string(k.n, '\0');
    else others_kept = others_kept && got == want;
  }
  EXPECT_TRUE(punched);
  EXPECT_TRUE(others_kept);
  // A piece that does not divide the chunk is refused before anything is written.
  const fs::path bad = root / "bad";
  fs::create_directories(bad);
  o.piece = 12288;
  auto refused = save_regions(fake_calls(), 0, regions, bad.string(), o);
  EXPECT_EQ(refused.status().code(), pos::Code::kInvalidArgument);
  EXPECT_TRUE(fs::is_empty(bad));
  delete mem;
  fs::remove_all(root);
}

}  // namespace
