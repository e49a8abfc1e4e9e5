// checkpoint_multi_gpu_test.cc — restore onto another device of the same model: a client
// checkpointed on device 0 comes back on device 1 with the same bytes, handles and addresses.
// Needs two devices: CI runs it on the host backend presenting two; the `multigpu` suite (tools/gpu_run.sh
// --multi) on a machine with two GPUs of one model. With fewer it fails, never skips.
#include <unistd.h>

#include <filesystem>
#include <string>

#ifdef POS_TEST_CUDA_HEADERS
#include <cuda.h>
#include <dlfcn.h>
#endif

#include "unittest/api_fixture.h"
#include "remoting/inproc/inproc_transport.h"

namespace pos::test {
namespace {

namespace fs = std::filesystem;

std::vector<unsigned> pattern(size_t n, unsigned seed) {
  std::vector<unsigned> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = seed * 2246822519u + static_cast<unsigned>(i) * 3266489917u;
  return v;
}

// Which device's memory backs `addr` (the CUDA backend maps client buffers with the driver's VMM
// calls): -1 where it cannot be told (the host backend keeps every device in host memory), -2 if
// the driver would not say. The driver is looked up at run time, so that CI machines without one
// still run this binary on the host backend.
int backing_device(uint64_t addr) {
#ifdef POS_TEST_CUDA_HEADERS
  if (backend_name() != "cuda") return -1;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);  // the backend has loaded it
  if (lib == nullptr) return -2;
  using Retain = CUresult (*)(CUmemGenericAllocationHandle*, void*);
  using Props = CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle);
  using Release = CUresult (*)(CUmemGenericAllocationHandle);
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using CtxRetain = CUresult (*)(CUcontext*, CUdevice);
  using CtxRelease = CUresult (*)(CUdevice);
  using CtxPush = CUresult (*)(CUcontext);
  using CtxPop = CUresult (*)(CUcontext*);
  auto retain = reinterpret_cast<Retain>(dlsym(lib, "cuMemRetainAllocationHandle"));
  auto props = reinterpret_cast<Props>(dlsym(lib, "cuMemGetAllocationPropertiesFromHandle"));
  auto release = reinterpret_cast<Release>(dlsym(lib, "cuMemRelease"));
  auto device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
  auto ctx_retain = reinterpret_cast<CtxRetain>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  auto ctx_release = reinterpret_cast<CtxRelease>(dlsym(lib, "cuDevicePrimaryCtxRelease_v2"));
  auto push = reinterpret_cast<CtxPush>(dlsym(lib, "cuCtxPushCurrent_v2"));
  auto pop = reinterpret_cast<CtxPop>(dlsym(lib, "cuCtxPopCurrent_v2"));
  int device = -2;
  if (retain != nullptr && props != nullptr && release != nullptr && device_get != nullptr && ctx_retain != nullptr &&
      ctx_release != nullptr && push != nullptr && pop != nullptr) {
    // Under device 0's primary context, pushed and popped again, so that the answer does not
    // depend on which context the backend last bound on the test thread.
    CUdevice dev0 = 0;
    CUcontext ctx = nullptr;
    if (device_get(&dev0, 0) == CUDA_SUCCESS && ctx_retain(&ctx, dev0) == CUDA_SUCCESS) {
      if (push(ctx) == CUDA_SUCCESS) {
        CUmemGenericAllocationHandle h = 0;
        if (retain(&h, reinterpret_cast<void*>(addr)) == CUDA_SUCCESS) {
          CUmemAllocationProp prop{};
          if (props(&prop, h) == CUDA_SUCCESS) device = prop.location.id;
          release(h);
        }
        CUcontext popped = nullptr;
        (void)pop(&popped);
      }
      (void)ctx_release(dev0);
    }
  }
  dlclose(lib);
  return device;
#else
  (void)addr;
  return -1;
#endif
}

