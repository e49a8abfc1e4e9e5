// posd.cc — the POS daemon: owns the GPU and serves unmodified CUDA programs that load
// libpos_client.so (docs/remoting.md). A thin main over remoting/posd_server.
#include <csignal>
#include <unistd.h>
#include <cstdio>
#include <ctime>
#include <memory>
#include <cstring>
#include <string>

#include <pthread.h>

#include "pos/base/log.h"
#include "pos/config.h"
#include "remoting/common/job_control.h"
#include "remoting/server/metrics.h"
#include "remoting/server/migration_peer.h"
#include "remoting/server/posd_server.h"

namespace {
int usage() {
  std::fprintf(stderr,
               "usage: posd [--config FILE] [--socket PATH] [--backend host|cuda]\n"
               "  Serves CUDA programs run with LD_PRELOAD=libpos_client.so. Stops cleanly on SIGTERM or SIGINT.\n"
               "  Config: YAML (docs/configuration.md): --config FILE, else $POS_CONFIG, else defaults.\n"
               "  POS_BACKEND / POS_LOG_LEVEL override the file; --socket / --backend override both.\n");
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  std::string config_path, socket, backend;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--config" || a == "--socket" || a == "--backend") && i + 1 < argc) {
      (a == "--config" ? config_path : a == "--socket" ? socket : backend) = argv[++i];
    } else {
      return usage();
    }
  }
  // The environment overrides the file on both paths: config_from_environment applies it to
  // $POS_CONFIG's file, and here it is applied to --config's.
  auto cfg = config_path.empty() ? pos::config_from_environment() : pos::load_config_file(config_path);
  if (cfg.ok() && !config_path.empty()) {
    if (pos::Status s = pos::apply_environment_overrides(&cfg.value()); !s.ok()) cfg = s;
  }
  if (!cfg.ok()) {
    pos::log_line(pos::LogLevel::kError, "posd", "%s", cfg.status().to_string().c_str());
    return 1;
  }
  if (!socket.empty()) cfg->posd_socket = socket;
  if (!backend.empty()) {
    if (backend != "host" && backend != "cuda") return usage();
    cfg->backend = backend;
  }
  // Signals go to this thread only (sigwait below), never to a session thread mid-call.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto srv = pos::PosdServer::start(*cfg);
  if (!srv.ok()) {
    pos::log_line(pos::LogLevel::kError, "posd", "%s", srv.status().to_string().c_str());
    return 1;
  }
  // Where it listens and that it stopped are printed at every log level (an operator always needs
  // them), so these lines skip POS_INFO's level check; PosdServer itself does not print them.
  pos::log_line(pos::LogLevel::kInfo, "posd", "listening on %s (%s backend)", (*srv)->socket_path().c_str(),
                cfg->backend.c_str());
  std::unique_ptr<pos::MetricsServer> metrics;
  if (!cfg->posd_metrics.empty()) {
    pos::PosdServer* server = srv->get();
    const std::string backend_name = cfg->backend, jobs_dir = pos::default_jobs_dir(), kept = cfg->posd_usage_region;
    auto m = pos::MetricsServer::start(cfg->posd_metrics, [server, backend_name, jobs_dir, kept] {
      pos::MetricsInput in;
      in.backend = backend_name;
      in.sessions = server->sessions();
      in.policies = pos::policies_for(in.sessions, jobs_dir);
      in.now = static_cast<uint64_t>(std::time(nullptr));
      in.posd_rss_bytes = pos::own_rss_bytes();
      in.usage = pos::usage_for(jobs_dir, kept);
      return pos::render_metrics(in);
    });
    if (!m.ok()) {
      pos::log_line(pos::LogLevel::kError, "posd", "%s", m.status().to_string().c_str());
      (*srv)->stop();
      return 1;
    }
    metrics = std::move(*m);
    pos::log_line(pos::LogLevel::kInfo, "posd", "metrics on http://%s/metrics", metrics->address().c_str());
  }
  // Jobs migrated in from other hosts (docs/migration.md): only with a secret a peer must prove.
  std::unique_ptr<pos::MigrationServer> migration;
  if (!cfg->posd_migration.listen.empty()) {
    const auto& mc = cfg->posd_migration;
    pos::StatusOr<std::string> secret =
        mc.secret_file.empty() ? pos::Status::InvalidArgument("posd.migration.listen needs posd.migration.secret_file")
                               : pos::read_migration_secret(mc.secret_file);
    pos::StatusOr<std::unique_ptr<pos::MigrationServer>> m = secret.status();
    if (secret.ok()) {
      pos::MigrationServerOptions mo;
      mo.listen = mc.listen, mo.secret = *secret, mo.dir = mc.dir, mo.posd_socket = (*srv)->socket_path();
      mo.cli = mc.cli;
      pos::PosdServer* server = srv->get();
      mo.on_authenticated = [server] { server->expect_incoming_job(); };
      mo.on_finished = [server] { server->incoming_job_done(); };
      if (mo.cli.empty()) {  // beside posd, as pos-cli is installed and built
        char self[4096];
        const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
        const std::string exe = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
        mo.cli = exe.substr(0, exe.rfind('/') + 1) + "pos-cli";
      }
      m = pos::MigrationServer::start(mo);
    }
    if (!m.ok()) {
      pos::log_line(pos::LogLevel::kError, "posd", "%s", m.status().to_string().c_str());
      metrics.reset();
      (*srv)->stop();
      return 1;
    }
    migration = std::move(*m);
    pos::log_line(pos::LogLevel::kInfo, "posd", "accepting migrations on %s (images into %s)", migration->address().c_str(),
                  mc.dir.c_str());
  }
  int sig = 0;
  sigwait(&set, &sig);
  migration.reset();
  metrics.reset();
  pos::log_line(pos::LogLevel::kInfo, "posd", "%s: ending %zu session(s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                (*srv)->sessions().size());
  (*srv)->stop();
  srv->reset();
  pos::log_line(pos::LogLevel::kInfo, "posd", "stopped");
  return 0;
}
