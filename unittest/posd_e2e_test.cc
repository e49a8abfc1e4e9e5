// posd_e2e_test.cc — the unmodified training binary (nvcc -cudart shared) under LD_PRELOAD against a
// real posd process: same output as without POS, several clients at once, a killed client reclaimed.
// Host backend in CI (reference: the direct CPU computation); CUDA backend in the gpu suite
// (reference: the same binary run natively).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <spawn.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <deque>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <atomic>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "remoting/client/shm_client.h"
#include "remoting/common/process_info.h"
#include "remoting/common/usage_region.h"
#include "unittest/netns_peer.h"
#include "unittest/run_program.h"
#include "workloads/mlp_reference.h"
#include "pos/checkpoint/checkpoint.h"
#include "remoting/server/checkpoint_policy.h"
#include "remoting/server/control_client.h"

extern char** environ;

namespace {

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) ADD_FAILURE() << name << " is not set (meson sets it)";
  return v == nullptr ? "" : v;
}
bool on_gpu() {
  const char* b = std::getenv("POS_TEST_BACKEND");
  return b != nullptr && std::string(b) == "cuda";
}

// Runs a shell command line; returns stdout (stderr into *err).
std::string shell(const std::string& cmd, int* code, std::string* err) {
  const std::string err_file = ::testing::TempDir() + "posd_e2e_stderr_" + std::to_string(::getpid()) + "_" +
                               std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + ".txt";
  FILE* p = popen((cmd + " 2>" + err_file).c_str(), "r");
  std::string out;
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err_file);
  err->assign(std::istreambuf_iterator<char>(f), {});
  return out;
}

// Starts a posd (the host or CUDA backend, as the suite runs) on `socket`, its stderr into `log`,
// and waits until it answers.
// `prefix`: a command posd runs under (ip netns exec NS: posd in another network namespace).
void start_posd(const std::string& socket, const std::string& log, pid_t* pid, const std::string& posd_extra = "",
                const std::vector<std::string>& prefix = {}) {
  const std::string cfg = socket.substr(0, socket.rfind('/')) + ".yaml";  // beside posd's own directory
  {
    std::ofstream y(cfg);
    // posd_extra last: more `posd:` keys, and after them top-level sections if it needs some.
    y << "backend: " << (on_gpu() ? "cuda" : "host") << "\nlog_level: info\nposd:\n  socket: " << socket
      << "\n  arena: 32MiB\n";
    if (!on_gpu()) y << "  host_kernel_libraries: [" << env_or_fail("POS_MLP_HOST_KERNELS") << "]\n";
    y << posd_extra;
  }
  const std::string posd = env_or_fail("POS_POSD");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  for (const auto& p : prefix) argv.push_back(const_cast<char*>(p.c_str()));
  for (const char* a : {posd.c_str(), "--config", cfg.c_str()}) argv.push_back(const_cast<char*>(a));
  argv.push_back(nullptr);
  ASSERT_EQ(posix_spawnp(pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  // Ready when it answers `ps` (bounded: a posd that never comes up fails the test).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pos::posd_control(socket, "ps").ok()) {
    int st = 0;
    std::ifstream f(log);
    ASSERT_EQ(waitpid(*pid, &st, WNOHANG), 0) << "posd exited: " << std::string(std::istreambuf_iterator<char>(f), {});
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "posd did not come up";
    std::this_thread::yield();
  }
}

// A whole file as text (empty if it cannot be read).
std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The unsigned number after "key": in a one-line JSON report, or -1.
long long json_number(const std::string& report, const std::string& key) {
  const size_t at = report.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::atoll(report.c_str() + at + key.size() + 3);
}

// A report's seconds (a JSON number with a fraction); -1 if the key is absent.
double json_seconds(const std::string& report, const std::string& key) {
  const size_t at = report.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::strtod(report.c_str() + at + key.size() + 3, nullptr);
}

// How many times `what` occurs in `text` (log lines counted).
size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A posd of a test's own, beside the fixture's (`posd_extra`: more `posd:` YAML), stopped with it.
struct OwnPosd {
  std::string socket, log;
  pid_t pid = -1;
  OwnPosd(const std::string& base, const std::string& posd_extra = "", const std::vector<std::string>& prefix = {})
      : socket(base + "/posd.sock"), log(base + ".log") {
    start_posd(socket, log, &pid, posd_extra, prefix);
  }
  ~OwnPosd() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int s = 0;
    waitpid(pid, &s, 0);
  }
  std::string ps() const {
    auto j = pos::posd_control(socket, "ps");
    return j.ok() ? *j : std::string();
  }
  std::string log_text() const { return read_file(log); }
};

class PosdProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = ::testing::TempDir() + "posd-e2e-" + std::to_string(::getpid()) + "/posd.sock";  // posd makes the directory
    log_ = ::testing::TempDir() + "posd-e2e-" + std::to_string(::getpid()) + ".log";
    start_posd(socket_, log_, &pid_);
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  std::string log_text() const { return read_file(log_); }
  // stand_ins: the job finds POS's stand-ins for the toolkit's libraries first (remoting/client/cuda_libs).
  std::string preload_env(bool stand_ins = false) const {
    return "POS_SOCKET=" + socket_ + " LD_LIBRARY_PATH=" + (stand_ins ? env_or_fail("POS_CUDA_STAND_INS") + ":" : "") +
           env_or_fail("POS_CUDA_LIB_DIR") + " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
  }
  std::string train_cmd(const std::string& args) const { return env_or_fail("POS_MLP_NATIVE") + " " + args; }
  // What the job must print: the direct CPU computation on the host backend, the job run natively
  // (without POS) on a GPU.
  std::string expected(const std::vector<std::string>& args) const {
    if (on_gpu()) {
      std::string a;
      for (const auto& s : args) a += s + " ";
      int code = -1;
      std::string err;
      std::string out = shell("LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") + " " + train_cmd(a), &code, &err);
      EXPECT_EQ(code, 0) << err;
      return out;
    }
    const std::string out = mlp_reference_output(args);
    EXPECT_FALSE(out.empty()) << "the reference refused its arguments";
    return out;
  }
  // `pos-cli dump --leave-running --json` of a running job into dir (plus `extra` options): its report.
  std::string dump_leaving_it_running(pid_t child, const std::string& dir, const std::string& extra = "") const {
    int code = -1;
    std::string err;
    const std::string report = shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir +
                                         " --leave-running" + extra + " --json --socket " + socket_,
                                     &code, &err);
    EXPECT_EQ(code, 0) << err << log_text();
    return report;
  }
  // The job exits 0, and its output is an uninterrupted run's.
  void expect_finishes_as_if_untouched(pid_t child, const std::string& out_file, const std::vector<std::string>& args) const {
    int st = 0;
    ASSERT_EQ(waitpid(child, &st, 0), child);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    EXPECT_EQ(read_file(out_file), expected(args));
  }
  std::string sessions_json() const {
    auto j = pos::posd_control(socket_, "ps");
    return j.ok() ? *j : "";
  }

  std::string socket_, log_;
  pid_t pid_ = -1;
};

TEST_F(PosdProcess, TheUnmodifiedTrainingBinaryUnderPosdPrintsWhatItPrintsWithoutPos) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, std::vector<std::string>{"--input", "96", "--hidden", "160", "--layers", "3",
                                                             "--output", "24", "--batch", "48", "--steps", "12",
                                                             "--seed", "7"}}) {
    std::string a;
    for (const auto& s : args) a += s + " ";
    int code = -1;
    std::string err;
    const std::string out = shell(preload_env() + train_cmd(a), &code, &err);
    ASSERT_EQ(code, 0) << err << log_text();
    EXPECT_EQ(out, expected(args));
    EXPECT_NE(out.find("checksum "), std::string::npos);
  }
}

TEST_F(PosdProcess, SeveralClientsAtOnceEachGetTheirOwnCorrectRun) {
  const std::vector<std::string> seeds{"1", "2", "3"};
  std::vector<std::string> outs(seeds.size()), errs(seeds.size());
  std::vector<int> codes(seeds.size(), -1);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < seeds.size(); ++i)
    ts.emplace_back([&, i] { outs[i] = shell(preload_env() + train_cmd("--seed " + seeds[i]), &codes[i], &errs[i]); });
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < seeds.size(); ++i) {
    ASSERT_EQ(codes[i], 0) << errs[i];
    EXPECT_EQ(outs[i], expected({"--seed", seeds[i]})) << "client " << i;
  }
  EXPECT_NE(outs[0], outs[1]);  // really three different jobs
}

TEST_F(PosdProcess, AClientKilledMidRunIsReclaimedAndPosdServesTheNextOne) {
  // A long run in the background, killed once posd shows its session holding device memory.
  const std::string cmd = preload_env() + "POS_JOB_NAME=victim exec " + train_cmd("--steps 100000000") + " >/dev/null 2>&1";
  pid_t child = -1;
  std::vector<char*> argv{const_cast<char*>("/bin/sh"), const_cast<char*>("-c"), const_cast<char*>(cmd.c_str()), nullptr};
  ASSERT_EQ(posix_spawn(&child, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string ps;
  while ((ps = sessions_json()).find("\"job\":\"victim\"") == std::string::npos ||
         ps.find("\"memory_bytes\":0,") != std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << ps << log_text();
    std::this_thread::yield();
  }
  kill(child, SIGKILL);
  int st = 0;
  waitpid(child, &st, 0);
  while ((ps = sessions_json()).find("\"job\":\"victim\"") != std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "session not reclaimed: " << ps;
    std::this_thread::yield();
  }
  EXPECT_NE(log_text().find("'victim') ended: client disconnected"), std::string::npos) << log_text();
  int code = -1;
  std::string err;
  const std::string out = shell(preload_env() + train_cmd("--steps 5"), &code, &err);
  ASSERT_EQ(code, 0) << err;
  EXPECT_EQ(out, expected({"--steps", "5"}));
}

// The pids whose parent is `parent` (from /proc/PID/stat: the field after the command's ')').
std::set<pid_t> children_of(pid_t parent) {
  std::set<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) out.insert(std::stoi(name));
  }
  return out;
}

// Starts the training binary under posd in the background (stdout to `out_file`), and waits until
// posd shows its session holding device memory. Returns its pid (the shell execs it).
pid_t start_job(const std::string& preload, const std::string& train, const std::string& job, const std::string& out_file,
                const std::function<std::string()>& ps, const std::function<std::string()>& log, bool append = false,
                const std::string& err_file = "/dev/null") {
  const std::string cmd = preload + "POS_JOB_NAME=" + job + " exec " + train + " </dev/null " + (append ? ">>" : ">") +
                          out_file + " 2>>" + err_file;
  pid_t child = -1;
  std::vector<char*> argv{const_cast<char*>("/bin/sh"), const_cast<char*>("-c"), const_cast<char*>(cmd.c_str()), nullptr};
  EXPECT_EQ(posix_spawn(&child, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string text;
  while ((text = ps()).find("\"job\":\"" + job + "\"") == std::string::npos ||
         text.find("\"memory_bytes\":0,") != std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << text << log();
      break;
    }
    std::this_thread::yield();
  }
  return child;
}

// `pos-cli dump --leave-running` on the unmodified binary mid-run: its calls wait while its GPU
// state (posd) and its process tree (CRIU) are saved at one cut, then it runs on and prints exactly
// what an uninterrupted run prints; the image passes `pos-cli inspect`.
TEST_F(PosdProcess, PosCliDumpLeaveRunningSavesGpuAndCpuStateAndTheJobFinishesAsIfUntouched) {
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string out_file = ::testing::TempDir() + "posd-e2e-dump-out-" + std::to_string(::getpid());
  const std::string dir = ::testing::TempDir() + "posd-e2e-dump-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1]), "dumped", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  const std::string report = dump_leaving_it_running(child, dir, " --mode async");
  EXPECT_NE(report.find("\"gpu_image\":\"" + dir + "/gpu\""), std::string::npos) << report;
  EXPECT_EQ(report.find("\"gpu_bytes\":0,"), std::string::npos) << report;
  EXPECT_NE(report.find("\"pause_s\":"), std::string::npos) << report;
  expect_finishes_as_if_untouched(child, out_file, args);
  int code = -1;
  std::string err;
  // The whole image: GPU part, CRIU's images of the process, the manifest, the caller's token.
  EXPECT_TRUE(std::filesystem::exists(dir + "/criu/core-" + std::to_string(child) + ".img"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/manifest"));
  EXPECT_EQ(std::filesystem::status(dir + "/token").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  {  // the permit: outside the image, used by the job to come back, and removed by it
    std::ifstream mf(dir + "/manifest");
    const std::string m((std::istreambuf_iterator<char>(mf)), {});
    const size_t at = m.find("\"permit\":\"");
    ASSERT_NE(at, std::string::npos) << m;
    const std::string permit = m.substr(at + 10, m.find('"', at + 10) - at - 10);
    EXPECT_EQ(permit.rfind(dir, 0), std::string::npos) << permit;
    EXPECT_FALSE(std::filesystem::exists(permit)) << permit;
  }
  const std::string inspected = shell(env_or_fail("POS_CLI") + " inspect " + dir + "/gpu", &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(inspected.find("every checksum right"), std::string::npos) << inspected;
  EXPECT_NE(inspected.find("(dumped)"), std::string::npos) << inspected;
  const std::string whole = shell(env_or_fail("POS_CLI") + " inspect " + dir, &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(whole.find("GPU part (gpu)"), std::string::npos) << whole;
  EXPECT_NE(whole.find("process tree:\n    " + std::to_string(child) + " '"), std::string::npos) << whole;
  // CRIU's pages truncated: inspect names the file, exit 1.
  std::string pages;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/criu"))
    if (e.path().filename().string().rfind("pages-", 0) == 0 && e.file_size() > 0) pages = e.path().string();
  ASSERT_FALSE(pages.empty());
  std::filesystem::resize_file(pages, std::filesystem::file_size(pages) - 4096);
  (void)shell(env_or_fail("POS_CLI") + " inspect " + dir, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find(std::filesystem::path(pages).filename().string()), std::string::npos) << err;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out_file);
}

// The unmodified binary, linked against the toolkit's libcudart and libcublas, run on POS's stand-ins
// for them: it prints what it prints without POS, its process maps none of the toolkit's libraries,
// and CRIU's part of its dump is a few MB (libcublasLt alone fills ~90 MB of private pages at load).
TEST_F(PosdProcess, AJobOnTheStandInCudaLibrariesMapsNoneOfTheToolkitsAndItsDumpCarriesOnlyItsOwnPages) {
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string out_file = ::testing::TempDir() + "posd-e2e-stand-in-out-" + std::to_string(::getpid());
  const std::string dir = ::testing::TempDir() + "posd-e2e-stand-in-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const pid_t child = start_job(preload_env(true), train_cmd(args[0] + " " + args[1]), "stand-in", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  {
    const std::string maps = read_file("/proc/" + std::to_string(child) + "/maps");
    const std::string stand_ins = env_or_fail("POS_CUDA_STAND_INS");
    EXPECT_NE(maps.find(stand_ins + "/libcudart.so."), std::string::npos) << maps;
    EXPECT_NE(maps.find(stand_ins + "/libcublas.so."), std::string::npos) << maps;
    EXPECT_EQ(maps.find("libcublasLt"), std::string::npos) << maps;  // nothing asks for it any more
    const std::string toolkit = std::filesystem::canonical(env_or_fail("POS_CUDA_LIB_DIR")).string();
    EXPECT_EQ(maps.find(toolkit + "/libcu"), std::string::npos) << maps;
    EXPECT_EQ(maps.find(env_or_fail("POS_CUDA_LIB_DIR") + "/libcu"), std::string::npos) << maps;
  }
  const std::string report = dump_leaving_it_running(child, dir);
  const long long criu_bytes = json_number(report, "criu_bytes");
  EXPECT_GT(criu_bytes, 0) << report;
  EXPECT_LT(criu_bytes, 32ll << 20) << report;
  expect_finishes_as_if_untouched(child, out_file, args);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out_file);
}

// Without --leave-running the job ends after the dump, as with `criu dump`, and posd frees its session.
TEST_F(PosdProcess, PosCliDumpEndsTheJobAndPosdFreesItsSession) {
  const std::string out_file = ::testing::TempDir() + "posd-e2e-dump-end-" + std::to_string(::getpid());
  const std::string dir = ::testing::TempDir() + "posd-e2e-dump-end-" + std::to_string(::getpid()) + ".img";
  std::filesystem::remove_all(dir);
  const pid_t child = start_job(preload_env(), train_cmd("--steps 100000000"), "ended", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  int code = -1;
  std::string err;
  (void)shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir + " --socket " + socket_,
              &code, &err);
  EXPECT_EQ(code, 0) << err << log_text();
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFSIGNALED(st)) << st;  // CRIU ended it
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sessions_json().find("\"job\":\"ended\"") != std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "session not freed: " << sessions_json();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(log_text().find("the job ended while detached"), std::string::npos) << log_text();
  EXPECT_TRUE(std::filesystem::exists(dir + "/gpu/client.pb"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/criu/core-" + std::to_string(child) + ".img"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out_file);
}

// CRIU saves what is resident of the job's memory, its session arena included. posd must not make
// the arena resident by page-locking all of it at once: a job that asks for a 512 MiB arena and
// uses a few MiB of it (staging of small copies) leaves CRIU far less than the arena to save, and
// still finishes exactly as it would have.
TEST_F(PosdProcess, ADumpSavesOnlyThePartOfTheSessionArenaTheJobUsed) {
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string out_file = ::testing::TempDir() + "posd-e2e-arena-out-" + std::to_string(::getpid());
  const std::string dir = ::testing::TempDir() + "posd-e2e-arena-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  constexpr uint64_t kArena = 512ull << 20;
  const pid_t child = start_job(preload_env() + "POS_ARENA_SIZE=512MiB ", train_cmd(args[0] + " " + args[1]), "arena",
                                out_file, [&] { return sessions_json(); }, [&] { return log_text(); });
  int code = -1;
  std::string err;
  (void)shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir +
                  " --leave-running --socket " + socket_,
              &code, &err);
  EXPECT_EQ(code, 0) << err << log_text();
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), expected(args));
  uint64_t pages = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/criu"))
    if (e.path().filename().string().rfind("pages-", 0) == 0) pages += e.file_size();
  EXPECT_GT(pages, 0u);
  // The job's own memory plus the part of the arena it used: on the GPU 137 MB (measured, H200),
  // where an arena page-locked whole would make it more than the arena alone.
  EXPECT_LT(pages, kArena / 2) << "CRIU saved " << pages << " bytes of a job that uses little of its " << kArena
                               << "-byte arena";
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out_file);
}

