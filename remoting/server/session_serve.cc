// session_serve.cc — one session's serving, shared by posd's session threads (posd.isolation:
// shared) and session processes (process): shared memory, welcome, frame loop, teardown on hang-up.
#include "remoting/server/session_serve.h"
#include "remoting/common/job_control.h"
#include "remoting/server/session_share.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "pos/base/cuda_errors.h"
#include "pos/base/log.h"
#include "pos/base/sync.h"
#include "remoting/common/unique_fd.h"
#include "remoting/common/wire.h"

namespace pos {

namespace {

// The session's shared memory: a sealed memfd (the client can neither shrink it under posd's
// mapping nor grow it), mapped here, and the eventfd the client rings when posd sleeps.
struct SessionMemory {
  int memfd = -1, efd = -1;
  std::byte* base = nullptr;
  wire::Layout layout{};
  bool registered = false;
  DeviceBackend* backend = nullptr;
  ~SessionMemory() {
    if (registered) (void)backend->host_unregister_on_use(base + layout.arena_offset);
    if (base != nullptr) ::munmap(base, layout.total);
    if (memfd >= 0) ::close(memfd);
    if (efd >= 0) ::close(efd);
  }
  Status create(uint64_t arena_bytes, DeviceBackend* b) {
    backend = b;
    layout = wire::layout_for(arena_bytes);
    memfd = ::memfd_create("pos-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd < 0) return Status::Unavailable(std::string("memfd_create: ") + std::strerror(errno));
    if (::ftruncate(memfd, static_cast<off_t>(layout.total)) != 0)
      return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation, std::string("sizing the session memory: ") + std::strerror(errno));
    if (::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      return Status::Unavailable(std::string("sealing the session memory: ") + std::strerror(errno));
    void* m = ::mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (m == MAP_FAILED) return Status::Unavailable(std::string("mapping the session memory: ") + std::strerror(errno));
    base = static_cast<std::byte*>(m);
    auto* h = new (base) wire::ShmHeader();
    h->magic = wire::kShmMagic;
    h->version = wire::kProtocolVersion;
    h->ring_bytes = layout.ring_bytes;
    efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd < 0) return Status::Unavailable(std::string("eventfd: ") + std::strerror(errno));
    // Page-locked a few MiB at a time as copies name it: what the job never uses stays unresident
    // (and out of CRIU's images at a dump).
    Status s = b->host_register_on_use(base + layout.arena_offset, layout.arena_bytes);
    if (!s.ok()) return s.with_context("page-locking the session arena");
    registered = true;
    return Status::Ok();
  }
  // A restored session: the layout is known, its range reserved at `at` (base, owned from now on);
  // the memory itself comes with the job's re-attach (adopt).
  void reserve(uint64_t arena_bytes, void* at, DeviceBackend* b) {
    backend = b;
    layout = wire::layout_for(arena_bytes);
    base = static_cast<std::byte*>(at);
  }
  bool adopted() const { return memfd >= 0; }
  // Takes over the job's own session memfd (CRIU restored it with the job's mapping of it): it must
  // be the layout's size and sealed against shrinking and growing (so the job cannot take pages
  // from under this mapping), then it is mapped over the reservation and page-locked.
  Status adopt(UniqueFd fd) {
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != layout.total)
      return Status::InvalidArgument("the job's session memory is not a file of " + std::to_string(layout.total) + " bytes");
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
      return Status::InvalidArgument("the job's session memory is not sealed against resizing (not a posd memfd)");
    if (::mmap(base, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd.get(), 0) != base)
      return Status::Unavailable(std::string("mapping the job's session memory: ") + std::strerror(errno));
    efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd < 0) return Status::Unavailable(std::string("eventfd: ") + std::strerror(errno));
    Status s = backend->host_register_on_use(base + layout.arena_offset, layout.arena_bytes);
    if (!s.ok()) return s.with_context("page-locking the session arena");
    registered = true;
    memfd = fd.release();
    return Status::Ok();
  }
};

ClientOptions session_options(const SessionSpec& spec, std::byte* arena, uint64_t arena_bytes) {
  ClientOptions o;
  o.host_base = reinterpret_cast<uint64_t>(arena);
  o.host_size = arena_bytes;
  o.devices = spec.devices;
  o.generation = spec.generation;
  o.memory_quota = spec.memory_quota;
  o.sms = spec.sms;
  return o;
}

}  // namespace

