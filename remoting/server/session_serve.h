// session_serve.h — one posd session: its shared memory (a sealed memfd, an eventfd, the arena
// page-locked), the welcome, and the loop that feeds ring frames to pos_process until hang-up or stop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "pos/base/status.h"
#include "pos/workspace.h"
#include "remoting/common/unique_fd.h"
#include "remoting/common/wire.h"

namespace pos {

// Detach and re-attach of one session (docs/dump_restore.md), between its serving loop and whoever
// asks (a session process's control thread). Thread-safe.
class SessionControl {
 public:
  SessionControl();
  // Asks the job's shim to detach and waits up to `timeout` until it has: every frame it published
  // handled, its shared memory and connection released. The session keeps its client meanwhile.
  Status detach(const wire::DetachRequest& request, std::chrono::milliseconds timeout);
  // Hands a re-attaching connection, and the session memfd its job maps, to a detached session's
  // loop (both taken only on success).
  Status reattach(UniqueFd& fd, UniqueFd& memfd);
  // A restored session (pos-cli restore): from now on it ends when process `pid` (the job CRIU
  // restored) ends; before this, only a re-attach, cancel() or posd's stop ends its wait.
  void watch_pid(int32_t pid);
  // Ends a detached session's wait for its job: the restore was abandoned.
  void cancel(const std::string& why);
  // The same, only while the session is detached with no re-attach under way (a job that came back
  // meanwhile keeps its session): whether it was cancelled.
  bool cancel_if_detached(const std::string& why);
  // Waits up to `timeout` for the session to be attached (a restored job's re-attach); false if it
  // ended first or the time passed.
  bool wait_attached(std::chrono::milliseconds timeout);
  bool detaching() const { return state_.load(std::memory_order_acquire) == kDetaching; }
  // The session's place in the usage region (pos-cli limit --gpu-share), while the serving loop has
  // one: set by the loop, used by the control thread.
  void set_share_slot(class SessionShare* share);
  Status set_gpu_share(uint32_t per_mille);
  uint32_t gpu_share() const;
  // Detached and no re-attach under way: nothing writes the job's device memory now.
  bool detached() const { return state_.load(std::memory_order_acquire) == kDetached; }

  // For the serving loop.
  void attached(int fd);
  void ended();
  // The job has let go of its connection: no detach request is sent on it any more.
  void mark_detached();
  // Detached: blocks until a re-attaching connection comes (returned, with the memfd that came with
  // it in *memfd), stop_fd fires, cancel() is called or the job's process `pid` (0: the one
  // watch_pid names) ends (a dump that ended it, a kill: empty, and *why says which).
  UniqueFd wait_for_reattach(int stop_fd, int32_t pid, std::string* why, UniqueFd* memfd);

 private:
  enum State : int { kStarting, kAttached, kDetaching, kDetached, kEnded };
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> state_{kStarting};
  mutable std::mutex share_mu_;
  class SessionShare* share_ = nullptr;  // guarded by share_mu_
  int fd_ = -1;         // the current attachment's connection (kAttached, kDetaching)
  UniqueFd pending_, pending_memfd_;  // a re-attaching connection and its memfd, for the loop
  UniqueFd wake_;       // eventfd: the loop waits on it while detached
  int32_t watch_pid_ = 0;   // guarded by mu_
  std::string cancelled_;   // guarded by mu_: why the wait was abandoned
};

// What posd knows of an admitted session when it starts serving it.
struct SessionSpec {
  int fd = -1;  // the client's connection, blocking; the serving side shuts it down when done
  int32_t pid = 0;
  uint32_t uid = 0;
  std::string job;  // printable (made so at the hello)
  uint64_t arena_bytes = 0;
  std::vector<int32_t> devices;  // posd.devices
  uint64_t generation = 0;       // the client's uuid generation; 0: the workspace's next
  uint64_t memory_quota = ClientOptions::kConfigQuota;  // posd.limits' for the job (0: none)
  // A session process: it joins posd's user's usage region (one accounting with that user's
  // in-process jobs) with posd.limits' GPU-time share for the job, per mille (0: none).
  bool join_usage = false;
  uint32_t gpu_share = 0;
  uint32_t sms = 0;  // posd.limits' SM limit for the job (0: none)
  int stop_fd = -1;              // readable once the session is to end (posd stopping)
  SessionControl* control = nullptr;  // detach and re-attach; none: a hang-up always ends the session
  // A restored session (pos-cli restore): its client exists already (restored from the image) and
  // the session starts detached, waiting for the job to re-attach with the memfd it maps, which
  // then goes at `reserved` (an address range of the layout for arena_bytes, reserved by the caller,
  // where the client's host range already points). Needs `control`.
  uint64_t restored_uuid = 0;
  void* reserved = nullptr;
  std::function<bool()> keep_spinning;  // false once the session is to end: an idle loop stops spinning
};

// What the serving side publishes for `pos-cli ps` (read from any thread).
struct SessionProgress {
  std::atomic<uint64_t> uuid{0};  // the client's, once it exists
  std::atomic<uint64_t> frames{0};
};

// Serves one session on `ws` until the client hangs up, sends a malformed frame or stop_fd fires,
// then removes its client (all its device memory freed). A session that cannot start is refused
// with a welcome that says why. posd runs it in a thread of its own (posd.isolation: shared) or a
// session process runs it (process).
void serve_session(POSWorkspace& ws, const SessionSpec& spec, SessionProgress* progress);

// A refusal is one welcome, which fits in a fresh socket's buffer: sent without waiting, so a peer
// that never reads cannot hold posd up (if it does not fit, the peer learns by the close).
void refuse_connection(int fd, const Status& why);

}  // namespace pos
