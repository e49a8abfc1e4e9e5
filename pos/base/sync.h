// sync.h — spin-then-block waiting: a futex doorbell and a waitable state word.
// Hot paths spin for a short, configurable time (latency), then sleep in the kernel (an idle client costs no CPU).
#pragma once

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>

namespace pos {

// Names the calling thread (`top -H`, `perf`, `ps -L` show it); Linux keeps at most 15 characters.
inline void name_this_thread(const char* name) {
  char n[16] = {};
  for (int i = 0; i < 15 && name[i] != '\0'; ++i) n[i] = name[i];
  (void)pthread_setname_np(pthread_self(), n);
}

// Asks for a cache line ahead of use: for reading, or (prefetch_write) for writing, so that a line
// another core holds is taken over before the store needs it. Never faults.
inline void prefetch_read(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_write(const void* p) {
#if defined(__x86_64__)
  // `prefetchw`: GCC emits it for __builtin_prefetch(p, 1) only with -mprfchw, which a portable
  // build does not set. CPUs without it (none of this decade's) run it as a no-op.
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spinning waiters yield the core (sched_yield) now and then. Where cores are scarce (fewer than
// 8 that this process may use: the CI machine has 2 for app, parser, worker and stream threads)
// they yield between every short round, since the thread they wait for may need the core.
// Elsewhere only every few tens of µs: a yield is a syscall (~0.5 µs on a VM), and a hand-off
// that lands during one waits for it to return.
inline bool cores_are_scarce() {
  static const bool scarce = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    return sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) < 8;
  }();
  return scarce;
}

// A full memory barrier (store-load ordering) for the doorbell's Dekker handshake. ThreadSanitizer
// cannot model fences, so its builds use a relaxed locked RMW on a private word instead: on x86 that
// is the same hardware barrier, and it adds no happens-before edges that could hide real races.
inline void full_fence() {
#if defined(__SANITIZE_THREAD__)
  thread_local std::atomic<uint32_t> word{0};
  word.fetch_add(1, std::memory_order_relaxed);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

inline uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Wakes threads that sleep until some condition (a queue is non-empty, a state advanced) holds.
// Thread-safe: any number of ringers and waiters. The fast path of ring() is one load of a
// read-mostly word: the sequence word is bumped and the futex woken only when somebody sleeps.
// No lost wake-up: a sleeper announces itself (sleepers_++) and then re-checks its condition;
// a ringer publishes its condition and then checks for sleepers. Full fences on both sides make
// at least one of them see the other (Dekker); a bump between the sleeper's snapshot of seq_ and
// its futex_wait makes the wait return at once.
class Doorbell {
 public:
  void ring() {
    full_fence();
    if (sleepers_.load(std::memory_order_relaxed) != 0) {
      seq_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(&seq_);
    }
  }
  template <typename Ready>
  void sleep_until(Ready&& ready) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    full_fence();
    const uint32_t seen = seq_.load(std::memory_order_seq_cst);
    if (!ready()) futex_wait(&seq_, seen);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  alignas(64) std::atomic<uint32_t> seq_{0};
  std::atomic<uint32_t> sleepers_{0};
};

// The shape of an idle spin (spin_wait): first `tight` looks with no pause; then rounds of `round`
// looks, each after a `pause`; after every round a look at the clock (and the caller's on_round),
// and a sched_yield every `yield_rounds` rounds, or every round where cores are scarce.
struct SpinShape {
  uint32_t tight = 0;
  uint32_t round = 32;         // about 1.5-5 µs of `pause`s, depending on the CPU
  uint32_t yield_rounds = 32;  // so about every 50-150 µs where cores are plentiful
};
// Idle loops that find their work with one load (posd's ring, a reply's sequence number): a look
// per `pause`, the clock every 64 looks, a yield where cores are scarce or every ~1000 looks.
inline constexpr SpinShape kPollSpin{0, 64, 16};

// on_round for a spin that only the deadline ends.
struct SpinToDeadline {
  constexpr bool operator()() const { return true; }
};

namespace sync_detail {
template <typename Budget>
inline uint64_t spin_budget(Budget& b) {
  if constexpr (std::is_invocable_v<Budget&>) return b();
  else return static_cast<uint64_t>(b);
}
}  // namespace sync_detail

// The spin phase of every idle wait: looks at ready() until it holds (true) or the budget is spent
// (false); the caller then blocks its own way (a doorbell, a futex, poll). `budget` is the spin
// time in ns, or a callable giving it. The deadline is taken at the end of the first round, not
// before the first look: a wait that ends within that round (most hand-offs in a busy pipeline)
// reads no clock, and a callable budget may read words other cores write. So the spin lasts one
// round plus `budget`, and at least one round even for a budget of 0. on_round() runs after each
// round; false gives up at once (posd stopping). Inline, so ready() and on_round() are too: on a
// wait that ends at the first look this costs what a hand-written loop does.
template <SpinShape kShape = SpinShape{}, typename Budget, typename Ready, typename OnRound = SpinToDeadline>
inline bool spin_wait(Budget&& budget, Ready&& ready, OnRound&& on_round = {}) {
  static_assert(kShape.round > 0 && kShape.yield_rounds > 0);
  // A short tight poll first where asked: a hand-off between two busy pipeline threads usually
  // lands within a few hundred nanoseconds, and `pause` (up to ~140 cycles) would add to each.
  for (uint32_t i = 0; i < kShape.tight; ++i) {
    if (ready()) return true;
  }
  uint64_t deadline = 0;
  for (uint32_t rounds = 1;; ++rounds) {
    // `pause` before each look: a tight load loop takes execution resources from a hyperthread
    // sibling and burns power; a pause costs ~50 ns of latency (measured: BENCHMARKS, posd).
    for (uint32_t i = 0; i < kShape.round; ++i) {
      cpu_relax();
      if (ready()) return true;
    }
    const uint64_t now = now_ns();
    if (deadline == 0) deadline = now + sync_detail::spin_budget(budget);
    if (now >= deadline || !on_round()) return false;
    // Lets a descheduled peer run where cores are scarce (see cores_are_scarce).
    if (cores_are_scarce() || rounds % kShape.yield_rounds == 0) sched_yield();
  }
}

// Spin for about spin_ns checking ready() (256 tight looks, then spin_wait's rounds), then sleep on
// the bell until ready(). The bell must be rung by whoever makes ready() true.
template <typename Ready>
void spin_then_block(Doorbell& bell, uint64_t spin_ns, Ready&& ready) {
  if (ready()) return;
  if (spin_ns > 0 && spin_wait<SpinShape{256, 32, 32}>(spin_ns, ready)) return;
  while (!ready()) bell.sleep_until(ready);
}

// A monotonically advancing state with waiters (an API call's lifecycle, a command's progress).
class StateWord {
 public:
  explicit StateWord(uint32_t v = 0) : v_(v) {}
  uint32_t load() const { return v_.load(std::memory_order_acquire); }
  void reset(uint32_t v) { v_.store(v, std::memory_order_relaxed); }  // only while nobody waits
  void set(uint32_t v) {
    v_.store(v, std::memory_order_release);
    bell_.ring();
  }
  // One look, no waiting: whether the word is at least v (wrap-safe); *seen gets the value.
  bool at_least(uint32_t v, uint32_t* seen) const {
    *seen = v_.load(std::memory_order_acquire);
    return static_cast<int32_t>(*seen - v) >= 0;
  }
  // Wrap-safe: "at least" in serial-number order (values within 2^31 of each other). Returns the
  // value seen.
  uint32_t wait_at_least(uint32_t v, uint64_t spin_ns) {
    uint32_t seen = 0;
    spin_then_block(bell_, spin_ns, [&] {
      seen = v_.load(std::memory_order_acquire);
      return static_cast<int32_t>(seen - v) >= 0;
    });
    return seen;
  }

 private:
  std::atomic<uint32_t> v_;
  Doorbell bell_;
};

}  // namespace pos
