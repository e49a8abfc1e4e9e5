// api_test.cc — the API set through the whole pipeline (pos_process → parser → worker → backend).
// Each test states a behaviour a CUDA program relies on and checks it through results on the device.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "pos/base/text.h"
#include "unittest/api_fixture.h"

namespace pos::test {
namespace {

TEST_F(ApiTest, DeviceQueriesDescribeTheBackendDevice) {
  int32_t n = 0, dev = -1, drv = 0, rt = 0, warp = 0;
  ASSERT_TRUE(api().get_device_count(&n).ok());
  EXPECT_GE(n, 1);
  ASSERT_TRUE(api().get_device(&dev).ok());
  EXPECT_EQ(dev, 0);
  ASSERT_TRUE(api().driver_get_version(&drv).ok());
  EXPECT_GE(drv, 12000);
  ASSERT_TRUE(api().runtime_get_version(&rt).ok());
  EXPECT_EQ(rt, 13000);
  ASSERT_TRUE(api().device_get_attribute(&warp, 10, 0).ok());
  EXPECT_EQ(warp, 32);
  DeviceProps p{};
  ASSERT_TRUE(api().get_device_properties(&p, 0).ok());
  EXPECT_GT(p.total_global_mem, 0u);
  EXPECT_EQ(p.warp_size, 32);
  EXPECT_GT(std::string(p.name).size(), 0u);
}

TEST_F(ApiTest, SetDeviceRejectsADeviceThatDoesNotExist) {
  int32_t n = 0;
  ASSERT_TRUE(api().get_device_count(&n).ok());
  Status s = api().set_device(n);
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidDevice);
  EXPECT_TRUE(api().set_device(0).ok());
  int32_t v = 0;
  EXPECT_EQ(api().device_get_attribute(&v, 10, 7).api_error(), cuda::kErrorInvalidDevice);
}

TEST_F(ApiTest, MemcpyRoundTripsBytesThroughDeviceMemory) {
  std::vector<uint8_t> in(100000);
  std::iota(in.begin(), in.end(), 3);
  const uint64_t d = alloc(in.size());
  upload(d, in.data(), in.size());
  EXPECT_EQ(download<uint8_t>(d, in.size()), in);
}

TEST_F(ApiTest, DeviceToDeviceCopyAndMemsetProduceTheExpectedBytes) {
  const uint64_t a = alloc(4096), b = alloc(4096);
  ASSERT_TRUE(api().memset(a, 0x5A, 4096).ok());
  ASSERT_TRUE(api().memcpy(b, a + 96, 1000, cuda::kMemcpyDeviceToDevice).ok());
  ASSERT_TRUE(api().memset_async(b + 10, 0x11, 5, 0).ok());
  auto out = download<uint8_t>(b, 1000);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], (i >= 10 && i < 15) ? 0x11 : 0x5A) << i;
}

TEST_F(ApiTest, DefaultKindInfersDirectionFromTheAddresses) {
  const uint64_t d = alloc(64);
  std::vector<uint32_t> in(16, 0xABCD1234u), out(16, 0);
  ASSERT_TRUE(api().memcpy(d, reinterpret_cast<uint64_t>(in.data()), 64, cuda::kMemcpyDefault).ok());
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(out.data()), d, 64, cuda::kMemcpyDefault).ok());
  EXPECT_EQ(in, out);
}

TEST_F(ApiTest, AsyncCopiesOnAStreamAreOrderedAndStaged) {
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create_with_flags(&s, cuda::kStreamNonBlocking).ok());
  const uint64_t d = alloc(4 * 1024);
  std::vector<float> host(1024, 1.5f), back(1024, 0.0f);
  ASSERT_TRUE(api().memcpy_async(d, reinterpret_cast<uint64_t>(host.data()), 4096, cuda::kMemcpyHostToDevice, s).ok());
  std::fill(host.begin(), host.end(), -7.0f);  // staged: changing the source now must not matter
  ASSERT_TRUE(api().memcpy_async(reinterpret_cast<uint64_t>(back.data()), d, 4096, cuda::kMemcpyDeviceToHost, s).ok());
  ASSERT_TRUE(api().stream_synchronize(s).ok());
  EXPECT_EQ(back, std::vector<float>(1024, 1.5f));
  EXPECT_TRUE(api().stream_query(s).ok());
  EXPECT_TRUE(api().stream_destroy(s).ok());
}