class MultiDeviceRestoreTest : public ApiTest {
 protected:
  void SetUp() override {
    Config c = test_config();
    c.host_device_count = 2;  // the host backend's stand-in for a two-GPU machine
    make_workspace(c);
    const int n = ws_->backend().device_count();
    ASSERT_GE(n, 2) << "this test needs two devices of one model and the " << backend_name() << " backend sees " << n
                    << "; run it on a multi-GPU machine (tools/gpu_run.sh --multi)";
    ASSERT_EQ(ws_->backend().device_name(0), ws_->backend().device_name(1))
        << "devices 0 and 1 are different models; restore onto another device needs the same one";
    dir_ = (fs::temp_directory_path() / ("pos-multigpu-test-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ApiTest::TearDown();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void build_state() {
    a_ = alloc(3u << 20);
    b_ = alloc(20u << 20);  // more than two 8 MiB chunks
    a_data_ = pattern((3u << 20) / 4, 1);
    b_data_ = pattern((20u << 20) / 4, 2);
    upload(a_, a_data_.data(), 3u << 20);
    upload(b_, b_data_.data(), 20u << 20);
    ASSERT_TRUE(api().stream_create_with_flags(&stream_, 1).ok());
    ASSERT_TRUE(api().device_synchronize().ok());
  }
  void expect_state(int device) {
    EXPECT_EQ(download<unsigned>(a_, a_data_.size()), a_data_);
    EXPECT_EQ(download<unsigned>(b_, b_data_.size()), b_data_);
    // The restored function and stream run a kernel there.
    auto args = ApiTest::args(client().fill, static_cast<uint64_t>(a_), 5u, 1000);
    ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, args).ok());
    ASSERT_TRUE(api().stream_synchronize(stream_).ok());
    std::vector<unsigned> want = a_data_;
    for (unsigned i = 0; i < 1000; ++i) want[i] = 5u + i;
    EXPECT_EQ(download<unsigned>(a_, want.size()), want);
    EXPECT_EQ(ws_->find_client(client().uuid)->device(), device);
    for (uint64_t p : {a_, b_}) {
      const int d = backing_device(p);
      if (d != -1) {
        EXPECT_EQ(d, device) << "buffer " << p << " lives on device " << d;
      }
    }
  }
  std::string image(const std::string& name) const { return dir_ + "/" + name; }
  Status dump(const std::string& d) {
    CheckpointRequest r;
    r.dir = d;
    auto res = ws_->checkpoint(client().uuid, std::move(r));
    return res.ok() ? Status::Ok() : res.status();
  }
  // Drops the client and restores it from `d` with `options`.
  Status kill_and_restore(const std::string& d, const RestoreOptions& options) {
    POS_RETURN_IF_ERROR(ws_->remove_client(client().uuid));
    auto img = ckpt::ImageReader::open_dir(d);
    if (!img.ok()) return img.status();
    auto u = ws_->restore(std::shared_ptr<const ckpt::ImageReader>(std::move(*img)), options);
    if (!u.ok()) return u.status();
    TestClient& c = client();
    c.uuid = *u;
    c.api.reset();
    c.transport = std::make_unique<InProcessTransport>(ws_, *u);
    c.api = std::make_unique<ApiClient>(c.transport.get());
    return Status::Ok();
  }
  static RestoreOptions on_device(int device, bool lazy = false) {
    RestoreOptions o;
    o.device = device;
    o.lazy = lazy;
    return o;
  }

  std::string dir_;
  uint64_t a_ = 0, b_ = 0, stream_ = 0;
  std::vector<unsigned> a_data_, b_data_;
};

TEST_F(MultiDeviceRestoreTest, ACheckpointOnDevice0RestoresOnDevice1WithTheSameBytes) {
  build_state();
  ASSERT_EQ(ws_->find_client(client().uuid)->device(), 0);
  ASSERT_TRUE(dump(image("on0")).ok());
  Status s = kill_and_restore(image("on0"), on_device(1));
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_state(1);
}

TEST_F(MultiDeviceRestoreTest, AnImageRemembersItsDeviceAndCanBeMappedBack) {
  build_state();
  ASSERT_TRUE(dump(image("on0")).ok());
  ASSERT_TRUE(kill_and_restore(image("on0"), on_device(1)).ok());
  ASSERT_TRUE(dump(image("on1")).ok());
  auto img = ckpt::ImageReader::open_dir(image("on1"));
  ASSERT_TRUE(img.ok());
  EXPECT_EQ((*img)->client().client().device(), 1);
  // Without a mapping the image goes back to its own device; with one, anywhere of its model.
  ASSERT_TRUE(kill_and_restore(image("on1"), on_device(-1)).ok());
  expect_state(1);
  ASSERT_TRUE(kill_and_restore(image("on1"), on_device(0)).ok());
  expect_state(0);
}

