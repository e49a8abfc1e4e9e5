// placement.cc — fixed device ranges, first-fit within them, VMM mappings per allocation.
#include "remoting/driver/placement.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "pos/base/text.h"

namespace pos::driver {

namespace {
constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorNotPermitted = 800;
constexpr int kPosixFd = 1;  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

// A kept descriptor away from the low numbers the job's own files take (select() cannot see past
// 1023), close-on-exec; the original closed. -1 when none can be made.
int keep_fd(int fd) {
  rlimit rl{};
  int low = 256;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 512)
    low = static_cast<int>(rl.rlim_cur / 2);
  int kept = ::fcntl(fd, F_DUPFD_CLOEXEC, low);
  if (kept < 0) kept = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  ::close(fd);
  return kept;
}

CUmemAllocationProp device_prop(int dev) {
  CUmemAllocationProp p{};
  p.type = 1;  // pinned device memory
  p.location.type = 1;
  p.location.id = dev;
  return p;
}
}  // namespace

Placement::Placement(const VmmCalls& calls, uint64_t base, uint64_t span) : calls_(calls), base_(base), span_(span) {}

bool Placement::ready(int dev) {
  Range& r = ranges_[dev];
  if (r.tried) return r.ok;
  r.tried = true;
  const auto off = [&](const std::string& why) {
    if (stats_.error.empty()) stats_.error = "device " + std::to_string(dev) + ": " + why;
    return false;
  };
  if (!calls_.complete()) return off("the driver lacks a virtual memory call");
  const CUmemAllocationProp prop = device_prop(dev);
  size_t g = 0;
  if (calls_.granularity(&g, &prop, 0) != kSuccess || g == 0 || span_ % g != 0)
    return off("no allocation granularity");
  const uint64_t want = base_ + static_cast<uint64_t>(dev) * span_;
  CUdeviceptr got = 0;
  if (calls_.reserve(&got, span_, g, want, 0) != kSuccess) return off("cannot reserve its range");
  if (got != want) {
    (void)calls_.address_free(got, span_);
    return off("its range was reserved elsewhere than asked (the address is taken)");
  }
  r.ok = true;
  r.base = want;
  r.granule = g;
  r.free.emplace(want, span_);
  stats_.devices.push_back(dev);
  return true;
}

uint64_t Placement::take(Range& r, uint64_t size) {
  for (auto it = r.free.begin(); it != r.free.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t at = it->first, left = it->second - size;
    r.free.erase(it);
    if (left > 0) r.free.emplace(at + size, left);
    return at;
  }
  return 0;
}

void Placement::give(Range& r, uint64_t addr, uint64_t size) {
  auto next = r.free.lower_bound(addr);
  if (next != r.free.end() && addr + size == next->first) {  // joins the range after it
    size += next->second;
    next = r.free.erase(next);
  }
  if (next != r.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {  // joins the range before it
      prev->second += size;
      return;
    }
  }
  r.free.emplace(addr, size);
}

CUresult Placement::alloc(CUdeviceptr* out, size_t bytes, bool* placed) {
  *placed = false;
  if (out == nullptr) return kErrorInvalidValue;
  CUdevice dev = 0;
  if (calls_.ctx_get_device == nullptr) return kSuccess;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (unmapped_) return kErrorNotPermitted;  // a dump holds the job's memory: its calls wait at the gate first
  }
  if (const CUresult rc = calls_.ctx_get_device(&dev); rc != kSuccess) return rc;  // no context: as the driver says
  if (dev < 0 || dev >= kMaxDevices) return kSuccess;
  std::lock_guard<std::mutex> lk(mu_);
  if (!ready(dev)) return kSuccess;
  *placed = true;
  Range& r = ranges_[dev];
  if (bytes == 0) return kErrorInvalidValue;  // as cuMemAlloc answers a zero size
  const uint64_t size = (static_cast<uint64_t>(bytes) + r.granule - 1) / r.granule * r.granule;
  const uint64_t at = take(r, size);
  if (at == 0) return kErrorOutOfMemory;
  Block b{dev, size, 0};
  if (const CUresult rc = map_block(at, &b); rc != kSuccess) {  // out of device memory, typically
    give(r, at, size);
    return rc;
  }
  touch(b, ++marks_, epoch_.load(std::memory_order_relaxed));  // a new allocation counts as written now
  live_.emplace(at, b);
  ++stats_.placed;
  ++stats_.live;
  stats_.live_bytes += size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  *out = at;
  return kSuccess;
}

