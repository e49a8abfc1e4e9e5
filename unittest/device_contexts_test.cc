// device_contexts_test.cc — DeviceContexts (remoting/server/job_dump.h), the checkpointer's kept
// context of an in-process job's device, against the fake driver's counted primary contexts.
#include <gtest/gtest.h>
#include <dlfcn.h>

#include <cstdlib>
#include <memory>

#include "remoting/server/job_dump.h"

namespace {

class DeviceContextsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("POS_FAKE_CUDA");
    ASSERT_NE(path, nullptr) << "POS_FAKE_CUDA names the fake driver";
    driver_ = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(driver_, nullptr) << ::dlerror();
    refs_ = reinterpret_cast<int (*)(int)>(::dlsym(driver_, "fake_primary_refs"));
    calls_ = reinterpret_cast<int (*)(const char*)>(::dlsym(driver_, "fake_calls"));
    ASSERT_NE(refs_, nullptr);
    ASSERT_NE(calls_, nullptr);
    ASSERT_EQ(refs_(0), 0);
    ASSERT_EQ(refs_(1), 0);
  }
  void* driver_ = nullptr;
  int (*refs_)(int) = nullptr;
  int (*calls_)(const char*) = nullptr;
};

TEST_F(DeviceContextsTest, KeepsOneContextOfADeviceHoweverOftenAskedAndLetsItGoAtTheEnd) {
  const int retains = calls_("cuDevicePrimaryCtxRetain");
  {
    pos::DeviceContexts kept;
    EXPECT_EQ(kept.device(), -1);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(kept.keep(driver_, 0).ok());
    EXPECT_EQ(kept.device(), 0);
    EXPECT_EQ(refs_(0), 1);
    EXPECT_EQ(calls_("cuDevicePrimaryCtxRetain") - retains, 1) << "retained once for three asks";
  }
  EXPECT_EQ(refs_(0), 0) << "let go with the keeper";
}

TEST_F(DeviceContextsTest, AJobOnAnotherDeviceMovesTheKeptContextThereAndLetsTheOldOneGo) {
  pos::DeviceContexts kept;
  ASSERT_TRUE(kept.keep(driver_, 0).ok());
  ASSERT_TRUE(kept.keep(driver_, 1).ok());
  EXPECT_EQ(kept.device(), 1);
  EXPECT_EQ(refs_(0), 0) << "no context left on the GPU the job left";
  EXPECT_EQ(refs_(1), 1);
}

TEST_F(DeviceContextsTest, AContextTheDriverRefusesLeavesTheKeptOneAsItWas) {
  pos::DeviceContexts kept;
  ASSERT_TRUE(kept.keep(driver_, 0).ok());
  const pos::Status bad = kept.keep(driver_, 99);  // the fake has no device 99
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("cuDevicePrimaryCtxRetain failed"), std::string::npos) << bad.message();
  EXPECT_EQ(kept.device(), 0);
  EXPECT_EQ(refs_(0), 1);
}

TEST_F(DeviceContextsTest, ADriverWithoutPrimaryContextsIsRefusedAndNothingIsKept) {
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(libc, nullptr);
  pos::DeviceContexts kept;
  const pos::Status no = kept.keep(libc, 0);
  EXPECT_FALSE(no.ok());
  EXPECT_EQ(kept.device(), -1);
  EXPECT_EQ(refs_(0), 0);
  ::dlclose(libc);
}

}  // namespace
