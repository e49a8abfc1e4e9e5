// posd_server.cc — the acceptor (every hello read in one thread with poll and a deadline; bounds
// on waiting connections and sessions), sessions (SO_PEERCRED, protocol version, sealed memfd +
// eventfd), the serve loop (decode, pos_process, reply; spin then sleep in poll) and teardown on hang-up.
#include "remoting/server/posd_server.h"
#include "remoting/server/checkpoint_policy.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "pos/base/cuda_errors.h"
#include "pos/base/log.h"
#include "pos/base/parse.h"
#include "pos/base/sync.h"
#include "pos/base/text.h"
#include "pos/base/thread.h"
#include "remoting/client/shm_client.h"
#include "remoting/common/usage_region.h"
#include "remoting/common/handshake.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"
#include "remoting/common/wire.h"
#include "remoting/server/session_process.h"
#include "remoting/server/session_serve.h"
#include "pos/runtime.h"

extern char** environ;

namespace pos {

struct PosdServer::Session {
  UniqueFd fd;
  ucred cred{};
  std::string job;  // printable (made so at the hello)
  uint64_t arena_bytes = 0;
  // The thread has ended its work and may be joined without waiting: the acceptor reaps such
  // sessions one by one (sessions_gate_ counts sessions, it cannot say which one ended).
  std::atomic<bool> finished{false};
  std::thread thread;
  // posd.isolation: process. The session process serves the client (fd is then empty here); posd
  // asks it for ps through the channel (io serializes the askers) and reaps it when it ends.
  pid_t child = -1;
  UniqueFd channel;
  std::mutex io;
  uint64_t generation = 0;
  std::string token;  // guarded by io: set while a detach is requested, until the job re-attaches
  SessionProgress progress;  // posd.isolation: shared
};

// A connection whose hello has not all arrived. The acceptor alone owns these: a connection costs
// no thread until its hello is admitted.
struct PosdServer::Handshake {
  UniqueFd fd;
  ucred cred{};
  Status admitted;  // the peer's admission, decided at accept, told once it sends a byte
  wire::Hello hello;
  size_t got = 0;  // bytes of the hello so far
  // A checkpoint or detach request's body after its hello, and a descriptor that came with it.
  alignas(8) std::byte body[std::max({sizeof(wire::DetachBody), sizeof(wire::RestoreBody), sizeof(wire::CheckpointBody)})] = {};
  size_t body_got = 0;
  UniqueFd passed, passed2;  // an incremental checkpoint's previous image comes second
  std::chrono::steady_clock::time_point deadline;
};

namespace {

constexpr size_t kMaxJobNameBytes = 256;  // as POSWorkspace::create_client keeps it

void set_blocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_NONBLOCK) != 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

// A refusal a flood repeats (connections beyond posd.max_pending, hellos that never come) is
// logged at most once a second; the next line says how many were not. Acceptor-only.
class LogThrottle {
 public:
  // True: log now, saying `*held_back` more happened since the last line.
  bool allow(uint64_t* held_back) {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) {
      ++held_back_;
      return false;
    }
    next_ = now + std::chrono::seconds(1);
    *held_back = std::exchange(held_back_, 0);
    return true;
  }

 private:
  std::chrono::steady_clock::time_point next_{};
  uint64_t held_back_ = 0;
};

std::string more_text(uint64_t held_back) {
  return held_back == 0 ? std::string() : " (and " + std::to_string(held_back) + " more since the last such line)";
}

std::string octal_mode(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof(b), "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

const char* state_of(const SessionInfo& s) {
  if (s.ending) return "ending";
  if (s.starting) return "starting";
  if (s.detached) return "detached";
  return s.stats.calls_executed < s.stats.calls_submitted ? "running" : "idle";
}


// The peer's credentials; its supplementary groups where the kernel tells them (Linux >= 4.13).
bool peer_credentials(int fd, ucred* cred, PeerCredentials* out) {
  socklen_t len = sizeof(*cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0) return false;
  out->uid = cred->uid, out->gid = cred->gid;
  std::vector<gid_t> g(64);
  for (int tries = 0; tries < 4; ++tries) {
    socklen_t glen = static_cast<socklen_t>(g.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g.data(), &glen) == 0) {
      out->groups.assign(g.begin(), g.begin() + glen / sizeof(gid_t));
      break;
    }
    if (errno != ERANGE) break;  // an older kernel: the primary group only
    g.resize(glen / sizeof(gid_t) + 16);
  }
  return true;
}

}  // namespace

// The acceptor's throttles, one per kind of line.
struct PosdServer::AcceptorLogs {
  LogThrottle late, crowded, no_fds;
};

Status admit(const PeerCredentials& peer, uint32_t server_uid, int64_t group_gid) {
  if (peer.uid == server_uid) return Status::Ok();
  if (group_gid >= 0) {
    const auto g = static_cast<uint32_t>(group_gid);
    if (peer.gid == g || std::find(peer.groups.begin(), peer.groups.end(), g) != peer.groups.end())
      return Status::Ok();
  }
  const std::string who = "uid " + std::to_string(peer.uid) + " (gid " + std::to_string(peer.gid) + ")";
  const std::string rule = group_gid >= 0 ? "uid " + std::to_string(server_uid) + " (its owner) and members of group " +
                                                std::to_string(group_gid) + " (posd.group)"
                                          : "only uid " + std::to_string(server_uid) +
                                                " (its owner; posd.group admits a group too)";
  return Status(Code::kFailedPrecondition, cuda::kErrorInitializationError,
                who + " may not use this posd: it admits " + rule);
}

StatusOr<int64_t> resolve_group(const std::string& group) {
  if (group.empty()) return int64_t{-1};
  if (group.size() <= 10 && std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    const uint64_t gid = std::stoull(group);
    if (gid >= (1ull << 31)) return Status::InvalidArgument("posd.group: gid " + group + " is out of range");
    return static_cast<int64_t>(gid);
  }
  std::vector<char> buf(16384);
  struct group gr{};
  struct group* found = nullptr;
  int e = 0;
  while ((e = ::getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &found)) == ERANGE && buf.size() < (1u << 22))
    buf.resize(buf.size() * 2);
  if (found == nullptr)
    return Status::InvalidArgument("posd.group: no group named '" + group + "'" +
                                   (e != 0 ? std::string(" (") + std::strerror(e) + ")" : std::string()) +
                                   ": name an existing group or give its gid");
  return static_cast<int64_t>(found->gr_gid);
}

