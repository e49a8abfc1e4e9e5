// session_process.cc — both ends of posd.isolation: process. posd's side starts posd-session and
// asks it for its state; the session process's side serves one client on a workspace of its own.
#include "remoting/server/session_process.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <mutex>
#include <set>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ckpt/image.h"
#include "pos/base/log.h"
#include "pos/base/thread.h"
#include "pos/checkpoint/checkpoint.h"
#include "pos/checkpoint/lazy_restore.h"
#include "pos/runtime.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/wire.h"
#include "remoting/server/peer_transfer.h"
#include "remoting/server/session_serve.h"

extern char** environ;

namespace pos {

namespace sc = session_channel;

namespace {

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string("./") : path.substr(0, slash + 1);
}

bool executable_file(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

// One packet, waiting at most `timeout`. kUnavailable once the peer is gone.
StatusOr<size_t> recv_packet(int fd, void* buf, size_t cap, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
    if (n == 0) return Status(Code::kNotReady, 0, "no answer within " + std::to_string(timeout.count()) + " ms");
    const ssize_t r = ::recv(fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) return Status::Unavailable(std::string("recv: ") + std::strerror(errno));
    if (r == 0) return Status::Unavailable("the session process has ended");
    if (static_cast<size_t>(r) > cap) return Status::Corrupt("a packet of " + std::to_string(r) + " bytes does not fit");
    return static_cast<size_t>(r);
  }
}

Status send_packet(int fd, const void* data, size_t n) {
  for (;;) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w != static_cast<ssize_t>(n)) return Status::Unavailable(std::string("send: ") + std::strerror(errno));
    return Status::Ok();
  }
}

// The session process's half.

void report_status(int channel, const Status& s, int device_count, const std::string& backend) {
  sc::Message m;
  m.type = static_cast<uint32_t>(sc::Type::kReport);
  m.code = static_cast<int32_t>(s.code());
  m.api_error = s.api_error();
  m.device_count = device_count;
  wire::put_cstr(m.backend, sizeof(m.backend), backend);
  wire::put_cstr(m.message, sizeof(m.message), s.message());
  (void)send_packet(channel, &m, sizeof(m)).ok();
}

// One operation at a time (a checkpoint, a detach), in a thread of its own: the control thread
// stays free for ps while it runs.
class OneAtATime {
 public:
  ~OneAtATime() {
    if (thread_.joinable()) thread_.join();
  }
  // False, and `body` neither run nor moved from, while the previous one runs. A thread the
  // kernel refuses drops `body` (and what it holds) unrun.
  template <typename F>
  bool start(const char* what, const char* thread_name, F&& body) {
    if (busy_.load(std::memory_order_acquire)) return false;
    if (thread_.joinable()) thread_.join();
    busy_.store(true, std::memory_order_release);
    auto run = [this, thread_name, b = std::forward<F>(body)]() mutable {
      name_this_thread(thread_name);
      b();
      busy_.store(false, std::memory_order_release);
    };
    if (!start_thread(&thread_, what, std::move(run)).ok()) busy_.store(false, std::memory_order_release);
    return true;
  }
  // From the running body, just before it answers its caller: a request the caller sends as soon
  // as it has the answer is taken (start joins what is left of this thread), not refused as busy.
  void finishing() { busy_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> busy_{false};
  std::thread thread_;
};

// Checkpoints of the session's client, one at a time; each answers pos-cli on its own connection.
class CheckpointRunner {
 public:
  // An image this session's client was rebuilt from (a restored session): its state at that
  // image's cut is the image's, so the image may be the parent of an incremental checkpoint.
  void adopt(const std::string& image_id) {
    std::lock_guard<std::mutex> lk(ids_mu_);
    ids_.insert(image_id);
  }
  // Takes the descriptors (`prev`: an incremental one's previous image directory, else empty). A
  // second request while one runs is refused on its own connection.
  void start(POSWorkspace* ws, uint64_t uuid, UniqueFd client, UniqueFd dir, UniqueFd prev, uint32_t mode,
             uint32_t flags, std::string parent_path, uint64_t since_call) {
    const int c = client.get();
    // Named: a refused body is not moved from, so it still holds the connection for the refusal.
    auto body = [this, ws, uuid, cl = std::move(client), d = std::move(dir), p = std::move(prev), mode, flags,
                 pp = std::move(parent_path), since_call]() mutable {
      run(ws, uuid, cl.get(), d.get(), p.get(), mode, flags, pp, since_call);
    };
    if (!one_.start("the session process's checkpoint thread", "posd-session-ckpt", std::move(body)))
      refuse_connection(c, Status::Busy("a dump of this job is already running"));
  }

 private:
  // An incremental checkpoint stores only buffers written since its parent's cut, which is right
  // only if the parent is an image of this very client: one this session took, or the one it was
  // restored from. Anything else (another job's image, one taken before a restore from another)
  // is refused before the checkpoint starts.
  Status check_parent(const std::string& parent_dir) {
    auto img = ckpt::ImageReader::open_dir(parent_dir);
    if (!img.ok()) return img.status().with_context("the previous image");
    const std::string id = (*img)->inventory().image_id();
    std::lock_guard<std::mutex> lk(ids_mu_);
    if (ids_.count(id) == 0)
      return Status::FailedPrecondition("the previous image (GPU image " + id +
                                        ") was not taken from this job's current session: --prev must name an "
                                        "earlier dump or pre-dump of this same job, since its last restore");
    return Status::Ok();
  }