// A posd that serves another GPU (posd.devices) restores a job where its own device list puts the
// job's number for the device it ran on: device 0 of a job that saw every device lands on device 1
// under the list [1] and under [1, 0]; the image records that number (device_index).
TEST_F(MultiDeviceRestoreTest, AnImageRestoredUnderADeviceListGoesWhereTheListPutsTheJobsOwnDevice) {
  build_state();
  ASSERT_TRUE(dump(image("on0")).ok());
  {
    auto img = ckpt::ImageReader::open_dir(image("on0"));
    ASSERT_TRUE(img.ok());
    ASSERT_TRUE((*img)->client().client().has_device_index());
    EXPECT_EQ((*img)->client().client().device_index(), 0);
  }
  for (const std::vector<int32_t>& list : {std::vector<int32_t>{1}, std::vector<int32_t>{1, 0}}) {
    RestoreOptions o;
    o.devices = list;
    ASSERT_TRUE(kill_and_restore(image("on0"), o).ok());
    expect_state(1);
  }
  // Taken under the list [1, 0] (its state on the list's first, backend device 1), restored under
  // [0]: the same place of the new list, device 0. (expect_state's kernel wrote a's first 1000.)
  for (unsigned i = 0; i < 1000; ++i) a_data_[i] = 5u + i;
  ASSERT_TRUE(dump(image("listed")).ok());
  auto img = ckpt::ImageReader::open_dir(image("listed"));
  ASSERT_TRUE(img.ok());
  EXPECT_EQ((*img)->client().client().device(), 1);
  EXPECT_EQ((*img)->client().client().device_index(), 0);
  RestoreOptions back;
  back.devices = {0};
  ASSERT_TRUE(kill_and_restore(image("listed"), back).ok());
  expect_state(0);
}

TEST_F(MultiDeviceRestoreTest, ALazyRestoreOntoDevice1LoadsEveryBufferThere) {
  build_state();
  ASSERT_TRUE(dump(image("lazy")).ok());
  ASSERT_TRUE(kill_and_restore(image("lazy"), on_device(1, /*lazy=*/true)).ok());
  expect_state(1);
  EXPECT_TRUE(ws_->find_client(client().uuid)->wait_restored().ok());
}

// ---- a job's state follows cudaSetDevice until it holds some ----

// What device the client's state is on, once the calls before this one have run.
int settled_device(POSWorkspace* ws, ApiClient& api, uint64_t uuid) {
  EXPECT_TRUE(api.device_synchronize().ok());
  return ws->find_client(uuid)->device();
}

TEST_F(MultiDeviceRestoreTest, AJobFollowsCudaSetDeviceUntilItHoldsDeviceStateAndItsKernelsRunThere) {
  // The fixture registered the test module and its kernels (as a program's static constructors
  // do) before any cudaSetDevice: the move takes them along.
  ASSERT_EQ(settled_device(ws_, api(), client().uuid), 0);
  ASSERT_TRUE(api().set_device(1).ok());
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 1);
  int32_t d = -1;
  ASSERT_TRUE(api().get_device(&d).ok());
  EXPECT_EQ(d, 1);
  const uint64_t buf = alloc(4u << 20);
  ASSERT_TRUE(api().device_synchronize().ok());  // cudaMalloc returns at parse; the worker maps it
  const int backing = backing_device(buf);
  if (backing != -1) {
    EXPECT_EQ(backing, 1) << "the buffer's memory is on device " << backing;
  }
  auto args = ApiTest::args(client().fill, buf, 7u, 4096);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(16, 256), 0, args).ok());
  std::vector<unsigned> want(4096);
  for (unsigned i = 0; i < 4096; ++i) want[i] = 7u + i;
  EXPECT_EQ(download<unsigned>(buf, 4096), want);

  // With memory, selecting another device changes the number the job sees, not where it runs.
  ASSERT_TRUE(api().set_device(0).ok());
  ASSERT_TRUE(api().get_device(&d).ok());
  EXPECT_EQ(d, 0);
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 1);
  const uint64_t second = alloc(1u << 20);
  ASSERT_TRUE(api().device_synchronize().ok());
  if (backing_device(second) != -1) {
    EXPECT_EQ(backing_device(second), 1);
  }
  EXPECT_EQ(download<unsigned>(buf, 4096), want) << "the first buffer is untouched";
  EXPECT_TRUE(api().get_last_error().ok());

  // Once it holds nothing again, it follows once more.
  ASSERT_TRUE(api().free(buf).ok());
  ASSERT_TRUE(api().free(second).ok());
  ASSERT_TRUE(api().set_device(0).ok());
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 0);
  const uint64_t third = alloc(1u << 20);
  ASSERT_TRUE(api().device_synchronize().ok());
  if (backing_device(third) != -1) {
    EXPECT_EQ(backing_device(third), 0);
  }
  args = ApiTest::args(client().fill, third, 3u, 64);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 64), 0, args).ok());
  std::vector<unsigned> small(64);
  for (unsigned i = 0; i < 64; ++i) small[i] = 3u + i;
  EXPECT_EQ(download<unsigned>(third, 64), small);
}

