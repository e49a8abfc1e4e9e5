// config.h — POS configuration: backend, per-client limits, queues, logging. YAML (yaml-cpp).
// Every field has a default that works with no file; a bad file is refused with the key and line named.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pos/base/log.h"
#include "pos/base/parse.h"
#include "pos/base/status.h"

namespace pos {

// queues.delayed_verdict: auto = delayed unless the process has fewer than 8 cores.
enum class VerdictLook : uint8_t { kAuto = 0, kDelayed, kImmediate };

// posd.isolation (docs/isolation.md): where a session's calls run. process: in a session process
// of its own, which owns its GPU context (posd only brokers), so a client's kernels can address
// neither another's memory nor posd's, and a fault ends that session alone. shared: in a thread of
// posd, every client on posd's one context (faster to start, no fault containment).
enum class Isolation : uint8_t { kProcess = 0, kShared };

struct Config {
  std::string backend = "host";  // host | cuda
  LogLevel log_level = LogLevel::kWarn;

  // Clients
  uint32_t max_clients = 64;
  uint64_t memory_quota = 0;                 // bytes of device memory per client; 0 = no quota
  uint64_t va_base = 0x110000000000ull;      // 17 TiB: above ASan shadow, below PIE/heap (0x55..)
  uint64_t va_size = 0x10000000000ull;       // per client (1 TiB): its memory + opaque handle slots

  // Queues and threads
  uint32_t queue_depth = 4096;  // per queue; a full queue applies back-pressure to the caller
  // Spin before blocking (latency vs. idle CPU). 1 ms: a training loop's pipeline threads stay awake
  // across the CPU work between steps (a futex wake-up costs tens of µs on a VM; measured in
  // docs/BENCHMARKS.md), and a client idle for longer still costs nothing.
  uint64_t spin_ns = 1000000;
  // A caller waiting for a synchronous call's result, and a parser whose client has calls in flight,
  // spin (yielding the core between rounds) this long before blocking: a job between two
  // dependent calls is not idle, and a futex wake-up costs tens of µs on a VM. Native CUDA spins too.
  uint64_t sync_spin_ns = 2000000;
  bool record_latency = false;  // keep a pos_process → worker-completion histogram per client
  // A caller of a parse-returnable call (a launch) first reads the parser's verdict only after an
  // adaptive delay, so that the parser's store does not have to take the line back from a poller
  // (docs/threads_and_queues.md, "Waiting for the verdict"). Auto: not where cores are scarce,
  // where the delay would hold the core the parser needs.
  VerdictLook delayed_verdict = VerdictLook::kAuto;

  // Host backend
  uint32_t host_device_count = 1;
  uint64_t host_device_memory = 16ull << 30;
  std::string host_device_name = "POS Host Device";

  // Checkpointing: the bound on device memory for async copy-on-write shadows per checkpoint. (Each
  // checkpoint request names its own mode, docs/checkpoint.md: there is no default mode to set.)
  uint64_t shadow_pool_bytes = 0;
  // Copies into images in pageable host memory go through page-locked staging, by several threads
  // at once (docs/cuda_backend.md): the threads (0: auto, min(8, cores)) and the staging they share.
  uint32_t ckpt_copy_threads = 0;
  uint64_t ckpt_staging_bytes = 32ull << 20;
  // checkpoint.keep_shadows: device memory that one async checkpoint's copy-on-write shadows used
  // stays reserved for the next one (so that a tick does not wait for the driver to map it
  // afresh); the job's own allocations take it back when they need the room. Unset (auto): kept
  // in the sessions of jobs posd.checkpoint_policy names, whose checkpoints come every few seconds.
  std::optional<bool> ckpt_keep_shadows;

