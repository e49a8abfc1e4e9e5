// job_control.cc — in-process jobs' control sockets: the answering thread, the asker, the scan.
#include "remoting/common/job_control.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "pos/base/sync.h"
#include "pos/base/thread.h"
#include "remoting/common/handshake.h"
#include "remoting/common/socket_io.h"

namespace pos {

namespace {

constexpr size_t kMaxCommand = 4200;  // "dump-save " and a path (PATH_MAX)
constexpr size_t kMaxAnswer = 4u << 20;  // a census of thousands of symbols is well under this

Status fill_address(const std::string& path, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  if (path.size() >= sizeof(a->sun_path)) return Status::InvalidArgument("socket path too long: " + path);
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path, path.c_str(), path.size() + 1);
  return Status::Ok();
}

bool peer_allowed(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == ::geteuid() || cred.uid == 0;
}

void set_timeouts(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

std::string default_jobs_dir() {
  if (const char* d = std::getenv("POS_JOBS_DIR"); d != nullptr && *d != '\0') return d;
  // Beside posd's private directory, never in it: posd decides that directory's mode and group.
  return socket_dir_of(private_socket_path(::geteuid(), std::getenv("XDG_RUNTIME_DIR"))) + "-jobs";
}

std::string jobs_dir_of_process(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (::stat(proc.c_str(), &st) != 0) return "";
  UniqueFd f(::open((proc + "/environ").c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) return "";
  std::string env;
  char buf[4096];
  for (ssize_t n; (n = ::read(f.get(), buf, sizeof(buf))) > 0 && env.size() < (1u << 20);) env.append(buf, static_cast<size_t>(n));
  std::string jobs_dir, xdg;
  bool has_xdg = false;
  for (size_t i = 0; i < env.size();) {
    const size_t end = env.find('\0', i);
    const std::string kv = env.substr(i, end == std::string::npos ? std::string::npos : end - i);
    if (kv.rfind("POS_JOBS_DIR=", 0) == 0 && kv.size() > 13) jobs_dir = kv.substr(13);
    if (kv.rfind("XDG_RUNTIME_DIR=", 0) == 0) xdg = kv.substr(16), has_xdg = true;
    if (end == std::string::npos) break;
    i = end + 1;
  }
  if (!jobs_dir.empty()) return jobs_dir;
  return socket_dir_of(private_socket_path(st.st_uid, has_xdg ? xdg.c_str() : nullptr)) + "-jobs";
}

std::string job_socket_path(const std::string& dir, pid_t pid) { return dir + "/" + std::to_string(pid) + ".sock"; }

Status send_line_with_fds(int sock, const std::string& line, const std::vector<int>& fds) {
  const size_t batches = (fds.size() + kFdsPerByte - 1) / kFdsPerByte;
  if (fds.size() > kMaxFds || batches > line.size())
    return Status::InvalidArgument(std::to_string(fds.size()) + " descriptors do not fit on a line of " +
                                   std::to_string(line.size()) + " bytes");
  std::vector<char> ctl(CMSG_SPACE(kFdsPerByte * sizeof(int)));
  for (size_t b = 0; b < batches; ++b) {
    const size_t first = b * kFdsPerByte, n = std::min(kFdsPerByte, fds.size() - first);
    msghdr msg{};
    iovec iov{const_cast<char*>(line.data() + b), 1};
    msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = ctl.data(), msg.msg_controllen = CMSG_SPACE(n * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(n * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data() + first, n * sizeof(int));
    ssize_t w;
    while ((w = ::sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    if (w != 1) return Status::Unavailable(std::string("sendmsg: ") + std::strerror(errno));
  }
  const std::string rest = line.substr(batches) + "\n";
  return send_all(sock, rest.data(), rest.size());
}

StatusOr<ControlMessage> recv_line_with_fds(int sock, size_t max) {
  ControlMessage m;
  std::vector<char> ctl(CMSG_SPACE(kFdsPerByte * sizeof(int)));
  char buf[4096];
  for (;;) {
    // Byte by byte while descriptors may still ride on the bytes (one batch per byte), then in bulk.
    const bool single = m.text.size() < kMaxFds / kFdsPerByte;
    msghdr msg{};
    iovec iov{buf, single ? size_t{1} : sizeof(buf)};
    msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = ctl.data(), msg.msg_controllen = ctl.size();
    const ssize_t r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (single ? 0 : MSG_PEEK));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Unavailable(std::string("no whole line came: ") + std::strerror(errno));
    if (r == 0) return Status::Unavailable("the peer closed the connection before a whole line");
    for_each_received_fd(&msg, [&](int got) { m.fds.emplace_back(got); });
    if (msg.msg_flags & MSG_CTRUNC) return Status::Corrupt("descriptors were lost on the way (the descriptor limit)");
    // In bulk the bytes were only peeked: take those up to and with the newline, no more, so
    // that nothing after the line is consumed.
    size_t take = static_cast<size_t>(r);
    const char* nl = static_cast<const char*>(std::memchr(buf, '\n', take));
    if (nl != nullptr) take = static_cast<size_t>(nl - buf) + 1;
    if (!single) {
      ssize_t got;
      while ((got = ::recv(sock, buf, take, 0)) < 0 && errno == EINTR) {
      }
      if (got != static_cast<ssize_t>(take)) return Status::Unavailable("the line went away while read");
    }
    m.text.append(buf, nl != nullptr ? take - 1 : take);
    if (nl != nullptr) return m;
    if (m.text.size() > max) return Status::Corrupt("a line longer than " + std::to_string(max) + " bytes");
  }
}

StatusOr<std::unique_ptr<JobControlServer>> JobControlServer::start(
    const std::string& dir, std::function<std::string(const std::string&)> answer) {
  return start_with_fds(dir, [answer = std::move(answer)](ControlMessage& cmd) {
    ControlMessage out;
    out.text = answer(cmd.text);
    return out;
  });
}

StatusOr<std::unique_ptr<JobControlServer>> JobControlServer::start_with_fds(
    const std::string& dir, std::function<ControlMessage(ControlMessage&)> answer) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::Unavailable("cannot make " + dir + ": " + std::strerror(errno));
  POS_RETURN_IF_ERROR(check_socket_dir(dir, {static_cast<uint32_t>(::geteuid())}, "this job's uid"));
  std::unique_ptr<JobControlServer> s(new JobControlServer);
  s->owner_ = ::getpid();
  s->path_ = job_socket_path(dir, s->owner_);
  s->answer_ = std::move(answer);
  sockaddr_un a{};
  POS_RETURN_IF_ERROR(fill_address(s->path_, &a));
  s->listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s->listen_) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  ::unlink(s->path_.c_str());  // a stale socket of an earlier process with this pid
  if (::bind(s->listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Status::Unavailable("cannot bind " + s->path_ + ": " + std::strerror(errno));
  if (::listen(s->listen_.get(), 8) != 0) {
    ::unlink(s->path_.c_str());
    return Status::Unavailable("cannot listen on " + s->path_ + ": " + std::strerror(errno));
  }
  // The thread must not take signals meant for the job's own threads.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  Status st = start_thread(&s->thread_, "the job's control thread", [p = s.get()] {
    name_this_thread("pos-control");
    p->serve();
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!st.ok()) {
    ::unlink(s->path_.c_str());
    return st;
  }
  return s;
}

JobControlServer::~JobControlServer() {
  if (listen_) ::shutdown(listen_.get(), SHUT_RDWR);  // wakes accept
  if (thread_.joinable()) thread_.join();
  remove_socket();
}

void JobControlServer::remove_socket() {
  if (!path_.empty() && ::getpid() == owner_) ::unlink(path_.c_str());
}

void JobControlServer::serve() {
  for (;;) {
    UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EINVAL || errno == EBADF) return;  // shut down
      ::usleep(10000);                                 // out of descriptors, say: do not spin
      continue;
    }
    if (!peer_allowed(c.get())) continue;  // closed unanswered
    set_timeouts(c.get(), 1000);
    auto cmd = recv_line_with_fds(c.get(), kMaxCommand);
    if (!cmd.ok()) continue;  // no whole command (or its descriptors lost): nothing to answer
    ControlMessage reply = answer_(*cmd);
    std::vector<int> fds;
    for (const UniqueFd& f : reply.fds) fds.push_back(f.get());
    // Descriptors need as many bytes to ride on: an answer is a JSON object, padded with spaces.
    const size_t need = (fds.size() + kFdsPerByte - 1) / kFdsPerByte;
    if (reply.text.size() < need) reply.text.append(need - reply.text.size(), ' ');
    (void)send_line_with_fds(c.get(), reply.text, fds);
  }
}

StatusOr<std::string> ask_job(const std::string& socket, const std::string& command, int timeout_ms) {
  auto got = ask_job_fds(socket, command, {}, timeout_ms);
  if (!got.ok()) return got.status();
  return std::move(got->text);
}

StatusOr<ControlMessage> ask_job_fds(const std::string& socket, const std::string& command, const std::vector<int>& fds,
                                     int timeout_ms) {
  if (command.size() > kMaxCommand || command.find('\n') != std::string::npos)
    return Status::InvalidArgument("not a control command: " + command);
  sockaddr_un a{};
  POS_RETURN_IF_ERROR(fill_address(socket, &a));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Status::Unavailable("cannot connect to " + socket + ": " + std::strerror(errno));
  if (!peer_allowed(fd.get()))
    return Status::FailedPrecondition(socket + " is served by another user's process: not asked");
  set_timeouts(fd.get(), timeout_ms);
  POS_RETURN_IF_ERROR(send_line_with_fds(fd.get(), command, fds));
  auto got = recv_line_with_fds(fd.get(), kMaxAnswer);
  if (!got.ok()) return got.status().with_context(socket + " did not answer");
  // An answer with descriptors may be padded (one batch rides on each byte).
  if (!got->fds.empty())
    while (!got->text.empty() && got->text.back() == ' ') got->text.pop_back();
  return got;
}

std::vector<JobAnswer> ask_jobs(const std::string& dir, const std::string& command, std::vector<std::string>* skipped) {
  std::vector<JobAnswer> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  std::vector<pid_t> pids;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const size_t dot = name.find(".sock");
    if (dot == std::string::npos || dot == 0 || dot + 5 != name.size()) continue;
    const std::string digits = name.substr(0, dot);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    pids.push_back(static_cast<pid_t>(std::atoi(digits.c_str())));
  }
  ::closedir(d);
  std::sort(pids.begin(), pids.end());
  for (pid_t pid : pids) {
    const std::string path = job_socket_path(dir, pid);
    if (::kill(pid, 0) != 0 && errno == ESRCH) {  // the job is gone (killed: nothing removed its socket)
      ::unlink(path.c_str());
      continue;
    }
    auto a = ask_job(path, command);
    if (!a.ok()) {
      if (skipped != nullptr) skipped->push_back(path + ": " + a.status().message());
      continue;
    }
    out.push_back(JobAnswer{pid, std::move(*a)});
  }
  return out;
}

}  // namespace pos
