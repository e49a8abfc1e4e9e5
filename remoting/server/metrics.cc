// metrics.cc — the Prometheus text rendering of posd's sessions and checkpoint policies, and the
// minimal HTTP/1.0 responder that serves it (no dependency: one GET, one answer, close).
#include "remoting/server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "pos/base/log.h"
#include "pos/base/text.h"
#include "remoting/common/job_control.h"
#include "remoting/common/socket_io.h"

namespace pos {
namespace {

// A label value: backslash, quote and newline escaped; other control bytes shown as printable() does.
std::string label(const std::string& v) {
  std::string out;
  for (char c : printable(v, 256)) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    t_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const char* name, const std::string& labels, double v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.17g", v);
    t_ += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " + b + "\n";
  }
  void sample(const char* name, const std::string& labels, uint64_t v) {
    t_ += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(v) + "\n";
  }
  std::string take() { return std::move(t_); }

 private:
  std::string t_;
};

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  Writer w;
  w.family("pos_up", "gauge", "1 while posd serves (the backend in a label).");
  w.sample("pos_up", "backend=\"" + label(in.backend) + "\"", uint64_t{1});
  w.family("pos_sessions", "gauge", "Sessions posd serves now.");
  w.sample("pos_sessions", "", static_cast<uint64_t>(in.sessions.size()));
  w.family("pos_posd_resident_bytes", "gauge", "posd's own resident memory.");
  w.sample("pos_posd_resident_bytes", "", in.posd_rss_bytes);
  std::map<uint32_t, std::string> job_of;
  const auto session_labels = [](const SessionInfo& s) {
    return "pid=\"" + std::to_string(s.pid) + "\",job=\"" + label(s.job) + "\",uid=\"" + std::to_string(s.uid) + "\"";
  };
  struct SessionFamily {
    const char* name;
    const char* type;
    const char* help;
    uint64_t (*value)(const SessionInfo&);
  };
  const SessionFamily families[] = {
      {"pos_session_device_memory_bytes", "gauge", "Device memory a session's job holds.",
       [](const SessionInfo& s) { return s.stats.memory_in_use; }},
      {"pos_session_memory_quota_bytes", "gauge", "A session's device-memory quota (posd.limits, pos-cli limit; 0: none).",
       [](const SessionInfo& s) { return s.stats.memory_quota; }},
      {"pos_session_handles", "gauge", "Live handles (buffers, streams, events, ...) of a session.",
       [](const SessionInfo& s) { return s.stats.live_handles; }},
      {"pos_session_arena_bytes", "gauge", "A session's shared-memory arena.",
       [](const SessionInfo& s) { return s.arena_bytes; }},
      {"pos_session_calls_total", "counter", "API calls a session's job submitted.",
       [](const SessionInfo& s) { return s.stats.calls_submitted; }},
      {"pos_session_calls_executed_total", "counter", "API calls of a session executed on the device.",
       [](const SessionInfo& s) { return s.stats.calls_executed; }},
  };
  for (const SessionFamily& f : families) {
    w.family(f.name, f.type, f.help);
    for (const SessionInfo& s : in.sessions) w.sample(f.name, session_labels(s), f.value(s));
  }
  for (const SessionInfo& s : in.sessions) job_of[s.pid] = s.job;

