// session_process.h — posd.isolation: process. posd brokers: it admits a connection, then starts a
// session process (posd-session) that owns a GPU context of its own and serves that one client.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "pos/base/status.h"
#include "pos/client.h"
#include "pos/config.h"
#include "remoting/common/unique_fd.h"

namespace pos {

// posd ↔ session process: one SOCK_SEQPACKET socketpair, the session process's descriptor 3 (its
// client's connection is descriptor 4). posd sends one Start; the session process answers every
// kStatsRequest with a Report. posd closing its end ends the session (so does posd dying).
namespace session_channel {
inline constexpr uint32_t kMagic = 0x53534f50;  // "POSS"
inline constexpr uint32_t kVersion = 1;
// kRestore: descriptor 4 is pos-cli's connection, 5 the image directory.
inline constexpr int kChannelFd = 3, kClientFd = 4, kDirFd = 5;
inline constexpr uint32_t kMaxConfigBytes = 1u << 20;
inline constexpr uint32_t kMaxJobBytes = 1024;

// kSpare: no client yet. The process brings its backend up, then waits for a second Start
// (kServe or kRestore, the same layout) that brings its descriptors along (SCM_RIGHTS: the
// client's connection, then a restore's image directory); posd.spare_session.
enum class Kind : uint32_t { kServe = 1, kProbe = 2, kRestore = 3, kSpare = 4 };
// kCheckpoint carries two descriptors (SCM_RIGHTS): pos-cli's connection and the image directory;
// the session process answers pos-cli on that connection (wire::ControlEvent), not posd.
// kDetach carries pos-cli's connection (answered by the session process); kReattach the job's new
// connection and the session memfd the job maps.
// kRelease: the detached job re-attached to another posd (migrate's live switch): the session ends.
// kLimit: what flags says changes (pos-cli limit): kLimitMemory, the client's device-memory quota
// becomes stats.memory_quota; kLimitShare, its GPU-time share becomes `share` (per mille). Answered
// with a report, as kStatsRequest is (code and message: a refused change; share: the share now).
// kPeerExport carries pos-cli's connection: the detached job's device memory goes to pos-cli as a
// peer table (posd checked the detach's token; answered by the session process).
enum class Type : uint32_t {
  kStatsRequest = 1, kReport = 2, kCheckpoint = 3, kDetach = 4, kReattach = 5, kRelease = 6, kLimit = 7,
  kPeerExport = 8
};

// posd → session process, once: then `job_len` bytes of job name and `config_len` bytes of
// config_to_yaml's text, in the same packet.
struct Start {
  uint32_t magic = kMagic, version = kVersion;
  uint32_t kind = 0;
  int32_t pid = 0;  // the client's
  uint32_t uid = 0, job_len = 0;
  uint64_t generation = 0, arena_bytes = 0;
  uint32_t config_len = 0;
  uint32_t flags = 0;  // kRestore: wire::RestoreFlags
};

// Either way, fixed size.
struct Message {
  uint32_t magic = kMagic;
  uint32_t type = 0;
  // Report: the probe's result (code 0: the backend came up) or the session's state.
  int32_t code = 0, api_error = 0;
  int32_t device_count = 0;  // probe: the backend's devices
  int32_t device = 0;        // session: the backend device its state is on
  uint64_t uuid = 0;         // session: its client's uuid, 0 while it starts
  uint64_t frames = 0;
  uint32_t ending = 0;
  uint32_t mode = 0;  // kCheckpoint: wire::CheckpointKind
  uint32_t timeout_ms = 0;  // kDetach
  uint32_t flags = 0;       // kCheckpoint: wire::kCheckpoint* flags
  char token[64] = {};                    // kDetach: the session token
  char permit[512] = {};                  // kDetach: the permit file's path
  char parent[512] = {};  // kCheckpoint, incremental: the parent's path as the image records it
  ClientStats stats{};
  char backend[32] = {};
  char message[512] = {};
  uint32_t share = 0;  // kLimit (kLimitShare) and its report: the GPU-time share, per mille
  uint32_t reserved = 0;
  uint64_t since_call = 0;  // kCheckpoint with wire::kCheckpointSince: the first call counted
};
inline constexpr uint32_t kLimitMemory = 1, kLimitShare = 2;
}  // namespace session_channel

// The session process's program: posd.session_binary, else $POS_SESSION_BINARY, else posd-session
// beside libpos_posd (the build tree) or in ../libexec/pos of it or of the running program (an
// install). Not found: an error that says where it looked and what to set.
StatusOr<std::string> find_session_binary(const Config& config);

// A started session process: its pid and posd's end of its channel.
struct SessionProcess {
  pid_t pid = -1;
  UniqueFd channel;
};

// The environment a session process gets: this process's as it is now. Taken once, when posd
// starts, so that spawning never reads `environ` while an embedder's thread changes it.
std::vector<std::string> environment_snapshot();

// Starts `binary` with the channel as descriptor 3, `client_fd` (may be -1: a probe) as 4 and
// `dir_fd` (may be -1; a restore's image directory) as 5, in a
// process group of its own (a terminal's Ctrl-C reaches posd, which ends sessions in order), with
// no signal blocked and environment `env`, and sends it `start` with the job and posd's config.
StatusOr<SessionProcess> spawn_session_process(const std::string& binary, int client_fd,
                                               session_channel::Start start, const std::string& job,
                                               const std::string& config_yaml, const std::vector<std::string>& env,
                                               int dir_fd = -1);

// A session process started ahead of its client (Kind::kSpare): its backend comes up meanwhile.
StatusOr<SessionProcess> spawn_spare_session(const std::string& binary, const std::string& config_yaml,
                                             const std::vector<std::string>& env);
// Gives a spare what spawn_session_process gives a new process: `start` (kServe or kRestore) with
// the job and config, `client_fd` and `dir_fd` (-1: none). Fails if the spare has ended.
Status hand_to_spare(const SessionProcess& spare, int client_fd, session_channel::Start start, const std::string& job,
                     const std::string& config_yaml, int dir_fd = -1);

// Sends a request and waits up to `timeout` for its Report. An ended process is kUnavailable.
StatusOr<session_channel::Message> query_session(int channel, std::chrono::milliseconds timeout);

// Waits up to `timeout` for a Report the process sends unasked (a probe's result).
StatusOr<session_channel::Message> await_report(int channel, std::chrono::milliseconds timeout);

// "exited with status 3", "was killed by signal 11 (Segmentation fault)".
std::string describe_wait_status(int status);

// waitpid for up to `timeout`, then SIGKILL and wait. Returns the wait status.
int wait_or_kill(pid_t pid, std::chrono::milliseconds timeout);

// The session process's main (tools/posd_session.cc): reads the Start from descriptor 3 and serves
// the client on descriptor 4, or answers a probe. Returns the exit status.
int session_process_main();

}  // namespace pos
