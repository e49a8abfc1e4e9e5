// handshake.cc — handshake.h: connect, hello, welcome checks. Every failure names the socket and
// what to do, since the first thing a misconfigured job prints is this message.
#include "remoting/common/handshake.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "pos/base/cuda_errors.h"
#include "remoting/common/socket_io.h"

namespace pos {

Status posd_unreachable(const std::string& path, const std::string& why) {
  return Status(Code::kUnavailable, cuda::kErrorInitializationError,
                "cannot reach posd at " + path + ": " + why +
                    " (start posd, or point POS_SOCKET at its socket; see docs/remoting.md)");
}

// Connects and sends the hello; the welcome (and any descriptors) is read by the caller.
StatusOr<int> open_posd_socket(const std::string& path, const wire::Hello& hello) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return Status::InvalidArgument("socket path too long: " + path);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return posd_unreachable(path, std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    ::close(fd);
    return posd_unreachable(path, std::strerror(e));
  }
  timeval tv{30, 0};  // a wedged posd must not hang the app forever
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  Status s = send_all(fd, &hello, sizeof(hello));
  if (!s.ok()) {
    ::close(fd);
    return posd_unreachable(path, s.message());
  }
  return fd;
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

std::string default_socket_path() {
  if (const char* s = std::getenv("POS_SOCKET"); s != nullptr && *s != '\0') return s;
  return "/tmp/posd-" + std::to_string(::getuid()) + ".sock";
}

}  // namespace pos