// The restored tree's root is reparented to this process (CRIU restores it detached), which must
// then reap it: a child subreaper, for the tests of pos-cli restore.
void become_subreaper() { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

// Waits up to `timeout` for `pid` (this process's child, or reparented to it) to end; its status.
int wait_for_exit(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      ADD_FAILURE() << "pid " << pid << " did not end within " << timeout.count() << " s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return st;
}

// ZDTM shape: the unmodified training binary runs under posd; `pos-cli dump` saves it mid-run and
// ends it; `pos-cli restore` brings it back (GPU state at the same addresses, the process by CRIU,
// re-attached to a new session), and it runs on to exactly the output of an uninterrupted run.
// Then the same image, moved to another directory, restored into a second posd, after the first run's end.
TEST_F(PosdProcess, PosCliRestoreBringsBackADumpedJobThatFinishesAsIfNeverStopped) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "3000"};
  const std::string base = ::testing::TempDir() + "posd-e2e-restore-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", dir = base + ".img";
  std::filesystem::remove_all(dir);
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1]), "restored", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  int code = -1;
  std::string err;
  (void)shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir + " --socket " + socket_, &code,
              &err);
  ASSERT_EQ(code, 0) << err << log_text();
  int st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;  // CRIU ended it
  std::string partial;
  {
    std::ifstream f(out_file);
    partial.assign(std::istreambuf_iterator<char>(f), {});
  }
  const std::string want = expected(args);
  ASSERT_LT(partial.size(), want.size()) << "the job had finished before the dump: make it longer";
  // The output so far is kept, to restore the image a second time from the same file state.
  const std::string saved = base + ".out.at-dump";
  std::filesystem::copy_file(out_file, saved, std::filesystem::copy_options::overwrite_existing);

  const std::string report = shell(env_or_fail("POS_CLI") + " restore -D " + dir + " --json --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  EXPECT_NE(report.find("\"pid\":" + std::to_string(child) + ","), std::string::npos) << report;
  EXPECT_EQ(report.find("\"gpu_bytes\":0,"), std::string::npos) << report;
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  EXPECT_EQ(read_file(out_file), want);
  EXPECT_NE(log_text().find("re-attached"), std::string::npos) << log_text();

  // Into another posd: the files as they were at the dump (CRIU restores open files at their size
  // then), the same image, a posd that never saw the job.
  const OwnPosd second(::testing::TempDir() + "posd-e2e-second-" + std::to_string(::getpid()));
  std::filesystem::copy_file(saved, out_file, std::filesystem::copy_options::overwrite_existing);
  // The image moved elsewhere first: nothing in it depends on where it was dumped.
  const std::string moved = base + ".moved";
  std::filesystem::remove_all(moved);
  std::filesystem::rename(dir, moved);
  (void)shell(env_or_fail("POS_CLI") + " restore -D " + moved + " --socket " + second.socket, &code, &err);
  ASSERT_EQ(code, 0) << err;
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), want);
  EXPECT_NE(second.log_text().find("re-attached"), std::string::npos) << second.log_text();
  std::filesystem::remove_all(moved);
  std::filesystem::remove(out_file);
  std::filesystem::remove(saved);
}

