// control_client.cc — posd_control: a control hello, the welcome, then the reply text.
// The reply's length is bounded before anything is allocated: posd is a peer, not trusted blindly.
#include "remoting/server/control_client.h"

#include <unistd.h>

#include "remoting/common/handshake.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/wire.h"

namespace pos {

StatusOr<std::string> posd_control(const std::string& socket_path, const std::string& command) {
  wire::Hello hello;
  hello.kind = static_cast<uint32_t>(wire::HelloKind::kControl);
  hello.pid = static_cast<uint32_t>(::getpid());
  wire::put_cstr(hello.command, sizeof(hello.command), command);
  auto fd = open_posd_socket(socket_path, hello);
  if (!fd.ok()) return fd.status();
  wire::Welcome w;
  Status s = recv_all(*fd, &w, sizeof(w));
  if (s.ok()) s = check_welcome(w);
  std::string text;
  if (s.ok() && w.control_bytes > (64u << 20)) s = Status::Corrupt("posd's reply is too long");
  if (s.ok()) {
    text.resize(w.control_bytes);
    s = recv_all(*fd, text.data(), text.size());
  }
  ::close(*fd);
  if (!s.ok()) return s;
  return text;
}

}  // namespace pos