  void run(POSWorkspace* ws, uint64_t uuid, int client, int dir, int prev, uint32_t mode, uint32_t flags,
           const std::string& parent_path, uint64_t since_call) {
    int fl = ::fcntl(client, F_GETFL);
    if (fl >= 0) (void)::fcntl(client, F_SETFL, fl & ~O_NONBLOCK);
    timeval tv{10, 0};  // a pos-cli that stops reading loses its answer; the checkpoint goes on
    (void)setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    wire::Welcome w;
    (void)send_packet(client, &w, sizeof(w)).ok();
    wire::ControlEvent r;
    r.type = static_cast<uint32_t>(wire::EventType::kResult);
    const bool estimate = (flags & wire::kCheckpointEstimate) != 0 && prev >= 0;
    StatusOr<CheckpointResult> res = Status::Unavailable("the job's session is still starting; try again");
    if (uuid != 0) {
      CheckpointRequest req;
      req.mode = mode == static_cast<uint32_t>(wire::CheckpointKind::kAsync) ? CheckpointMode::kAsync : CheckpointMode::kSync;
      req.lazy_ok = (flags & wire::kCheckpointLazyOk) != 0;
      req.peer = (flags & wire::kCheckpointPeer) != 0;
      // Through the caller's own descriptor: posd's user never resolves the caller's path.
      req.dir = "/proc/self/fd/" + std::to_string(dir) + "/gpu";
      if (prev >= 0) {
        req.parent_dir = "/proc/self/fd/" + std::to_string(prev) + "/gpu";
        req.parent_path = parent_path;  // as the caller sees the two directories
      }
      auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
      req.progress = [&](uint64_t done, uint64_t total) {
        const auto now = std::chrono::steady_clock::now();
        if (done < total && now - last < std::chrono::milliseconds(100)) return;
        last = now;
        wire::ControlEvent p;
        p.type = static_cast<uint32_t>(wire::EventType::kProgress);
        p.done = done, p.total = total;
        wire::put_cstr(p.phase, sizeof(p.phase), "drain");
        (void)::send(client, &p, sizeof(p), MSG_NOSIGNAL | MSG_DONTWAIT);  // never holds the drainer up
      };
      // The cut, as soon as it is taken: a dump lets the job run on from there while the drain
      // goes on (async), so the caller learns of it before the result.
      req.on_cut = [client](uint64_t cut) {
        wire::ControlEvent c;
        c.type = static_cast<uint32_t>(wire::EventType::kProgress);
        c.cut_pc = cut;
        wire::put_cstr(c.phase, sizeof(c.phase), "cut");
        (void)::send(client, &c, sizeof(c), MSG_NOSIGNAL | MSG_DONTWAIT);
      };
      // Each range of a memory file once written (pos-cli migrate sends them on while the drain
      // goes on). From the writer's threads, one event at a time; never waited for: an event that
      // does not fit is dropped, and pos-cli sends what it was not told of once the image is done.
      std::mutex written_mu;
      if ((flags & wire::kCheckpointWrites) != 0)
        req.on_written = [client, &written_mu](const std::string& file, uint64_t off, uint64_t len) {
          wire::ControlEvent e;
          e.type = static_cast<uint32_t>(wire::EventType::kWritten);
          e.done = off, e.total = len;
          wire::put_cstr(e.phase, sizeof(e.phase), file);
          std::lock_guard<std::mutex> lk(written_mu);
          (void)::send(client, &e, sizeof(e), MSG_NOSIGNAL | MSG_DONTWAIT);
        };
      Status parent_ok = prev >= 0 ? check_parent(req.parent_dir) : Status::Ok();
      if (!parent_ok.ok()) res = parent_ok;
      else if (estimate) res = ws->estimate_increment(uuid, req.parent_dir, since_call);  // nothing cut, nothing written
      else res = ws->checkpoint(uuid, std::move(req));
    }
    if (res.ok() && estimate) {
      r.cut_pc = res->cut_pc, r.handles = res->handles;
      r.bytes_stored = res->bytes_stored, r.bytes_referenced = res->bytes_referenced;
      POS_DEBUG("posd-session", "estimate for client %lu at call %lu: %lu bytes written since the previous image",
                (unsigned long)uuid, (unsigned long)res->cut_pc, (unsigned long)res->bytes_stored);
    } else if (res.ok()) {
      adopt(res->image_id);
      r.cut_pc = res->cut_pc, r.handles = res->handles;
      r.bytes_stored = res->bytes_stored, r.bytes_referenced = res->bytes_referenced;
      r.bytes_from_image = res->bytes_from_image;
      r.stall_s = res->stall_s, r.total_s = res->total_s;
      POS_INFO("posd-session",
               "checkpoint of client %lu: cut %lu, %lu bytes in %.3f s (cut after %.3f s, drained in %.3f s; the job's "
               "calls waited %.1f ms for %.1f MB of copy-on-write shadows, %.1f ms of it allocating them; %.1f MB of "
               "shadows kept for the next)",
               (unsigned long)uuid, (unsigned long)res->cut_pc, (unsigned long)res->bytes_stored, res->total_s,
               res->to_cut_s, res->drain_end_s - res->drain_start_s, res->shadow_s * 1e3, res->shadow_bytes / 1e6,
               res->shadow_alloc_s * 1e3, res->shadow_kept / 1e6);
    } else {
      r.code = static_cast<int32_t>(res.status().code());
      r.api_error = res.status().api_error();
      wire::put_cstr(r.message, sizeof(r.message), res.status().message());
      POS_WARN("posd-session", "checkpoint of client %lu failed: %s", (unsigned long)uuid,
               res.status().to_string().c_str());
    }
    one_.finishing();  // pos-cli migrate asks its next round right after an estimate's answer
    (void)send_packet(client, &r, sizeof(r)).ok();
  }

