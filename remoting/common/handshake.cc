// handshake.cc — handshake.h: where posd listens and who may answer there, connect, hello, welcome
// checks. Every failure names the socket and what to do, since the first thing a misconfigured job
// prints is this message.
#include "remoting/common/handshake.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pos/base/cuda_errors.h"
#include "pos/base/parse.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"

namespace pos {
namespace {

constexpr size_t kSunPath = sizeof(sockaddr_un::sun_path);

std::string octal_mode(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof(b), "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

Status refused(const std::string& why) {
  return Status(Code::kFailedPrecondition, cuda::kErrorInitializationError, why);
}

}  // namespace

std::string private_socket_path(uint32_t uid, const char* xdg_runtime_dir) {
  struct stat st {};
  const auto owned_dir = [&](const std::string& d) {
    return ::stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid;
  };
  const std::string u = std::to_string(uid);
  const std::string fallback = "/tmp/pos-" + u + "/posd.sock";  // posd creates it 0700 and checks it
  if (uid == 0) return owned_dir("/run") && (st.st_mode & 022) == 0 ? "/run/pos/posd.sock" : fallback;
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    std::string x = xdg_runtime_dir;
    while (x.size() > 1 && x.back() == '/') x.pop_back();
    const std::string p = x + "/pos/posd.sock";
    // The XDG rule for the runtime directory: the user's own, mode 0700.
    if (p.size() < kSunPath && owned_dir(x) && (st.st_mode & 07777) == 0700) return p;
  }
  const std::string run = "/run/user/" + u;
  if (owned_dir(run) && (st.st_mode & 022) == 0) return run + "/pos/posd.sock";
  return fallback;
}

std::string default_socket_path() {
  if (const char* s = std::getenv("POS_SOCKET"); s != nullptr && *s != '\0') return s;
  return private_socket_path(::geteuid(), std::getenv("XDG_RUNTIME_DIR"));
}

std::string socket_dir_of(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : socket_path.substr(0, slash);
}

Status check_socket_dir(const std::string& dir, const std::vector<uint32_t>& owners, const std::string& whose) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    const int e = errno;
    return Status(e == ENOENT ? Code::kNotFound : Code::kUnavailable, cuda::kErrorInitializationError,
                  "cannot inspect " + dir + ": " + std::strerror(e));
  }
  if (S_ISLNK(st.st_mode))
    return refused(dir + " is a symbolic link: posd's socket directory must be the directory itself (whoever "
                         "can change the link decides where clients connect); name the real directory");
  if (!S_ISDIR(st.st_mode)) return refused(dir + " is not a directory");
  if (std::find(owners.begin(), owners.end(), static_cast<uint32_t>(st.st_uid)) == owners.end())
    return refused(dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to " + whose +
                   ": its owner can put any socket in posd's place; remove it, or choose another directory");
  if ((st.st_mode & 022) != 0)
    return refused(dir + " can be written by its group or others (mode " + octal_mode(st.st_mode) +
                   "): any of them can put a socket in posd's place; chmod go-w " + dir +
                   ", or choose a private directory");
  return Status::Ok();
}

StatusOr<std::vector<uint32_t>> trusted_daemon_uids(std::string* whose) {
  const uint32_t me = ::geteuid();
  if (const char* d = std::getenv("POS_DAEMON_UID"); d != nullptr && *d != '\0') {
    const std::string text = d;
    const bool digits = std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    auto v = digits ? parse_uint(text) : StatusOr<uint64_t>(Status::InvalidArgument("not digits"));
    if (!v.ok() || *v >= 0xffffffffull)
      return Status(Code::kInvalidArgument, cuda::kErrorInitializationError,
                    "POS_DAEMON_UID must be the uid posd runs as (decimal digits), not '" + text + "'");
    if (whose != nullptr) *whose = "uid " + text + " (POS_DAEMON_UID)";
    return std::vector<uint32_t>{static_cast<uint32_t>(*v)};
  }
  if (whose != nullptr)
    *whose = me == 0 ? "uid 0 (root, yours)" : "uid " + std::to_string(me) + " (yours) or 0 (root)";
  return me == 0 ? std::vector<uint32_t>{0} : std::vector<uint32_t>{me, 0};
}

