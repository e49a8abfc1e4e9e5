// sync.h — spin-then-block waiting: a futex doorbell and a waitable state word.
// Hot paths spin for a short, configurable time (latency), then sleep in the kernel (an idle client costs no CPU).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pos {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
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

// A word that changes whenever a waiter may have something to do. Thread-safe: any number of
// ringers and waiters. The syscall happens only when somebody actually sleeps (sleepers_ > 0);
// seq_cst on both sides makes "ring after check" and "sleep after ring" impossible to miss.
class Doorbell {
 public:
  uint32_t snapshot() const { return seq_.load(std::memory_order_seq_cst); }
  void ring() {
    seq_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) != 0) futex_wake_all(&seq_);
  }
  void sleep(uint32_t seen) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (seq_.load(std::memory_order_seq_cst) == seen) futex_wait(&seq_, seen);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  alignas(64) std::atomic<uint32_t> seq_{0};
  std::atomic<uint32_t> sleepers_{0};
};

// Spin for up to spin_ns checking ready(), then sleep on the bell until ready().
// The bell must be rung by whoever makes ready() true.
template <typename Ready>
void spin_then_block(Doorbell& bell, uint64_t spin_ns, Ready&& ready) {
  if (ready()) return;
  if (spin_ns > 0) {
    const uint64_t deadline = now_ns() + spin_ns;
    do {
      for (int i = 0; i < 32; ++i) {
        if (ready()) return;
        cpu_relax();
      }
    } while (now_ns() < deadline);
  }
  for (;;) {
    const uint32_t seen = bell.snapshot();
    if (ready()) return;
    bell.sleep(seen);
  }
}

// A monotonically advancing state with waiters (an API call's lifecycle, a command's progress).
class StateWord {
 public:
  explicit StateWord(uint32_t v = 0) : v_(v) {}
  uint32_t load() const { return v_.load(std::memory_order_acquire); }
  void reset(uint32_t v) { v_.store(v, std::memory_order_relaxed); }
  void set(uint32_t v) {
    v_.store(v, std::memory_order_release);
    bell_.ring();
  }
  void wait_at_least(uint32_t v, uint64_t spin_ns) {
    spin_then_block(bell_, spin_ns, [&] { return v_.load(std::memory_order_acquire) >= v; });
  }

 private:
  std::atomic<uint32_t> v_;
  Doorbell bell_;
};

}  // namespace pos