  std::mutex ids_mu_;
  std::set<std::string> ids_;  // guarded by ids_mu_: GPU images of this client (see check_parent)
  OneAtATime one_;  // last: joined first, while the rest is alive
};

// pos-cli migrate's peer switch: the detached job's device memory, as descriptors, to pos-cli on
// `client` (a Welcome, then a peer table). Only while detached: then nothing writes that memory
// until the job re-attaches (here, if the switch fails, or at the target).
void export_peer(int client, POSWorkspace* ws, uint64_t uuid, SessionControl* ctl) {
  int fl = ::fcntl(client, F_GETFL);
  if (fl >= 0) (void)::fcntl(client, F_SETFL, fl & ~O_NONBLOCK);
  timeval tv{10, 0};
  (void)setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  wire::Welcome w;
  (void)send_packet(client, &w, sizeof(w)).ok();
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<std::vector<PeerMemory>> mem = Status::FailedPrecondition("the job is not detached from this session");
  if (ctl->detached()) {
    raise_descriptor_limit();  // one descriptor per range until pos-cli has them
    auto c = uuid != 0 ? ws->find_client(uuid) : nullptr;
    // Test hook (docs/migration.md, "Fault points"): POS_FAULT_POINT=peer-export-refused in this
    // posd's environment fails every export, as memory without a shareable handle does.
    const char* fp = std::getenv("POS_FAULT_POINT");
    if (fp != nullptr && std::strcmp(fp, "peer-export-refused") == 0)
      mem = Status::Unsupported("the export was refused (fault point peer-export-refused)");
    else if (c != nullptr) mem = c->export_peer_memory();
    else mem = Status::Unavailable("the job's session has no client (it is starting or ending)");
  }
  const auto t_exported = std::chrono::steady_clock::now();
  Status sent = mem.ok() ? send_peer_table(client, *mem) : send_peer_failure(client, mem.status());
  if (mem.ok()) {
    uint64_t bytes = 0;
    for (const PeerMemory& m : *mem) bytes += m.size;
    using sec = std::chrono::duration<double>;
    POS_INFO("posd-session", "handed %zu ranges (%lu bytes) of device memory to pos-cli in %.3f s (export %.3f s)%s",
             mem->size(), (unsigned long)bytes, sec(std::chrono::steady_clock::now() - t0).count(),
             sec(t_exported - t0).count(), sent.ok() ? "" : " (it did not take them)");
  } else {
    POS_WARN("posd-session", "peer export refused: %s", mem.status().to_string().c_str());
  }
}

// Answers posd's requests until posd closes the channel (then the session is told to end) or
// `done` fires (the session ended by itself).
// A detach waits for the job's shim (up to its timeout): in a thread, one at a time.
class DetachRunner {
 public:
  // `arena_bytes`: the session's arena, told to pos-cli with the token (a restore needs it).
  void start(SessionControl* ctl, UniqueFd client, const sc::Message& m, uint64_t arena_bytes) {
    wire::DetachRequest req;
    req.timeout_ms = m.timeout_ms;
    std::memcpy(req.token, m.token, sizeof(req.token));
    std::memcpy(req.permit, m.permit, sizeof(req.permit));
    req.token[sizeof(req.token) - 1] = '\0', req.permit[sizeof(req.permit) - 1] = '\0';
    const int c = client.get();
    auto body = [ctl, cl = std::move(client), req, arena_bytes]() mutable { run(ctl, cl.get(), req, arena_bytes); };
    if (!one_.start("the session process's detach thread", "posd-session-det", std::move(body)))
      refuse_connection(c, Status::Busy("a detach of this job is already under way"));
  }

 private:
  static void run(SessionControl* ctl, int client, const wire::DetachRequest& req, uint64_t arena_bytes) {
    int fl = ::fcntl(client, F_GETFL);
    if (fl >= 0) (void)::fcntl(client, F_SETFL, fl & ~O_NONBLOCK);
    wire::Welcome w;
    (void)send_packet(client, &w, sizeof(w)).ok();
    // The shim answers once its running call (if any) returns: a few seconds at most, normally.
    const Status s = ctl->detach(req, std::chrono::seconds(30));
    wire::ControlEvent r;
    r.type = static_cast<uint32_t>(wire::EventType::kResult);
    r.code = static_cast<int32_t>(s.code());
    r.api_error = s.api_error();
    wire::put_cstr(r.message, sizeof(r.message), s.ok() ? std::string(req.token) : s.message());
    r.total = arena_bytes;
    (void)send_packet(client, &r, sizeof(r)).ok();
  }

  OneAtATime one_;
};

void control_loop(int channel, int stop_fd, int done_fd, std::atomic<bool>* stopping, POSWorkspace* ws,
                  const SessionProgress* progress, SessionControl* ctl, uint64_t arena_bytes,
                  const std::string& restored_image_id = {}) {
  CheckpointRunner checkpoints;  // joined as the loop returns: the session's client outlives it
  if (!restored_image_id.empty()) checkpoints.adopt(restored_image_id);
  DetachRunner detaches;
  auto end_session = [&] {
    stopping->store(true, std::memory_order_release);
    const uint64_t one = 1;
    (void)!::write(stop_fd, &one, sizeof(one));
  };
  for (;;) {
    pollfd p[2] = {{channel, POLLIN, 0}, {done_fd, POLLIN, 0}};
    const int n = ::poll(p, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || p[1].revents != 0) return;
    sc::Message req;
    UniqueFd fds[3];
    const ssize_t r = recv_with_fds(channel, &req, sizeof(req), fds, 3);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) {  // posd closed it (stopping) or died: the session ends
      end_session();
      return;
    }
    if (static_cast<size_t>(r) == sizeof(req) && req.magic == sc::kMagic &&
        req.type == static_cast<uint32_t>(sc::Type::kCheckpoint) && fds[0] && fds[1]) {
      req.parent[sizeof(req.parent) - 1] = '\0';
      std::string parent = req.parent;
      if (!parent.empty() != static_cast<bool>(fds[2])) {
        refuse_connection(fds[0].get(), Status::InvalidArgument("malformed incremental checkpoint request"));
        continue;
      }
      checkpoints.start(ws, progress->uuid.load(std::memory_order_acquire), std::move(fds[0]), std::move(fds[1]),
                        std::move(fds[2]), req.mode, req.flags, std::move(parent), req.since_call);
      continue;
    }
    if (static_cast<size_t>(r) == sizeof(req) && req.magic == sc::kMagic &&
        req.type == static_cast<uint32_t>(sc::Type::kDetach) && fds[0]) {
      detaches.start(ctl, std::move(fds[0]), req, arena_bytes);
      continue;
    }
    if (static_cast<size_t>(r) == sizeof(req) && req.magic == sc::kMagic &&
        req.type == static_cast<uint32_t>(sc::Type::kReattach) && fds[0]) {
      if (Status s = ctl->reattach(fds[0], fds[1]); !s.ok()) refuse_connection(fds[0].get(), s);
      continue;
    }
    if (static_cast<size_t>(r) == sizeof(req) && req.magic == sc::kMagic &&
        req.type == static_cast<uint32_t>(sc::Type::kPeerExport) && fds[0]) {
      export_peer(fds[0].get(), ws, progress->uuid.load(std::memory_order_acquire), ctl);
      continue;
    }
    if (static_cast<size_t>(r) == sizeof(req) && req.magic == sc::kMagic &&
        req.type == static_cast<uint32_t>(sc::Type::kRelease)) {
      // posd checked the token: the job runs under another posd now, this copy of its GPU state goes.
      if (!ctl->cancel_if_detached("the job re-attached to another posd (pos-cli migrate), so this session was released"))
        POS_WARN("posd-session", "a release came for a session that is not detached: kept");
      continue;
    }
    const bool limit = static_cast<size_t>(r) == sizeof(req) && req.magic == sc::kMagic &&
                       req.type == static_cast<uint32_t>(sc::Type::kLimit);
    if (!limit && (static_cast<size_t>(r) != sizeof(req) || req.magic != sc::kMagic ||
                   req.type != static_cast<uint32_t>(sc::Type::kStatsRequest))) {
      POS_ERROR("posd-session", "posd sent a request this session process does not know; ending the session");
      end_session();
      return;
    }
    sc::Message m;
    m.type = static_cast<uint32_t>(sc::Type::kReport);
    m.uuid = progress->uuid.load(std::memory_order_acquire);
    m.frames = progress->frames.load(std::memory_order_relaxed);
    if (m.uuid != 0) {
      if (auto c = ws->find_client(m.uuid)) {
        Status changed;
        if (limit && (req.flags & sc::kLimitShare) != 0) changed = ctl->set_gpu_share(req.share);
        if (limit && changed.ok() && (req.flags & sc::kLimitMemory) != 0) c->set_memory_quota(req.stats.memory_quota);
        if (!changed.ok()) {
          m.code = static_cast<int32_t>(changed.code());
          wire::put_cstr(m.message, sizeof(m.message), changed.message());
        }
        m.stats = c->stats();
        m.device = c->device();
        m.share = ctl->gpu_share();
      } else {
        m.ending = 1;
      }
    }
    wire::put_cstr(m.backend, sizeof(m.backend), std::string(ws->backend().name()));
    if (!send_packet(channel, &m, sizeof(m)).ok()) {
      end_session();
      return;
    }
  }
}


