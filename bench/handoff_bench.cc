// handoff_bench.cc — the floor under the pipeline's per-call cost: request/verdict round trips
// between threads through Boost SPSC queues and a state word, with no POS code in between.
#include <boost/lockfree/spsc_queue.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/sync.h"

namespace {

constexpr uint64_t kSpinNs = 50'000;

// A serving thread's loop: on_item for each element of q, else spin, then sleep on bell, until stop.
template <typename Q, typename F>
void serve(Q& q, pos::Doorbell& bell, const std::atomic<bool>& stop, F&& on_item) {
  typename Q::value_type item{};
  for (;;) {
    if (q.pop(item)) {
      on_item(item);
      continue;
    }
    if (stop.load(std::memory_order_relaxed)) return;
    pos::spin_then_block(bell, kSpinNs, [&] { return q.read_available() > 0 || stop.load(); });
  }
}

// ---- two / three: a one-line slot, handed over by pointer ----
struct alignas(64) Slot {
  pos::StateWord state{0};
  uint64_t payload[6] = {};
};

double run_bare(uint64_t n, bool three) {
  boost::lockfree::spsc_queue<Slot*> q(4096), q2(4096);
  pos::Doorbell bell, bell2;
  std::vector<Slot> slots(1024);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    serve(q, bell, stop, [&](Slot* s) {
      s->payload[1] = s->payload[0] + 1;  // "parse"
      s->state.set(1);
      if (three) {
        while (!q2.push(s)) pos::cpu_relax();
        bell2.ring();
      }
    });
  });
  std::thread worker([&] {
    serve(q2, bell2, stop, [&](Slot* s) {
      s->payload[2] = s->payload[1] + 1;  // "execute"
      s->state.set(2);
    });
  });
  const uint64_t t0 = pos::now_ns();
  for (uint64_t i = 0; i < n; ++i) {
    Slot* s = &slots[i % slots.size()];
    if (three && i >= slots.size()) s->state.wait_at_least(2, kSpinNs);  // its last use is finished
    s->state.reset(0);
    s->payload[0] = i;
    while (!q.push(s)) pos::cpu_relax();
    bell.ring();
    s->state.wait_at_least(1, kSpinNs);
  }
  const double ns = static_cast<double>(pos::now_ns() - t0) / static_cast<double>(n);
  stop = true;
  bell.ring();
  bell2.ring();
  server.join();
  worker.join();
  return ns;
}

// ---- ctx / slot: POS's context layout, three threads ----
// A model of APIContext: three lines the submitter writes (header, parameter sizes, bytes), the
// state word's line, the parser/worker line, and the caller's own line. `ctx` hands the context
// over by pointer (POS today); `slot` carries the header and parameters in a two-line queue slot
// and the parser copies them into the context, so the parser's first read does not depend on a
// second one, and the caller writes no line the parser or worker read during the context's last use.
struct alignas(64) Ctx {
  uint64_t sub[24] = {};  // submitter block: 3 lines
  alignas(64) pos::StateWord state{0};
  alignas(64) uint64_t pw[8] = {};  // parser / worker block
  alignas(64) uint32_t caller_base = 0;  // the caller's own line
};
constexpr int kHeaderWords = 6, kParamWords = 8;  // a launch: 6 header words, 48 bytes of parameters + sizes
struct alignas(64) CallSlot {
  Ctx* c = nullptr;
  uint64_t w[15] = {};
};
static_assert(sizeof(CallSlot) == 128);