// Bytes no power-of-two stride repeats, so a chunk landing one staging slot off shows.
std::vector<uint8_t> pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + i / 251 + seed);
  return v;
}

// On the CUDA backend, copies of 1 MiB and more from or to pageable memory go through pinned
// staging slots (docs/cuda_backend.md); smaller ones and pinned memory take the driver's path.
// Through posd, the session's arena stages them. Every route must deliver the same bytes.
TEST_F(ApiTest, LargePageableCopiesAtOddSizesAndOffsetsArriveWholeBothWays) {
  const uint64_t n = (64ull << 20) + 12345;
  const std::vector<uint8_t> src = pattern(n + 7, 1);
  const uint64_t d = alloc(n + 4096);
  upload(d + 3, src.data() + 7, n);
  std::vector<uint8_t> back(n + 16, 0xee);
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data() + 5), d + 3, n, cuda::kMemcpyDeviceToHost).ok());
  ASSERT_EQ(std::memcmp(back.data() + 5, src.data() + 7, n), 0);
  for (uint64_t i : {uint64_t{0}, uint64_t{4}, n + 5, n + 15}) ASSERT_EQ(back[i], 0xee) << i;

  // Asynchronous, to pageable memory on a stream: there once the stream is.
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create(&s).ok());
  std::vector<uint8_t> back2(n + 1, 0);
  ASSERT_TRUE(api().memcpy_async(reinterpret_cast<uint64_t>(back2.data() + 1), d + 3, n, cuda::kMemcpyDeviceToHost, s).ok());
  ASSERT_TRUE(api().stream_synchronize(s).ok());
  ASSERT_EQ(std::memcmp(back2.data() + 1, src.data() + 7, n), 0);
  EXPECT_TRUE(api().stream_destroy(s).ok());
}

TEST_F(ApiTest, CopiesAroundTheStagingThresholdAndFromPinnedMemoryStillArriveWhole) {
  const uint64_t d = alloc(8 << 20);
  for (uint64_t n : std::initializer_list<uint64_t>{4097, (1u << 20) - 1, 1u << 20, (1u << 20) + 1, (8u << 20) + 1 - 512}) {
    const std::vector<uint8_t> src = pattern(n + 3, static_cast<uint8_t>(n));
    upload(d + 511, src.data() + 3, n);
    std::vector<uint8_t> back(n + 2, 0xee);
    ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(back.data() + 1), d + 511, n, cuda::kMemcpyDeviceToHost).ok());
    ASSERT_EQ(std::memcmp(back.data() + 1, src.data() + 3, n), 0) << n;
    ASSERT_EQ(back[0], 0xee);
    ASSERT_EQ(back[n + 1], 0xee);
  }
  // Page-locked both ends (cudaMallocHost): the driver's DMA, no staging.
  const uint64_t n = (4ull << 20) + 3;
  auto* in = static_cast<uint8_t*>(pinned_alloc(n + 1));
  auto* out = static_cast<uint8_t*>(pinned_alloc(n + 1));
  ASSERT_NE(in, nullptr);
  ASSERT_NE(out, nullptr);
  const std::vector<uint8_t> src = pattern(n, 9);
  std::memcpy(in + 1, src.data(), n);
  ASSERT_TRUE(api().memcpy(d + 1, reinterpret_cast<uint64_t>(in + 1), n, cuda::kMemcpyHostToDevice).ok());
  ASSERT_TRUE(api().memcpy(reinterpret_cast<uint64_t>(out + 1), d + 1, n, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(std::memcmp(out + 1, src.data(), n), 0);
  pinned_free(in);
  pinned_free(out);
}

TEST_F(ApiTest, KernelLaunchComputesAxpyOnTheDevice) {
  const int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i), y[i] = 1.0f;
  const uint64_t dx = alloc(n * 4), dy = alloc(n * 4);
  upload(dx, x.data(), n * 4);
  upload(dy, y.data(), n * 4);
  const float a = 2.0f;
  auto p = args(client().axpy, dy, dx, a, n);
  ASSERT_TRUE(api().launch_kernel(client().axpy.handle, dims((n + 127) / 128, 128), 0, p).ok());
  auto out = download<float>(dy, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * i + 1.0f);
}

