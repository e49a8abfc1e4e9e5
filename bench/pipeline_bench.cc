// pipeline_bench.cc — throughput and latency of the pos_process → parser → worker pipeline.
// Prints a table: async calls/s per client and pos_process→worker-completion p50/p99, for 1 and N clients.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/sync.h"
#include "pos/workspace.h"
#include "remoting/common/api_client.h"
#include "unittest/test_kernels.h"
#include "pos/runtime.h"
#include "remoting/inproc/inproc_transport.h"

namespace {

struct Options {
  uint64_t calls = 2'000'000;   // async launches per client in the throughput run
  uint64_t paced = 200'000;     // one-at-a-time launches per client in the latency run
  std::vector<int> clients = {1, 4};
  uint64_t spin_us = 50;
  bool delayed_verdict = true;  // --immediate-verdict: callers poll the verdict at once (A/B)
};

struct Result {
  int clients = 0;
  double per_client_rate = 0, total_rate = 0;
  uint64_t flood_p50 = 0, flood_p99 = 0, paced_p50 = 0, paced_p99 = 0;
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--calls" && (v = next())) o->calls = std::strtoull(v, nullptr, 10);
    else if (a == "--paced" && (v = next())) o->paced = std::strtoull(v, nullptr, 10);
    else if (a == "--spin-us" && (v = next())) o->spin_us = std::strtoull(v, nullptr, 10);
    else if (a == "--immediate-verdict") o->delayed_verdict = false;
    else if (a == "--clients" && (v = next())) {
      o->clients.clear();
      for (char* p = const_cast<char*>(v); *p;) {
        o->clients.push_back(static_cast<int>(std::strtol(p, &p, 10)));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: pipeline_bench [--calls N] [--paced N] [--clients 1,4] [--spin-us N] [--immediate-verdict]\n");
      return false;
    }
  }
  return o->calls > 0 && !o->clients.empty();
}

struct BenchClient {
  uint64_t uuid = 0;
  std::unique_ptr<pos::InProcessTransport> t;
  std::unique_ptr<pos::ApiClient> api;
  uint64_t fn = 0;
  std::vector<std::byte> params;
};

bool check(const pos::Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "pipeline_bench: %s: %s\n", what, s.to_string().c_str());
  return s.ok();
}

// One workspace, nclients clients: a flood, then (if paced) one call in flight at a time.
// The throughput pass runs without the latency histogram (two clock reads per call).
bool run_phase(const Options& o, int nclients, bool record_latency, Result* r) {
  pos::Config cfg;
  cfg.backend = "host";
  cfg.spin_ns = o.spin_us * 1000;
  if (!o.delayed_verdict) cfg.delayed_verdict = pos::VerdictLook::kImmediate;
  cfg.record_latency = record_latency;
  auto ws = pos::create_workspace(cfg);
  if (!check(ws.status(), "create workspace")) return false;
  std::vector<BenchClient> cs(nclients);
  for (auto& c : cs) {
    auto u = (*ws)->create_client("bench");
    if (!check(u.status(), "create client")) return false;
    c.uuid = *u;
    c.t = std::make_unique<pos::InProcessTransport>(ws->get(), c.uuid);
    c.api = std::make_unique<pos::ApiClient>(c.t.get());
    uint64_t module = 0;
    pos::RegisteredFunction f;
    if (!check(c.api->register_fatbin(&module, pos::make_test_fatbin(16)), "register module") ||
        !check(c.api->register_function(&f, module, kTestNoopName), "register kernel"))
      return false;
    c.fn = f.handle;
    c.params.assign(f.param_bytes, std::byte{0});
  }
  const pos::LaunchDims dims{{1, 1, 1}, {1, 1, 1}, 0};

  // Throughput: every client floods async launches from its own thread.
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, ok{true};
  std::vector<double> secs(nclients);
  std::vector<std::thread> threads;
  for (int i = 0; i < nclients; ++i) {
    threads.emplace_back([&, i] {
      BenchClient& c = cs[i];
      ready.fetch_add(1);
      while (!go.load()) pos::cpu_relax();
      const uint64_t t0 = pos::now_ns();
      for (uint64_t k = 0; k < o.calls; ++k)
        if (!c.api->launch_kernel(c.fn, dims, 0, c.params).ok()) ok = false;
      if (!c.api->device_synchronize().ok()) ok = false;
      secs[i] = static_cast<double>(pos::now_ns() - t0) / 1e9;
    });
  }
  while (ready.load() < nclients) std::this_thread::yield();
  go = true;
  for (auto& t : threads) t.join();
  if (!ok) return false;
  r->clients = nclients;
  auto c0 = (*ws)->find_client(cs[0].uuid);
  if (!record_latency) {
    double total = 0, min_rate = 1e300;
    for (int i = 0; i < nclients; ++i) {
      const double rate = static_cast<double>(o.calls) / secs[i];
      total += rate;
      min_rate = std::min(min_rate, rate);
    }
    r->per_client_rate = min_rate;
    r->total_rate = total;
    return true;
  }
  r->flood_p50 = c0->latency().percentile_ns(0.50);
  r->flood_p99 = c0->latency().percentile_ns(0.99);

  // Latency: one call in flight per client; wait for the worker before the next.
  for (auto& c : cs) (*ws)->find_client(c.uuid)->clear_latency();
  threads.clear();
  for (int i = 0; i < nclients; ++i) {
    threads.emplace_back([&, i] {
      BenchClient& c = cs[i];
      auto client = (*ws)->find_client(c.uuid);
      for (uint64_t k = 0; k < o.paced; ++k) {
        const uint64_t before = client->stats().calls_executed;
        if (!c.api->launch_kernel(c.fn, dims, 0, c.params).ok()) ok = false;
        while (client->stats().calls_executed == before) pos::cpu_relax();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!c0->latency().count()) return false;
  r->paced_p50 = c0->latency().percentile_ns(0.50);
  r->paced_p99 = c0->latency().percentile_ns(0.99);
  return ok.load();
}

bool run(const Options& o, int nclients, Result* r) {
  return run_phase(o, nclients, false, r) && run_phase(o, nclients, true, r);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  std::vector<Result> results;
  for (int n : o.clients) {
    Result r;
    if (!run(o, n, &r)) {
      std::fprintf(stderr, "pipeline_bench: run with %d clients failed\n", n);
      return 1;
    }
    results.push_back(r);
  }
  std::printf("\nPOS pipeline (host backend, noop kernel launches; %u cores, spin %lu us, %lu calls/client, verdict %s)\n",
              std::thread::hardware_concurrency(), static_cast<unsigned long>(o.spin_us),
              static_cast<unsigned long>(o.calls), o.delayed_verdict ? "auto" : "immediate");
  std::printf("| clients | async calls/s per client (min) | all clients calls/s | flood p50 us | flood p99 us | "
              "one-in-flight p50 us | one-in-flight p99 us |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const auto& r : results)
    std::printf("| %d | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f |\n", r.clients, r.per_client_rate, r.total_rate,
                r.flood_p50 / 1e3, r.flood_p99 / 1e3, r.paced_p50 / 1e3, r.paced_p99 / 1e3);
  std::printf("rates: a pass without latency recording; latency: a second pass with it, pos_process entry -> "
              "worker completion (client 0), 50 ns buckets, upper edge\n");
  return 0;
}