Status posd_unreachable(const std::string& path, const std::string& why) {
  return Status(Code::kUnavailable, cuda::kErrorInitializationError,
                "cannot reach posd at " + path + ": " + why +
                    " (start posd, or point POS_SOCKET at its socket; see docs/remoting.md)");
}

// Who answers is checked before the hello goes out: the hello names the job, and what follows it
// (the fatbins, every call's arguments) must reach only a posd this user trusts.
StatusOr<int> open_posd_socket(const std::string& path, const wire::Hello& hello, int pass_fd) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return Status::InvalidArgument("socket path too long: " + path);
  std::string whose;
  auto trusted = trusted_daemon_uids(&whose);
  if (!trusted.ok()) return trusted.status();
  // The default socket's directory must be private (POS_SOCKET is the user's own choice: there
  // the peer's uid, below, is the check).
  if (path == private_socket_path(::geteuid(), std::getenv("XDG_RUNTIME_DIR"))) {
    const std::string dir = socket_dir_of(path);
    Status d = check_socket_dir(dir, *trusted, whose);
    if (d.code() == Code::kNotFound) return posd_unreachable(path, "there is no " + dir);
    if (!d.ok()) return Status(d.code(), d.api_error(), "refusing posd's socket " + path + ": " + d.message());
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return posd_unreachable(path, std::strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return posd_unreachable(path, std::strerror(errno));
  const char* what = hello.kind == static_cast<uint32_t>(wire::HelloKind::kControl) ? "request" : "job";
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
    return refused("cannot learn who answers at " + path + " (SO_PEERCRED: " + std::strerror(errno) +
                   "): refusing to send it this " + what);
  if (std::find(trusted->begin(), trusted->end(), static_cast<uint32_t>(peer.uid)) == trusted->end()) {
    const bool named = std::getenv("POS_DAEMON_UID") != nullptr && *std::getenv("POS_DAEMON_UID") != '\0';
    return refused("posd at " + path + " runs as uid " + std::to_string(peer.uid) + ", expected " + whose +
                   ": refusing to send it this " + what +
                   (named ? std::string() : " (if posd runs as another user, set POS_DAEMON_UID to its uid)"));
  }
  timeval tv{30, 0};  // a wedged posd must not hang the app forever
  (void)setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  Status s = pass_fd >= 0 ? send_with_fds(fd.get(), &hello, sizeof(hello), {pass_fd}) : send_all(fd.get(), &hello, sizeof(hello));
  if (!s.ok()) {
    // posd may have refused the connection before reading a byte (too many waiting) and closed
    // it: its welcome, which says why, is still there to read. Then the caller reads it.
    char b = 0;
    if (::recv(fd.get(), &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1) return fd.release();
    return posd_unreachable(path, s.message());
  }
  return fd.release();
}

Status check_welcome(const wire::Welcome& w) {
  if (w.magic != wire::kWelcomeMagic) return Status::Corrupt("posd sent a malformed welcome");
  if (w.version != wire::kProtocolVersion)
    return Status(Code::kFailedPrecondition, cuda::kErrorInitializationError,
                  "posd speaks protocol version " + std::to_string(w.version) + ", this libpos_client speaks " +
                      std::to_string(wire::kProtocolVersion) + ": use the posd and libpos_client of one POS build");
  if (w.code != 0) {
    const int32_t code = w.code > 0 && w.code <= static_cast<int32_t>(Code::kInternal) ? w.code : static_cast<int32_t>(Code::kInternal);
    return Status(static_cast<Code>(code), w.api_error != 0 ? w.api_error : cuda::kErrorInitializationError,
                  "posd refused the session: " + wire::get_cstr(w.message, sizeof(w.message)));
  }
  return Status::Ok();
}

}  // namespace pos
