// stream_pool.cc — stream-ordered allocations carved out of placed segments (stream_pool.h): best
// fit among the free blocks a stream may use, split on allocation, merged with free neighbours on
// free, whole free segments given back on trim.
#include "remoting/driver/stream_pool.h"

#include <algorithm>
#include <iterator>

namespace pos::driver {

namespace {
constexpr CUresult kErrorInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE
constexpr int kMaxScan = 64;                // free blocks looked at per allocation, smallest fit first
constexpr unsigned int kEventDisableTiming = 0x2;
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

StreamPool::Fence::~Fence() {
  // Fences die under the pool's lock (or in its destructor): the event goes back for reuse.
  if (event != nullptr && pool != nullptr) {
    if (pool->spare_events_.size() < 1024) pool->spare_events_.push_back(event);
    else (void)pool->calls_.event_destroy(event);
  }
}

StreamPool::StreamPool(const StreamPoolCalls& calls, SegmentSource segments)
    : calls_(calls), segments_(std::move(segments)) {}

StreamPool::~StreamPool() {
  std::lock_guard<std::mutex> lk(mu_);
  blocks_.clear();  // the fences' events go to spare_events_
  for (CUevent e : spare_events_) (void)calls_.event_destroy(e);
  spare_events_.clear();
}  // segments stay with Placement

bool StreamPool::record(Fence& f) {
  if (f.event != nullptr || f.done) return true;
  CUevent e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else if (calls_.event_create(&e, kEventDisableTiming) != kSuccess) {
    e = nullptr;
  }
  const CUstream on = f.per_thread ? reinterpret_cast<CUstream>(kStreamPerThread) : f.stream;
  if (e != nullptr && calls_.event_record(e, on) == kSuccess) {
    f.event = e;
    ++stats_.events_recorded;
    return true;
  }
  if (e != nullptr) spare_events_.push_back(e);
  // No event to order the reuse: the device finishes what was queued before the free first.
  (void)calls_.synchronize();
  f.done = true;
  return false;
}

bool StreamPool::complete(Fence& f) {
  if (f.done) return true;
  (void)record(f);
  return f.done || calls_.event_query(f.event) == kSuccess;
}

// A null stream (not a per-thread one) is the legacy default stream: one name for it at allocation
// and at free, else a job on the default stream would never meet its own frees (and took a new
// segment while their events were pending).
CUstream StreamPool::named(CUstream s, bool per_thread) {
  return s == nullptr && !per_thread ? reinterpret_cast<CUstream>(kStreamLegacy) : s;
}

void StreamPool::index(uint64_t addr) { by_size_.emplace(blocks_.at(addr).size, addr); }
void StreamPool::unindex(uint64_t addr) { by_size_.erase({blocks_.at(addr).size, addr}); }

bool StreamPool::usable(Block& b, CUstream s, bool per_thread, bool* same) {
  *same = false;
  if (!b.fence) return true;
  if (!per_thread && !b.fence->per_thread && !b.fence->stream_ended && b.fence->stream == s) {  // the stream orders the free before this use
    *same = true;
    return true;
  }
  if (complete(*b.fence)) {
    b.fence.reset();
    return true;
  }
  return false;
}

CUresult StreamPool::alloc(CUdeviceptr* out, size_t bytes, CUstream s, bool per_thread, bool* placed, int dev) {
  *placed = false;
  if (dev < 0 && calls_.ctx_get_device(&dev) != kSuccess) return kSuccess;  // the driver answers (and says why)
  const uint64_t size = round_up(std::max<uint64_t>(bytes, 1), kBlockAlign);
  s = named(s, per_thread);
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t addr = 0;
  bool found = false, same = false, fenced = false;
  int scanned = 0;
  for (auto it = by_size_.lower_bound({size, 0}); it != by_size_.end() && scanned < kMaxScan; ++it) {
    Block& b = blocks_.at(it->second);
    if (b.dev != dev) continue;
    ++scanned;
    fenced = b.fence != nullptr;
    if (usable(b, s, per_thread, &same)) {
      addr = it->second, found = true;
      break;
    }
  }
  if (!found) {
    const uint64_t seg_bytes = std::max(kSegmentBytes, round_up(size, kSegmentAlign));
    CUdeviceptr seg = 0;
    bool seg_placed = false;
    const CUresult r = segments_.alloc(&seg, seg_bytes, &seg_placed);
    if (!seg_placed) return r;  // placement is off for this device: the driver's own pool serves it
    *placed = true;
    if (r != kSuccess) return r;  // out of memory (or the job's limit), as the driver would say
    segs_[seg] = {dev, seg_bytes};
    Block b;
    b.dev = dev, b.seg = seg, b.size = seg_bytes, b.free = true;
    blocks_[seg] = b;
    index(seg);
    addr = seg;
    stats_.reserved += seg_bytes, ++stats_.segments;
    stats_.reserved_high = std::max(stats_.reserved_high, stats_.reserved);
  } else if (same) {
    ++stats_.reused_same_stream;
  } else if (fenced) {
    ++stats_.reused_after_event;
  }
  unindex(addr);
  Block& b = blocks_.at(addr);
  if (b.size - size >= kBlockAlign) {  // the rest stays free, under the same ordering
    Block rest = b;
    rest.size = b.size - size;
    blocks_[addr + size] = rest;
    index(addr + size);
    b.size = size;
  }
  b.free = false, b.fence.reset();
  stats_.used += b.size, ++stats_.allocs;
  stats_.used_high = std::max(stats_.used_high, stats_.used);
  *placed = true;
  *out = addr;
  return kSuccess;
}

void StreamPool::merge_around(uint64_t addr) {
  // `addr` was freed last: its ordering is the newest. A neighbour joins it when the merged block
  // can carry one ordering: the neighbour has none, or the same stream's, or its event completed.
  auto joinable = [&](Block& recent, Block& n) {
    if (!n.free || n.deferred || n.seg != recent.seg) return false;
    if (!n.fence) return true;
    if (!recent.fence) {
      recent.fence = n.fence;
      return true;
    }
    const Fence& a = *recent.fence;
    const Fence& c = *n.fence;
    if (!a.per_thread && !c.per_thread && !a.stream_ended && !c.stream_ended && a.stream == c.stream) return true;
    // Another stream's: only once its event has completed (not recorded here just to merge).
    return c.done || (c.event != nullptr && calls_.event_query(c.event) == kSuccess);
  };
  auto it = blocks_.find(addr);
  Block& b = it->second;
  if (auto nx = std::next(it); nx != blocks_.end() && nx->first == addr + b.size && joinable(b, nx->second)) {
    unindex(nx->first);
    b.size += nx->second.size;
    blocks_.erase(nx);
  }
  if (it != blocks_.begin()) {
    auto pv = std::prev(it);
    if (pv->first + pv->second.size == addr && joinable(b, pv->second)) {
      unindex(pv->first);
      pv->second.size += b.size;
      pv->second.fence = b.fence;
      blocks_.erase(it);
      addr = pv->first;
    }
  }
  index(addr);
}

CUresult StreamPool::release(uint64_t addr, bool deferred, CUstream s, bool per_thread) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.free) return kErrorInvalidValue;  // not a live block's start
  Block& b = it->second;
  b.free = true;
  stats_.used -= b.size, ++stats_.frees;
  if (deferred) {  // not indexed: no allocation takes it before a trim
    b.deferred = true;
    return kSuccess;
  }
  b.fence.reset();
  if (s != nullptr || per_thread) {
    auto f = std::make_shared<Fence>();
    f->pool = this, f->stream = s, f->per_thread = per_thread;
    if (per_thread) (void)record(*f);  // only this thread can name its per-thread stream
    if (!f->done) b.fence = std::move(f);
  }
  merge_around(addr);
  return kSuccess;
}

