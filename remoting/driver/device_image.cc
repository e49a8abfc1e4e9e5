// device_image.cc — saving and loading placed device memory: chunks handed to copy threads, each
// copying through its own page-locked buffer and stream, checksummed, written or read in place.
#include "remoting/driver/device_image.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "ckpt/crc32c.h"
#include "remoting/common/unique_fd.h"

namespace pos::driver {

namespace {

std::string cu_error(const char* what, CUresult rc) { return std::string(what) + " failed: CUDA driver error " + std::to_string(rc); }

uint64_t device_address(const CopyOptions& o, uint64_t addr) { return o.address ? o.address(addr) : addr; }

uint64_t chunks_of(uint64_t size, uint64_t chunk) { return (size + chunk - 1) / chunk; }

// The copy threads' common frame: one thread per memory file, each with the primary context
// current, its own stream and two page-locked staging buffers (one filling from the device while
// the other is checksummed and written); the first error kept, progress serialized.
class CopyPool {
 public:
  CopyPool(const CopyCalls& c, int dev, const CopyOptions& o, uint64_t total) : c_(c), dev_(dev), o_(o), total_(total) {}

  struct Lane {
    uint32_t file;
    void* buf[2];
    CUstream stream;
  };
  // body(Lane&) runs once per file, on its own thread; it calls done(n) as bytes complete and
  // stops early when failed().
  template <typename Body>
  Status run(uint32_t files, uint64_t buffer_bytes, Body body) {
    if (!c_.complete()) return Status::Unsupported("the driver lacks a call the device image needs");
    CUcontext ctx = nullptr;
    if (const CUresult rc = c_.primary_ctx_retain(&ctx, dev_); rc != kSuccess)
      return Status::Unavailable(cu_error("cuDevicePrimaryCtxRetain", rc));
    std::vector<std::thread> pool;
    for (uint32_t f = 0; f < files; ++f)
      pool.emplace_back([&, f] {
        Lane lane{f, {nullptr, nullptr}, nullptr};
        // Lower this thread only (Linux nice is per thread); a refusal leaves it as it was.
        if (o_.nice != 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), o_.nice);
        if (o_.idle) {
          const sched_param none{};
          (void)::sched_setscheduler(static_cast<pid_t>(::gettid()), SCHED_IDLE, &none);
        }
        CUresult rc = c_.ctx_set_current(ctx);
        if (rc != kSuccess) return fail(Status::Unavailable(cu_error("cuCtxSetCurrent", rc)));
        if ((rc = c_.stream_create(&lane.stream, 1 /* non-blocking */)) != kSuccess)
          return fail(Status::Unavailable(cu_error("cuStreamCreate", rc)));
        for (void*& b : lane.buf)
          if (rc == kSuccess && (rc = c_.host_alloc(&b, buffer_bytes, 0)) != kSuccess) b = nullptr;
        if (rc != kSuccess) fail(Status(Code::kOutOfMemory, 0, cu_error("cuMemHostAlloc (staging)", rc)));
        else if (Status st = body(lane); !st.ok()) fail(std::move(st));
        (void)c_.stream_synchronize(lane.stream);  // nothing may still copy into a buffer being freed
        for (void* b : lane.buf)
          if (b != nullptr) (void)c_.free_host(b);
        (void)c_.stream_destroy(lane.stream);
        (void)c_.ctx_set_current(nullptr);
      });
    for (std::thread& t : pool) t.join();
    (void)c_.primary_ctx_release(dev_);
    return first_;
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void done(uint64_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    done_ += n;
    if (o_.progress) o_.progress(done_, total_);
  }

