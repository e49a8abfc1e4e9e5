// host_stream.h — a CUDA stream on the host: an ordered executor thread with real asynchrony.
// Ops run in submission order; cross-stream dependencies (legacy default stream, wait-event) are
// (stream, sequence) pairs waited on before an op runs.
#pragma once

#include <boost/lockfree/spsc_queue.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "pos/base/sync.h"

namespace pos::host {

class HostStream;

struct StreamDep {
  std::shared_ptr<HostStream> stream;
  uint64_t seq;  // wait until stream->completed() >= seq
};

// Producer side (enqueue) is confined to one thread: the owning client's worker. Waiting and
// progress queries are thread-safe.
class HostStream {
 public:
  HostStream(uint32_t flags, int32_t priority, uint64_t spin_ns);
  ~HostStream();  // runs what is queued, then stops
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Returns the op's sequence number (1, 2, ...).
  uint64_t enqueue(std::function<void()> fn, std::vector<StreamDep> deps = {});
  // The hot path (kernel launches with no cross-stream dependency): the op and its argument bytes
  // travel inside the queue slot, no allocation. Falls back to enqueue() when `bytes` is too big.
  static constexpr size_t kInlineBytes = 160;
  using InlineFn = void (*)(const std::byte* bytes);
  uint64_t enqueue_inline(InlineFn fn, const void* bytes, size_t n);
  uint64_t submitted() const { return submitted_.load(std::memory_order_acquire); }
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  bool idle() const { return completed() == submitted(); }
  void wait_for(uint64_t seq);
  void wait_idle() { wait_for(submitted()); }
  uint32_t flags() const { return flags_; }
  int32_t priority() const { return priority_; }

 private:
  struct Slow {  // an op that needs allocation: arbitrary work and/or dependencies
    std::function<void()> fn;
    std::vector<StreamDep> deps;
  };
  // Trivially copyable, stored by value in the queue: either an inline call or a Slow op.
  struct Op {
    InlineFn inline_fn;
    Slow* slow;
    alignas(16) std::byte bytes[kInlineBytes];
  };
  uint64_t push(const Op& op);
  void run();

  const uint32_t flags_;
  const int32_t priority_;
  const uint64_t spin_ns_;
  boost::lockfree::spsc_queue<Op, boost::lockfree::capacity<1024>> q_;
  Doorbell submit_bell_;  // ops queued / stop
  Doorbell done_bell_;    // ops completed (waiters and a producer facing a full queue)
  // Written by the producer and by the executor on every op: a line each.
  alignas(64) std::atomic<uint64_t> submitted_{0};
  alignas(64) std::atomic<uint64_t> completed_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pos::host
