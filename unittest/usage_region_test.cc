// usage_region_test.cc — the shared usage region (remoting/common/usage_region.h) across real
// processes: joins, a process killed with SIGKILL forgotten at once, a lock holder killed mid-hold,
// a process restored under its pid, a full region, and files that are not a region; and the
// GPU-time scheduler's turns, driven with a clock of the test's own (shares, idle and busy holders,
// a holder killed, the shares' sum).
#include "remoting/common/usage_region.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include "remoting/common/process_info.h"
#include "remoting/server/metrics.h"

namespace {

namespace fs = std::filesystem;

class UsageRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pos-usage-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = pos::usage_region_path(dir_.string());
  }
  void TearDown() override {
    for (pid_t p : children_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    fs::remove_all(dir_);
  }
  // A child that joins with `used` bytes on device 0, does `then` with its slot (which must say
  // yes), says so on a pipe, and stays until killed.
  pid_t joined_child(uint64_t used, const std::function<bool(pos::UsageRegion&, int)>& then = {}) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    const pid_t c = ::fork();
    if (c == 0) {
      ::close(p[0]);
      auto r = pos::UsageRegion::open(path_);
      char ok = 'n';
      if (r.ok()) {
        pos::UsageRegion::Entry e;
        e.pid = static_cast<uint32_t>(::getpid());
        e.start_time = pos::process_start_time(e.pid);
        e.device = 0;
        e.memory_used = used;
        auto slot = (*r)->join(e);
        if (slot.ok() && (!then || then(**r, *slot))) ok = 'y';
      }
      (void)!::write(p[1], &ok, 1);
      for (;;) ::pause();
    }
    ::close(p[1]);
    char ok = 0;
    EXPECT_EQ(::read(p[0], &ok, 1), 1);
    ::close(p[0]);
    EXPECT_EQ(ok, 'y');
    children_.push_back(c);
    return c;
  }
  static std::vector<uint32_t> pids(const std::vector<pos::UsageRegion::Entry>& es) {
    std::vector<uint32_t> out;
    for (const auto& e : es) out.push_back(e.pid);
    return out;
  }

  fs::path dir_;
  std::string path_;
  std::vector<pid_t> children_;
  std::vector<int> pipes_;  // write ends that keep children waiting
};

TEST_F(UsageRegionTest, ProcessesThatJoinAreListedWithTheirUsageAndOneKilledWithSigkillIsForgottenAtOnce) {
  const pid_t a = joined_child(1 << 20), b = joined_child(2 << 20), c = joined_child(3 << 20);
  auto r = pos::UsageRegion::open(path_);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto all = (*r)->list();
  ASSERT_EQ(all.size(), 3u);
  uint64_t total = 0;
  for (const auto& e : all) total += e.memory_used;
  EXPECT_EQ(total, 6u << 20);
  ::kill(b, SIGKILL);
  ::waitpid(b, nullptr, 0);
  all = (*r)->list();
  EXPECT_EQ(pids(all), (std::vector<uint32_t>{static_cast<uint32_t>(a), static_cast<uint32_t>(c)}));
  total = 0;
  for (const auto& e : all) total += e.memory_used;
  EXPECT_EQ(total, 4u << 20);  // b's 2 MiB are back
  // This process joins, updates its own slot without the lock, and leaves.
  pos::UsageRegion::Entry me;
  me.pid = static_cast<uint32_t>(::getpid());
  me.start_time = pos::process_start_time(me.pid);
  auto slot = (*r)->join(me);
  ASSERT_TRUE(slot.ok());
  (*r)->set_used(*slot, 5 << 20);
  (*r)->set_limit(*slot, 8 << 20);
  all = (*r)->list();
  ASSERT_EQ(all.size(), 3u);
  bool seen = false;
  for (const auto& e : all)
    if (e.pid == me.pid) seen = e.memory_used == (5u << 20) && e.memory_limit == (8u << 20);
  EXPECT_TRUE(seen);
  (*r)->leave(*slot);
  EXPECT_EQ((*r)->list().size(), 2u);
}

