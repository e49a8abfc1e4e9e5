// call_profile.cc — the per-API timing table a client prints when POS_PROFILE=1 (see call_profile.h).
// Averages are per call; "work" is the worker function alone, so the rest of a call is queueing.
#include "pos/call_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pos/base/api_id.h"

namespace pos {

bool CallProfile::enabled_by_env() {
  static const bool on = [] {
    const char* e = std::getenv("POS_PROFILE");
    return e != nullptr && std::strcmp(e, "0") != 0 && e[0] != '\0';
  }();
  return on;
}

std::string CallProfile::report(const std::string& title) const {
  struct Line {
    uint32_t api;
    uint64_t calls, submit, parse, work;
  };
  std::vector<Line> lines;
  uint64_t work_total = 0;
  for (uint32_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    const uint64_t n = r.calls.load(std::memory_order_relaxed);
    if (n == 0) continue;
    lines.push_back({i, n, r.submit_ns.load(), r.parse_ns.load(), r.work_ns.load()});
    work_total += lines.back().work;
  }
  std::sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.work > b.work; });
  std::string out = "pos profile: " + title + "\n";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-34s %10s %12s %12s %12s %12s\n", "api", "calls", "submit us", "parse us",
                "work us", "work total ms");
  out += buf;
  for (const Line& l : lines) {
    const ApiInfo* info = find_api(l.api);
    const double n = static_cast<double>(l.calls);
    std::snprintf(buf, sizeof(buf), "%-34.34s %10llu %12.3f %12.3f %12.3f %12.3f\n",
                  info != nullptr ? std::string(info->name).c_str() : "?", static_cast<unsigned long long>(l.calls),
                  l.submit / n / 1e3, l.parse / n / 1e3, l.work / n / 1e3, l.work / 1e6);
    out += buf;
  }
  const uint64_t first = worker_first_ns_.load(), last = worker_last_ns_.load();
  const double span = last > first ? static_cast<double>(last - first) : 0;
  std::snprintf(buf, sizeof(buf),
                "worker: %.3f ms from first to last call; in worker functions %.3f ms (%.1f %%), waiting for calls "
                "%.3f ms (%.1f %%), the rest is dequeue and bookkeeping\n",
                span / 1e6, work_total / 1e6, span > 0 ? 100.0 * work_total / span : 0, worker_idle_ns_.load() / 1e6,
                span > 0 ? 100.0 * worker_idle_ns_.load() / span : 0);
  out += buf;
  return out;
}

}  // namespace pos