TEST_F(ApiTest, RegisteredLayoutMatchesCudaParameterPacking) {
  const RegisteredFunction& f = client().axpy;
  ASSERT_TRUE(f.found);
  ASSERT_EQ(f.params.size(), 4u);
  EXPECT_EQ(f.params[0].offset, 0u);
  EXPECT_EQ(f.params[1].offset, 8u);
  EXPECT_EQ(f.params[2].offset, 16u);
  EXPECT_EQ(f.params[3].offset, 20u);
  EXPECT_EQ(f.param_bytes, 24u);
  EXPECT_EQ(f.params[1].read_only, 1u);  // const float*
  EXPECT_EQ(f.params[0].read_only, 0u);
}

TEST_F(ApiTest, PointersInsideStructParametersAreFollowed) {
  const int n = 64;
  std::vector<float> v(n, 3.0f);
  const uint64_t d = alloc(n * 4);
  upload(d, v.data(), n * 4);
  ScaleArgs sa{reinterpret_cast<float*>(d), n, 0.5f};
  auto p = args(client().scale_struct, sa);
  ASSERT_TRUE(api().launch_kernel(client().scale_struct.handle, dims(1, 64), 0, p).ok());
  EXPECT_EQ(download<float>(d, n), std::vector<float>(n, 1.5f));
  // The same struct pointing at freed memory is refused at launch.
  ASSERT_TRUE(api().free(d).ok());
  Status s = api().launch_kernel(client().scale_struct.handle, dims(1, 64), 0, p);
  EXPECT_EQ(s.api_error(), cuda::kErrorInvalidValue);
}

TEST_F(ApiTest, OnePastTheEndPointersAreAcceptedAsTheBuffersOwn) {
  const uint64_t d = alloc(4096);
  const uint64_t end = d + 4096;  // an end iterator, as thrust and friends pass them
  auto p = args(client().fill, end, 1u, 0);
  EXPECT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 1), 0, p).ok());
  auto q = args(client().fill, end + 4096, 1u, 0);  // beyond that: refused
  EXPECT_EQ(api().launch_kernel(client().fill.handle, dims(1, 1), 0, q).api_error(), cuda::kErrorInvalidValue);
}

TEST_F(ApiTest, StreamsRunConcurrentlyAndWaitEventOrdersThem) {
  uint64_t s1 = 0, s2 = 0, ev = 0;
  ASSERT_TRUE(api().stream_create_with_flags(&s1, cuda::kStreamNonBlocking).ok());
  ASSERT_TRUE(api().stream_create_with_priority(&s2, cuda::kStreamNonBlocking, -1).ok());
  ASSERT_TRUE(api().event_create_with_flags(&ev, cuda::kEventDisableTiming).ok());
  const int n = 1 << 16;
  const uint64_t d = alloc(n * 4);
  // s1 fills; s2 waits on the event, then adds: the result needs the fill first.
  auto fill = args(client().fill, d, 1000u, n);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(n / 256, 256), s1, fill).ok());
  ASSERT_TRUE(api().event_record(ev, s1).ok());
  ASSERT_TRUE(api().stream_wait_event(s2, ev, 0).ok());
  ASSERT_TRUE(api().memset_async(d, 0, 4, s2).ok());
  ASSERT_TRUE(api().stream_synchronize(s2).ok());
  auto out = download<uint32_t>(d, n);
  EXPECT_EQ(out[0], 0u);  // the memset ran after the fill
  EXPECT_EQ(out[1], 1001u);
  EXPECT_EQ(out[n - 1], 1000u + n - 1);
}