TEST_F(UsageRegionTest, AProcessKilledWhileHoldingTheLockDoesNotStopTheOthersFromJoining) {
  { auto made = pos::UsageRegion::open(path_); ASSERT_TRUE(made.ok()); }
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    // The mutex is at byte 64 of the file (docs/limits.md): taken, and never given back.
    const int fd = ::open(path_.c_str(), O_RDWR);
    void* base = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int rc = pthread_mutex_lock(reinterpret_cast<pthread_mutex_t*>(static_cast<char*>(base) + 64));
    const char ok = rc == 0 ? 'y' : 'n';
    (void)!::write(p[1], &ok, 1);
    for (;;) ::pause();
  }
  char ok = 0;
  ASSERT_EQ(::read(p[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  auto r = pos::UsageRegion::open(path_);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  pos::UsageRegion::Entry me;
  me.pid = static_cast<uint32_t>(::getpid());
  me.start_time = pos::process_start_time(me.pid);
  auto slot = (*r)->join(me);
  EXPECT_TRUE(slot.ok()) << slot.status().to_string();
  EXPECT_EQ((*r)->list().size(), 1u);
  ::close(p[0]);
  ::close(p[1]);
}

// A process CRIU restored has the pid of the one that joined but another start time: the slot is
// not its own, and reaping frees it.
TEST_F(UsageRegionTest, AnEntryWhosePidNowNamesALaterProcessIsNotHeldAndIsFreed) {
  auto r = pos::UsageRegion::open(path_);
  ASSERT_TRUE(r.ok());
  pos::UsageRegion::Entry old;
  old.pid = static_cast<uint32_t>(::getpid());
  old.start_time = pos::process_start_time(old.pid) + 12345;
  auto slot = (*r)->join(old);
  ASSERT_TRUE(slot.ok());
  EXPECT_FALSE((*r)->holds(*slot, old.pid, pos::process_start_time(old.pid)));
  EXPECT_TRUE((*r)->list().empty());
  EXPECT_FALSE((*r)->holds(*slot, old.pid, old.start_time));  // freed by the list's reaping
}

TEST_F(UsageRegionTest, AFullRegionRefusesAnotherJoinByName) {
  auto r = pos::UsageRegion::open(path_);
  ASSERT_TRUE(r.ok());
  pos::UsageRegion::Entry me;
  me.pid = static_cast<uint32_t>(::getpid());
  me.start_time = pos::process_start_time(me.pid);
  for (uint32_t i = 0; i < pos::UsageRegion::kSlots; ++i) ASSERT_TRUE((*r)->join(me).ok()) << i;
  auto more = (*r)->join(me);
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.status().message().find("has no free slot"), std::string::npos) << more.status().to_string();
}

TEST_F(UsageRegionTest, FilesThatAreNotThisUsersRegionAreRefusedByNameAndLeftAsTheyAre) {
  const auto write = [&](const std::string& bytes) {
    fs::remove(path_);
    std::ofstream(path_, std::ios::binary) << bytes;
  };
  auto good = pos::UsageRegion::open(path_);
  ASSERT_TRUE(good.ok());
  const size_t size = fs::file_size(path_);
  good->reset();
  struct Case {
    std::string bytes, says;
  };
  std::string foreign(size, 'x'), old_version(size, '\0');
  std::string magic = "POSUSAGE";
  old_version.replace(0, 8, magic);
  old_version[8] = 9;  // version 9
  for (const Case& c : std::vector<Case>{{"short", "has 5 bytes"},
                                          {foreign, "is not a POS usage region"},
                                          {old_version, "is of version 9"}}) {
    write(c.bytes);
    auto r = pos::UsageRegion::open(path_);
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().to_string();
    EXPECT_EQ(fs::file_size(path_), c.bytes.size());  // untouched
  }
  // Another user's, and a symbolic link, are not followed or used.
  write(std::string(size, '\0'));
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path_.c_str(), 65534, 65534), 0);
    auto r = pos::UsageRegion::open(path_);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("belongs to uid 65534"), std::string::npos) << r.status().to_string();
  }
  fs::remove(path_);
  fs::create_symlink("/etc/passwd", path_);
  auto linked = pos::UsageRegion::open(path_);
  EXPECT_FALSE(linked.ok());
}

