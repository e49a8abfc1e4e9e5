// pos_run.cc — `pos run [--census FILE] [--] CMD ARGS...`: starts any program with POS's in-process
// driver layer (libpos_driver.so, remoting/driver) preloaded, the way `LD_PRELOAD` would, then
// becomes that program (exec). A thin main: the layer itself is tested in driver_hooks_test.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef POS_VERSION_STRING
#define POS_VERSION_STRING "unknown"
#endif
#ifndef POS_DRIVER_LIB_PATH
#define POS_DRIVER_LIB_PATH "libpos_driver.so"
#endif
#ifndef POS_DRIVER_LIB_INSTALLED
#define POS_DRIVER_LIB_INSTALLED "/usr/local/lib/libpos_driver.so"
#endif

int main(int argc, char** argv) {
  CLI::App app{"pos: run unmodified CUDA programs under POS (docs/driver_runtime.md)", "pos"};
  app.set_version_flag("--version", std::string("pos ") + POS_VERSION_STRING);
  app.require_subcommand(1);
  std::string census;
  CLI::App* run = app.add_subcommand(
      "run", "start CMD with POS's driver layer preloaded: pos run [--census FILE] [--] CMD ARGS...");
  run->add_option("--census", census,
                  "write what the program resolved and called through the driver, as JSON, to FILE at its exit "
                  "('-': stderr)");
  run->prefix_command();  // everything from CMD on is the program's, options included
  // What follows `--` is the program's, never parsed here; CLI11 sees only what comes before.
  std::vector<std::string> cmd;
  int own = argc;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      own = i;
      for (int j = i + 1; j < argc; ++j) cmd.emplace_back(argv[j]);
      break;
    }
  if (own > 1 && argv[1][0] != '-' && std::strcmp(argv[1], "run") != 0) {
    std::fprintf(stderr, "pos: unknown command '%s' (the only one is run)\nRun 'pos --help' for the commands.\n", argv[1]);
    return 2;
  }
  try {
    app.parse(own, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) msg = "a command is required (run)";
    std::fprintf(stderr, "pos: %s\nRun 'pos --help' for the commands.\n", msg.c_str());
    return 2;
  }
  if (own == argc) {  // no `--`: the program starts at the first positional
    cmd = run->remaining();
    if (!cmd.empty() && cmd.front().starts_with("-")) {
      std::fprintf(stderr, "pos run: unknown option %s (a program's own options go after its name, or after --)\n",
                   cmd.front().c_str());
      return 2;
    }
  }
  if (cmd.empty()) {
    std::fprintf(stderr, "pos run: no command given: pos run [--census FILE] [--] CMD ARGS...\n");
    return 2;
  }
  // The layer goes first in LD_PRELOAD, so its exports come before every other library's. Named by
  // POS_DRIVER_LIB, it must be there; else the build's copy, else the installed one.
  const char* lib_env = std::getenv("POS_DRIVER_LIB");
  std::string lib = (lib_env != nullptr && *lib_env != '\0') ? lib_env : POS_DRIVER_LIB_PATH;
  if (::access(lib.c_str(), R_OK) != 0 && (lib_env == nullptr || *lib_env == '\0') &&
      ::access(POS_DRIVER_LIB_INSTALLED, R_OK) == 0)
    lib = POS_DRIVER_LIB_INSTALLED;
  if (::access(lib.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "pos run: cannot read the driver layer %s: %s (set POS_DRIVER_LIB)\n", lib.c_str(),
                 std::strerror(errno));
    return 1;
  }
  const char* old = std::getenv("LD_PRELOAD");
  const std::string preload = (old != nullptr && *old != '\0') ? lib + ":" + old : lib;
  if (::setenv("LD_PRELOAD", preload.c_str(), 1) != 0 ||
      (!census.empty() && ::setenv("POS_DRIVER_CENSUS", census.c_str(), 1) != 0) ||
      // Device memory at POS's addresses, which a dump needs (docs/driver_runtime.md): on under
      // pos run unless the environment says otherwise (POS_DRIVER_PLACE=0).
      ::setenv("POS_DRIVER_PLACE", "1", 0) != 0) {
    std::fprintf(stderr, "pos run: cannot set the environment: %s\n", std::strerror(errno));
    return 1;
  }
  std::vector<char*> args;
  for (std::string& a : cmd) args.push_back(a.data());
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "pos run: cannot start %s: %s\n", args[0], std::strerror(errno));
  return errno == ENOENT ? 127 : 126;
}