TEST_F(ApiTest, EventsMeasureElapsedTimeAndReportCompletion) {
  uint64_t a = 0, b = 0;
  ASSERT_TRUE(api().event_create(&a).ok());
  ASSERT_TRUE(api().event_create(&b).ok());
  float ms = -1;
  EXPECT_EQ(api().event_elapsed_time(&ms, a, b).api_error(), cuda::kErrorInvalidResourceHandle);  // never recorded
  ASSERT_TRUE(api().event_record(a, 0).ok());
  const uint64_t d = alloc(1 << 20);
  ASSERT_TRUE(api().memset(d, 1, 1 << 20).ok());
  ASSERT_TRUE(api().event_record(b, 0).ok());
  ASSERT_TRUE(api().event_synchronize(b).ok());
  EXPECT_TRUE(api().event_query(b).ok());
  ASSERT_TRUE(api().event_elapsed_time(&ms, a, b).ok());
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);
  uint64_t nt = 0;
  ASSERT_TRUE(api().event_create_with_flags(&nt, cuda::kEventDisableTiming).ok());
  ASSERT_TRUE(api().event_record(nt, 0).ok());
  EXPECT_EQ(api().event_elapsed_time(&ms, a, nt).api_error(), cuda::kErrorInvalidResourceHandle);
  EXPECT_TRUE(api().event_destroy(nt).ok());
  EXPECT_EQ(api().event_query(nt).api_error(), cuda::kErrorInvalidResourceHandle);
}

TEST_F(ApiTest, LegacyDefaultStreamWaitsForBlockingStreams) {
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create(&s).ok());  // blocking stream
  const int n = 1 << 18;
  const uint64_t d = alloc(n * 4);
  auto fill = args(client().fill, d, 7u, n);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(n / 256, 256), s, fill).ok());
  // A sync copy on the legacy stream must see the whole fill.
  auto out = download<uint32_t>(d, n);
  EXPECT_EQ(out[n - 1], 7u + n - 1);
}

TEST_F(ApiTest, SymbolsCanBeWrittenAndReadWithOffsets) {
  uint64_t var = 0;
  ASSERT_TRUE(api().register_var(&var, client().module, "coeffs", 64, false).ok());
  std::vector<float> in(8, 2.5f);
  ASSERT_TRUE(api().memcpy_to_symbol(var, reinterpret_cast<uint64_t>(in.data()), 32, 16, cuda::kMemcpyHostToDevice).ok());
  std::vector<float> out(16, -1);
  ASSERT_TRUE(api().memcpy_from_symbol(reinterpret_cast<uint64_t>(out.data()), var, 64, 0, cuda::kMemcpyDeviceToHost).ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], (i >= 4 && i < 12) ? 2.5f : 0.0f) << i;
  EXPECT_EQ(api().memcpy_to_symbol(var, reinterpret_cast<uint64_t>(in.data()), 32, 40, cuda::kMemcpyHostToDevice).api_error(),
            cuda::kErrorInvalidValue);
  EXPECT_EQ(api().memcpy_to_symbol(var + 4, reinterpret_cast<uint64_t>(in.data()), 4, 0, cuda::kMemcpyHostToDevice).api_error(),
            cuda::kErrorInvalidSymbol);
  // Kernels can use the symbol's device address like any buffer.
  PointerAttributes pa{};
  ASSERT_TRUE(api().pointer_get_attributes(&pa, var).ok());
  EXPECT_EQ(pa.type, cuda::kMemoryTypeDevice);
}