StatusOr<std::unique_ptr<PosdServer>> PosdServer::start(const Config& config) {
  std::unique_ptr<PosdServer> srv(new PosdServer());
  srv->config_ = config;
  set_log_level(config.log_level);
  if (!config.host_kernel_libraries.empty() && config.backend != "host")
    return Status::InvalidArgument("posd.host_kernel_libraries apply to the host backend only");
  if (const auto& p = config.posd_policy; !p.jobs.empty()) {
    if (p.dir.empty()) return Status::InvalidArgument("posd.checkpoint_policy: dir is required with jobs");
    if (auto iv = parse_interval(p.every); !iv.ok())
      return Status::InvalidArgument("posd.checkpoint_policy.every: " + iv.status().message());
    srv->policy_cli_ = p.cli;
    if (srv->policy_cli_.empty()) {  // beside posd (the build tree and an install both have it there)
      char self[4096];
      const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
      const std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
      const std::string beside = dir.substr(0, dir.rfind('/') + 1) + "pos-cli";
      srv->policy_cli_ = !dir.empty() && ::access(beside.c_str(), X_OK) == 0 ? beside : "pos-cli";
    }
  }
  // Host kernels run where the clients' memory is: in posd (shared) or in each session process.
  for (const auto& lib : config.posd_isolation == Isolation::kShared ? config.host_kernel_libraries
                                                                      : std::vector<std::string>{}) {
    void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return Status::InvalidArgument("cannot load host kernel library " + lib + ": " + ::dlerror());
    srv->kernel_libs_.push_back(h);
  }
  auto gid = resolve_group(config.posd_group);
  if (!gid.ok()) return gid.status();
  srv->group_gid_ = *gid;
  // The usage region posd keeps for several users' jobs (docs/limits.md): made now, shared with
  // posd.group. One that cannot be kept stops posd: the operator asked for it.
  if (!config.posd_usage_region.empty()) {
    if (Status s = UsageRegion::keep(config.posd_usage_region, *gid); !s.ok()) return s.with_context("posd.usage_region");
    POS_INFO("posd", "keeps the usage region %s%s", config.posd_usage_region.c_str(),
             *gid >= 0 ? (", shared with group " + std::to_string(*gid)).c_str() : " (posd.group unset: its user's only)");
  }
  srv->owner_uid_.store(::geteuid());
  srv->socket_path_ = config.posd_socket.empty() ? default_socket_path() : config.posd_socket;
  sockaddr_un addr{};
  if (srv->socket_path_.size() >= sizeof(addr.sun_path))
    return Status::InvalidArgument("socket path too long: " + srv->socket_path_);
  POS_RETURN_IF_ERROR(srv->prepare_socket_dir());
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, srv->socket_path_.c_str(), srv->socket_path_.size() + 1);
  // A leftover socket file is replaced, a live daemon is not. Asked before the workspace: a posd
  // that cannot serve must not take the GPU first. The probe connects and closes without a byte,
  // which the live daemon counts as a probe (read_hello), not as a client gone wrong.
  if (::access(srv->socket_path_.c_str(), F_OK) == 0) {
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) ::close(probe);
    if (live) return Status::Busy("another posd is listening on " + srv->socket_path_);
    ::unlink(srv->socket_path_.c_str());
  }
  // The devices to check posd.devices against come from the backend: posd's own (shared), or a
  // probe session process's, which also proves before any client comes that session processes
  // start here (the program is found, the backend comes up, host kernel libraries load).
  int count = 0;
  if (config.posd_isolation == Isolation::kShared) {
    auto ws = create_workspace(config);
    if (!ws.ok()) return ws.status();
    srv->ws_ = std::move(ws.value());
    count = srv->ws_->backend().device_count();
    srv->backend_name_ = std::string(srv->ws_->backend().name());
  } else {
    auto bin = find_session_binary(config);
    if (!bin.ok()) return bin.status();
    srv->session_binary_ = *bin;
    srv->config_yaml_ = config_to_yaml(config);
    Config ahead = config;
    ahead.posd_checkpoint_staging_ahead = true;
    if (!ahead.ckpt_keep_shadows.has_value()) ahead.ckpt_keep_shadows = true;
    srv->config_yaml_ahead_ = config_to_yaml(ahead);
    srv->session_env_ = environment_snapshot();
    session_channel::Start probe;
    probe.kind = static_cast<uint32_t>(session_channel::Kind::kProbe);
    auto p = spawn_session_process(srv->session_binary_, -1, probe, "", srv->config_yaml_, srv->session_env_);
    if (!p.ok()) return p.status();
    // Generous: the first CUDA initialization on a machine can take seconds.
    auto r = await_report(p->channel.get(), std::chrono::seconds(120));
    const int wst = wait_or_kill(p->pid, std::chrono::seconds(r.ok() ? 30 : 1));
    if (!r.ok())
      return Status::Unavailable("posd's probe session process (" + srv->session_binary_ + ") " +
                                 describe_wait_status(wst) + " without a report (" + r.status().message() +
                                 "); its log lines above say why");
    if (r->code != 0)
      return Status(static_cast<Code>(r->code), r->api_error, r->message).with_context("a session process cannot start");
    count = r->device_count;
    srv->backend_name_ = r->backend;
  }
  // The YAML parser refuses negative and repeated indices already; an embedder's Config may not.
  const auto& devices = config.posd_devices;
  for (auto it = devices.begin(); it != devices.end(); ++it) {
    if (*it < 0 || *it >= count)
      return Status::InvalidArgument("posd.devices lists device " + std::to_string(*it) + ", but the " +
                                     srv->backend_name_ + " backend has " + std::to_string(count) +
                                     " device(s) (0.." + std::to_string(count - 1) + ")");
    if (std::find(devices.begin(), it, *it) != it)
      return Status::InvalidArgument("posd.devices lists device " + std::to_string(*it) + " twice");
  }

  // Non-blocking: the acceptor takes every connection that is there, then goes back to poll.
  srv->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (srv->listen_fd_ < 0) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  // Owner only (or owner + the configured group): the socket's mode is the first gate, the
  // SO_PEERCRED check the second.
  const int64_t group = srv->group_gid_;
  const mode_t old = ::umask(group >= 0 ? 0117 : 0177);
  const int b = ::bind(srv->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::umask(old);
  if (b != 0) return Status::Unavailable("cannot bind " + srv->socket_path_ + ": " + std::strerror(errno));
  srv->bound_ = true;  // from here every failed start removes the socket again (stop(), from the destructor)
  if (group >= 0 && ::chown(srv->socket_path_.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(group)) != 0) {
    const int e = errno;
    return Status::Unavailable("cannot give " + srv->socket_path_ + " to group " + std::to_string(group) + ": " +
                               std::strerror(e) + " (posd's user must be a member of posd.group)");
  }
  if (::listen(srv->listen_fd_, 64) != 0) return Status::Unavailable(std::string("listen: ") + std::strerror(errno));
  srv->stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (srv->stop_fd_ < 0) return Status::Unavailable(std::string("eventfd: ") + std::strerror(errno));
  // Before the acceptor: the first client may take it.
  if (config.posd_spare_session && config.posd_isolation == Isolation::kProcess) srv->start_spare();
  POS_RETURN_IF_ERROR(start_thread(&srv->acceptor_, "posd's acceptor thread", [p = srv.get()] {
    name_this_thread("posd-accept");
    p->accept_main();
  }));
  // No "listening" line here: tools/posd.cc prints it, once, at every log level.
  return srv;
}

// The socket's directory decides who can put a socket at posd's name: only posd's uid may write
// it. An existing one must pass check_socket_dir for posd's uid (and let posd.group's members
// search it); a missing one is made, 0700 or, with posd.group, 0710 and the group's: members need
// search (x) to reach the socket, never read (listing) or write.
Status PosdServer::prepare_socket_dir() {
  const std::string dir = socket_dir_of(socket_path_);
  const uint32_t me = ::geteuid();
  const std::string whose = "uid " + std::to_string(me) + " (posd's)";
  const bool group = group_gid_ >= 0;
  const mode_t mode = group ? 0710 : 0700;
  Status st = check_socket_dir(dir, {me}, whose);
  if (st.code() == Code::kNotFound) {
    if (::mkdir(dir.c_str(), mode) == 0) {
      created_dir_ = true;
    } else if (errno != EEXIST) {  // EEXIST: made meanwhile; checked below like any other
      return Status::Unavailable("cannot create posd's socket directory " + dir + ": " + std::strerror(errno) +
                                 " (its parent must exist)");
    }
    st = check_socket_dir(dir, {me}, whose);
  }
  if (!st.ok()) return Status(st.code(), st.api_error(), "posd's socket directory: " + st.message());
  if (created_dir_) {
    // mkdir's mode went through the umask; the group is the creator's: set both as meant. Through
    // a descriptor of the directory itself, so a rename in between cannot redirect them.
    UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!d || ::fchmod(d.get(), mode) != 0 ||
        (group && ::fchown(d.get(), static_cast<uid_t>(-1), static_cast<gid_t>(group_gid_)) != 0))
      return Status::Unavailable("cannot give posd's socket directory " + dir + (group ? " to posd.group " : "") +
                                 (group ? std::to_string(group_gid_) : std::string()) + " and mode " +
                                 (group ? "0710" : "0700") + ": " + std::strerror(errno) +
                                 (group ? " (posd's user must be a member of posd.group)" : ""));
    return Status::Ok();
  }
  if (group) {
    struct stat sd {};
    const auto gid = static_cast<gid_t>(group_gid_);
    if (::stat(dir.c_str(), &sd) == 0 && !((sd.st_gid == gid && (sd.st_mode & 010)) || (sd.st_mode & 001)))
      return Status::FailedPrecondition(
          "posd's socket directory " + dir + " (mode " + octal_mode(sd.st_mode) + ", group " +
          std::to_string(sd.st_gid) + ") does not let posd.group " +
          std::to_string(group_gid_) + " search it, so its members could not reach the socket: chgrp " +
          std::to_string(group_gid_) + " and chmod g+x it, or remove it and posd makes it");
  }
  return Status::Ok();
}

PosdServer::~PosdServer() {
  stop();
  ws_.reset();
  for (void* h : kernel_libs_) ::dlclose(h);
}

