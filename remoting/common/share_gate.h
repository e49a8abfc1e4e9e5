// share_gate.h — a job's side of the GPU-time scheduler (issue #24): before each kernel launch (an
// in-process job's hooks, a posd session's worker) the job asks the usage region whose turn it is,
// waits while another job's, and yields its own (after finishing its queued work) when its turn is
// over and others wait.
//
// The scheduler's state is in the shared region (remoting/common/usage_region.h, docs/limits.md);
// this class keeps the job's slot and device, checks every 10 ms whether its GPU is contended at
// all (uncontended: a launch costs two relaxed loads and a clock read), and counts what waiting
// cost the job, for ps. Thread-safe: any thread of the job may launch.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "remoting/common/usage_region.h"

namespace pos {

class ShareGate {
 public:
  // Called every 10 ms from a launching thread, before the contention check: the job checks there
  // that its slot is still its own (a CRIU restore) and re-attaches. Set once, before any launch.
  void set_verify(std::function<void()> verify) { verify_ = std::move(verify); }
  // The region and the job's slot and device in it (slot or device < 0: not scheduled). Set by the
  // job whenever it (re)joins or learns its device.
  void attach(UsageRegion* region, int slot, int device) {
    slot_.store(slot, std::memory_order_relaxed);
    device_.store(device, std::memory_order_relaxed);
    region_.store(region, std::memory_order_release);
    next_check_.store(0, std::memory_order_relaxed);
  }
  void set_timing(const UsageRegion::Timing& t) { timing_ = t; }

  // Before a launch: returns once the job may launch. `drain` finishes the job's queued work (the
  // real cuCtxSynchronize) before its turn is handed on. The token goes to done().
  template <typename Drain>
  int enter(Drain&& drain) {
    UsageRegion* r = region_.load(std::memory_order_acquire);
    if (r == nullptr) return 0;
    const int slot = slot_.load(std::memory_order_relaxed), dev = device_.load(std::memory_order_relaxed);
    if (slot < 0 || dev < 0) return 0;
    uint64_t now = steady_now_ns();
    if (!contended(r, dev, now)) return 0;
    const uint64_t began = now;
    bool waited = false;
    unsigned spins = 0;
    for (;;) {
      switch (r->pass(slot, dev, now, timing_)) {
        case UsageRegion::Pass::kGo:
          if (waited) {
            waits_.fetch_add(1, std::memory_order_relaxed);
            wait_ns_.fetch_add(now - began, std::memory_order_relaxed);
          }
          r->busy(slot, +1, now);
          return slot + 1;
        case UsageRegion::Pass::kYield:
          if (yield_mu_.try_lock()) {  // one thread of the job hands the turn on; the others wait
            r->begin_drain(slot, dev);
            drain();
            r->yield(slot, dev, steady_now_ns(), timing_);
            yields_.fetch_add(1, std::memory_order_relaxed);
            yield_mu_.unlock();
            break;
          }
          [[fallthrough]];
        case UsageRegion::Pass::kWait:
          waited = true;
          pause(spins++);
          break;
      }
      now = steady_now_ns();
      if (!contended(r, dev, now)) {  // the others left meanwhile
        r->stop_waiting(slot);
        return 0;
      }
    }
  }
  void done(int token) {
    if (token == 0) return;
    if (UsageRegion* r = region_.load(std::memory_order_acquire)) r->busy(token - 1, -1, steady_now_ns());
  }
  // Around a call that waits on the job's own work (a synchronize, a blocking copy): not idle.
  int busy_begin() {
    UsageRegion* r = region_.load(std::memory_order_acquire);
    const int slot = slot_.load(std::memory_order_relaxed), dev = device_.load(std::memory_order_relaxed);
    if (r == nullptr || slot < 0 || dev < 0 || !contended_.load(std::memory_order_relaxed)) return 0;
    r->busy(slot, +1, steady_now_ns());
    return slot + 1;
  }

  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
  uint64_t wait_ns() const { return wait_ns_.load(std::memory_order_relaxed); }
  uint64_t yields() const { return yields_.load(std::memory_order_relaxed); }

 private:
  bool contended(UsageRegion* r, int dev, uint64_t now) {
    if (now >= next_check_.load(std::memory_order_relaxed)) {
      next_check_.store(now + 10'000'000, std::memory_order_relaxed);
      if (verify_) verify_();
      contended_.store(r->contended(dev), std::memory_order_relaxed);
    }
    return contended_.load(std::memory_order_relaxed);
  }
  // A waiter asks again within about 50 µs at first, then less often (at most every 200 µs): a
  // turn handed to it is taken within a fraction of a percent of a 50 ms round.
  static void pause(unsigned spins) {
    timespec ts{0, spins < 20 ? 30'000 : 150'000};
    ::nanosleep(&ts, nullptr);
  }

  std::atomic<UsageRegion*> region_{nullptr};
  std::atomic<int> slot_{-1}, device_{-1};
  std::atomic<uint64_t> next_check_{0};
  std::atomic<bool> contended_{false};
  UsageRegion::Timing timing_;
  std::function<void()> verify_;
  std::mutex yield_mu_;
  std::atomic<uint64_t> waits_{0}, wait_ns_{0}, yields_{0};
};

}  // namespace pos