// What a new API's shim entry point uses (docs/adding_an_api.md): no typed method in ApiClient.
TEST_F(ApiTest, GenericCallsByApiIdPackValuesAndNamesAsTheParsersReadThem) {
  uint64_t d = 0;
  ASSERT_TRUE(api().call_ret(ApiId::kMalloc, &d, uint64_t{256}).ok());
  ASSERT_NE(d, 0u);
  ASSERT_TRUE(api().call(ApiId::kMemset, d, int32_t{0x3C}, uint64_t{256}).ok());
  for (uint8_t b : download<uint8_t>(d, 256)) ASSERT_EQ(b, 0x3C);
  int32_t warp = 0;
  ASSERT_TRUE(api().call_ret(ApiId::kDeviceGetAttribute, &warp, int32_t{10}, int32_t{0}).ok());
  EXPECT_EQ(warp, 32);
  // A name goes as its characters, as register_var sends it.
  uint64_t var = 0;
  const std::string name = "coeffs";
  ASSERT_TRUE(api().call_ret(ApiId::kRegisterVar, &var, client().module, name, uint64_t{64}, int32_t{0}).ok());
  PointerAttributes pa{};
  ASSERT_TRUE(api().pointer_get_attributes(&pa, var).ok());
  EXPECT_EQ(pa.type, cuda::kMemoryTypeDevice);
  // A value of another width than the parser reads is refused, not misread.
  EXPECT_EQ(api().call(ApiId::kMemset, d, int64_t{0x3C}, uint64_t{256}).api_error(), cuda::kErrorInvalidValue);
}

TEST_F(ApiTest, PointerAttributesDistinguishDeviceAndHostMemory) {
  const uint64_t d = alloc(256);
  PointerAttributes a{};
  ASSERT_TRUE(api().pointer_get_attributes(&a, d + 10).ok());
  EXPECT_EQ(a.type, cuda::kMemoryTypeDevice);
  EXPECT_EQ(a.device_pointer, d + 10);
  int local = 0;
  ASSERT_TRUE(api().pointer_get_attributes(&a, reinterpret_cast<uint64_t>(&local)).ok());
  EXPECT_EQ(a.type, cuda::kMemoryTypeUnregistered);
}

TEST_F(ApiTest, FunctionAttributesAndOccupancyAreReported) {
  FuncAttributes fa{};
  ASSERT_TRUE(api().func_get_attributes(&fa, client().axpy.handle).ok());
  EXPECT_EQ(fa.max_threads_per_block, 1024);
  ASSERT_TRUE(api().func_set_attribute(client().axpy.handle, 8, 64 << 10).ok());
  ASSERT_TRUE(api().func_get_attributes(&fa, client().axpy.handle).ok());
  EXPECT_EQ(fa.max_dynamic_shared_size_bytes, 64 << 10);
  EXPECT_EQ(api().func_set_attribute(client().axpy.handle, 8, 1 << 30).api_error(), cuda::kErrorInvalidValue);
  int32_t blocks = 0;
  ASSERT_TRUE(api().occupancy(&blocks, client().axpy.handle, 256, 0).ok());
  EXPECT_EQ(blocks, 8);
  ASSERT_TRUE(api().occupancy_with_flags(&blocks, client().axpy.handle, 1024, 0, 0).ok());
  EXPECT_EQ(blocks, 2);
  EXPECT_EQ(api().occupancy(&blocks, client().axpy.handle, 0, 0).api_error(), cuda::kErrorInvalidValue);
}