// ZDTM shape, lazy: a job restored with --lazy whose background loaders are held (fault point
// lazy-loaders-held: they load nothing) still has a buffer it has not named since, the workload's
// --reserve-mib buffer. `dump --lazy-ok` takes it at once, that buffer's bytes copied from the image
// being restored; the new image alone (restored into a posd without the hold) finishes the job
// exactly, the reserve's checksum included.
TEST_F(PosdProcess, ADumpWithLazyOkOfAJobStillLoadingItsRestoreTakesWhatItHasNotLoadedFromTheImage) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "3000", "--reserve-mib", "8"};
  const std::string base = ::testing::TempDir() + "posd-e2e-lazyok-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", first = base + ".first", second = base + ".second";
  const std::string cli = env_or_fail("POS_CLI");
  for (const std::string& d : {first, second}) std::filesystem::remove_all(d);
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1] + " " + args[2] + " " + args[3]),
                                "lazyok", out_file, [&] { return sessions_json(); }, [&] { return log_text(); });
  // The reserve is made and written before step 0: the first image must hold it, or the restored
  // job would write it again (and load it) instead of leaving it to the lazy loaders.
  const auto stepped_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(out_file).find("step 0 ") == std::string::npos && std::chrono::steady_clock::now() < stepped_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  int code = -1;
  std::string err;
  (void)shell(cli + " dump -t " + std::to_string(child) + " -D " + first + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  int st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;

  ::setenv("POS_FAULT_POINT", "lazy-loaders-held", 1);
  const OwnPosd held(base + "-held");
  ::unsetenv("POS_FAULT_POINT");
  (void)shell(cli + " restore -D " + first + " --lazy --socket " + held.socket, &code, &err);
  ASSERT_EQ(code, 0) << err << held.log_text();
  const std::string report =
      shell(cli + " dump -t " + std::to_string(child) + " -D " + second + " --lazy-ok --json --socket " + held.socket, &code, &err);
  ASSERT_EQ(code, 0) << err << held.log_text();
  EXPECT_GE(json_number(report, "gpu_bytes_from_image"), 8ll << 20) << report;
  EXPECT_GT(json_number(report, "gpu_bytes"), json_number(report, "gpu_bytes_from_image")) << report;
  st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;

  std::filesystem::remove_all(first);  // the new image needs nothing of the one it was loading from
  (void)shell(cli + " restore -D " + second + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  const std::string out = read_file(out_file);
  EXPECT_EQ(out, expected(args));
  EXPECT_NE(out.find("reserve checksum"), std::string::npos);
  for (const std::string& p : {first, second, out_file}) std::filesystem::remove_all(p);
}

// ZDTM shape, incremental: a job whose first layers are frozen is pre-dumped while it runs, then
// dumped with --prev (it ends), and restored from the chain; it finishes as if never stopped. The
// dump stores only the tensors written since the pre-dump (the frozen ones are left in it), and CRIU
// only the pages changed since its pre-dump where this kernel tracks dirty memory (else the report
// says why not). A pre-dump is refused as a restore point, and --prev of another job is refused.
TEST_F(PosdProcess, APreDumpAndADumpWithPrevSaveOnlyWhatChangedAndTheChainRestores) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "3000", "--frozen", "2"};
  const std::string base = ::testing::TempDir() + "posd-e2e-chain-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", pre = base + ".pre", dir = base + ".img";
  for (const std::string& d : {pre, dir}) std::filesystem::remove_all(d);
  std::string a;
  for (const auto& x : args) a += x + " ";
  const pid_t child = start_job(preload_env(), train_cmd(a), "chained", out_file, [&] { return sessions_json(); },
                                [&] { return log_text(); });
  const std::string cli = env_or_fail("POS_CLI");
  int code = -1;
  std::string err;
  const std::string pre_report =
      shell(cli + " pre-dump -t " + std::to_string(child) + " -D " + pre + " --json --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  EXPECT_NE(pre_report.find("\"command\":\"pre-dump\""), std::string::npos) << pre_report;
  EXPECT_GT(json_number(pre_report, "gpu_bytes"), 0) << pre_report;
  ASSERT_EQ(kill(child, 0), 0) << "a pre-dump must leave the job running";
  // The CPU part: CRIU's pre-dump where the kernel tracks dirty memory, else the job's pages as
  // read while it ran.
  const bool tracked = pre_report.find("\"criu_track_mem\":true") != std::string::npos;
  EXPECT_TRUE(std::filesystem::exists(pre + "/criu")) << pre_report;
  if (!tracked) {
    EXPECT_NE(pre_report.find("tracks no dirty memory"), std::string::npos) << pre_report;
    EXPECT_NE(pre_report.find("read while it runs"), std::string::npos) << pre_report;
    EXPECT_TRUE(std::filesystem::exists(pre + "/criu/pagemap-" + std::to_string(child) + ".img")) << pre_report;
  }

  // A pre-dump is no restore point (and its job runs anyway).
  (void)shell(cli + " restore -D " + pre + " --socket " + socket_, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("is a pre-dump"), std::string::npos) << err;

  const std::string report = shell(cli + " dump -t " + std::to_string(child) + " -D " + dir + " --prev " + pre +
                                        " --json --socket " + socket_,
                                    &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  // The frozen layers' tensors are in the pre-dump, unchanged; the rest is stored again.
  EXPECT_GT(json_number(report, "gpu_bytes_referenced"), 0) << report;
  EXPECT_GT(json_number(report, "gpu_bytes"), 0) << report;
  // Either way the dump's CPU part holds only the pages that changed: CRIU's tracking found them,
  // or comparing CRIU's whole dump with the pre-dump's pages did (the rest left to it, through
  // criu/parent, which CRIU's restore below reads).
  EXPECT_NE(report.find("\"criu_incremental\":true"), std::string::npos) << report;
  EXPECT_TRUE(std::filesystem::exists(dir + "/criu/parent")) << report;
  if (!tracked) {
    EXPECT_NE(report.find("tracks no dirty memory"), std::string::npos) << report;
    EXPECT_GT(json_number(report, "criu_pages_to_parent"), 0) << report;
    EXPECT_NE(report.find("equal the previous image's and were left to it"), std::string::npos) << report;
  }
  int st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;  // CRIU ended it
  // inspect shows both parts of the chain's last image: the GPU part verified with its parent, the
  // process tree CRIU saved, rooted at the job.
  const std::string inspected = shell(cli + " inspect " + dir, &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(inspected.find("every checksum right"), std::string::npos) << inspected;
  EXPECT_NE(inspected.find("2 image(s)"), std::string::npos) << inspected;  // this one and the pre-dump
  EXPECT_NE(inspected.find("process tree:\n    " + std::to_string(child) + " '"), std::string::npos) << inspected;
  EXPECT_NE(inspected.find("previous image: "), std::string::npos) << inspected;
  const std::string inspected_json = shell(cli + " inspect --json " + dir, &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(inspected_json.find("\"processes\":[{\"pid\":" + std::to_string(child) + ","), std::string::npos)
      << inspected_json;
  EXPECT_GT(json_number(inspected_json, "pages_stored"), 0) << inspected_json;
  const std::string pre_inspected = shell(cli + " inspect " + pre, &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(pre_inspected.find("a pre-dump"), std::string::npos) << pre_inspected;

  (void)shell(cli + " restore -D " + dir + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  EXPECT_EQ(read_file(out_file), expected(args));

  // --prev must be this job's: another job's image is refused before anything happens to the job.
  const pid_t other = start_job(preload_env(), train_cmd(a), "other", out_file, [&] { return sessions_json(); },
                                [&] { return log_text(); });
  std::filesystem::remove_all(base + ".other");
  (void)shell(cli + " dump -t " + std::to_string(other) + " -D " + base + ".other --prev " + dir + " --socket " + socket_,
              &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("not of this job"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(base + ".other/gpu"));
  st = wait_for_exit(other, std::chrono::seconds(300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  for (const std::string& d : {pre, dir, base + ".other"}) std::filesystem::remove_all(d);
  std::filesystem::remove(out_file);
}

// A restore checks the image before it changes anything: with the dumped job still running (its
// pid taken), with a manifest that is not one, with a GPU part that is not the manifest's. Each is
// refused with the reason; the job runs on untouched and no session is left behind.
TEST_F(PosdProcess, PosCliRestoreRefusesATakenPidAndABadImageAndChangesNothing) {
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string base = ::testing::TempDir() + "posd-e2e-refuse-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", dir = base + ".img";
  std::filesystem::remove_all(dir);
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1]), "kept", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  int code = -1;
  std::string err;
  (void)shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir + " --leave-running --socket " +
                  socket_,
              &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  (void)shell(env_or_fail("POS_CLI") + " restore -D " + dir + " --socket " + socket_, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("pid " + std::to_string(child) + " is in use"), std::string::npos) << err;
  // A manifest that names another GPU part (a cut it does not have).
  std::string manifest;
  {
    std::ifstream f(dir + "/manifest");
    manifest.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t cut = manifest.find("\"cut\":");
  ASSERT_NE(cut, std::string::npos) << manifest;
  manifest.insert(cut + 6, "9");
  {
    std::ofstream f(dir + "/manifest", std::ios::trunc);
    f << manifest;
  }
  (void)shell(env_or_fail("POS_CLI") + " restore -D " + dir + " --socket " + socket_, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("is not the one the manifest names"), std::string::npos) << err;
  {
    std::ofstream f(dir + "/manifest", std::ios::trunc);
    f << "{\"format\":3,\"pid\":\"x\"}";
  }
  (void)shell(env_or_fail("POS_CLI") + " restore -D " + dir + " --socket " + socket_, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("manifest is not valid"), std::string::npos) << err;
  int st = wait_for_exit(child, std::chrono::seconds(300));
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), expected(args));
  // No restore left a session behind; the job's own ends with it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string ps;
  while ((ps = sessions_json()).find("\"sessions\":[]") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << ps;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out_file);
}

// A dump that posd answers "busy" (the previous, killed one's GPU drain still runs in the session):
// tried again, as a user would.
std::string dump_when_free(const std::string& cmd, int* code, std::string* err) {
  std::string out;
  for (int i = 0; i < 100; ++i) {
    out = shell(cmd, code, err);
    if (err->find("already running") == std::string::npos && err->find("detached already") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return out;
}

// kill -9 of pos-cli at each phase of a dump, and of CRIU under it: the job is let run on at once
// (pos-cli's guardian writes its permit; CRIU dies with pos-cli), no manifest is left (no image
// that looks whole), and after all of it a dump works and the job finishes as if never touched.
// Dumps that would end the job, at every phase: CRIU leaves it stopped and it is ended only once
// the manifest is written, so pos-cli killed after CRIU leaves it running too (the guardian's
// SIGCONT); and dumps that leave it running, after CRIU.
TEST_F(PosdProcess, PosCliOrCriuKilledAtAnyPhaseOfADumpLeavesTheJobRunningAndNoImage) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "60000" : "8000"};
  const std::string base = ::testing::TempDir() + "posd-e2e-fault-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", cli = env_or_fail("POS_CLI");
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1]), "faulted", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  struct Point {
    const char* name;
    bool leave_running;
  };
  for (const Point& p : {Point{"job-dump-detached", false}, Point{"job-dump-cut", false},
                         Point{"criu-dump-running", false}, Point{"job-dump-criu-done", false},
                         Point{"job-dump-before-manifest", false}, Point{"job-dump-criu-done", true},
                         Point{"job-dump-before-manifest", true}}) {
    SCOPED_TRACE(p.name);
    ASSERT_EQ(kill(child, 0), 0) << "the job ended: make it longer";
    const std::string dir = base + "." + p.name;
    std::filesystem::remove_all(dir);
    int code = -1;
    std::string err;
    (void)dump_when_free(std::string("POS_FAULT_POINT=") + p.name + " " + cli + " dump -t " + std::to_string(child) +
                             " -D " + dir + (p.leave_running ? " --leave-running" : "") + " --socket " + socket_,
                         &code, &err);
    EXPECT_NE(code, 0);
    EXPECT_NE(err.find(std::string("fault point ") + p.name), std::string::npos) << err << log_text();
    EXPECT_FALSE(std::filesystem::exists(dir + "/manifest"));
    // Running, not stopped (a dump that would have ended it left it stopped until the manifest).
    std::string state;
    for (int i = 0; i < 200; ++i) {
      state = read_file("/proc/" + std::to_string(child) + "/stat");
      const size_t at = state.rfind(')');
      if (at != std::string::npos && at + 2 < state.size() && state[at + 2] != 'T') break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const size_t at = state.rfind(')');
    ASSERT_TRUE(at != std::string::npos && at + 2 < state.size()) << "the job is gone: " << state;
    EXPECT_NE(state[at + 2], 'T') << "the job was left stopped: " << state;
    std::filesystem::remove_all(dir);
  }
  int code = -1;
  std::string err;
  (void)dump_when_free(cli + " dump -t " + std::to_string(child) + " -D " + base + ".whole --leave-running --socket " +
                           socket_,
                       &code, &err);
  EXPECT_EQ(code, 0) << err << log_text();
  EXPECT_TRUE(std::filesystem::exists(base + ".whole/manifest"));
  const int st = wait_for_exit(child, std::chrono::seconds(300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  EXPECT_EQ(read_file(out_file), expected(args));
  for (const char* p : {"job-dump-detached", "job-dump-cut", "criu-dump-running", "job-dump-criu-done",
                        "job-dump-before-manifest", "whole"})
    std::filesystem::remove_all(base + "." + p);
  std::filesystem::remove(out_file);
}

// kill -9 of pos-cli mid-restore: once posd rebuilt the GPU state (posd abandons it), and once CRIU
// brought the process back but before it re-attached (posd abandons the session; the process, refused,
// ends). No session is left behind, and the image, unchanged, restores to a job that finishes right.
TEST_F(PosdProcess, PosCliKilledMidRestoreLeavesNoSessionAndTheImageStillRestores) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "1500"};
  const std::string base = ::testing::TempDir() + "posd-e2e-rfault-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", dir = base + ".img", saved = base + ".saved", cli = env_or_fail("POS_CLI");
  std::filesystem::remove_all(dir);
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1]), "rfaulted", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  int code = -1;
  std::string err;
  (void)shell(cli + " dump -t " + std::to_string(child) + " -D " + dir + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  int st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  std::filesystem::copy_file(out_file, saved, std::filesystem::copy_options::overwrite_existing);
  auto no_sessions = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    std::string ps;
    while ((ps = sessions_json()).find("\"sessions\":[]") == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return ps;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::string();
  };
  for (const char* point : {"job-restore-gpu", "job-restore-criu-done"}) {
    SCOPED_TRACE(point);
    std::filesystem::copy_file(saved, out_file, std::filesystem::copy_options::overwrite_existing);
    (void)shell(std::string("POS_FAULT_POINT=") + point + " " + cli + " restore -D " + dir + " --socket " + socket_,
                &code, &err);
    EXPECT_NE(code, 0);
    EXPECT_NE(err.find(std::string("fault point ") + point), std::string::npos) << err;
    if (std::string(point) == "job-restore-criu-done") {
      // The process CRIU brought back either re-attached before posd saw pos-cli go (then it runs
      // to the right end), or finds its session abandoned and ends: it never hangs.
      st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        EXPECT_EQ(read_file(out_file), expected(args));
      }
    }
    EXPECT_EQ(no_sessions(), "") << log_text();
  }
  std::filesystem::copy_file(saved, out_file, std::filesystem::copy_options::overwrite_existing);
  (void)shell(cli + " restore -D " + dir + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  EXPECT_EQ(read_file(out_file), expected(args));
  for (const std::string& p : {dir, saved, out_file}) std::filesystem::remove_all(p);
}

// kill -9 of posd itself in the middle of a dump (pos-cli stopped once the job is detached, posd
// killed, pos-cli let go on): the dump fails with a message and leaves no image; the job, which can
// no longer re-attach through posd, ends rather than hangs; the last good image restores into a new
// posd and finishes as if never stopped.
TEST_F(PosdProcess, PosdKilledMidDumpFailsTheDumpAndTheLastGoodImageStillRestores) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "3000"};
  const std::string base = ::testing::TempDir() + "posd-e2e-pkill-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", good = base + ".good", bad = base + ".bad", saved = base + ".saved";
  const std::string cli = env_or_fail("POS_CLI");
  for (const std::string& d : {good, bad}) std::filesystem::remove_all(d);
  const pid_t child = start_job(preload_env(), train_cmd(args[0] + " " + args[1]), "pkilled", out_file,
                                [&] { return sessions_json(); }, [&] { return log_text(); });
  int code = -1;
  std::string err;
  (void)shell(cli + " dump -t " + std::to_string(child) + " -D " + good + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  int st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  std::filesystem::copy_file(out_file, saved, std::filesystem::copy_options::overwrite_existing);
  (void)shell(cli + " restore -D " + good + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();

  const std::string err_file = base + ".dump-err";
  const std::string cmd = "POS_FAULT_POINT=job-dump-detached:stop exec " + cli + " dump -t " + std::to_string(child) + " -D " +
                          bad + " --leave-running --socket " + socket_ + " 2>" + err_file;
  pid_t dumper = -1;
  std::vector<char*> argv{const_cast<char*>("/bin/sh"), const_cast<char*>("-c"), const_cast<char*>(cmd.c_str()), nullptr};
  ASSERT_EQ(posix_spawn(&dumper, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  ASSERT_EQ(waitpid(dumper, &st, WUNTRACED), dumper);
  ASSERT_TRUE(WIFSTOPPED(st)) << st;  // the job detached
  ASSERT_EQ(kill(pid_, SIGKILL), 0);
  waitpid(pid_, &st, 0);
  pid_ = -1;
  ASSERT_EQ(kill(dumper, SIGCONT), 0);
  ASSERT_EQ(waitpid(dumper, &st, 0), dumper);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  {
    std::ifstream f(err_file);
    const std::string e((std::istreambuf_iterator<char>(f)), {});
    EXPECT_NE(e.find("pos-cli dump: "), std::string::npos) << e;
  }
  EXPECT_FALSE(std::filesystem::exists(bad + "/manifest"));
  st = wait_for_exit(child, std::chrono::seconds(120));
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;

  start_posd(socket_, log_, &pid_);
  std::filesystem::copy_file(saved, out_file, std::filesystem::copy_options::overwrite_existing);
  (void)shell(cli + " restore -D " + good + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  EXPECT_EQ(read_file(out_file), expected(args));
  for (const std::string& p : {good, bad, saved, out_file, err_file}) std::filesystem::remove_all(p);
}

// Only root and the job's own user may dump or restore it: a user posd admits (its group) who asks to
// detach, checkpoint, restore or hand out the memory of root's job is refused with the reason, and
// the job runs on untouched; root without the detach's token gets no memory either.
TEST_F(PosdProcess, AnotherUsersDumpOrRestoreOfAJobIsRefusedAndTheJobRunsOn) {
  const uint32_t kUid = 65534, kGid = 65533;
  const std::string base = ::testing::TempDir() + "posd-e2e-uid-" + std::to_string(::getpid());
  const std::string out_file = base + ".out";
  const OwnPosd posd(base, "  group: " + std::to_string(kGid) + "\n");  // admits kGid's members too
  const std::string& socket = posd.socket;
  auto ps = [&] { return posd.ps(); };
  auto logtext = [&] { return posd.log_text(); };
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string env = "POS_SOCKET=" + socket + " LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") +
                          " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
  const pid_t job = start_job(env, env_or_fail("POS_MLP_NATIVE") + " " + args[0] + " " + args[1], "roots", out_file, ps,
                              logtext);
  const std::string img = base + ".img";
  std::filesystem::create_directories(img);
  ASSERT_EQ(chown(img.c_str(), kUid, kGid), 0);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t other = fork();
  if (other == 0) {  // the other user: each refusal's message, one per line
    close(p[0]);
    if (setgroups(0, nullptr) != 0 || setresgid(kGid, kGid, kGid) != 0 || setresuid(kUid, kUid, kUid) != 0) _exit(3);
    std::string out;
    out += pos::posd_detach(socket, static_cast<uint32_t>(job), img + "/.reattach", 1000).status().message() + "\n";
    out += pos::posd_checkpoint(socket, static_cast<uint32_t>(job), img, false).status().message() + "\n";
    pos::RestoreRequest r;
    r.pid = 4000000, r.uid = 0, r.arena_bytes = 32u << 20, r.token = std::string(32, 'a'), r.job = "roots";
    out += pos::begin_restore(socket, img, r).status().message() + "\n";
    r.stage = true;  // a migration target's staging restore is a restore like any other
    out += pos::begin_restore(socket, img, r).status().message() + "\n";
    out += pos::posd_peer_export(socket, static_cast<uint32_t>(job), std::string(32, 'b')).status().message() + "\n";
    (void)!write(p[1], out.data(), out.size());
    _exit(0);
  }
  close(p[1]);
  std::string said;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof(buf))) > 0) said.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int st = 0;
  ASSERT_EQ(waitpid(other, &st, 0), other);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_NE(said.find("uid 65534 may not dump a job of uid 0"), std::string::npos) << said << logtext();
  EXPECT_NE(said.find("uid 65534 may not restore a job of uid 0"), std::string::npos) << said << logtext();
  size_t refusals = 0;
  for (size_t at = 0; (at = said.find("may not", at)) != std::string::npos; ++at) ++refusals;
  EXPECT_EQ(refusals, 5u) << said;
  EXPECT_FALSE(std::filesystem::exists(img + "/gpu"));
  // Root's staging restore of the running job's pid is no "busy": a staging session is no job's
  // (docs/migration.md, "Staged at the target"); it fails on the image (none here), and the job
  // still has its one session.
  {
    pos::RestoreRequest r;
    r.pid = static_cast<uint32_t>(job), r.uid = 0, r.arena_bytes = 1u << 20, r.token = std::string(32, 'c');
    r.job = "roots", r.stage = true;
    auto staged = pos::begin_restore(socket, img, r);
    EXPECT_FALSE(staged.ok());
    EXPECT_NE(staged.status().code(), pos::Code::kBusy) << staged.status().to_string();
    EXPECT_NE(staged.status().message().find("GPU part"), std::string::npos) << staged.status().to_string();
    r.lazy = true;  // a staging restore is eager and alone
    EXPECT_EQ(pos::begin_restore(socket, img, r).status().code(), pos::Code::kInvalidArgument);
    EXPECT_NE(ps().find("\"pid\":" + std::to_string(job) + ","), std::string::npos) << ps();
  }
  // The job's own user (root here) without the detach's token gets no memory either: the job is
  // not detached, and only its detacher knows the token.
  auto peer_ckpt = pos::posd_checkpoint(socket, static_cast<uint32_t>(job), img, false, {}, {}, {}, false, true);
  EXPECT_EQ(peer_ckpt.status().code(), pos::Code::kFailedPrecondition) << peer_ckpt.status().to_string();
  EXPECT_NE(peer_ckpt.status().message().find("for a detached job"), std::string::npos) << peer_ckpt.status().to_string();
  auto mem = pos::posd_peer_export(socket, static_cast<uint32_t>(job), std::string(32, 'b'));
  EXPECT_EQ(mem.status().code(), pos::Code::kFailedPrecondition) << mem.status().to_string();
  EXPECT_NE(mem.status().message().find("not detached with that token"), std::string::npos) << mem.status().to_string();
  st = 0;
  ASSERT_EQ(waitpid(job, &st, 0), job);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), expected(args));
  std::filesystem::remove_all(img);
  std::filesystem::remove(out_file);
}

}  // namespace
std::string scrape_metrics(const std::string& posd_log);
double metric(const std::string& text, const std::string& name, uint32_t pid);
namespace {

// posd.limits (#24, docs/limits.md): a job whose name matches a rule gets the rule's device-memory
// quota in place of client.memory_quota, and its first allocation past it fails as CUDA fails
// them, and the rule's SM limit; `pos-cli limit` shows and changes a running posd job's quota (the job's owner or root only,
// bad values refused with nothing changed), and the job finishes as it would have.
TEST_F(PosdProcess, PosdLimitsGiveJobsTheirQuotaByNameAndPosCliLimitChangesItForItsOwnerOnly) {
  const uint32_t kUid = 65534, kGid = 65533;
  const std::string base = ::testing::TempDir() + "posd-e2e-limits-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", cli = env_or_fail("POS_CLI");
  const OwnPosd posd(base, "  group: " + std::to_string(kGid) + "\n  metrics: 127.0.0.1:0" +
                               "\n  limits:\n    - jobs: [\"tiny*\"]\n      memory: 1MiB\n"
                               "    - jobs: [\"roomy\"]\n      memory: 0\n      sms: 16\n");
  const std::string env = "POS_SOCKET=" + posd.socket + " LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") +
                          " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
  // 4 MiB of weights in a 1 MiB quota: the job's cudaMalloc fails, and it says so.
  int code = -1;
  std::string err;
  pos::test::run_shell(env + "POS_JOB_NAME=tiny-one " + train_cmd("--hidden 1024 --steps 3"), &code, &err);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("error: cudaMalloc: cudaErrorMemoryAllocation"), std::string::npos) << err;
  // The same job under a name no rule matches: client.memory_quota (none here), and it runs.
  pos::test::run_shell(env + "POS_JOB_NAME=big-one " + train_cmd("--hidden 1024 --steps 3"), &code, &err);
  EXPECT_EQ(code, 0) << err;
  // A job the second rule names: no quota; pos-cli limit sets one, shows it, and takes it away.
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const pid_t job = start_job(env, train_cmd(args[0] + " " + args[1]), "roomy", out_file, [&] { return posd.ps(); },
                              [&] { return posd.log_text(); });
  const std::string t = cli + " limit -t " + std::to_string(job) + " --socket " + posd.socket + " --jobs-dir " + base + "-jobs";
  std::string out = pos::test::run_shell(t, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("(under posd): no device-memory quota; it holds "), std::string::npos) << out;
  out = pos::test::run_shell(t + " --memory 64MiB", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("device-memory quota 67108864 bytes; it holds "), std::string::npos) << out;
  EXPECT_NE(posd.ps().find("\"memory_quota\":67108864,"), std::string::npos) << posd.ps();
  // The rule's SM limit: the CUDA backend opens the session's client in a green context of 16 SMs;
  // the host backend has no SMs to confine (granted 0: all).
  EXPECT_NE(posd.ps().find(std::string("\"sms\":16,\"sms_granted\":") + (on_gpu() ? "16," : "0,")), std::string::npos)
      << posd.ps();
  EXPECT_NE(out.find(on_gpu() ? "; SM limit 16: its kernels run on 16 SMs" : "; SM limit 16 asked, not in force"),
            std::string::npos)
      << out;
  EXPECT_EQ(metric(scrape_metrics(posd.log), "pos_session_memory_quota_bytes", static_cast<uint32_t>(job)), 67108864.0);
  out = pos::test::run_shell(t + " --json", &code);
  EXPECT_NE(out.find("\"ok\":true,\"pid\":" + std::to_string(job) + ",\"job\":\"roomy\",\"memory_quota\":67108864,"),
            std::string::npos) << out;
  out = pos::test::run_shell(t + " --memory lots", &code);
  EXPECT_EQ(code, 2) << out;
  // A GPU-time share for the running job (its session process's slot in the usage region), shown
  // and taken away again; a bad one refused with nothing changed.
  out = pos::test::run_shell(t + " --gpu-share 30%", &code);
  EXPECT_EQ(code, 0) << out << posd.log_text();
  EXPECT_NE(out.find("; GPU-time share 30.0%"), std::string::npos) << out;
  out = pos::test::run_shell(t + " --json", &code);
  EXPECT_NE(out.find("\"gpu_share\":300}"), std::string::npos) << out;
  out = pos::test::run_shell(t + " --gpu-share 130%", &code);
  EXPECT_EQ(code, 2) << out;
  out = pos::test::run_shell(t + " --gpu-share 0", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("; no GPU-time share"), std::string::npos) << out;
  out = pos::test::run_shell(cli + " limit -t 4000000 --socket " + posd.socket + " --jobs-dir " + base + "-jobs", &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("has no session on this posd"), std::string::npos) << out;
  for (const std::string& bad : {std::string("limit x memory=1"), "limit " + std::to_string(job) + " cpu=1",
                                "limit " + std::to_string(job) + " memory=-1", "limit " + std::to_string(job) + " share=1001",
                                "limit " + std::to_string(job) + " share=1 share=2",
                                "limit " + std::to_string(job) + " memory=1 share=1 memory=2"}) {
    auto r = pos::posd_control(posd.socket, bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_NE(posd.ps().find("\"memory_quota\":67108864,"), std::string::npos) << posd.ps();  // unchanged
  // Another user may not change it.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t other = fork();
  if (other == 0) {
    close(p[0]);
    if (setgroups(0, nullptr) != 0 || setresgid(kGid, kGid, kGid) != 0 || setresuid(kUid, kUid, kUid) != 0) _exit(3);
    const std::string said = pos::posd_control(posd.socket, "limit " + std::to_string(job) + " memory=1").status().message();
    (void)!write(p[1], said.data(), said.size());
    _exit(0);
  }
  close(p[1]);
  std::string said;
  char buf[1024];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof(buf))) > 0) said.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int st = 0;
  ASSERT_EQ(waitpid(other, &st, 0), other);
  EXPECT_NE(said.find("uid 65534 may not change the limits of a job of uid 0"), std::string::npos) << said;
  out = pos::test::run_shell(t + " --memory 0", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(posd.ps().find("\"memory_quota\":0,"), std::string::npos) << posd.ps();
  st = 0;
  ASSERT_EQ(waitpid(job, &st, 0), job);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), expected(args));
  std::filesystem::remove(out_file);
}

// posd.limits' GPU-time shares (#24, docs/limits.md): two posd jobs that always want their device,
// with shares of 70 % and 30 %, execute calls in about that ratio (their session processes take
// turns through posd's user's usage region, which lists both with their shares).
TEST_F(PosdProcess, PosdJobsWithGpuSharesExecuteInTheRatioOfTheirShares) {
  const std::string base = ::testing::TempDir() + "posd-e2e-shares-" + std::to_string(::getpid());
  const std::string jobs_dir = base + "-jobs";
  std::filesystem::remove_all(jobs_dir);
  const OwnPosd posd(base, "  limits:\n    - jobs: [\"heavy\"]\n      gpu_share: 70%\n"
                           "    - jobs: [\"light\"]\n      gpu_share: 30%\n",
                     {"env", "POS_JOBS_DIR=" + jobs_dir});
  const std::string env = "POS_SOCKET=" + posd.socket + " LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") +
                          " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
  const std::string train = train_cmd("--steps 1000000");
  const pid_t heavy = start_job(env, train, "heavy", base + ".heavy", [&] { return posd.ps(); }, [&] { return posd.log_text(); });
  const pid_t light = start_job(env, train, "light", base + ".light", [&] { return posd.ps(); }, [&] { return posd.log_text(); });
  // Calls executed per session, from posd's ps.
  const auto executed = [&](const std::string& job) {
    const std::string ps = posd.ps();
    const size_t at = ps.find("\"job\":\"" + job + "\"");
    const size_t e = at == std::string::npos ? at : ps.find("\"calls_executed\":", at);
    return e == std::string::npos ? -1LL : std::atoll(ps.c_str() + e + 17);
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // both past their start
  const long long h0 = executed("heavy"), l0 = executed("light");
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const long long dh = executed("heavy") - h0, dl = executed("light") - l0;
  ASSERT_GT(dh, 0) << posd.ps();
  ASSERT_GT(dl, 0) << posd.ps();
  EXPECT_NEAR(double(dh) / double(dh + dl), 0.70, 0.10) << dh << " " << dl;
  // Both session processes are in the region with their shares.
  int code = -1;
  const std::string ps = pos::test::run_shell(env_or_fail("POS_CLI") + " ps --json --socket " + posd.socket +
                                                  " --jobs-dir " + jobs_dir, &code);
  EXPECT_NE(ps.find("\"gpu_share\":700,"), std::string::npos) << ps;
  EXPECT_NE(ps.find("\"gpu_share\":300,"), std::string::npos) << ps;
  // pos-cli limit changes a running posd job's share: one that would make the GPU's shares pass
  // 100 % is refused naming the holder, with nothing changed; a smaller one moves the ratio.
  const std::string lim = env_or_fail("POS_CLI") + " limit -t " + std::to_string(light) + " --socket " + posd.socket +
                          " --jobs-dir " + jobs_dir;
  std::string out = pos::test::run_shell(lim + " --gpu-share 40%", &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("already shared out"), std::string::npos) << out;
  out = pos::test::run_shell(lim + " --gpu-share 10%", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("; GPU-time share 10.0%"), std::string::npos) << out;
  const long long h1 = executed("heavy"), l1 = executed("light");
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const long long dh1 = executed("heavy") - h1, dl1 = executed("light") - l1;
  ASSERT_GT(dl1, 0) << posd.ps();
  EXPECT_NEAR(double(dh1) / double(dh1 + dl1), 0.875, 0.10) << dh1 << " " << dl1;
  for (pid_t p : {heavy, light}) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
  std::filesystem::remove(base + ".heavy");
  std::filesystem::remove(base + ".light");
}