// The region posd keeps for several users (posd.usage_region, a job's POS_USAGE_REGION;
// docs/limits.md): posd's own, shared with its group (0660). A job of another user opens it only
// through that group; not when the file is open to every user, not when the user is not in the
// group, and never makes it; what such a job joins is what posd's user sees.
TEST_F(UsageRegionTest, ARegionPosdKeepsIsUsedByAnotherUsersJobOnlyThroughItsGroupAndNeverMadeByIt) {
  using Access = pos::UsageRegion::Access;
  const std::string kept = (dir_ / "kept").string();
  auto missing = pos::UsageRegion::open(kept, Access::kKept);
  ASSERT_FALSE(missing.ok());
  EXPECT_FALSE(fs::exists(kept));  // a job never makes the keeper's region
  const long gid = 65533;
  ASSERT_TRUE(pos::UsageRegion::keep(kept, ::geteuid() == 0 ? gid : -1).ok());
  struct stat st {};
  ASSERT_EQ(::stat(kept.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, ::geteuid() == 0 ? 0660u : 0600u);
  if (::geteuid() != 0) return;  // the other user's side needs root to become one
  EXPECT_EQ(st.st_gid, static_cast<gid_t>(gid));
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  // A process of uid 65534 with (or without) group 65533 opens it and joins; it answers on a pipe
  // ('y' joined, else the error), then stays until the pipe closes.
  const auto as_other_user = [&](bool in_group, std::string* said) -> pid_t {
    int to[2], from[2];
    EXPECT_EQ(::pipe(to), 0);
    EXPECT_EQ(::pipe(from), 0);
    const pid_t c = ::fork();
    if (c == 0) {
      ::close(to[1]);
      ::close(from[0]);
      const gid_t groups[1] = {static_cast<gid_t>(gid)};
      if (::setgroups(in_group ? 1 : 0, groups) != 0 || ::setgid(65532) != 0 || ::setuid(65534) != 0) ::_exit(3);
      auto r = pos::UsageRegion::open(kept, Access::kKept);
      std::string out = "y";
      if (!r.ok()) out = r.status().message();
      else {
        pos::UsageRegion::Entry e;
        e.pid = static_cast<uint32_t>(::getpid());
        e.start_time = pos::process_start_time(e.pid);
        e.device = 0;
        e.memory_used = 12345;
        if (auto slot = (*r)->join(e); !slot.ok()) out = slot.status().message();
      }
      (void)!::write(from[1], out.data(), out.size());
      ::close(from[1]);
      char b;
      (void)!::read(to[0], &b, 1);
      ::_exit(0);
    }
    ::close(to[0]);
    ::close(from[1]);
    char buf[512];
    const ssize_t n = ::read(from[0], buf, sizeof(buf));
    ::close(from[0]);
    *said = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    children_.push_back(c);
    pipes_.push_back(to[1]);
    return c;
  };
  std::string said;
  const pid_t member = as_other_user(true, &said);
  EXPECT_EQ(said, "y");
  auto own = pos::UsageRegion::open(kept);  // posd's user: its own region
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  bool seen = false;
  for (const auto& e : (*own)->list()) seen |= e.pid == static_cast<uint32_t>(member) && e.memory_used == 12345;
  EXPECT_TRUE(seen);
  as_other_user(false, &said);  // the file's mode keeps it out before POS looks
  EXPECT_NE(said.find("this user is not in it"), std::string::npos) << said;
  ASSERT_EQ(::chmod(kept.c_str(), 0660), 0);
  ASSERT_EQ(::chown(kept.c_str(), static_cast<uid_t>(-1), 65531), 0);  // another group, which the user is not in
  as_other_user(true, &said);
  EXPECT_NE(said.find("this user is not in it"), std::string::npos) << said;
  ASSERT_EQ(::chown(kept.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)), 0);
  ASSERT_EQ(::chmod(kept.c_str(), 0666), 0);
  as_other_user(true, &said);
  EXPECT_NE(said.find("is open to every user (mode 0666)"), std::string::npos) << said;
  for (int fd : pipes_) ::close(fd);
}

