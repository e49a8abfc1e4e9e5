// restore_gate.h — the in-process runtime's gate around a client that POS_CHECKPOINT stops,
// restores and hands back to the app's threads while they keep calling (docs/inprocess_checkpoint.md).
// Calls hold its Gate (pos/base/gate.h); a restore closes it, waits for the calls inside, and
// reopens it when done (std::unique_lock<RestoreGate>). A call that a stop checkpoint answered
// kUnavailable was not run and is not in the image (docs/checkpoint.md, "Stop"): like a system call
// interrupted by a dump, it is issued again once the stop is over, to the restored client (or to the
// live one, if the checkpoint failed). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "pos/base/gate.h"
#include "pos/base/status.h"

namespace pos {

class RestoreGate {
 public:
  // Runs `call` (returning Status) under the gate, again after the stop if a stop refused it.
  template <typename F>
  Status run(F&& call) {
    for (;;) {
      const uint64_t stops = stops_done_.load(std::memory_order_acquire);
      Status s;
      {
        // Waits while a restore holds the gate (no spin: a restore takes milliseconds at least).
        Gate::Holder in(gate_, 0);
        s = call();
      }
      if (s.code() != Code::kUnavailable) return s;
      // stops_done_ moves before stopping_ clears: a refusal by a stop sees one or the other.
      if (stops_done_.load(std::memory_order_acquire) == stops) {
        if (!stopping_.load(std::memory_order_acquire)) return s;
        stops_done_.wait(stops, std::memory_order_acquire);
      }
    }
  }
  // Around a stop checkpoint and the restore that follows it (or its failure).
  void begin_stop() { stopping_.store(true, std::memory_order_release); }
  void end_stop() {
    stops_done_.fetch_add(1, std::memory_order_acq_rel);
    stops_done_.notify_all();
    stopping_.store(false, std::memory_order_release);
  }
  // Exclusive while the client is removed and rebuilt (std::unique_lock<RestoreGate>): new calls
  // wait instead of seeing an unknown client, and lock() returns once the calls in flight have
  // left. Restores take turns: the one that closed the gate holds it until unlock().
  void lock() {
    while (!gate_.close()) gate_.wait_open(0);
    gate_.wait_drained(0);
  }
  void unlock() { gate_.reopen(); }

 private:
  Gate gate_;  // calls hold it; a restore closes it
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> stops_done_{0};
};

}  // namespace pos
