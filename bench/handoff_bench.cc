// handoff_bench.cc — the floor under the pipeline's per-call cost: a bare request/verdict round
// trip between two threads through a Boost SPSC queue and a state word, with no POS code in between.
#include <boost/lockfree/spsc_queue.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "pos/sync.h"

namespace {

struct alignas(64) Slot {
  pos::StateWord state{0};
  uint64_t payload[6] = {};
};

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 5'000'000;
  // With a second argument, a third thread (the "worker") takes every slot after the verdict and
  // writes it again, as POS's worker does: the caller still waits for the first verdict only.
  const bool three = argc > 2;
  boost::lockfree::spsc_queue<Slot*> q(4096), q2(4096);
  pos::Doorbell bell, bell2;
  std::vector<Slot> slots(1024);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    Slot* s = nullptr;
    for (;;) {
      if (q.pop(s)) {
        s->payload[1] = s->payload[0] + 1;  // "parse"
        s->state.set(1);
        if (three) {
          while (!q2.push(s)) pos::cpu_relax();
          bell2.ring();
        }
        continue;
      }
      if (stop.load(std::memory_order_relaxed)) return;
      pos::spin_then_block(bell, 50000, [&] { return q.read_available() > 0 || stop.load(); });
    }
  });
  std::thread worker([&] {
    Slot* s = nullptr;
    for (;;) {
      if (q2.pop(s)) {
        s->payload[2] = s->payload[1] + 1;  // "execute"
        s->state.set(2);
        continue;
      }
      if (stop.load(std::memory_order_relaxed)) return;
      pos::spin_then_block(bell2, 50000, [&] { return q2.read_available() > 0 || stop.load(); });
    }
  });
  const uint64_t t0 = pos::now_ns();
  for (uint64_t i = 0; i < n; ++i) {
    Slot* s = &slots[i % slots.size()];
    if (three && i >= slots.size()) s->state.wait_at_least(2, 50000);  // its last use is finished
    s->state.reset(0);
    s->payload[0] = i;
    while (!q.push(s)) pos::cpu_relax();
    bell.ring();
    s->state.wait_at_least(1, 50000);
  }
  const double secs = static_cast<double>(pos::now_ns() - t0) / 1e9;
  stop = true;
  bell.ring();
  bell2.ring();
  server.join();
  worker.join();
  std::printf("| bare %s round trip (Boost SPSC + state word) | %.0f round trips/s | %.0f ns each |\n",
              three ? "three-thread" : "two-thread",
              static_cast<double>(n) / secs, secs * 1e9 / static_cast<double>(n));
  return 0;
}
