// socket_io.h — whole-buffer reads and writes on a stream socket, retried across EINTR and short
// transfers. Shared by the client library's handshake and posd's, so both treat a hang-up alike.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "pos/base/status.h"
#include "remoting/common/unique_fd.h"

namespace pos {

// "A.B.C.D:PORT" (port 0..65535) → an IPv4 socket address; `what` names the setting in errors.
StatusOr<sockaddr_in> parse_ipv4_endpoint(const std::string& text, const std::string& what);

// A listening TCP socket (SO_REUSEADDR) on `at`; `bound` gets where it listens, "A.B.C.D:PORT"
// (the port chosen if `at` asked for 0). `what` names it in errors ("cannot listen for WHAT on ...").
StatusOr<UniqueFd> listen_tcp(const sockaddr_in& at, int backlog, const std::string& what, std::string* bound);

// listen_tcp with a thread of its own that hands each accepted connection, one at a time, to
// `handler` (the connection and its peer, "A.B.C.D:PORT"; closed when the handler returns), until
// the server is destroyed. posd's metrics endpoint and migration listener.
class TcpServer {
 public:
  using Handler = std::function<void(int fd, const std::string& peer)>;
  static StatusOr<std::unique_ptr<TcpServer>> start(const sockaddr_in& at, int backlog, const std::string& what,
                                                    Handler handler);
  ~TcpServer();
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;
  const std::string& address() const { return address_; }

 private:
  TcpServer() = default;
  void serve();
  std::string address_;
  UniqueFd listen_, stop_;
  Handler handler_;
  std::thread thread_;
};

// kUnavailable once the peer is gone or the socket fails; never raises SIGPIPE.
Status send_all(int fd, const void* p, size_t n);
// All n bytes, or kUnavailable ("the peer closed the connection" when it hung up first).
Status recv_all(int fd, void* p, size_t n);

// One message (a packet, or a stream's bytes) with descriptors attached (SCM_RIGHTS); the caller's
// descriptors stay open.
Status send_with_fds(int fd, const void* data, size_t n, std::initializer_list<int> fds);
// The same for up to kMaxFdsPerMessage descriptors, all attached to the message's first byte.
inline constexpr size_t kMaxFdsPerMessage = 64;
Status send_with_fds(int fd, const void* data, size_t n, std::span<const int> fds);
// recv without waiting, keeping up to `max` descriptors that came along in fds[0..max) (each only if
// that slot is empty); any others are closed at once. recv's result.
ssize_t recv_with_fds(int fd, void* buf, size_t n, UniqueFd* fds, size_t max);

// Each descriptor SCM_RIGHTS brought on a received message, to take(fd), which then owns it.
// Allocates nothing: a forked child may use it.
template <typename Take>
void for_each_received_fd(msghdr* msg, Take take) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      take(got);
    }
  }
}

}  // namespace pos
