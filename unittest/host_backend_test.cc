// host_backend_test.cc — the host backend's launch check on its own: which kernel pointer arguments
// a client may pass (its own buffers and variables, null, one past an end) and which fail the launch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pos/backend.h"
#include "pos/backends/host/host_backend.h"
#include "pos/base/cuda_errors.h"
#include "pos/base/hex.h"
#include "pos/config.h"
#include "unittest/test_kernels.h"

namespace pos {
namespace {

constexpr uint64_t kRange = 1ull << 30;

// Two clients of one host backend, side by side in this process as under posd, each with a kernel
// module loaded; A has a 4 KiB buffer and a 16-byte variable, B a buffer of its own.
class HostLaunchCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    Config c;
    // Sanitizer setups move the window (see unittest/meson.build); follow them.
    if (const char* v = std::getenv("POS_TEST_VA_BASE")) c.va_base = std::strtoull(v, nullptr, 0);
    backend_ = host::make_host_backend(c);
    base_ = c.va_base;
    for (int i = 0; i < 2; ++i) {
      auto cl = backend_->open_client(base_ + i * kRange, kRange, 0, 0);
      ASSERT_TRUE(cl.ok()) << cl.status().to_string();
      clients_[i] = std::move(cl.value());
      auto m = clients_[i]->module_load({});
      ASSERT_TRUE(m.ok());
      module_[i] = *m;
    }
    buf_ = base_ + 0x10000;
    var_ = base_ + 0x20000;
    other_ = base_ + kRange + 0x10000;
    ASSERT_TRUE(a().alloc_at(buf_, 4096).ok());
    ASSERT_TRUE(a().var_bind(module_[0], "coeffs", var_, 16).ok());
    ASSERT_TRUE(clients_[1]->alloc_at(other_, 4096).ok());
    ASSERT_TRUE(clients_[1]->memset(other_, 0x3C, 4096, 0, true).ok());
    fill_ = function(kTestFillName);
    axpy_ = function(kTestAxpyName);
    scale_ = function(kTestScaleStructName);
  }
  void TearDown() override {
    for (auto& c : clients_) c.reset();
  }

  BackendClient& a() { return *clients_[0]; }
  BackendObj function(const char* name) {
    auto f = a().function_get(module_[0], name);
    EXPECT_TRUE(f.ok() && f->found) << name;
    return f.ok() ? f->obj : 0;
  }
  // test_fill(out, value, n): writes out[0..n) from one block of n threads.
  Status fill(uint64_t out, int n) {
    std::vector<std::byte> p(16);
    const unsigned value = 9;
    std::memcpy(p.data(), &out, 8);
    std::memcpy(p.data() + 8, &value, 4);
    std::memcpy(p.data() + 12, &n, 4);
    return launch(fill_, p, n);
  }
  // test_axpy(y, x, a, n): y[i] = a * x[i] + y[i].
  Status axpy(uint64_t y, uint64_t x, int n) {
    std::vector<std::byte> p(24);
    const float alpha = 2.0f;
    std::memcpy(p.data(), &y, 8);
    std::memcpy(p.data() + 8, &x, 8);
    std::memcpy(p.data() + 16, &alpha, 4);
    std::memcpy(p.data() + 20, &n, 4);
    return launch(axpy_, p, n);
  }
  Status launch(BackendObj f, const std::vector<std::byte>& p, int threads) {
    const LaunchDims d{{1, 1, 1}, {static_cast<uint32_t>(threads > 0 ? threads : 1), 1, 1}, 0};
    Status s = a().launch(f, d, p, 0);
    EXPECT_TRUE(a().synchronize_all().ok());
    return s;
  }
  std::vector<uint8_t> bytes(BackendClient& c, uint64_t addr, uint64_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_TRUE(c.memcpy_d2h(out.data(), addr, n).ok());
    return out;
  }
  static void expect_refused(const Status& s, uint64_t addr, const std::string& param, const char* kernel) {
    EXPECT_EQ(s.api_error(), cuda::kErrorIllegalAddress) << s.to_string();
    EXPECT_NE(s.message().find(param), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(kernel), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(hex(addr)), std::string::npos) << s.message();
  }

  std::unique_ptr<DeviceBackend> backend_;
  std::unique_ptr<BackendClient> clients_[2];
  BackendObj module_[2] = {0, 0};
  uint64_t base_ = 0, buf_ = 0, var_ = 0, other_ = 0;
  BackendObj fill_ = 0, axpy_ = 0, scale_ = 0;
};

