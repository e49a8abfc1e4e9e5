// usage_region_test.cc — the shared usage region (remoting/common/usage_region.h) across real
// processes: joins, a process killed with SIGKILL forgotten at once, a lock holder killed mid-hold,
// a process restored under its pid, a full region, and files that are not a region.
#include "remoting/common/usage_region.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "remoting/common/process_info.h"

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
  // A child that joins with `used` bytes, says so on a pipe, and stays until killed.
  pid_t joined_child(uint64_t used) {
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
        if ((*r)->join(e).ok()) ok = 'y';
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

}  // namespace