CUresult Placement::free(CUdeviceptr p, bool* ours) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(p);
  *ours = it != live_.end();
  if (!*ours) return kSuccess;
  if (unmapped_) return kErrorNotPermitted;
  const Block b = it->second;
  // Like cuMemFree, which synchronizes: no work still running may use the memory once it goes.
  CUresult rc = calls_.synchronize();
  if (rc == kSuccess) rc = calls_.unmap(p, b.size);
  if (rc != kSuccess) return rc;  // still mapped and ours: the caller may try again
  (void)calls_.release(b.handle);
  if (b.fd >= 0) ::close(b.fd);
  live_.erase(it);
  give(ranges_[b.dev], p, b.size);
  ++stats_.freed;
  --stats_.live;
  stats_.live_bytes -= b.size;
  return kSuccess;
}

CUresult Placement::map_block(uint64_t at, Block* b) {
  CUmemAllocationProp prop = device_prop(b->dev);
  CUmemGenericAllocationHandle h = 0;
  // Shareable when the driver can hand it off; a driver or device that refuses the handle type
  // still gets the memory, which a dump then copies.
  CUresult rc = 1;
  if (calls_.export_fd != nullptr && calls_.import_fd != nullptr) {
    prop.requestedHandleTypes = kPosixFd;
    rc = calls_.create(&h, b->size, &prop, 0);
    b->shareable = rc == kSuccess;
  }
  if (rc != kSuccess) {
    prop.requestedHandleTypes = 0;
    rc = calls_.create(&h, b->size, &prop, 0);
  }
  if (rc != kSuccess) return rc;
  rc = calls_.map(at, b->size, 0, h, 0);
  if (rc == kSuccess) {
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = 3;  // read-write
    rc = calls_.set_access(at, b->size, &access, 1);
    if (rc != kSuccess) (void)calls_.unmap(at, b->size);
  }
  if (rc != kSuccess) {
    (void)calls_.release(h);
    return rc;
  }
  b->handle = h;
  return kSuccess;
}

std::vector<Placement::Region> Placement::regions() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Region> out;
  out.reserve(live_.size());
  for (const auto& [at, b] : live_) out.push_back(Region{b.dev, at, b.size});
  return out;
}

void Placement::touch(Block& b, uint64_t now, uint64_t epoch) {
  b.written = true;
  if (b.epoch == epoch) return;
  b.prev_first = b.first;
  b.epoch = epoch;
  b.first = now;
}

void Placement::mark_written(const uint64_t* addrs, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t now = ++marks_, e = epoch_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    auto it = live_.upper_bound(addrs[i]);
    if (it == live_.begin()) continue;
    --it;
    if (addrs[i] - it->first < it->second.size) touch(it->second, now, e);
  }
}

void Placement::mark_range_written(uint64_t addr, uint64_t len) {
  if (len == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t now = ++marks_, e = epoch_.load(std::memory_order_relaxed);
  auto it = live_.upper_bound(addr);
  if (it != live_.begin()) --it;
  for (; it != live_.end() && it->first < addr + len; ++it)
    if (it->first + it->second.size > addr) touch(it->second, now, e);
}

void Placement::mark_all_written() {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t now = ++marks_, e = epoch_.load(std::memory_order_relaxed);
  for (auto& [at, b] : live_) touch(b, now, e);
}

std::vector<Placement::Region> Placement::cut() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Region> out;
  out.reserve(live_.size());
  const uint64_t e = epoch_.load(std::memory_order_relaxed);
  for (auto& [at, b] : live_) {
    // Not touched yet this epoch: by its first touch in its latest epoch; else after all of those,
    // by its first touch the epoch before.
    const uint64_t order = b.epoch != e ? b.first : (uint64_t{1} << 63) | b.prev_first;
    out.push_back(Region{b.dev, at, b.size, b.written, order});
    b.written = false;
  }
  return out;
}