void send_event(int fd, const wire::ControlEvent& e) { (void)send_packet(fd, &e, sizeof(e)).ok(); }

wire::ControlEvent result_event(const Status& s, const std::string& ok_message) {
  wire::ControlEvent r;
  r.type = static_cast<uint32_t>(wire::EventType::kResult);
  r.code = static_cast<int32_t>(s.code());
  r.api_error = s.api_error();
  wire::put_cstr(r.message, sizeof(r.message), s.ok() ? ok_message : s.message());
  return r;
}

// The session's spec from posd's Start: the parts both kinds of serving session share.
SessionSpec spec_from_start(const sc::Start& start, const std::string& job, const Config& config, int fd, int stop_fd,
                            std::atomic<bool>* stopping, SessionControl* control) {
  SessionSpec spec;
  spec.fd = fd;
  spec.pid = start.pid;
  spec.uid = start.uid;
  spec.job = job;
  spec.arena_bytes = start.arena_bytes;
  spec.devices = config.posd_devices;
  spec.generation = start.generation;
  spec.memory_quota = memory_quota_for_job(config, job);
  spec.join_usage = true;
  spec.gpu_share = gpu_share_for_job(config, job);
  spec.sms = sms_for_job(config, job);
  spec.stop_fd = stop_fd;
  spec.keep_spinning = [stopping] { return !stopping->load(std::memory_order_acquire); };
  spec.control = control;
  return spec;
}

