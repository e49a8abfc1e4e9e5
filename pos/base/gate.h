// gate.h — Gate: admits work until it is closed, then waits for the work inside to leave (the idea
// of Seastar's `gate`). Used wherever one side must retire an object that other threads are using.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "pos/base/sync.h"

namespace pos {

// Thread-safe: any thread may enter, leave, close, wait and reopen.
//
// One 32-bit word holds everything: bit 31 "closed", bit 30 "sleepers" (a thread may be asleep in
// futex_wait on the word), bits 0..29 the holders. So entering is one atomic RMW whose result says
// whether the gate was open, and leaving is one RMW whose result says whether a sleeper must be
// woken: no second word, no fence, no Dekker handshake. Embedded beside the data its holders use
// (a client slot, a submitter's fields), it costs no extra cache line either.
//
// Every entry that precedes close() in the word's modification order is counted and waited for;
// every later one sees the closed bit and is turned away. An entrant turned away bumps the count
// for an instant (fetch_add, then fetch_sub): wait_drained never returns while one is inside, but
// such entries never hold the gate. So callers turned away must not retry in a tight loop (one
// preempted inside that instant holds the drain up for a time slice); none does: pos_process
// answers NotFound, RestoreGate's callers sleep in wait_open, posd's acceptor stops.
//
// Lifetime: leave() writes the gate only in its RMW; the wake-up that may follow is a futex
// syscall on the word's address, which is harmless if the word is gone by then (a private futex
// wake reads no memory; a waiter that happens to live there later sees a spurious wake-up, which
// every futex waiter tolerates). So whoever sees the drain may free the gate at once. Sleepers
// clear their own announcement (kSleepers) on the way out, never the thread that woke them.
class Gate {
 public:
  explicit Gate(bool open = true) : word_(open ? 0u : kClosed) {}
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Enters unless the gate is closed. True: the caller holds the gate and must leave() once.
  [[nodiscard]] bool try_enter() {
    // Acquire: what a reopen() published (a restored client) is visible to whoever enters after it.
    const uint32_t prev = word_.fetch_add(1, std::memory_order_acquire);
    if ((prev & kClosed) == 0) [[likely]] return true;
    leave();  // turned away; may be the last one out of the closed gate
    return false;
  }
  // Enters, waiting (spin for spin_ns, then sleep) while the gate is closed.
  void enter(uint64_t spin_ns) {
    while (!try_enter()) wait_open(spin_ns);
  }
  void leave() {
    // Release: a drain waiter that sees the count reach zero sees everything its holders did.
    const uint32_t prev = word_.fetch_sub(1, std::memory_order_release);
    if ((prev & (kSleepers | kCountMask)) == (kSleepers | 1)) [[unlikely]] futex_wake_all(&word_);
  }

  // From its return on, try_enter() fails. True if this call closed the gate (false: it was
  // closed already), so closers may take turns (RestoreGate).
  bool close() { return (word_.fetch_or(kClosed, std::memory_order_acq_rel) & kClosed) == 0; }
  // Returns once nobody holds the gate; spins for spin_ns first, then sleeps. After close() that
  // is for good (until reopen()); on an open gate it is a moment that may pass at once.
  void wait_drained(uint64_t spin_ns) {
    wait_until(spin_ns, [](uint32_t w) { return (w & kCountMask) == 0; });
  }
  // Admits entries again and wakes the threads waiting in enter() / wait_open().
  void reopen() {
    const uint32_t prev = word_.fetch_and(~kClosed, std::memory_order_release);
    if ((prev & kSleepers) != 0) futex_wake_all(&word_);
  }
  // Returns once the gate is open (a moment: it may be closed again by the time the caller acts).
  void wait_open(uint64_t spin_ns) {
    wait_until(spin_ns, [](uint32_t w) { return (w & kClosed) == 0; });
  }

  bool is_open() const { return (word_.load(std::memory_order_acquire) & kClosed) == 0; }
  bool drained() const { return (word_.load(std::memory_order_acquire) & kCountMask) == 0; }

  // Holds the gate for a scope: leaves on destruction (or at leave()). Not thread-safe: one owner.
  class Holder {
   public:
    // Tries once: check the holder (operator bool) to see whether it got in.
    explicit Holder(Gate& g) : gate_(g.try_enter() ? &g : nullptr) {}
    // Waits while the gate is closed (Gate::enter): always gets in.
    Holder(Gate& g, uint64_t spin_ns) : gate_(&g) { g.enter(spin_ns); }
    Holder(Holder&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)) {}
    Holder& operator=(Holder&&) = delete;
    ~Holder() { leave(); }
    explicit operator bool() const { return gate_ != nullptr; }
    void leave() {
      if (gate_ != nullptr) std::exchange(gate_, nullptr)->leave();
    }

   private:
    Gate* gate_;
  };

 private:
  static constexpr uint32_t kClosed = 1u << 31;
  static constexpr uint32_t kSleepers = 1u << 30;
  static constexpr uint32_t kCountMask = kSleepers - 1;

  template <typename Done>
  void wait_until(uint64_t spin_ns, Done done) {
    auto ready = [&] { return done(word_.load(std::memory_order_acquire)); };
    if (ready()) return;
    if (spin_ns > 0 && spin_wait(spin_ns, ready)) return;
    bool announced = false;
    for (;;) {
      uint32_t w = word_.load(std::memory_order_acquire);
      if (done(w)) break;
      // Announce the sleeper in the word itself: a leave() or reopen() that changes the word after
      // this makes futex_wait return at once (it compares the whole word), and one that sees the
      // bit wakes us. A failed CAS means the word moved: look again.
      if ((w & kSleepers) == 0 &&
          !word_.compare_exchange_weak(w, w | kSleepers, std::memory_order_acquire, std::memory_order_acquire))
        continue;
      announced = true;
      futex_wait(&word_, w | kSleepers);
    }
    // While the bit is set, every last leave() makes a syscall: take it down. Other sleepers may
    // still be asleep behind it (waiting for the other condition), so wake them all: each looks
    // again and announces itself anew if it sleeps on.
    if (announced && (word_.fetch_and(~kSleepers, std::memory_order_relaxed) & kSleepers) != 0)
      futex_wake_all(&word_);
  }

  std::atomic<uint32_t> word_;
};

}  // namespace pos
