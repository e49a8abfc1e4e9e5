// memory_limit.h — an in-process job's device-memory limit (issue #24): what its allocations
// hold, charged before the driver is asked, and refused as the driver refuses memory it lacks.
//
// The driver layer's hooks charge cuMemAlloc*, cuMemAllocAsync / FromPoolAsync, cuMemAllocManaged
// and cuMemCreate (PyTorch's expandable segments), and give back on cuMemFree* / cuMemRelease;
// cuMemGetInfo is narrowed to the limit (docs/limits.md). Device-neutral and thread-safe: the
// charge is one compare-and-swap loop, so two threads never both pass the last free bytes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace pos::driver {

class MemoryLimit {
 public:
  // 0: no limit (the job is still charged, so that a limit set later sees what it holds).
  void set(uint64_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  // `bytes` more held, unless that passes the limit: then false, nothing charged, and the refusal
  // counted.
  bool charge(uint64_t bytes) {
    uint64_t now = used_.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t cap = limit();
      if (cap != 0 && (bytes > cap || now > cap - bytes)) {
        refused_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      if (used_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed)) return true;
    }
  }
  void uncharge(uint64_t bytes) {
    uint64_t now = used_.load(std::memory_order_relaxed);
    while (!used_.compare_exchange_weak(now, now >= bytes ? now - bytes : 0, std::memory_order_relaxed)) {
    }
  }

  // VMM handles (cuMemCreate) by the value the job was given: their size comes back on release.
  void created(uint64_t handle, uint64_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    handles_[handle] = bytes;
  }
  // The size charged for `handle`, forgotten (0 when it is not known).
  uint64_t released(uint64_t handle) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return 0;
    const uint64_t n = it->second;
    handles_.erase(it);
    return n;
  }
  uint64_t size_of(uint64_t handle) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = handles_.find(handle);
    return it == handles_.end() ? 0 : it->second;
  }

  // cuMemGetInfo's answer as the job sees it: the total is the limit (when lower), and free is what
  // the limit leaves (when lower than what the device has free).
  void narrow(size_t* free_bytes, size_t* total_bytes) const {
    const uint64_t cap = limit();
    if (cap == 0 || free_bytes == nullptr || total_bytes == nullptr) return;
    const uint64_t held = used();
    *total_bytes = static_cast<size_t>(std::min<uint64_t>(*total_bytes, cap));
    *free_bytes = static_cast<size_t>(std::min<uint64_t>(*free_bytes, cap > held ? cap - held : 0));
  }

 private:
  std::atomic<uint64_t> limit_{0}, used_{0}, refused_{0};
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> handles_;  // under mu_
};

}  // namespace pos::driver