// kRestore with kRestoreStage (a migration target's staging, docs/migration.md): the client rebuilt
// from an earlier image of the job hands its memory to pos-cli (descriptors), which gives it to the
// job's own restore; then it waits, running nothing, until pos-cli hangs up (or posd ends it), and
// the session ends, its device memory with it. No job ever re-attaches here.
int serve_staged(int channel, int cli, uint64_t uuid, POSWorkspace& ws, const sc::Start& start, void* at, size_t span) {
  const auto t0 = std::chrono::steady_clock::now();
  raise_descriptor_limit();  // one descriptor per range until pos-cli has them
  auto c = ws.find_client(uuid);
  StatusOr<std::vector<PeerMemory>> mem = Status::Unavailable("the staged client is gone");
  if (c != nullptr) {
    // The job's own restore needs as much again beside this copy: without room for it, staging
    // would only make that restore fail first (and then read everything from files anyway).
    MemInfo mi;
    const uint64_t held = c->stats().memory_in_use, margin = 256ull << 20;
    if (ws.backend().mem_info(c->device(), &mi).ok() && mi.free < held + margin)
      mem = Status(Code::kOutOfMemory, 0,
                   "no room on the GPU for the job beside its staged copy (" + std::to_string(mi.free) + " bytes free, " +
                       std::to_string(held) + " staged)");
    else
      mem = c->export_peer_memory();
  }
  c.reset();
  Status sent = mem.ok() ? send_peer_table(cli, *mem) : send_peer_failure(cli, mem.status());
  if (mem.ok()) {
    uint64_t bytes = 0;
    for (const PeerMemory& m : *mem) bytes += m.size;
    POS_INFO("posd-session", "staged pid %d's image: handed %zu ranges (%lu bytes) to pos-cli in %.3f s%s", start.pid,
             mem->size(), (unsigned long)bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
             sent.ok() ? "" : " (it did not take them)");
    mem->clear();  // pos-cli holds its own descriptors now; the memory stays mapped here until the end
  } else {
    POS_WARN("posd-session", "staging of pid %d's image: no memory to hand out: %s", start.pid, mem.status().to_string().c_str());
  }
  UniqueFd stop_fd(::eventfd(0, EFD_CLOEXEC)), done_fd(::eventfd(0, EFD_CLOEXEC));
  std::atomic<bool> stopping{false};
  SessionProgress progress;
  progress.uuid.store(uuid, std::memory_order_release);  // ps lists it, with its memory
  SessionControl ctl;
  std::thread control;
  Status t = start_thread(&control, "the session process's control thread", [&] {
    name_this_thread("posd-session-ctl");
    control_loop(channel, stop_fd.get(), done_fd.get(), &stopping, &ws, &progress, &ctl, start.arena_bytes);
  });
  // Until pos-cli hangs up (its restore copied what it needed, or it ended) or posd ends the session.
  for (char byte; sent.ok() && t.ok();) {
    pollfd p[2] = {{cli, POLLIN, 0}, {stop_fd.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno == EINTR) continue;
    if (p[1].revents != 0) break;
    const ssize_t r = ::recv(cli, &byte, 1, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) break;
  }
  const uint64_t one = 1;
  (void)!::write(done_fd.get(), &one, sizeof(one));
  if (control.joinable()) control.join();
  (void)ws.remove_client(uuid);
  ::munmap(at, span);
  POS_INFO("posd-session", "staging of pid %d's image ended after %.3f s", start.pid,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

// kRestore (pos-cli restore, docs/dump_restore.md): the client is rebuilt from the image at the
// addresses it had, then the session waits, detached, for the job CRIU restores to re-attach with
// the session memory it maps. pos-cli's connection (descriptor 4) hears "restored" once the GPU
// state is up; pos-cli then restores the process and says so (RestoreGo), and hears the result once
// the job has re-attached. pos-cli hanging up before its RestoreGo abandons the restore.
int serve_restored(int channel, const sc::Start& start, const std::string& job, const Config& config,
                   POSWorkspace& ws) {
  const int cli = sc::kClientFd;
  int fl = ::fcntl(cli, F_GETFL);
  if (fl >= 0) (void)::fcntl(cli, F_SETFL, fl & ~O_NONBLOCK);
  timeval tv{10, 0};  // a pos-cli that stops reading loses its answers; the restore goes on
  (void)setsockopt(cli, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  wire::Welcome w;
  (void)send_packet(cli, &w, sizeof(w)).ok();
  auto fail = [&](const Status& why) {
    POS_WARN("posd-session", "restore of pid %d (%s) failed: %s", start.pid, job.c_str(), why.to_string().c_str());
    send_event(cli, result_event(why, ""));
    return 1;
  };
  const auto t0 = std::chrono::steady_clock::now();
  // Through pos-cli's own descriptor: posd's user never resolves the caller's path.
  auto opened = ckpt::ImageReader::open_dir("/proc/self/fd/" + std::to_string(sc::kDirFd) + "/gpu");
  if (!opened.ok()) return fail(opened.status().with_context("the image's GPU part"));
  std::shared_ptr<const ckpt::ImageReader> image(std::move(*opened));
  const wire::Layout layout = wire::layout_for(start.arena_bytes);
  // The session memory's range, reserved now: the client's host range must name it from its first
  // call, and the memory itself (the job's own memfd) comes only with the re-attach.
  void* at = ::mmap(nullptr, layout.total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (at == MAP_FAILED) return fail(Status::Unavailable(std::string("reserving the session memory: ") + std::strerror(errno)));
  RestoreOptions ro;
  ro.lazy = (start.flags & wire::kRestoreLazy) != 0;
  const bool stage = (start.flags & wire::kRestoreStage) != 0;
  // A peer switch: the source session's memory comes from pos-cli, right after the Welcome (a staged
  // restore's: a staging session's memory, after the id of the image it holds).
  std::vector<PeerMemory> peer;
  const auto t_table = std::chrono::steady_clock::now();
  auto t_table_first = t_table;
  if ((start.flags & wire::kRestorePeer) != 0) {
    timeval rt{10, 0};  // pos-cli sends it right after the Welcome: a pos-cli that stalls is not waited for
    (void)setsockopt(cli, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt));
    pollfd pf{cli, POLLIN, 0};
    (void)::poll(&pf, 1, 10000);  // for the log: when its first bytes came, apart from reading them all
    t_table_first = std::chrono::steady_clock::now();
    if ((start.flags & wire::kRestoreStaged) != 0) {
      wire::StagedImage si;
      Status got = recv_all(cli, &si, sizeof(si));
      const std::string id = wire::get_cstr(si.image_id, sizeof(si.image_id));
      if (!got.ok() || si.magic != wire::kRestoreMagic || id.size() != 32 ||
          id.find_first_not_of("0123456789abcdef") != std::string::npos) {
        ::munmap(at, layout.total);
        return fail(got.ok() ? Status::InvalidArgument("a malformed staged image id") : got.with_context("the staged image's id"));
      }
      ro.peer_image_id = id;
    }
    auto got = recv_peer_table(cli);
    if (!got.ok()) {
      ::munmap(at, layout.total);
      return fail(got.status().with_context("the source session's memory"));
    }
    peer = std::move(*got);
    ro.peer = &peer;
  }
  // Test hook (docs/dump_restore.md, "Fault points"): POS_FAULT_POINT=lazy-loaders-held keeps a lazy
  // restore's background loaders from loading anything, so that a test meets a job still loading.
  static std::atomic<bool> loaders_held{true};
  if (const char* fp = std::getenv("POS_FAULT_POINT"); fp != nullptr && std::strcmp(fp, "lazy-loaders-held") == 0)
    ro.hold_loader = &loaders_held;
  ro.host_base = reinterpret_cast<uint64_t>(at) + layout.arena_offset;
  ro.host_size = layout.arena_bytes;
  ro.devices = config.posd_devices;
  ro.sms = sms_for_job(config, job);
  const auto t_client = std::chrono::steady_clock::now();
  auto uuid = ws.restore(image, ro);
  const auto t_restored = std::chrono::steady_clock::now();
  // Test hook: the target's session dies with the source's memory copied, before it says so.
  if (!peer.empty() && uuid.ok()) ckpt::fault_point("restore-peer-copied");
  peer.clear();  // copied (or failed): the source's memory is not held here any longer
  ro.peer = nullptr;
  if (!uuid.ok()) {
    ::munmap(at, layout.total);
    return fail(uuid.status());
  }
  {
    wire::ControlEvent e;
    e.type = static_cast<uint32_t>(wire::EventType::kProgress);
    wire::put_cstr(e.phase, sizeof(e.phase), "restored");
    if (auto c = ws.find_client(*uuid)) {
      c->set_memory_quota(memory_quota_for_job(config, job));  // posd.limits, as for a new session
      const ClientStats st = c->stats();
      e.total = st.memory_in_use, e.handles = st.live_handles;
    }
    e.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    send_event(cli, e);
  }
  {
    using sec = std::chrono::duration<double>;
    POS_INFO("posd-session",
             "restored client %lu of pid %d (%s)%s in %.3f s (image %.3f s, peer table %.3f s of which waiting for its "
             "start %.3f s, client %.3f s); %s",
             (unsigned long)*uuid, start.pid, job.c_str(), ro.lazy ? " lazily" : "",
             sec(std::chrono::steady_clock::now() - t0).count(), sec(t_table - t0).count(),
             sec(t_client - t_table).count(), sec(t_table_first - t_table).count(), sec(t_restored - t_client).count(),
             stage ? "staged: its memory goes to pos-cli" : "waiting for the job to re-attach");
  }
  if (stage) return serve_staged(channel, cli, *uuid, ws, start, at, layout.total);

  UniqueFd stop_fd(::eventfd(0, EFD_CLOEXEC)), done_fd(::eventfd(0, EFD_CLOEXEC));
  std::atomic<bool> stopping{false};
  SessionProgress progress;
  SessionControl ctl;
  SessionSpec spec = spec_from_start(start, job, config, -1, stop_fd.get(), &stopping, &ctl);
  spec.restored_uuid = *uuid;
  spec.reserved = at;
  std::thread control, watcher;
  Status t = start_thread(&control, "the session process's control thread", [&] {
    name_this_thread("posd-session-ctl");
    control_loop(channel, stop_fd.get(), done_fd.get(), &stopping, &ws, &progress, &ctl, start.arena_bytes,
                 image->inventory().image_id());
  });
  if (t.ok())
    t = start_thread(&watcher, "the restore's watcher thread", [&] {
      name_this_thread("posd-session-rst");
      // pos-cli's RestoreGo (CRIU restored the job), or its hang-up (abandoned), or the session's end.
      wire::RestoreGo go;
      size_t got = 0;
      while (got < sizeof(go)) {
        pollfd p[2] = {{cli, POLLIN, 0}, {done_fd.get(), POLLIN, 0}};
        if (::poll(p, 2, -1) < 0 && errno == EINTR) continue;
        if (p[1].revents != 0) return;
        const ssize_t r = ::recv(cli, reinterpret_cast<char*>(&go) + got, sizeof(go) - got, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) {
          ctl.cancel("pos-cli abandoned the restore before the job was restored");
          return;
        }
        got += static_cast<size_t>(r);
      }
      if (go.magic != wire::kRestoreMagic || go.pid == 0 || go.pid > static_cast<uint32_t>(INT32_MAX)) {
        ctl.cancel("pos-cli sent a malformed restore message");
        return;
      }
      ctl.watch_pid(static_cast<int32_t>(go.pid));
      const bool attached = ctl.wait_attached(std::chrono::seconds(60));
      // A job that did not come within the minute is not coming (its pos-cli let it go back to its
      // source, or died before it let it come here): this copy of its GPU state is not left behind.
      if (!attached) (void)ctl.cancel_if_detached("the restored job did not re-attach within 60 s");
      send_event(cli, result_event(attached ? Status::Ok()
                                            : Status::Unavailable("the restored job did not re-attach to its session"),
                                   "re-attached"));
    });
  if (!t.ok()) {
    ctl.cancel(t.message());
    if (!control.joinable()) {
      ::munmap(at, layout.total);
      (void)ws.remove_client(*uuid);
      return fail(t);
    }
  }
  serve_session(ws, spec, &progress);
  const uint64_t one = 1;
  (void)!::write(done_fd.get(), &one, sizeof(one));
  if (watcher.joinable()) watcher.join();
  if (control.joinable()) control.join();
  return 0;
}

}  // namespace

StatusOr<std::string> find_session_binary(const Config& config) {
  if (!config.posd_session_binary.empty()) {
    if (executable_file(config.posd_session_binary)) return config.posd_session_binary;
    return Status::FailedPrecondition("posd.session_binary " + config.posd_session_binary +
                                      " is not an executable file");
  }
  if (const char* e = std::getenv("POS_SESSION_BINARY"); e != nullptr && *e != '\0') {
    if (executable_file(e)) return std::string(e);
    return Status::FailedPrecondition(std::string("POS_SESSION_BINARY ") + e + " is not an executable file");
  }
  std::vector<std::string> looked;
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&find_session_binary), &info) != 0 && info.dli_fname != nullptr) {
    const std::string d = dir_of(info.dli_fname);
    for (const char* rel : {"posd-session", "../libexec/pos/posd-session", "../../libexec/pos/posd-session"})
      looked.push_back(d + rel);
  }
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    const std::string d = dir_of(std::string(self, static_cast<size_t>(n)));
    for (const char* rel : {"posd-session", "../libexec/pos/posd-session"}) looked.push_back(d + rel);
  }
  std::string where;
  for (const auto& p : looked) {
    if (executable_file(p)) return p;
    where += (where.empty() ? "" : ", ") + p;
  }
  return Status::FailedPrecondition("posd-session, the session process's program, is not installed (looked for " +
                                    where +
                                    "): set posd.session_binary or POS_SESSION_BINARY to it, or run with "
                                    "posd.isolation: shared (no isolation between clients)");
}

