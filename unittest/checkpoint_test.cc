// checkpoint_test.cc — the checkpoint engine end to end: sync, async copy-on-write and incremental
// images, restore at the same addresses, bad images refused, and crashes mid-dump (fault points).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ckpt/inspect.h"
#include "unittest/api_fixture.h"

namespace pos::test {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("pos-ckpt-test-" + std::to_string(::getpid())) / name;
  fs::create_directories(p.parent_path());
  fs::remove_all(p);
  return p.string();
}

// What test_fill(out, value, n) leaves: value + i.
std::vector<unsigned> filled(size_t n, unsigned value) {
  std::vector<unsigned> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value + static_cast<unsigned>(i);
  return v;
}

std::vector<unsigned> pattern(size_t n, unsigned seed) {
  std::vector<unsigned> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = seed * 2654435761u + static_cast<unsigned>(i) * 40503u;
  return v;
}

class CheckpointTest : public ApiTest {
 protected:
  void TearDown() override {
    ApiTest::TearDown();
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("pos-ckpt-test-" + std::to_string(::getpid())), ec);
  }
  // Builds state: three buffers (one larger than a chunk), a stream and an event.
  void build_state() {
    small_ = alloc(4096);
    big_ = alloc(20u << 20);  // spans three 8 MiB chunks
    odd_ = alloc(777 * 4);
    small_data_ = pattern(1024, 1);
    big_data_ = pattern((20u << 20) / 4, 2);
    odd_data_ = pattern(777, 3);
    upload(small_, small_data_.data(), 4096);
    upload(big_, big_data_.data(), 20u << 20);
    upload(odd_, odd_data_.data(), 777 * 4);
    ASSERT_TRUE(api().stream_create_with_flags(&stream_, 1).ok());
    ASSERT_TRUE(api().event_create(&event_).ok());
    ASSERT_TRUE(api().event_record(event_, stream_).ok());
    ASSERT_TRUE(api().device_synchronize().ok());
  }
  void expect_state() {
    EXPECT_EQ(download<unsigned>(small_, 1024), small_data_);
    EXPECT_EQ(download<unsigned>(big_, big_data_.size()), big_data_);
    EXPECT_EQ(download<unsigned>(odd_, 777), odd_data_);
    // Restored handles work: a kernel on the restored stream, by the restored function handle.
    auto a = args(client().fill, static_cast<uint64_t>(odd_), 7u, 777);
    ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, a).ok());
    ASSERT_TRUE(api().stream_synchronize(stream_).ok());
    EXPECT_EQ(download<unsigned>(odd_, 777), filled(777, 7u));
    EXPECT_TRUE(api().event_query(event_).ok());
  }
  StatusOr<CheckpointResult> dump(CheckpointRequest r) { return ws_->checkpoint(client().uuid, std::move(r)); }
  CheckpointRequest to_dir(const std::string& d, CheckpointMode m = CheckpointMode::kSync) {
    CheckpointRequest r;
    r.dir = d;
    r.mode = m;
    return r;
  }
  // Drops the client (as a dead daemon would) and restores it from `dir`.
  Status kill_and_restore(const std::string& dir) {
    const uint64_t uuid = client().uuid;
    Status s = ws_->remove_client(uuid);
    if (!s.ok()) return s;
    return restore_from(dir);
  }
  Status restore_from(const std::string& dir, const RestoreOptions& options = {}) {
    auto img = ckpt::ImageReader::open_dir(dir);
    if (!img.ok()) return img.status();
    auto u = options.lazy ? ws_->restore(std::shared_ptr<const ckpt::ImageReader>(std::move(*img)), options)
                          : ws_->restore(**img, options);
    if (!u.ok()) return u.status();
    reattach(*u);
    return Status::Ok();
  }
  // Lazily, the background loaders held until `hold` goes false (nullptr: not held).
  Status kill_and_restore_lazily(const std::string& dir, std::atomic<bool>* hold = nullptr) {
    Status s = ws_->remove_client(client().uuid);
    if (!s.ok()) return s;
    RestoreOptions o;
    o.lazy = true;
    o.hold_loader = hold;
    return restore_from(dir, o);
  }
  POSClient& live_client() { return *ws_->find_client(client().uuid); }
  // A copy of image `dir` with one byte of `buffer`'s blob flipped.
  std::string corrupt_copy(const std::string& dir, uint64_t buffer, const std::string& name) {
    const std::string c = temp_dir(name);
    fs::copy(dir, c);
    auto img = ckpt::ImageReader::open_dir(dir);
    EXPECT_TRUE(img.ok());
    uint64_t off = 0;
    for (const auto& h : (*img)->client().handles())
      if (h.addr() == buffer && h.has_memory()) off = h.memory().offset();
    std::fstream f(c + "/memory.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(off + 100));
    const char was = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(off + 100));
    f.put(static_cast<char>(was ^ 0x5a));
    return c;
  }
  void reattach(uint64_t uuid) {
    TestClient& c = client();
    c.uuid = uuid;
    c.api.reset();
    c.transport = std::make_unique<InProcessTransport>(ws_, uuid);
    c.api = std::make_unique<ApiClient>(c.transport.get());
  }

  uint64_t small_ = 0, big_ = 0, odd_ = 0, stream_ = 0, event_ = 0;
  std::vector<unsigned> small_data_, big_data_, odd_data_;
};

