// socket_io.cc — send_all / recv_all of socket_io.h, and the IPv4 endpoint parser.
// MSG_NOSIGNAL: a peer that vanished mid-handshake must not kill the process with SIGPIPE.
#include "remoting/common/socket_io.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "pos/base/text.h"

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

Status send_with_fds(int fd, const void* data, size_t n, std::initializer_list<int> fds) {
  return send_with_fds(fd, data, n, std::span<const int>(fds.begin(), fds.size()));
}

Status send_with_fds(int fd, const void* data, size_t n, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerMessage) return Status::InvalidArgument("too many descriptors for one message");
  if (n == 0) return Status::InvalidArgument("descriptors need at least one byte to travel with");
  msghdr msg{};
  iovec iov{const_cast<void*>(data), n};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(kMaxFdsPerMessage * sizeof(int))] = {};
  msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = cbuf, msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  if (!fds.empty()) std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  ssize_t w = 0;
  do w = ::sendmsg(fd, &msg, MSG_NOSIGNAL); while (w < 0 && errno == EINTR);
  if (w <= 0) return Status::Unavailable(std::string("sendmsg: ") + std::strerror(errno));
  // The descriptors went with the first byte; the rest of a short send is plain bytes.
  if (static_cast<size_t>(w) < n) return send_all(fd, static_cast<const char*>(data) + w, n - static_cast<size_t>(w));
  return Status::Ok();
}

ssize_t recv_with_fds(int fd, void* buf, size_t n, UniqueFd* fds, size_t max) {
  msghdr msg{};
  iovec iov{buf, n};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(4 * sizeof(int))];
  msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = cbuf, msg.msg_controllen = sizeof(cbuf);
  const ssize_t r = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r < 0) return r;
  size_t next = 0;
  for_each_received_fd(&msg, [&](int got) {
    while (next < max && fds[next]) ++next;
    if (next < max) fds[next++].reset(got);
    else ::close(got);
  });
  return r;
}

StatusOr<sockaddr_in> parse_ipv4_endpoint(const std::string& address, const std::string& what) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size() || address.size() > 64)
    return Status::InvalidArgument(what + " must be HOST:PORT with an IPv4 address, e.g. 127.0.0.1:9464, not '" +
                                   printable(address, 64) + "'");
  const std::string host = address.substr(0, colon), port_text = address.substr(colon + 1);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    return Status::InvalidArgument(what + ": '" + printable(host, 64) + "' is no IPv4 address");
  unsigned long port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9' || port > 65535) return Status::InvalidArgument(what + ": the port must be 0 to 65535");
    port = port * 10 + static_cast<unsigned long>(c - '0');
  }
  if (port > 65535) return Status::InvalidArgument(what + ": the port must be 0 to 65535");
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

StatusOr<UniqueFd> listen_tcp(const sockaddr_in& at, int backlog, const std::string& what, std::string* bound) {
  sockaddr_in a = at;
  char host[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::Unavailable(what + " socket: " + std::strerror(errno));
  const int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd.get(), backlog) != 0)
    return Status::Unavailable("cannot listen for " + what + " on " + host + ":" + std::to_string(ntohs(at.sin_port)) +
                               ": " + std::strerror(errno));
  socklen_t len = sizeof(a);
  (void)::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  *bound = std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
  return fd;
}

StatusOr<std::unique_ptr<TcpServer>> TcpServer::start(const sockaddr_in& at, int backlog, const std::string& what,
                                                      Handler handler) {
  std::unique_ptr<TcpServer> t(new TcpServer());
  auto fd = listen_tcp(at, backlog, what, &t->address_);
  if (!fd.ok()) return fd.status();
  t->listen_ = std::move(*fd);
  t->stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC));
  if (!t->stop_) return Status::Unavailable(std::string("eventfd: ") + std::strerror(errno));
  t->handler_ = std::move(handler);
  t->thread_ = std::thread([p = t.get()] { p->serve(); });
  return t;
}

TcpServer::~TcpServer() {
  if (stop_) {
    const uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

void TcpServer::serve() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    UniqueFd c(::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC));
    if (!c) continue;
    char host[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &peer.sin_addr, host, sizeof(host));
    handler_(c.get(), std::string(host) + ":" + std::to_string(ntohs(peer.sin_port)));
  }
}

}  // namespace pos
