// socket_io.cc — send_all / recv_all of socket_io.h.
// MSG_NOSIGNAL: a peer that vanished mid-handshake must not kill the process with SIGPIPE.
#include "remoting/common/socket_io.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace pos {

Status send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Unavailable(std::string("socket write: ") + std::strerror(errno));
    c += w, n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Status::Unavailable("the peer closed the connection");
    if (r < 0) return Status::Unavailable(std::string("socket read: ") + std::strerror(errno));
    c += r, n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace pos