void PosdServer::stop() {
  if (!sessions_gate_.close()) {  // another stop() came first
    if (acceptor_.joinable()) acceptor_.join();
    return;
  }
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof(one));  // never read: stays readable for every poll
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    // Each waits at most 10 s for its session, less once the gate closed.
    std::vector<PolicyStarter> policies;
    {
      std::lock_guard<std::mutex> lk(policy_mu_);
      policies.swap(policy_threads_);
    }
    for (PolicyStarter& p : policies) p.thread.join();
  }
  std::list<std::unique_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    all.swap(sessions_);
  }
  // Every session ends at once: stop_fd_ woke the serving ones (connections still waiting for
  // their hello were the acceptor's, closed as it returned), and each client learns at once.
  // Their teardowns run side by side; the joins then only collect threads.
  for (auto& s : all) {
    if (s->fd) ::shutdown(s->fd.get(), SHUT_RDWR);
    // A session process ends its session when posd closes its channel (as if posd had died).
    if (s->channel) ::shutdown(s->channel.get(), SHUT_RDWR);
  }
  sessions_gate_.wait_drained(0);
  for (auto& s : all) {
    if (s->thread.joinable()) s->thread.join();
    if (s->child > 0 && !s->finished.load()) {
      const int st = wait_or_kill(s->child, std::chrono::seconds(10));
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        POS_WARN("posd", "session process %d (pid %d, '%s') %s", static_cast<int>(s->child), s->cred.pid,
                 s->job.c_str(), describe_wait_status(st).c_str());
    }
  }
  all.clear();  // closes their sockets
  for (SessionProcess spare = take_spare(); spare.pid > 0; spare = take_spare()) {
    spare.channel.reset();  // a spare ends when its channel closes
    (void)wait_or_kill(spare.pid, std::chrono::seconds(10));
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  // Only a socket this posd bound is removed: a start that failed before binding (another posd
  // took the name meanwhile) must not take a live daemon's socket away.
  if (bound_) {
    ::unlink(socket_path_.c_str());
    bound_ = false;
  }
  // The directory goes too if this posd made it (and nothing else is in it now).
  if (created_dir_) {
    (void)::rmdir(socket_dir_of(socket_path_).c_str());
    created_dir_ = false;
  }
  if (stop_fd_ >= 0) ::close(stop_fd_), stop_fd_ = -1;
}

void PosdServer::reap_finished() {
  std::list<std::unique_ptr<Session>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if ((*it)->finished.load()) done.splice(done.end(), sessions_, it++);
      else ++it;
    }
  }
  for (auto& s : done)
    if (s->thread.joinable()) s->thread.join();
}  // `done` closes their sockets

// A session process hung up its channel: it is ending or has ended. Whatever ended it, only its
// own client lost its session; how it ended is logged (a signal means a fault in its calls or kernels).
void PosdServer::reap_process(Session* s) {
  const int st = wait_or_kill(s->child, std::chrono::seconds(10));
  const uint64_t uuid = s->generation << 16;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    POS_DEBUG("posd", "session process %d (session %lu) ended", static_cast<int>(s->child), (unsigned long)uuid);
  } else {
    POS_WARN("posd", "session %lu (pid %d, '%s'): its session process %d %s; no other session is affected",
             (unsigned long)uuid, s->cred.pid, s->job.c_str(), static_cast<int>(s->child),
             describe_wait_status(st).c_str());
  }
  s->finished.store(true);
}

size_t PosdServer::live_sessions() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<size_t>(std::count_if(sessions_.begin(), sessions_.end(),
                                           [](const auto& s) { return !s->finished.load(); }));
}

// One thread for every connection's handshake: poll() over the listening socket, stop_fd_ and the
// connections still sending their hello, each with its deadline. A session thread starts only for
// an admitted hello (start_session), so idle connections cost a descriptor and a few bytes each,
// and at most posd.max_pending of them.
void PosdServer::accept_main() {
  std::vector<Handshake> waiting;
  std::vector<pollfd> p;
  AcceptorLogs logs;
  while (sessions_gate_.is_open()) {
    reap_finished();
    const auto now = std::chrono::steady_clock::now();
    int timeout_ms = 1000;  // finished sessions are reaped at least this often
    for (const Handshake& h : waiting) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(h.deadline - now).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, timeout_ms));
    }
    p.assign({{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}});
    for (const Handshake& h : waiting) p.push_back({h.fd.get(), POLLIN, 0});
    // Session processes' channels, for their hang-up only (events 0): their answers to ps are
    // read by whoever asked. Only this thread removes sessions, so the pointers stay valid.
    std::vector<Session*> children;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (const auto& s : sessions_)
        if (s->child > 0 && !s->finished.load()) children.push_back(s.get());
    }
    for (Session* c : children) p.push_back({c->channel.get(), 0, 0});
    const int n = ::poll(p.data(), p.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      POS_ERROR("posd", "the acceptor's poll failed: %s; trying again", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (n > 0 && p[1].revents != 0) break;  // stop()
    for (size_t i = 0; n > 0 && i < children.size(); ++i)
      if (p[2 + waiting.size() + i].revents != 0) reap_process(children[i]);
    // Hellos first, then deadlines, then new connections: a connection is never judged before
    // poll has looked at it once.
    size_t kept = 0;
    for (size_t i = 0; i < waiting.size(); ++i) {
      const bool done = n > 0 && p[2 + i].revents != 0 && read_hello(waiting[i]);
      if (!done) {
        if (kept != i) waiting[kept] = std::move(waiting[i]);
        ++kept;
      }
    }
    waiting.resize(kept);
    const auto after = std::chrono::steady_clock::now();
    std::erase_if(waiting, [&](const Handshake& h) {
      if (h.deadline > after) return false;
      uint64_t held_back = 0;
      if (logs.late.allow(&held_back))
        POS_WARN("posd", "pid %d sent no hello within %lld ms; closed%s", h.cred.pid,
                 static_cast<long long>(hello_timeout_ms_.load()), more_text(held_back).c_str());
      return true;  // its UniqueFd closes it
    });
    if (n > 0 && (p[0].revents & POLLIN) != 0) accept_new(&waiting, &logs);
    waiting_.store(waiting.size(), std::memory_order_release);
  }
  waiting_.store(0, std::memory_order_release);
}  // `waiting` closes every connection still in its handshake

// Takes the connections that are there (a batch at most, so that hellos and deadlines get their
// turn in a flood). Beyond posd.max_pending a connection is refused at once.
void PosdServer::accept_new(std::vector<Handshake>* waiting, AcceptorLogs* logs) {
  for (int i = 0; i < 64; ++i) {
    UniqueFd fd(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      const int e = errno;
      if (e == EINTR || e == ECONNABORTED) continue;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        uint64_t held_back = 0;
        if (logs->no_fds.allow(&held_back))
          POS_WARN("posd", "cannot accept a connection: %s%s", std::strerror(e), more_text(held_back).c_str());
        // The connection stays in the backlog and poll reports it at once: do not spin on it.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;  // EAGAIN: none left
    }
    Handshake h;
    PeerCredentials peer;
    if (!peer_credentials(fd.get(), &h.cred, &peer)) {
      POS_WARN("posd", "connection without peer credentials refused");
      continue;
    }
    if (waiting->size() >= config_.posd_max_pending) {
      const Status why(Code::kBusy, cuda::kErrorInitializationError,
                       "too many connections waiting for their hello (" + std::to_string(config_.posd_max_pending) +
                           ", posd.max_pending); try again");
      uint64_t held_back = 0;
      if (logs->crowded.allow(&held_back))
        POS_WARN("posd", "refused pid %d: %s%s", h.cred.pid, why.message().c_str(), more_text(held_back).c_str());
      refuse_connection(fd.get(), why);
      continue;
    }
    h.fd = std::move(fd);
    h.admitted = admit(peer, owner_uid_.load(), group_gid_);
    h.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(hello_timeout_ms_.load());
    waiting->push_back(std::move(h));
  }
}