 private:
  void fail(Status st) {
    std::lock_guard<std::mutex> lk(mu_);
    if (first_.ok()) first_ = std::move(st);
    failed_.store(true);
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
    if (w <= 0) return Status::Unavailable(std::string("cannot write a memory file: ") + std::strerror(w < 0 ? errno : ENOSPC));
    c += w, n -= static_cast<uint64_t>(w), off += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status read_all_at(int fd, void* p, uint64_t n, uint64_t off) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Unavailable(std::string("cannot read a memory file: ") + std::strerror(errno));
    if (r == 0) return Status::Corrupt("a memory file is shorter than its region table says");
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
  if (o.piece % 4096 != 0 || (o.piece != 0 && o.chunk % o.piece != 0))
    return Status::InvalidArgument("the write piece must be a multiple of 4096 that divides the chunk size");
  const uint64_t piece = o.piece < o.chunk ? o.piece : 0;
  RegionTable table;
  table.chunk = o.chunk;
  table.inherited = o.inherited;
  std::sort(table.inherited.begin(), table.inherited.end(),
            [](const SavedRegion& a, const SavedRegion& b) { return a.addr < b.addr; });
  for (SavedRegion& r : table.inherited) r.offset = 0, r.crcs.clear();
  uint64_t offset = 0, nchunks = 0;
  for (const SavedRegion& r : regions) {
    SavedRegion s{r.dev, r.addr, r.size, offset, std::vector<uint32_t>(chunks_of(r.size, o.chunk)), {}};
    if (o.unchanged) s.same.assign(s.crcs.size(), false);
    offset += r.size;
    nchunks += s.crcs.size();
    table.regions.push_back(std::move(s));
  }
  table.files = static_cast<uint32_t>(std::clamp<uint64_t>(std::min<uint64_t>(o.threads, nchunks), 1, RegionTable::kMaxFiles));
  const std::vector<ChunkPlace> places = chunk_places(table);
  std::vector<UniqueFd> fds;
  const auto remove_all = [&] {
    for (uint32_t f = 0; f < table.files; ++f) ::unlink((dir + "/" + memory_file_name(f)).c_str());
    ::unlink((dir + "/regions.tmp").c_str());
  };
  for (uint32_t f = 0; f < table.files; ++f) {
    const std::string path = dir + "/" + memory_file_name(f);
    fds.emplace_back(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fds.back()) {
      const int e = errno;
      fds.pop_back();  // not ours: not removed below
      for (uint32_t g = 0; g < f; ++g) ::unlink((dir + "/" + memory_file_name(g)).c_str());
      return Status::Unavailable("cannot create " + path + ": " + std::strerror(e));
    }
  }
  CopyPool pool(calls, dev, o, offset);
  std::vector<char> same_chunk(places.size(), 0);  // per chunk (places order): left to the previous image
  Status st = pool.run(table.files, o.chunk, [&](CopyPool::Lane& lane) -> Status {
    // This lane's chunks: copy the next one into one buffer while the last one is checksummed and
    // written from the other (the stream holds one copy at a time).
    const ChunkPlace* held = nullptr;  // copied into buf[side ^ 1], not yet written
    int side = 0;
    const auto write_held = [&]() -> Status {
      SavedRegion& r = table.regions[held->region];
      const void* b = lane.buf[side ^ 1];
      const size_t index = held->off / o.chunk;
      const int fd = fds[lane.file].get();
      bool written = false;
      if (piece > 0 && held->n > piece) {
        // Each piece checksummed, then written while it is still cached.
        uint32_t crc = 0;
        for (uint64_t at = 0; at < held->n; at += piece) {
          const uint64_t n = std::min(piece, held->n - at);
          crc = ckpt::crc32c(static_cast<const char*>(b) + at, n, crc);
          POS_RETURN_IF_ERROR(write_all_at(fd, static_cast<const char*>(b) + at, n, held->file_off + at));
        }
        r.crcs[index] = crc;
        written = true;
      } else {
        r.crcs[index] = ckpt::crc32c(b, held->n);  // one lane per chunk: no two write one slot
      }
      // A chunk the previous image holds with the same checksum is left there (a hole here).
      if (o.unchanged && o.unchanged(r.addr, r.size, index, r.crcs[index], b, held->n)) {
        same_chunk[static_cast<size_t>(held - places.data())] = 1;  // a byte per chunk: lanes never share one
        // Written already: given back (a file system without holes keeps bytes no reader takes).
        if (written)
          (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(held->file_off),
                            static_cast<off_t>(held->n));
        pool.done(held->n);
        return Status::Ok();
      }
      if (!written) POS_RETURN_IF_ERROR(write_all_at(fd, b, held->n, held->file_off));
      pool.done(held->n);
      return Status::Ok();
    };
    for (size_t i = lane.file; i < places.size() && !pool.failed(); i += table.files) {
      const ChunkPlace& k = places[i];
      if (const CUresult rc = calls.dtoh_async(lane.buf[side], device_address(o, table.regions[k.region].addr) + k.off, k.n, lane.stream);
          rc != kSuccess)
        return Status::Unavailable(cu_error("cuMemcpyDtoHAsync", rc));
      if (held != nullptr) POS_RETURN_IF_ERROR(write_held());
      if (const CUresult rc = calls.stream_synchronize(lane.stream); rc != kSuccess)
        return Status::Unavailable(cu_error("cuStreamSynchronize", rc));
      held = &k;
      side ^= 1;
    }
    return held != nullptr && !pool.failed() ? write_held() : Status::Ok();
  });
  uint64_t same_bytes = 0;
  for (size_t i = 0; i < places.size(); ++i)
    if (same_chunk[i] != 0) {
      table.regions[places[i].region].same[places[i].off / o.chunk] = true;
      same_bytes += places[i].n;
    }
  // Chunks left out are holes; a file whose last chunks were left out still has its full size.
  const std::vector<uint64_t> sizes = file_sizes(table);
  for (uint32_t f = 0; st.ok() && f < table.files; ++f)
    if (::ftruncate(fds[f].get(), static_cast<off_t>(sizes[f])) != 0)
      st = Status::Unavailable("cannot size " + dir + "/" + memory_file_name(f) + ": " + std::strerror(errno));
  if (st.ok()) {
    const std::string text = region_table_text(table), tmp = dir + "/regions.tmp";
    UniqueFd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!t || ::write(t.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::rename(tmp.c_str(), (dir + "/regions").c_str()) != 0)
      st = Status::Unavailable("cannot write " + dir + "/regions: " + std::strerror(errno));
  }
  if (!st.ok()) {
    remove_all();
    return st;
  }
  return CopyReport{offset, regions.size(), same_bytes, since(t0)};
}

namespace {

// The chunks of one image marked in `which` (per chunk, in chunk_places order), loaded, each
// checksum checked first.
Status load_stored(const CopyCalls& calls, int dev, const RegionTable& table, const std::vector<char>& which,
                   const std::string& dir, const CopyOptions& o) {
  const std::vector<ChunkPlace> all = chunk_places(table);
  std::vector<ChunkPlace> places;
  uint64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (which[i] != 0) {
      places.push_back(all[i]);
      total += all[i].n;
    }
  if (places.empty()) return Status::Ok();
  const std::vector<uint64_t> sizes = file_sizes(table);
  std::vector<UniqueFd> fds;
  for (uint32_t f = 0; f < table.files; ++f) {
    const std::string path = dir + "/" + memory_file_name(f);
    fds.emplace_back(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat st {};
    if (!fds.back()) return Status::Unavailable("cannot open " + path + ": " + std::strerror(errno));
    if (::fstat(fds.back().get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != sizes[f])
      return Status::Corrupt(path + " is not the size its region table says");
  }
  const uint64_t chunk = table.chunk;
  CopyPool pool(calls, dev, o, total);
  return pool.run(table.files, chunk, [&](CopyPool::Lane& lane) -> Status {
    size_t mine = 0;
    for (size_t i = 0; i < places.size() && !pool.failed(); ++i) {
      const ChunkPlace& k = places[i];
      if (k.file != lane.file) continue;
      const SavedRegion& r = table.regions[k.region];
      // Read into the buffer no copy uses (the one before last finished at the last sync) while the
      // last chunk still copies to the device from the other.
      void* b = lane.buf[mine++ % 2];
      POS_RETURN_IF_ERROR(read_all_at(fds[lane.file].get(), b, k.n, k.file_off));
      if (ckpt::crc32c(b, k.n) != r.crcs[k.off / chunk])
        return Status::Corrupt(dir + "/" + memory_file_name(lane.file) + ": the chunk at " + std::to_string(k.file_off) +
                               " fails its checksum");
      if (const CUresult rc = calls.stream_synchronize(lane.stream); rc != kSuccess)
        return Status::Unavailable(cu_error("cuStreamSynchronize", rc));
      if (const CUresult rc = calls.htod_async(device_address(o, r.addr) + k.off, b, k.n, lane.stream); rc != kSuccess)
        return Status::Unavailable(cu_error("cuMemcpyHtoDAsync", rc));
      pool.done(k.n);
    }
    if (const CUresult rc = calls.stream_synchronize(lane.stream); rc != kSuccess)
      return Status::Unavailable(cu_error("cuStreamSynchronize", rc));
    return Status::Ok();
  });
}

// Where each stored region's chunks start in chunk_places order.
std::vector<size_t> first_chunks(const RegionTable& t) {
  std::vector<size_t> out;
  size_t n = 0;
  for (const SavedRegion& r : t.regions) {
    out.push_back(n);
    n += chunks_of(r.size, t.chunk);
  }
  return out;
}

}  // namespace

StatusOr<CopyReport> load_regions(const CopyCalls& calls, int dev, const std::vector<SavedRegion>& expected,
                                  const std::string& dir, const CopyOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto table = read_region_table(dir);
  if (!table.ok()) return table.status();
  const std::vector<SavedRegion> all = table->allocations();
  if (all.size() != expected.size())
    return Status::Corrupt(dir + " holds " + std::to_string(all.size()) + " regions; the job has " +
                           std::to_string(expected.size()) + " allocations");
  for (size_t i = 0; i < expected.size(); ++i) {
    const SavedRegion& a = all[i];
    const SavedRegion& b = expected[i];
    if (a.addr != b.addr || a.size != b.size || a.dev != b.dev)
      return Status::Corrupt(dir + " does not match the job's allocations (region " + std::to_string(i) + ")");
  }
  // Every chunk is loaded from the nearest image that stores it: this one's own, then, for chunks
  // it leaves to the previous image and regions it inherits, the previous images in turn.
  struct Need {
    int dev;
    uint64_t addr, size;
    size_t index;
    bool check;  // the child listed its checksum (a `same` chunk): the parent's must match
    uint32_t crc;
  };
  std::vector<std::pair<std::string, RegionTable>> images{{dir, *table}};
  std::vector<std::vector<char>> which;
  std::vector<Need> pending;
  {
    std::vector<char> w(chunk_places(*table).size(), 0);
    const std::vector<size_t> first = first_chunks(*table);
    for (size_t r = 0; r < table->regions.size(); ++r) {
      const SavedRegion& g = table->regions[r];
      for (size_t c = 0; c < g.crcs.size(); ++c) {
        if (g.chunk_same(c)) pending.push_back(Need{g.dev, g.addr, g.size, c, true, g.crcs[c]});
        else w[first[r] + c] = 1;
      }
    }
    for (const SavedRegion& g : table->inherited)
      for (size_t c = 0; c < chunks_of(g.size, table->chunk); ++c) pending.push_back(Need{g.dev, g.addr, g.size, c, false, 0});
    which.push_back(std::move(w));
  }
  for (size_t k = 0; k < o.parents.size() && !pending.empty(); ++k) {
    auto parent = read_region_table(o.parents[k]);
    if (!parent.ok()) return parent.status().with_context("the previous image");
    if (parent->chunk != table->chunk)
      return Status::Corrupt("the previous image " + o.parents[k] + " has another chunk size than " + dir);
    std::vector<char> w(chunk_places(*parent).size(), 0);
    const std::vector<size_t> first = first_chunks(*parent);
    std::vector<Need> still;
    for (const Need& n : pending) {
      const auto same_region = [&](const SavedRegion& r) { return r.addr == n.addr && r.size == n.size && r.dev == n.dev; };
      const auto stored = std::find_if(parent->regions.begin(), parent->regions.end(), same_region);
      if (stored != parent->regions.end()) {
        if (stored->chunk_same(n.index)) {
          still.push_back(n);
          continue;
        }
        if (n.check && stored->crcs[n.index] != n.crc)
          return Status::Corrupt("the previous image " + o.parents[k] + " holds another chunk than " + dir +
                                 " left to it (its checksum differs)");
        w[first[static_cast<size_t>(stored - parent->regions.begin())] + n.index] = 1;
      } else if (std::any_of(parent->inherited.begin(), parent->inherited.end(), same_region)) {
        still.push_back(n);
      } else {
        return Status::Corrupt("the previous image " + o.parents[k] + " does not hold the allocation at " +
                               std::to_string(n.addr) + " that " + dir + " inherits");
      }
    }
    images.emplace_back(o.parents[k], std::move(*parent));
    which.push_back(std::move(w));
    pending = std::move(still);
  }
  if (!pending.empty())
    return Status::Corrupt(dir + " leaves " + std::to_string(pending.size()) +
                           " chunk(s) to previous images that do not hold them (is the image chain whole?)");
  uint64_t total = 0, done_before = 0;
  std::vector<uint64_t> per(images.size(), 0);
  for (size_t k = 0; k < images.size(); ++k) {
    const std::vector<ChunkPlace> places = chunk_places(images[k].second);
    for (size_t i = 0; i < places.size(); ++i)
      if (which[k][i] != 0) per[k] += places[i].n;
    total += per[k];
  }
  for (size_t k = 0; k < images.size(); ++k) {
    CopyOptions ok = o;  // progress over the whole chain
    if (o.progress) ok.progress = [&, base = done_before](uint64_t d, uint64_t) { o.progress(base + d, total); };
    POS_RETURN_IF_ERROR(load_stored(calls, dev, images[k].second, which[k], images[k].first, ok));
    done_before += per[k];
  }
  return CopyReport{total, expected.size(), 0, since(t0)};
}

StatusOr<PreviousChunks> PreviousChunks::open(const std::vector<std::string>& dirs) {
  PreviousChunks p;
  // A load goes up the chain only through images that name the region (stored or inherited): a
  // chunk further up counts only while every nearer image has its region.
  std::set<std::pair<uint64_t, uint64_t>> reach;
  uint64_t chunk = 0;
  for (size_t k = 0; k < dirs.size(); ++k) {
    auto t = read_region_table(dirs[k]);
    if (!t.ok()) return t.status().with_context("the previous image");
    if (k == 0) {
      chunk = t->chunk;
      for (const SavedRegion& r : t->allocations()) reach.emplace(r.addr, r.size);
    }
    if (t->chunk != chunk) break;  // a load would not go on past it either
    std::vector<UniqueFd> files;
    for (uint32_t f = 0; f < t->files; ++f) {
      files.emplace_back(::open((dirs[k] + "/" + memory_file_name(f)).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (!files.back())
        return Status::Unavailable("cannot open " + dirs[k] + "/" + memory_file_name(f) + ": " + std::strerror(errno));
    }
    p.fds_.push_back(std::move(files));
    for (const ChunkPlace& c : chunk_places(*t)) {
      const SavedRegion& r = t->regions[c.region];
      const size_t index = c.off / t->chunk;
      if (r.chunk_same(index) || reach.count({r.addr, r.size}) == 0) continue;  // further up, or out of reach
      p.where_.emplace(Key{r.addr, r.size, index}, Place{k, c.file, c.file_off, c.n, r.crcs[index]});  // nearest wins
    }
    std::set<std::pair<uint64_t, uint64_t>> next;
    for (const SavedRegion& r : t->allocations())
      if (reach.count({r.addr, r.size}) != 0) next.emplace(r.addr, r.size);
    reach = std::move(next);
  }
  return p;
}

bool PreviousChunks::unchanged(uint64_t addr, uint64_t size, size_t index, uint32_t crc, const void* bytes,
                               uint64_t n) const {
  auto it = where_.find(Key{addr, size, index});
  if (it == where_.end() || it->second.crc != crc || it->second.n != n) return false;
  thread_local std::vector<char> buf;
  buf.resize(n);
  if (!read_all_at(fds_[it->second.image][it->second.file].get(), buf.data(), n, it->second.off).ok()) return false;
  return std::memcmp(buf.data(), bytes, n) == 0;
}

void remove_saved(const std::string& dir) {
  ::unlink((dir + "/regions").c_str());
  ::unlink((dir + "/regions.tmp").c_str());
  for (uint32_t f = 0; f < RegionTable::kMaxFiles; ++f) ::unlink((dir + "/" + memory_file_name(f)).c_str());
}

}  // namespace pos::driver