// ---- GPU-time shares -----------------------------------------------------------------------

class ShareTest : public UsageRegionTest {
 protected:
  void SetUp() override {
    UsageRegionTest::SetUp();
    auto r = pos::UsageRegion::open(path_);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    r_ = std::move(*r);
  }
  // A slot of this process (slots of one pid are as good as slots of several for the turns).
  int job(int device, uint32_t share) {
    pos::UsageRegion::Entry e;
    e.pid = static_cast<uint32_t>(::getpid());
    e.start_time = pos::process_start_time(e.pid);
    auto slot = r_->join(e);
    EXPECT_TRUE(slot.ok());
    r_->set_device(*slot, device);
    if (share != 0) {
      EXPECT_TRUE(r_->set_share(*slot, share).ok());
    }
    return *slot;
  }
  // Jobs that always want the GPU, asking every 100 µs of the test's clock from `from` for
  // `seconds`; a job told to yield does so at once (its queued work done). Per job, the time it
  // held the turn.
  std::vector<uint64_t> contend(const std::vector<int>& jobs, uint64_t from, double seconds) {
    std::vector<uint64_t> held(jobs.size(), 0);
    const uint64_t step = 100'000;
    for (uint64_t now = from; now < from + uint64_t(seconds * 1e9); now += step) {
      for (size_t j = 0; j < jobs.size(); ++j) {
        auto p = r_->pass(jobs[j], 0, now);
        if (p == pos::UsageRegion::Pass::kYield) r_->yield(jobs[j], 0, now);
      }
      const int h = r_->holder(0);
      for (size_t j = 0; j < jobs.size(); ++j)
        if (jobs[j] == h) held[j] += step;
    }
    return held;
  }
  std::unique_ptr<pos::UsageRegion> r_;
};

TEST_F(ShareTest, TheSharesOfOneGpuCannotAddUpPastTheWholeGpuAndEachGpuCountsApart) {
  const int a = job(0, 700), b = job(0, 0), c = job(0, 0), d = job(1, 0);
  EXPECT_TRUE(r_->set_share(b, 300).ok());
  pos::Status over = r_->set_share(c, 100);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.message().find("GPU 0's time is already shared out"), std::string::npos) << over.to_string();
  EXPECT_NE(over.message().find("would make 110%"), std::string::npos) << over.to_string();
  EXPECT_EQ(r_->set_share(c, 1001).code(), pos::Code::kInvalidArgument);
  EXPECT_TRUE(r_->set_share(d, 900).ok());  // GPU 1 is another GPU
  EXPECT_TRUE(r_->set_share(b, 200).ok());  // a job's own share is not counted twice
  EXPECT_TRUE(r_->set_share(c, 100).ok());
  r_->leave(a);
  EXPECT_TRUE(r_->set_share(c, 800).ok());
  bool seen = false;
  for (const auto& e : r_->list())
    if (e.device == 1) seen = e.share == 900;
  EXPECT_TRUE(seen);
}

TEST_F(ShareTest, AGpuIsContendedOnlyWithTwoJobsOnItAndAShareAmongThem) {
  const int a = job(0, 0);
  EXPECT_FALSE(r_->contended(0));
  const int b = job(0, 0);
  EXPECT_FALSE(r_->contended(0));  // no shares: the GPU's own time-slicing
  ASSERT_TRUE(r_->set_share(a, 300).ok());
  EXPECT_TRUE(r_->contended(0));
  EXPECT_FALSE(r_->contended(1));
  r_->leave(b);
  EXPECT_FALSE(r_->contended(0));  // alone: never held back
  EXPECT_FALSE(r_->contended(-1));
  EXPECT_FALSE(r_->contended(int(pos::UsageRegion::kDevices)));
}