// Reads what arrived of h's hello. True once h is settled: handed to a session thread, answered,
// refused or dropped (the caller forgets it, which closes it unless a session took it).
namespace {

// 128 bits from the kernel, as hex: a session token. Empty if the kernel has none to give.
std::string random_token() {
  unsigned char b[16];
  size_t got = 0;
  while (got < sizeof(b)) {
    const ssize_t r = ::getrandom(b + got, sizeof(b) - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return {};
    got += static_cast<size_t>(r);
  }
  static const char* kHex = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) t += kHex[c >> 4], t += kHex[c & 15];
  return t;
}

// Equal bytes, in a time that does not depend on where they differ.
bool CRYPTO_memcmp_like(const char* a, const char* b, size_t n) {
  unsigned char d = 0;
  for (size_t i = 0; i < n; ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// The bytes of the body that follows a control hello: a CheckpointBody, a DetachBody, or none.
size_t body_size(const wire::Hello& h) {
  if (h.magic != wire::kHelloMagic || h.kind != static_cast<uint32_t>(wire::HelloKind::kControl)) return 0;
  const std::string c = wire::get_cstr(h.command, sizeof(h.command));
  return c == "checkpoint" ? sizeof(wire::CheckpointBody)
         : c == "detach"   ? sizeof(wire::DetachBody)
         : c == "restore"  ? sizeof(wire::RestoreBody)
         : c == "release"  ? sizeof(wire::ReleaseBody)
         : c == "peer-export" ? sizeof(wire::PeerExportBody)
                           : 0;
}

}  // namespace

bool PosdServer::read_hello(Handshake& h) {
  for (;;) {
    const bool body = h.got == sizeof(h.hello);
    auto* at = body ? reinterpret_cast<char*>(h.body) + h.body_got : reinterpret_cast<char*>(&h.hello) + h.got;
    const size_t want = body ? body_size(h.hello) - h.body_got : sizeof(h.hello) - h.got;
    UniqueFd got[2];
    const ssize_t r = recv_with_fds(h.fd.get(), at, want, got, 2);
    for (UniqueFd& g : got)
      if (g) (!h.passed ? h.passed : !h.passed2 ? h.passed2 : g) = std::move(g);  // a third is closed
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (r == 0 && h.got == 0) {
      // A peer that closes before its first byte is a liveness probe (PosdServer::start of a
      // second posd asking whether this one is alive), not a client that failed its hello.
      POS_DEBUG("posd", "pid %d connected and closed without a byte: a liveness probe (another posd checking)",
                h.cred.pid);
      probes_.fetch_add(1, std::memory_order_release);  // after the line: a test that sees the count sees the line
      return true;
    }
    if (r <= 0) {
      POS_WARN("posd", "pid %d sent no valid %s; dropped", h.cred.pid, body ? "checkpoint request" : "hello");
      return true;
    }
    (body ? h.body_got : h.got) += static_cast<size_t>(r);
    if (!h.admitted.ok()) {  // told at its first byte, as soon as it asks for anything
      POS_WARN("posd", "refused pid %d: %s", h.cred.pid, h.admitted.message().c_str());
      refuse_connection(h.fd.get(), h.admitted);
      return true;
    }
    if (h.got == sizeof(h.hello) && h.body_got == body_size(h.hello)) {
      on_hello(h);
      return true;
    }
  }
}

void PosdServer::on_hello(Handshake& h) {
  const wire::Hello& hello = h.hello;
  const int fd = h.fd.get();
  if (hello.magic != wire::kHelloMagic) {
    POS_WARN("posd", "pid %d sent no valid hello; dropped", h.cred.pid);
  } else if (hello.version != wire::kProtocolVersion) {
    POS_WARN("posd", "pid %d speaks protocol %u, posd %u; refused", h.cred.pid, hello.version, wire::kProtocolVersion);
    refuse_connection(fd, Status(Code::kFailedPrecondition, cuda::kErrorInitializationError,
                      "protocol version " + std::to_string(hello.version) + " is not posd's " +
                          std::to_string(wire::kProtocolVersion) + ": use the libpos_client of the running posd's build"));
  } else if (hello.kind == static_cast<uint32_t>(wire::HelloKind::kControl)) {
    // Answered here: a control request is short. Its reply may not fit the socket's buffer, so
    // the send may wait, but for a bounded time (a peer that does not read loses its answer).
    set_blocking(fd);
    timeval tv{2, 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    const std::string command = wire::get_cstr(hello.command, sizeof(hello.command));
    if (command == "checkpoint") control_checkpoint(h);
    else if (command == "detach") control_detach(h);
    else if (command == "release") control_release(h);
    else if (command == "peer-export") control_peer_export(h);
    else if (command == "restore") control_restore(h);
    else if (command.rfind("limit ", 0) == 0) control_limit(h, command);
    else control(fd, command);
  } else if (hello.kind == static_cast<uint32_t>(wire::HelloKind::kReattach)) {
    set_blocking(fd);
    reattach(h);
  } else if (hello.kind == static_cast<uint32_t>(wire::HelloKind::kSession)) {
    // The job name is the client's bytes: made printable once, here, so that every log line and
    // everything after the hello (the workspace, ps) sees text (docs/remoting.md, "Job names").
    std::string job = printable(wire::get_cstr(hello.job, sizeof(hello.job)), kMaxJobNameBytes);
    const uint64_t arena = hello.arena_bytes == 0 ? config_.posd_arena_bytes : hello.arena_bytes;
    if (arena < (1u << 20) || arena > config_.posd_arena_max) {
      refuse_connection(fd, Status(Code::kInvalidArgument, cuda::kErrorInvalidValue,
                        "arena of " + std::to_string(arena) + " bytes asked; posd allows 1 MiB to " +
                            std::to_string(config_.posd_arena_max)));
    } else {
      start_session(h, std::move(job), arena);
    }
  } else {
    refuse_connection(fd, Status::InvalidArgument("unknown hello kind " + std::to_string(hello.kind)));
  }
}

// An admitted session gets its thread here, if posd serves fewer than client.max_clients and the
// kernel gives one; otherwise a refusal that says which.
void PosdServer::start_session(Handshake& h, std::string job, uint64_t arena_bytes) {
  const size_t most = config_.max_clients;
  if (live_sessions() >= most) {
    const Status why(Code::kBusy, cuda::kErrorInitializationError,
                     "posd has " + std::to_string(most) + " sessions, the most it serves (client.max_clients)");
    POS_WARN("posd", "session for pid %d (%s) refused: %s", h.cred.pid, job.c_str(), why.message().c_str());
    refuse_connection(h.fd.get(), why);
    return;
  }
  if (config_.posd_isolation == Isolation::kProcess) {
    start_process_session(h, std::move(job), arena_bytes);
    return;
  }
  if (!sessions_gate_.try_enter()) return;  // stop() began: its drain must not miss this session
  // The session's thread waits in poll; its few writes (the welcome) must not fail with EAGAIN.
  set_blocking(h.fd.get());
  auto s = std::make_unique<Session>();
  s->fd = std::move(h.fd);
  s->cred = h.cred;
  s->job = std::move(job);
  s->arena_bytes = arena_bytes;
  Session* raw = s.get();
  {
    std::lock_guard<std::mutex> lk(mu_);
    sessions_.push_back(std::move(s));
  }
  const uint32_t pid = static_cast<uint32_t>(raw->cred.pid);
  const std::string job_name = raw->job;
  const Status st = start_thread(&raw->thread, "posd's session thread", [this, raw] {
    name_this_thread("posd-session");
    session_main(raw);
  });
  if (st.ok()) {
    start_policy(pid, job_name);
    return;
  }
  std::unique_ptr<Session> back;  // only the acceptor adds or removes sessions: it is the last one
  {
    std::lock_guard<std::mutex> lk(mu_);
    back = std::move(sessions_.back());
    sessions_.pop_back();
  }
  sessions_gate_.leave();
  POS_WARN("posd", "session for pid %d (%s) refused: %s", back->cred.pid, back->job.c_str(), st.message().c_str());
  refuse_connection(back->fd.get(), st);
}

// posd.isolation: process. The connection goes to a new session process, which sends the welcome
// (or a refusal) itself; posd keeps no copy of it, so the client sees the hang-up when that process
// ends, however it ends.
void PosdServer::start_process_session(Handshake& h, std::string job, uint64_t arena_bytes) {
  set_blocking(h.fd.get());
  auto s = std::make_unique<Session>();
  s->cred = h.cred;
  s->job = std::move(job);
  s->arena_bytes = arena_bytes;
  s->generation = ++next_generation_;
  session_channel::Start start;
  start.kind = static_cast<uint32_t>(session_channel::Kind::kServe);
  start.pid = h.cred.pid;
  start.uid = h.cred.uid;
  start.generation = s->generation;
  start.arena_bytes = arena_bytes;
  bool spare = false;
  auto p = session_process_for(h.fd.get(), start, s->job, -1, &spare);
  if (!p.ok()) {
    POS_WARN("posd", "session for pid %d (%s) refused: %s", h.cred.pid, s->job.c_str(), p.status().message().c_str());
    refuse_connection(h.fd.get(), Status(Code::kUnavailable, cuda::kErrorInitializationError, p.status().message()));
    return;
  }
  s->child = p->pid;
  s->channel = std::move(p->channel);
  POS_INFO("posd", "session %lu: pid %d uid %u job '%s' in session process %d%s", (unsigned long)(s->generation << 16),
           h.cred.pid, h.cred.uid, s->job.c_str(), static_cast<int>(s->child), spare ? " (the spare)" : "");
  const std::string job_name = s->job;
  {
    std::lock_guard<std::mutex> lk(mu_);
    sessions_.push_back(std::move(s));
  }
  start_policy(static_cast<uint32_t>(h.cred.pid), job_name);
}  // h.fd closes posd's copy of the connection

StatusOr<SessionProcess> PosdServer::session_process_for(int client_fd, const session_channel::Start& start,
                                                         const std::string& job, int dir_fd, bool* spare_used) {
  *spare_used = false;
  if (config_.posd_spare_session) {
    SessionProcess spare = take_spare();
    if (spare.pid > 0) {
      Status handed = hand_to_spare(spare, client_fd, start, job, session_yaml(job), dir_fd);
      if (handed.ok()) {
        start_spare();  // the next one comes up while this client starts
        *spare_used = true;
        return spare;
      }
      spare.channel.reset();
      const int st = wait_or_kill(spare.pid, std::chrono::seconds(1));
      POS_WARN("posd", "the spare session process %d cannot take pid %d (%s; it %s); starting one for it",
               static_cast<int>(spare.pid), start.pid, handed.message().c_str(), describe_wait_status(st).c_str());
    }
    start_spare();
  }
  return spawn_session_process(session_binary_, client_fd, start, job, session_yaml(job), session_env_, dir_fd);
}

SessionProcess PosdServer::take_spare() {
  std::lock_guard<std::mutex> lk(spare_mu_);
  if (spares_.empty()) return SessionProcess{};
  SessionProcess s = std::move(spares_.front());
  spares_.pop_front();
  return s;
}

void PosdServer::expect_incoming_job() {
  if (!config_.posd_spare_session || config_.posd_isolation != Isolation::kProcess) return;
  {
    std::lock_guard<std::mutex> lk(spare_mu_);
    if (spares_.size() >= 2) return;
  }
  start_spare();
}

void PosdServer::incoming_job_done() {
  SessionProcess extra;
  {
    std::lock_guard<std::mutex> lk(spare_mu_);
    if (spares_.size() <= 1) return;
    extra = std::move(spares_.back());
    spares_.pop_back();
  }
  POS_INFO("posd", "spare session process %d ends: the migration it was started for is over", static_cast<int>(extra.pid));
  // Not on the migration server's thread: a spare still bringing its backend up takes a moment to
  // see its channel close.
  std::thread([p = std::move(extra)]() mutable {
    p.channel.reset();
    (void)wait_or_kill(p.pid, std::chrono::seconds(10));
  }).detach();
}

void PosdServer::start_spare() {
  auto p = spawn_spare_session(session_binary_, config_yaml_, session_env_);
  if (!p.ok()) {
    POS_WARN("posd", "cannot start a spare session process: %s", p.status().message().c_str());
    return;
  }
  POS_INFO("posd", "spare session process %d started (its backend comes up before the next job or restore)",
           static_cast<int>(p->pid));
  std::lock_guard<std::mutex> lk(spare_mu_);
  spares_.push_back(std::move(*p));
}

void PosdServer::start_policy(uint32_t pid, const std::string& job) {
  const auto& p = config_.posd_policy;
  if (!policy_names_job(config_, job)) return;
  // DIR/<job>-<pid>: the program's base name, in characters safe in a file name.
  std::string name;
  for (char c : job.substr(job.rfind('/') == std::string::npos ? 0 : job.rfind('/') + 1))
    name += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ? c : '_';
  if (name.empty() || name[0] == '.') name = "job" + name;
  name = name.substr(0, 64);
  std::vector<std::string> args = {policy_cli_, "checkpoint", "-t", std::to_string(pid), "-D",
                                   p.dir + "/" + name + "-" + std::to_string(pid), "--every", p.every, "--keep",
                                   std::to_string(p.keep), "--full-every", std::to_string(p.full_every), "--mode",
                                   p.async ? "async" : "sync", "--socket", socket_path_};
  if (p.with_cpu) args.push_back("--with-cpu");
  std::lock_guard<std::mutex> lk(policy_mu_);
  std::erase_if(policy_threads_, [](PolicyStarter& starter) {
    if (!starter.done->load()) return false;
    starter.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, pid, job, done, args = std::move(args)]() mutable {
    name_this_thread("posd-policy");
    struct Done {
      std::atomic<bool>& d;
      ~Done() { d.store(true); }
    } mark{*done};
    // The first checkpoint needs the session served: wait until it is (at most 10 s).
    for (int i = 0; i < 200 && !!sessions_gate_.is_open(); ++i) {
      bool up = false;
      for (const SessionInfo& si : sessions()) up = up || (si.pid == pid && !si.starting && si.uuid != 0);
      if (up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!sessions_gate_.is_open()) return;
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Nothing of posd's goes with it: not its blocked signals (--stop is a SIGTERM), not one of its
    // descriptors (sessions' connections and channels, the listening socket), which the
    // checkpointer, a long-lived daemon, would otherwise hold open for as long as it runs.
    const pid_t child = ::fork();
    if (child == 0) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(out[1], 1), ::dup2(out[1], 2);
      const int nul = ::open("/dev/null", O_RDONLY);
      if (nul >= 0) ::dup2(nul, 0);
      ::close_range(3, ~0u, 0);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    const int rc = child < 0 ? errno : 0;
    ::close(out[1]);
    std::string text;
    char buf[1024];
    ssize_t n;
    while (rc == 0 && (n = ::read(out[0], buf, sizeof(buf))) != 0)
      if (n > 0) text.append(buf, static_cast<size_t>(n));
      else if (errno != EINTR) break;
    ::close(out[0]);
    int st = 0;
    if (rc == 0) (void)::waitpid(child, &st, 0);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    if (rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 127 && text.empty()) text = "cannot run " + args[0];
    if (rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
      POS_INFO("posd", "checkpoint policy for pid %u ('%s'): %s", pid, job.c_str(), printable(text, 512).c_str());
    else
      POS_WARN("posd", "checkpoint policy for pid %u ('%s') did not start: %s", pid, job.c_str(),
               rc != 0 ? (std::string("cannot run ") + args[0] + ": " + std::strerror(rc)).c_str() : printable(text, 512).c_str());
  });
  policy_threads_.push_back(PolicyStarter{std::move(t), std::move(done)});
}

void PosdServer::session_main(Session* s) {
  SessionSpec spec;
  spec.fd = s->fd.get();
  spec.pid = s->cred.pid;
  spec.uid = s->cred.uid;
  spec.job = s->job;
  spec.arena_bytes = s->arena_bytes;
  spec.devices = config_.posd_devices;
  spec.memory_quota = memory_quota_for_job(config_, s->job);
  spec.sms = sms_for_job(config_, s->job);
  spec.stop_fd = stop_fd_;
  spec.keep_spinning = [this] { return sessions_gate_.is_open(); };
  serve_session(*ws_, spec, &s->progress);
  sessions_gate_.leave();  // entered for this session by start_session
  s->finished.store(true);  // the fd is closed by whoever joins this thread
}

uint32_t PosdServer::caller_uid(const Handshake& h) const {
  const int64_t faked = caller_uid_for_test_.load();
  return faked >= 0 ? static_cast<uint32_t>(faked) : h.cred.uid;
}

// The one live session of the job with client pid `pid`, if `caller` may dump it.
StatusOr<PosdServer::Session*> PosdServer::job_session(uint32_t pid, uint32_t caller, const std::string& what) {
  Session* target = nullptr;
  size_t matches = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& s : sessions_)
      if (!s->finished.load() && static_cast<uint32_t>(s->cred.pid) == pid) target = s.get(), ++matches;
  }
  if (target == nullptr)
    return Status(Code::kNotFound, cuda::kErrorInvalidValue,
                  "pid " + std::to_string(pid) + " has no session on this posd (pos-cli ps lists them)");
  if (matches > 1)
    return Status::InvalidArgument("pid " + std::to_string(pid) + " has " + std::to_string(matches) +
                                   " sessions on this posd; a dump takes a job with one");
  POS_RETURN_IF_ERROR(authorize_job_control(caller, target->cred.uid, what));
  return target;
}

Status authorize_job_control(uint32_t caller_uid, uint32_t job_uid, const std::string& what) {
  if (caller_uid == 0 || caller_uid == job_uid) return Status::Ok();
  return Status(Code::kFailedPrecondition, cuda::kErrorInvalidValue,
                "uid " + std::to_string(caller_uid) + " may not " + what + " a job of uid " + std::to_string(job_uid) +
                    ": only root and the job's own user may");
}

// `pos-cli dump`'s GPU half: checked here (the request, the caller's right, the job), then handed,
// with pos-cli's connection and its directory, to the job's session process, which answers pos-cli
// itself while it checkpoints. posd keeps no copy of either descriptor and never waits for it.
void PosdServer::control_checkpoint(Handshake& h) {
  const int fd = h.fd.get();
  wire::CheckpointBody b;
  std::memcpy(&b, h.body, sizeof(b));
  auto refuse = [&](const Status& why) {
    POS_WARN("posd", "checkpoint request of pid %d (uid %u) refused: %s", h.cred.pid, h.cred.uid, why.message().c_str());
    refuse_connection(fd, why);
  };
  const bool incremental = (b.flags & wire::kCheckpointIncremental) != 0;
  const std::string parent = wire::get_cstr(b.parent_path, sizeof(b.parent_path));
  if (b.magic != wire::kCheckpointMagic || (b.flags & ~wire::kCheckpointFlags) != 0 || b.mode > 1 ||
      parent.size() >= sizeof(b.parent_path) - 1 || incremental != !parent.empty() || printable(parent) != parent ||
      (!parent.empty() && parent[0] == '/'))
    return refuse(Status::InvalidArgument("malformed checkpoint request"));
  struct stat st {};
  if (!h.passed || ::fstat(h.passed.get(), &st) != 0 || !S_ISDIR(st.st_mode))
    return refuse(Status::InvalidArgument("a checkpoint request must come with its image directory's descriptor"));
  if (incremental != static_cast<bool>(h.passed2) ||
      (incremental && (::fstat(h.passed2.get(), &st) != 0 || !S_ISDIR(st.st_mode))))
    return refuse(Status::InvalidArgument(incremental ? "an incremental checkpoint request must come with its previous "
                                                        "image's directory descriptor"
                                                      : "a checkpoint request came with a descriptor too many"));
  if (config_.posd_isolation != Isolation::kProcess)
    return refuse(Status::FailedPrecondition(
        "this posd runs with posd.isolation: shared; checkpoints of its jobs are taken with session processes only"));
  const bool peer = (b.flags & wire::kCheckpointPeer) != 0;
  if (peer && (incremental || b.mode != static_cast<uint32_t>(wire::CheckpointKind::kSync)))
    return refuse(Status::InvalidArgument("a peer checkpoint (pos-cli migrate's peer switch) is synchronous and whole"));
  const bool since = (b.flags & wire::kCheckpointSince) != 0;
  if ((b.flags & wire::kCheckpointEstimate) != 0 &&
      (b.flags & ~wire::kCheckpointSince) != (wire::kCheckpointEstimate | wire::kCheckpointIncremental))
    return refuse(Status::InvalidArgument("an estimate (flag 16) is against a previous image (flag 1), and nothing else"));
  if (since != (b.since_call != 0) || (since && (b.flags & wire::kCheckpointEstimate) == 0))
    return refuse(Status::InvalidArgument("flag 32 (writes since a call) is for an estimate, with a call number above 0"));
  const uint32_t caller = caller_uid(h);
  auto found = job_session(b.target_pid, caller);
  if (!found.ok()) return refuse(found.status());
  Session* const target = *found;
  if (peer) {
    // Its buffers stay only in the session's memory: meaningful for a job detached for a switch.
    std::lock_guard<std::mutex> io(target->io);
    if (target->token.empty())
      return refuse(Status::FailedPrecondition("a peer checkpoint is for a detached job (pos-cli migrate's peer switch)"));
  }
  session_channel::Message m;
  m.type = static_cast<uint32_t>(session_channel::Type::kCheckpoint);
  m.mode = b.mode;
  m.flags = b.flags;
  m.since_call = b.since_call;
  wire::put_cstr(m.parent, sizeof(m.parent), parent);
  Status sent;
  {
    std::lock_guard<std::mutex> io(target->io);
    sent = incremental ? send_with_fds(target->channel.get(), &m, sizeof(m), {fd, h.passed.get(), h.passed2.get()})
                       : send_with_fds(target->channel.get(), &m, sizeof(m), {fd, h.passed.get()});
  }
  if (!sent.ok()) return refuse(Status::Unavailable("the job's session process is gone: " + sent.message()));
  POS_INFO("posd", "checkpoint of pid %d ('%s') handed to its session process %d for uid %u", target->cred.pid,
           target->job.c_str(), static_cast<int>(target->child), caller);
}

// `pos-cli dump`'s detach: the job's shim releases its session (docs/dump_restore.md) so CRIU can
// dump it; it comes back with the token posd makes here, which only this request's caller learns.
void PosdServer::control_detach(Handshake& h) {
  const int fd = h.fd.get();
  wire::DetachBody b;
  std::memcpy(&b, h.body, sizeof(b));
  auto refuse = [&](const Status& why) {
    POS_WARN("posd", "detach request of pid %d (uid %u) refused: %s", h.cred.pid, h.cred.uid, why.message().c_str());
    refuse_connection(fd, why);
  };
  const std::string permit = wire::get_cstr(b.permit, sizeof(b.permit));
  if (b.magic != wire::kDetachMagic || b.reserved != 0 || permit.empty() || permit[0] != '/' ||
      permit.size() >= sizeof(b.permit) - 1 || b.timeout_ms == 0 || b.timeout_ms > 3600u * 1000)
    return refuse(Status::InvalidArgument("malformed detach request (an absolute permit path and a timeout of 1 ms to 1 h)"));
  if (config_.posd_isolation != Isolation::kProcess)
    return refuse(Status::FailedPrecondition("this posd runs with posd.isolation: shared; jobs detach from session processes only"));
  const uint32_t caller = caller_uid(h);
  auto found = job_session(b.target_pid, caller);
  if (!found.ok()) return refuse(found.status());
  Session* const target = *found;
  std::string token = random_token();
  if (token.empty()) return refuse(Status::Unavailable("no randomness for a session token"));
  session_channel::Message m;
  m.type = static_cast<uint32_t>(session_channel::Type::kDetach);
  m.timeout_ms = b.timeout_ms;
  wire::put_cstr(m.token, sizeof(m.token), token);
  wire::put_cstr(m.permit, sizeof(m.permit), permit);
  Status sent;
  {
    std::lock_guard<std::mutex> io(target->io);
    if (!target->token.empty()) {
      sent = Status::Busy("the job is detached already (another dump is under way)");
    } else {
      target->token = token;
      sent = send_with_fds(target->channel.get(), &m, sizeof(m), {fd});
      if (!sent.ok()) target->token.clear();
    }
  }
  if (sent.code() == Code::kBusy) return refuse(sent);
  if (!sent.ok()) return refuse(Status::Unavailable("the job's session process is gone: " + sent.message()));
  POS_INFO("posd", "detach of pid %d ('%s') handed to its session process %d for uid %u", target->cred.pid,
           target->job.c_str(), static_cast<int>(target->child), caller);
}

// A request only the job's detacher may make (release, peer-export): `token` must be the detach's;
// then `type` goes to the session process, with `fd` (pos-cli's connection) when it is >= 0, and,
// with `forget`, the token is dropped (no re-attach is routed to the session after it).
Status PosdServer::to_detached_session(Session* target, const std::string& token, session_channel::Type type, int fd,
                                       bool forget) {
  session_channel::Message m;
  m.type = static_cast<uint32_t>(type);
  std::lock_guard<std::mutex> io(target->io);
  if (target->token.size() != token.size() || !CRYPTO_memcmp_like(target->token.data(), token.data(), token.size()))
    return Status(Code::kFailedPrecondition, cuda::kErrorInvalidValue,
                  "pid " + std::to_string(target->cred.pid) + "'s session here is not detached with that token");
  if (forget) target->token.clear();
  Status sent = fd >= 0 ? send_with_fds(target->channel.get(), &m, sizeof(m), {fd})
                        : send_with_fds(target->channel.get(), &m, sizeof(m), {});
  return sent.ok() ? sent : Status::Unavailable("the job's session process is gone: " + sent.message());
}

// pos-cli migrate's live switch: the job it detached from here re-attached to another posd of this
// host, so its session here (still detached, waiting with the detach's token) ends. The token
// proves the caller is the one who detached it; the caller's uid must be the job's or root.
void PosdServer::control_release(Handshake& h) {
  const int fd = h.fd.get();
  wire::ReleaseBody b;
  std::memcpy(&b, h.body, sizeof(b));
  auto refuse = [&](const Status& why) {
    POS_WARN("posd", "release request of pid %d (uid %u) refused: %s", h.cred.pid, h.cred.uid, why.message().c_str());
    refuse_connection(fd, why);
  };
  const std::string token = wire::get_cstr(b.token, sizeof(b.token));
  if (b.magic != wire::kReleaseMagic || b.target_pid == 0 || token.empty())
    return refuse(Status::InvalidArgument("malformed release request"));
  const uint32_t caller = caller_uid(h);
  auto found = job_session(b.target_pid, caller);
  if (!found.ok()) return refuse(found.status());
  Session* const target = *found;
  // No re-attach is routed to it any more once it is told.
  if (Status sent = to_detached_session(target, token, session_channel::Type::kRelease, -1, true); !sent.ok())
    return refuse(sent);
  POS_INFO("posd", "session of pid %d ('%s') released: the job runs under another posd now", target->cred.pid,
           target->job.c_str());
  wire::Welcome w;
  (void)send_all(fd, &w, sizeof(w)).ok();
}

// pos-cli migrate's peer switch: the job it detached from here hands its device memory to pos-cli
// (descriptors), which gives it to the target's restoring session. As for release, the token proves
// the caller detached the job, and the caller's uid must be the job's or root; the session process
// answers on the connection. The session stays detached.
void PosdServer::control_peer_export(Handshake& h) {
  const int fd = h.fd.get();
  wire::PeerExportBody b;
  std::memcpy(&b, h.body, sizeof(b));
  auto refuse = [&](const Status& why) {
    POS_WARN("posd", "peer-export request of pid %d (uid %u) refused: %s", h.cred.pid, h.cred.uid, why.message().c_str());
    refuse_connection(fd, why);
  };
  const std::string token = wire::get_cstr(b.token, sizeof(b.token));
  if (b.magic != wire::kPeerMagic || b.target_pid == 0 || token.empty())
    return refuse(Status::InvalidArgument("malformed peer-export request"));
  const uint32_t caller = caller_uid(h);
  auto found = job_session(b.target_pid, caller);
  if (!found.ok()) return refuse(found.status());
  Session* const target = *found;
  if (Status sent = to_detached_session(target, token, session_channel::Type::kPeerExport, fd, false); !sent.ok())
    return refuse(sent);
  POS_INFO("posd", "peer export of pid %d ('%s') handed to its session process %d for uid %u", target->cred.pid,
           target->job.c_str(), static_cast<int>(target->child), caller);
}

// A detached job coming back: its token names its session (once), its uid must be the session's.
void PosdServer::reattach(Handshake& h) {
  const std::string token = wire::get_cstr(h.hello.command, sizeof(h.hello.command));
  Session* target = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& s : sessions_) {
      if (s->finished.load()) continue;
      std::lock_guard<std::mutex> io(s->io);
      if (!s->token.empty() && s->token.size() == token.size() &&
          CRYPTO_memcmp_like(s->token.data(), token.data(), token.size()) && s->cred.uid == h.cred.uid)
        target = s.get();
    }
  }
  if (target == nullptr) {
    POS_WARN("posd", "re-attach of pid %d refused: no detached session with that token for uid %u", h.cred.pid, h.cred.uid);
    refuse_connection(h.fd.get(), Status(Code::kNotFound, cuda::kErrorInitializationError,
                                         "no detached session of this posd has that token"));
    return;
  }
  session_channel::Message m;
  m.type = static_cast<uint32_t>(session_channel::Type::kReattach);
  Status sent;
  {
    std::lock_guard<std::mutex> io(target->io);
    target->token.clear();  // one use
    // With the session memfd the job maps (a restored session takes it over).
    sent = h.passed ? send_with_fds(target->channel.get(), &m, sizeof(m), {h.fd.get(), h.passed.get()})
                    : send_with_fds(target->channel.get(), &m, sizeof(m), {h.fd.get()});
  }
  if (!sent.ok()) refuse_connection(h.fd.get(), Status::Unavailable("the job's session process is gone"));
}

namespace {
bool hex_token(const std::string& t) {
  return t.size() == 32 && std::all_of(t.begin(), t.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
}  // namespace

// `pos-cli restore`'s GPU half: a session process of its own rebuilds the job's GPU state from the
// image (through pos-cli's descriptor of it) and waits, detached, for the job CRIU restores to
// re-attach with the image's token. It answers pos-cli itself; posd routes the re-attach to it.
void PosdServer::control_restore(Handshake& h) {
  const int fd = h.fd.get();
  wire::RestoreBody b;
  std::memcpy(&b, h.body, sizeof(b));
  auto refuse = [&](const Status& why) {
    POS_WARN("posd", "restore request of pid %d (uid %u) refused: %s", h.cred.pid, h.cred.uid, why.message().c_str());
    refuse_connection(fd, why);
  };
  const std::string token = wire::get_cstr(b.token, sizeof(b.token));
  // A staging restore stands alone; a staged one comes with a peer table; lazy and a peer table
  // only go together when the table is a staging session's (wire.h, RestoreFlags).
  const uint32_t f = b.flags;
  const bool stage = (f & wire::kRestoreStage) != 0;
  const bool flags_ok =
      (f & ~static_cast<uint32_t>(wire::kRestoreLazy | wire::kRestorePeer | wire::kRestoreStage | wire::kRestoreStaged)) == 0 &&
      (!stage || f == wire::kRestoreStage) && ((f & wire::kRestoreStaged) == 0 || (f & wire::kRestorePeer) != 0) &&
      ((f & (wire::kRestoreLazy | wire::kRestorePeer)) != (wire::kRestoreLazy | wire::kRestorePeer) ||
       (f & wire::kRestoreStaged) != 0);
  if (b.magic != wire::kRestoreMagic || b.target_pid == 0 || b.target_pid > static_cast<uint32_t>(INT32_MAX) ||
      !flags_ok || !hex_token(token))
    return refuse(Status::InvalidArgument("malformed restore request"));
  if (b.arena_bytes < (1u << 20) || b.arena_bytes > config_.posd_arena_max)
    return refuse(Status::InvalidArgument("the image's session arena (" + std::to_string(b.arena_bytes) +
                                          " bytes) is outside 1 MiB .. posd.arena_max (" +
                                          std::to_string(config_.posd_arena_max) + ")"));
  struct stat st {};
  if (!h.passed || ::fstat(h.passed.get(), &st) != 0 || !S_ISDIR(st.st_mode))
    return refuse(Status::InvalidArgument("a restore request must come with its image directory's descriptor"));
  if (config_.posd_isolation != Isolation::kProcess)
    return refuse(Status::FailedPrecondition("this posd runs with posd.isolation: shared; jobs are restored into session processes only"));
  const uint32_t caller = caller_uid(h);
  if (Status a = authorize_job_control(caller, b.uid, "restore"); !a.ok()) return refuse(a);
  // A staging session holds an earlier image of the job for the job's own restore, which follows.
  if (!stage) {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& s : sessions_)
      if (!s->finished.load() && static_cast<uint32_t>(s->cred.pid) == b.target_pid)
        return refuse(Status::Busy("pid " + std::to_string(b.target_pid) +
                                   " has a session on this posd already (is the dumped job still running?)"));
  }
  if (live_sessions() >= config_.max_clients)
    return refuse(Status(Code::kOutOfMemory, cuda::kErrorInitializationError,
                         "posd serves " + std::to_string(config_.max_clients) + " sessions already (client.max_clients)"));
  set_blocking(fd);
  auto s = std::make_unique<Session>();
  // A staging session is no job's: pid 0 (no request by pid finds it) and no token (no re-attach).
  s->cred.pid = stage ? 0 : static_cast<pid_t>(b.target_pid);
  s->cred.uid = b.uid;
  s->cred.gid = static_cast<gid_t>(-1);
  s->job = printable(wire::get_cstr(b.job, sizeof(b.job)), kMaxJobNameBytes);
  if (stage) s->job += " (staged)";
  s->arena_bytes = b.arena_bytes;
  s->generation = ++next_generation_;
  if (!stage) s->token = token;  // the restored job's re-attach comes here (once)
  session_channel::Start start;
  start.kind = static_cast<uint32_t>(session_channel::Kind::kRestore);
  start.pid = static_cast<int32_t>(b.target_pid);
  start.uid = b.uid;
  start.generation = s->generation;
  start.arena_bytes = b.arena_bytes;
  start.flags = b.flags;
  bool spare = false;
  auto p = session_process_for(fd, start, s->job, h.passed.get(), &spare);
  if (!p.ok()) return refuse(Status(Code::kUnavailable, cuda::kErrorInitializationError, p.status().message()));
  s->child = p->pid;
  s->channel = std::move(p->channel);
  POS_INFO("posd", "%s of pid %u ('%s', uid %u) for uid %u in session process %d%s", stage ? "staging restore" : "restore",
           b.target_pid, s->job.c_str(), b.uid, caller, static_cast<int>(s->child), spare ? " (the spare)" : "");
  std::lock_guard<std::mutex> lk(mu_);
  sessions_.push_back(std::move(s));
}

// `limit PID [memory=BYTES]` (pos-cli limit for a job under posd): the session's device-memory
// quota, set first when asked (0: none); the job's owner or root only. The answer is one JSON
// object: {"ok":true,"pid":P,"job":J,"memory_quota":Q,"memory_bytes":U,"sms":N,"sms_granted":G,"gpu_share":S}.
void PosdServer::control_limit(Handshake& h, const std::string& command) {
  const int fd = h.fd.get();
  auto refuse = [&](const Status& why) {
    POS_WARN("posd", "limit request of pid %d (uid %u) refused: %s", h.cred.pid, h.cred.uid, why.message().c_str());
    refuse_connection(fd, why);
  };
  std::istringstream in(command.substr(6));
  std::string pid_text, arg, arg2, extra;
  in >> pid_text >> arg >> arg2 >> extra;
  auto pid = parse_uint(pid_text);
  if (!pid.ok() || *pid == 0 || *pid > INT32_MAX || !extra.empty())
    return refuse(Status::InvalidArgument("limit wants a pid and at most memory=BYTES and share=PERMILLE, not '" +
                                          printable(command, 64) + "'"));
  bool set_memory = false, set_share = false;
  uint64_t bytes = 0, per_mille = 0;
  for (const std::string& a : {arg, arg2}) {
    if (a.empty()) continue;
    const bool mem = a.rfind("memory=", 0) == 0, sh = a.rfind("share=", 0) == 0;
    auto v = mem ? parse_uint(a.substr(7)) : sh ? parse_uint(a.substr(6)) : StatusOr<uint64_t>(Status::InvalidArgument("unknown limit"));
    if (!v.ok() || (mem && set_memory) || (sh && set_share) || (sh && *v > 1000))
      return refuse(Status::InvalidArgument("limit wants memory=BYTES and share=PERMILLE (0 to 1000), not '" +
                                            printable(a, 64) + "'"));
    if (mem) set_memory = true, bytes = *v;
    else set_share = true, per_mille = *v;
  }
  const bool set = set_memory || set_share;
  auto found = job_session(static_cast<uint32_t>(*pid), caller_uid(h), "change the limits of");
  if (!found.ok()) return refuse(found.status());
  Session* const target = *found;
  uint64_t quota = 0, used = 0, share = 0, sms = 0, sms_granted = 0;
  if (target->child > 0) {
    session_channel::Message m;
    m.type = static_cast<uint32_t>(set ? session_channel::Type::kLimit : session_channel::Type::kStatsRequest);
    m.stats.memory_quota = bytes;
    m.share = static_cast<uint32_t>(per_mille);
    m.flags = (set_memory ? session_channel::kLimitMemory : 0u) | (set_share ? session_channel::kLimitShare : 0u);
    StatusOr<session_channel::Message> r = Status::Unavailable("not asked");
    {
      std::lock_guard<std::mutex> io(target->io);
      Status sent = send_with_fds(target->channel.get(), &m, sizeof(m), {});
      r = sent.ok() ? await_report(target->channel.get(), std::chrono::seconds(2)) : StatusOr<session_channel::Message>(sent);
    }
    if (!r.ok()) return refuse(Status::Unavailable("the job's session process did not answer: " + r.status().message()));
    if (r->uuid == 0 || r->ending != 0)
      return refuse(Status::FailedPrecondition("pid " + std::to_string(*pid) + "'s session is starting or ending"));
    if (r->code != 0) {  // the change was refused (a share past 100 %, no usage region): nothing changed
      const int32_t c = r->code > 0 && r->code <= static_cast<int32_t>(Code::kInternal) ? r->code : static_cast<int32_t>(Code::kInternal);
      return refuse(Status(static_cast<Code>(c), 0, wire::get_cstr(r->message, sizeof(r->message))));
    }
    quota = r->stats.memory_quota, used = r->stats.memory_in_use, share = r->share;
    sms = r->stats.sms, sms_granted = r->stats.sms_granted;
  } else {
    auto c = ws_->find_client(target->progress.uuid.load(std::memory_order_acquire));
    if (!c) return refuse(Status::FailedPrecondition("pid " + std::to_string(*pid) + "'s session is starting or ending"));
    if (set_share)
      return refuse(Status::FailedPrecondition("GPU-time shares are for session processes (posd.isolation: process); "
                                               "this posd runs its sessions in one process"));
    if (set_memory) c->set_memory_quota(bytes);
    const ClientStats st = c->stats();
    quota = c->memory_quota(), used = st.memory_in_use, sms = st.sms, sms_granted = st.sms_granted;
  }
  if (set_memory)
    POS_INFO("posd", "pid %u ('%s'): device-memory quota set to %lu bytes by uid %u", static_cast<unsigned>(*pid),
             target->job.c_str(), (unsigned long)quota, caller_uid(h));
  if (set_share)
    POS_INFO("posd", "pid %u ('%s'): GPU-time share set to %lu per mille by uid %u", static_cast<unsigned>(*pid),
             target->job.c_str(), (unsigned long)share, caller_uid(h));
  const std::string text = "{\"ok\":true,\"pid\":" + std::to_string(*pid) + ",\"job\":" + json_string(target->job) +
                           ",\"memory_quota\":" + std::to_string(quota) + ",\"memory_bytes\":" + std::to_string(used) +
                           ",\"sms\":" + std::to_string(sms) + ",\"sms_granted\":" + std::to_string(sms_granted) +
                           ",\"gpu_share\":" + std::to_string(share) + "}\n";
  wire::Welcome w;
  w.control_bytes = text.size();
  if (send_all(fd, &w, sizeof(w)).ok()) (void)send_all(fd, text.data(), text.size()).ok();
}

void PosdServer::control(int fd, const std::string& command) {
  std::string text;
  if (command == "ps") {
    text = sessions_json();
  } else if (command == "ps-table") {
    text = sessions_table();
  } else {
    refuse_connection(fd, Status::InvalidArgument("unknown posd command '" + command + "' (known: ps, ps-table, checkpoint, detach, restore, release, peer-export, limit)"));
    return;
  }
  wire::Welcome w;
  w.control_bytes = text.size();
  if (send_all(fd, &w, sizeof(w)).ok()) (void)send_all(fd, text.data(), text.size()).ok();
}


std::vector<SessionInfo> PosdServer::sessions() const {
  std::vector<SessionInfo> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& s : sessions_) {
    if (s->finished.load()) continue;
    SessionInfo i;
    i.pid = static_cast<uint32_t>(s->cred.pid), i.uid = s->cred.uid;
    i.job = s->job;
    i.arena_bytes = s->arena_bytes;
    if (s->child > 0) {
      // Asked in turn; a session process answers from a thread of its own, so a busy session
      // answers too. One that does not (ended meanwhile, or stopped) is listed as ending.
      std::lock_guard<std::mutex> io(s->io);
      auto r = query_session(s->channel.get(), std::chrono::seconds(2));
      i.detached = !s->token.empty();
      i.server_pid = static_cast<uint32_t>(s->child);
      i.uuid = r.ok() && r->uuid != 0 ? r->uuid : s->generation << 16;
      i.ending = !r.ok() || r->ending != 0;
      if (r.ok()) {
        i.device = r->device;
        i.frames = r->frames;
        i.stats = r->stats;
        if (r->uuid == 0) i.starting = true;
      }
      out.push_back(std::move(i));
      continue;
    }
    const uint64_t uuid = s->progress.uuid.load(std::memory_order_acquire);
    if (uuid == 0) continue;
    // Listed until its teardown (device memory freed) is complete.
    auto c = ws_->find_client(uuid);
    i.ending = !c;
    i.uuid = uuid;
    i.server_pid = static_cast<uint32_t>(::getpid());
    if (c) i.device = c->device();
    i.frames = s->progress.frames.load();
    if (c) i.stats = c->stats();
    out.push_back(std::move(i));
  }
  return out;
}

// A session's job is what its client sent, so it is escaped here too (defence in depth: the
// client's own name is already printable): json_string() shows it as printable() does, quoted, so
// the answer is valid JSON (UTF-8, no raw control characters) whatever the bytes.
std::string PosdServer::sessions_json() const {
  std::string o = "{\"backend\":" + json_string(backend_name_) + ",\"isolation\":\"" +
                  (config_.posd_isolation == Isolation::kProcess ? "process" : "shared") +
                  "\",\"socket\":" + json_string(socket_path_) + ",\"sessions\":[";
  bool first = true;
  for (const auto& s : sessions()) {
    if (!first) o += ",";
    first = false;
    o += "{\"uuid\":" + std::to_string(s.uuid) + ",\"pid\":" + std::to_string(s.pid) + ",\"uid\":" + std::to_string(s.uid) +
         ",\"job\":" + json_string(s.job) + ",\"device\":" + std::to_string(s.device) +
         ",\"memory_bytes\":" + std::to_string(s.stats.memory_in_use) +
         ",\"memory_quota\":" + std::to_string(s.stats.memory_quota) + ",\"sms\":" + std::to_string(s.stats.sms) +
         ",\"sms_granted\":" + std::to_string(s.stats.sms_granted) + ",\"handles\":" + std::to_string(s.stats.live_handles) + ",\"calls\":" + std::to_string(s.stats.calls_submitted) +
         ",\"calls_executed\":" + std::to_string(s.stats.calls_executed) + ",\"arena_bytes\":" + std::to_string(s.arena_bytes) + ",\"server_pid\":" + std::to_string(s.server_pid) +
         ",\"state\":\"" + state_of(s) + "\"}";
  }
  return o + "]}\n";
}

}  // namespace pos