// posd.usage_region (#24, docs/limits.md): posd keeps one region for several users, shared with
// posd.group (0660). Its sessions join it (not the jobs directory's), pos-cli ps reads it through
// POS_USAGE_REGION, and a job of another user in the group shares its GPU by the same accounting:
// a share that would make the GPU's shares pass 100 % beside a posd job's is refused.
TEST_F(PosdProcess, PosdKeepsOneUsageRegionForTheJobsOfSeveralUsers) {
  const long kGid = 65533;
  const std::string base = ::testing::TempDir() + "posd-e2e-kept-" + std::to_string(::getpid());
  const std::string jobs_dir = base + "-jobs", kept = base + "-usage";
  std::filesystem::remove_all(jobs_dir);
  std::filesystem::remove(kept);
  const bool root = ::geteuid() == 0;
  const OwnPosd posd(base, (root ? "  group: " + std::to_string(kGid) + "\n" : std::string()) + "  usage_region: " +
                               kept + "\n  limits:\n    - jobs: [\"heavy\"]\n      gpu_share: 70%\n",
                     {"env", "POS_JOBS_DIR=" + jobs_dir});
  struct stat st {};
  ASSERT_EQ(::stat(kept.c_str(), &st), 0) << posd.log_text();
  EXPECT_EQ(st.st_mode & 0777, root ? 0660u : 0600u);
  const std::string env = "POS_SOCKET=" + posd.socket + " LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") +
                          " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
  const pid_t heavy = start_job(env, train_cmd("--steps 1000000"), "heavy", base + ".heavy", [&] { return posd.ps(); },
                                [&] { return posd.log_text(); });
  int code = -1;
  std::string ps;
  for (int i = 0; i < 100 && ps.find("\"gpu_share\":700,") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ps = pos::test::run_shell("POS_USAGE_REGION=" + kept + " " + env_or_fail("POS_CLI") + " ps --json --socket " +
                                  posd.socket + " --jobs-dir " + jobs_dir, &code);
  }
  EXPECT_NE(ps.find("\"gpu_share\":700,"), std::string::npos) << ps;
  EXPECT_FALSE(std::filesystem::exists(jobs_dir + "/usage"));  // not the jobs directory's region
  if (root) {
    // Another user (uid 65534) in posd.group asks for 40 % of the same GPU: refused, naming the
    // rest's holder; 30 % fits.
    int from[2];
    ASSERT_EQ(::pipe(from), 0);
    const pid_t c = ::fork();
    if (c == 0) {
      ::close(from[0]);
      const gid_t groups[1] = {static_cast<gid_t>(kGid)};
      if (::setgroups(1, groups) != 0 || ::setgid(65532) != 0 || ::setuid(65534) != 0) ::_exit(3);
      std::string out;
      auto r = pos::UsageRegion::open(kept, pos::UsageRegion::Access::kKept);
      if (!r.ok()) out = "open: " + r.status().message();
      else {
        pos::UsageRegion::Entry e;
        e.pid = static_cast<uint32_t>(::getpid());
        e.start_time = pos::process_start_time(e.pid);
        e.device = 0;
        auto slot = (*r)->join(e);
        if (!slot.ok()) out = "join: " + slot.status().message();
        else {
          const pos::Status over = (*r)->set_share(*slot, 400), fits = (*r)->set_share(*slot, 300);
          out = "40%: " + (over.ok() ? std::string("ok") : over.message()) + "\n30%: " + (fits.ok() ? "ok" : fits.message());
        }
      }
      (void)!::write(from[1], out.data(), out.size());
      ::_exit(0);
    }
    ::close(from[1]);
    std::string said;
    char buf[512];
    for (ssize_t n; (n = ::read(from[0], buf, sizeof(buf))) > 0;) said.append(buf, static_cast<size_t>(n));
    ::close(from[0]);
    ::waitpid(c, nullptr, 0);
    EXPECT_NE(said.find("40%: "), std::string::npos) << said;
    EXPECT_NE(said.find("already shared out"), std::string::npos) << said;
    EXPECT_NE(said.find("30%: ok"), std::string::npos) << said;
  }
  ::kill(heavy, SIGKILL);
  ::waitpid(heavy, nullptr, 0);
  std::filesystem::remove(base + ".heavy");
  std::filesystem::remove(kept);
}

// A job that is not root (uid 65534, admitted through posd.group). Detached, it comes back as soon
// as a permit appears (in /dev/shm, where it can read it; its own, so it may remove it there) and
// not for a permit of another user; it finishes exactly as an uninterrupted run. pos-cli dump of it
// works where pos-cli has CAP_SYS_RESOURCE (CRIU needs it for another user's process) and is refused
// up front, saying so, where it does not (some containers, this CI's among them), the job untouched.
TEST_F(PosdProcess, AJobOfAnotherUserComesBackOnItsOwnPermitOnlyAndIsDumpedOrRefusedUpFront) {
  const uint32_t kUid = 65534, kGid = 65533;
  const std::string base = ::testing::TempDir() + "posd-e2e-nonroot-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", bin = base + ".bin";
  const std::string cli = env_or_fail("POS_CLI");
  const OwnPosd posd(base, "  group: " + std::to_string(kGid) + "\n");  // admits kGid's members too
  const std::string& socket = posd.socket;
  auto ps = [&] { return posd.ps(); };
  auto logtext = [&] { return posd.log_text(); };
  // The programs where the other user can read them, whatever the build directory's mode.
  namespace fs = std::filesystem;
  fs::remove_all(bin);
  fs::create_directories(bin);
  fs::permissions(bin, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                           fs::perms::others_exec);
  fs::copy_file(env_or_fail("POS_MLP_NATIVE"), bin + "/mlp_train_native");
  fs::copy_file(env_or_fail("POS_CLIENT_LIB"), bin + "/libpos_client.so");
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "3000"};
  const std::string train = "setpriv --reuid=" + std::to_string(kUid) + " --regid=" + std::to_string(kGid) +
                            " --clear-groups env POS_SOCKET=" + socket + " LD_LIBRARY_PATH=" +
                            env_or_fail("POS_CUDA_LIB_DIR") + " LD_PRELOAD=" + bin + "/libpos_client.so " + bin +
                            "/mlp_train_native " + args[0] + " " + args[1];
  const pid_t child = start_job("", train, "nonroot", out_file, ps, logtext);
  struct stat st_proc {};
  ASSERT_EQ(stat(("/proc/" + std::to_string(child)).c_str(), &st_proc), 0);
  ASSERT_EQ(st_proc.st_uid, kUid) << "the job does not run as the other user";
  auto lines = [&] {
    std::ifstream f(out_file);
    return std::count(std::istreambuf_iterator<char>(f), {}, '\n');
  };
  auto permit = pos::new_permit_path();
  ASSERT_TRUE(permit.ok()) << permit.status().to_string();
  auto token = pos::posd_detach(socket, static_cast<uint32_t>(child), *permit, 600'000);
  ASSERT_TRUE(token.ok()) << token.status().to_string() << logtext();
  // Someone else's permit (neither root's nor the job's) is not looked at.
  ASSERT_TRUE(pos::grant_reattach(*permit, "", kUid + 1000).ok());
  const auto held = lines();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(lines(), held) << "the job ran on a permit that is not its own";
  EXPECT_TRUE(fs::exists(*permit));
  ASSERT_TRUE(pos::grant_reattach(*permit, "", kUid).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (lines() <= held + 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the job did not come back on its permit" << logtext();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(fs::exists(*permit)) << "the job did not remove its permit";

  int code = -1;
  std::string err;
  std::ifstream status("/proc/self/status");
  std::string line;
  bool sys_resource = false;
  while (std::getline(status, line))
    if (line.rfind("CapEff:", 0) == 0) sys_resource = ((std::stoull(line.substr(7), nullptr, 16) >> 24) & 1) != 0;
  (void)shell(cli + " dump -t " + std::to_string(child) + " -D " + base + ".lr --leave-running --socket " + socket, &code,
              &err);
  if (sys_resource) {
    EXPECT_EQ(code, 0) << err << logtext();
  } else {
    EXPECT_EQ(code, 1);
    EXPECT_NE(err.find("CRIU needs CAP_SYS_RESOURCE to dump another user's process"), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(base + ".lr/gpu"));
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << logtext();
  EXPECT_EQ(read_file(out_file), expected(args));
  for (const std::string& p : {base + ".lr", bin, out_file}) fs::remove_all(p);
}

TEST_F(PosdProcess, ASessionIsNamedAfterTheProgramsFullFileName) {
  const std::string binary = env_or_fail("POS_MLP_NATIVE");
  const std::string name = binary.substr(binary.rfind('/') + 1);
  // Longer than the 15 characters Linux keeps of a process's name (/proc/self/comm).
  ASSERT_GT(name.size(), 15u) << name;
  const std::string cmd = preload_env() + "exec " + train_cmd("--steps 100000000") + " >/dev/null 2>&1";
  pid_t child = -1;
  std::vector<char*> argv{const_cast<char*>("/bin/sh"), const_cast<char*>("-c"), const_cast<char*>(cmd.c_str()), nullptr};
  ASSERT_EQ(posix_spawn(&child, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  struct Reap {
    pid_t pid;
    ~Reap() {
      kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
    }
  } reap{child};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string ps;
  while ((ps = sessions_json()).find("\"job\":\"") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no session: " << ps << log_text();
    std::this_thread::yield();
  }
  EXPECT_NE(ps.find("\"job\":\"" + name + "\""), std::string::npos) << ps;
}

TEST_F(PosdProcess, WithoutPosdTheJobStopsAtOnceWithAMessageNamingIt) {
  int code = -1;
  std::string err;
  const std::string env = "POS_SOCKET=" + ::testing::TempDir() + "nobody-here.sock LD_LIBRARY_PATH=" +
                          env_or_fail("POS_CUDA_LIB_DIR") + " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
  (void)shell(env + train_cmd(""), &code, &err);
  EXPECT_NE(code, 0);
  EXPECT_NE(err.find("cannot reach posd"), std::string::npos) << err;
}

// posd --config FILE with `extra` ("NAME=value") over this process's environment; stderr to `log`.
pid_t spawn_posd(const std::string& cfg, const std::string& log, const std::vector<std::string>& extra) {
  std::vector<std::string> env(extra);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const bool replaced = std::any_of(extra.begin(), extra.end(), [&](const std::string& x) {
      return kv.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
    });
    if (!replaced) env.push_back(kv);
  }
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  const std::string posd = env_or_fail("POS_POSD");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv{const_cast<char*>(posd.c_str()), const_cast<char*>("--config"), const_cast<char*>(cfg.c_str()),
                          nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, posd.c_str(), &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// The file says cuda and error; the environment says host and debug, and wins. The debug level
// shows in what a second posd's liveness probe leaves in the first one's log: a debug line, no
// warning or error.
TEST_F(PosdProcess, TheEnvironmentOverridesTheConfigFileAndAProbeFromASecondPosdIsNoWarning) {
  const std::string tag = "posd-e2e-env-" + std::to_string(::getpid());
  const std::string sock = ::testing::TempDir() + tag + "/posd.sock", cfg = ::testing::TempDir() + tag + ".yaml",
                    log = ::testing::TempDir() + tag + ".log";
  std::ofstream(cfg) << "backend: cuda\nlog_level: error\nposd:\n  socket: " << sock << "\n";
  const pid_t pid = spawn_posd(cfg, log, {"POS_BACKEND=host", "POS_LOG_LEVEL=debug"});
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool up = false;
  while (!(up = pos::posd_control(sock, "ps").ok())) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) != 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::yield();
  }
  if (!up) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
  ASSERT_TRUE(up) << "posd did not come up: " << read_file(log);
  EXPECT_NE(pos::posd_control(sock, "ps").value().find("\"backend\":\"host\""), std::string::npos);

  int code = -1;
  std::string err;
  (void)shell("POS_BACKEND=host " + env_or_fail("POS_POSD") + " --config " + cfg, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find(" error posd: "), std::string::npos) << err;
  EXPECT_NE(err.find("another posd is listening on " + sock), std::string::npos) << err;
  while (read_file(log).find("liveness probe") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  kill(pid, SIGTERM);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const std::string text = read_file(log);
  EXPECT_NE(text.find("debug posd: pid "), std::string::npos) << text;
  EXPECT_NE(text.find("liveness probe"), std::string::npos) << text;
  EXPECT_EQ(text.find(" warn "), std::string::npos) << text;
  EXPECT_EQ(text.find(" error "), std::string::npos) << text;
  EXPECT_NE(text.find("info posd: listening on " + sock + " (host backend)"), std::string::npos) << text;

  // A bad value in the environment stops posd --config too, naming the variable.
  (void)shell("POS_BACKEND=tpu " + env_or_fail("POS_POSD") + " --config " + cfg, &code, &err);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("POS_BACKEND must be host|cuda, not 'tpu'"), std::string::npos) << err;
}

TEST_F(PosdProcess, PosdSaysWhereItListensOnceAndEveryLineHasTheLogFormat) {
  // posd prints the line after its acceptor runs, so `ps` may have answered before it is there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (log_text().find("listening on ") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  const std::string text = log_text();
  const size_t first = text.find("listening on ");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find("listening on ", first + 1), std::string::npos) << text;  // log_level is info here
  std::istringstream in(text);
  const std::regex format("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z pos\\[" +
                          std::to_string(pid_) + "\\] (error|warn|info|debug) [^:]+: .*");
  for (std::string line; std::getline(in, line);) EXPECT_TRUE(std::regex_match(line, format)) << line;
}

// The pids of the spare session processes a posd log says it started, in order.
std::vector<int> spare_pids(const std::string& log) {
  std::vector<int> pids;
  const std::regex re("spare session process ([0-9]+) started");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    pids.push_back(std::stoi((*it)[1].str()));
  return pids;
}

// posd.spare_session: the session process started ahead serves the next job (whose output is that
// of a run without POS), the next spare comes up at once, a spare that died is replaced by a new
// process without the job noticing, and posd's stop leaves no spare behind.
TEST_F(PosdProcess, APosdWithASpareSessionGivesItToTheNextJobStartsAnotherAndLeavesNoneBehind) {
  const std::string base = ::testing::TempDir() + "posd-e2e-spare-" + std::to_string(::getpid());
  std::vector<int> spares;
  const std::vector<std::string> args{"--steps", "5"};
  const std::string want = expected(args);
  {
    OwnPosd own(base, "  spare_session: true\n");
    spares = spare_pids(own.log_text());
    ASSERT_EQ(spares.size(), 1u) << own.log_text();
    const std::string env = "POS_SOCKET=" + own.socket + " LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") +
                            " LD_PRELOAD=" + env_or_fail("POS_CLIENT_LIB") + " ";
    int code = -1;
    std::string err;
    EXPECT_EQ(shell(env + train_cmd(args[0] + " " + args[1]), &code, &err), want);
    EXPECT_EQ(code, 0) << err << own.log_text();
    EXPECT_NE(own.log_text().find("in session process " + std::to_string(spares[0]) + " (the spare)"), std::string::npos)
        << own.log_text();
    spares = spare_pids(own.log_text());
    ASSERT_EQ(spares.size(), 2u) << own.log_text();
    // The second spare dies before anyone takes it: the next job still runs, in a process of its own.
    ASSERT_EQ(kill(spares[1], SIGKILL), 0);
    EXPECT_EQ(shell(env + train_cmd(args[0] + " " + args[1]), &code, &err), want);
    EXPECT_EQ(code, 0) << err << own.log_text();
    EXPECT_NE(own.log_text().find("the spare session process " + std::to_string(spares[1]) + " cannot take pid"),
              std::string::npos) << own.log_text();
    spares = spare_pids(own.log_text());
    ASSERT_EQ(spares.size(), 3u) << own.log_text();
    EXPECT_EQ(::kill(spares[2], 0), 0) << "the newest spare is not running";
  }  // posd stops (SIGTERM)
  for (int pid : spares) {
    // Reaped by posd (not our children): gone, or at most a zombie of a posd that has exited.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    EXPECT_TRUE(text.empty() || text.find(") Z ") != std::string::npos) << "spare " << pid << " outlived posd: " << text;
  }
}

TEST_F(PosdProcess, SigtermStopsPosdCleanly) {
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  int st = 0;
  ASSERT_EQ(waitpid(pid_, &st, 0), pid_);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log_text();
  EXPECT_NE(log_text().find("posd: stopped"), std::string::npos);
  EXPECT_FALSE(pos::posd_control(socket_, "ps").ok());
}

}  // namespace

// gpu suite only (meson's CI test filters it out: its program has no host-backend build).
using PosdGpuProcess = PosdProcess;

// ---- continuous checkpointing (pos-cli checkpoint, docs/continuous_checkpointing.md) ----

// The job, its output appended to `out_file` (O_APPEND|O_WRONLY: CRIU then does not hold the
// file to its size at the dump, so a job restored from an earlier point appends what it prints
// from its cut on), its jobs directory `jobs_dir` (its policy's status goes there).
pid_t start_appending_job(const std::string& preload, const std::string& train, const std::string& job,
                          const std::string& out_file, const std::string& jobs_dir, const OwnPosd& posd,
                          const std::string& err_file = "/dev/null") {
  return start_job(preload + "POS_SOCKET=" + posd.socket + " POS_JOBS_DIR=" + jobs_dir + " ", train, job, out_file,
                   [&] { return posd.ps(); }, [&] { return posd.log_text(); }, true, err_file);
}

// What a job killed after printing `killed_at` bytes and restored from a restore point leaves in
// its appended output: the uninterrupted run's first `killed_at` bytes, then the uninterrupted
// run's output from the point's cut on (which is no later than the kill).
void expect_resumed_output(const std::string& out, size_t killed_at, const std::string& want, const std::string& why) {
  ASSERT_LE(killed_at, out.size()) << why;
  EXPECT_EQ(want.compare(0, killed_at, out, 0, killed_at), 0) << why << ": the killed run's output is no prefix of an uninterrupted run's";
  const std::string tail = out.substr(killed_at);
  ASSERT_FALSE(tail.empty()) << why << ": the restored job printed nothing";
  ASSERT_LE(tail.size(), want.size()) << why;
  EXPECT_EQ(want.substr(want.size() - tail.size()), tail)
      << why << ": the restored run did not go on exactly as the uninterrupted one from its cut";
  EXPECT_LE(want.size() - tail.size(), killed_at) << why << ": the restore point's cut is later than the kill";
}

// posd's metrics, scraped over HTTP from the address its log names.
std::string scrape_metrics(const std::string& posd_log) {
  std::smatch m;
  const std::string log = read_file(posd_log);
  if (!std::regex_search(log, m, std::regex("metrics on http://([0-9.]+):([0-9]+)/metrics"))) return "";
  int code = -1;
  std::string err;
  // No curl on a bare CI machine: bash's /dev/tcp speaks the request.
  return shell("bash -c 'exec 3<>/dev/tcp/" + m[1].str() + "/" + m[2].str() +
                   "; printf \"GET /metrics HTTP/1.0\\r\\n\\r\\n\" >&3; cat <&3'",
               &code, &err);
}

// One sample's value from the exposition text, or -1.
double metric(const std::string& text, const std::string& name, uint32_t pid) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\n" + name + "\\{pid=\"" + std::to_string(pid) + "\"[^}]*\\} ([-0-9.e+]+)")))
    return -1;
  return std::stod(m[1].str());
}