// kDelayNs > 0 (mode ctxd): the caller first waits that long before polling the state word, and
// the parser asks for the state word's line for writing as soon as it takes the call: a line the
// caller polls must be taken back by the parser's store (one more round trip on the critical path).
template <bool kInSlot>
double run_ctx(uint64_t n, uint64_t delay_ns = 0) {
  using Item = std::conditional_t<kInSlot, CallSlot, Ctx*>;
  boost::lockfree::spsc_queue<Item> q(1024);
  boost::lockfree::spsc_queue<Ctx*> q2(1024), cq(1024);
  pos::Doorbell bell, bell2;
  std::vector<std::unique_ptr<Ctx>> all;
  std::deque<Ctx*> pool;
  for (int i = 0; i < 128; ++i) {
    all.push_back(std::make_unique<Ctx>());
    pool.push_back(all.back().get());
  }
  std::atomic<bool> stop{false};
  std::thread parser([&] {
    serve(q, bell, stop, [&](const Item& it) {
      Ctx* c = nullptr;
      uint64_t sum = 0;
      if constexpr (kInSlot) {
        c = it.c;
        for (size_t off = 0; off < sizeof(c->sub); off += 64) pos::prefetch_write(reinterpret_cast<char*>(c->sub) + off);
        pos::prefetch_write(c->pw);
        c->sub[0] = it.w[0];  // what the parser stores for the worker: header and parameters
        for (int k = 1; k < kHeaderWords; ++k) c->sub[k] = it.w[k];
        for (int k = 0; k < kParamWords; ++k) c->sub[8 + k] = it.w[kHeaderWords + k];
        for (int k = 0; k < kHeaderWords + kParamWords; ++k) sum += it.w[k];
      } else {
        c = it;
        for (size_t off = 0; off < sizeof(c->sub); off += 64) pos::prefetch_read(reinterpret_cast<char*>(c->sub) + off);
        pos::prefetch_write(c->pw);
        if (delay_ns > 0) pos::prefetch_write(&c->state);
        for (int k = 0; k < kHeaderWords; ++k) sum += c->sub[k];
        for (int k = 0; k < kParamWords; ++k) sum += c->sub[8 + k];
      }
      c->pw[0] = sum;  // "parse"
      c->pw[1] = 0;
      c->state.set(static_cast<uint32_t>(c->sub[0]) + 1);
      while (!q2.push(c)) pos::cpu_relax();
      bell2.ring();
    });
  });
  std::thread worker([&] {
    serve(q2, bell2, stop, [&](Ctx* c) {
      uint64_t sum = c->pw[0];
      for (int k = 0; k < kParamWords; ++k) sum += c->sub[8 + k];
      c->pw[2] = sum;  // "execute"
      c->state.set(static_cast<uint32_t>(c->sub[0]) + 2);
      while (!cq.push(c)) pos::cpu_relax();
    });
  });
  const uint64_t t0 = pos::now_ns();
  for (uint64_t i = 0; i < n; ++i) {
    // FIFO pool refilled in batches from the completion queue, as POS's acquire_context does.
    if (pool.size() < 32) {
      Ctx* back = nullptr;
      while (pool.empty() || cq.read_available() > 0) {
        if (cq.pop(back)) pool.push_back(back);
        else pos::cpu_relax();
      }
    }
    Ctx* c = pool.front();
    pool.pop_front();
    c->caller_base += 4;
    const uint32_t base = c->caller_base;
    if constexpr (kInSlot) {
      CallSlot s;
      s.c = c;
      s.w[0] = base;
      for (int k = 1; k < kHeaderWords; ++k) s.w[k] = i + k;
      for (int k = 0; k < kParamWords; ++k) s.w[kHeaderWords + k] = i ^ k;
      while (!q.push(s)) pos::cpu_relax();
    } else {
      c->sub[0] = base;
      for (int k = 1; k < kHeaderWords; ++k) c->sub[k] = i + k;
      for (int k = 0; k < kParamWords; ++k) c->sub[8 + k] = i ^ k;
      while (!q.push(c)) pos::cpu_relax();
    }
    bell.ring();
    if (delay_ns > 0) {
      const uint64_t until = pos::now_ns() + delay_ns;
      while (pos::now_ns() < until) pos::cpu_relax();
    }
    c->state.wait_at_least(base + 1, kSpinNs);
  }
  const double ns = static_cast<double>(pos::now_ns() - t0) / static_cast<double>(n);
  stop = true;
  bell.ring();
  bell2.ring();
  parser.join();
  worker.join();
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 5'000'000;
  int reps = 1;
  uint64_t delay_ns = 250;
  std::vector<std::string> modes = {"two", "three"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--calls" && v != nullptr) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && v != nullptr) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--delay-ns" && v != nullptr) delay_ns = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--modes" && v != nullptr) {
      modes.clear();
      std::string m = argv[++i];
      for (size_t p = 0; p <= m.size();) {
        const size_t e = std::min(m.find(',', p), m.size());
        modes.push_back(m.substr(p, e - p));
        p = e + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: handoff_bench [--calls N] [--reps R] [--modes two,three,ctx,ctxd,slot] [--delay-ns N]\n"
                   "  two    caller and parser, a one-line slot by pointer\n"
                   "  three  the same, and a worker takes every slot after the verdict\n"
                   "  ctx    three threads, POS's context layout handed over by pointer\n"
                   "  ctxd   ctx, the caller polls the verdict only after --delay-ns (default 250)\n"
                   "  slot   three threads, header and parameters in a two-line queue slot\n");
      return 2;
    }
  }
  for (const auto& m : modes) {
    if (m != "two" && m != "three" && m != "ctx" && m != "ctxd" && m != "slot") {
      std::fprintf(stderr, "handoff_bench: unknown mode '%s'\n", m.c_str());
      return 2;
    }
  }
  if (n == 0) {
    std::fprintf(stderr, "handoff_bench: --calls must be positive\n");
    return 2;
  }
  std::printf("| rep | mode | round trips/s | ns each |\n|---|---|---|---|\n");
  for (int r = 0; r < reps; ++r) {
    for (const auto& m : modes) {  // interleaved, so that drift on the machine hits every mode alike
      const double ns = m == "two" ? run_bare(n, false)
                        : m == "three" ? run_bare(n, true)
                        : m == "ctx"   ? run_ctx<false>(n)
                        : m == "ctxd"  ? run_ctx<false>(n, delay_ns)
                                       : run_ctx<true>(n);
      std::printf("| %d | %s | %.0f | %.0f |\n", r + 1, m.c_str(), 1e9 / ns, ns);
      std::fflush(stdout);
    }
  }
  return 0;
}