TEST_F(ShareTest, TwoJobsThatAlwaysWantTheGpuHoldItForTheirSharesAndPsSeesTheRecentShares) {
  const int a = job(0, 700), b = job(0, 300);
  const uint64_t from = pos::steady_now_ns() - 10'000'000'000ull;  // ten seconds ago, to end "now"
  const auto held = contend({a, b}, from, 9.9);
  const double share_a = double(held[0]) / double(held[0] + held[1]);
  EXPECT_NEAR(share_a, 0.70, 0.01) << held[0] << " " << held[1];
  int32_t recent_a = -1, recent_b = -1;
  uint64_t gpu_a = 0;
  // Both slots are this process's: the ring tells them apart by pid only, so check the sum.
  for (const auto& e : r_->list()) {
    if (e.share == 700) recent_a = e.recent_share, gpu_a = e.gpu_ns;
    if (e.share == 300) recent_b = e.recent_share;
  }
  EXPECT_EQ(recent_a, recent_b);  // one pid: all of the turns
  EXPECT_GE(recent_a, 990);
  EXPECT_NEAR(double(gpu_a), double(held[0]), 0.02 * double(held[0]));
}

TEST_F(ShareTest, FourJobsGetTheirSharesAndOneWithoutAShareGetsWhatIsLeft) {
  const int a = job(0, 400), b = job(0, 300), c = job(0, 200), d = job(0, 0);
  const auto held = contend({a, b, c, d}, 1'000'000'000ull, 10);
  uint64_t all = 0;
  for (uint64_t h : held) all += h;
  const double want[] = {0.4, 0.3, 0.2, 0.1};
  for (size_t j = 0; j < 4; ++j) EXPECT_NEAR(double(held[j]) / double(all), want[j], 0.015) << j;
}

TEST_F(ShareTest, AJobThatOverranItsTurnGetsLessNextSoThatTheSharesHoldOverTime) {
  const int a = job(0, 500), b = job(0, 500);
  // a's queued work takes 40 ms to finish every time it yields (its turn is 25 ms): the time it
  // holds counts to the end of that, and b gets the turns a took.
  std::vector<uint64_t> held(2, 0);
  const uint64_t step = 100'000;
  uint64_t now = 1'000'000'000ull;
  for (int i = 0; i < 100000; ++i, now += step) {
    for (int j : {a, b}) {
      if (r_->pass(j, 0, now) != pos::UsageRegion::Pass::kYield) continue;
      if (j == a) {
        r_->begin_drain(a, 0);
        EXPECT_EQ(r_->pass(b, 0, now + 30'000'000), pos::UsageRegion::Pass::kWait);  // draining: not idle
        held[0] += 40'000'000;
        now += 40'000'000;
      }
      r_->yield(j, 0, now);
    }
    const int h = r_->holder(0);
    held[h == a ? 0 : 1] += step;
  }
  EXPECT_NEAR(double(held[0]) / double(held[0] + held[1]), 0.5, 0.03) << held[0] << " " << held[1];
}

TEST_F(ShareTest, AnIdleHolderLosesItsTurnToAWaitingJobAndAJobAloneKeepsItsTurnPastItsEnd) {
  const int a = job(0, 300), b = job(0, 700);
  const uint64_t t0 = 5'000'000'000ull;
  ASSERT_EQ(r_->pass(a, 0, t0), pos::UsageRegion::Pass::kGo);  // nobody's turn: a's
  ASSERT_EQ(r_->holder(0), a);
  // Alone in wanting the GPU, a goes on past its 15 ms turn.
  EXPECT_EQ(r_->pass(a, 0, t0 + 100'000'000), pos::UsageRegion::Pass::kGo);
  EXPECT_EQ(r_->holder(0), a);
  // b asks while a is launching: it waits; a stops launching: 2 ms later b has the turn.
  EXPECT_EQ(r_->pass(b, 0, t0 + 100'500'000), pos::UsageRegion::Pass::kWait);
  EXPECT_EQ(r_->pass(b, 0, t0 + 101'900'000), pos::UsageRegion::Pass::kWait);
  EXPECT_EQ(r_->pass(b, 0, t0 + 102'200'000), pos::UsageRegion::Pass::kGo);
  EXPECT_EQ(r_->holder(0), b);
  EXPECT_EQ(r_->pass(a, 0, t0 + 102'300'000), pos::UsageRegion::Pass::kWait);
}

TEST_F(ShareTest, AHolderWaitingOnItsOwnWorkKeepsItsTurnButNotForMoreThanASecondPastItsEnd) {
  const int a = job(0, 500), b = job(0, 500);
  const uint64_t t0 = 5'000'000'000ull;
  ASSERT_EQ(r_->pass(a, 0, t0), pos::UsageRegion::Pass::kGo);
  r_->busy(a, +1, t0);  // a synchronize that does not come back (a stopped job, say)
  EXPECT_EQ(r_->pass(b, 0, t0 + 20'000'000), pos::UsageRegion::Pass::kWait);
  EXPECT_EQ(r_->pass(b, 0, t0 + 900'000'000), pos::UsageRegion::Pass::kWait);
  EXPECT_EQ(r_->pass(b, 0, t0 + 25'000'000 + 1'000'000'000 + 1), pos::UsageRegion::Pass::kGo);
  r_->busy(a, -1, t0 + 1'100'000'000);
  EXPECT_EQ(r_->pass(b, 0, t0 + 1'099'000'000), pos::UsageRegion::Pass::kGo);  // b launches in its turn
  EXPECT_EQ(r_->pass(a, 0, t0 + 1'100'000'000), pos::UsageRegion::Pass::kWait);
  // b leaves (its process ends): the turn goes to a, which waits, at once.
  r_->leave(b);
  EXPECT_EQ(r_->holder(0), a);
}

TEST_F(ShareTest, ATurnHeldByAProcessKilledWithSigkillGoesToTheWaitingJob) {
  const int mine = job(0, 400);
  const pid_t c = joined_child(0, [](pos::UsageRegion& r, int slot) {
    const uint64_t now = pos::steady_now_ns();
    if (!r.set_share(slot, 600).ok() || r.pass(slot, 0, now) != pos::UsageRegion::Pass::kGo) return false;
    r.busy(slot, +1, now);  // killed inside a launch
    return true;
  });
  const uint64_t now = pos::steady_now_ns();
  EXPECT_EQ(r_->pass(mine, 0, now), pos::UsageRegion::Pass::kWait);
  ::kill(c, SIGKILL);
  ::waitpid(c, nullptr, 0);
  // Gone: the next reaping (anyone's join or list) frees its slot and its turn.
  EXPECT_EQ(r_->list().size(), 1u);
  EXPECT_EQ(r_->pass(mine, 0, now + 1'000'000), pos::UsageRegion::Pass::kGo);
  EXPECT_EQ(r_->holder(0), mine);
}

// posd's metrics endpoint exports what the region holds: each in-process job's memory against its
// limit and its share (docs/metrics.md).
TEST_F(ShareTest, PosdsMetricsCarryEachJobsMemoryLimitAndShareFromTheRegion) {
  const int a = job(0, 700), b = job(0, 0);
  r_->set_used(a, 3 << 20);
  r_->set_limit(a, 8 << 20);
  (void)b;
  pos::MetricsInput in;
  in.backend = "host";
  in.usage = pos::usage_for(dir_.string());
  ASSERT_EQ(in.usage.size(), 2u);
  const std::string text = pos::render_metrics(in);
  const std::string me = "{pid=\"" + std::to_string(::getpid()) + "\",device=\"0\"} ";
  EXPECT_NE(text.find("# TYPE pos_job_gpu_share gauge\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pos_job_memory_limit_bytes" + me + "8388608\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pos_job_device_memory_bytes" + me + "3145728\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pos_job_gpu_share" + me + "0.69999999999999996\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pos_job_gpu_share" + me + "0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pos_job_recent_gpu_share" + me + "-1\n"), std::string::npos) << text;
  // No region: no samples, and none is made.
  EXPECT_TRUE(pos::usage_for(dir_.string() + "/none").empty());
  EXPECT_FALSE(fs::exists(dir_ / "none"));
}

}  // namespace