// ZDTM shape, at random moments: the training job runs under posd with a restore point (GPU and
// CPU state) every 250 ms; then the job, the checkpointer or posd is killed with SIGKILL, the job
// is gone too, and `pos-cli restore --latest` brings back the newest complete point (into a new
// posd where posd died), from which the job prints exactly what an uninterrupted run prints. One
// chain, never cut here (--full-every 64): each tick's retention makes the older kept point whole, and
// the newest point, built on it, restores through it.
TEST_F(PosdProcess, ContinuousCheckpointsLeaveTheNewestRestorePointRestorableWhateverIsKilledWhen) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "30000" : "4000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const unsigned seed = static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::srand(seed);
  for (const std::string victim : {"job", "checkpointer", "posd"}) {
    const std::string why = "killed: " + victim + " (seed " + std::to_string(seed) + ")";
    const std::string base = ::testing::TempDir() + "posd-e2e-cont-" + victim + "-" + std::to_string(::getpid());
    const std::string out_file = base + ".out", dir = base + ".points", jobs = base + ".jobs", err_file = base + ".err";
    for (const std::string& p : {dir, jobs, out_file, err_file}) std::filesystem::remove_all(p);
    auto posd = std::make_unique<OwnPosd>(base + "-posd", "  metrics: 127.0.0.1:0\n");
    const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "cont-" + victim,
                                            out_file, jobs, *posd, err_file);
    int code = -1;
    std::string err;
    const std::string started = shell("POS_JOBS_DIR=" + jobs + " " + cli + " checkpoint -t " + std::to_string(child) +
                                          " -D " + dir + " --every 250ms --with-cpu --keep 2 --full-every 64 --json --socket " +
                                          posd->socket,
                                      &code, &err);
    ASSERT_EQ(code, 0) << err << posd->log_text();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(started, m, std::regex("\"checkpointer\":([0-9]+)"))) << started;
    const pid_t checkpointer = std::stoi(m[1].str());
    // Three points (a chain, whose older kept point is then made whole), then a moment anywhere in
    // the next 0.8 s.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (pos::list_restore_points(dir).size() < 2 || !std::filesystem::exists(dir + "/cp-000003")) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << read_file(dir + "/checkpoint.log") << posd->log_text();
      ASSERT_TRUE(pos::process_running(static_cast<uint32_t>(child))) << why << ": the job ended first: make it longer\n"
                                                                      << read_file(dir + "/checkpoint.log");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::rand() % 800));
    const pid_t target = victim == "job" ? child : victim == "checkpointer" ? checkpointer : posd->pid;
    const bool job_ran = pos::process_running(static_cast<uint32_t>(child));
    ASSERT_EQ(kill(target, SIGKILL), 0) << why;
    if (victim == "posd") {
      waitpid(posd->pid, nullptr, 0);
      posd->pid = -1;
    }
    // Whatever died, the job is lost next (a crash of the machine, say); a dump that the kill left
    // holding it is released by its guardian first.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(child, SIGKILL);
    int st = wait_for_exit(child, std::chrono::seconds(30));
    // (With posd gone the job may have ended first by itself: its calls fail and it exits 1.)
    ASSERT_TRUE(WIFSIGNALED(st) || (victim == "posd" && WIFEXITED(st)))
        << why << ": the job " << (job_ran ? "was running at the kill" : "had ended before the kill") << ", status " << st
        << "\nits stderr:\n" << read_file(err_file) << "\ncheckpoint.log:\n" << read_file(dir + "/checkpoint.log")
        << (posd->pid > 0 ? posd->log_text() : "");
    if (victim != "checkpointer") {
      // The checkpointer sees the job gone and ends (its tick in progress fails, if any).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (pos::process_running(static_cast<uint32_t>(checkpointer)) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_FALSE(pos::process_running(static_cast<uint32_t>(checkpointer))) << why;
    }
    const size_t killed_at = read_file(out_file).size();
    if (victim == "posd") posd = std::make_unique<OwnPosd>(base + "-posd2");
    const std::string images = shell(cli + " images " + dir, &code, &err);
    EXPECT_EQ(code, 0) << err;
    const std::string restored = shell(cli + " restore -D " + dir + " --latest --json --socket " + posd->socket, &code, &err);
    ASSERT_EQ(code, 0) << why << ": " << err << images << read_file(dir + "/checkpoint.log") << posd->log_text();
    st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << why << " " << st << posd->log_text();
    expect_resumed_output(read_file(out_file), killed_at, want, why + "\n" + images);
    // Retention kept two points, the older made whole so that nothing older is kept (a
    // checkpointer killed between a new point and its retention may leave a third), and no
    // unfinished point is left to be mistaken for one.
    const auto points = pos::list_restore_points(dir);
    EXPECT_GE(points.size(), 2u) << images;
    EXPECT_LE(points.size(), victim == "checkpointer" ? 3u : 2u) << images << read_file(dir + "/checkpoint.log");
    // (A tick's retention finishes whatever happens to the job or posd; a checkpointer killed may
    // not have got there.)
    if (victim != "checkpointer") {
      EXPECT_TRUE(points[points.size() - 2].parent.empty()) << images;
      EXPECT_NE(read_file(dir + "/checkpoint.log").find("made whole"), std::string::npos) << read_file(dir + "/checkpoint.log");
    }
    // (A checkpointer killed mid-tick leaves .tmp-/.del- for the next one to clear; the others end cleanly.)
    if (victim != "checkpointer") {
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        EXPECT_TRUE(n.rfind(".del-", 0) != 0 && n.rfind(".tmp-", 0) != 0) << n << "\n" << images;
      }
    }
    for (const std::string& p : {dir, jobs, out_file, err_file}) std::filesystem::remove_all(p);
  }
}

// A full disk (a small tmpfs): the ticks that do not fit fail with the reason in the status, ps and
// the metrics; every restore point written before stays complete and restorable, and the job runs on
// and finishes untouched. posd's metrics agree with what happened.
TEST_F(PosdProcess, AFullDiskFailsTicksWithTheReasonKeepsEveryRestorePointAndTheJobRunsOn) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "60000" : "3000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-full-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", mnt = base + ".tmpfs", dir = mnt + "/points", jobs = base + ".jobs";
  std::filesystem::remove_all(jobs);
  std::filesystem::create_directories(mnt);
  int code = -1;
  std::string err;
  // Room for a few restore points of this job, not for many (each is mostly CRIU's part).
  (void)shell("mount -t tmpfs -o size=260m pos-e2e-full " + mnt, &code, &err);
  ASSERT_EQ(code, 0) << "this test needs a tmpfs it can mount (root): " << err;
  struct Unmount {
    std::string m;
    ~Unmount() { (void)!std::system(("umount -l " + m + " 2>/dev/null").c_str()); }
  } unmount{mnt};
  OwnPosd posd(base + "-posd", "  metrics: 127.0.0.1:0\n");
  const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "full", out_file, jobs, posd);
  (void)shell("POS_JOBS_DIR=" + jobs + " " + cli + " checkpoint -t " + std::to_string(child) + " -D " + dir +
                  " --every 200ms --with-cpu --keep 50 --full-every 1 --socket " + posd.socket,
              &code, &err);
  ASSERT_EQ(code, 0) << err;
  const std::string status_path = pos::policy_status_path(jobs, static_cast<uint32_t>(child));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pos::PolicyStatus s;
  for (;;) {
    auto r = pos::read_policy_status(status_path);
    if (r.ok() && r->failed >= 2 && r->taken >= 1) {
      s = *r;
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << read_file(dir + "/checkpoint.log");
    ASSERT_TRUE(pos::process_running(static_cast<uint32_t>(child))) << "the job ended before the disk was full";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(s.last_error.empty());
  EXPECT_NE(s.last_error.find("No space left on device"), std::string::npos) << s.last_error;
  EXPECT_EQ(s.state, "running");  // the policy goes on
  const std::string ps = shell("POS_JOBS_DIR=" + jobs + " " + cli + " ps --socket " + posd.socket, &code, &err);
  EXPECT_NE(ps.find("last error: "), std::string::npos) << ps;
  // The metrics say what the status says (read again right after: a tick may land in between).
  const std::string text = scrape_metrics(posd.log);
  auto now = pos::read_policy_status(status_path);
  ASSERT_TRUE(now.ok());
  EXPECT_NE(text.find("HTTP/1.0 200 OK"), std::string::npos) << text;
  EXPECT_EQ(metric(text, "pos_sessions", 0), -1);  // no labels: matched below
  EXPECT_NE(text.find("\npos_sessions 1\n"), std::string::npos) << text;
  const double taken = metric(text, "pos_checkpoints_total", static_cast<uint32_t>(child));
  const double failed = metric(text, "pos_checkpoint_failures_total", static_cast<uint32_t>(child));
  EXPECT_GE(taken, static_cast<double>(s.taken));
  EXPECT_LE(taken, static_cast<double>(now->taken));
  EXPECT_GE(failed, static_cast<double>(s.failed));
  EXPECT_LE(failed, static_cast<double>(now->failed));
  EXPECT_EQ(metric(text, "pos_checkpoint_policy_running", static_cast<uint32_t>(child)), 1);
  EXPECT_GE(metric(text, "pos_checkpoint_latest_age_seconds", static_cast<uint32_t>(child)), 0);
  EXPECT_GT(metric(text, "pos_session_device_memory_bytes", static_cast<uint32_t>(child)), 0);
  // Stop the policy; every point it wrote is complete, and nothing unfinished is left.
  const std::string stopped = shell(cli + " checkpoint -t " + std::to_string(child) + " --jobs-dir " + jobs + " --stop", &code, &err);
  EXPECT_EQ(code, 0) << err;
  EXPECT_NE(stopped.find("stopped the checkpoint policy"), std::string::npos) << stopped;
  auto last = pos::read_policy_status(status_path);
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  EXPECT_EQ(last->state, "stopped");
  EXPECT_EQ(pos::list_restore_points(dir).size(), static_cast<size_t>(last->taken)) << read_file(dir + "/checkpoint.log");
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
  // The job ran on untouched.
  int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), want);
  // And the newest point written before the disk filled restores to the same end.
  const size_t finished_at = read_file(out_file).size();
  (void)shell(cli + " restore -D " + dir + " --latest --socket " + posd.socket, &code, &err);
  ASSERT_EQ(code, 0) << err << posd.log_text();
  st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 120 : 300));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  expect_resumed_output(read_file(out_file), finished_at, want, "restored after the job finished");
  std::filesystem::remove_all(jobs);
  std::filesystem::remove(out_file);
}

// posd.checkpoint_policy: posd starts a policy for each session whose job name matches (here
// GPU-only checkpoints), into DIR/<job>-<pid>; other jobs are left alone; a policy posd cannot run
// (no directory, a bad interval) stops posd from starting, with the reason.
TEST_F(PosdProcess, APosdPolicyCheckpointsTheJobsItNamesFromTheirStart) {
  // Long enough for any first checkpoint (a first `criu check` took 11 s here); ended by the test.
  const std::vector<std::string> args{"--steps", "100000000"};
  const std::string base = ::testing::TempDir() + "posd-e2e-yaml-" + std::to_string(::getpid());
  const std::string points = base + ".points", jobs = base + ".jobs";
  for (const std::string& p : {points, jobs}) std::filesystem::remove_all(p);
  // With a spare session process, which the named job (started first) is handed: what posd's
  // config says of a named job's checkpoints must reach a session whose backend is up already.
  OwnPosd posd(base + "-posd", "  spare_session: true\n  checkpoint_policy:\n    jobs: [\"auto-*\"]\n    every: 200ms\n    dir: " +
                                   points + "\n    keep: 2\n    full_every: 3\n");
  const pid_t named = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "auto-1", base + ".out1", jobs, posd);
  const pid_t other = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "manual", base + ".out2", jobs, posd);
  const std::string dir = points + "/auto-1-" + std::to_string(named);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (pos::list_restore_points(dir).size() < 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << read_file(dir + "/checkpoint.log") << posd.log_text();
    ASSERT_TRUE(pos::process_running(static_cast<uint32_t>(named))) << "the job ended first: make it longer";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(posd.log_text().find("checkpoint policy for pid " + std::to_string(named) + " ('auto-1')"), std::string::npos)
      << posd.log_text();
  EXPECT_FALSE(std::filesystem::exists(points + "/manual-" + std::to_string(other)));
  // The named job's session page-locked its checkpoint staging as it started, and keeps its
  // copy-on-write shadows between ticks (checkpoint.keep_shadows: auto); the other's did neither.
  // (A spare made its restore loaders' chunks already: at least as many as a checkpoint takes.)
  const std::string ahead = "pid " + std::to_string(named) + " ('auto-1'): checkpoint staging made ahead, ";
  EXPECT_TRUE(std::regex_search(posd.log_text(), std::regex("pid " + std::to_string(named) +
                                                              " uid [0-9]+ job 'auto-1' in session process [0-9]+ \\(the spare\\)")))
      << posd.log_text();
  const size_t at = posd.log_text().find(ahead);
  ASSERT_NE(at, std::string::npos) << posd.log_text();
  const std::string line = posd.log_text().substr(at, posd.log_text().find('\n', at) - at);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, std::regex("made ahead, ([0-9]+) chunks of 8 MiB kept"))) << line;
  EXPECT_GE(std::stoul(m[1].str()), pos::checkpoint_staging_chunks()) << line;
  EXPECT_NE(line.find("copy-on-write shadows kept between checkpoints"), std::string::npos) << line;
  EXPECT_EQ(posd.log_text().find("pid " + std::to_string(other) + " ('manual'): checkpoint staging made ahead"),
            std::string::npos)
      << posd.log_text();
  int code = -1;
  std::string err;
  const std::string ps = shell(env_or_fail("POS_CLI") + " ps --json --socket " + posd.socket + " --jobs-dir " + jobs, &code, &err);
  EXPECT_NE(ps.find("\"pid\":" + std::to_string(named) + ",\"checkpointer\":"), std::string::npos) << ps;
  EXPECT_NE(ps.find("\"with_cpu\":false,\"state\":\"running\""), std::string::npos) << ps;
  for (pid_t p : {named, other}) {
    kill(p, SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(wait_for_exit(p, std::chrono::seconds(30))));
  }
  // Refused at start: no directory, then an interval that is none.
  for (const std::string& bad : {std::string("  checkpoint_policy:\n    jobs: [x]\n"),
                                 std::string("  checkpoint_policy:\n    jobs: [x]\n    dir: /tmp\n    every: 5x\n")}) {
    const std::string cfg = base + ".bad.yaml";
    std::ofstream(cfg) << "backend: host\nposd:\n  socket: " << base << "-bad/posd.sock\n" << bad;
    (void)shell(env_or_fail("POS_POSD") + " --config " + cfg, &code, &err);
    EXPECT_EQ(code, 1) << err;
    EXPECT_NE(err.find("posd.checkpoint_policy"), std::string::npos) << err;
  }
  for (const std::string& p : {points, jobs, base + ".out1", base + ".out2"}) std::filesystem::remove_all(p);
}

