// device_image.cc — saving and loading placed device memory: chunks handed to copy threads, each
// copying through its own page-locked buffer and stream, checksummed, written or read in place.
#include "remoting/driver/device_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "ckpt/crc32c.h"
#include "remoting/common/unique_fd.h"

namespace pos::driver {

namespace {

std::string cu_error(const char* what, CUresult rc) { return std::string(what) + " failed: CUDA driver error " + std::to_string(rc); }

uint64_t chunks_of(uint64_t size, uint64_t chunk) { return (size + chunk - 1) / chunk; }

struct Chunk {
  size_t region;
  uint64_t off, n;
};

std::vector<Chunk> chunk_list(const std::vector<SavedRegion>& regions, uint64_t chunk) {
  std::vector<Chunk> out;
  for (size_t i = 0; i < regions.size(); ++i)
    for (uint64_t off = 0; off < regions[i].size; off += chunk)
      out.push_back(Chunk{i, off, std::min(chunk, regions[i].size - off)});
  return out;
}

// The copy threads' common frame: a primary context made current on each, a stream and a staging
// buffer per thread, the first error kept, progress serialized.
class CopyPool {
 public:
  CopyPool(const CopyCalls& c, int dev, const CopyOptions& o, uint64_t total) : c_(c), dev_(dev), o_(o), total_(total) {}

  template <typename Body>  // Status body(void* staging, CUstream s, const Chunk& k)
  Status run(const std::vector<Chunk>& chunks, Body body) {
    if (!c_.complete()) return Status::Unsupported("the driver lacks a call the device image needs");
    CUcontext ctx = nullptr;
    if (const CUresult rc = c_.primary_ctx_retain(&ctx, dev_); rc != kSuccess)
      return Status::Unavailable(cu_error("cuDevicePrimaryCtxRetain", rc));
    const int threads = std::max(1, std::min<int>(o_.threads, static_cast<int>(std::max<size_t>(chunks.size(), 1))));
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        void* buf = nullptr;
        CUstream s = nullptr;
        CUresult rc = c_.ctx_set_current(ctx);
        if (rc != kSuccess) return fail(Status::Unavailable(cu_error("cuCtxSetCurrent", rc)));
        if ((rc = c_.stream_create(&s, 1 /* non-blocking */)) != kSuccess)
          return fail(Status::Unavailable(cu_error("cuStreamCreate", rc)));
        if ((rc = c_.host_alloc(&buf, o_.chunk, 0)) != kSuccess) {
          (void)c_.stream_destroy(s);
          return fail(Status(Code::kOutOfMemory, 0, cu_error("cuMemHostAlloc (staging)", rc)));
        }
        while (!failed_.load(std::memory_order_relaxed)) {
          const size_t i = next.fetch_add(1);
          if (i >= chunks.size()) break;
          if (Status st = body(buf, s, chunks[i]); !st.ok()) {
            fail(std::move(st));
            break;
          }
          done(chunks[i].n);
        }
        (void)c_.free_host(buf);
        (void)c_.stream_destroy(s);
        (void)c_.ctx_set_current(nullptr);
      });
    for (std::thread& t : pool) t.join();
    (void)c_.primary_ctx_release(dev_);
    return first_;
  }

 private:
  void fail(Status st) {
    std::lock_guard<std::mutex> lk(mu_);
    if (first_.ok()) first_ = std::move(st);
    failed_.store(true);
  }
  void done(uint64_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    done_ += n;
    if (o_.progress) o_.progress(done_, total_);
  }

  const CopyCalls& c_;
  const int dev_;
  const CopyOptions& o_;
  const uint64_t total_;
  std::mutex mu_;
  Status first_;
  uint64_t done_ = 0;
  std::atomic<bool> failed_{false};
};

Status write_all_at(int fd, const void* p, uint64_t n, uint64_t off) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, c, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Unavailable(std::string("cannot write memory.bin: ") + std::strerror(w < 0 ? errno : ENOSPC));
    c += w, n -= static_cast<uint64_t>(w), off += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status read_all_at(int fd, void* p, uint64_t n, uint64_t off) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Unavailable(std::string("cannot read memory.bin: ") + std::strerror(errno));
    if (r == 0) return Status::Corrupt("memory.bin is shorter than its region table says");
    c += r, n -= static_cast<uint64_t>(r), off += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

