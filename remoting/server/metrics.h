// metrics.h — posd's metrics for operators: Prometheus text format over plain HTTP on a configured
// local address (posd.metrics): sessions, their memory and calls, and every checkpoint policy's counters (docs/metrics.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/status.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"
#include "remoting/common/usage_region.h"
#include "remoting/server/checkpoint_policy.h"
#include "remoting/server/posd_server.h"

namespace pos {

struct MetricsInput {
  std::string backend;
  std::vector<SessionInfo> sessions;
  std::vector<PolicyStatus> policies;
  uint64_t now = 0;             // seconds since the epoch (the age of each newest restore point)
  uint64_t posd_rss_bytes = 0;  // posd's own resident memory
  // The in-process jobs of posd's user (their usage region, docs/limits.md): memory against their
  // limits and GPU-time shares.
  std::vector<UsageRegion::Entry> usage;
};
// The exposition text (text format 0.0.4): HELP and TYPE lines, then the samples; label values
// escaped as the format wants (a job's name is a client's bytes).
std::string render_metrics(const MetricsInput& in);

// The checkpoint policies of these sessions' jobs (each job's status file, in the jobs directory
// its environment names) and every policy in `jobs_dir` (in-process jobs of posd's user), by pid.
std::vector<PolicyStatus> policies_for(const std::vector<SessionInfo>& sessions, const std::string& jobs_dir);

// The usage region of `jobs_dir`'s jobs, read (never made); empty when there is none or it cannot
// be used.
// `kept`: the region posd keeps (posd.usage_region), read in place of the jobs directory's when set.
std::vector<UsageRegion::Entry> usage_for(const std::string& jobs_dir, const std::string& kept = "");

// Resident memory of this process, bytes.
uint64_t own_rss_bytes();

// "HOST:PORT" (an IPv4 address; port 0: any free one) → a listening socket whose GET /metrics
// answers body(); anything else gets 404 or 405. One request at a time on its own thread, each
// bounded (8 KiB of request, 2 s to send it).
class MetricsServer {
 public:
  static StatusOr<std::unique_ptr<MetricsServer>> start(const std::string& address, std::function<std::string()> body);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // Where it listens, "127.0.0.1:9464" (the port chosen if 0 was asked).
  const std::string& address() const { return server_->address(); }

 private:
  MetricsServer() = default;
  void answer(int fd);

  std::function<std::string()> body_;
  std::unique_ptr<TcpServer> server_;  // last: stopped (its thread joined) before body_ goes
};

}  // namespace pos