// A program written for this test alone (workloads/pinned_pipeline.cu: two streams ordered by
// events, cuBLAS, cudaMallocHost buffers a second host thread fills while the GPU works), dumped
// mid-run, restored, and run on: it prints exactly what a native run prints. Then again with
// --leave-running: the original finishes identically.
TEST_F(PosdGpuProcess, ANewProgramWithStreamsEventsCublasAndPinnedBuffersIsDumpedAndRestoredMidRun) {
  become_subreaper();
  const std::string prog = env_or_fail("POS_PIPELINE_NATIVE");
  const std::string args = "--steps 3000 --n 512";
  int code = -1;
  std::string err;
  const std::string want = shell("LD_LIBRARY_PATH=" + env_or_fail("POS_CUDA_LIB_DIR") + " " + prog + " " + args, &code, &err);
  ASSERT_EQ(code, 0) << err;
  ASSERT_NE(want.find("final "), std::string::npos) << want;
  const std::string base = ::testing::TempDir() + "posd-e2e-pipeline-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", dir = base + ".img", dir2 = base + ".img2";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
  pid_t child = start_job(preload_env(), prog + " " + args, "pipeline", out_file, [&] { return sessions_json(); },
                          [&] { return log_text(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well into its steps
  (void)shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir + " --socket " + socket_, &code,
              &err);
  ASSERT_EQ(code, 0) << err << log_text();
  int st = wait_for_exit(child, std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  {
    std::ifstream f(out_file);
    const std::string partial((std::istreambuf_iterator<char>(f)), {});
    ASSERT_LT(partial.size(), want.size()) << "it had finished before the dump";
  }
  (void)shell(env_or_fail("POS_CLI") + " restore -D " + dir + " --socket " + socket_, &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  st = wait_for_exit(child, std::chrono::seconds(120));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << log_text();
  EXPECT_EQ(read_file(out_file), want);
  // --leave-running, async: the original runs on and finishes identically.
  child = start_job(preload_env(), prog + " " + args, "pipeline2", out_file, [&] { return sessions_json(); },
                    [&] { return log_text(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (void)shell(env_or_fail("POS_CLI") + " dump -t " + std::to_string(child) + " -D " + dir2 +
                  " --leave-running --mode async --socket " + socket_,
              &code, &err);
  ASSERT_EQ(code, 0) << err << log_text();
  st = wait_for_exit(child, std::chrono::seconds(120));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), want);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
  std::filesystem::remove(out_file);
}

// ---- live migration between two posd of one host (pos-cli migrate, docs/migration.md) ----
// Its own meson test (posd_migrate_e2e_test): posd_e2e_test's time limit holds the others.
using PosdMigrate = PosdProcess;

// pos-cli migrate run while this thread reaps the job's original process (CRIU can restore the job
// under its pid only once its parent has reaped it); the statuses reaped, in order.
std::string migrate_reaping(const std::string& cmd, pid_t child, int* code, std::string* err, std::vector<int>* reaped) {
  std::atomic<bool> done{false};
  std::string out;
  std::thread t([&] {
    out = shell(cmd, code, err);
    done = true;
  });
  while (!done.load()) {
    int st = 0;
    if (waitpid(child, &st, WNOHANG) == child) reaped->push_back(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  t.join();
  // An end that came just before the command returned (a dump ends the job as its last step).
  int st = 0;
  if (waitpid(child, &st, WNOHANG) == child) reaped->push_back(st);
  return out;
}

// Whether posd's `ps` lists a session of `pid` that is attached (not detached or restoring).
bool serves(const OwnPosd& posd, pid_t pid) {
  const std::string ps = posd.ps();
  return ps.find("\"pid\":" + std::to_string(pid) + ",") != std::string::npos;
}

// ZDTM shape: the unmodified training binary under posd A is migrated to posd B, back to A and to B
// again while it trains, and finishes with exactly the output of an uninterrupted run; after each
// move one posd serves it, the target. Moves 1 and 3 take the live switch (the process stays, only
// its GPU state moves): move 1 the peer switch (the default: no rounds, the device memory handed
// over), move 3 pre-copy rounds through image files (--no-peer); move 2 moves the process too
// (--move-process: pre-copy rounds, then CRIU, the way to another host).
TEST_F(PosdMigrate, AJobMigratedBackAndForthBetweenTwoPosdsFinishesAsIfNeverMoved) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "40000" : "4000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-mig-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", jobs = base + ".jobs", work = base + ".work";
  for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
  std::filesystem::create_directories(work);
  // B keeps a spare session process (posd.spare_session): moves into B restore into it.
  OwnPosd a(base + "-a"), b(base + "-b", "  spare_session: true\n");
  const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "migrated", out_file, jobs, a);
  std::vector<int> reaped;
  for (int i = 0; i < 3; ++i) {
    const OwnPosd& from = i % 2 == 0 ? a : b;
    const OwnPosd& to = i % 2 == 0 ? b : a;
    int code = -1;
    std::string err;
    const bool live = i != 1, peer = i == 0;
    const std::string report = migrate_reaping(cli + " migrate -t " + std::to_string(child) + " --to " + to.socket +
                                                   " --socket " + from.socket + " --max-rounds 3 --work-dir " + work + " --json" +
                                                   (live ? "" : " --move-process") + (i == 2 ? " --no-peer" : ""),
                                               child, &code, &err, &reaped);
    ASSERT_EQ(code, 0) << "move " << i << ": " << err << report << from.log_text() << to.log_text();
    EXPECT_NE(report.find("\"where\":\"target\""), std::string::npos) << report;
    EXPECT_NE(report.find(live ? "\"live\":true" : "\"live\":false"), std::string::npos) << report;
    EXPECT_NE(report.find("\"release_error\":\"\""), std::string::npos) << report;
    EXPECT_NE(report.find(peer ? "\"peer\":true" : "\"peer\":false"), std::string::npos) << report;
    std::smatch m;
    if (peer) {
      // No rounds: the source's session handed its device memory to B's, which copied it.
      EXPECT_NE(report.find("\"rounds\":[],\"stop_reason\":\"peer\""), std::string::npos) << report;
      ASSERT_TRUE(std::regex_search(report, m, std::regex("\"peer_bytes\":([0-9]+)"))) << report;
      EXPECT_GT(std::stoull(m[1].str()), 0u) << report;
      EXPECT_NE(to.log_text().find("from the peer session's memory"), std::string::npos) << to.log_text();
    } else {
      EXPECT_NE(report.find("\"rounds\":[{\"round\":1,"), std::string::npos) << report;
    }
    ASSERT_TRUE(std::regex_search(report, m, std::regex("\"final_bytes\":([0-9]+)"))) << report;
    ASSERT_TRUE(std::regex_search(report, m, std::regex("\"downtime_s\":([0-9.]+)"))) << report;
    EXPECT_GT(std::stod(m[1].str()), 0.0) << report;
    // The live switch keeps the process; moving it ends the original (CRIU restores it under B).
    ASSERT_EQ(reaped.size(), i >= 1 ? 1u : 0u) << "move " << i;
    if (!live) {
      EXPECT_TRUE(WIFSIGNALED(reaped.back()) && WTERMSIG(reaped.back()) == SIGKILL) << reaped.back();
    }
    EXPECT_TRUE(serves(to, child)) << to.ps();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (serves(from, child) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(serves(from, child)) << "two posd serve the job\n" << from.ps();
    // The scratch images go (in the background, once the job runs at the target).
    EXPECT_TRUE(pos::test::empties_within(work, 30)) << report;
    ASSERT_TRUE(pos::process_running(static_cast<uint32_t>(child))) << "the job ended before move " << i + 1 << ": make it longer";
  }
  const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << a.log_text() << b.log_text();
  EXPECT_EQ(read_file(out_file), want);
  // Moves 1 and 3 went into B's spares (A has none).
  const std::string bl = b.log_text();
  size_t into_spare = 0;
  for (size_t at = bl.find("(the spare)"); at != std::string::npos; at = bl.find("(the spare)", at + 1)) ++into_spare;
  EXPECT_EQ(into_spare, 2u) << bl;
  EXPECT_EQ(a.log_text().find("(the spare)"), std::string::npos);
  for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
}

// Every failure leaves exactly one running copy: pos-cli killed after a pre-copy round, after the
// stop with the job left stopped, after CRIU but before the image is complete, after the source
// handed its device memory over (the peer switch), and after the source's copy ended but before the
// target's restore; and a target that refuses the restore. In
// each case the job runs on (or comes back) under posd A only, and finishes with the output of an
// uninterrupted run. Bad targets are refused before anything is asked of the job.
TEST_F(PosdMigrate, AMigrationThatFailsAtAnyPhaseLeavesTheJobRunningExactlyOnce) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-migf-" + std::to_string(::getpid());
  OwnPosd a(base + "-a"), b(base + "-b"), shared(base + "-s", "  isolation: shared\n");
  // A target whose restoring session dies right after it copied the source's memory (the peer switch).
  OwnPosd dying(base + "-d", "", {"env", "POS_FAULT_POINT=restore-peer-copied"});
  size_t releases = 0;
  // "+criu": the same with --move-process (the process moves too, through CRIU). The live switch's
  // own points (after the target was told the job comes, before and after its permit) end with the
  // job at the target: pos-cli's guardian settles it there and releases its session at A.
  // "+files": the live switch through pre-copy rounds and image files (--no-peer); without a suffix,
  // the peer switch (no rounds).
  for (const std::string fault : {"migrate-round+files", "migrate-stopped", "migrate-stopped+files", "migrate-peer-exported",
                                  "migrate-stopped+criu", "criu-dump-running+criu", "job-dump-criu-done+criu",
                                  "migrate-before-restore+criu",
                                  "refusing-target", "refusing-target+criu", "dying-target", "migrate-live-go",
                                  "migrate-live-go+files", "migrate-live-permit"}) {
    const std::string out_file = base + "." + fault + ".out", jobs = base + ".jobs", work = base + ".work";
    for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
    std::filesystem::create_directories(work);
    const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "mig-" + fault, out_file, jobs, a);
    const bool criu = fault.ends_with("+criu"), files = fault.ends_with("+files");
    const std::string point = fault.substr(0, fault.find('+'));
    const bool refusing = point == "refusing-target", dies = point == "dying-target";
    const bool lands_on_b = point == "migrate-live-go" || point == "migrate-live-permit";
    int code = -1;
    std::string err;
    std::vector<int> reaped;
    const std::string report =
        migrate_reaping((refusing || dies ? std::string() : "POS_FAULT_POINT=" + point + " ") + cli + " migrate -t " +
                            std::to_string(child) + " --to " + (refusing ? shared.socket : dies ? dying.socket : b.socket) +
                            " --socket " +
                            a.socket + " --max-rounds 2 --work-dir " + work + " --json" + (criu ? " --move-process" : "") +
                            (files ? " --no-peer" : ""),
                        child, &code, &err, &reaped);
    if (refusing) {
      EXPECT_EQ(code, 3) << err << report;  // back on the source, and said so
      EXPECT_NE(report.find("\"where\":\"source\""), std::string::npos) << report;
      EXPECT_NE(report.find("isolation: shared"), std::string::npos) << report;
    } else if (dies) {
      EXPECT_EQ(code, 3) << err << report;  // the target's session died: back on the source
      EXPECT_NE(report.find("\"where\":\"source\""), std::string::npos) << report;
      EXPECT_NE(report.find("\"peer\":true"), std::string::npos) << report;
      EXPECT_NE(report.find("the restoring session ended before the GPU state was up"), std::string::npos) << report;
    } else {
      EXPECT_EQ(code, 137) << fault << ": " << err << report;  // the fault point killed pos-cli
    }
    // The job is served by A again (at once, or after the guardian's restore), never by B; or, the
    // live switch's late points, by B only (A's session released).
    const OwnPosd& home = lands_on_b ? b : a;
    const OwnPosd& other = lands_on_b ? a : b;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(serves(home, child) && !serves(other, child) && pos::process_running(static_cast<uint32_t>(child))) &&
           std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(child, &st, WNOHANG) == child) reaped.push_back(st);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(serves(home, child)) << fault << ": " << err << home.ps() << home.log_text();
    EXPECT_FALSE(serves(other, child)) << fault << ": " << other.ps() << other.log_text();
    EXPECT_FALSE(serves(shared, child)) << fault;
    EXPECT_FALSE(serves(dying, child)) << fault;
    // A's detached session goes only when the job runs at B (posd logs the release).
    if (lands_on_b) ++releases;
    const std::string al = a.log_text();
    size_t released = 0;
    for (size_t at = al.find("released: the job runs under another posd"); at != std::string::npos;
         at = al.find("released: the job runs under another posd", at + 1))
      ++released;
    EXPECT_EQ(released, releases) << fault << al;
    // Ended and restored (the image was complete) or never ended (it ran on, or moved live).
    const bool ended = criu && (point == "migrate-before-restore" || refusing);
    EXPECT_EQ(reaped.size(), ended ? 1u : 0u) << fault;
    // No scratch is left behind: pos-cli or its guardian removes the rounds' images.
    const auto clean_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::is_empty(work) && std::chrono::steady_clock::now() < clean_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(std::filesystem::is_empty(work)) << fault;
    const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << fault << " " << st << home.log_text();
    EXPECT_EQ(read_file(out_file), want) << fault;
    for (const std::string& p : {out_file, jobs}) std::filesystem::remove_all(p);
  }
  // Refused up front, the job untouched: no target, the job's own posd, another host, a dead socket.
  const std::string out_file = base + ".bad.out", jobs = base + ".jobs";
  const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "mig-bad", out_file, jobs, a);
  for (const auto& [to, says] : std::vector<std::pair<std::string, std::string>>{
           {a.socket, "is the posd the job runs under already"},
           {"10.0.0.1:7070", "--secret-file names the secret"},
           {base + "-none/posd.sock", "the target posd"}}) {
    int code = -1;
    std::string err;
    std::vector<int> reaped;
    (void)migrate_reaping(cli + " migrate -t " + std::to_string(child) + " --to " + to + " --socket " + a.socket, child,
                          &code, &err, &reaped);
    EXPECT_EQ(code, 1) << to;
    EXPECT_NE(err.find(says), std::string::npos) << to << ": " << err;
    EXPECT_TRUE(reaped.empty()) << to;
  }
  EXPECT_TRUE(serves(a, child));
  const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(read_file(out_file), want);
  for (const std::string& p : {out_file, jobs, base + ".work"}) std::filesystem::remove_all(p);
}

// A source that cannot hand the job's device memory over (POS_FAULT_POINT=peer-export-refused in
// its posd, as memory without a shareable handle): the peer switch lets the job back at the source
// and pos-cli migrates it through image files instead, saying why; with --no-fallback it stops
// there (exit 3, the job at the source). Either way the job finishes as if never moved.
TEST_F(PosdMigrate, APeerSwitchTheSourceCannotServeFallsBackToImageFilesUnlessToldNot) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "2000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-migfb-" + std::to_string(::getpid());
  OwnPosd a(base + "-a", "", {"env", "POS_FAULT_POINT=peer-export-refused"}), b(base + "-b");
  for (const bool fallback : {true, false}) {
    const std::string name = fallback ? "fallback" : "no-fallback";
    const std::string out_file = base + "." + name + ".out", jobs = base + ".jobs", work = base + ".work";
    for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
    std::filesystem::create_directories(work);
    const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "mig-" + name, out_file, jobs, a);
    int code = -1;
    std::string err;
    std::vector<int> reaped;
    const std::string report = migrate_reaping(cli + " migrate -t " + std::to_string(child) + " --to " + b.socket +
                                                   " --socket " + a.socket + " --max-rounds 2 --work-dir " + work +
                                                   " --json" + (fallback ? "" : " --no-fallback"),
                                               child, &code, &err, &reaped);
    EXPECT_TRUE(reaped.empty()) << name;  // the process stayed: the live switch, both times
    if (fallback) {
      EXPECT_EQ(code, 0) << err << report;
      EXPECT_NE(report.find("\"where\":\"target\""), std::string::npos) << report;
      EXPECT_NE(report.find("\"peer\":false"), std::string::npos) << report;
      EXPECT_NE(report.find("\"peer_fallback\":\"the export was refused (fault point peer-export-refused)\""),
                std::string::npos)
          << report;
      EXPECT_NE(report.find("\"round\":1,"), std::string::npos) << report;  // through pre-copy rounds
    } else {
      EXPECT_EQ(code, 3) << err << report;
      EXPECT_NE(report.find("\"where\":\"source\""), std::string::npos) << report;
      EXPECT_NE(report.find("\"peer_fallback\":\"\""), std::string::npos) << report;
      EXPECT_NE(report.find("--no-peer copies it through image files instead"), std::string::npos) << report;
    }
    const OwnPosd& home = fallback ? b : a;
    const OwnPosd& other = fallback ? a : b;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(serves(home, child) && !serves(other, child)) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(serves(home, child)) << name << ": " << home.ps() << home.log_text();
    EXPECT_FALSE(serves(other, child)) << name << ": " << other.ps();
    const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << name << " " << st << home.log_text();
    EXPECT_EQ(read_file(out_file), want) << name;
    for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
  }
}

// ---- two GPUs of one host (issue #23; the `multigpu` suite on a machine with two, CI on the host
// backend presenting two devices) ----
using PosdMultiGpu = PosdProcess;

// More `posd:` YAML for a posd that serves GPU `device` only (its sessions see it as device 0).
std::string serving_device(int device) {
  std::string y = "  devices: [" + std::to_string(device) + "]\n  spare_session: true\n";
  if (!on_gpu()) y += "host_backend:\n  device_count: 2\n";
  return y;
}

