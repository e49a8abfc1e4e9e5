// call_profile.h — optional per-API timing of one client's pipeline (submit, parse, work, idle).
// Switched on by POS_PROFILE=1; POSClient prints the table when it stops. Off: one branch per call.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "pos/api_table.h"

namespace pos {

class CallProfile {
 public:
  // Whether POS_PROFILE asks for profiles (read once per process).
  static bool enabled_by_env();

  // App threads (several may submit at once: relaxed atomics).
  void add_submit(uint32_t api, uint64_t ns) { at(api).submit_ns.fetch_add(ns, std::memory_order_relaxed); }
  // Parser thread.
  void add_parse(uint32_t api, uint64_t ns) {
    Row& r = at(api);
    r.parse_ns.fetch_add(ns, std::memory_order_relaxed);
    r.calls.fetch_add(1, std::memory_order_relaxed);
  }
  // Worker thread.
  void add_work(uint32_t api, uint64_t ns) { at(api).work_ns.fetch_add(ns, std::memory_order_relaxed); }
  // Idle time counts only between the first and the last call (it is added by the next call).
  void add_worker_idle(uint64_t ns) { pending_idle_ns_ += ns; }
  void worker_seen(uint64_t now) {
    if (worker_first_ns_.load(std::memory_order_relaxed) == 0) worker_first_ns_.store(now, std::memory_order_relaxed);
    else worker_idle_ns_.fetch_add(pending_idle_ns_, std::memory_order_relaxed);
    pending_idle_ns_ = 0;
    worker_last_ns_.store(now, std::memory_order_relaxed);
  }

  // The table: one row per API that was called, by worker time, then the worker's busy share.
  std::string report(const std::string& title) const;

 private:
  struct Row {
    std::atomic<uint64_t> calls{0}, submit_ns{0}, parse_ns{0}, work_ns{0};
  };
  Row& at(uint32_t api) { return rows_[api < ApiTable::kMaxId ? api : 0]; }
  std::array<Row, ApiTable::kMaxId> rows_{};
  std::atomic<uint64_t> worker_idle_ns_{0}, worker_first_ns_{0}, worker_last_ns_{0};
  uint64_t pending_idle_ns_ = 0;  // worker thread only
};

}  // namespace pos