// A kernel's or a symbol's name is the client's choice. An error that names it reaches the app
// and, through posd, posd's log: it carries the name as printable() text, never its raw bytes.
TEST_F(ApiTest, ErrorsThatNameAClientsKernelOrSymbolShowTheNameAsPrintableText) {
  const std::string hostile = "no_such\x1b[2J\a\x9b";  // ESC[2J clears a terminal; BEL; a byte that is not UTF-8
  const std::string shown = "no_such\\x1b[2J\\x07\\x9b";
  auto names_it_printably = [&](const Status& s, const char* what) {
    EXPECT_FALSE(s.ok()) << what;
    const std::string& m = s.message();
    EXPECT_NE(m.find(shown), std::string::npos) << what << ": " << m;
    EXPECT_TRUE(is_utf8(m)) << what << ": " << m;
    for (char ch : m) {
      const auto u = static_cast<unsigned char>(ch);
      EXPECT_TRUE(u >= 0x20 && u != 0x7f) << what << ": raw byte " << static_cast<int>(u) << " in " << m;
    }
  };
  RegisteredFunction f{};
  ASSERT_TRUE(api().register_function(&f, client().module, hostile).ok());
  ASSERT_FALSE(f.found);
  names_it_printably(api().launch_kernel(f.handle, dims(1, 32), 0, {}), "launch");
  FuncAttributes fa{};
  names_it_printably(api().func_get_attributes(&fa, f.handle), "cudaFuncGetAttributes");
  // The host backend binds a symbol of any name (CUDA's looks it up in the module).
  if (backend_name() == "host") {
    uint64_t var = 0;
    ASSERT_TRUE(api().register_var(&var, client().module, hostile, 16, false).ok());
    const uint64_t bytes[2] = {1, 2};
    names_it_printably(api().memcpy_to_symbol(var, reinterpret_cast<uint64_t>(bytes), 16, 8, cuda::kMemcpyHostToDevice),
                       "cudaMemcpyToSymbol past the end");
  }
}

// Column-major reference in double.
std::vector<float> gemm_ref(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& A, int lda,
                            const std::vector<float>& B, int ldb, float beta, std::vector<float> C, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int l = 0; l < k; ++l) {
        const double a = ta ? A[l + i * lda] : A[i + l * lda];
        const double b = tb ? B[j + l * ldb] : B[l + j * ldb];
        acc += a * b;
      }
      C[i + j * ldc] = static_cast<float>(alpha * acc + (beta == 0 ? 0.0 : beta * C[i + j * ldc]));
    }
  return C;
}

TEST_F(ApiTest, CublasSgemmMatchesAReferenceOnAStream) {
  const int m = 37, n = 23, k = 41;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> A(k * m), B(n * k), C(m * n);
  for (auto* v : {&A, &B, &C})
    for (auto& x : *v) x = u(rng);
  const uint64_t dA = alloc(A.size() * 4), dB = alloc(B.size() * 4), dC = alloc(C.size() * 4);
  upload(dA, A.data(), A.size() * 4);
  upload(dB, B.data(), B.size() * 4);
  upload(dC, C.data(), C.size() * 4);
  uint64_t h = 0, s = 0, got = 1;
  ASSERT_TRUE(api().cublas_create(&h).ok());
  ASSERT_TRUE(api().stream_create_with_flags(&s, cuda::kStreamNonBlocking).ok());
  ASSERT_TRUE(api().cublas_set_stream(h, s).ok());
  ASSERT_TRUE(api().cublas_get_stream(h, &got).ok());
  EXPECT_EQ(got, s);
  ASSERT_TRUE(api().cublas_set_math_mode(h, kCublasTF32TensorOpMath).ok());
  // C = 0.5 * A^T * B + 2 * C with A stored k x m.
  ASSERT_TRUE(api().cublas_sgemm(h, sgemm_args(1, 0, m, n, k, 0.5f, dA, k, dB, k, 2.0f, dC, m)).ok());
  ASSERT_TRUE(api().stream_synchronize(s).ok());
  auto ref = gemm_ref(true, false, m, n, k, 0.5f, A, k, B, k, 2.0f, C, m);
  auto out = download<float>(dC, C.size());
  // TF32 keeps 10 mantissa bits on a GPU (the host computes in full float).
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], gemm_tolerance()) << i;
  EXPECT_TRUE(api().cublas_destroy(h).ok());
  EXPECT_EQ(api().cublas_set_stream(h, s).api_error(), cuda::kCublasNotInitialized);
}

