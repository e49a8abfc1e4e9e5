// handshake.h — the client side of posd's socket handshake (docs/wire_format.md): where posd
// listens, connecting and sending a hello, checking the welcome. Sessions and control requests share it.
#pragma once

#include <string>

#include "pos/base/status.h"
#include "remoting/common/wire.h"

namespace pos {

// Where posd listens: $POS_SOCKET, else /tmp/posd-<uid>.sock (docs/remoting.md).
std::string default_socket_path();

// kUnavailable with cudaErrorInitializationError, saying how to start posd or find its socket.
Status posd_unreachable(const std::string& path, const std::string& why);
// Connects and sends the hello; the caller reads the welcome (and any descriptors) and closes
// the descriptor. Reads time out after 30 s: a wedged posd must not hang the caller forever.
StatusOr<int> open_posd_socket(const std::string& path, const wire::Hello& hello);
// A welcome's magic and version, and posd's refusal as a Status.
Status check_welcome(const wire::Welcome& w);

}  // namespace pos