// The backend device posd's `ps` gives the session of `pid` (-1 when it lists none).
int device_of(const OwnPosd& posd, pid_t pid) {
  const std::string ps = posd.ps();
  std::smatch m;
  if (!std::regex_search(ps, m, std::regex("\"pid\":" + std::to_string(pid) + ",[^}]*\"device\":(-?[0-9]+)"))) return -1;
  return std::stoi(m[1].str());
}

// ZDTM shape: the training job under posd A, which serves GPU 0, is live-migrated to posd B, which
// serves GPU 1, back to A (moving its process too, through CRIU) and to B again while it trains; it
// finishes with exactly the output of an uninterrupted run, and after each move its memory is on
// the target's GPU and one posd serves it.
TEST_F(PosdMultiGpu, AJobMigratedFromGpu0ToGpu1AndBackFinishesAsIfNeverMoved) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "40000" : "4000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-mgpu-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", jobs = base + ".jobs", work = base + ".work";
  for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
  std::filesystem::create_directories(work);
  OwnPosd a(base + "-a", serving_device(0)), b(base + "-b", serving_device(1));
  const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "gpu-to-gpu", out_file, jobs, a);
  const auto first = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (device_of(a, child) < 0 && std::chrono::steady_clock::now() < first) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(device_of(a, child), 0) << a.ps();
  std::vector<int> reaped;
  for (int i = 0; i < 3; ++i) {
    const OwnPosd& from = i % 2 == 0 ? a : b;
    const OwnPosd& to = i % 2 == 0 ? b : a;
    const bool live = i != 1;
    int code = -1;
    std::string err;
    const std::string report = migrate_reaping(cli + " migrate -t " + std::to_string(child) + " --to " + to.socket +
                                                   " --socket " + from.socket + " --max-rounds 3 --work-dir " + work +
                                                   " --json" + (live ? "" : " --move-process"),
                                               child, &code, &err, &reaped);
    ASSERT_EQ(code, 0) << "move " << i << ": " << err << report << from.log_text() << to.log_text();
    EXPECT_NE(report.find("\"where\":\"target\""), std::string::npos) << report;
    // The live moves take the peer switch: the memory is copied GPU to GPU.
    EXPECT_NE(report.find(live ? "\"peer\":true" : "\"peer\":false"), std::string::npos) << report;
    EXPECT_EQ(device_of(to, child), i % 2 == 0 ? 1 : 0) << "move " << i << ": " << to.ps();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (serves(from, child) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(serves(from, child)) << "two posd serve the job\n" << from.ps();
    ASSERT_EQ(reaped.size(), i >= 1 ? 1u : 0u) << "move " << i;
    ASSERT_TRUE(pos::process_running(static_cast<uint32_t>(child))) << "the job ended before move " << i + 1 << ": make it longer";
  }
  const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << a.log_text() << b.log_text();
  EXPECT_EQ(read_file(out_file), want);
  for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
}

// ZDTM shape: the job under posd A (GPU 0) is dumped with pos-cli dump (it ends), restored with
// pos-cli restore into posd B (GPU 1), where it finishes with exactly the output of an
// uninterrupted run.
TEST_F(PosdMultiGpu, AJobDumpedOnGpu0AndRestoredOnGpu1FinishesAsIfNeverStopped) {
  become_subreaper();
  const std::vector<std::string> args{"--steps", on_gpu() ? "20000" : "3000"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-mgpud-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", jobs = base + ".jobs", img = base + ".img";
  for (const std::string& p : {out_file, jobs, img}) std::filesystem::remove_all(p);
  OwnPosd a(base + "-a", serving_device(0)), b(base + "-b", serving_device(1));
  const pid_t child = start_appending_job(preload_env(), train_cmd(args[0] + " " + args[1]), "gpu-dump", out_file, jobs, a);
  // Some steps first, so that the image holds trained state.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(out_file).size() < 200 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  int code = -1;
  std::string err;
  std::vector<int> reaped;
  (void)migrate_reaping(cli + " dump -t " + std::to_string(child) + " -D " + img + " --socket " + a.socket, child, &code,
                        &err, &reaped);
  ASSERT_EQ(code, 0) << err << a.log_text();
  ASSERT_EQ(reaped.size(), 1u) << read_file("/proc/" + std::to_string(child) + "/stat") << err;  // the dump ended it
  const std::string restored = shell(cli + " restore -D " + img + " --socket " + b.socket, &code, &err);
  ASSERT_EQ(code, 0) << err << restored << b.log_text();
  EXPECT_EQ(device_of(b, child), 1) << b.ps();
  EXPECT_FALSE(serves(a, child)) << a.ps();
  const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << b.log_text();
  EXPECT_EQ(read_file(out_file), want);
  for (const std::string& p : {out_file, jobs, img}) std::filesystem::remove_all(p);
}

// posd A here, posd B in a network namespace (pos::test::NetnsPeer, 10.231.N.*): CI's stand-in
// for a second host.
struct NetnsPeer : pos::test::NetnsPeer {
  NetnsPeer() : pos::test::NetnsPeer("pos-mig", "pma", "pmb", 231) {
    EXPECT_TRUE(ok) << "cannot make a network namespace and a veth pair (iproute2, root): " << error;
  }
};

// A TCP relay with delay and loss, in this process: the CI kernel has no netem, so the migration
// link's impairments are made here. Each chunk read on one side is written on the other `delay_ms`
// after it arrived (in order, so the link keeps its rate); every `lose_every`-th chunk is "lost":
// it and all after it wait 200 ms more, as TCP's retransmission after a lost segment holds the
// stream (deterministic, so that a test can count on losses). Connections are relayed to
// TO_IP:TO_PORT; listens on LISTEN_IP, port().
class ImpairedLink {
 public:
  ImpairedLink(const std::string& listen_ip, const std::string& to_ip, int to_port, int delay_ms, int lose_every)
      : to_ip_(to_ip), to_port_(to_port), delay_(delay_ms), lose_every_(lose_every) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, listen_ip.c_str(), &a.sin_addr);
    socklen_t n = sizeof(a);
    if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(listen_, 8) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &n) != 0)
      return;
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~ImpairedLink() {
    stop_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();  // no pump starts after this
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_);
  }
  int port() const { return port_; }
  uint64_t lost() const { return lost_; }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Chunk {
    std::chrono::steady_clock::time_point due;
    std::string data;
  };
  void accept_loop() {
    for (;;) {
      const int in = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (in < 0 || stop_) return;
      const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(to_port_));
      ::inet_pton(AF_INET, to_ip_.c_str(), &a.sin_addr);
      if (::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(in), ::close(out);
        continue;
      }
      std::lock_guard<std::mutex> lk(mu_);
      fds_.push_back(in), fds_.push_back(out);
      threads_.emplace_back([this, in, out] { pump(in, out); });
      threads_.emplace_back([this, in, out] { pump(out, in); });
    }
  }
  // One direction: a reader queues chunks with their due time, this thread's writer sends them.
  void pump(int from, int to) {
    std::mutex qmu;
    std::condition_variable qcv;
    std::deque<Chunk> q;
    bool eof = false;
    uint64_t chunks = 0;
    std::thread reader([&] {
      char buf[65536];
      for (;;) {
        const ssize_t n = ::read(from, buf, sizeof(buf));
        std::lock_guard<std::mutex> lk(qmu);
        if (n <= 0) {
          eof = true;
          qcv.notify_all();
          return;
        }
        auto due = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_);
        if (lose_every_ > 0 && ++chunks % static_cast<uint64_t>(lose_every_) == 0) {
          due += std::chrono::milliseconds(200);
          ++lost_;
        }
        if (!q.empty() && q.back().due > due) due = q.back().due;  // in order
        q.push_back(Chunk{due, std::string(buf, static_cast<size_t>(n))});
        bytes_ += static_cast<uint64_t>(n);
        qcv.notify_all();
      }
    });
    for (;;) {
      std::unique_lock<std::mutex> lk(qmu);
      qcv.wait(lk, [&] { return !q.empty() || eof; });
      if (q.empty()) break;
      Chunk c = std::move(q.front());
      q.pop_front();
      lk.unlock();
      std::this_thread::sleep_until(c.due);
      size_t off = 0;
      while (off < c.data.size()) {
        const ssize_t w = ::send(to, c.data.data() + off, c.data.size() - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += static_cast<size_t>(w);
      }
      if (off < c.data.size()) break;
    }
    ::shutdown(to, SHUT_WR);
    ::shutdown(from, SHUT_RD);
    reader.join();
  }
  std::string to_ip_;
  int to_port_, delay_, lose_every_;
  std::thread acceptor_;
  int listen_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> lost_{0}, bytes_{0};
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// The port a posd says it accepts migrations on (its log, within 10 s: posd answers `ps` first), or "".
std::string migration_port(const OwnPosd& p) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::smatch m;
    const std::string log = p.log_text();
    if (std::regex_search(log, m, std::regex("accepting migrations on [0-9.]+:([0-9]+)"))) return m[1].str();
    if (std::chrono::steady_clock::now() > until) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// ZDTM shape across "hosts": posd A in this network namespace and posd B in another, joined only
