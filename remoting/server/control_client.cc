// control_client.cc — posd_control: a control hello, the welcome, then the reply text.
// The reply's length is bounded before anything is allocated: posd is a peer, not trusted blindly.
#include "remoting/server/control_client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <climits>
#include <filesystem>

#include "pos/base/text.h"
#include "remoting/common/handshake.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"
#include "remoting/common/wire.h"
#include "remoting/server/peer_transfer.h"

namespace pos {

namespace {

// A control connection to posd: its hello sent (the caller's uid checked by posd, posd's by us).
StatusOr<int> open_control(const std::string& socket_path, const std::string& command) {
  wire::Hello hello;
  hello.kind = static_cast<uint32_t>(wire::HelloKind::kControl);
  hello.pid = static_cast<uint32_t>(::getpid());
  wire::put_cstr(hello.command, sizeof(hello.command), command);
  return open_posd_socket(socket_path, hello);
}

}  // namespace

StatusOr<std::string> posd_control(const std::string& socket_path, const std::string& command) {
  auto fd = open_control(socket_path, command);
  if (!fd.ok()) return fd.status();
  wire::Welcome w;
  Status s = recv_all(*fd, &w, sizeof(w));
  if (s.ok()) s = check_welcome(w);
  std::string text;
  if (s.ok() && w.control_bytes > (64u << 20)) s = Status::Corrupt("posd's reply is too long");
  if (s.ok()) {
    text.resize(w.control_bytes);
    s = recv_all(*fd, text.data(), text.size());
  }
  ::close(*fd);
  if (!s.ok()) return s;
  return text;
}

// One checkpoint request on its own connection: the body and its descriptors, then posd's
// welcome and events up to the result.
namespace {
StatusOr<CheckpointReport> run_checkpoint(const std::string& socket_path, const wire::CheckpointBody& body, int dir_fd,
                                          int prev_fd, const std::string& dir,
                                          const std::function<void(uint64_t, uint64_t)>& progress,
                                          const std::function<void(uint64_t)>& on_cut,
                                          const std::function<void(const std::string&, uint64_t, uint64_t)>& on_written) {
  auto fd = open_control(socket_path, "checkpoint");
  if (!fd.ok()) return fd.status();
  UniqueFd sock(*fd);
  // posd may have refused at the hello already (then its welcome is there to read).
  (void)(prev_fd >= 0 ? send_with_fds(sock.get(), &body, sizeof(body), {dir_fd, prev_fd})
                      : send_with_fds(sock.get(), &body, sizeof(body), {dir_fd}));
  // A checkpoint's answer comes when it is done, however long the cut and the drain take.
  timeval none{0, 0};
  (void)setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  wire::Welcome w;
  POS_RETURN_IF_ERROR(recv_all(sock.get(), &w, sizeof(w)).with_context("posd's answer"));
  POS_RETURN_IF_ERROR(check_welcome(w));
  for (;;) {
    wire::ControlEvent e;
    Status s = recv_all(sock.get(), &e, sizeof(e));
    if (!s.ok()) return Status::Unavailable("the job's session ended before the checkpoint's result came (" + s.message() + ")");
    if (e.magic != wire::kEventMagic) return Status::Corrupt("posd sent a malformed checkpoint event");
    if (e.type == static_cast<uint32_t>(wire::EventType::kProgress)) {
      if (wire::get_cstr(e.phase, sizeof(e.phase)) == "cut") {
        if (on_cut) on_cut(e.cut_pc);
      } else if (progress && e.done <= e.total) {
        progress(e.done, e.total);
      }
      continue;
    }
    if (e.type == static_cast<uint32_t>(wire::EventType::kWritten)) {
      // Only what was asked for, and only a memory file's name (the caller opens it).
      const std::string file = wire::get_cstr(e.phase, sizeof(e.phase));
      const bool named = file == "memory.bin" || (file.size() > 11 && file.rfind("memory.", 0) == 0 &&
                                                  file.substr(file.size() - 4) == ".bin" &&
                                                  file.find_first_not_of("0123456789", 7) == file.size() - 4);
      if (!on_written || !named || e.total == 0 || e.done > (uint64_t{1} << 50) || e.total > (uint64_t{1} << 30))
        return Status::Corrupt("posd sent a malformed written-range event");
      on_written(file, e.done, e.total);
      continue;
    }
    if (e.type != static_cast<uint32_t>(wire::EventType::kResult)) return Status::Corrupt("posd sent an unknown checkpoint event");
    if (e.code != 0)
      return Status(static_cast<Code>(e.code > 0 && e.code <= static_cast<int32_t>(Code::kInternal) ? e.code
                                                                                               : static_cast<int32_t>(Code::kInternal)),
                    e.api_error, wire::get_cstr(e.message, sizeof(e.message)));
    CheckpointReport r;
    r.cut_pc = e.cut_pc, r.handles = e.handles, r.bytes_stored = e.bytes_stored, r.bytes_referenced = e.bytes_referenced;
    r.bytes_from_image = e.bytes_from_image;
    r.stall_s = e.stall_s, r.total_s = e.total_s;
    r.image = dir + "/gpu";
    return r;
  }
}
}  // namespace

StatusOr<CheckpointReport> posd_checkpoint(const std::string& socket_path, uint32_t pid, const std::string& dir,
                                           bool async, const std::function<void(uint64_t, uint64_t)>& progress,
                                           const std::function<void(uint64_t)>& on_cut,
                                           const std::string& prev_dir, bool lazy_ok, bool peer,
                                           const std::function<void(const std::string&, uint64_t, uint64_t)>& on_written) {
  if (dir.empty()) return Status::InvalidArgument("no image directory given");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::InvalidArgument("cannot create " + dir + ": " + std::strerror(errno));
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return Status::InvalidArgument("cannot open " + dir + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstatat(d.get(), "gpu", &st, AT_SYMLINK_NOFOLLOW) == 0)
    return Status::InvalidArgument(dir + " already holds an image (" + dir +
                                   "/gpu): name an empty or new directory");
  wire::CheckpointBody body;
  body.target_pid = pid;
  body.mode = static_cast<uint32_t>(async ? wire::CheckpointKind::kAsync : wire::CheckpointKind::kSync);
  UniqueFd prev;
  if (!prev_dir.empty()) {
    // The new image names its parent relative to itself, so that the two may move together.
    char a[PATH_MAX], b[PATH_MAX];
    if (::realpath(dir.c_str(), a) == nullptr || ::realpath(prev_dir.c_str(), b) == nullptr)
      return Status::InvalidArgument("cannot resolve " + prev_dir + ": " + std::strerror(errno));
    const std::string rel = (std::filesystem::path(b) / "gpu").lexically_relative(std::filesystem::path(a) / "gpu").string();
    if (rel.empty() || rel.size() >= sizeof(body.parent_path) - 1 || printable(rel) != rel)
      return Status::InvalidArgument("the previous image's path " + printable(rel) + " cannot be recorded in an image");
    prev.reset(::open(prev_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!prev) return Status::InvalidArgument("cannot open " + prev_dir + ": " + std::strerror(errno));
    body.flags |= wire::kCheckpointIncremental;
    wire::put_cstr(body.parent_path, sizeof(body.parent_path), rel);
  }
  if (lazy_ok) body.flags |= wire::kCheckpointLazyOk;
  if (peer) body.flags |= wire::kCheckpointPeer;
  if (on_written) body.flags |= wire::kCheckpointWrites;
  return run_checkpoint(socket_path, body, d.get(), prev.get(), dir, progress, on_cut, on_written);
}

StatusOr<CheckpointReport> posd_estimate_increment(const std::string& socket_path, uint32_t pid, const std::string& prev_dir,
                                                   uint64_t since_call) {
  UniqueFd prev(::open(prev_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!prev) return Status::InvalidArgument("cannot open " + prev_dir + ": " + std::strerror(errno));
  wire::CheckpointBody body;
  body.target_pid = pid;
  body.flags = wire::kCheckpointIncremental | wire::kCheckpointEstimate;
  if (since_call > 0) body.flags |= wire::kCheckpointSince, body.since_call = since_call;
  wire::put_cstr(body.parent_path, sizeof(body.parent_path), "gpu");  // checked, not recorded: nothing is written
  // The request's directory is the previous image's too: posd checks it is one, and writes nothing.
  auto r = run_checkpoint(socket_path, body, prev.get(), prev.get(), {}, {}, {}, {});
  if (r.ok()) r->image.clear();
  return r;
}


StatusOr<std::string> posd_detach(const std::string& socket_path, uint32_t pid, const std::string& permit,
                                  uint32_t timeout_ms, uint64_t* arena_bytes) {
  if (permit.empty() || permit[0] != '/') return Status::InvalidArgument("the permit must be an absolute path");
  auto fd = open_control(socket_path, "detach");
  if (!fd.ok()) return fd.status();
  UniqueFd sock(*fd);
  wire::DetachBody body;
  body.target_pid = pid;
  body.timeout_ms = timeout_ms;
  wire::put_cstr(body.permit, sizeof(body.permit), permit);
  (void)send_all(sock.get(), &body, sizeof(body));  // a refusal at the hello is read below
  timeval none{0, 0};
  (void)setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  wire::Welcome w;
  POS_RETURN_IF_ERROR(recv_all(sock.get(), &w, sizeof(w)).with_context("posd's answer"));
  POS_RETURN_IF_ERROR(check_welcome(w));
  wire::ControlEvent e;
  POS_RETURN_IF_ERROR(recv_all(sock.get(), &e, sizeof(e)).with_context("the detach's result"));
  if (e.magic != wire::kEventMagic || e.type != static_cast<uint32_t>(wire::EventType::kResult))
    return Status::Corrupt("posd sent a malformed detach result");
  const std::string msg = wire::get_cstr(e.message, sizeof(e.message));
  if (e.code != 0)
    return Status(static_cast<Code>(e.code > 0 && e.code <= static_cast<int32_t>(Code::kInternal)
                                        ? e.code
                                        : static_cast<int32_t>(Code::kInternal)),
                  e.api_error, msg);
  if (arena_bytes != nullptr) *arena_bytes = e.total;
  return msg;
}

namespace {
Status event_status(const wire::ControlEvent& e) {
  const int32_t c = e.code > 0 && e.code <= static_cast<int32_t>(Code::kInternal) ? e.code : static_cast<int32_t>(Code::kInternal);
  return Status(static_cast<Code>(c), e.api_error, wire::get_cstr(e.message, sizeof(e.message)));
}
}  // namespace

StatusOr<PendingRestore> begin_restore(const std::string& socket_path, const std::string& dir, const RestoreRequest& r) {
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return Status::InvalidArgument("cannot open " + dir + ": " + std::strerror(errno));
  const auto t0 = std::chrono::steady_clock::now();
  auto fd = open_control(socket_path, "restore");
  if (!fd.ok()) return fd.status();
  PendingRestore p;
  p.sock.reset(*fd);
  wire::RestoreBody body;
  body.target_pid = r.pid;
  body.uid = r.uid;
  if (r.lazy && r.peer != nullptr && r.staged_image.empty())
    return Status::InvalidArgument("a restore from a peer session's memory is not lazy");
  if (!r.staged_image.empty() && (r.peer == nullptr || r.staged_image.size() != 32))
    return Status::InvalidArgument("a staged restore needs the staging session's memory and its image's id");
  if (r.stage && (r.lazy || r.peer != nullptr)) return Status::InvalidArgument("a staging restore is eager and alone");
  body.flags = r.lazy ? static_cast<uint32_t>(wire::kRestoreLazy) : 0u;
  if (r.peer != nullptr) body.flags |= wire::kRestorePeer;
  if (!r.staged_image.empty()) body.flags |= wire::kRestoreStaged;
  if (r.stage) body.flags |= wire::kRestoreStage;
  body.arena_bytes = r.arena_bytes;
  wire::put_cstr(body.token, sizeof(body.token), r.token);
  wire::put_cstr(body.job, sizeof(body.job), r.job);
  (void)send_with_fds(p.sock.get(), &body, sizeof(body), {d.get()});  // a refusal at the hello is read below
  // Rebuilding a large GPU state takes as long as it takes.
  timeval none{0, 0};
  (void)setsockopt(p.sock.get(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  wire::Welcome w;
  POS_RETURN_IF_ERROR(recv_all(p.sock.get(), &w, sizeof(w)).with_context("posd's answer"));
  POS_RETURN_IF_ERROR(check_welcome(w));
  const auto t_welcome = std::chrono::steady_clock::now();
  p.welcome_s = std::chrono::duration<double>(t_welcome - t0).count();
  if (r.peer != nullptr) {  // the source's memory, to the restoring session (it copies, then answers)
    if (!r.staged_image.empty()) {
      wire::StagedImage si;
      wire::put_cstr(si.image_id, sizeof(si.image_id), r.staged_image);
      POS_RETURN_IF_ERROR(send_all(p.sock.get(), &si, sizeof(si)).with_context("naming the staged image"));
    }
    POS_RETURN_IF_ERROR(send_peer_table(p.sock.get(), *r.peer).with_context("handing the job's memory to the target"));
    p.table_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_welcome).count();
  }
  for (;;) {
    wire::ControlEvent e;
    Status s = recv_all(p.sock.get(), &e, sizeof(e));
    if (!s.ok()) return Status::Unavailable("the restoring session ended before the GPU state was up (" + s.message() + ")");
    if (e.magic != wire::kEventMagic) return Status::Corrupt("posd sent a malformed restore event");
    if (e.type == static_cast<uint32_t>(wire::EventType::kResult)) {
      if (e.code != 0) return event_status(e);
      return Status::Corrupt("posd ended the restore before the job was restored");
    }
    if (e.type == static_cast<uint32_t>(wire::EventType::kProgress) && wire::get_cstr(e.phase, sizeof(e.phase)) == "restored") {
      p.gpu_s = e.total_s, p.bytes = e.total, p.handles = e.handles;
      return p;
    }
  }
}

Status finish_restore(PendingRestore& p, uint32_t pid) {
  POS_RETURN_IF_ERROR(send_restore_go(p, pid));
  return await_restore(p);
}

Status send_restore_go(PendingRestore& p, uint32_t pid) {
  wire::RestoreGo go;
  go.pid = pid;
  return send_all(p.sock.get(), &go, sizeof(go)).with_context("telling the session the job is restored");
}

Status posd_release(const std::string& socket_path, uint32_t pid, const std::string& token) {
  auto fd = open_control(socket_path, "release");
  if (!fd.ok()) return fd.status();
  UniqueFd sock(*fd);
  wire::ReleaseBody body;
  body.target_pid = pid;
  wire::put_cstr(body.token, sizeof(body.token), token);
  (void)send_all(sock.get(), &body, sizeof(body));  // a refusal at the hello is read below
  wire::Welcome w;
  POS_RETURN_IF_ERROR(recv_all(sock.get(), &w, sizeof(w)).with_context("posd's answer"));
  return check_welcome(w);
}

StatusOr<std::vector<PeerMemory>> posd_peer_export(const std::string& socket_path, uint32_t pid, const std::string& token) {
  auto fd = open_control(socket_path, "peer-export");
  if (!fd.ok()) return fd.status();
  UniqueFd sock(*fd);
  wire::PeerExportBody body;
  body.target_pid = pid;
  wire::put_cstr(body.token, sizeof(body.token), token);
  (void)send_all(sock.get(), &body, sizeof(body));  // a refusal at the hello is read below
  timeval t{60, 0};  // the session synchronizes the job's device work first
  (void)setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  wire::Welcome w;
  POS_RETURN_IF_ERROR(recv_all(sock.get(), &w, sizeof(w)).with_context("posd's answer"));
  POS_RETURN_IF_ERROR(check_welcome(w));
  return recv_peer_table(sock.get());
}

Status await_restore(PendingRestore& p) {
  timeval t{75, 0};  // the session answers within a minute either way
  (void)setsockopt(p.sock.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  for (;;) {
    wire::ControlEvent e;
    Status s = recv_all(p.sock.get(), &e, sizeof(e));
    if (!s.ok()) return Status::Unavailable("the restored job's session ended before it re-attached (" + s.message() + ")");
    if (e.magic != wire::kEventMagic) return Status::Corrupt("posd sent a malformed restore event");
    if (e.type == static_cast<uint32_t>(wire::EventType::kResult)) return e.code == 0 ? Status::Ok() : event_status(e);
  }
}

void wait_until_taken(const std::string& path, uint32_t pid) {
  struct stat st {};
  for (int i = 0; i < 2500 && ::stat(path.c_str(), &st) == 0; ++i) {
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return;
    ::usleep(2'000);
  }
}

Status grant_reattach(const std::string& permit, const std::string& socket_path, int64_t owner) {
  const std::string tmp = permit + ".tmp";
  // Readable by the job's user (it names a socket, no secret): a job that is not root reads it.
  UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!f) return Status::Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  (void)::fchmod(f.get(), 0644);  // whatever the umask
  // The job's own: the job trusts a permit of root or of its own uid only, and removes it after use.
  if (owner >= 0 && static_cast<uid_t>(owner) != ::geteuid() && ::fchown(f.get(), static_cast<uid_t>(owner), -1) != 0)
    return Status::Unavailable("cannot give " + tmp + " to uid " + std::to_string(owner) + ": " + std::strerror(errno));
  const std::string text = socket_path + "\n";
  if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(f.get()) != 0)
    return Status::Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  f.reset();
  if (::rename(tmp.c_str(), permit.c_str()) != 0)
    return Status::Unavailable("cannot put " + permit + " in place: " + std::strerror(errno));
  return Status::Ok();
}

StatusOr<std::string> new_permit_path() {
  unsigned char r[16];
  UniqueFd u(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!u || ::read(u.get(), r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)))
    return Status::Unavailable("no randomness for a permit name");
  static const char kHex[] = "0123456789abcdef";
  std::string name = "pos-permit-";
  for (unsigned char c : r) name += kHex[c >> 4], name += kHex[c & 15];
  struct stat st {};
  const char* dir = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) ? "/dev/shm" : "/tmp";
  return std::string(dir) + "/" + name;
}

}  // namespace pos
