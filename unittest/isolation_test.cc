// isolation_test.cc — bad input and cross-client access: each gets the error a real CUDA runtime
// returns, and nothing else changes (other buffers, other clients, later calls).
#include "pos/base/hex.h"
#include "unittest/api_fixture.h"

namespace pos::test {
namespace {

class IsolationTest : public ApiTest {
 protected:
  void SetUp() override {
    ApiTest::SetUp();
    add_client("test-b");
    a_buf_ = alloc(4096, 0);
    b_buf_ = alloc(4096, 1);
    ASSERT_TRUE(api(0).memset(a_buf_, 0xAA, 4096).ok());
    ASSERT_TRUE(api(1).memset(b_buf_, 0xBB, 4096).ok());
  }
  // Nothing changed: both clients' buffers keep their bytes and both clients still work.
  void expect_unchanged() {
    EXPECT_EQ(download<uint8_t>(a_buf_, 4096, 0), std::vector<uint8_t>(4096, 0xAA));
    EXPECT_EQ(download<uint8_t>(b_buf_, 4096, 1), std::vector<uint8_t>(4096, 0xBB));
    uint64_t p = 0;
    EXPECT_TRUE(api(0).malloc(&p, 16).ok());
    EXPECT_TRUE(api(0).free(p).ok());
  }
  uint64_t a_buf_ = 0, b_buf_ = 0;
};

TEST_F(IsolationTest, ClientsGetDisjointAddressRanges) {
  EXPECT_NE(a_buf_, b_buf_);
  const uint64_t dist = a_buf_ > b_buf_ ? a_buf_ - b_buf_ : b_buf_ - a_buf_;
  EXPECT_GE(dist, ws_->config().va_size / 2);
}

TEST_F(IsolationTest, ClientCannotReadAnotherClientsBuffer) {
  std::vector<uint8_t> out(4096, 0);
  Status s = api(0).memcpy(reinterpret_cast<uint64_t>(out.data()), b_buf_, 4096, cuda::kMemcpyDeviceToHost);
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(out, std::vector<uint8_t>(4096, 0));
  // Disguised as host memory: a default-kind or host-to-host copy naming B's buffer is refused too.
  EXPECT_EQ(api(0).memcpy(reinterpret_cast<uint64_t>(out.data()), b_buf_, 64, cuda::kMemcpyDefault).api_error(),
            cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).memcpy(b_buf_, reinterpret_cast<uint64_t>(out.data()), 64, cuda::kMemcpyHostToHost).api_error(),
            cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).memcpy(a_buf_, b_buf_, 64, cuda::kMemcpyHostToDevice).api_error(), cuda::kErrorInvalidValue);
  PointerAttributes pa{};
  EXPECT_EQ(api(0).pointer_get_attributes(&pa, b_buf_).api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(out, std::vector<uint8_t>(4096, 0));
  expect_unchanged();
}

TEST_F(IsolationTest, ClientCannotWriteFreeOrLaunchOnAnotherClientsBuffer) {
  EXPECT_EQ(api(0).memset(b_buf_, 0, 16).api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).free(b_buf_).api_error(), cuda::kErrorInvalidValue);
  auto p = args(client(0).fill, b_buf_, 1u, 16);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(1, 16), 0, p).api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).memcpy(a_buf_, b_buf_, 16, cuda::kMemcpyDeviceToDevice).api_error(), cuda::kErrorInvalidValue);
  expect_unchanged();
}