std::vector<std::string> environment_snapshot() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

namespace {
// The Start packet: the struct, then the job name and posd's config.
StatusOr<std::string> start_packet(sc::Start start, const std::string& job, const std::string& config_yaml) {
  if (job.size() > sc::kMaxJobBytes || config_yaml.size() > sc::kMaxConfigBytes)
    return Status::InvalidArgument("job name or config too long for a session process");
  start.magic = sc::kMagic, start.version = sc::kVersion;
  start.job_len = static_cast<uint32_t>(job.size());
  start.config_len = static_cast<uint32_t>(config_yaml.size());
  std::string packet(reinterpret_cast<const char*>(&start), sizeof(start));
  packet += job;
  packet += config_yaml;
  return packet;
}
}  // namespace

StatusOr<SessionProcess> spawn_spare_session(const std::string& binary, const std::string& config_yaml,
                                             const std::vector<std::string>& env) {
  sc::Start start;
  start.kind = static_cast<uint32_t>(sc::Kind::kSpare);
  return spawn_session_process(binary, -1, start, "", config_yaml, env);
}

Status hand_to_spare(const SessionProcess& spare, int client_fd, sc::Start start, const std::string& job,
                     const std::string& config_yaml, int dir_fd) {
  if (client_fd < 0) return Status::InvalidArgument("a spare session process is handed a client");
  auto packet = start_packet(start, job, config_yaml);
  if (!packet.ok()) return packet.status();
  // A spare sends nothing before its Start: readable means it hung up (it ended).
  pollfd p{spare.channel.get(), POLLIN, 0};
  if (::poll(&p, 1, 0) != 0) return Status::Unavailable("the spare session process has ended");
  return dir_fd >= 0 ? send_with_fds(spare.channel.get(), packet->data(), packet->size(), {client_fd, dir_fd})
                     : send_with_fds(spare.channel.get(), packet->data(), packet->size(), {client_fd});
}