TEST_F(ApiTest, CublasGemmExAndStridedBatchedCompute) {
  const int m = 8, n = 5, k = 6, batch = 3;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> A(m * k * batch), B(k * n * batch), C(m * n * batch, 0.0f);
  for (auto& x : A) x = u(rng);
  for (auto& x : B) x = u(rng);
  const uint64_t dA = alloc(A.size() * 4), dB = alloc(B.size() * 4), dC = alloc(C.size() * 4);
  upload(dA, A.data(), A.size() * 4);
  upload(dB, B.data(), B.size() * 4);
  uint64_t h = 0;
  ASSERT_TRUE(api().cublas_create(&h).ok());
  GemmArgs g = sgemm_args(0, 0, m, n, k, 1.0f, dA, m, dB, k, 0.0f, dC, m);
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n, g.batch = batch;
  ASSERT_TRUE(api().cublas_sgemm_strided_batched(h, g).ok());
  GemmArgs ex = sgemm_args(0, 0, m, n, k, 1.0f, dA, m, dB, k, 0.0f, dC, m);
  ex.compute_type = kCublasCompute32FFastTF32;
  ASSERT_TRUE(api().cublas_gemm_ex(h, ex).ok());  // recomputes batch 0: same values
  ASSERT_TRUE(api().device_synchronize().ok());
  auto out = download<float>(dC, C.size());
  for (int b = 0; b < batch; ++b) {
    std::vector<float> Ab(A.begin() + b * m * k, A.begin() + (b + 1) * m * k);
    std::vector<float> Bb(B.begin() + b * k * n, B.begin() + (b + 1) * k * n);
    auto ref = gemm_ref(false, false, m, n, k, 1.0f, Ab, m, Bb, k, 0.0f, std::vector<float>(m * n), m);
    for (int i = 0; i < m * n; ++i) ASSERT_NEAR(out[b * m * n + i], ref[i], gemm_tolerance());
  }
  GemmArgs bad = ex;
  bad.a_type = bad.b_type = bad.c_type = 3;  // int8 in and out with float compute: no device has it
  bad.compute_type = kCublasCompute32F;
  EXPECT_TRUE(api().cublas_gemm_ex(h, bad).ok());  // argument checks pass; the device refuses later
  (void)api().device_synchronize();  // cudaGetLastError reports what the worker has run so far
  const int32_t e = api().get_last_error().api_error();
  EXPECT_TRUE(e == cuda::kCublasNotSupported || e == cuda::kCublasInvalidValue) << e;
}

TEST_F(ApiTest, CublasRejectsBadDimensionsAndOutOfRangeOperands) {
  uint64_t h = 0;
  ASSERT_TRUE(api().cublas_create(&h).ok());
  const uint64_t d = alloc(64 * 4);
  EXPECT_EQ(api().cublas_sgemm(h, sgemm_args(0, 0, 8, 8, 8, 1, d, 4, d, 8, 0, d, 8)).api_error(), cuda::kCublasInvalidValue);
  EXPECT_EQ(api().cublas_sgemm(h, sgemm_args(0, 0, 16, 16, 16, 1, d, 16, d, 16, 0, d, 16)).api_error(),
            cuda::kCublasInvalidValue);  // 16x16 floats do not fit in 64
  EXPECT_EQ(api().cublas_sgemm(h, sgemm_args(5, 0, 8, 8, 8, 1, d, 8, d, 8, 0, d, 8)).api_error(), cuda::kCublasInvalidValue);
  EXPECT_EQ(api().cublas_set_math_mode(h, 99).api_error(), cuda::kCublasInvalidValue);
  EXPECT_EQ(api().cublas_sgemm(h + 16, sgemm_args(0, 0, 8, 8, 8, 1, d, 8, d, 8, 0, d, 8)).api_error(),
            cuda::kCublasNotInitialized);
}