// Hole 1 of "Tenant isolation and daemon hardening": a pointer argument outside the POS window
// looks like an integer to the parser, so it reached the host kernel, which runs inside posd. The
// host backend now checks every pointer parameter against the client's own buffers; the failure is
// asynchronous, as a device fault is (the launch returns, the next synchronize reports it).
TEST_F(IsolationTest, AKernelPointerAtAWildHostOrOtherClientsAddressIsRefusedAndEveryoneCarriesOn) {
  if (backend_name() != "host")
    GTEST_SKIP() << "the pointer check is the host backend's; isolating clients on a GPU is separate work";
  // Host memory: this process's own in-process, posd's (the test runs it in this process) through
  // posd. Either way no device memory of the client's, so no kernel may write it.
  std::vector<unsigned> host(1024, 0x5C5C5C5Cu);
  const uint64_t wild = 0x1000;
  for (uint64_t bad : {reinterpret_cast<uint64_t>(host.data()), wild}) {
    SCOPED_TRACE(hex(bad));
    auto p = args(client(0).fill, bad, 7u, 1024);
    ASSERT_TRUE(api(0).launch_kernel(client(0).fill.handle, dims(4, 256), 0, p).ok());
    Status s = api(0).device_synchronize();
    EXPECT_EQ(s.api_error(), cuda::kErrorIllegalAddress) << s.to_string();
    EXPECT_NE(s.message().find(kTestFillName), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("parameter 0"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(hex(bad)), std::string::npos) << s.message();
    (void)api(0).get_last_error();  // taken: the client goes on, as after any asynchronous error
  }
  EXPECT_EQ(host, std::vector<unsigned>(1024, 0x5C5C5C5Cu));
  // The second pointer of a kernel is checked too, and a refused launch runs no thread at all:
  // y (client 0's own buffer) keeps its bytes although x is the bad one.
  const uint64_t y = alloc(64 * sizeof(float), 0);
  const std::vector<float> ones(64, 1.0f);
  upload(y, ones.data(), 64 * sizeof(float), 0);
  auto ax = args(client(0).axpy, y, wild, 2.0f, 64);
  ASSERT_TRUE(api(0).launch_kernel(client(0).axpy.handle, dims(1, 64), 0, ax).ok());
  Status s = api(0).device_synchronize();
  EXPECT_EQ(s.api_error(), cuda::kErrorIllegalAddress) << s.to_string();
  EXPECT_NE(s.message().find("parameter 1"), std::string::npos) << s.message();
  (void)api(0).get_last_error();
  EXPECT_EQ(download<float>(y, 64, 0), ones);
  // Another client's live buffer lies in the POS window: the parser refuses it at the launch.
  auto pb = args(client(0).fill, b_buf_, 7u, 1024);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(4, 256), 0, pb).api_error(), cuda::kErrorInvalidValue);
  // Both clients carry on: B's bytes are bit-exact, and a correct kernel computes the right result
  // in each.
  expect_unchanged();
  for (size_t ci : {size_t{0}, size_t{1}}) {
    const uint64_t out = alloc(1024 * sizeof(unsigned), ci);
    auto good = args(client(ci).fill, out, 100u, 1024);
    ASSERT_TRUE(api(ci).launch_kernel(client(ci).fill.handle, dims(4, 256), 0, good).ok());
    ASSERT_TRUE(api(ci).device_synchronize().ok());
    const std::vector<unsigned> got = download<unsigned>(out, 1024, ci);
    for (unsigned i = 0; i < 1024; ++i) ASSERT_EQ(got[i], 100u + i) << "client " << ci << " element " << i;
  }
}

TEST_F(IsolationTest, ClientCannotUseAnotherClientsStreamOrFunction) {
  uint64_t sb = 0;
  ASSERT_TRUE(api(1).stream_create(&sb).ok());
  EXPECT_EQ(api(0).stream_synchronize(sb).api_error(), cuda::kErrorInvalidResourceHandle);
  auto p = args(client(1).fill, a_buf_, 1u, 16);
  EXPECT_EQ(api(0).launch_kernel(client(1).fill.handle, dims(1, 16), 0, p).api_error(), cuda::kErrorInvalidDeviceFunction);
  expect_unchanged();
}

TEST_F(IsolationTest, UnknownApiIdIsRejected) {
  Status s = ws_->pos_process(0x7777, client(0).uuid, {}, nullptr, 0);
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidValue);
  EXPECT_NE(s.message().find("unknown api"), std::string::npos);
  expect_unchanged();
}

TEST_F(IsolationTest, UnknownClientIsAnErrorNotAHang) {
  Status s = ws_->pos_process(static_cast<uint32_t>(ApiId::kDeviceSynchronize), 0xdead0001, {}, nullptr, 0);
  EXPECT_EQ(s.code(), Code::kNotFound);
  const uint64_t uuid = client(1).uuid;
  ASSERT_TRUE(ws_->remove_client(uuid).ok());
  s = ws_->pos_process(static_cast<uint32_t>(ApiId::kDeviceSynchronize), uuid, {}, nullptr, 0);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(ws_->remove_client(uuid).code(), Code::kNotFound);
}