  const auto policy_labels = [&](const PolicyStatus& p) {
    auto j = job_of.find(p.pid);
    return "pid=\"" + std::to_string(p.pid) + "\",job=\"" + label(j == job_of.end() ? "" : j->second) + "\",dir=\"" +
           label(p.dir) + "\"";
  };
  struct PolicyFamily {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const PolicyStatus&, uint64_t now);
  };
  const PolicyFamily pfam[] = {
      {"pos_checkpoint_policy_running", "gauge", "1 while a job's checkpoint policy runs, else 0 (stopped, or the job ended).",
       [](const PolicyStatus& p, uint64_t) { return p.state == "running" && checkpointer_alive(p) ? 1.0 : 0.0; }},
      {"pos_checkpoint_interval_seconds", "gauge", "A policy's interval.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.every_us) / 1e6; }},
      {"pos_checkpoints_total", "counter", "Checkpoints taken (restore points written whole).",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.taken); }},
      {"pos_checkpoint_failures_total", "counter", "Checkpoints that failed (the job ran on, earlier points kept).",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.failed); }},
      {"pos_checkpoint_coalesced_total", "counter", "Ticks skipped because the one before ran past them.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.coalesced); }},
      {"pos_checkpoint_written_bytes_total", "counter", "Bytes written by a policy's checkpoints (GPU and CRIU parts).",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.bytes_total); }},
      {"pos_checkpoint_retired_total", "counter", "Restore points deleted by retention.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.retired); }},
      {"pos_checkpoint_rebased_total", "counter", "Restore points made whole so that the points they built on could be deleted.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.rebased); }},
      {"pos_checkpoint_restore_points", "gauge", "Complete restore points in the policy's directory.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.points); }},
      {"pos_checkpoint_last_duration_seconds", "gauge", "The last checkpoint, from its start until its point was complete.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_duration_us) / 1e6; }},
      {"pos_checkpoint_last_pause_seconds", "gauge", "How long the last checkpoint held the job's calls.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_pause_us) / 1e6; }},
      {"pos_checkpoint_last_gpu_seconds", "gauge", "The last checkpoint's GPU part, until durable.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_gpu_us) / 1e6; }},
      {"pos_checkpoint_last_cpu_seconds", "gauge", "The last checkpoint's CPU part (CRIU); 0 without --with-cpu.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_criu_us) / 1e6; }},
      {"pos_checkpoint_last_bytes", "gauge", "Bytes the last checkpoint wrote.",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_bytes); }},
      {"pos_checkpoint_last_referenced_bytes", "gauge", "GPU bytes the last checkpoint left to earlier points (unchanged).",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_bytes_referenced); }},
      {"pos_checkpoint_latest_timestamp_seconds", "gauge", "When the newest restore point became complete (0: none yet).",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.newest_time); }},
      {"pos_checkpoint_latest_age_seconds", "gauge",
       "Age of the newest restore point: what a crash now would lose (-1: none yet).",
       [](const PolicyStatus& p, uint64_t now) {
         return p.newest_time == 0 ? -1.0 : static_cast<double>(now - std::min(now, p.newest_time));
       }},
      {"pos_checkpoint_last_error_timestamp_seconds", "gauge", "When a checkpoint last failed (0: never).",
       [](const PolicyStatus& p, uint64_t) { return static_cast<double>(p.last_error_time); }},
  };
  for (const PolicyFamily& f : pfam) {
    w.family(f.name, f.type, f.help);
    for (const PolicyStatus& p : in.policies) w.sample(f.name, policy_labels(p), f.value(p, in.now));
  }
  // In-process jobs' limits (issue #24): from their shared usage region.
  struct UsageFamily {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const UsageRegion::Entry&);
  };
  const UsageFamily ufam[] = {
      {"pos_job_device_memory_bytes", "gauge", "Device memory an in-process job holds (its allocations).",
       [](const UsageRegion::Entry& e) { return static_cast<double>(e.memory_used); }},
      {"pos_job_memory_limit_bytes", "gauge", "An in-process job's device-memory limit (0: none).",
       [](const UsageRegion::Entry& e) { return static_cast<double>(e.memory_limit); }},
      {"pos_job_gpu_share", "gauge", "An in-process job's GPU-time share, 0 to 1 (0: none).",
       [](const UsageRegion::Entry& e) { return static_cast<double>(e.share) / 1000.0; }},
      {"pos_job_recent_gpu_share", "gauge",
       "The part of its GPU's turns an in-process job held in the last 3 s, 0 to 1 (-1: its GPU not contended).",
       [](const UsageRegion::Entry& e) { return e.recent_share < 0 ? -1.0 : static_cast<double>(e.recent_share) / 1000.0; }},
      {"pos_job_gpu_turn_seconds_total", "counter", "Time an in-process job held its GPU's turn while jobs contended for it.",
       [](const UsageRegion::Entry& e) { return static_cast<double>(e.gpu_ns) / 1e9; }},
  };
  for (const UsageFamily& f : ufam) {
    w.family(f.name, f.type, f.help);
    for (const UsageRegion::Entry& e : in.usage)
      w.sample(f.name, "pid=\"" + std::to_string(e.pid) + "\",device=\"" + std::to_string(e.device) + "\"", f.value(e));
  }
  return w.take();
}

std::vector<UsageRegion::Entry> usage_for(const std::string& jobs_dir, const std::string& kept) {
  const UsageRegionChoice use = choose_usage_region(jobs_dir, kept);
  if (::access(use.path.c_str(), F_OK) != 0) return {};
  auto region = UsageRegion::open(use.path, use.access);
  return region.ok() ? (*region)->list() : std::vector<UsageRegion::Entry>{};
}

std::vector<PolicyStatus> policies_for(const std::vector<SessionInfo>& sessions, const std::string& jobs_dir) {
  std::map<uint32_t, PolicyStatus> by_pid;
  for (PolicyStatus& p : list_policy_statuses(jobs_dir)) by_pid[p.pid] = std::move(p);
  for (const SessionInfo& s : sessions) {
    const std::string dir = jobs_dir_of_process(static_cast<pid_t>(s.pid));
    if (dir.empty() || dir == jobs_dir) continue;
    auto p = read_policy_status(policy_status_path(dir, s.pid));
    if (p.ok()) by_pid[s.pid] = std::move(*p);
  }
  std::vector<PolicyStatus> out;
  for (auto& [pid, p] : by_pid) out.push_back(std::move(p));
  return out;
}

uint64_t own_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& address, std::function<std::string()> body) {
  auto endpoint = parse_ipv4_endpoint(address, "posd.metrics");
  if (!endpoint.ok()) return endpoint.status();
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->body_ = std::move(body);
  auto server = TcpServer::start(*endpoint, 16, "metrics", [p = m.get()](int fd, const std::string&) { p->answer(fd); });
  if (!server.ok()) return server.status();
  m->server_ = std::move(*server);
  return m;
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::answer(int fd) {
  const timeval tv{2, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string req;
  char buf[1024];
  while (req.size() < 8192 && req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string line = req.substr(0, req.find_first_of("\r\n"));
  std::string status = "200 OK", body;
  if (line.rfind("GET ", 0) != 0 && line.rfind("HEAD ", 0) != 0) {
    status = "405 Method Not Allowed", body = "only GET /metrics\n";
  } else {
    const size_t a = line.find(' ') + 1, b = line.find(' ', a);
    const std::string path = line.substr(a, b == std::string::npos ? std::string::npos : b - a);
    if (path == "/metrics" || path.rfind("/metrics?", 0) == 0) body = body_();
    else status = "404 Not Found", body = "posd serves its metrics at /metrics\n";
  }
  const std::string head = "HTTP/1.0 " + status + "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                           "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  const std::string all = line.rfind("HEAD ", 0) == 0 ? head : head + body;
  size_t off = 0;
  while (off < all.size()) {
    const ssize_t n = ::send(fd, all.data() + off, all.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace pos