TEST_F(HostLaunchCheck, NullAnAddressInsideABufferOrVariableAndOnePastTheEndPassButOneByteFurtherDoesNot) {
  EXPECT_TRUE(fill(0, 0).ok());                       // null: CUDA lets a kernel take it
  EXPECT_TRUE(fill(buf_, 16).ok());                   // a buffer's start
  EXPECT_TRUE(fill(buf_ + 4096 - 64, 16).ok());       // its last bytes
  EXPECT_TRUE(fill(buf_ + 4096, 0).ok());             // one past its end (an end iterator)
  EXPECT_TRUE(fill(var_ + 4, 3).ok());                // inside a variable
  EXPECT_TRUE(fill(var_ + 16, 0).ok());               // one past the variable's end
  const std::vector<uint8_t> got = bytes(a(), buf_, 4096);
  EXPECT_EQ(got[0], 9);                               // the kernels that passed ran
  EXPECT_EQ(got[4096 - 64], 9);
  // One byte beyond the end is no longer the buffer's, although the page behind it is mapped.
  expect_refused(fill(buf_ + 4097, 0), buf_ + 4097, "parameter 0", kTestFillName);
  expect_refused(fill(var_ + 17, 0), var_ + 17, "parameter 0", kTestFillName);
}

TEST_F(HostLaunchCheck, AWildHostOrOtherClientsAddressFailsTheLaunchWithIllegalAddressAndNoThreadRuns) {
  ASSERT_TRUE(a().memset(buf_, 0, 4096, 0, true).ok());
  std::vector<float> host(64, 1.0f);
  const uint64_t wild = 0x1000, foreign = other_ + 128, host_addr = reinterpret_cast<uint64_t>(host.data());
  // x (parameter 1) is the bad one; y is A's own buffer and must not see a single write.
  for (uint64_t bad : {wild, foreign, host_addr, base_ + 0x30000 /* unallocated, in A's range */}) {
    SCOPED_TRACE(hex(bad));
    expect_refused(axpy(buf_, bad, 64), bad, "parameter 1", kTestAxpyName);
    expect_refused(fill(bad, 64), bad, "parameter 0", kTestFillName);
  }
  EXPECT_EQ(bytes(a(), buf_, 4096), std::vector<uint8_t>(4096, 0));
  EXPECT_EQ(host, std::vector<float>(64, 1.0f));
  EXPECT_EQ(bytes(*clients_[1], other_, 4096), std::vector<uint8_t>(4096, 0x3C));
  // A freed buffer is no longer the client's.
  ASSERT_TRUE(a().alloc_at(base_ + 0x40000, 4096).ok());
  ASSERT_TRUE(a().free_at(base_ + 0x40000, 4096).ok());
  expect_refused(fill(base_ + 0x40000, 1), base_ + 0x40000, "parameter 0", kTestFillName);
  // The client is not poisoned: a correct launch right after runs.
  EXPECT_TRUE(axpy(buf_, buf_ + 2048, 64).ok());
}

TEST_F(HostLaunchCheck, APointerMemberOfAStructParameterIsCheckedToo) {
  const std::vector<float> ones(16, 1.0f);
  ASSERT_TRUE(a().memcpy_h2d(buf_, ones.data(), sizeof(float) * ones.size()).ok());
  auto scale = [&](uint64_t data) {
    ScaleArgs s{};
    std::memcpy(&s.data, &data, 8);
    s.n = 16;
    s.factor = 3.0f;
    std::vector<std::byte> p(sizeof s);
    std::memcpy(p.data(), &s, sizeof s);
    return launch(scale_, p, 16);
  };
  expect_refused(scale(0x1000), 0x1000, "parameter 0", kTestScaleStructName);
  expect_refused(scale(other_), other_, "parameter 0", kTestScaleStructName);
  EXPECT_EQ(bytes(*clients_[1], other_, 4096), std::vector<uint8_t>(4096, 0x3C));
  ASSERT_TRUE(scale(buf_).ok());
  std::vector<float> got(16);
  ASSERT_TRUE(a().memcpy_d2h(got.data(), buf_, sizeof(float) * got.size()).ok());
  EXPECT_EQ(got, std::vector<float>(16, 3.0f));
}

}  // namespace
}  // namespace pos
