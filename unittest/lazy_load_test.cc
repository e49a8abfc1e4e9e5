// lazy_load_test.cc — the flag of a lazy restore (remoting/driver/lazy_load.h) against recorded
// driver calls: pos-cli's page, the job's registration of it, the waits its streams get.
// The whole path (pos-cli restore --lazy of a running job) is driver_dump_test's.
#include "remoting/driver/lazy_load.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tuple>
#include <vector>

namespace pos::driver {
namespace {

// What the job's driver was asked, for the test to look at.
struct Seen {
  std::vector<void*> registered, unregistered;
  std::vector<std::tuple<CUstream, CUdeviceptr, uint32_t, unsigned>> waits;
  CUresult register_rc = kSuccess, wait_rc = kSuccess;
};
Seen* g_seen = nullptr;

LazyCalls recording_calls() {
  LazyCalls c;
  c.host_register = [](void* p, size_t, unsigned) {
    g_seen->registered.push_back(p);
    return g_seen->register_rc;
  };
  c.host_device_pointer = [](CUdeviceptr* d, void* p, unsigned) {
    *d = reinterpret_cast<uintptr_t>(p) + 0x1000000;  // another address than the host's, as a GPU may give
    return kSuccess;
  };
  c.host_unregister = [](void* p) {
    g_seen->unregistered.push_back(p);
    return kSuccess;
  };
  c.wait_value32 = [](CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
    g_seen->waits.emplace_back(s, a, v, f);
    return g_seen->wait_rc;
  };
  return c;
}

class LazyLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { g_seen = &seen_; }
  void TearDown() override { g_seen = nullptr; }
  Seen seen_;
};

TEST_F(LazyLoadTest, EveryStreamWaitsOnTheDeviceAddressOfTheFlagUntilPosCliSetsIt) {
  auto flag = LazyFlag::make();
  ASSERT_TRUE(flag.ok()) << flag.status().message();
  auto job = LazyLoad::open(recording_calls(), UniqueFd(::dup((*flag)->fd())));
  ASSERT_TRUE(job.ok()) << job.status().message();
  ASSERT_EQ(seen_.registered.size(), 1u);
  const auto device = reinterpret_cast<uintptr_t>(seen_.registered[0]) + 0x1000000;
  CUstream a = reinterpret_cast<CUstream>(uintptr_t{1}), b = reinterpret_cast<CUstream>(uintptr_t{0x50});
  EXPECT_EQ((*job)->hold(a), kSuccess);
  EXPECT_EQ((*job)->hold(b), kSuccess);
  EXPECT_EQ((*job)->holds(), 2u);
  ASSERT_EQ(seen_.waits.size(), 2u);
  for (const auto& [s, addr, value, flags] : seen_.waits) {
    EXPECT_EQ(addr, device);  // the driver's address of the page, not the host's
    EXPECT_EQ(value, kLazyLoaded);
    EXPECT_EQ(flags, 0u);  // greater or equal
  }
  EXPECT_EQ(std::get<0>(seen_.waits[1]), b);
  EXPECT_FALSE((*job)->loaded());
  (*flag)->set();  // pos-cli's store is seen through the job's own mapping of the page
  EXPECT_TRUE((*job)->loaded());
  void* page = seen_.registered[0];
  job->reset();
  ASSERT_EQ(seen_.unregistered.size(), 1u);  // let go of once done
  EXPECT_EQ(seen_.unregistered[0], page);
}

TEST_F(LazyLoadTest, AFailedWaitIsReportedAndNotCounted) {
  auto flag = LazyFlag::make();
  ASSERT_TRUE(flag.ok());
  auto job = LazyLoad::open(recording_calls(), UniqueFd(::dup((*flag)->fd())));
  ASSERT_TRUE(job.ok());
  seen_.wait_rc = 801;
  EXPECT_EQ((*job)->hold(nullptr), 801);
  EXPECT_EQ((*job)->holds(), 0u);
}

TEST_F(LazyLoadTest, AFlagThatIsNotOnePageOfSharedMemoryIsRefusedBeforeTheDriverIsAsked) {
  const int fd = ::memfd_create("not-a-flag", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 3 * kLazyFlagBytes), 0);
  auto job = LazyLoad::open(recording_calls(), UniqueFd(fd));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(seen_.registered.empty());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);  // not memory at all
  ::close(pipe_fds[1]);
  EXPECT_FALSE(LazyLoad::open(recording_calls(), UniqueFd(pipe_fds[0])).ok());
  EXPECT_TRUE(seen_.registered.empty());
}

TEST_F(LazyLoadTest, ADriverThatCannotRegisterOrLacksACallIsRefusedByName) {
  auto flag = LazyFlag::make();
  ASSERT_TRUE(flag.ok());
  seen_.register_rc = 801;
  auto job = LazyLoad::open(recording_calls(), UniqueFd(::dup((*flag)->fd())));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(job.status().message().find("cuMemHostRegister"), std::string::npos) << job.status().message();
  EXPECT_TRUE(seen_.unregistered.empty());  // nothing registered, nothing to let go
  LazyCalls missing = recording_calls();
  missing.wait_value32 = nullptr;
  auto none = LazyLoad::open(missing, UniqueFd(::dup((*flag)->fd())));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("lacks"), std::string::npos);
}

}  // namespace
}  // namespace pos::driver