StatusOr<CopyReport> save_regions(const CopyCalls& calls, int dev, const std::vector<SavedRegion>& regions,
                                  const std::string& dir, const CopyOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.chunk == 0 || o.chunk % 4096 != 0) return Status::InvalidArgument("the chunk size must be a multiple of 4096");
  RegionTable table;
  table.chunk = o.chunk;
  uint64_t offset = 0;
  for (const SavedRegion& r : regions) {
    SavedRegion s{r.dev, r.addr, r.size, offset, std::vector<uint32_t>(chunks_of(r.size, o.chunk))};
    offset += r.size;
    table.regions.push_back(std::move(s));
  }
  const std::string bin = dir + "/memory.bin";
  UniqueFd f(::open(bin.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!f) return Status::Unavailable("cannot create " + bin + ": " + std::strerror(errno));
  if (::ftruncate(f.get(), static_cast<off_t>(offset)) != 0)
    return Status::Unavailable("cannot size " + bin + ": " + std::strerror(errno));
  const std::vector<Chunk> chunks = chunk_list(table.regions, o.chunk);
  CopyPool pool(calls, dev, o, offset);
  Status st = pool.run(chunks, [&](void* buf, CUstream s, const Chunk& k) -> Status {
    SavedRegion& r = table.regions[k.region];
    if (const CUresult rc = calls.dtoh_async(buf, r.addr + k.off, k.n, s); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemcpyDtoHAsync", rc));
    if (const CUresult rc = calls.stream_synchronize(s); rc != kSuccess)
      return Status::Unavailable(cu_error("cuStreamSynchronize", rc));
    r.crcs[k.off / o.chunk] = ckpt::crc32c(buf, k.n);  // each thread its own chunks: no two write one slot
    return write_all_at(f.get(), buf, k.n, r.offset + k.off);
  });
  if (st.ok()) {
    const std::string text = region_table_text(table), tmp = dir + "/regions.tmp";
    UniqueFd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!t || ::write(t.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::rename(tmp.c_str(), (dir + "/regions").c_str()) != 0)
      st = Status::Unavailable("cannot write " + dir + "/regions: " + std::strerror(errno));
  }
  if (!st.ok()) {
    ::unlink(bin.c_str());
    ::unlink((dir + "/regions.tmp").c_str());
    return st;
  }
  return CopyReport{offset, regions.size(), since(t0)};
}

StatusOr<CopyReport> load_regions(const CopyCalls& calls, int dev, const std::vector<SavedRegion>& expected,
                                  const std::string& dir, const CopyOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto table = read_region_table(dir);
  if (!table.ok()) return table.status();
  if (table->regions.size() != expected.size())
    return Status::Corrupt(dir + " holds " + std::to_string(table->regions.size()) + " regions; the job has " +
                           std::to_string(expected.size()) + " allocations");
  for (size_t i = 0; i < expected.size(); ++i) {
    const SavedRegion& a = table->regions[i];
    const SavedRegion& b = expected[i];
    if (a.addr != b.addr || a.size != b.size || a.dev != b.dev)
      return Status::Corrupt(dir + " does not match the job's allocations (region " + std::to_string(i) + ")");
  }
  const std::string bin = dir + "/memory.bin";
  UniqueFd f(::open(bin.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!f) return Status::Unavailable("cannot open " + bin + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != table->bytes())
    return Status::Corrupt(bin + " is not the size its region table says");
  const uint64_t chunk = table->chunk;
  CopyOptions lo = o;
  lo.chunk = chunk;  // the staging buffers hold the image's chunks
  const std::vector<Chunk> chunks = chunk_list(table->regions, chunk);
  CopyPool pool(calls, dev, lo, table->bytes());
  Status s = pool.run(chunks, [&](void* buf, CUstream stream, const Chunk& k) -> Status {
    const SavedRegion& r = table->regions[k.region];
    POS_RETURN_IF_ERROR(read_all_at(f.get(), buf, k.n, r.offset + k.off));
    if (ckpt::crc32c(buf, k.n) != r.crcs[k.off / chunk])
      return Status::Corrupt(bin + ": the chunk at " + std::to_string(r.offset + k.off) + " fails its checksum");
    if (const CUresult rc = calls.htod_async(r.addr + k.off, buf, k.n, stream); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemcpyHtoDAsync", rc));
    if (const CUresult rc = calls.stream_synchronize(stream); rc != kSuccess)
      return Status::Unavailable(cu_error("cuStreamSynchronize", rc));
    return Status::Ok();
  });
  if (!s.ok()) return s;
  return CopyReport{table->bytes(), table->regions.size(), since(t0)};
}

}  // namespace pos::driver
