// pos_cli.cc — `pos-cli`, the operator's tool. A thin main over tested libraries.
// `inspect DIR [--json]` (ckpt/inspect), `ps [--json] [--socket PATH]` (posd's sessions).
#include <cstdio>
#include <cstring>
#include <string>

#include "ckpt/inspect.h"
#include "remoting/common/handshake.h"
#include "remoting/server/control_client.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: pos-cli inspect IMAGE_DIR [--json]\n"
               "       pos-cli ps [--json] [--socket PATH]\n"
               "  inspect   validate a checkpoint image (and its parents) and print it\n"
               "  ps        list posd's sessions: pid, job, device memory, calls, state\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  if (cmd == "inspect") {
    std::string dir;
    bool json = false;
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--json") == 0) json = true;
      else if (dir.empty() && argv[i][0] != '-') dir = argv[i];
      else return usage();
    }
    if (dir.empty()) return usage();
    auto img = pos::ckpt::ImageReader::open_dir(dir);
    if (!img.ok()) {
      std::fprintf(stderr, "pos-cli: %s: %s\n", dir.c_str(), img.status().to_string().c_str());
      return 1;
    }
    std::fputs(pos::ckpt::describe_image(**img, json).c_str(), stdout);
    return 0;
  }
  if (cmd == "ps") {
    bool json = false;
    std::string socket = pos::default_socket_path();
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--json") == 0) json = true;
      else if (std::strcmp(argv[i], "--socket") == 0 && i + 1 < argc) socket = argv[++i];
      else return usage();
    }
    // posd renders both forms: one source of truth for the fields.
    auto text = pos::posd_control(socket, json ? "ps" : "ps-table");
    if (!text.ok()) {
      std::fprintf(stderr, "pos-cli: %s\n", text.status().message().c_str());
      return 1;
    }
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  return usage();
}