TEST_F(CheckpointTest, ASyncCheckpointToADirectoryRestoresEveryBufferAndHandle) {
  build_state();
  const std::string d = temp_dir("sync");
  auto r = dump(to_dir(d));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(r->bytes_stored, 4096u + (20u << 20) + 777 * 4);
  EXPECT_FALSE(fs::exists(d + ".partial"));
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

TEST_F(CheckpointTest, InspectDescribesEveryHandleInTextAndJson) {
  build_state();
  const std::string d = temp_dir("inspect");
  auto r = dump(to_dir(d));
  ASSERT_TRUE(r.ok());
  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok());
  const std::string text = ckpt::describe_image(**img, false);
  EXPECT_NE(text.find("cut " + std::to_string(r->cut_pc)), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(20u << 20) + " bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("_Z9test_fillPjji"), std::string::npos) << text;
  const std::string json = ckpt::describe_image(**img, true);
  EXPECT_NE(json.find("\"cut_pc\":\"" + std::to_string(r->cut_pc) + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"image_id\":\"" + r->image_id + "\""), std::string::npos) << json;
}

TEST_F(CheckpointTest, TheClientContinuesAfterACheckpointAndTheImageKeepsTheCut) {
  build_state();
  const std::string d = temp_dir("continue");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  // The job goes on and overwrites a buffer; the image still holds the state at the cut.
  std::vector<unsigned> later = pattern(1024, 9);
  upload(small_, later.data(), 4096);
  EXPECT_EQ(download<unsigned>(small_, 1024), later);
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

TEST_F(CheckpointTest, AMemoryImageRestoresLikeADirectoryAndCanBeSaved) {
  build_state();
  ckpt::MemoryImage mem(ckpt::HostAllocator::plain());
  CheckpointRequest req;
  req.memory = &mem;
  auto r = dump(std::move(req));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::string d = temp_dir("saved");
  ASSERT_TRUE(mem.save_to_dir(d).ok());
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  auto img = ckpt::ImageReader::open_memory(&mem);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  auto u = ws_->restore(**img);
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  reattach(*u);
  expect_state();
  Status saved = kill_and_restore(d);  // the saved copy is a complete image too
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  expect_state();
}

TEST_F(CheckpointTest, AnAsyncImageHoldsTheStateAtTheCutWhileTheJobOverwritesItsBuffers) {
  build_state();
  const std::string d = temp_dir("async");
  std::atomic<bool> hold{true}, cut{false};
  CheckpointRequest req = to_dir(d, CheckpointMode::kAsync);
  req.hold_drain = &hold;
  req.on_cut = [&](uint64_t) { cut.store(true); };
  StatusOr<CheckpointResult> result = Status::Internal("not run");
  std::thread t([&] { result = dump(std::move(req)); });
  while (!cut.load()) std::this_thread::yield();
  // The drainer has not copied a byte yet; the job writes every buffer through three paths.
  ASSERT_TRUE(api().memset(big_, 0x5a, 20u << 20).ok());
  auto a = args(client().fill, static_cast<uint64_t>(small_), 1234u, 1024);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, a).ok());
  ASSERT_TRUE(api().stream_synchronize(stream_).ok());
  ASSERT_TRUE(api().free(odd_).ok());
  hold.store(false);
  t.join();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->shadow_bytes, (20u << 20) + 4096u + 777 * 4);
  EXPECT_EQ(download<unsigned>(small_, 1024), filled(1024, 1234u));
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