StatusOr<SessionProcess> spawn_session_process(const std::string& binary, int client_fd, sc::Start start,
                                               const std::string& job, const std::string& config_yaml,
                                               const std::vector<std::string>& env, int dir_fd) {
  auto packet = start_packet(start, job, config_yaml);
  if (!packet.ok()) return packet.status();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return Status::Unavailable(std::string("socketpair: ") + std::strerror(errno));
  UniqueFd mine(sv[0]), theirs(sv[1]);
  // Above the descriptors the child gets, so each dup2 below really duplicates (and so clears
  // close-on-exec on the copy).
  UniqueFd ch(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
  UniqueFd cl(client_fd >= 0 ? ::fcntl(client_fd, F_DUPFD_CLOEXEC, 10) : -1);
  UniqueFd dd(dir_fd >= 0 ? ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 10) : -1);
  if (!ch || (client_fd >= 0 && !cl) || (dir_fd >= 0 && !dd))
    return Status::Unavailable(std::string("dup: ") + std::strerror(errno));
  theirs.reset();
  // Sent before the process exists: the packet waits in the socket (a config is well under its buffer).
  POS_RETURN_IF_ERROR(send_packet(mine.get(), packet->data(), packet->size()));

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_adddup2(&fa, ch.get(), sc::kChannelFd);
  if (cl) posix_spawn_file_actions_adddup2(&fa, cl.get(), sc::kClientFd);
  if (dd) posix_spawn_file_actions_adddup2(&fa, dd.get(), sc::kDirFd);
  posix_spawn_file_actions_addclosefrom_np(&fa, (dd ? sc::kDirFd : sc::kClientFd) + 1);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGTERM, SIGINT, SIGPIPE, SIGHUP}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &defaults);
  posix_spawnattr_setpgroup(&at, 0);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  char* argv[] = {const_cast<char*>(binary.c_str()), nullptr};
  std::vector<char*> envp;
  for (const auto& v : env) envp.push_back(const_cast<char*>(v.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int e = ::posix_spawn(&pid, binary.c_str(), &fa, &at, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (e != 0) return Status::Unavailable("cannot start the session process " + binary + ": " + std::strerror(e));
  SessionProcess p;
  p.pid = pid;
  p.channel = std::move(mine);
  return p;
}

StatusOr<sc::Message> query_session(int channel, std::chrono::milliseconds timeout) {
  sc::Message req;
  req.type = static_cast<uint32_t>(sc::Type::kStatsRequest);
  POS_RETURN_IF_ERROR(send_packet(channel, &req, sizeof(req)));
  return await_report(channel, timeout);
}

StatusOr<sc::Message> await_report(int channel, std::chrono::milliseconds timeout) {
  sc::Message m;
  auto n = recv_packet(channel, &m, sizeof(m), timeout);
  if (!n.ok()) return n.status();
  if (*n != sizeof(m) || m.magic != sc::kMagic || m.type != static_cast<uint32_t>(sc::Type::kReport))
    return Status::Corrupt("the session process answered with a malformed report");
  m.backend[sizeof(m.backend) - 1] = '\0';
  m.message[sizeof(m.message) - 1] = '\0';
  return m;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* name = ::strsignal(s);
    return "was killed by signal " + std::to_string(s) + " (" + (name != nullptr ? name : "?") + ")";
  }
  return "ended (wait status " + std::to_string(status) + ")";
}

int wait_or_kill(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return 0;  // not ours (already reaped)
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  POS_WARN("posd", "session process %d did not end within %lld ms; killing it", static_cast<int>(pid),
           static_cast<long long>(timeout.count()));
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

namespace {
// A spare's second Start (kServe or kRestore) and its descriptors, put where a process started
// for that client has them (kClientFd, kDirFd). False: posd closed the channel, or sent nothing
// this build reads (then the process ends; posd starts a new one for that client).
bool await_handover(int channel, std::vector<char>& buf, sc::Start* start, std::string* job, std::string* config) {
  for (;;) {
    pollfd p{channel, POLLIN, 0};
    const int n = ::poll(&p, 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    UniqueFd fds[2];
    const ssize_t r = recv_with_fds(channel, buf.data(), buf.size(), fds, 2);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    sc::Start s;
    if (static_cast<size_t>(r) < sizeof(s)) return false;
    std::memcpy(&s, buf.data(), sizeof(s));
    const bool kind_ok = s.kind == static_cast<uint32_t>(sc::Kind::kServe) ||
                         s.kind == static_cast<uint32_t>(sc::Kind::kRestore);
    if (s.magic != sc::kMagic || s.version != sc::kVersion || !kind_ok || s.job_len > sc::kMaxJobBytes ||
        s.config_len > sc::kMaxConfigBytes || static_cast<size_t>(r) != sizeof(s) + s.job_len + s.config_len || !fds[0] ||
        (s.kind == static_cast<uint32_t>(sc::Kind::kRestore) && !fds[1])) {
      log_line(LogLevel::kError, "posd-session", "the spare's start message is not one this build reads");
      return false;
    }
    // Each to its place; one that arrived there already (the lowest free number) stays open.
    auto place = [](UniqueFd& fd, int at) {
      if (fd.get() == at) return (void)fd.release(), true;
      return ::dup2(fd.get(), at) == at;
    };
    if (fds[1] && fds[1].get() == sc::kClientFd) {  // out of the client's way first
      UniqueFd moved(::fcntl(fds[1].get(), F_DUPFD_CLOEXEC, sc::kDirFd + 1));
      if (!moved) return false;
      fds[1] = std::move(moved);
    }
    if (!place(fds[0], sc::kClientFd) || (fds[1] && !place(fds[1], sc::kDirFd))) return false;
    *start = s;
    job->assign(buf.data() + sizeof(s), s.job_len);
    config->assign(buf.data() + sizeof(s) + s.job_len, s.config_len);
    return true;
  }
}
}  // namespace

int session_process_main() {
  const int channel = sc::kChannelFd;
  (void)::fcntl(channel, F_SETFD, FD_CLOEXEC);
  std::vector<char> buf(sizeof(sc::Start) + sc::kMaxJobBytes + sc::kMaxConfigBytes);
  auto n = recv_packet(channel, buf.data(), buf.size(), std::chrono::seconds(10));
  sc::Start start;
  if (!n.ok() || *n < sizeof(start)) {
    log_line(LogLevel::kError, "posd-session", "no start message from posd (%s); this program is started by posd",
             n.ok() ? "too short" : n.status().message().c_str());
    return 2;
  }
  std::memcpy(&start, buf.data(), sizeof(start));
  if (start.magic != sc::kMagic || start.version != sc::kVersion || start.job_len > sc::kMaxJobBytes ||
      start.config_len > sc::kMaxConfigBytes || *n != sizeof(start) + start.job_len + start.config_len) {
    log_line(LogLevel::kError, "posd-session", "the start message is not one this build reads (another posd's?)");
    return 2;
  }
  std::string job(buf.data() + sizeof(start), start.job_len);
  auto cfg = parse_config(std::string(buf.data() + sizeof(start) + start.job_len, start.config_len));
  if (!cfg.ok()) {
    report_status(channel, cfg.status().with_context("posd's config"), 0, "");
    return 2;
  }
  Config config = *cfg;
  set_log_level(config.log_level);
  prepare_descriptor_table();  // a peer switch's table lands here without growing it then
  // Host kernels run here, where the client's memory is: the libraries are loaded in this process.
  std::vector<void*> libs;
  Status st;
  for (const auto& lib : config.host_kernel_libraries) {
    void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      st = Status::InvalidArgument("cannot load host kernel library " + lib + ": " + ::dlerror());
      break;
    }
    libs.push_back(h);
  }
  const bool probe = start.kind == static_cast<uint32_t>(sc::Kind::kProbe);
  if (!probe) config.max_clients = 1;  // one client, in slot 0 of a window of its own
  StatusOr<std::unique_ptr<POSWorkspace>> ws = st.ok() ? create_workspace(config) : StatusOr<std::unique_ptr<POSWorkspace>>(st);
  if (start.kind == static_cast<uint32_t>(sc::Kind::kSpare)) {
    // A spare may be handed a restore (a migration's restore ahead, say): the page-locked staging
    // of its loaders is made now, while it waits, rather than on the restore's path (a job's
    // session then drains its checkpoints through the same chunks). Best effort: what is not made
    // here is made as the loaders start, as in any other session.
    if (ws.ok()) (void)(*ws)->backend().keep_staging_chunks(restore_loader_threads() + 1);
    // Up ahead of its client: now the client (posd closing the channel instead: nothing to do).
    std::string handed;
    if (!await_handover(channel, buf, &start, &job, &handed)) {
      if (ws.ok()) ws->reset();
      for (void* h : libs) ::dlclose(h);
      return 0;
    }
    // The spare's backend is up already; what posd's config says of this job's checkpoints (its
    // policy names it, say) is taken from the config it was handed with.
    if (auto h = parse_config(handed); h.ok()) {
      config.posd_checkpoint_staging_ahead = h->posd_checkpoint_staging_ahead;
      config.ckpt_keep_shadows = h->ckpt_keep_shadows;
    }
  }
  if (!probe && ws.ok()) (*ws)->backend().set_keep_shadows(config.ckpt_keep_shadows.value_or(false));
  // A job that will be checkpointed gets its checkpoint staging now, as it starts: made at its
  // first checkpoint, the page-locking held the job's GPU work for its ~60-70 ms (the driver
  // serializes it with the job's calls; the H200). posd sets this for the jobs its policy names.
  // Best effort, as for a spare (whose kept chunks already cover it).
  if (!probe && ws.ok() && config.posd_checkpoint_staging_ahead) {
    DeviceBackend& b = (*ws)->backend();
    const auto t0 = std::chrono::steady_clock::now();
    const size_t kept = b.keep_staging_chunks(std::max(b.staging_chunks_kept(), checkpoint_staging_chunks()));
    POS_INFO("posd-session",
             "pid %d ('%s'): checkpoint staging made ahead, %zu chunks of %llu MiB kept (%.3f s); copy-on-write "
             "shadows %s between checkpoints",
             start.pid, job.c_str(), kept, static_cast<unsigned long long>(DeviceBackend::kStagingChunkBytes >> 20),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
             config.ckpt_keep_shadows.value_or(false) ? "kept" : "given back");
  }
  const bool restore = start.kind == static_cast<uint32_t>(sc::Kind::kRestore);
  int rc = 0;
  if (probe) {
    report_status(channel, ws.ok() ? Status::Ok() : ws.status(), ws.ok() ? (*ws)->backend().device_count() : 0,
                  ws.ok() ? std::string((*ws)->backend().name()) : config.backend);
  } else if (!ws.ok()) {
    POS_WARN("posd-session", "session for pid %d (%s) refused: %s", start.pid, job.c_str(),
             ws.status().to_string().c_str());
    refuse_connection(sc::kClientFd, ws.status());
    rc = 1;
  } else if (restore) {
    rc = serve_restored(channel, start, job, config, **ws);
  } else {
    UniqueFd stop_fd(::eventfd(0, EFD_CLOEXEC)), done_fd(::eventfd(0, EFD_CLOEXEC));
    std::atomic<bool> stopping{false};
    SessionProgress progress;
    SessionControl session_control;
    SessionSpec spec = spec_from_start(start, job, config, sc::kClientFd, stop_fd.get(), &stopping, &session_control);
    std::thread control;
    Status t = start_thread(&control, "the session process's control thread", [&] {
      name_this_thread("posd-session-ctl");
      control_loop(channel, stop_fd.get(), done_fd.get(), &stopping, ws->get(), &progress, &session_control,
                   start.arena_bytes);
    });
    if (!t.ok()) {
      refuse_connection(sc::kClientFd, t);
      rc = 1;
    } else {
      serve_session(**ws, spec, &progress);
      const uint64_t one = 1;
      (void)!::write(done_fd.get(), &one, sizeof(one));
      control.join();
    }
  }
  if (ws.ok()) ws->reset();
  for (void* h : libs) ::dlclose(h);
  return rc;
}

}  // namespace pos