TEST_F(MultiDeviceRestoreTest, AStreamOfItsOwnKeepsTheJobWhereItIs) {
  uint64_t s = 0;
  ASSERT_TRUE(api().stream_create(&s).ok());
  ASSERT_TRUE(api().set_device(1).ok());
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 0) << "a stream of its own is device state";
  ASSERT_TRUE(api().stream_destroy(s).ok());
  ASSERT_TRUE(api().set_device(1).ok());
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 1) << "without it the job moves";
}

TEST_F(MultiDeviceRestoreTest, AModuleUnregisteredBeforeAMoveStaysGoneAndTheOthersMove) {
  uint64_t extra = 0;
  RegisteredFunction f;
  ASSERT_TRUE(api().register_fatbin(&extra, test_fatbin()).ok());
  ASSERT_TRUE(api().register_function(&f, extra, kTestFillName).ok());
  ASSERT_TRUE(api().unregister_fatbin(extra).ok());
  ASSERT_TRUE(api().set_device(1).ok());
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 1);
  EXPECT_TRUE(api().get_last_error().ok());
  // The gone module's kernel is refused; the fixture's module came along and runs.
  const uint64_t buf = alloc(256);
  auto args = ApiTest::args(client().fill, buf, 9u, 64);
  EXPECT_EQ(api().launch_kernel(f.handle, dims(1, 64), 0, args).api_error(), cuda::kErrorInvalidDeviceFunction);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 64), 0, args).ok());
  std::vector<unsigned> want(64);
  for (unsigned i = 0; i < 64; ++i) want[i] = 9u + i;
  EXPECT_EQ(download<unsigned>(buf, 64), want);
}

// The restore hooks hand the worker its loaded modules, functions and variables, as registration
// does, so a restored job that holds nothing else still moves with them.
TEST_F(MultiDeviceRestoreTest, ARestoredJobHoldingOnlyItsKernelsStillFollowsCudaSetDevice) {
  uint64_t var = 0;
  ASSERT_TRUE(api().register_var(&var, client().module, "coeffs", 64, false).ok());
  ASSERT_TRUE(dump(image("kernels")).ok());
  ASSERT_TRUE(kill_and_restore(image("kernels"), on_device(-1)).ok());
  ASSERT_EQ(settled_device(ws_, api(), client().uuid), 0);
  ASSERT_TRUE(api().set_device(1).ok());
  EXPECT_EQ(settled_device(ws_, api(), client().uuid), 1);
  EXPECT_TRUE(api().get_last_error().ok());
  const uint64_t buf = alloc(256);
  auto args = ApiTest::args(client().fill, buf, 11u, 64);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 64), 0, args).ok());
  std::vector<unsigned> want(64);
  for (unsigned i = 0; i < 64; ++i) want[i] = 11u + i;
  EXPECT_EQ(download<unsigned>(buf, 64), want);
  std::vector<float> in(16, 1.5f), out(16, 0.0f);
  const auto host = [](auto& v) { return reinterpret_cast<uint64_t>(v.data()); };
  ASSERT_TRUE(api().memcpy_to_symbol(var, host(in), 64, 0, cuda::kMemcpyHostToDevice).ok());
  ASSERT_TRUE(api().memcpy_from_symbol(host(out), var, 64, 0, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(out, in) << "the variable was bound again on device 1";
}

TEST_F(MultiDeviceRestoreTest, AnImageOfAMovedJobRecordsTheDeviceItMovedTo) {
  ASSERT_TRUE(api().set_device(1).ok());
  build_state();
  ASSERT_TRUE(dump(image("moved")).ok());
  auto img = ckpt::ImageReader::open_dir(image("moved"));
  ASSERT_TRUE(img.ok());
  EXPECT_EQ((*img)->client().client().device(), 1);
  EXPECT_EQ((*img)->client().client().current_device(), 1);
  ASSERT_TRUE(kill_and_restore(image("moved"), on_device(-1)).ok());
  expect_state(1);
}

TEST_F(MultiDeviceRestoreTest, ADeviceThatDoesNotExistIsRefusedAndChangesNothing) {
  build_state();
  ASSERT_TRUE(dump(image("img")).ok());
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  auto img = ckpt::ImageReader::open_dir(image("img"));
  ASSERT_TRUE(img.ok());
  const int n = ws_->backend().device_count();
  auto u = ws_->restore(**img, on_device(n));
  EXPECT_EQ(u.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(u.status().message().find("device " + std::to_string(n)), std::string::npos) << u.status().to_string();
  ASSERT_TRUE(ws_->restore(**img, on_device(1)).ok());  // the slot is still free
}

}  // namespace
}  // namespace pos::test