TEST_F(CheckpointTest, AnAutoSizedShadowPoolLetsTheJobRewriteEverythingWithoutWaiting) {
  build_state();
  const std::string d = temp_dir("auto-pool");
  std::atomic<bool> hold{true}, cut{false};
  CheckpointRequest req = to_dir(d, CheckpointMode::kAsync);  // the config's pool: auto
  req.hold_drain = &hold;
  req.on_cut = [&](uint64_t) { cut.store(true); };
  StatusOr<CheckpointResult> result = Status::Internal("not run");
  std::thread t([&] { result = dump(std::move(req)); });
  while (!cut.load()) std::this_thread::yield();
  // The drainer is held: had the worker to wait for it, these calls would never return.
  ASSERT_TRUE(api().memset(big_, 0x11, 20u << 20).ok());
  ASSERT_TRUE(api().memset(small_, 0x22, 4096).ok());
  ASSERT_TRUE(api().memset(odd_, 0x33, 777 * 4).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  hold.store(false);
  t.join();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->shadow_limit, (20u << 20) + 4096u + 777 * 4);  // every buffer, once
  EXPECT_EQ(result->shadow_bytes, result->shadow_limit);
  EXPECT_EQ(result->shadow_waits, 0u);
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

TEST_F(CheckpointTest, AFullShadowPoolMakesTheWorkerWaitForTheDrainerAndTheImageStaysExact) {
  build_state();
  const std::string d = temp_dir("small-pool");
  std::atomic<bool> hold{true}, cut{false};
  CheckpointRequest req = to_dir(d, CheckpointMode::kAsync);
  req.shadow_pool_bytes = 8192;  // the small buffer fits, the 20 MiB one never does
  req.hold_drain = &hold;
  req.on_cut = [&](uint64_t) { cut.store(true); };
  req.on_pool_full = [&] { hold.store(false); };  // the drainer starts only once the worker waits
  StatusOr<CheckpointResult> result = Status::Internal("not run");
  std::thread t([&] { result = dump(std::move(req)); });
  while (!cut.load()) std::this_thread::yield();
  ASSERT_TRUE(api().memset(big_, 0x11, 20u << 20).ok());
  ASSERT_TRUE(api().memset(small_, 0x22, 4096).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  t.join();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->shadow_limit, 8192u);
  EXPECT_LE(result->shadow_bytes, 8192u);
  EXPECT_GE(result->shadow_waits, 1u);
  EXPECT_EQ(download<unsigned char>(big_, 16), std::vector<unsigned char>(16, 0x11));
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

TEST_F(CheckpointTest, ASecondCheckpointWhileOneIsDrainingIsBusy) {
  build_state();
  std::atomic<bool> hold{true}, cut{false};
  CheckpointRequest req = to_dir(temp_dir("busy1"), CheckpointMode::kAsync);
  req.hold_drain = &hold;
  req.on_cut = [&](uint64_t) { cut.store(true); };
  StatusOr<CheckpointResult> first = Status::Internal("not run");
  std::thread t([&] { first = dump(std::move(req)); });
  while (!cut.load()) std::this_thread::yield();
  auto second = dump(to_dir(temp_dir("busy2")));
  EXPECT_EQ(second.status().code(), Code::kBusy) << second.status().to_string();
  hold.store(false);
  t.join();
  EXPECT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_FALSE(fs::exists(temp_dir("busy2")));
}

TEST_F(CheckpointTest, AnIncrementalChainStoresOnlyWrittenBuffersAndRestoresThemAll) {
  build_state();
  const std::string base = temp_dir("chain0"), mid = temp_dir("chain1"), top = temp_dir("chain2");
  ASSERT_TRUE(dump(to_dir(base)).ok());
  odd_data_ = pattern(777, 11);
  upload(odd_, odd_data_.data(), 777 * 4);
  CheckpointRequest r1 = to_dir(mid);
  r1.parent_dir = base;
  auto i1 = dump(std::move(r1));
  ASSERT_TRUE(i1.ok()) << i1.status().to_string();
  EXPECT_EQ(i1->bytes_stored, 777u * 4);  // only the buffer written since
  EXPECT_EQ(i1->bytes_referenced, 4096u + (20u << 20));
  small_data_ = pattern(1024, 12);
  upload(small_, small_data_.data(), 4096);
  CheckpointRequest r2 = to_dir(top);
  r2.parent_dir = mid;
  auto i2 = dump(std::move(r2));
  ASSERT_TRUE(i2.ok()) << i2.status().to_string();
  EXPECT_EQ(i2->bytes_stored, 4096u);
  ASSERT_TRUE(kill_and_restore(top).ok());
  expect_state();
  // A broken link anywhere in the chain: the top image is refused before anything changes.
  fs::remove(base + "/memory.bin");
  EXPECT_FALSE(ckpt::ImageReader::open_dir(top).ok());
}

TEST_F(CheckpointTest, CorruptTruncatedAndForeignImagesAreRefusedAndChangeNothing) {
  build_state();
  const std::string d = temp_dir("good");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  auto copy = [&](const std::string& name) {
    const std::string c = temp_dir(name);
    fs::copy(d, c);
    return c;
  };
  auto patch = [](const std::string& file, uint64_t off, char byte) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    f.put(byte);
  };
  // A flipped byte in the device bytes: caught by the chunk checksum during restore.
  const std::string flipped = copy("flipped");
  patch(flipped + "/memory.bin", 4096 + 100, 0x7f);
  Status s = restore_from(flipped);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.to_string();
  // Truncated device bytes, a damaged record file, a foreign format version: refused at open.
  const std::string cut = copy("truncated");
  fs::resize_file(cut + "/memory.bin", 8192);
  EXPECT_EQ(restore_from(cut).code(), Code::kCorrupt);
  const std::string rec = copy("records");
  patch(rec + "/client.pb", 10, 0x01);
  EXPECT_EQ(restore_from(rec).code(), Code::kCorrupt);
  const std::string ver = copy("version");
  patch(ver + "/inventory.pb", 8, 9);
  Status vs = restore_from(ver);
  EXPECT_EQ(vs.code(), Code::kUnsupported);
  EXPECT_NE(vs.message().find("format version 9"), std::string::npos) << vs.to_string();
  const std::string gone = copy("noinventory");
  fs::remove(gone + "/inventory.pb");
  EXPECT_EQ(restore_from(gone).code(), Code::kCorrupt);
  // Nothing changed: the good image still restores into the same slot.
  ASSERT_TRUE(restore_from(d).ok());
  expect_state();
}

TEST_F(CheckpointTest, AnExistingImageIsRefusedUnlessReplacedAndReplacingIsAtomic) {
  build_state();
  const std::string d = temp_dir("replace");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  auto again = dump(to_dir(d));
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
  odd_data_ = pattern(777, 21);
  upload(odd_, odd_data_.data(), 777 * 4);
  CheckpointRequest r = to_dir(d);
  r.replace = true;
  ASSERT_TRUE(dump(std::move(r)).ok());
  EXPECT_FALSE(fs::exists(d + ".partial"));
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

// ---------------- lazy restore ----------------

TEST_F(CheckpointTest, ALazilyRestoredClientHasEveryBufferAndHandle) {
  build_state();
  const std::string d = temp_dir("lazy");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  Status s = kill_and_restore_lazily(d);
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_state();
  Status loaded = live_client().wait_restored();
  EXPECT_TRUE(loaded.ok()) << loaded.to_string();
  const LazyRestoreStats st = live_client().restore_stats();
  EXPECT_TRUE(st.complete);
  EXPECT_EQ(st.buffers, 3u);
  EXPECT_EQ(st.bytes, 4096u + (20u << 20) + 777 * 4);
  EXPECT_EQ(st.loaded_on_demand + st.loaded_in_background, 3u);
  EXPECT_EQ(st.failed, 0u);
}

TEST_F(CheckpointTest, ALazyRestoreNeedsTheImagesOwnership) {
  build_state();
  const std::string d = temp_dir("lazy-ref");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok());
  RestoreOptions o;
  o.lazy = true;
  EXPECT_EQ(ws_->restore(**img, o).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(restore_from(d).ok());  // nothing was left behind: the slot is free
  expect_state();
}

TEST_F(CheckpointTest, BuffersUsedBeforeTheBackgroundLoaderReachesThemAreLoadedFirst) {
  build_state();
  const uint64_t rest = alloc(8192);  // named by no call after the restore: the loaders' part
  const std::vector<unsigned> rest_data = pattern(2048, 4);
  upload(rest, rest_data.data(), 8192);
  const std::string d = temp_dir("lazy-first-use");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  std::atomic<bool> hold{true};
  ASSERT_TRUE(kill_and_restore_lazily(d, &hold).ok());
  // The background loaders have not loaded a byte: whatever a call names, the worker loads first.
  EXPECT_EQ(download<unsigned>(big_, big_data_.size()), big_data_);  // read (In)
  auto a = args(client().fill, static_cast<uint64_t>(odd_), 7u, 100);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 128), stream_, a).ok());  // partial write (InOut)
  ASSERT_TRUE(api().stream_synchronize(stream_).ok());
  std::vector<unsigned> odd = odd_data_;
  for (unsigned i = 0; i < 100; ++i) odd[i] = 7u + i;
  EXPECT_EQ(download<unsigned>(odd_, 777), odd);  // the kernel's bytes, and the image's beyond them
  ASSERT_TRUE(api().free(small_).ok());            // never loaded: dropped
  ASSERT_TRUE(api().device_synchronize().ok());
  LazyRestoreStats st = live_client().restore_stats();
  EXPECT_FALSE(st.complete);
  EXPECT_EQ(st.loaded_on_demand, 2u);
  EXPECT_EQ(st.dropped, 1u);
  EXPECT_EQ(st.loaded_in_background, 0u);
  hold.store(false);
  ASSERT_TRUE(live_client().wait_restored().ok());
  st = live_client().restore_stats();
  EXPECT_TRUE(st.complete);
  EXPECT_EQ(st.loaded_on_demand, 2u);
  EXPECT_EQ(st.loaded_in_background, 1u);
  EXPECT_EQ(download<unsigned>(rest, 2048), rest_data);
  EXPECT_EQ(download<unsigned>(big_, big_data_.size()), big_data_);
}

