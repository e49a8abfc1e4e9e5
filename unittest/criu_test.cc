// criu_test.cc — the CRIU driver (ckpt/criu) in CRIU's ZDTM shape: zdtm_cpu builds CPU state (memory,
// a thread, an open file, a child), the test dumps and restores it, the program checks its state.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <linux/magic.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/criu.h"

extern char** environ;

namespace pos::ckpt {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// Waits (bounded) for `pid`, a child or a restored tree reparented to this subreaper.
int wait_exit(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int st = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  ADD_FAILURE() << "pid " << pid << " did not end in time";
  return -1;
}

// Zombies reparented to this subreaper (the dumped tree's children, which CRIU ended with it) are
// reaped, or their pids would stay taken and a restore could not have them back.
void reap_orphans() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int st = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(-1, &st, WNOHANG);
    if (r < 0) return;  // no children left
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

class Criu : public ::testing::Test {
 protected:
  void SetUp() override {
    // Restored trees are reparented to this process (not to init) so the test can wait for them.
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    auto c = find_criu();
    // No skip: where CRIU cannot run, these tests fail with the reason (docs/setup.md says the fix).
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    criu_ = *c;
    root_ = fs::temp_directory_path() / ("pos-criu-test-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "work");
    fs::create_directories(root_ / "img");
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    fs::remove_all(root_);
  }
  // Starts zdtm_cpu and waits until its state is built.
  void start() {
    const char* prog = std::getenv("POS_ZDTM_CPU");
    ASSERT_NE(prog, nullptr) << "POS_ZDTM_CPU is not set (meson sets it)";
    const std::string work = (root_ / "work").string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char* argv[] = {const_cast<char*>(prog), const_cast<char*>(work.c_str()), nullptr};
    ASSERT_EQ(::posix_spawn(&pid_, prog, &fa, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(root_ / "work" / "ready")) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "zdtm_cpu did not get ready";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Tells the program (or its restored self) to check its state; true if it passed.
  void check(pid_t pid) {
    ASSERT_EQ(::kill(pid, SIGUSR2), 0);
    const int st = wait_exit(pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st << ": " << read_file(root_ / "work" / "result");
    EXPECT_EQ(read_file(root_ / "work" / "result"), "PASS\n");
    fs::remove(root_ / "work" / "result");
  }

  std::string criu_;
  fs::path root_;
  pid_t pid_ = -1;
};

TEST_F(Criu, ADumpedProcessTreeIsGoneAndItsRestoreCarriesOnWithMemoryThreadFileAndChildIntact) {
  start();
  const std::string img = (root_ / "img").string();
  ASSERT_TRUE(criu_dump(criu_, pid_, img, {}).ok());
  const int st = wait_exit(pid_);  // CRIU ends the tree after the dump
  EXPECT_TRUE(WIFSIGNALED(st)) << st;
  const pid_t dumped = pid_;
  pid_ = -1;
  reap_orphans();
  auto r = criu_restore(criu_, img, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, dumped);  // the same pid, as CRIU restores it
  pid_ = *r;
  check(pid_);
  pid_ = -1;
  EXPECT_EQ(read_file(root_ / "work" / "log"), "before\nafter\n");
}

// CRIU reads what it learnt of the kernel from /run/criu.kdat instead of probing it again (30-45 ms
// a run): it keeps the file itself where /run is a tmpfs, and find_criu seeds it, for this boot
// only, where /run is not (ckpt/criu.cc, seed_kdat_cache). A file of another boot is replaced.
TEST_F(Criu, CriuLoadsItsKernelFactsFromACacheOfThisBootInsteadOfProbingEachRun) {
  if (::geteuid() != 0) GTEST_SKIP() << "CRIU reads /run/criu.kdat as root only";
  std::string boot = read_file("/proc/sys/kernel/random/boot_id");
  while (!boot.empty() && boot.back() == '\n') boot.pop_back();
  struct statfs fs {};
  const bool seeded = ::statfs("/run", &fs) == 0 && fs.f_type != TMPFS_MAGIC;
  if (seeded) {
    // Another boot's cache (garbage, as a stale one may be to this kernel) and its stamp.
    { std::ofstream("/run/criu.kdat") << "not this boot's facts"; }
    { std::ofstream("/run/criu.kdat.pos-boot") << "00000000-0000-0000-0000-000000000000\n"; }
  }
  ASSERT_TRUE(find_criu().ok());
  start();
  // Two dumps (the job runs on): on a tmpfs CRIU's first run keeps the file itself.
  for (const char* dir : {"img1", "img2"}) {
    CriuDumpOptions o;
    o.leave_running = true;
    o.verbosity = 4;  // CRIU says where its kernel facts came from at info level
    fs::create_directories(root_ / dir);
    ASSERT_TRUE(criu_dump(criu_, pid_, (root_ / dir).string(), o).ok());
  }
  const std::string log = read_file(root_ / "img2" / "dump.log");
  EXPECT_NE(log.find("Loaded kdat cache from /run/criu.kdat"), std::string::npos) << log.substr(0, 2000);
  if (seeded) {
    EXPECT_EQ(read_file("/run/criu.kdat.pos-boot"), boot + "\n");
    const std::string first = read_file(root_ / "img1" / "dump.log");
    EXPECT_NE(first.find("Loaded kdat cache from /run/criu.kdat"), std::string::npos) << first.substr(0, 2000);
    EXPECT_EQ(first.find("Stale /run/criu.kdat"), std::string::npos) << first.substr(0, 2000);
  }
  check(pid_);
  pid_ = -1;
}

TEST(CriuVerbosity, IsTwoUnlessPosCriuVerbositySaysZeroToFour) {
  const char* was = std::getenv("POS_CRIU_VERBOSITY");
  const std::string saved = was != nullptr ? was : "";
  ::unsetenv("POS_CRIU_VERBOSITY");
  EXPECT_EQ(criu_verbosity(), 2);
  for (const char* v : {"0", "3", "4"}) {
    ::setenv("POS_CRIU_VERBOSITY", v, 1);
    EXPECT_EQ(criu_verbosity(), v[0] - '0') << v;
  }
  for (const char* v : {"5", "-1", "44", "", "four"}) {
    ::setenv("POS_CRIU_VERBOSITY", v, 1);
    EXPECT_EQ(criu_verbosity(), 2) << "'" << v << "'";
  }
  if (was != nullptr) ::setenv("POS_CRIU_VERBOSITY", saved.c_str(), 1);
  else ::unsetenv("POS_CRIU_VERBOSITY");
}

TEST_F(Criu, ALeaveRunningDumpLetsTheOriginalFinishAndItsImageRestoresAfterwards) {
  start();
  const std::string img = (root_ / "img").string();
  CriuDumpOptions o;
  o.leave_running = true;
  std::vector<std::pair<uint64_t, uint64_t>> seen;  // progress: (written, expected)
  o.progress = [&](uint64_t d, uint64_t e) { seen.emplace_back(d, e); };
  const uint64_t estimate = tree_memory_bytes(pid_);
  EXPECT_GE(estimate, 4u << 20) << "zdtm_cpu and its child hold several MiB of memory";
  ASSERT_TRUE(criu_dump(criu_, pid_, img, o).ok());
  ASSERT_FALSE(seen.empty());
  for (const auto& [d, e] : seen) EXPECT_LE(d, e);
  EXPECT_EQ(seen.back().first, dir_file_bytes(img));  // the last report is what was written
  EXPECT_GT(seen.back().first, 1u << 20);
  const pid_t original = pid_;
  check(pid_);  // the original runs on and passes
  pid_ = -1;
  reap_orphans();
  // CRIU restores open files as they were at the dump and checks that each still has its size
  // then: files are the user's to put back (here, the log as it was), as with any CRIU restore.
  fs::resize_file(root_ / "work" / "log", 7);
  auto r = criu_restore(criu_, img, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, original);
  pid_ = *r;
  check(pid_);
  pid_ = -1;
}

TEST_F(Criu, ARestoreWhileTheOriginalStillRunsFailsNamingThePidInUse) {
  start();
  const std::string img = (root_ / "img").string();
  CriuDumpOptions o;
  o.leave_running = true;
  ASSERT_TRUE(criu_dump(criu_, pid_, img, o).ok());
  auto r = criu_restore(criu_, img, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("in use"), std::string::npos) << r.status().message();
  check(pid_);  // the original is untouched
  pid_ = -1;
}

TEST_F(Criu, ADumpOfAPidThatDoesNotExistFailsWithCriusReason) {
  const std::string img = (root_ / "img").string();
  Status s = criu_dump(criu_, 0x3ffffff0, img, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("criu dump of pid"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("Error"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("dump.log"), std::string::npos) << s.message();
}

// A dumped process killed in the middle of the dump can leave CRIU blocked for good (seen with
// CRIU 4.1.1 in CI): once the process has been gone a few seconds, CRIU is ended and the dump
// fails, saying so. The "CRIU" here is a script that never returns.
TEST(CriuHang, ADumpWhoseProcessDiesWhileCriuHangsIsAbandoned) {
  const fs::path dir = fs::temp_directory_path() / ("pos-criu-hang-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "img");
  const fs::path fake = dir / "criu";
  {
    std::ofstream f(fake);
    f << "#!/bin/sh\nexec sleep 600\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  const pid_t victim = ::fork();
  if (victim == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(victim, 0);
  std::thread killer([victim] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(victim, SIGKILL);  // left unreaped: a zombie counts as gone
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = criu_dump(fake.string(), victim, (dir / "img").string(), {});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  killer.join();
  ::waitpid(victim, nullptr, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("abandoned: the process ended during the dump"), std::string::npos) << s.message();
  EXPECT_GE(took, 5.0);  // the grace
  EXPECT_LT(took, 30.0);
  fs::remove_all(dir);
}

TEST(CriuFind, AMissingOrTooOldCriuIsAnErrorNamingTheFix) {
  ::setenv("POS_CRIU", "/nonexistent/criu", 1);
  auto c = find_criu();
  ::unsetenv("POS_CRIU");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tools/setup.sh"), std::string::npos) << c.status().message();
  // A program that is no CRIU >= 4 (it prints no version) is refused as too old.
  ::setenv("POS_CRIU", "/bin/true", 1);
  c = find_criu();
  ::unsetenv("POS_CRIU");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("CRIU >= 4"), std::string::npos) << c.status().message();
}

// A fake CRIU that counts how often each check runs: `check` passes unless the FAIL file exists,
// `check --feature mem_dirty_track` says no.
struct FakeCriu {
  fs::path dir;
  std::string bin, cache;
  explicit FakeCriu(const std::string& name) : dir(fs::path(::testing::TempDir()) / (name + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    bin = (dir / "criu").string(), cache = (dir / "cache").string();
    write_script("4.1.1");
    ::setenv("POS_CRIU", bin.c_str(), 1);
    ::setenv("POS_CRIU_CACHE", cache.c_str(), 1);
  }
  ~FakeCriu() {
    ::unsetenv("POS_CRIU");
    ::unsetenv("POS_CRIU_CACHE");
    fs::remove_all(dir);
  }
  void write_script(const std::string& version) {
    const std::string d = dir.string();
    std::ofstream(bin) << "#!/bin/sh\n"
                       << "case \"$1 $2 $3\" in\n"
                       << "  '--version  ') echo 'Version: " << version << "' ;;\n"
                       << "  'check --feature mem_dirty_track') echo x >> " << d << "/features; exit 1 ;;\n"
                       << "  'check  ') echo x >> " << d << "/checks; [ -e " << d << "/FAIL ] && { echo 'Error: no'; exit 1; }; echo 'Looks good.' ;;\n"
                       << "esac\n";
    fs::permissions(bin, fs::perms::owner_all);
  }
  size_t count(const char* what) const {
    std::ifstream f(dir / what);
    size_t n = 0;
    for (std::string l; std::getline(f, l);) ++n;
    return n;
  }
};

// Runs `body` in a child process (a new pos-cli, with nothing remembered in memory); its exit code.
int in_new_process(const std::function<int()>& body) {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(body());
  int st = 0;
  ::waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(CriuFind, ACriuCheckThatPassedIsRunOncePerBinaryAndBootAcrossProcesses) {
  FakeCriu f("criu-cache-");
  ASSERT_TRUE(find_criu().ok());
  EXPECT_EQ(f.count("checks"), 1u);
  EXPECT_FALSE(criu_tracks_memory(f.bin));
  EXPECT_EQ(f.count("features"), 1u);
  // A later process (another pos-cli) reads what the first learnt.
  EXPECT_EQ(in_new_process([] { return find_criu().ok() ? 0 : 1; }), 0);
  EXPECT_EQ(in_new_process([&] { return criu_tracks_memory(f.bin) ? 1 : 0; }), 0);
  EXPECT_EQ(f.count("checks"), 1u);
  EXPECT_EQ(f.count("features"), 1u);
  // A new binary is checked afresh.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  f.write_script("4.2");
  EXPECT_EQ(in_new_process([] { return find_criu().ok() ? 0 : 1; }), 0);
  EXPECT_EQ(f.count("checks"), 2u);
  // A cache file that someone else could have written is not believed.
  fs::permissions(f.cache, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_write);
  EXPECT_EQ(in_new_process([] { return find_criu().ok() ? 0 : 1; }), 0);
  EXPECT_EQ(f.count("checks"), 3u);
}

TEST(CriuFind, AFailedCriuCheckIsNotRememberedAndItsReasonIsTheError) {
  FakeCriu f("criu-fail-");
  std::ofstream(f.dir / "FAIL") << "";
  for (size_t i = 1; i <= 2; ++i) {
    EXPECT_EQ(in_new_process([] {
                auto c = find_criu();
                return !c.ok() && c.status().message().find("check failed (Error: no)") != std::string::npos ? 0 : 1;
              }),
              0);
    EXPECT_EQ(f.count("checks"), i);
  }
  fs::remove(f.dir / "FAIL");
  EXPECT_EQ(in_new_process([] { return find_criu().ok() ? 0 : 1; }), 0);
  EXPECT_EQ(f.count("checks"), 3u);
}

}  // namespace
}  // namespace pos::ckpt