TEST_F(ApiTest, AsynchronousFailuresSurfaceThroughGetLastError) {
  EXPECT_TRUE(api().get_last_error().ok());
  uint64_t h = 0;
  ASSERT_TRUE(api().cublas_create(&h).ok());
  const uint64_t d = alloc(1024);
  GemmArgs g = sgemm_args(0, 0, 4, 4, 4, 1, d, 4, d, 4, 0, d, 4);
  g.a_type = g.b_type = g.c_type = 3;  // int8 in and out, float compute: accepted by the parser only
  g.compute_type = kCublasCompute32F;
  ASSERT_TRUE(api().cublas_gemm_ex(h, g).ok());
  // The failure is known once the worker has run the call; a synchronize waits for that and
  // reports it too, without clearing it.
  const int32_t s = api().device_synchronize().api_error();
  const int32_t e = api().peek_at_last_error().api_error();
  EXPECT_EQ(s, e);
  EXPECT_TRUE(e == cuda::kCublasNotSupported || e == cuda::kCublasInvalidValue) << e;
  if (backend_name() == "host") {
    EXPECT_EQ(e, cuda::kCublasNotSupported);
  }
  EXPECT_EQ(api().get_last_error().api_error(), e);
  EXPECT_TRUE(api().get_last_error().ok());  // cleared
}

TEST_F(ApiTest, GetLastErrorAnswersWithoutWaitingForTheWorker) {
  // A launch followed by cudaGetLastError is every kernel's idiom; waiting for the worker there
  // would make each launch a round trip. With the worker held, both still return at once.
  const uint64_t d = alloc(1024 * 4);
  std::shared_ptr<POSClient> c = ws_->find_client(client().uuid);
  ASSERT_NE(c, nullptr);
  c->set_worker_paused(true);
  auto a = args(client().fill, d, 5u, 1024);
  EXPECT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), 0, a).ok());
  EXPECT_TRUE(api().get_last_error().ok());
  EXPECT_TRUE(api().peek_at_last_error().ok());
  c->set_worker_paused(false);
  EXPECT_EQ(download<unsigned>(d, 1024)[1023], 5u + 1023u);
}

TEST_F(ApiTest, MallocOfZeroBytesReturnsNullAndFreeOfNullSucceeds) {
  uint64_t p = 123;
  ASSERT_TRUE(api().malloc(&p, 0).ok());
  EXPECT_EQ(p, 0u);
  EXPECT_TRUE(api().free(0).ok());
}

TEST_F(ApiTest, FreedAddressRangesAreReused) {
  const uint64_t a = alloc(1 << 20);
  ASSERT_TRUE(api().free(a).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  // The parser reuses the range once the worker confirmed the free; a sync call orders that.
  const uint64_t b = alloc(1 << 20);
  EXPECT_EQ(a, b);
  // Reused memory does not show the old contents.
  EXPECT_EQ(download<uint8_t>(b, 16), std::vector<uint8_t>(16, 0));
}

TEST_F(ApiTest, MemGetInfoAndMallocHonourThePerClientQuota) {
  Config c = test_config();
  c.memory_quota = 1 << 20;
  make_workspace(c);
  uint64_t free = 0, total = 0;
  ASSERT_TRUE(api().mem_get_info(&free, &total).ok());
  EXPECT_EQ(total, 1u << 20);
  EXPECT_EQ(free, 1u << 20);
  const uint64_t a = alloc(512 << 10);
  ASSERT_TRUE(api().mem_get_info(&free, &total).ok());
  EXPECT_EQ(free, 512u << 10);
  uint64_t p = 0;
  EXPECT_EQ(api().malloc(&p, 768 << 10).api_error(), cuda::kErrorMemoryAllocation);
  ASSERT_TRUE(api().free(a).ok());
  EXPECT_TRUE(api().malloc(&p, 768 << 10).ok());
}

}  // namespace
}  // namespace pos::test