TEST_F(CheckpointTest, ACorruptBufferFoundLazilyFailsTheCallsThatNameItNeverWithWrongBytes) {
  build_state();
  const std::string d = temp_dir("lazy-good");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  const std::string bad = corrupt_copy(d, big_, "lazy-bad");
  // Found by the worker, before the call that reads the buffer (the loaders are held).
  std::atomic<bool> hold{true};
  ASSERT_TRUE(kill_and_restore_lazily(bad, &hold).ok());  // only the structure is checked up front
  std::vector<unsigned> got(big_data_.size());
  for (int attempt = 0; attempt < 2; ++attempt) {  // and every later call that names it
    Status s = api().memcpy(reinterpret_cast<uint64_t>(got.data()), big_, 20u << 20, cuda::kMemcpyDeviceToHost);
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.to_string();
    EXPECT_EQ(s.api_error(), cuda::kErrorEccUncorrectable) << s.to_string();
    EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.to_string();
  }
  EXPECT_NE(got, big_data_);
  // An asynchronous call that names it fails too, through the sticky error.
  auto a = args(client().fill, static_cast<uint64_t>(big_), 1u, 64);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 64), stream_, a).ok());
  EXPECT_EQ(api().device_synchronize().api_error(), cuda::kErrorEccUncorrectable);
  (void)api().get_last_error();
  EXPECT_EQ(download<unsigned>(odd_, 777), odd_data_);  // the other buffers are fine
  hold.store(false);
  Status w = live_client().wait_restored();
  EXPECT_EQ(w.code(), Code::kCorrupt) << w.to_string();
  // A checkpoint would not hold the job's state: refused, until the job drops the buffer.
  auto refused = dump(to_dir(temp_dir("lazy-refused")));
  EXPECT_EQ(refused.status().code(), Code::kCorrupt) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("lazy restore"), std::string::npos) << refused.status().to_string();
  ASSERT_TRUE(api().free(big_).ok());
  ASSERT_TRUE(api().device_synchronize().ok());  // cudaFree returns once parsed; the worker drops it
  EXPECT_TRUE(live_client().wait_restored().ok());
  EXPECT_TRUE(dump(to_dir(temp_dir("lazy-after-free"))).ok());

  // Found by a background loader first: wait_restored says so, and the call that names it fails.
  const std::string bad2 = corrupt_copy(d, big_, "lazy-bad2");
  ASSERT_TRUE(kill_and_restore_lazily(bad2).ok());
  w = live_client().wait_restored();
  EXPECT_EQ(w.code(), Code::kCorrupt) << w.to_string();
  EXPECT_EQ(live_client().restore_stats().failed, 1u);
  Status s = api().memcpy(reinterpret_cast<uint64_t>(got.data()), big_, 20u << 20, cuda::kMemcpyDeviceToHost);
  EXPECT_EQ(s.api_error(), cuda::kErrorEccUncorrectable) << s.to_string();
  EXPECT_EQ(download<unsigned>(small_, 1024), small_data_);
}