bool StreamPool::owns(CUdeviceptr p) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = segs_.upper_bound(p);
  if (it == segs_.begin()) return false;
  --it;
  return p - it->first < it->second.second;
}

CUresult StreamPool::free_async(CUdeviceptr p, CUstream s, bool per_thread, bool* ours) {
  *ours = owns(p);
  if (!*ours) return kSuccess;
  std::lock_guard<std::mutex> lk(mu_);
  return release(p, false, named(s, per_thread), per_thread);
}

CUresult StreamPool::free_now(CUdeviceptr p, bool* ours) {
  *ours = owns(p);
  if (!*ours) return kSuccess;
  (void)calls_.synchronize();
  std::lock_guard<std::mutex> lk(mu_);
  return release(p, false, nullptr, false);
}

CUresult StreamPool::free_deferred(CUdeviceptr p, bool* ours) {
  *ours = owns(p);
  if (!*ours) return kSuccess;
  std::lock_guard<std::mutex> lk(mu_);
  return release(p, true, nullptr, false);
}

CUresult StreamPool::trim(size_t keep) {
  const CUresult r = calls_.synchronize();  // every pending free has completed after this
  if (r != kSuccess) return r;
  std::lock_guard<std::mutex> lk(mu_);
  // Every free block is usable anywhere now: orderings dropped, deferred blocks back, neighbours merged.
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    Block& b = it->second;
    if (!b.free) continue;
    if (b.deferred) {
      b.deferred = false;
      index(it->first);
    }
    b.fence.reset();
    for (auto nx = std::next(it); nx != blocks_.end() && nx->second.free && nx->second.seg == b.seg &&
                                  nx->first == it->first + b.size;
         nx = std::next(it)) {
      unindex(it->first);
      if (nx->second.deferred) nx->second.deferred = false;
      else unindex(nx->first);
      b.size += nx->second.size;
      blocks_.erase(nx);
      index(it->first);
    }
  }
  // Whole free segments go back, largest first, until at most `keep` bytes are held.
  std::vector<std::pair<uint64_t, uint64_t>> empty;  // (size, start)
  for (const auto& [start, ds] : segs_) {
    auto b = blocks_.find(start);
    if (b != blocks_.end() && b->second.free && b->second.size == ds.second) empty.emplace_back(ds.second, start);
  }
  std::sort(empty.rbegin(), empty.rend());
  CUresult out = kSuccess;
  for (const auto& [size, start] : empty) {
    if (stats_.reserved <= keep) break;
    const CUresult f = segments_.free(start);
    if (f != kSuccess) {
      out = f;
      continue;
    }
    unindex(start);
    blocks_.erase(start);
    segs_.erase(start);
    stats_.reserved -= size, --stats_.segments;
  }
  return out;
}

void StreamPool::stream_ending(CUstream s) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [addr, b] : blocks_)
    if (b.free && b.fence && !b.fence->per_thread && !b.fence->stream_ended && b.fence->stream == s) {
      (void)record(*b.fence);
      b.fence->stream_ended = true;
    }
}

std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> StreamPool::live_pieces(uint64_t align) const {
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [seg, where] : segs_) {
    const uint64_t seg_end = seg + where.second;
    auto& pieces = out[seg];
    for (auto it = blocks_.lower_bound(seg); it != blocks_.end() && it->first < seg_end; ++it) {
      const Block& b = it->second;
      if (b.free && !b.deferred) continue;
      const uint64_t lo = std::max(seg, it->first & ~(align - 1));
      const uint64_t hi = std::min(seg_end, (it->first + b.size + align - 1) & ~(align - 1));
      if (!pieces.empty() && lo <= pieces.back().second) pieces.back().second = std::max(pieces.back().second, hi);
      else pieces.emplace_back(lo, hi);
    }
  }
  return out;
}

StreamPool::Stats StreamPool::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace pos::driver