void SessionControl::set_share_slot(SessionShare* share) {
  std::lock_guard<std::mutex> lk(share_mu_);
  share_ = share;
}

Status SessionControl::set_gpu_share(uint32_t per_mille) {
  std::lock_guard<std::mutex> lk(share_mu_);
  if (share_ == nullptr)
    return Status::FailedPrecondition("this job's session is in no usage region (its posd user's region could not be "
                                      "opened, or the session is starting or ending): no GPU-time share can be set");
  return share_->set_share(per_mille);
}

uint32_t SessionControl::gpu_share() const {
  std::lock_guard<std::mutex> lk(share_mu_);
  return share_ != nullptr ? share_->share() : 0;
}

SessionControl::SessionControl() : wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

void SessionControl::attached(int fd) {
  std::lock_guard<std::mutex> lk(mu_);
  fd_ = fd;
  state_.store(kAttached, std::memory_order_release);
  cv_.notify_all();
}

void SessionControl::ended() {
  std::lock_guard<std::mutex> lk(mu_);
  fd_ = -1;
  state_.store(kEnded, std::memory_order_release);
  cv_.notify_all();
}

Status SessionControl::detach(const wire::DetachRequest& request, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_.load() == kDetached || state_.load() == kDetaching)
    return Status::Busy("the job is detached already (another dump is under way)");
  if (state_.load() != kAttached) return Status::Unavailable("the job's session is not running");
  state_.store(kDetaching, std::memory_order_release);
  if (::send(fd_, &request, sizeof(request), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(request))) {
    state_.store(kAttached, std::memory_order_release);
    return Status::Unavailable(std::string("cannot reach the job: ") + std::strerror(errno));
  }
  if (!cv_.wait_for(lk, timeout, [&] { return state_.load() != kDetaching; }))
    // The shim acknowledges once its running call returns; it may still. Until then the session
    // serves on (and detaches when the acknowledgement comes).
    return Status(Code::kNotReady, 0,
                  "the job did not detach within " + std::to_string(timeout.count()) + " ms (a call of it is still running?)");
  if (state_.load() != kDetached) return Status::Unavailable("the job's session ended instead of detaching");
  return Status::Ok();
}

Status SessionControl::reattach(UniqueFd& fd, UniqueFd& memfd) {
  std::lock_guard<std::mutex> lk(mu_);
  // A restored session is still starting for a moment after its process told pos-cli the restore
  // is done (the job, let go at once, may already be here): its re-attach waits for the serving
  // loop, as one to a detached session does. New sessions have no token, so none comes to them.
  const int st = state_.load();
  if (st != kDetached && st != kStarting) return Status::FailedPrecondition("the session is not detached");
  if (pending_) return Status::Busy("another re-attach is under way");
  pending_ = std::move(fd);
  pending_memfd_ = std::move(memfd);
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  return Status::Ok();
}

void SessionControl::watch_pid(int32_t pid) {
  std::lock_guard<std::mutex> lk(mu_);
  watch_pid_ = pid;
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
}

void SessionControl::cancel(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_ = why;
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
}

bool SessionControl::cancel_if_detached(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (state_.load() != kDetached || pending_) return false;
  cancelled_ = why;
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  return true;
}

bool SessionControl::wait_attached(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return state_.load() == kAttached || state_.load() == kEnded; });
  return state_.load() == kAttached;
}

void SessionControl::mark_detached() {
  std::lock_guard<std::mutex> lk(mu_);
  fd_ = -1;
  state_.store(kDetached, std::memory_order_release);
  cv_.notify_all();
}

UniqueFd SessionControl::wait_for_reattach(int stop_fd, int32_t pid, std::string* why, UniqueFd* memfd) {
  // Readable once the job's process has ended (Linux >= 5.3; without it only posd's stop ends the wait).
  UniqueFd job(pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1);
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!cancelled_.empty()) {
        *why = cancelled_;
        return UniqueFd();
      }
      if (!job && pid <= 0 && watch_pid_ > 0) {
        job.reset(static_cast<int>(::syscall(SYS_pidfd_open, watch_pid_, 0)));
        if (!job && errno == ESRCH) {
          *why = "the restored job ended before it re-attached";
          return UniqueFd();
        }
      }
    }
    pollfd p[3] = {{wake_.get(), POLLIN, 0}, {stop_fd, POLLIN, 0}, {job.get(), POLLIN, 0}};
    const int n = ::poll(p, job ? 3 : 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || p[1].revents != 0) {
      *why = "posd stopping while the job was detached";
      return UniqueFd();
    }
    if (job && p[2].revents != 0) {
      *why = "the job ended while detached (a dump that ends it, or a kill)";
      return UniqueFd();
    }
    uint64_t v;
    (void)!::read(wake_.get(), &v, sizeof(v));
    std::lock_guard<std::mutex> lk(mu_);
    if (pending_) {
      *memfd = std::move(pending_memfd_);
      return std::move(pending_);
    }
  }
}

