// backend.cc — what every device backend shares: device-wide memory accounting and plain host memory.
// The backends themselves live in pos/backends/; pos/backends/factory.cc picks one.
#include "pos/backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "pos/base/hex.h"

namespace pos {

void PeerMemory::close_fd() {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

StatusOr<std::vector<PeerPiece>> check_peer_memory(const std::vector<PeerMemory>& ranges,
                                                   const std::vector<PeerBuffer>& buffers, uint64_t base, uint64_t span,
                                                   uint64_t align) {
  if (align == 0) align = 1;
  std::vector<size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a].addr < ranges[b].addr; });
  uint64_t end = 0;
  for (size_t i : order) {
    const PeerMemory& r = ranges[i];
    const std::string what = "peer memory " + hex(r.addr) + " + " + std::to_string(r.size);
    if (r.fd < 0) return Status::InvalidArgument(what + " came without its descriptor");
    if (r.size == 0 || r.addr % align != 0 || r.size % align != 0)
      return Status::InvalidArgument(what + " is empty or not aligned to " + std::to_string(align) + " bytes");
    if (r.addr < base || r.size > span || r.addr - base > span - r.size)
      return Status::InvalidArgument(what + " lies outside the client's range " + hex(base) + " + " + hex(span));
    if (r.addr < end) return Status::InvalidArgument(what + " overlaps another range");
    end = r.addr + r.size;
  }
  std::vector<PeerPiece> pieces;
  pieces.reserve(buffers.size());
  for (const PeerBuffer& b : buffers) {
    if (b.size == 0 || b.addr + b.size < b.addr)
      return Status::InvalidArgument("buffer " + hex(b.addr) + " + " + std::to_string(b.size) + " is empty or wraps");
    // From the buffer's start, range after range: the last range starting at or below `at` must
    // hold it, up to its end or the buffer's.
    for (uint64_t at = b.addr, stop = b.addr + b.size; at < stop;) {
      auto it = std::upper_bound(order.begin(), order.end(), at, [&](uint64_t a, size_t i) { return a < ranges[i].addr; });
      const PeerMemory* r = it == order.begin() ? nullptr : &ranges[*std::prev(it)];
      if (r == nullptr || at - r->addr >= r->size)
        return Status::InvalidArgument("buffer " + hex(b.addr) + " + " + std::to_string(b.size) +
                                       " is not wholly inside the memory handed over (nothing at " + hex(at) + ")");
      const uint64_t n = std::min(stop, r->addr + r->size) - at;
      pieces.push_back(PeerPiece{*std::prev(it), at, n});
      at += n;
    }
  }
  return pieces;
}

bool DeviceBackend::try_reserve(uint64_t bytes) {
  uint64_t cur = reserved_.load();
  do {
    if (bytes > capacity_ || cur > capacity_ - bytes) return false;
  } while (!reserved_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

StatusOr<void*> DeviceBackend::host_alloc(uint64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0)
    return Status::Cuda(cuda::kErrorMemoryAllocation, "host allocation of " + std::to_string(bytes) + " bytes failed");
  return p;
}

Status DeviceBackend::host_free(void* p) {
  std::free(p);
  return Status::Ok();
}

StatusOr<void*> DeviceBackend::take_staging_chunk() {
  {
    std::lock_guard<std::mutex> lk(chunks_mu_);
    if (!chunks_.empty()) {
      void* p = chunks_.back();
      chunks_.pop_back();
      return p;
    }
  }
  return host_alloc(kStagingChunkBytes);
}

void DeviceBackend::give_staging_chunk(void* p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lk(chunks_mu_);
    if (chunks_.size() < kKeptStagingChunks) {
      chunks_.push_back(p);
      return;
    }
  }
  (void)host_free(p);
}

size_t DeviceBackend::keep_staging_chunks(size_t n) {
  n = std::min(n, kKeptStagingChunks);
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(chunks_mu_);
      if (chunks_.size() >= n) return chunks_.size();
    }
    auto p = host_alloc(kStagingChunkBytes);  // outside the lock: it takes milliseconds
    if (!p.ok()) return staging_chunks_kept();
    std::lock_guard<std::mutex> lk(chunks_mu_);
    chunks_.push_back(*p);
  }
}

size_t DeviceBackend::staging_chunks_kept() const {
  std::lock_guard<std::mutex> lk(chunks_mu_);
  return chunks_.size();
}

void DeviceBackend::release_staging_chunks() {
  std::vector<void*> all;
  {
    std::lock_guard<std::mutex> lk(chunks_mu_);
    all.swap(chunks_);
  }
  for (void* p : all) (void)host_free(p);
}


}  // namespace pos