  // posd (docs/remoting.md): where it listens, who may connect, each session's shared arena.
  // Empty: $POS_SOCKET, else the user's private default (/run/pos/posd.sock for root; docs/remoting.md,
  // "Where posd listens"). Its directory must be posd's uid's alone; posd makes it if missing.
  std::string posd_socket;
  // Also admit members of this group (the socket becomes 0660): a gid, or a group name that posd
  // resolves at start (an unknown name is a start error). Empty: the owner's uid only.
  std::string posd_group;
  // The devices each session sees, renumbered 0..k-1 as CUDA_VISIBLE_DEVICES does; its state
  // starts on the first (docs/api_set.md, cudaSetDevice). Empty: all of the backend's devices. Checked against
  // the backend's device count when posd starts.
  std::vector<int32_t> posd_devices;
  // Connections accepted whose hello has not all arrived (each must within 5 s): beyond them posd
  // refuses a connection at once. posd reads hellos in one thread, so they cost no thread each.
  uint32_t posd_max_pending = 32;
  uint64_t posd_arena_bytes = 256ull << 20;  // a session's arena unless the client asks
  uint64_t posd_arena_max = 4ull << 30;      // the most a client may ask for
  // Host backend only: shared libraries of host kernels (the test double's stand-in for device code).
  std::vector<std::string> host_kernel_libraries;
  Isolation posd_isolation = Isolation::kProcess;
  // posd.spare_session: with isolation: process, posd keeps one session process started ahead,
  // its backend up (for CUDA: a context, ~0.3 s to make), and hands it the next job or restore, so
  // that neither waits for it; then starts the next spare. Costs one idle context's device memory.
  bool posd_spare_session = false;
  // posd.checkpoint_staging_ahead: every job's session page-locks its checkpoint staging (16
  // chunks of 8 MiB on a 16-core host) as it starts, instead of at its first checkpoint, where the
  // driver held the job's GPU work for the ~60-70 ms it takes (the H200). Sessions of jobs that
  // posd.checkpoint_policy names do so whatever this says (docs/continuous_checkpointing.md).
  bool posd_checkpoint_staging_ahead = false;
  // The session process's program (posd-session). Empty: $POS_SESSION_BINARY, else found beside
  // libpos_posd or posd (docs/remoting.md, "Session processes").
  std::string posd_session_binary;
  // Where posd serves Prometheus metrics, "HOST:PORT" (IPv4; port 0: any free one, logged at
  // start). Empty: no metrics endpoint (docs/metrics.md).
  std::string posd_metrics;
  // posd.usage_region: the usage region posd keeps for the jobs of several users (absolute; "":
  // each user's own JOBS_DIR/usage, as before): made at start, shared with posd.group (0660);
  // posd's sessions join it, and in-process jobs whose POS_USAGE_REGION names it (docs/limits.md).
  std::string posd_usage_region;
  // posd.checkpoint_policy: continuous checkpoints posd starts for every session whose job name
  // matches one of `jobs` (shell patterns), each into DIR/<job>-<pid> through `pos-cli checkpoint`
  // run as posd's user (docs/continuous_checkpointing.md). No patterns: none.
  struct CheckpointPolicyDefaults {
    std::vector<std::string> jobs;
    std::string every = "30s";  // checked when posd starts (pos-cli's intervals: 30s, 500ms, 2m)
    std::string dir;            // required with jobs; absolute
    uint32_t keep = 3, full_every = 10;
    bool async = true, with_cpu = false;
    std::string cli;  // the pos-cli to run; empty: beside posd, else on PATH
  } posd_policy;
  // posd.limits: per-job limits by job name (docs/limits.md): the first rule whose `jobs` patterns
  // (shell: "train*", against the session's job name, the program's full file name) match gives
  // the job's device-memory quota in place of client.memory_quota (0: none) and its GPU-time share.
  struct JobLimits {
    std::vector<std::string> jobs;
    uint64_t memory = UINT64_MAX;  // UINT64_MAX: not set by this rule (client.memory_quota)
    uint32_t gpu_share = 0;        // per mille of its GPU's time (0: none)
    uint32_t sms = 0;              // the SMs its kernels may run on (0: all; CUDA backend, docs/limits.md)
  };
  std::vector<JobLimits> posd_limits;
  // posd.migration: jobs migrated in from posd on other hosts (pos-cli migrate --to HOST:PORT):
  // where posd listens (IPv4 HOST:PORT; empty: it accepts none), the file holding the secret a
  // peer must prove it shares, where incoming images go, and the pos-cli that restores them
  // (docs/migration.md, "Across hosts").
  struct MigrationListen {
    std::string listen, secret_file, dir = "/var/tmp/pos-migrations", cli;
  } posd_migration;
};

// The config as a YAML document parse_config reads back to the same values (spin times to the
// microsecond, as the file gives them): how posd hands its config to a session process.
std::string config_to_yaml(const Config& c);

// Parse a YAML document strictly: unknown or repeated keys, values of the wrong type, malformed or
// out-of-range numbers and sizes are errors that name the key path (e.g. `posd.arena`) and the
// line (1-based). Never throws.
StatusOr<Config> parse_config(const std::string& yaml_text);
// The file's text through parse_config; errors start with the path. A directory, a missing or an
// unreadable file is an error.
StatusOr<Config> load_config_file(const std::string& path);
// The environment's word over a loaded config: POS_BACKEND (host|cuda) and POS_LOG_LEVEL
// (error|warn|info|debug), when set and not empty. Every path that loads a config applies it (this
// function, config_from_environment, posd --config), so the environment always overrides the file.
Status apply_environment_overrides(Config* c);
// POS_CONFIG names a file if set; otherwise defaults. Then apply_environment_overrides.
StatusOr<Config> config_from_environment();

// The device-memory quota of a job named `job` (posd.limits' first matching rule; else
// client.memory_quota). 0: none.
uint64_t memory_quota_for_job(const Config& c, const std::string& job);
// Whether posd.checkpoint_policy's `jobs` patterns name the job.
bool policy_names_job(const Config& c, const std::string& job);
// Its GPU-time share, per mille (posd.limits' first matching rule; 0: none).
uint32_t gpu_share_for_job(const Config& c, const std::string& job);
// The SM limit of the first posd.limits rule that names the job (0: none).
uint32_t sms_for_job(const Config& c, const std::string& job);

}  // namespace pos