void refuse_connection(int fd, const Status& why) {
  wire::Welcome w;
  w.code = static_cast<int32_t>(why.code());
  w.api_error = why.api_error() != 0 ? why.api_error() : cuda::kErrorInitializationError;
  wire::put_cstr(w.message, sizeof(w.message), why.message());
  (void)::send(fd, &w, sizeof(w), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void serve_session(POSWorkspace& ws, const SessionSpec& spec, SessionProgress* progress) {
  int fd = spec.fd;
  UniqueFd reattached;  // the connection of a re-attachment (spec.fd is the caller's)
  auto mem = std::make_unique<SessionMemory>();
  const bool restored = spec.restored_uuid != 0 && spec.control != nullptr && spec.reserved != nullptr;
  Status st;
  if (restored) mem->reserve(spec.arena_bytes, spec.reserved, &ws.backend());
  else st = mem->create(spec.arena_bytes, &ws.backend());
  std::byte* const arena = mem->base == nullptr ? nullptr : mem->base + mem->layout.arena_offset;
  StatusOr<ClientUuid> uuid =
      restored ? StatusOr<ClientUuid>(spec.restored_uuid)
      : st.ok() ? ws.create_client(spec.job, session_options(spec, arena, mem->layout.arena_bytes))
                : StatusOr<ClientUuid>(st);
  if (!uuid.ok()) {
    POS_WARN("posd", "session for pid %d (%s) refused: %s", spec.pid, spec.job.c_str(),
             uuid.status().to_string().c_str());
    refuse_connection(fd, uuid.status());
    return;
  }
  progress->uuid.store(*uuid, std::memory_order_release);
  // A session process joins posd's user's usage region: one accounting with that user's in-process
  // jobs, and its GPU-time share (docs/limits.md). Without the region it runs as before.
  std::unique_ptr<SessionShare> share;
  if (spec.join_usage) {
    if (auto c = ws.find_client(*uuid)) {
      std::string why;
      share = SessionShare::join(default_jobs_dir(), ws.config().posd_usage_region, c.get(), spec.gpu_share, &why);
      if (share) c->set_turn_gate(share.get());
      if (share && spec.control != nullptr) spec.control->set_share_slot(share.get());
      else if (spec.gpu_share != 0)
        POS_WARN("posd", "session %lu (pid %d, '%s'): no GPU-time share: %s", (unsigned long)*uuid, spec.pid,
                 spec.job.c_str(), why.c_str());
      else POS_DEBUG("posd", "session %lu: not in the usage region: %s", (unsigned long)*uuid, why.c_str());
    }
  }
  const Config& cfg = ws.config();
  // The welcome of an attachment: the session memory (memfd, eventfd) and where things are.
  auto welcome = [&](int to) {
    wire::Welcome w;
    w.client_uuid = *uuid;
    w.shm_bytes = mem->layout.total;
    w.ring_offset = mem->layout.ring_offset, w.ring_bytes = mem->layout.ring_bytes;
    w.reply_offset = mem->layout.reply_offset;
    w.arena_offset = mem->layout.arena_offset, w.arena_bytes = mem->layout.arena_bytes;
    w.daemon_arena_addr = reinterpret_cast<uint64_t>(arena);
    w.device_base = cfg.va_base + (*uuid & 0xffff) * cfg.va_size;
    w.device_size = cfg.va_size;
    w.window_base = cfg.va_base;
    w.window_size = cfg.va_size * cfg.max_clients;
    msghdr msg{};
    iovec iov{&w, sizeof(w)};
    alignas(cmsghdr) char cbuf[CMSG_SPACE(2 * sizeof(int))] = {};
    msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = cbuf, msg.msg_controllen = sizeof(cbuf);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    const int fds[2] = {mem->memfd, mem->efd};
    std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
    return ::sendmsg(to, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(w));
  };
  if (!restored && !welcome(fd)) {
    POS_WARN("posd", "pid %d left during the handshake", spec.pid);
    (void)ws.remove_client(*uuid);
    return;
  }
  POS_INFO("posd", "session %lu: pid %d uid %u job '%s', arena %lu bytes%s", (unsigned long)*uuid, spec.pid,
           spec.uid, spec.job.c_str(), (unsigned long)mem->layout.arena_bytes,
           restored ? ", restored: waiting for the job to re-attach" : "");
  SessionControl* const ctl = spec.control;
  if (ctl != nullptr && !restored) ctl->attached(fd);

  auto* hdr = reinterpret_cast<wire::ShmHeader*>(mem->base);
  std::byte* ring = mem->base + mem->layout.ring_offset;
  auto* reply = reinterpret_cast<wire::ReplySlot*>(mem->base + mem->layout.reply_offset);
  const uint64_t ring_bytes = mem->layout.ring_bytes;
  const uint64_t spin_ns = cfg.sync_spin_ns;
  uint64_t head = 0, last_seq = 0;
  // Posted cudaGetLastError frames are answered here from the client's atomic (what its parser
  // function would read), not through pos_process: a training loop posts one after every launch,
  // and a parser round trip each would make this thread the session's bottleneck.
  std::shared_ptr<POSClient> client = ws.find_client(*uuid);
  Status deferred;  // first failure of a posted frame since the last reply
  int32_t taken_async_error = 0;  // taken by a posted cudaGetLastError since the last reply
  std::string end_reason = "client disconnected";
  alignas(16) std::byte ret[wire::kMaxRet];
  wire::DecodedFrame f;

  // A frame's ring space is free again; then its completion is visible to the client.
  auto consumed = [&](uint64_t total_len, uint64_t seq) {
    head += total_len;
    hdr->head.store(head, std::memory_order_release);
    last_seq = seq;
    progress->frames.fetch_add(1, std::memory_order_relaxed);
  };
  auto published = [&](uint64_t seq) {
    hdr->done_seq.store(seq, std::memory_order_release);
    // Store then load, both seq_cst (no fences: ThreadSanitizer models these): with the client's
    // store-sleeping-then-load-done32, at least one side sees the other.
    hdr->done32.store(static_cast<uint32_t>(seq), std::memory_order_seq_cst);
    if (hdr->client_sleeping.load(std::memory_order_seq_cst) != 0) wire::futex_wake_all(&hdr->done32);
  };
  auto fail = [&](const Status& why) {
    POS_ERROR("posd", "session %lu (pid %d, '%s'): %s; closing it", (unsigned long)*uuid, spec.pid, spec.job.c_str(),
              why.message().c_str());
    end_reason = "malformed frame";
  };
  // A restored session starts where a dump left its job: detached, waiting for it to re-attach.
  bool serving = !restored;
  int first_answers = 0;  // after a re-attach: the first answers are logged with their delay
  auto t_reattach = std::chrono::steady_clock::now();
  if (restored) {
    end_reason = "detached";
    ctl->mark_detached();
  }
  for (;;) {
   for (; serving;) {
    const uint64_t tail = hdr->tail.load(std::memory_order_acquire);
    if (tail != head) {
      if (tail < head || tail - head > ring_bytes) {
        fail(Status::Corrupt("ring tail " + std::to_string(tail) + " is impossible (head " + std::to_string(head) + ")"));
        break;
      }
      const uint64_t pos = head % ring_bytes, rem = ring_bytes - pos;
      if (rem < sizeof(wire::FrameHeader)) {  // too little room for a header: implicit pad
        head += rem;
        hdr->head.store(head, std::memory_order_release);
        continue;
      }
      Status d = wire::decode_frame(ring + pos, std::min(tail - head, rem), arena, mem->layout.arena_bytes, &f);
      if (d.ok() && (f.h.flags & wire::kFlagPad) && f.h.total_len != rem) d = Status::Corrupt("pad frame does not end at the ring's end");
      if (d.ok() && !(f.h.flags & wire::kFlagPad) && f.h.seq != last_seq + 1)
        d = Status::Corrupt("frame sequence " + std::to_string(f.h.seq) + " after " + std::to_string(last_seq));
      if (!d.ok()) {
        fail(d);
        break;
      }
      if (f.h.flags & wire::kFlagPad) {
        head += f.h.total_len;
        hdr->head.store(head, std::memory_order_release);
        continue;
      }
      if (f.h.api_id == static_cast<uint32_t>(ApiId::kGetLastError) && !(f.h.flags & wire::kFlagReply) &&
          f.nparams == 0 && client) {
        if (const int32_t e = client->take_async_error(); e != 0) taken_async_error = e;
        consumed(f.h.total_len, f.h.seq);
        published(f.h.seq);
        continue;
      }
      uint64_t written = 0;
      Status r = ws.pos_process(f.h.api_id, *uuid, std::span<const Param>(f.params, f.nparams), ret, f.h.ret_cap,
                                  &written);
      if (!r.ok())
        POS_DEBUG("posd", "session %lu ('%s'): %s failed: %s", (unsigned long)*uuid, spec.job.c_str(),
                  std::string(api_name(static_cast<ApiId>(f.h.api_id))).c_str(),
                  r.to_string().c_str());
      // pos_process copied the parameters: the ring space may be reused.
      consumed(f.h.total_len, f.h.seq);
      if ((f.h.flags & wire::kFlagReply) && first_answers > 0) {
        // A move's cost to the job does not end at the re-attach: what its first calls wait for
        // (lazily loaded kernels, a cold context) is logged, to be measured.
        --first_answers;
        POS_INFO("posd", "session %lu ('%s'): %s answered %.1f ms after the re-attach (%lu frames)", (unsigned long)*uuid,
                 spec.job.c_str(), std::string(api_name(static_cast<ApiId>(f.h.api_id))).c_str(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_reattach).count(),
                 (unsigned long)f.h.seq);
      }
      if (f.h.flags & wire::kFlagReply) {
        reply->seq = f.h.seq;
        reply->code = static_cast<int32_t>(r.code());
        reply->api_error = r.ok() ? 0 : r.api_error();
        const std::string& m = r.message();
        reply->message_len = static_cast<uint32_t>(std::min<uint64_t>(m.size(), wire::kMaxMessage));
        std::memcpy(reply->message, m.data(), reply->message_len);
        reply->deferred_code = static_cast<int32_t>(deferred.code());
        reply->deferred_api_error = deferred.ok() ? 0 : deferred.api_error();
        const std::string& dm = deferred.message();
        reply->deferred_message_len = static_cast<uint32_t>(std::min<uint64_t>(dm.size(), wire::kMaxMessage));
        std::memcpy(reply->deferred_message, dm.data(), reply->deferred_message_len);
        reply->ret_written = std::min<uint64_t>(written, wire::kMaxRet);
        std::memcpy(reply->ret, ret, reply->ret_written);
        reply->async_error = taken_async_error;
        reply->reserved = 0;
        deferred = Status::Ok();
        taken_async_error = 0;
      } else if (f.h.api_id == static_cast<uint32_t>(ApiId::kGetLastError)) {
        // A posted cudaGetLastError: what it took is the app's next last error, not a failure.
        if (!r.ok()) taken_async_error = r.api_error();
      } else if (!r.ok() && deferred.ok()) {
        deferred = r;
      }
      published(f.h.seq);
      continue;
    }
    // Idle: spin a while (a training loop's next call is microseconds away), then sleep until the
    // client rings, hangs up, or posd stops.
    if (spin_wait<kPollSpin>(
            spin_ns, [&] { return hdr->tail.load(std::memory_order_acquire) != head; },
            [&] { return spec.keep_spinning() && (ctl == nullptr || !ctl->detaching()); }))
      continue;
    hdr->server_sleeping.store(1, std::memory_order_seq_cst);  // pairs with the client's tail store
    if (hdr->tail.load(std::memory_order_seq_cst) != head) {
      hdr->server_sleeping.store(0, std::memory_order_relaxed);
      continue;
    }
    pollfd p[3] = {{fd, POLLIN | POLLRDHUP, 0}, {mem->efd, POLLIN, 0}, {spec.stop_fd, POLLIN, 0}};
    const int n = ::poll(p, 3, -1);
    hdr->server_sleeping.store(0, std::memory_order_relaxed);
    if (n < 0 && errno != EINTR) break;
    if (p[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(mem->efd, &v, sizeof(v));
    }
    if (p[2].revents != 0) {
      end_reason = "posd stopping";
      break;
    }
    if (p[0].revents != 0) {
      if (hdr->tail.load(std::memory_order_acquire) != head) continue;  // run what it left first
      // After the hello the client writes to the socket only to acknowledge a detach; anything
      // else readable is a hang-up (or garbage, which ends the session too).
      wire::DetachAck ack;
      if (ctl != nullptr && ctl->detaching() &&
          ::recv(fd, &ack, sizeof(ack), MSG_DONTWAIT | MSG_WAITALL) == static_cast<ssize_t>(sizeof(ack)) &&
          ack.magic == wire::kDetachMagic && ack.last_seq == last_seq) {
        if (ack.phase == 1) {
          // Every call the job made finishes on the device (an asynchronous copy into a pinned
          // block lands) before the shim copies its arena; then it is told to go on.
          Command quiet;
          quiet.type = CommandType::kQuiesce;
          if (Status q = ws.run_command(*uuid, quiet); !q.ok())
            POS_WARN("posd", "session %lu: quiescing for a detach: %s", (unsigned long)*uuid, q.to_string().c_str());
          wire::DetachAck back;
          back.phase = 1;
          back.last_seq = last_seq;
          if (::send(fd, &back, sizeof(back), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(back))) continue;
        } else if (ack.phase == 2) {
          // Detached once the shim has also closed its end: then nothing of posd is left in the job.
          pollfd h{fd, POLLRDHUP, 0};
          char byte;
          if (::poll(&h, 1, 5000) > 0 && ::recv(fd, &byte, 1, MSG_DONTWAIT) == 0) end_reason = "detached";
        }
      }
      break;
    }
   }
    if (end_reason != "detached") break;
    // Detached: the connection goes. The session memory stays, and the job keeps its mapping of it:
    // its pinned memory (the arena) never moves while its threads may touch it. So do the client
    // and its GPU state, until the job re-attaches (or posd stops, or the job ends).
    if (serving) {
      ctl->mark_detached();  // before the close: no one sends on this connection any more
      ::shutdown(fd, SHUT_RDWR);
      reattached.reset();
      if (fd == spec.fd) ::close(spec.fd);
      fd = -1;
      POS_INFO("posd", "session %lu (pid %d, '%s'): detached after call %lu", (unsigned long)*uuid, spec.pid,
               spec.job.c_str(), (unsigned long)last_seq);
    }
    // A restored session's job does not exist yet (CRIU restores it after this session is up):
    // its pid is watched once pos-cli says CRIU has restored it (SessionControl::watch_pid).
    UniqueFd job_memfd;
    UniqueFd next = ctl->wait_for_reattach(spec.stop_fd, serving ? spec.pid : 0, &end_reason, &job_memfd);
    if (!next) break;
    if (!mem->adopted()) {
      // The job's own session memory, which CRIU restored with it: its pinned memory stays where
      // it is, with what it held, and this session serves it from now on.
      if (Status a = mem->adopt(std::move(job_memfd)); !a.ok()) {
        POS_WARN("posd", "session %lu (pid %d, '%s'): re-attach refused: %s", (unsigned long)*uuid, spec.pid,
                 spec.job.c_str(), a.to_string().c_str());
        refuse_connection(next.get(), a);
        end_reason = "the restored job's session memory was refused (" + a.message() + ")";
        break;
      }
    }
    serving = true;
    // The same memory, its header as new: the ring starts over.
    auto* fresh = new (mem->base) wire::ShmHeader();
    fresh->magic = wire::kShmMagic;
    fresh->version = wire::kProtocolVersion;
    fresh->ring_bytes = mem->layout.ring_bytes;
    if (!welcome(next.get())) {
      end_reason = "the job left during its re-attach";
      break;
    }
    reattached = std::move(next);
    fd = reattached.get();
    hdr = fresh;
    head = 0, last_seq = 0;
    end_reason = "client disconnected";
    ctl->attached(fd);
    t_reattach = std::chrono::steady_clock::now();
    first_answers = 3;
    POS_INFO("posd", "session %lu (pid %d, '%s'): re-attached", (unsigned long)*uuid, spec.pid, spec.job.c_str());
  }
  if (ctl != nullptr) ctl->ended();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // the client learns at once that its session is over
  const ClientStats st2 = client ? client->stats() : ClientStats{};
  client.reset();  // the workspace alone owns it while it is removed
  Status rm = ws.remove_client(*uuid);
  if (ctl != nullptr) ctl->set_share_slot(nullptr);
  share.reset();  // its worker is gone: the gate goes, and the slot
  const std::string rm_note = rm.ok() ? "" : " (" + rm.to_string() + ")";
  POS_INFO("posd", "session %lu (pid %d, '%s') ended: %s; %lu frames, freed %lu bytes of device memory%s",
           (unsigned long)*uuid, spec.pid, spec.job.c_str(), end_reason.c_str(), (unsigned long)progress->frames.load(),
           (unsigned long)st2.memory_in_use, rm_note.c_str());
}

}  // namespace pos