// by a veth pair; the job under A is migrated to B over the migration stream (B authenticating
// pos-cli by the shared secret), back to A, and to B again, the last time over a link throttled to
// 400 Mbit/s each way, delayed and with losses (ImpairedLink); it finishes with exactly the output
// of an uninterrupted run. A
// peer with another secret is refused and logged, the job untouched. pos-cli killed after the
// target restored the job but before it committed leaves it running once: the target ends its
// copy as the link closes, pos-cli's guardian brings it back to the source. (CRIU must run in the
// job's own network and mount namespaces, as it would on a real host: B's restores run in this
// test's, through its posd.migration.cli.)
TEST_F(PosdMigrate, AJobMigratedBetweenPosdsInTwoNetworkNamespacesOverTheStreamFinishesAsIfNeverMoved) {
  become_subreaper();
  NetnsPeer net;
  ASSERT_TRUE(net.ok);
  // Its first layer frozen (read only after init): later rounds copy less than round 1, as for the
  // bench's job, so that the rounds can end on posd's estimate ("no-shrink").
  const std::vector<std::string> args{"--steps", on_gpu() ? "40000" : "4000", "--frozen", "1"};
  const std::string want = expected(args), cli = env_or_fail("POS_CLI");
  const std::string base = ::testing::TempDir() + "posd-e2e-migx-" + std::to_string(::getpid());
  const std::string out_file = base + ".out", jobs = base + ".jobs", work = base + ".work", secret = base + ".secret",
                    wrong = base + ".wrong", cli_here = base + ".cli";
  for (const std::string& p : {out_file, jobs, work}) std::filesystem::remove_all(p);
  std::filesystem::create_directories(work);
  std::ofstream(secret) << "a shared secret of this test run " << ::getpid() << "\n";
  std::ofstream(wrong) << "not the secret the posd instances share\n";
  for (const std::string& f : {secret, wrong})
    std::filesystem::permissions(f, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::ofstream(cli_here) << "#!/bin/sh\nexec nsenter --net=/proc/" << ::getpid() << "/ns/net --mount=/proc/" << ::getpid() << "/ns/mnt " << cli << " \"$@\"\n";
  std::filesystem::permissions(cli_here, std::filesystem::perms::owner_all);
  auto listen = [&](const std::string& ip, const std::string& dir) {
    return "  migration:\n    listen: " + ip + ":0\n    secret_file: " + secret + "\n    dir: " + dir + "\n    cli: " + cli_here + "\n";
  };
  // One-shot test hooks of the target (docs/migration.md, "Fault points"): the link drops as the
  // commit arrives, or just after the target committed (its answer lost). Armed by making the file.
  const std::string drop_commit = base + ".drop-commit", drop_answer = base + ".drop-answer", drop_at = base + ".drop-at";
  // And A dies (SIGKILL) as the image the file names begins to arrive: a target posd killed mid-migration.
  const std::string die_at = base + ".die-at";
  // And the target's pos-cli: its restore of the stop's GPU part ahead fails once done.
  const std::string fail_ahead = base + ".fail-ahead";
  ::setenv("POS_RESTORE_AHEAD_FAIL_FILE", fail_ahead.c_str(), 1);
  ::setenv("POS_MIGRATION_DROP_COMMIT_FILE", drop_commit.c_str(), 1);
  ::setenv("POS_MIGRATION_DROP_ANSWER_FILE", drop_answer.c_str(), 1);
  ::setenv("POS_MIGRATION_DROP_AT_FILE", drop_at.c_str(), 1);
  ::setenv("POS_MIGRATION_DIE_AT_FILE", die_at.c_str(), 1);
  OwnPosd a(base + "-a", listen(net.ip_here, base + ".in-a"));
  ::unsetenv("POS_MIGRATION_DIE_AT_FILE");
  // B keeps a spare session: an incoming migration makes it two (the staging takes one, the stop's
  // restore the other).
  OwnPosd b(base + "-b", listen(net.ip_there, base + ".in-b") + "  spare_session: true\n", net.in());
  ::unsetenv("POS_MIGRATION_DROP_COMMIT_FILE");
  ::unsetenv("POS_MIGRATION_DROP_ANSWER_FILE");
  ::unsetenv("POS_MIGRATION_DROP_AT_FILE");
  ::unsetenv("POS_RESTORE_AHEAD_FAIL_FILE");
  const std::string port_a = migration_port(a), port_b = migration_port(b);
  ASSERT_FALSE(port_a.empty()) << a.log_text();
  ASSERT_FALSE(port_b.empty()) << b.log_text();
  const std::string to_a = net.ip_here + ":" + port_a, to_b = net.ip_there + ":" + port_b;
  // On POS's stand-ins for the toolkit's libraries, as the bench runs it: CRIU moves only the job's own pages.
  const pid_t child = start_appending_job(preload_env(true), train_cmd(args[0] + " " + args[1] + " " + args[2] + " " + args[3]), "netns", out_file, jobs, a);
  auto migrate = [&](const OwnPosd& from, const std::string& to, const std::string& secret_file, const std::string& env,
                     int* code, std::string* err, std::vector<int>* reaped, const std::string& extra = "") {
    return migrate_reaping(env + cli + " migrate -t " + std::to_string(child) + " --to " + to + " --secret-file " +
                               secret_file + " --socket " + from.socket + " --max-rounds 3 --work-dir " + work + " --json" + extra,
                           child, code, err, reaped);
  };
  int code = -1;
  std::string err;
  std::vector<int> reaped;
  // The wrong secret: refused by B (and logged there), before anything is asked of the job.
  (void)migrate(a, to_b, wrong, "", &code, &err, &reaped);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("refused: the peer does not hold this posd's migration secret"), std::string::npos) << err;
  EXPECT_NE(b.log_text().find("refused: the peer does not hold"), std::string::npos) << b.log_text();
  EXPECT_TRUE(reaped.empty());
  EXPECT_TRUE(serves(a, child));
  // A -> B, B -> A, A -> B (the last on a slow, delayed and lossy link).
  std::unique_ptr<ImpairedLink> impaired;
  for (int i = 0; i < 3; ++i) {
    const bool toward_b = i % 2 == 0;
    const OwnPosd& from = toward_b ? a : b;
    const OwnPosd& to = toward_b ? b : a;
    std::string where = toward_b ? to_b : to_a;
    if (i == 2) {
      // The CI kernel has no netem: the veth is throttled (tbf), and the stream goes through a relay
      // here that delays it 20 ms each way and holds it 200 ms at every 20th chunk (a lost segment).
      (void)shell("tc qdisc add dev " + net.dev_here + " root tbf rate 400mbit burst 64kb latency 200ms && tc -n " + net.ns +
                      " qdisc add dev " + net.dev_there + " root tbf rate 400mbit burst 64kb latency 200ms",
                  &code, &err);
      ASSERT_EQ(code, 0) << err;
      impaired = std::make_unique<ImpairedLink>(net.ip_here, net.ip_there, std::stoi(port_b), 20, 20);
      ASSERT_GT(impaired->port(), 0);
      where = net.ip_here + ":" + std::to_string(impaired->port());
    }
    const size_t before = reaped.size();
    // Move 2: the target's restore of the stop's GPU part ahead fails (as on a GPU without room
    // for it); the target restores that part from its files once CRIU restored the process.
    if (i == 1) std::ofstream(fail_ahead) << "1";
    // Move 1 with a budget no round fits (1 ms): the rounds end when they would not shrink.
    const std::string report = migrate(from, where, secret, "", &code, &err, &reaped, i == 0 ? " --max-downtime 1" : "");
    if (i == 1) {
      EXPECT_FALSE(std::filesystem::exists(fail_ahead)) << "the hook did not fire";
    }
    if (impaired) {
      EXPECT_GT(impaired->lost(), 0u) << impaired->bytes() << " bytes relayed";  // the losses happened
      impaired.reset();
    }
    ASSERT_EQ(code, 0) << "move " << i << ": " << err << report << from.log_text() << to.log_text();
    EXPECT_NE(report.find("\"where\":\"target\""), std::string::npos) << report;
    EXPECT_NE(report.find("\"remote\":true,\"same_host\":true"), std::string::npos) << report;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(report, m, std::regex("\"final_sent\":([0-9]+)"))) << report;
    EXPECT_GT(std::stoull(m[1].str()), 0u) << report;
    // CPU pre-copy: each round also sent the job's pages, and the stop's CRIU part left the ones
    // still equal to the last round's to them (the target's CRIU read them there).
    EXPECT_GT(json_number(report, "final_criu_pages_to_parent"), 0) << report;
    // The stop's GPU part went while CRIU dumped the process, before the rest of the image.
    EXPECT_GT(json_number(report, "final_sent_early"), 0) << report;
    EXPECT_LT(json_number(report, "final_sent_early"), json_number(report, "final_sent")) << report;
    // Of it, the ranges posd reported written went as it reported them (in parts), not once saved.
    EXPECT_GT(json_number(report, "final_sent_draining"), 0) << report;
    EXPECT_LE(json_number(report, "final_sent_draining"), json_number(report, "final_sent_early")) << report;
    // Its parts: saved, then sent ahead, both within the stop's image phase.
    EXPECT_GT(json_seconds(report, "stop_gpu_part_s"), 0) << report;
    EXPECT_GT(json_seconds(report, "stop_early_send_s"), 0) << report;
    EXPECT_LE(json_seconds(report, "stop_gpu_part_s") + json_seconds(report, "stop_early_send_s"),
              json_seconds(report, "stop_image_s") + 0.001) << report;
    // The target's own phases (its held line): CRIU's restore and the checks before it, within
    // the restore as the source saw it.
    EXPECT_GT(json_seconds(report, "target_criu_s"), 0) << report;
    EXPECT_GT(json_seconds(report, "target_check_s"), 0) << report;
    EXPECT_LE(json_seconds(report, "target_check_s") + json_seconds(report, "target_criu_s"),
              json_seconds(report, "target_restore_s") + 0.001) << report;
    EXPECT_TRUE(std::regex_search(report, m, std::regex("\"round\":1,[^}]*\"criu_bytes\":([0-9]+)"))) << report;
    EXPECT_GT(std::stoull(m[1].str()), 0u) << report;
    EXPECT_LT(std::stoull(m[1].str()), 32ull << 20) << report;  // ~94 MB with the toolkit's libraries
    // Round 1 went to the target as posd wrote it (its device memory is all written there).
    EXPECT_TRUE(std::regex_search(report, m, std::regex("\"round\":1,[^}]*\"streamed\":([0-9]+)"))) << report;
    EXPECT_GT(std::stoull(m[1].str()), 0u) << report;
    // After each round posd estimated what the job had written since its cut: the rounds went on
    // only while that was under 90 % of the round (from round 2 on), and "no-shrink" says they
    // ended on it.
    {
      // Each round: number, bytes, next_estimate, window_s, window_bytes.
      const std::regex round_re("\"round\":([0-9]+),\"bytes\":([0-9]+),[^}]*\"next_estimate\":([0-9]+),"
                                "\"window_s\":([0-9.]+),\"window_bytes\":([0-9]+)\\}");
      std::vector<std::array<double, 5>> rounds;
      for (auto it = std::sregex_iterator(report.begin(), report.end(), round_re); it != std::sregex_iterator(); ++it)
        rounds.push_back({std::stod((*it)[1].str()), std::stod((*it)[2].str()), std::stod((*it)[3].str()),
                          std::stod((*it)[4].str()), std::stod((*it)[5].str())});
      ASSERT_FALSE(rounds.empty()) << report;
      const bool no_shrink = report.find("\"stop_reason\":\"no-shrink\"") != std::string::npos;
      for (size_t r = 1; r + 1 < rounds.size(); ++r) EXPECT_LT(rounds[r][2], 0.9 * rounds[r][1]) << report;
      // Round 1, when the window was measured and round 2 followed: the job wrote less than 90 %
      // of round 1's estimate in it.
      if (rounds.size() > 1 && rounds[0][3] > 0) {
        EXPECT_LT(rounds[0][4], 0.9 * rounds[0][2]) << report;
      }
      if (no_shrink && rounds.size() == 1) {
        // Ended after round 1 on the window: the job rewrote 90 % of its dirty set within it.
        EXPECT_GT(rounds[0][3], 0) << report;
        EXPECT_GE(rounds[0][4], 0.9 * rounds[0][2]) << report;
        EXPECT_GT(rounds[0][2], 0) << report;
      } else if (no_shrink) {
        EXPECT_GE(rounds.back()[2], 0.9 * rounds.back()[1]) << report;
      }
      if (i == 0) {
        // B started a second spare once the source authenticated, before round 1's staging took
        // one; the staging and the stop's restore each went into a spare.
        const std::string bl = b.log_text();
        const size_t staging_at = bl.find("staging round-1");
        ASSERT_NE(staging_at, std::string::npos) << bl;
        EXPECT_GE(spare_pids(bl.substr(0, staging_at)).size(), 2u) << bl;
        EXPECT_NE(bl.find("staging restore of pid " + std::to_string(child)), std::string::npos) << bl;
        const std::regex into_spare("(staging restore|restore) of pid " + std::to_string(child) + " [^\n]*\\(the spare\\)");
        EXPECT_EQ(std::distance(std::sregex_iterator(bl.begin(), bl.end(), into_spare), std::sregex_iterator()), 2) << bl;
        // Once the migration's connection ended, B ended the spare beyond one.
        const std::regex trimmed("spare session process ([0-9]+) ends: the migration it was started for is over");
        std::smatch t;
        std::string now = b.log_text();
        for (int w = 0; w < 1000 && !std::regex_search(now, t, trimmed); ++w) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          now = b.log_text();
        }
        ASSERT_TRUE(std::regex_search(now, t, trimmed)) << now;
        const pid_t gone = std::stoi(t[1].str());
        for (int w = 0; w < 1000 && ::kill(gone, 0) == 0; ++w) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_NE(::kill(gone, 0), 0) << "the ended spare " << gone << " is still there";
        // After round 1 the job had written its trained layers (not the frozen one) since the cut,
        // and it rewrote them all within the time a round 2 would have taken to copy them (its
        // steps take milliseconds here): round 2 would have left the stop as much as it copied, so
        // the rounds ended after round 1.
        ASSERT_EQ(rounds.size(), 1u) << report;
        EXPECT_LT(rounds[0][2], rounds[0][1]) << report;
        EXPECT_TRUE(no_shrink) << report;
      }
    }
    EXPECT_EQ(reaped.size(), before + 1) << "the source's copy was not ended";
    EXPECT_TRUE(serves(to, child)) << to.ps() << to.log_text();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (serves(from, child) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(serves(from, child)) << "two posd serve the job";
    const auto logged_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (to.log_text().find("committed; pid " + std::to_string(child) + " runs here") == std::string::npos &&
           std::chrono::steady_clock::now() < logged_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_NE(to.log_text().find("committed; pid " + std::to_string(child) + " runs here"), std::string::npos) << to.log_text();
    // Every move into this posd restored the GPU part there while CRIU dumped the process and the
    // rest of the image came.
    const auto count = occurrences;
    const std::string to_log = to.log_text();
    // Move 2 only (into A), and the job finishes as if never moved all the same (below).
    EXPECT_EQ(count(to_log, "could not be restored ahead; restored from its files"), i == 1 ? 1u : 0u) << to_log;
    EXPECT_GT(count(to_log, "was restored ahead") + (i == 1 ? 1u : 0u), 0u) << to_log;
    EXPECT_EQ(count(to_log, "was restored ahead") + count(to_log, "could not be restored ahead; restored from its files"),
              count(to_log, "committed; pid ")) << to_log;
    EXPECT_EQ(to_log.find("the restore that began with the GPU part failed"), std::string::npos) << to_log;
    // Round 1 was staged there while the rounds went on, and the restore ahead copied the buffers
    // the job had not written since from the staging session's memory (the rest from files).
    EXPECT_NE(report.find("\"target_staged\":true"), std::string::npos) << report;
    // ... and the source waited for that staging to be ready before it stopped the job.
    EXPECT_NE(report.find("\"stage_ready\":true"), std::string::npos) << report;
    EXPECT_GT(count(to_log, "from the staged image"), 0u) << to_log;
    EXPECT_EQ(count(to_log, "from the staged image"), count(to_log, "committed; pid ")) << to_log;
    EXPECT_GT(count(to_log, "from the staging session's memory"), 0u) << to_log;
    EXPECT_EQ(count(to_log, "staging of pid " + std::to_string(child) + "'s image ended"),
              count(to_log, "from the staging session's memory")) << to_log;
    // Neither side keeps images: the target removes what it received, pos-cli its scratch (its
    // guardian, in the background).
    EXPECT_TRUE(pos::test::empties_within(work, 30)) << report;
    const std::string in = base + (toward_b ? ".in-b" : ".in-a");
    const auto emptied_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!std::filesystem::is_empty(in) && std::chrono::steady_clock::now() < emptied_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(std::filesystem::is_empty(in)) << in;
    ASSERT_TRUE(pos::process_running(static_cast<uint32_t>(child))) << "the job ended before move " << i + 1;
  }
  // pos-cli killed (B -> A) at `fault`, before it committed: A ends the copy it restored or held
  // uncommitted as the link closes, and the guardian brings the job back under B once its pid is
  // free. One copy, back under B. Killed under A's restore, A may also never make a copy (the
  // link can close before its restore starts): what A ended, it says in its log.
  auto killed_before_commit = [&](const std::string& fault, bool a_holds_one) {
    SCOPED_TRACE(fault);
    const size_t before = reaped.size();
    const auto ended = [&] { return occurrences(a.log_text(), "ended before it was committed: ending restored pid"); };
    const size_t ended_before = ended();
    (void)migrate(b, to_a, secret, "POS_FAULT_POINT=" + fault + " ", &code, &err, &reaped);
    EXPECT_EQ(code, 137) << err;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    // A's session of its ended copy goes a moment after that copy's pid is free (which B's restore
    // needs): it is waited for too.
    while (!(serves(b, child) && !serves(a, child) && pos::process_running(static_cast<uint32_t>(child))) &&
           std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(child, &st, WNOHANG) == child) reaped.push_back(st);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(serves(b, child)) << b.log_text() << a.log_text();
    EXPECT_FALSE(serves(a, child)) << a.ps() << a.log_text();
    const size_t ended_at_a = ended() - ended_before;
    if (a_holds_one) {
      EXPECT_EQ(ended_at_a, 1u) << a.log_text();
    }
    EXPECT_LE(ended_at_a, 1u) << a.log_text();
    EXPECT_EQ(reaped.size(), before + 1 + ended_at_a) << "the source's copy ends, and A's uncommitted one if it made one\n"
                                                      << a.log_text();
  };
  killed_before_commit("migrate-target-restoring", false);  // the link closes under A's restore
  killed_before_commit("migrate-before-commit", true);      // A holds the job, restored
  EXPECT_NE(a.log_text().find("ended before it was committed"), std::string::npos) << a.log_text();
  auto wait_served = [&](const OwnPosd& by, const OwnPosd& not_by, std::vector<int>* reaped_so_far) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (!(serves(by, child) && !serves(not_by, child) && pos::process_running(static_cast<uint32_t>(child))) &&
           std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(child, &st, WNOHANG) == child) reaped_so_far->push_back(st);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return serves(by, child) && !serves(not_by, child);
  };
  // pos-cli killed just after it sent the commit (B -> A): only A knows the outcome; pos-cli's
  // guardian asks it (a new connection), hears "committed", and leaves the job to A.
  {
    const size_t before = reaped.size();
    (void)migrate(b, to_a, secret, "POS_FAULT_POINT=migrate-commit-sent ", &code, &err, &reaped);
    EXPECT_EQ(code, 137) << err;
    EXPECT_TRUE(wait_served(a, b, &reaped)) << a.log_text() << b.log_text();
    const auto logged_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (a.log_text().find(": committed") == std::string::npos && std::chrono::steady_clock::now() < logged_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_NE(a.log_text().find("ended: committed"), std::string::npos) << a.log_text();
    EXPECT_EQ(reaped.size(), before + 1) << "only the source's copy ends";
    const auto emptied_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::is_empty(work) && std::chrono::steady_clock::now() < emptied_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(std::filesystem::is_empty(work)) << "the guardian leaves no scratch once the target has the job";
  }
  // The target commits but its answer is lost (A -> B): pos-cli asks B, which says committed.
  {
    std::ofstream(drop_answer) << "1";
    const size_t before = reaped.size();
    const std::string report = migrate(a, to_b, secret, "", &code, &err, &reaped);
    EXPECT_EQ(code, 0) << err << report << b.log_text();
    EXPECT_NE(report.find("\"where\":\"target\""), std::string::npos) << report;
    EXPECT_NE(report.find("\"commit_answer_lost\":true"), std::string::npos) << report;
    EXPECT_FALSE(std::filesystem::exists(drop_answer)) << "the hook did not fire";
    EXPECT_TRUE(wait_served(b, a, &reaped)) << b.log_text();
    EXPECT_EQ(reaped.size(), before + 1);
  }
  // The link drops as the commit reaches the target (B -> A): A ends its held copy; pos-cli asks
  // A, hears "ended", and restores the job on B (exit 3): one copy, under B.
  {
    std::ofstream(drop_commit) << "1";
    const size_t before = reaped.size();
    const std::string report = migrate(b, to_a, secret, "", &code, &err, &reaped);
    EXPECT_EQ(code, 3) << err << report << a.log_text();
    EXPECT_NE(report.find("\"where\":\"source\""), std::string::npos) << report;
    EXPECT_FALSE(std::filesystem::exists(drop_commit)) << "the hook did not fire";
    EXPECT_TRUE(wait_served(b, a, &reaped)) << a.log_text() << b.log_text();
    EXPECT_NE(a.log_text().find("ended: ended"), std::string::npos) << a.log_text();
    EXPECT_EQ(reaped.size(), before + 2) << "the source's copy and A's held one both end";
  }
  // The link drops while a pre-copy round is sent (B -> A, round 1), then while the stop's image is
  // sent (the job stopped at B): each time the job runs on under B, untouched (permit and SIGCONT
  // after the stop: the job, moved here by earlier migrations, comes back to B, not to the posd it
  // started under).
  for (const std::string at : {"round-1", "final"}) {
    std::ofstream(drop_at) << at << "\n";
    const size_t before = reaped.size();
    auto stagings = [&] { return occurrences(a.log_text(), "staging round-1 for final"); };
    const size_t staged_before = stagings();
    const std::string report = migrate(b, to_a, secret, "", &code, &err, &reaped, " --max-downtime 1");
    EXPECT_EQ(code, 1) << at << ": " << err << report;
    EXPECT_NE(err.find(at == "final" ? "sending the stop's image (the job runs on at the source)"
                                     : "sending pre-copy round 1 (the job runs on at the source)"),
              std::string::npos) << err;
    EXPECT_FALSE(std::filesystem::exists(drop_at)) << "the hook did not fire at " << at;
    EXPECT_TRUE(serves(b, child)) << b.log_text();
    EXPECT_FALSE(serves(a, child));
    EXPECT_EQ(reaped.size(), before) << "the job never ended";
    EXPECT_TRUE(std::filesystem::is_empty(work)) << at;
    // Before the stop's image, round 1 was staged at A; the staging session ended with the
    // migration, its memory with it.
    EXPECT_EQ(stagings(), staged_before + (at == "final" ? 1 : 0)) << a.log_text();
    const auto unstaged_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (a.ps().find("(staged)") != std::string::npos && std::chrono::steady_clock::now() < unstaged_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(a.ps().find("(staged)"), std::string::npos) << at << ": " << a.ps();
    // Still running: its steps go on (the output file grows).
    const auto size0 = std::filesystem::file_size(out_file);
    const auto grew_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::filesystem::file_size(out_file) == size0 && std::chrono::steady_clock::now() < grew_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GT(std::filesystem::file_size(out_file), size0) << "the job does not step after the link dropped at " << at;
  }
  // The target posd killed (kill -9) as the stop's image begins to arrive (B -> A; the job stopped
  // at B, round 1 staged at A): the link closes under the source, which lets the job run on there;
  // A's staging session and the pos-cli it ran end with it (their connections to it close).
  {
    std::ofstream(die_at) << "final\n";
    const size_t before = reaped.size();
    std::set<pid_t> test_children = children_of(::getpid());
    test_children.erase(a.pid);
    size_t orphans_seen = 0;
    const std::string report = migrate(b, to_a, secret, "", &code, &err, &reaped, " --max-downtime 1");
    EXPECT_EQ(code, 1) << err << report;
    EXPECT_NE(err.find("(the job runs on at the source)"), std::string::npos) << err;
    EXPECT_FALSE(std::filesystem::exists(die_at)) << "the hook did not fire";
    for (pid_t p : children_of(::getpid()))
      if (!test_children.count(p) && p != child && p != a.pid) ++orphans_seen;
    int ast = 0;
    pid_t got = 0;  // bounded: a hook that did not fire leaves A running
    for (int w = 0; w < 3000 && (got = waitpid(a.pid, &ast, WNOHANG)) == 0; ++w)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(got, a.pid) << "A did not die";
    EXPECT_TRUE(WIFSIGNALED(ast) && WTERMSIG(ast) == SIGKILL) << ast;
    a.pid = -1;
    EXPECT_TRUE(serves(b, child)) << b.log_text();
    EXPECT_EQ(reaped.size(), before) << "the job never ended";
    // Nothing of A's is left: its session processes (round 1's staging among them) and the
    // pos-cli restore it started end; orphaned, they became this test's children (the subreaper),
    // which reaps them here.
    const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::set<pid_t> left;
    do {
      left.clear();
      for (pid_t p : children_of(::getpid()))
        if (!test_children.count(p) && p != child && ::waitpid(p, nullptr, WNOHANG) != p) left.insert(p);
      if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (!left.empty() && std::chrono::steady_clock::now() < gone_by);
    EXPECT_TRUE(left.empty()) << "A's processes still there: " << left.size() << ", the first " << *left.begin();
    // A died with round 1 staged: the pos-cli holding it was orphaned at least (so this looked at something).
    EXPECT_GE(orphans_seen, 1u);
    const auto size0 = std::filesystem::file_size(out_file);
    const auto grew_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::filesystem::file_size(out_file) == size0 && std::chrono::steady_clock::now() < grew_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GT(std::filesystem::file_size(out_file), size0) << "the job does not step after the target posd died";
  }
  const int st = wait_for_exit(child, std::chrono::seconds(on_gpu() ? 300 : 600));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << a.log_text() << b.log_text();
  EXPECT_EQ(read_file(out_file), want);
  for (const std::string& p : {out_file, jobs, work, secret, wrong, cli_here, base + ".in-a", base + ".in-b", drop_commit, drop_answer, drop_at, die_at})
    std::filesystem::remove_all(p);
}
