// handshake.h — the client side of posd's socket handshake (docs/wire_format.md): where posd
// listens, who may answer there, connecting and sending a hello, checking the welcome. Sessions and control requests share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pos/base/status.h"
#include "remoting/common/wire.h"

namespace pos {

// posd's default socket for `uid` (docs/remoting.md, "Where posd listens"): always in a directory
// that only `uid` (or root) can write, so nobody else can bind the name first. Root:
// /run/pos/posd.sock. Another uid: $XDG_RUNTIME_DIR/pos/posd.sock when `xdg_runtime_dir` is an
// absolute path to a directory of `uid`'s with mode 0700; else /run/user/<uid>/pos/posd.sock when
// that user directory exists, is `uid`'s and nobody else may write it; else /tmp/pos-<uid>/posd.sock.
// Pure apart from stat(2): posd and its clients compute the same path.
std::string private_socket_path(uint32_t uid, const char* xdg_runtime_dir);
// Where posd listens: $POS_SOCKET, else private_socket_path(geteuid(), $XDG_RUNTIME_DIR).
std::string default_socket_path();
// The directory a socket path names (".": a bare name; "/": the root).
std::string socket_dir_of(const std::string& socket_path);

// Whether `dir` may hold posd's socket: it exists (else kNotFound), is a directory and not a
// symbolic link, belongs to one of `owners` (`whose` says which in words, e.g. "uid 0 (posd's)"),
// and neither its group nor others may write it: whoever could write it could put their own socket
// in posd's place. Refusals are kFailedPrecondition and say what is wrong and how to fix it.
Status check_socket_dir(const std::string& dir, const std::vector<uint32_t>& owners, const std::string& whose);

// The uids this process accepts as posd's: the one $POS_DAEMON_UID names (decimal digits) when it
// is set, else its own effective uid and root. `whose` (optional) gets them in words. An
// unreadable POS_DAEMON_UID is an error that names it.
StatusOr<std::vector<uint32_t>> trusted_daemon_uids(std::string* whose = nullptr);

// kUnavailable with cudaErrorInitializationError, saying how to start posd or find its socket.
Status posd_unreachable(const std::string& path, const std::string& why);
// Connects and sends the hello; the caller reads the welcome (and any descriptors) and closes
// the descriptor. Before a byte is sent it checks who answers: the peer (SO_PEERCRED) must run as
// a trusted uid (trusted_daemon_uids), and the default socket's directory must pass
// check_socket_dir; otherwise it hangs up and says so. Reads time out after 30 s: a wedged posd
// must not hang the caller forever. `pass_fd` (>= 0) travels with the hello (SCM_RIGHTS).
StatusOr<int> open_posd_socket(const std::string& path, const wire::Hello& hello, int pass_fd = -1);
// A welcome's magic and version, and posd's refusal as a Status.
Status check_welcome(const wire::Welcome& w);

}  // namespace pos