CUresult Placement::unmap() {
  std::lock_guard<std::mutex> lk(mu_);
  unmapped_ = true;
  for (auto& [at, b] : live_) {
    if (b.handle == 0) continue;
    if (const CUresult rc = calls_.unmap(at, b.size); rc != kSuccess) return rc;
    (void)calls_.release(b.handle);
    b.handle = 0;
    if (b.fd >= 0) ::close(b.fd);  // whoever took the memory holds its own descriptor
    b.fd = -1;
  }
  return kSuccess;
}

std::string Placement::share_blocker() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (calls_.export_fd == nullptr || calls_.import_fd == nullptr) return "the driver lacks cuMemExportToShareableHandle";
  for (const auto& [at, b] : live_)
    if (!b.shareable) return "an allocation was made without a shareable handle";
  return "";
}

CUresult Placement::share(std::vector<int>* fds) {
  std::lock_guard<std::mutex> lk(mu_);
  fds->clear();
  const auto undo = [&](CUresult rc) {
    for (int fd : *fds) ::close(fd);
    fds->clear();
    return rc;
  };
  if (calls_.export_fd == nullptr) return kErrorNotPermitted;
  for (const auto& [at, b] : live_) {
    if (b.handle == 0 || !b.shareable) return undo(kErrorNotPermitted);
    int fd = -1;
    if (b.fd >= 0) {
      if ((fd = ::fcntl(b.fd, F_DUPFD_CLOEXEC, 0)) < 0) return undo(kErrorOutOfMemory);
    } else if (const CUresult rc = calls_.export_fd(&fd, b.handle, kPosixFd, 0); rc != kSuccess) {
      return undo(rc);
    }
    fds->push_back(fd);
  }
  return kSuccess;
}

CUresult Placement::take(const std::vector<int>& fds) {
  std::lock_guard<std::mutex> lk(mu_);
  if (fds.size() != live_.size() || calls_.import_fd == nullptr) return kErrorInvalidValue;
  size_t i = 0;
  for (auto& [at, b] : live_) {
    const int fd = fds[i++];
    if (b.handle != 0) continue;  // came back on an earlier try
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = calls_.import_fd(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)), kPosixFd);
    if (rc != kSuccess) return rc;
    rc = calls_.map(at, b.size, 0, h, 0);
    if (rc == kSuccess) {
      CUmemAccessDesc access{};
      access.location = device_prop(b.dev).location;
      access.flags = 3;
      rc = calls_.set_access(at, b.size, &access, 1);
      if (rc != kSuccess) (void)calls_.unmap(at, b.size);
    }
    if (rc != kSuccess) {
      (void)calls_.release(h);
      return rc;
    }
    const int kept = keep_fd(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    b.handle = h;
    b.shareable = kept >= 0;  // without its descriptor it cannot leave again: the next dump copies
    b.fd = kept;
  }
  unmapped_ = false;
  return kSuccess;
}

CUresult Placement::remap() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [at, b] : live_) {
    if (b.handle != 0) continue;
    if (const CUresult rc = map_block(at, &b); rc != kSuccess) return rc;
  }
  unmapped_ = false;
  return kSuccess;
}

Placement::Stats Placement::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::string Placement::json() const {
  const Stats s = stats();
  std::string devices;
  for (int d : s.devices) devices += (devices.empty() ? "" : ",") + std::to_string(d);
  return "{\"base\":" + std::to_string(base_) + ",\"span\":" + std::to_string(span_) + ",\"devices\":[" + devices +
         "],\"placed\":" + std::to_string(s.placed) + ",\"freed\":" + std::to_string(s.freed) +
         ",\"live\":" + std::to_string(s.live) + ",\"live_bytes\":" + std::to_string(s.live_bytes) +
         ",\"peak_bytes\":" + std::to_string(s.peak_bytes) + ",\"error\":" + json_string(s.error) + "}";
}

}  // namespace pos::driver
