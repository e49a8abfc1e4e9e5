// queue_test.cc — the concurrency primitives: SPSC queues under spin-then-block waiting, the doorbell's
// no-lost-wakeup property, the idle spin (spin_wait), host stream ordering. Run under TSan/ASan too.
#include <gtest/gtest.h>

#include <boost/lockfree/spsc_queue.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "pos/backends/host/host_stream.h"
#include "pos/base/sync.h"

namespace pos {
namespace {

using namespace std::chrono_literals;

TEST(SpscQueue, DeliversEveryItemInOrderAcrossThreadsWithBlockingWaits) {
  boost::lockfree::spsc_queue<uint64_t> q(64);
  Doorbell items, space;
  constexpr uint64_t kCount = 200000;
  std::thread producer([&] {
    for (uint64_t i = 1; i <= kCount; ++i) {
      while (!q.push(i)) spin_then_block(space, 1000, [&] { return q.write_available() > 0; });
      items.ring();
    }
  });
  uint64_t expected = 1;
  while (expected <= kCount) {
    uint64_t v = 0;
    spin_then_block(items, 1000, [&] { return q.read_available() > 0; });
    while (q.pop(v)) {
      ASSERT_EQ(v, expected);
      ++expected;
    }
    space.ring();
  }
  producer.join();
  EXPECT_EQ(expected, kCount + 1);
}

TEST(Doorbell, AWaiterThatSleepsIsAlwaysWoken) {
  // Zero spin: every wait goes to the futex, so a lost wake-up would hang this test.
  Doorbell bell;
  std::atomic<int> value{0};
  std::thread waiter([&] {
    for (int i = 1; i <= 2000; ++i) spin_then_block(bell, 0, [&] { return value.load() >= i; });
  });
  for (int i = 1; i <= 2000; ++i) {
    value.store(i);
    bell.ring();
  }
  waiter.join();
  EXPECT_EQ(value.load(), 2000);
}

TEST(StateWord, WaitersSeeMonotonicProgress) {
  StateWord s(0);
  std::thread t([&] {
    for (uint32_t i = 1; i <= 3; ++i) s.set(i);
  });
  s.wait_at_least(3, 0);
  EXPECT_EQ(s.load(), 3u);
  t.join();
}

TEST(SpinWait, ReturnsTrueOnceReadyHoldsAndFalseOnceTheBudgetIsSpent) {
  std::atomic<bool> flag{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(5ms);
    flag.store(true);
  });
  // A budget far beyond the setter's delay: the spin must end by seeing the flag.
  EXPECT_TRUE(spin_wait(uint64_t{10'000'000'000}, [&] { return flag.load(); }));
  setter.join();

  const uint64_t t0 = now_ns();
  EXPECT_FALSE(spin_wait(uint64_t{2'000'000}, [] { return false; }));
  EXPECT_GE(now_ns() - t0, uint64_t{2'000'000}) << "gave up before the budget was spent";
}

TEST(SpinWait, TakesACallableBudgetOnceAndStopsWhenOnRoundSaysSo) {
  int budget_reads = 0;
  int rounds = 0;
  constexpr SpinShape kShape{0, 8, 4};
  const bool ready = spin_wait<kShape>(
      [&] {
        ++budget_reads;
        return uint64_t{10'000'000'000};
      },
      [] { return false; }, [&] { return ++rounds < 5; });
  EXPECT_FALSE(ready);
  EXPECT_EQ(rounds, 5);
  EXPECT_EQ(budget_reads, 1);
}

TEST(SpinWait, AZeroBudgetSpinsOneRound) {
  int looks = 0;
  constexpr SpinShape kShape{3, 16, 1};
  EXPECT_FALSE(spin_wait<kShape>(uint64_t{0}, [&] {
    ++looks;
    return false;
  }));
  EXPECT_EQ(looks, 3 + 16);
}

TEST(HostStream, RunsOpsInSubmissionOrderAsynchronously) {
  host::HostStream s(0, 0, 1000);
  std::vector<int> order;
  for (int i = 0; i < 1000; ++i) s.enqueue([&order, i] { order.push_back(i); });
  s.wait_idle();
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
  EXPECT_TRUE(s.idle());
}

TEST(HostStream, DependenciesOnOtherStreamsAreHonoured) {
  auto a = std::make_shared<host::HostStream>(0, 0, 1000);
  auto b = std::make_shared<host::HostStream>(0, 0, 1000);
  std::atomic<int> stage{0};
  std::atomic<bool> gate{false};
  const uint64_t seq = a->enqueue([&] {
    while (!gate.load()) std::this_thread::yield();
    stage = 1;
  });
  int seen = -1;
  b->enqueue([&] { seen = stage.load(); }, {host::StreamDep{a, seq}});
  EXPECT_FALSE(b->idle());  // blocked behind a's op
  gate = true;
  b->wait_idle();
  EXPECT_EQ(seen, 1);
}

TEST(HostStream, MoreOpsThanTheQueueHoldsApplyBackPressure) {
  host::HostStream s(0, 0, 1000);
  std::atomic<int> n{0};
  for (int i = 0; i < 5000; ++i) s.enqueue([&] { n.fetch_add(1); });
  s.wait_idle();
  EXPECT_EQ(n.load(), 5000);
}

}  // namespace
}  // namespace pos