namespace pos {
// Read on an operator's terminal: the job is shown as printable() does (no escape sequence, bell,
// newline or invalid byte reaches the terminal) and fitted to its column by characters, so a cut
// never splits one.
std::string PosdServer::sessions_table() const {
  const auto all = sessions();
  std::string o;
  char line[512];
  std::snprintf(line, sizeof(line), "%-8s %-8s %-24s %6s %14s %8s %12s %12s %-8s\n", "PID", "UID", "JOB", "DEVICE",
                "MEMORY", "HANDLES", "CALLS", "EXECUTED", "STATE");
  o += line;
  for (const auto& s : all) {
    std::snprintf(line, sizeof(line), "%-8u %-8u %s %6d %14llu %8llu %12llu %12llu %-8s\n", s.pid, s.uid,
                  fit_columns(printable(s.job), 24).c_str(), s.device, (unsigned long long)s.stats.memory_in_use,
                  (unsigned long long)s.stats.live_handles,
                  (unsigned long long)s.stats.calls_submitted, (unsigned long long)s.stats.calls_executed,
                  state_of(s));
    o += line;
  }
  o += std::to_string(all.size()) + " session(s) on " + printable(socket_path_) + " (" + backend_name_ + " backend, " +
       (config_.posd_isolation == Isolation::kProcess ? "a process per session" : "shared process") + ")\n";
  return o;
}
}  // namespace pos
