// migration_peer.h — the migration stream between two posd hosts (docs/migration.md, "Across
// hosts"): a peer authenticated by a shared secret sends image directories; the receiving posd
// writes them (every path, size and checksum checked) and restores the job on request.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/status.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"

namespace pos {

// A shared secret from a file: at least 16 bytes (a trailing newline is not part of it), a regular
// file owned by this user or root that group and others can neither read nor write.
StatusOr<std::string> read_migration_secret(const std::string& path);

// Test hook: the next `n` chunks of file bytes that send_dir sends carry a wrong CRC-32C, as a
// chunk damaged on the way would (n = 0 ends it). Thread-safe.
void damage_sent_chunks_for_test(int n);

struct MigrationServerOptions {
  std::string listen;       // HOST:PORT (port 0: any free one)
  std::string secret;       // the shared secret's bytes
  std::string dir;          // where incoming images go: DIR/<peer>-<random>, removed after
  std::string posd_socket;  // this posd's socket: restores go into it
  std::string cli;          // the pos-cli that restores (`restore -D ... --socket ... --json`)
  // Called once a peer has authenticated, before its first frame: posd starts what the job's
  // restore will need (PosdServer::expect_incoming_job). On the server's thread; must not block.
  std::function<void()> on_authenticated;
  // Called as that migration's connection ends, however it ended (PosdServer::incoming_job_done).
  std::function<void()> on_finished;
};

// posd's side. One migration at a time, on its own thread; each connection must authenticate
// within 10 s and never waits more than 2 minutes for the peer's next frame.
class MigrationServer {
 public:
  static StatusOr<std::unique_ptr<MigrationServer>> start(const MigrationServerOptions& options);
  ~MigrationServer();
  MigrationServer(const MigrationServer&) = delete;
  MigrationServer& operator=(const MigrationServer&) = delete;
  const std::string& address() const { return server_->address(); }

 private:
  MigrationServer() = default;
  void handle(int fd, const std::string& peer);

  MigrationServerOptions opt_;
  // How each migration ended, by id (only the server thread touches it): for a source that lost
  // the commit's answer.
  struct Outcome {
    bool committed = false;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Outcome> outcomes_;
  std::unique_ptr<TcpServer> server_;  // last: stopped (its thread joined) before the rest goes
};

// The sending side (pos-cli migrate --to HOST:PORT).
class MigrationLink {
 public:
  // Connects and authenticates both ways (each side proves it holds the secret); fails naming why.
  static StatusOr<std::unique_ptr<MigrationLink>> connect(const std::string& host_port, const std::string& secret);
  // Whether the peer runs on this machine (its boot id is ours): a restore there needs the job's
  // pid free here first.
  bool same_host() const { return same_host_; }
  // Sends `local_dir` (its directories, regular files and relative symbolic links) as `as`, a
  // relative path under the migration's directory on the peer.
  // Entries of `local_dir` named in `skip` (relative to it: "gpu", "gpu/memory.bin") are left out
  // (sent before, with send_dir of that entry alone).
  // A file of `local_dir` that was sent in parts (send_part) gets what was not sent yet, then its
  // size; it is not sent again.
  Status send_dir(const std::string& local_dir, const std::string& as, const std::vector<std::string>& skip = {});
  // A file that another process is still writing (the stop's GPU part while posd drains it, in any
  // order): bytes [offset, offset+length) of the open file `fd` are final, and go now to `as` at the
  // same offset (whole pages of zeros left out). The peer makes `as` at its first part; a send_dir
  // of its directory completes it. `fd` is duplicated at the first part of `as`. Thread-safe
  // against other send_part calls (each reads its part on its own thread; the sends take turns),
  // not against the other calls.
  Status send_part(const std::string& as, int fd, uint64_t offset, uint64_t length);
  // Makes the directory `as` on the peer (a parent for a send_dir of one of its entries).
  Status make_dir(const std::string& as);
  // Waits until the peer has written everything sent so far (or says why it could not).
  Status sync();
  // Asks whether the peer could restore a job that needs `needs` (lines "pid N", "path /ABS"):
  // fails naming what it lacks (a path, or a pid in use there; pids only across boots).
  Status check(const std::string& needs);
  // The image at `as` has its GPU part (`as`/gpu) and `as`/gpu-first (the job's pid, uid, arena
  // and token) at the peer: it may restore that part now, ahead of restore(as). No answer: a peer
  // that cannot restores it all at restore().
  Status prepare(const std::string& as, bool lazy);
  // The image at `staged` (a pre-copy round of a posd job) is whole at the peer: it may restore it
  // into a staging session now, so that prepare(as) copies from there what did not change since
  // instead of reading it (docs/migration.md, "Staged at the target"). No answer: best effort.
  Status stage(const std::string& staged, const std::string& as, bool lazy);
  // Waits (at most `seconds`, 1 to 30) until the peer's staging restore is ready: fails naming why
  // it is not (none runs, it ended, still loading). Before the stop: a staging restore still
  // loading slowed the stop it shared a machine with, and came late for its prepare.
  Status await_stage(uint32_t seconds);
  // The peer restores the image at `as` into its posd and holds the job (restored by CRIU, waiting
  // for its permit: no step runs); its pos-cli's output so far. `sent` runs once the request is
  // on its way, while the peer restores (pos-cli's fault point there).
  StatusOr<std::string> restore(const std::string& as, bool lazy, const std::function<void()>& sent = {});
  // The held job runs on at the peer: it is let re-attach (send_commit); await_commit fails if it
  // did not (then the peer has ended it) or if the answer was lost (then only the peer knows:
  // outcome()). Without a commit the peer ends the held job when the link closes.
  Status send_commit();
  Status await_commit();
  // This migration's id (the peer's), for outcome().
  const std::string& id() const { return id_; }
  // Closes the link (the peer then ends a job it holds uncommitted).
  void close();
  // How migration `id` ended at the peer, on a new connection: "committed" (the job runs there),
  // "ended" (it does not), or "unknown" (the peer forgot or never saw it). Retried for `seconds`
  // while the peer cannot be reached or is still busy with that migration's own connection.
  static StatusOr<std::string> outcome(const std::string& host_port, const std::string& secret, const std::string& id,
                                       double seconds);
  uint64_t bytes_sent() const { return bytes_; }

 private:
  MigrationLink() = default;
  // A file being sent in parts: its descriptor and the ranges sent (start → end, merged).
  struct PartOut {
    UniqueFd fd;
    std::map<uint64_t, uint64_t> sent;
  };
  Status send_range(const std::string& as, PartOut& p, uint64_t offset, uint64_t length);
  Status finish_part(const std::string& as, PartOut& p);
  UniqueFd fd_;
  std::string id_;
  bool same_host_ = false;
  uint64_t bytes_ = 0;
  // send_part may be called from several threads at once (nothing else meanwhile): part_mu_
  // guards parts_, each PartOut's `sent`, part_bufs_, bytes_ and the socket's writes.
  std::mutex part_mu_;
  std::map<std::string, PartOut> parts_;  // by remote name, until send_dir completes them
  std::vector<std::unique_ptr<char[]>> part_bufs_;  // chunks for send_range, one per caller at a time
};

}  // namespace pos
