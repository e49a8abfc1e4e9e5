// pos_run.cc — `pos run [--census FILE] [--checkpoint-every T -D DIR ...] [--] CMD ARGS...`: starts
// any program with POS's in-process driver layer (libpos_driver.so, remoting/driver) preloaded, the
// way `LD_PRELOAD` would, then becomes that program (exec); with a checkpoint policy, a detached
// `pos-cli checkpoint` outside the job's process tree checkpoints it (docs/continuous_checkpointing.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pos/base/parse.h"
#include "pos/base/text.h"
#include "remoting/server/checkpoint_policy.h"

#ifndef POS_VERSION_STRING
#define POS_VERSION_STRING "unknown"
#endif
#ifndef POS_DRIVER_LIB_PATH
#define POS_DRIVER_LIB_PATH "libpos_driver.so"
#endif
#ifndef POS_DRIVER_LIB_INSTALLED
#define POS_DRIVER_LIB_INSTALLED "/usr/local/lib/libpos_driver.so"
#endif

namespace {

using pos::Status;

// The checkpoint policy of the program this process is about to become: `pos-cli checkpoint
// --foreground --wait` in a grandchild (so that it is no part of the job's process tree, which a
// --with-cpu dump hands to CRIU), in a session of its own, its output appended to DIR/checkpoint.log.
Status start_policy(const std::string& every, const std::string& dir, unsigned keep, unsigned full_every, bool with_cpu) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string cli = "pos-cli";
  if (n > 0) {
    std::string beside(self, static_cast<size_t>(n));
    beside = beside.substr(0, beside.rfind('/') + 1) + "pos-cli";
    if (::access(beside.c_str(), X_OK) == 0) cli = beside;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::InvalidArgument("cannot make " + dir + ": " + std::strerror(errno));
  const std::string log = dir + "/checkpoint.log";
  const int lf = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lf < 0) return Status::InvalidArgument("cannot open " + log + ": " + std::strerror(errno));
  const std::string pid = std::to_string(::getpid());
  std::vector<std::string> argv_s = {cli, "checkpoint", "-t", pid, "-D", dir, "--every", every, "--keep",
                                     std::to_string(keep), "--full-every", std::to_string(full_every), "--foreground",
                                     "--wait", "120"};
  if (with_cpu) argv_s.push_back("--with-cpu");
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(lf);
    return Status::Unavailable(std::string("fork: ") + std::strerror(errno));
  }
  if (child == 0) {
    if (::fork() != 0) ::_exit(0);  // the grandchild goes on, adopted away from the job
    ::setsid();
    const int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul >= 0) ::dup2(nul, 0);
    ::dup2(lf, 1), ::dup2(lf, 2);
    std::vector<char*> av;
    for (std::string& a : argv_s) av.push_back(a.data());
    av.push_back(nullptr);
    ::execvp(av[0], av.data());
    std::fprintf(stderr, "pos run: cannot start %s: %s\n", av[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(lf);
  int st = 0;
  (void)::waitpid(child, &st, 0);
  return Status::Ok();
}

}  // namespace

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
  std::string every, ckpt_dir;
  unsigned keep = 3, full_every = 10;
  bool with_cpu = false;
  run->add_option("--checkpoint-every", every, "checkpoint the program every interval (30s, 500ms, 2m) into -D DIR");
  run->add_option("-D,--images-dir", ckpt_dir, "with --checkpoint-every: the directory of its restore points");
  run->add_option("--keep", keep, "with --checkpoint-every: the newest restore points kept")->check(CLI::Range(1u, 100000u));
  run->add_option("--full-every", full_every, "with --checkpoint-every: every K-th restore point is whole")
      ->check(CLI::Range(1u, 64u));
  run->add_flag("--with-cpu", with_cpu, "with --checkpoint-every: each restore point a whole process (CRIU)");
  std::string memory;
  run->add_option("--memory", memory,
                  "the program's device-memory limit (8GiB, 512MiB): allocations past it fail as out of memory; "
                  "pos-cli limit changes it (docs/limits.md)");
  std::string gpu_share;
  run->add_option("--gpu-share", gpu_share,
                  "the program's share of its GPU's time while other jobs want it too (30%, 12.5%): launches past "
                  "it wait; alone it runs at full speed (docs/limits.md)");
  unsigned sms = 0;
  run->add_option("--sms", sms,
                  "the SMs the program's kernels may run on (40): its contexts are green contexts of that many SMs, "
                  "rounded up to the GPU's SM group; fixed for the program's life (docs/limits.md)")
      ->check(CLI::Range(1u, 100000u));
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
  if (every.empty() != ckpt_dir.empty()) {
    std::fprintf(stderr, "pos run: --checkpoint-every and -D go together\n");
    return 2;
  }
  if (!memory.empty()) {
    auto bytes = pos::parse_size(memory);
    if (!bytes.ok() || *bytes == 0) {
      std::fprintf(stderr, "pos run: --memory %s: %s\n", pos::printable(memory, 64).c_str(),
                   bytes.ok() ? "a limit of 0 bytes would refuse every allocation" : bytes.status().message().c_str());
      return 2;
    }
    if (::setenv("POS_MEMORY_LIMIT", std::to_string(*bytes).c_str(), 1) != 0) {
      std::fprintf(stderr, "pos run: cannot set the environment: %s\n", std::strerror(errno));
      return 1;
    }
  }
  if (!gpu_share.empty()) {
    auto pm = pos::parse_share(gpu_share);
    if (!pm.ok()) {
      std::fprintf(stderr, "pos run: --gpu-share %s\n", pm.status().message().c_str());
      return 2;
    }
    const std::string pct = std::to_string(*pm / 10) + "." + std::to_string(*pm % 10) + "%";
    if (::setenv("POS_GPU_SHARE", pct.c_str(), 1) != 0) {
      std::fprintf(stderr, "pos run: cannot set the environment: %s\n", std::strerror(errno));
      return 1;
    }
  }
  if (sms != 0 && ::setenv("POS_SM_LIMIT", std::to_string(sms).c_str(), 1) != 0) {
    std::fprintf(stderr, "pos run: cannot set the environment: %s\n", std::strerror(errno));
    return 1;
  }
  if (!every.empty()) {
    if (auto iv = pos::parse_interval(every); !iv.ok()) {
      std::fprintf(stderr, "pos run: --checkpoint-every: %s\n", iv.status().message().c_str());
      return 2;
    }
    if (Status st = start_policy(every, ckpt_dir, keep, full_every, with_cpu); !st.ok()) {
      std::fprintf(stderr, "pos run: %s\n", st.message().c_str());
      return 1;
    }
  }
  std::vector<char*> args;
  for (std::string& a : cmd) args.push_back(a.data());
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "pos run: cannot start %s: %s\n", args[0], std::strerror(errno));
  return errno == ENOENT ? 127 : 126;
}