TEST_F(CheckpointTest, ACheckpointOfAClientStillLoadingLazilyWaitsForEveryBuffer) {
  build_state();
  const std::string d = temp_dir("lazy-src");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  std::atomic<bool> hold{true};
  ASSERT_TRUE(kill_and_restore_lazily(d, &hold).ok());
  const std::string again = temp_dir("lazy-again");
  std::atomic<bool> finished{false};
  StatusOr<CheckpointResult> r = Status::Internal("not run");
  std::thread t([&] {
    r = dump(to_dir(again));
    finished.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(finished.load()) << "the checkpoint did not wait for the lazy restore";
  hold.store(false);
  t.join();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(live_client().restore_stats().complete);
  // The new image has every byte (an unloaded buffer would have been stored as zeros).
  ASSERT_TRUE(kill_and_restore(again).ok());
  expect_state();
}

TEST_F(CheckpointTest, AnImageOfAnotherDeviceModelIsRefused) {
  build_state();
  const std::string d = temp_dir("model");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok());
  if (backend_name() != "host") GTEST_SKIP() << "the host backend's device name is configurable; a GPU's is not";
  Config other = test_config();
  other.host_device_name = "Another Device";
  clients_.clear();
  own_ws_.reset();
  ws_ = nullptr;
  auto ws = POSWorkspace::create(other);
  ASSERT_TRUE(ws.ok());
  auto u = (*ws)->restore(**img);
  EXPECT_EQ(u.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(u.status().message().find("Another Device"), std::string::npos) << u.status().to_string();
  // Mapped onto a device explicitly: the model must match all the same.
  RestoreOptions on0;
  on0.device = 0;
  u = (*ws)->restore(**img, on0);
  EXPECT_EQ(u.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(u.status().message().find("same device model"), std::string::npos) << u.status().to_string();
}

TEST_F(CheckpointTest, AnImageOfADeviceThatIsNotPresentIsRefusedUnlessMappedOntoOne) {
  if (backend_name() != "host") GTEST_SKIP() << "the host backend's device count is configurable; a machine's is not";
  Config two = test_config();
  two.host_device_count = 2;
  make_workspace(two);
  build_state();
  const std::string d0 = temp_dir("dev0"), d1 = temp_dir("dev1");
  ASSERT_TRUE(dump(to_dir(d0)).ok());
  RestoreOptions on1;
  on1.device = 1;
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  ASSERT_TRUE(restore_from(d0, on1).ok());
  EXPECT_EQ(live_client().device(), 1);
  ASSERT_TRUE(dump(to_dir(d1)).ok());
  auto img = ckpt::ImageReader::open_dir(d1);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ((*img)->client().client().device(), 1);
  EXPECT_NE(ckpt::describe_image(**img, false).find("on device 1"), std::string::npos);
  // A workspace with one device: the image's own device is not there; mapped onto device 0 it is.
  clients_.clear();
  own_ws_.reset();
  ws_ = nullptr;
  auto one = POSWorkspace::create(test_config());
  ASSERT_TRUE(one.ok());
  auto u = (*one)->restore(**img);
  EXPECT_EQ(u.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(u.status().message().find("device 1 is not present"), std::string::npos) << u.status().to_string();
  RestoreOptions on0;
  on0.device = 0;
  u = (*one)->restore(**img, on0);
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_EQ((*one)->find_client(*u)->device(), 0);
}

// A dump killed at each stage (POS_FAULT_POINT) leaves the previous image intact and restorable,
// whether the new image was going to a new directory or replacing the old one. The stages are in
// the image writer, the same for every backend; the host backend runs it (a forked child cannot
// use a CUDA context its parent opened).
TEST(CheckpointFaultTest, AKillAtAnyStageOfADumpLeavesThePreviousImageIntact) {
  Config cfg = test_config();
  cfg.backend = "host";
  const std::vector<std::string> stages = {"dump-begin", "dump-blob", "dump-records", "dump-inventory",
                                           "dump-exchanged", "dump-renamed"};
  const std::vector<unsigned> good = pattern(300000, 5);
  for (bool replace : {false, true}) {
    for (const std::string& stage : stages) {
      SCOPED_TRACE(stage + (replace ? " (replacing)" : " (new directory)"));
      const std::string a = temp_dir("fault-a"), b = temp_dir("fault-b");
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        // Child: no gtest assertions; the exit code says how far it got.
        auto ws = POSWorkspace::create(cfg);
        if (!ws.ok()) ::_exit(10);
        auto u = (*ws)->create_client("fault");
        if (!u.ok()) ::_exit(11);
        InProcessTransport t(ws->get(), *u);
        ApiClient api(&t);
        uint64_t p = 0;
        if (!api.malloc(&p, good.size() * 4).ok()) ::_exit(12);
        if (!api.memcpy(p, reinterpret_cast<uint64_t>(good.data()), good.size() * 4, cuda::kMemcpyHostToDevice).ok()) ::_exit(13);
        CheckpointRequest r;
        r.dir = a;
        if (!(*ws)->checkpoint(*u, r).ok()) ::_exit(14);
        std::vector<unsigned> bad(good.size(), 0xdead);
        if (!api.memcpy(p, reinterpret_cast<uint64_t>(bad.data()), bad.size() * 4, cuda::kMemcpyHostToDevice).ok()) ::_exit(15);
        ::setenv("POS_FAULT_POINT", stage.c_str(), 1);
        r.dir = replace ? a : b;
        r.replace = replace;
        (void)(*ws)->checkpoint(*u, r);
        ::_exit(0);  // the stage was not on this path (e.g. "exchanged" for a new directory)
      }
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "child failed early: " << WEXITSTATUS(status);
      // The image at `a`: the old one, or (killed after an atomic exchange) the complete new one.
      auto ws = POSWorkspace::create(cfg);
      ASSERT_TRUE(ws.ok());
      auto img = ckpt::ImageReader::open_dir(a);
      ASSERT_TRUE(img.ok()) << img.status().to_string();
      auto u = (*ws)->restore(**img);
      ASSERT_TRUE(u.ok()) << u.status().to_string();
      InProcessTransport t(ws->get(), *u);
      ApiClient api(&t);
      uint64_t p = 0;
      for (const auto& h : (*img)->client().handles())
        if (h.type() == static_cast<uint32_t>(ResourceType::kMemory)) p = h.addr();
      std::vector<unsigned> got(good.size());
      ASSERT_TRUE(api.memcpy(reinterpret_cast<uint64_t>(got.data()), p, got.size() * 4, cuda::kMemcpyDeviceToHost).ok());
      // Killed: the old image, except after the atomic exchange (then the complete new one). Not
      // killed (the stage is not on this path): the dump finished.
      const bool killed = WIFSIGNALED(status);
      const bool expect_new = replace && (!killed || stage == "dump-exchanged");
      EXPECT_EQ(got, expect_new ? std::vector<unsigned>(good.size(), 0xdead) : good);
      // A half-written image never passes for a complete one.
      if (!replace && fs::exists(b)) {
        EXPECT_TRUE(ckpt::ImageReader::open_dir(b).ok());
      }
      // The inventory is written last: before it, the partial directory is not an image.
      if (fs::exists(b + ".partial") && stage != "dump-inventory") {
        EXPECT_FALSE(ckpt::ImageReader::open_dir(b + ".partial").ok());
      }
    }
  }
}

}  // namespace
}  // namespace pos::test