TEST_F(IsolationTest, WrongParameterCountOrSizeIsRejected) {
  const uint64_t one = 1;
  const uint32_t small = 1;
  Param too_few[] = {param_of(one)};
  EXPECT_EQ(api(0).raw(ApiId::kMemcpy, too_few).api_error(), cuda::kErrorInvalidValue);
  Param wrong_size[] = {param_of(small)};
  EXPECT_EQ(api(0).raw(ApiId::kMalloc, wrong_size).api_error(), cuda::kErrorInvalidValue);
  Param too_many[] = {param_of(one), param_of(one)};
  EXPECT_EQ(api(0).raw(ApiId::kFree, too_many).api_error(), cuda::kErrorInvalidValue);
  // A launch whose parameter buffer does not match the kernel's layout.
  std::vector<std::byte> short_params(8);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(1, 1), 0, short_params).api_error(), cuda::kErrorInvalidValue);
  // A result buffer too small for the result.
  uint8_t tiny = 0;
  EXPECT_EQ(api(0).raw(ApiId::kGetDeviceProperties, std::array<Param, 1>{param_of(int32_t{0})}, &tiny, 1).code(),
            Code::kInvalidArgument);
  expect_unchanged();
}

TEST_F(IsolationTest, UseAfterFreeAndDoubleFreeAreRejected) {
  const uint64_t d = alloc(256, 0);
  ASSERT_TRUE(api(0).free(d).ok());
  std::vector<uint8_t> out(16);
  EXPECT_EQ(api(0).memcpy(reinterpret_cast<uint64_t>(out.data()), d, 16, cuda::kMemcpyDeviceToHost).api_error(),
            cuda::kErrorInvalidValue);
  Status df = api(0).free(d);
  // Before the worker confirms the first free the range is "pending"; after it, it is unknown.
  EXPECT_EQ(df.api_error(), cuda::kErrorInvalidValue);
  auto p = args(client(0).fill, d, 1u, 4);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(1, 4), 0, p).api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).free(a_buf_ + 8).api_error(), cuda::kErrorInvalidValue);  // interior pointer
  expect_unchanged();
}

TEST_F(IsolationTest, OutOfRangeCopiesAreRejectedWithoutPartialWrites) {
  std::vector<uint8_t> src(8192, 0x11);
  EXPECT_EQ(api(0).memcpy(a_buf_, reinterpret_cast<uint64_t>(src.data()), 4097, cuda::kMemcpyHostToDevice).api_error(),
            cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).memcpy(a_buf_ + 4000, reinterpret_cast<uint64_t>(src.data()), 100, cuda::kMemcpyHostToDevice).api_error(),
            cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).memset(a_buf_ + 1, 0, 4096).api_error(), cuda::kErrorInvalidValue);
  EXPECT_EQ(api(0).memcpy(a_buf_, reinterpret_cast<uint64_t>(src.data()), 16, 9).api_error(),
            cuda::kErrorInvalidMemcpyDirection);
  EXPECT_EQ(api(0).memcpy(0, a_buf_, 16, cuda::kMemcpyDeviceToHost).api_error(), cuda::kErrorInvalidValue);
  expect_unchanged();
}

TEST_F(IsolationTest, LaunchOfAnUnregisteredFunctionIsRejected) {
  RegisteredFunction missing;
  ASSERT_TRUE(api(0).register_function(&missing, client(0).module, "_Z13no_such_kernelv").ok());
  EXPECT_FALSE(missing.found);
  Status s = api(0).launch_kernel(missing.handle, dims(1, 1), 0, {});
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidDeviceFunction);
  EXPECT_NE(s.message().find("_Z13no_such_kernelv"), std::string::npos);
  EXPECT_EQ(api(0).launch_kernel(0x1234, dims(1, 1), 0, {}).api_error(), cuda::kErrorInvalidDeviceFunction);
  expect_unchanged();
}

TEST_F(IsolationTest, BadLaunchConfigurationsAndHandlesAreRejected) {
  auto p = args(client(0).fill, a_buf_, 1u, 16);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(0, 16), 0, p).api_error(), cuda::kErrorInvalidConfiguration);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(1, 2048), 0, p).api_error(), cuda::kErrorInvalidConfiguration);
  EXPECT_EQ(api(0).launch_kernel(client(0).fill.handle, dims(1, 16), 0xbad0, p).api_error(),
            cuda::kErrorInvalidResourceHandle);
  EXPECT_EQ(api(0).stream_destroy(0).api_error(), cuda::kErrorInvalidResourceHandle);
  EXPECT_EQ(api(0).event_record(0x42, 0).api_error(), cuda::kErrorInvalidResourceHandle);
  uint64_t s = 0;
  EXPECT_EQ(api(0).stream_create_with_flags(&s, 0x80).api_error(), cuda::kErrorInvalidValue);
  std::vector<std::byte> junk(100, std::byte{0x42});
  uint64_t m = 0;
  EXPECT_EQ(api(0).register_fatbin(&m, junk).api_error(), cuda::kErrorInvalidKernelImage);
  expect_unchanged();
}

}  // namespace
}  // namespace pos::test
