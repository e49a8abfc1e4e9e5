// control_client.h — the operator's side of posd's control socket (pos-cli ps and, later, dump,
// restore, migrate). Never linked into the client library that runs inside applications.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pos/backend.h"
#include "pos/base/status.h"
#include "remoting/common/unique_fd.h"

namespace pos {

// One control request ("ps", "ps-table") to posd; returns its reply text.
StatusOr<std::string> posd_control(const std::string& socket_path, const std::string& command);

// What a checkpoint of a job's GPU state stored (docs/cli.md, `pos-cli dump`).
struct CheckpointReport {
  uint64_t cut_pc = 0, handles = 0, bytes_stored = 0, bytes_referenced = 0;
  uint64_t bytes_from_image = 0;  // lazy_ok: of bytes_stored, copied from the image a lazy restore loads
  double stall_s = 0, total_s = 0;
  std::string image;  // where: DIR/gpu
};
// Asks posd to checkpoint the GPU state of the job whose client has pid `pid` into `dir`/gpu while
// it runs (made if missing; `dir` must not hold a `gpu` image yet). The image is written through
// this process's descriptor of `dir`, so `dir` needs to be writable by the caller only. `progress`
// gets device bytes stored so far and the total, about ten times a second.
// `on_cut` is called once the cut is taken (with its call number), before the drain ends.
// `lazy_ok`: a job still loading a lazy restore is checkpointed at once (docs/cli.md, --lazy-ok).
// `on_written`: told of each range of a memory file of `dir`/gpu.partial once posd has written it
// (best effort: posd drops what does not fit the socket; the files are whole once this returns).
StatusOr<CheckpointReport> posd_checkpoint(const std::string& socket_path, uint32_t pid, const std::string& dir,
                                           bool async, const std::function<void(uint64_t, uint64_t)>& progress = {},
                                           const std::function<void(uint64_t)>& on_cut = {},
                                           const std::string& prev_dir = {}, bool lazy_ok = false,
                                           bool peer = false,
                                           const std::function<void(const std::string& file, uint64_t offset,
                                                                    uint64_t length)>& on_written = {});

// What an incremental checkpoint of the job against the image in `prev_dir` (one posd took of
// this job, as for posd_checkpoint's prev_dir) would store if taken now: bytes_stored,
// bytes_referenced, handles, and cut_pc the next call's number. Nothing is cut, written or waited
// for (the job's queued GPU work included); the job writes on meanwhile.
// since_call > 0: the bytes of buffers the job wrote at or after that call instead, rewrites
// included (checkpoint flag 32); the report's cut_pc is the next call's number either way.
StatusOr<CheckpointReport> posd_estimate_increment(const std::string& socket_path, uint32_t pid, const std::string& prev_dir,
                                                   uint64_t since_call = 0);

// Asks posd to detach the job whose client has pid `pid` (docs/dump_restore.md): returns once its
// shim has released its session (every call it made handled), with the session token. The job's
// calls wait until the file `permit` (an absolute path) appears, or `timeout_ms` passes; then it
// re-attaches by itself.
// *arena_bytes (if given) gets the size of the job's session arena, which a restore needs.
StatusOr<std::string> posd_detach(const std::string& socket_path, uint32_t pid, const std::string& permit,
                                  uint32_t timeout_ms, uint64_t* arena_bytes = nullptr);
// `pos-cli restore`'s GPU half (docs/dump_restore.md), in two steps on one connection.
struct RestoreRequest {
  uint32_t pid = 0, uid = 0;  // the dumped job's
  uint64_t arena_bytes = 0;
  std::string token, job;
  bool lazy = false;
  // pos-cli migrate's peer switch: the source session's memory (posd_peer_export), from which the
  // image's in_peer buffers are copied. Not with lazy.
  const std::vector<PeerMemory>* peer = nullptr;
  // With peer: the table is a staging session's memory, which holds the image of this id restored;
  // the buffers this image takes from that one are copied from it (lazy allowed: for the rest).
  std::string staged_image;
  // A staging restore (a migration target's, docs/migration.md "Staged at the target"): the session
  // restores `dir` eagerly and, once it answered, sends its memory (recv_peer_table on the pending
  // connection); closing the connection ends it. Alone: no lazy, no peer.
  bool stage = false;
};
struct PendingRestore {
  UniqueFd sock;        // open until finish_restore; closing it abandons the restore
  double gpu_s = 0;     // posd's time to rebuild the GPU state
  uint64_t bytes = 0, handles = 0;  // device memory and handles of the restored client
  double welcome_s = 0;  // from the connect to the session's Welcome
  double table_s = 0;    // kRestorePeer: sending the peer table
};
// Asks posd to rebuild the job's GPU state from `dir`/gpu (through this process's descriptor of
// `dir`) in a new session process, which then waits for the job to re-attach with `token`. Returns
// once the GPU state is up.
StatusOr<PendingRestore> begin_restore(const std::string& socket_path, const std::string& dir, const RestoreRequest& r);
// Tells the session CRIU restored the job as `pid`, and waits (up to a minute) until the job has
// re-attached to it.
Status finish_restore(PendingRestore& pending, uint32_t pid);
// finish_restore's two halves: the job is `pid` (from now on the session waits for it, a minute at
// most, whoever holds `pending`), then its answer once the job has re-attached.
Status send_restore_go(PendingRestore& pending, uint32_t pid);
Status await_restore(PendingRestore& pending);

// pos-cli migrate's live switch: the job `pid`, detached from the posd at `socket_path` with
// `token`, re-attached to another posd; its session here ends (wire::ReleaseBody).
Status posd_release(const std::string& socket_path, uint32_t pid, const std::string& token);
// pos-cli migrate's peer switch: the job detached with `token` hands out its device memory, as
// descriptors (wire::PeerExportBody); its session stays detached.
StatusOr<std::vector<PeerMemory>> posd_peer_export(const std::string& socket_path, uint32_t pid, const std::string& token);

// Waits until the job `pid` has taken (removed) the permit `path`, it is gone, or 5 s have passed
// (a waiting job looks for its permit every 2 ms).
void wait_until_taken(const std::string& path, uint32_t pid);

// Lets a detached job re-attach: writes `permit` (atomically), naming the socket of the posd to
// come back to (empty: the one it left), owned by `owner` (the job's uid, so that it may remove
// the permit from a sticky directory once it has used it; -1: this process's).
Status grant_reattach(const std::string& permit, const std::string& socket_path = "", int64_t owner = -1);

// Where a dumped job will look for its permit: a name of 128 random bits in /dev/shm (else /tmp):
// outside the image directory, so that the image can move, and in a directory every user can
// reach, so that a job that is not root can read it.
StatusOr<std::string> new_permit_path();

}  // namespace pos
