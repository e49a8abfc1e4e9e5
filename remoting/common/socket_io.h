// socket_io.h — whole-buffer reads and writes on a stream socket, retried across EINTR and short
// transfers. Shared by the client library's handshake and posd's, so both treat a hang-up alike.
#pragma once

#include <cstddef>

#include "pos/base/status.h"

namespace pos {

// kUnavailable once the peer is gone or the socket fails; never raises SIGPIPE.
Status send_all(int fd, const void* p, size_t n);
// All n bytes, or kUnavailable ("the peer closed the connection" when it hung up first).
Status recv_all(int fd, void* p, size_t n);

}  // namespace pos
