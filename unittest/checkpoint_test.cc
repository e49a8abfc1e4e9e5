// checkpoint_test.cc — the checkpoint engine end to end: sync, async copy-on-write and incremental
// images, restore at the same addresses, bad images refused, and crashes mid-dump (fault points).
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <tuple>
#include <fstream>
#include <thread>
#include <fcntl.h>
#include <sys/resource.h>

#include "ckpt/crc32c.h"
#include "ckpt/inspect.h"
#include "pos/base/hex.h"
#include "pos/base/text.h"
#include "pos/checkpoint/lazy_restore.h"
#include "pos/checkpoint/restore_gate.h"
#include "unittest/api_fixture.h"
#include "pos/runtime.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/wire.h"
#include "remoting/inproc/inproc_transport.h"
#include "remoting/server/peer_transfer.h"

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
  // An async checkpoint into `d` on a thread of its own, past its cut when this returns, its
  // drainer held until finish(): the test writes the job's buffers before the drain reads them.
  struct HeldAsync {
    std::atomic<bool> hold{true}, cut{false}, done{false};
    StatusOr<CheckpointResult> result = Status::Internal("not run");
    std::thread t;
    StatusOr<CheckpointResult>& finish() {
      hold.store(false);
      if (t.joinable()) t.join();
      return result;
    }
    ~HeldAsync() { (void)finish(); }
  };
  std::unique_ptr<HeldAsync> held_async(const std::string& d) {
    auto h = std::make_unique<HeldAsync>();
    CheckpointRequest req = to_dir(d, CheckpointMode::kAsync);
    req.hold_drain = &h->hold;
    req.on_cut = [p = h.get()](uint64_t) { p->cut.store(true); };
    h->t = std::thread([this, p = h.get(), r = std::move(req)]() mutable {
      p->result = dump(std::move(r));
      p->done.store(true);
    });
    while (!h->cut.load() && !h->done.load()) std::this_thread::yield();  // (a refused one never cuts)
    return h;
  }
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
  // A hold for a lazy restore's background loaders (true: they wait), owned by the fixture: a
  // loader thread may look at it after the test's block ended (one scheduled late, once the worker
  // loaded everything), until its client goes (the next restore, or TearDown's workspace reset).
  std::atomic<bool>& loader_hold() { return loader_holds_.emplace_back(true); }
  std::deque<std::atomic<bool>> loader_holds_;
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

  // ---- stop checkpoints ----
  // A stop checkpoint whose drain is held (CheckpointRequest::hold_drain) until finish_stop, so
  // that calls pile up after its cut.
  struct Stopping {
    std::atomic<bool> hold{true}, cut{false};
    StatusOr<CheckpointResult> result = Status::Internal("not run");
    std::thread thread;
  };
  void start_stop(Stopping& st, CheckpointRequest r) {
    r.stop = true;
    r.hold_drain = &st.hold;
    r.on_cut = [&st](uint64_t) { st.cut.store(true); };
    st.thread = std::thread([this, &st, r = std::move(r)]() mutable { st.result = dump(std::move(r)); });
    while (!st.cut.load()) std::this_thread::yield();
  }
  StatusOr<CheckpointResult> finish_stop(Stopping& st) {
    st.hold.store(false);
    st.thread.join();
    return st.result;
  }
  // Another workspace, as a restarted daemon would have: the clients' transports go with the old.
  void fresh_workspace() {
    for (auto& c : clients_) {
      c->api.reset();
      c->transport.reset();
    }
    server_.reset();
    own_ws_.reset();
    ws_ = nullptr;
    auto ws = create_workspace(test_config());
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    own_ws_ = std::move(*ws);
    ws_ = own_ws_.get();
  }
  // The asynchronous calls of the stop tests (every one returns once parsed): memsets, launches and
  // a host-to-device copy whose source the caller overwrites as soon as the call returns.
  void async_work(ApiClient& a, const RegisteredFunction& fill, uint64_t small, uint64_t big, uint64_t odd,
                  uint64_t stream) {
    ASSERT_TRUE(a.memset_async(big, 0x11, 1u << 20, stream).ok());
    ASSERT_TRUE(a.launch_kernel(fill.handle, dims(4, 256), stream, args(fill, small, 500u, 1024)).ok());
    std::vector<unsigned> src = pattern(777, 40);
    ASSERT_TRUE(a.memcpy_async(odd, reinterpret_cast<uint64_t>(src.data()), 777 * 4, cuda::kMemcpyHostToDevice, stream).ok());
    std::fill(src.begin(), src.end(), 0u);  // the call carried its bytes
    ASSERT_TRUE(a.memset(big + (4u << 20), 0x22, 1u << 20).ok());
    ASSERT_TRUE(a.launch_kernel(fill.handle, dims(1, 128), stream, args(fill, odd, 9u, 100)).ok());
    ASSERT_TRUE(a.launch_kernel(fill.handle, dims(4, 256), 0, args(fill, big + (8u << 20) + 4, 77u, 1000)).ok());
  }
  static constexpr uint64_t kAsyncWorkCalls = 6;
  // A copy of image `dir` whose records `edit` changed (client.pb re-encoded, the inventory's size
  // and checksum of it updated): a well-formed file with the damage inside the records.
  std::string edited_copy(const std::string& dir, const std::string& name,
                          const std::function<void(ckpt::pb::Inventory&, ckpt::pb::ClientImage&)>& edit) {
    const std::string c = temp_dir(name);
    fs::copy(dir, c);
    auto read = [](const std::string& f) {
      std::ifstream in(f, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    auto inv = ckpt::decode_inventory(read(c + "/inventory.pb"));
    EXPECT_TRUE(inv.ok()) << inv.status().to_string();
    ckpt::pb::ClientImage img;
    EXPECT_TRUE(img.ParseFromString(read(c + "/client.pb")));
    edit(*inv, img);
    std::string bytes;
    EXPECT_TRUE(img.SerializeToString(&bytes));
    inv->set_client_size(bytes.size());
    inv->set_client_crc(ckpt::crc32c(bytes.data(), bytes.size()));
    std::ofstream(c + "/client.pb", std::ios::binary | std::ios::trunc) << bytes;
    std::ofstream(c + "/inventory.pb", std::ios::binary | std::ios::trunc) << ckpt::encode_inventory(*inv);
    return c;
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

// A copy-on-write checkpoint's writers run at nice 19, so that the job, running on beside it, keeps
// the session's worker on its cores; a sync one's (the job waits for it) at the caller's nice.
TEST_F(CheckpointTest, ACopyOnWriteCheckpointWritesAtNice19AndASyncOneAtTheCallersNice) {
  build_state();
  const int mine = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  for (CheckpointMode mode : {CheckpointMode::kSync, CheckpointMode::kAsync}) {
    const std::string d = temp_dir(mode == CheckpointMode::kSync ? "nice-sync" : "nice-async");
    std::mutex mu;
    std::set<int> nices;
    CheckpointRequest req = to_dir(d, mode);
    req.on_written = [&](const std::string&, uint64_t, uint64_t) {
      const int n = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
      std::lock_guard<std::mutex> lk(mu);
      nices.insert(n);
    };
    auto r = dump(std::move(req));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_FALSE(nices.empty()) << "no range written was told of";
    EXPECT_EQ(nices, (std::set<int>{mode == CheckpointMode::kAsync ? 19 : mine}));
    ASSERT_TRUE(kill_and_restore(d).ok());
    expect_state();
    upload(odd_, odd_data_.data(), 777 * 4);
    ASSERT_TRUE(api().device_synchronize().ok());
  }
}

// Each type's record hook writes its own fields and its restore hook reads them all back: an image
// of the restored client has the same records, and the restored handles behave as configured.
// Image format 3 through the engine: a buffer fills memory.bin past kSpreadAfter, so the next
// large ones are striped chunk by chunk over the memory files (the drainer feeding every file's
// writer); sync and copy-on-write images both restore every byte, eagerly and lazily.
TEST_F(CheckpointTest, ALargeImageIsStripedOverMemoryFilesAndRestoresExactlyEagerlyAndLazily) {
  const uint64_t filler_bytes = ckpt::kSpreadAfter + (8u << 20);
  const uint64_t filler = alloc(filler_bytes);
  const std::vector<unsigned> filler_data = pattern(filler_bytes / 4, 9);
  upload(filler, filler_data.data(), filler_bytes);
  build_state();
  for (CheckpointMode mode : {CheckpointMode::kSync, CheckpointMode::kAsync}) {
    const std::string d = temp_dir(mode == CheckpointMode::kSync ? "striped-sync" : "striped-async");
    auto r = dump(to_dir(d, mode));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(fs::exists(d + "/memory.1.bin"));
    auto img = ckpt::ImageReader::open_dir(d);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    int striped = 0;
    for (const auto& h : (*img)->client().handles())
      if (h.has_memory() && h.memory().stripes() >= 2) {
        ++striped;
        EXPECT_EQ(h.addr(), big_) << "only the 20 MiB buffer is above kStripeAfter";
      }
    EXPECT_EQ(striped, 1);
    for (bool lazy : {false, true}) {
      if (lazy) {
        ASSERT_TRUE(kill_and_restore_lazily(d).ok());
      } else {
        ASSERT_TRUE(kill_and_restore(d).ok());
      }
      EXPECT_EQ(download<unsigned>(filler, filler_data.size()), filler_data) << (lazy ? "lazy" : "eager");
      expect_state();
      // expect_state() rewrote the odd buffer: put it back for the next round.
      upload(odd_, odd_data_.data(), 777 * 4);
      ASSERT_TRUE(api().device_synchronize().ok());
    }
  }
}

TEST_F(CheckpointTest, EveryResourceTypesOwnFieldsSurviveARestoreAndASecondImage) {
  build_state();
  uint64_t prio = 0, blas = 0, var = 0;
  ASSERT_TRUE(api().stream_create_with_priority(&prio, 1, -3).ok());
  ASSERT_TRUE(api().cublas_create(&blas).ok());
  ASSERT_TRUE(api().cublas_set_stream(blas, prio).ok());
  ASSERT_TRUE(api().cublas_set_math_mode(blas, 3).ok());
  ASSERT_TRUE(api().func_set_attribute(client().axpy.handle, 8, 32 << 10).ok());
  ASSERT_TRUE(api().register_var(&var, client().module, "coeffs", 64, /*constant=*/true).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  const std::string d0 = temp_dir("fields0"), d1 = temp_dir("fields1");
  ASSERT_TRUE(dump(to_dir(d0)).ok());
  ASSERT_TRUE(kill_and_restore(d0).ok());
  ASSERT_TRUE(dump(to_dir(d1)).ok());
  auto first = ckpt::ImageReader::open_dir(d0);
  auto second = ckpt::ImageReader::open_dir(d1);
  ASSERT_TRUE(first.ok() && second.ok());
  auto records = [](const ckpt::ImageReader& img) {
    std::vector<std::string> out;
    for (ckpt::pb::HandleRecord h : img.client().handles()) {
      h.clear_memory();  // where the bytes lie in memory.bin differs between images
      out.push_back(h.DebugString());
    }
    return out;
  };
  EXPECT_EQ(records(**first), records(**second));
  bool saw_prio = false, saw_blas = false, saw_attr = false, saw_var = false, saw_module = false;
  for (const auto& h : (*first)->client().handles()) {
    const auto t = static_cast<ResourceType>(h.type());
    saw_prio |= t == ResourceType::kStream && h.addr() == prio && h.flags() == 1 && h.priority() == -3;
    saw_blas |= t == ResourceType::kCublas && h.bound_stream() == prio && h.math_mode() == 3;
    saw_attr |= t == ResourceType::kFunction && h.func_attrs_size() == 1 && h.func_attrs(0).value() == 32 << 10;
    saw_var |= t == ResourceType::kVar && h.name() == "coeffs" && h.flags() == 1 && h.charged() >= 64;
    saw_module |= t == ResourceType::kModule && !h.fatbin().empty();
  }
  EXPECT_TRUE(saw_prio && saw_blas && saw_attr && saw_var && saw_module)
      << saw_prio << saw_blas << saw_attr << saw_var << saw_module;
  // The restored handles behave as configured.
  uint64_t bound = 0;
  ASSERT_TRUE(api().cublas_get_stream(blas, &bound).ok());
  EXPECT_EQ(bound, prio);
  FuncAttributes fa{};
  ASSERT_TRUE(api().func_get_attributes(&fa, client().axpy.handle).ok());
  EXPECT_EQ(fa.max_dynamic_shared_size_bytes, 32 << 10);
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

// The names a handle record holds, by type (function, var), in record order.
std::vector<std::string> names_of(const ckpt::pb::ClientImage& c, ResourceType t) {
  std::vector<std::string> out;
  for (const auto& h : c.handles())
    if (h.type() == static_cast<uint32_t>(t)) out.push_back(h.name());
  return out;
}

TEST_F(CheckpointTest, AJobNameAndSymbolNamesThatAreNotUtf8AreCheckpointedReadBackAndRestored) {
  // What a hostile client may send: a job name and kernel and variable names of any bytes.
  TestClient& c = add_client("caf\xe9 \x1b[2J\a");
  const std::string shown = "caf\\xe9 \\x1b[2J\\x07";  // the job name as POS keeps it
  const std::string kernel = "_Z4k\xff\xfe\xc0\xaf";
  const std::string var = "v\xed\xa0\x80\x1b]0;x";
  RegisteredFunction f;
  ASSERT_TRUE(c.api->register_function(&f, c.module, kernel).ok());
  EXPECT_FALSE(f.found);  // no such kernel: launches fail, the name is still the job's
  uint64_t v = 0;
  const Status vs = c.api->register_var(&v, c.module, var, 256, false);
  // The host backend binds a variable of any name (its kernels are C++); a real device binds only
  // what the module holds, so there the registration fails, naming the symbol without its raw bytes,
  // and the bytes below live in a buffer instead.
  const bool host = test_config().backend == "host";
  if (host) {
    ASSERT_TRUE(vs.ok()) << vs.to_string();
  } else {
    ASSERT_FALSE(vs.ok());
    EXPECT_EQ(vs.message().find('\x1b'), std::string::npos) << vs.message();
    EXPECT_NE(vs.message().find("v\\xed"), std::string::npos) << vs.message();
    ASSERT_TRUE(c.api->malloc(&v, 256).ok());
  }
  const std::vector<unsigned> bytes = pattern(64, 5);
  upload(v, bytes.data(), 256, 1);
  const std::string d = temp_dir("hostile-names");
  auto r = ws_->checkpoint(c.uuid, to_dir(d));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  const auto& cimg = (*img)->client();
  EXPECT_EQ(cimg.client().job_name(), shown);
  EXPECT_EQ(names_of(cimg, ResourceType::kFunction).back(), kernel);  // byte for byte
  if (host) {
    EXPECT_EQ(names_of(cimg, ResourceType::kVar).back(), var);
  }
  // An operator's terminal sees none of those bytes raw.
  const std::string text = ckpt::describe_image(**img, false);
  EXPECT_TRUE(is_utf8(text)) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("_Z4k\\xff\\xfe\\xc0\\xaf"), std::string::npos) << text;

  ASSERT_TRUE(ws_->remove_client(c.uuid).ok());
  auto u = ws_->restore(**img);
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  auto restored = ws_->find_client(*u);
  ASSERT_TRUE(restored != nullptr);
  EXPECT_EQ(restored->job_name(), shown);
  InProcessTransport t(ws_, *u);
  ApiClient a(&t);
  std::vector<unsigned> got(64);
  ASSERT_TRUE(a.memcpy(reinterpret_cast<uint64_t>(got.data()), v, 256, cuda::kMemcpyDeviceToHost).ok());
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(a.launch_kernel(f.handle, dims(1, 1), 0, {}).api_error(), cuda::kErrorInvalidDeviceFunction);
  // The restored client keeps the names exactly: its next image holds them again.
  const std::string d2 = temp_dir("hostile-names-again");
  auto r2 = ws_->checkpoint(*u, to_dir(d2));
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  auto img2 = ckpt::ImageReader::open_dir(d2);
  ASSERT_TRUE(img2.ok()) << img2.status().to_string();
  EXPECT_EQ((*img2)->client().client().job_name(), shown);
  EXPECT_EQ(names_of((*img2)->client(), ResourceType::kFunction), names_of(cimg, ResourceType::kFunction));
  EXPECT_EQ(names_of((*img2)->client(), ResourceType::kVar), names_of(cimg, ResourceType::kVar));
}

TEST_F(CheckpointTest, AnImageWhoseJobNameHoldsControlCharactersRestoresWithThemEscaped) {
  // An image written before names were sanitized (valid UTF-8, so it reads): ESC and BEL in its
  // job name must not reach logs or `pos-cli ps` through the restored client.
  build_state();
  const std::string d = temp_dir("old-name");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  ckpt::pb::ClientImage c;
  {
    std::ifstream in(d + "/client.pb", std::ios::binary);
    ASSERT_TRUE(c.ParseFromIstream(&in));
  }
  c.mutable_client()->set_job_name("old\x1b[2J\a");
  std::string cbytes;
  ASSERT_TRUE(c.SerializeToString(&cbytes));
  std::string ibytes;
  {
    std::ifstream in(d + "/inventory.pb", std::ios::binary);
    ibytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto inv = ckpt::decode_inventory(ibytes);
  ASSERT_TRUE(inv.ok()) << inv.status().to_string();
  inv->set_client_size(cbytes.size());
  inv->set_client_crc(ckpt::crc32c(cbytes.data(), cbytes.size()));
  std::ofstream(d + "/client.pb", std::ios::binary | std::ios::trunc) << cbytes;
  std::ofstream(d + "/inventory.pb", std::ios::binary | std::ios::trunc) << ckpt::encode_inventory(*inv);
  ASSERT_TRUE(kill_and_restore(d).ok());
  EXPECT_EQ(live_client().job_name(), "old\\x1b[2J\\x07");
  expect_state();
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
  auto held = held_async(d);
  // The drainer has not copied a byte yet; the job writes every buffer through three paths.
  ASSERT_TRUE(api().memset(big_, 0x5a, 20u << 20).ok());
  auto a = args(client().fill, static_cast<uint64_t>(small_), 1234u, 1024);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, a).ok());
  ASSERT_TRUE(api().stream_synchronize(stream_).ok());
  ASSERT_TRUE(api().free(odd_).ok());
  auto& result = held->finish();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->shadow_bytes, (20u << 20) + 4096u + 777 * 4);
  // The worker's time on those shadows is what the job's calls waited: some, within the checkpoint.
  EXPECT_GT(result->shadow_s, 0.0);
  EXPECT_LT(result->shadow_s, result->total_s);
  EXPECT_GT(result->shadow_alloc_s, 0.0);  // one allocation per shadowed buffer, part of that time
  EXPECT_LE(result->shadow_alloc_s, result->shadow_s);
  EXPECT_EQ(download<unsigned>(small_, 1024), filled(1024, 1234u));
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
}

// The worker does not wait for a shadow's copy on a GPU: the call that writes the buffer waits for
// it on the device. A 256 MiB copy is still running when the memset right behind it would start,
// so an image that holds every byte of the cut shows the write came after the copy.
TEST_F(CheckpointTest, AWriteRightAfterTheCutToALargeBufferWaitsForItsShadowsCopy) {
  build_state();
  constexpr uint64_t kBytes = 256ull << 20;
  const uint64_t large = alloc(kBytes);
  const std::vector<unsigned> data = pattern(kBytes / 4, 9);
  upload(large, data.data(), kBytes);
  ASSERT_TRUE(api().device_synchronize().ok());
  const std::string d = temp_dir("fenced");
  auto held = held_async(d);
  ASSERT_TRUE(api().memset(large, 0xee, kBytes).ok());
  ASSERT_TRUE(api().device_synchronize().ok());  // (stream_ does not wait for the default stream)
  auto a = args(client().fill, large + kBytes / 2, 77u, 1024);  // and a kernel on another stream
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, a).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  auto& result = held->finish();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->shadow_bytes, kBytes);
  EXPECT_EQ(download<unsigned>(large + kBytes / 2, 1024), filled(1024, 77u));  // the job's writes landed
  ASSERT_TRUE(kill_and_restore(d).ok());
  expect_state();
  EXPECT_TRUE(download<unsigned>(large, kBytes / 4) == data) << "the image does not hold the cut's bytes";
}

// checkpoint.keep_shadows: on a GPU the session keeps the memory an async checkpoint's shadows used
// for the next one (its first checkpoint grew the pool ahead of the cut, then gave back what the
// shadows did not use), and keeps nothing without it. The host backend's shadows are plain host
// memory, kept by nobody. Either way every image holds its cut.
TEST_F(CheckpointTest, ShadowsAreKeptForTheNextCheckpointOnlyWhereTheConfigSaysSo) {
  for (const bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "keep_shadows: true" : "keep_shadows: false");
    Config c = test_config();
    c.ckpt_keep_shadows = keep;
    make_workspace(c);
    build_state();
    const bool kept_here = keep && ws_->backend().name() == "cuda";
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("checkpoint " + std::to_string(round + 1));
      const std::string d = temp_dir("kept-" + std::to_string(keep) + "-" + std::to_string(round));
      auto held = held_async(d);
      ASSERT_TRUE(api().memset(big_, 0x40 + round, 20u << 20).ok());
      ASSERT_TRUE(api().device_synchronize().ok());
      auto& result = held->finish();
      ASSERT_TRUE(result.ok()) << result.status().to_string();
      EXPECT_GE(result->shadow_bytes, 20u << 20);
      if (kept_here) {
        EXPECT_GE(result->shadow_kept, result->shadow_bytes);
        // Ahead of the first cut the pool grew to the job's memory (half the free memory at most);
        // what the shadows did not use went back (a pool's chunks are whole granules).
        EXPECT_LE(result->shadow_kept, result->shadow_bytes + (64u << 20));
      } else {
        EXPECT_EQ(result->shadow_kept, 0u);
      }
      ASSERT_TRUE(kill_and_restore(d).ok());
      expect_state();
      upload(odd_, odd_data_.data(), 777 * 4);  // (expect_state's kernel rewrote it)
    }
  }
}

// Into memory that was never page-locked (on a GPU: the copier's staging lanes, several chunks in
// flight at once) while the job writes its largest buffer during the drain: the image is the cut's.
TEST_F(CheckpointTest, AnAsyncCheckpointIntoPageableMemoryHoldsTheCutWhileTheJobWritesDuringTheDrain) {
  build_state();
  ckpt::MemoryImage mem(ckpt::HostAllocator::pageable());
  CheckpointRequest req;
  req.memory = &mem;
  req.mode = CheckpointMode::kAsync;
  std::atomic<bool> cut{false};
  req.on_cut = [&](uint64_t) { cut.store(true); };
  StatusOr<CheckpointResult> result = Status::Internal("not run");
  std::thread t([&] { result = dump(std::move(req)); });
  while (!cut.load()) std::this_thread::yield();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(api().memset(big_ + (i % 5) * (4u << 20), 0x30 + i, 4u << 20).ok());
  t.join();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->bytes_stored, (20u << 20) + 4096u + 777u * 4);
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  auto img = ckpt::ImageReader::open_memory(&mem);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  auto u = ws_->restore(**img);
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  reattach(*u);
  expect_state();
}

// `pos-cli dump` without --leave-running: CRIU ends the job right after the cut while its bytes
// still drain, and its session removes the client. The removal waits for the drain: the image is
// whole and restores, instead of the drain reading device memory already freed.
TEST_F(CheckpointTest, RemovingAClientWhileItsCheckpointDrainsFinishesTheImageFirst) {
  build_state();
  const std::string d = temp_dir("removed-while-draining");
  std::atomic<bool> hold{true}, cut{false};
  CheckpointRequest req = to_dir(d, CheckpointMode::kAsync);
  req.hold_drain = &hold;
  req.on_cut = [&](uint64_t) { cut.store(true); };
  StatusOr<CheckpointResult> result = Status::Internal("not run");
  std::thread t([&] { result = dump(std::move(req)); });
  while (!cut.load()) std::this_thread::yield();
  std::atomic<bool> removed{false};
  Status rm;
  std::thread remover([&] {
    rm = ws_->remove_client(client().uuid);
    removed.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed.load()) << "the client went while its checkpoint still had every byte to drain";
  hold.store(false);
  t.join();
  remover.join();
  ASSERT_TRUE(rm.ok()) << rm.to_string();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_TRUE(restore_from(d).ok());
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

// pos-cli migrate's peer switch (docs/migration.md): a peer image stores no buffer bytes (each is
// marked in_peer), the client hands out its memory as descriptors, and a restore given that memory
// copies every buffer from it; the same image without it, or lazily, is refused.
TEST_F(CheckpointTest, APeerImageStoresNoBufferBytesAndRestoresOnlyFromTheMemoryHandedOver) {
  build_state();
  const std::string d = temp_dir("peer");
  CheckpointRequest req = to_dir(d);
  req.peer = true;
  auto r = dump(std::move(req));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(r->bytes_referenced, 4096u + (20u << 20) + 777 * 4);
  {
    auto img = ckpt::ImageReader::open_dir(d);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    int peer = 0;
    for (const auto& h : (*img)->client().handles())
      if (h.has_memory() && h.type() == static_cast<uint32_t>(ResourceType::kMemory)) {
        EXPECT_TRUE(h.memory().in_peer()) << h.addr();
        EXPECT_EQ(h.memory().length(), 0u);
        ++peer;
      }
    EXPECT_EQ(peer, 3);
    const auto& f = (*img)->inventory().features();
    EXPECT_NE(std::find(f.begin(), f.end(), "peer"), f.end());
  }
  auto mem = live_client().export_peer_memory();
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  uint64_t bytes = 0;
  for (const PeerMemory& m : *mem) {
    EXPECT_GE(m.fd, 0);
    bytes += m.size;
  }
  EXPECT_GE(bytes, 4096u + (20u << 20) + 777 * 4);
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  // From files: refused by name, nothing restored.
  Status files = restore_from(d);
  EXPECT_EQ(files.code(), Code::kFailedPrecondition) << files.to_string();
  EXPECT_NE(files.message().find("peer session"), std::string::npos) << files.to_string();
  RestoreOptions lazy;
  lazy.lazy = true;
  lazy.peer = &*mem;
  EXPECT_EQ(restore_from(d, lazy).code(), Code::kInvalidArgument);
  // Memory that lacks the end of a buffer: refused before anything is copied.
  const uint64_t big_last = big_ + (20u << 20) - 1;
  std::vector<PeerMemory> partial;
  for (PeerMemory& m : *mem)
    if (!(m.addr <= big_last && big_last < m.addr + m.size)) partial.emplace_back(m.addr, m.size, ::dup(m.fd));
  RestoreOptions some;
  some.peer = &partial;
  Status lacking = restore_from(d, some);
  EXPECT_EQ(lacking.code(), Code::kInvalidArgument) << lacking.to_string();
  EXPECT_NE(lacking.message().find(pos::hex(big_)), std::string::npos) << lacking.to_string();
  RestoreOptions all;
  all.peer = &*mem;
  Status s = restore_from(d, all);
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_state();
}

// A record that claims its bytes are in a peer session and also says where they are stored (or is
// a variable, whose bytes are always stored) is damage: refused at open.
TEST_F(CheckpointTest, AnInPeerRecordThatAlsoNamesStoredBytesIsRefusedAsCorrupt) {
  build_state();
  const std::string d = temp_dir("peer-damaged-src");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  const std::string c = edited_copy(d, "peer-damaged", [&](ckpt::pb::Inventory&, ckpt::pb::ClientImage& img) {
    for (auto& h : *img.mutable_handles())
      if (h.addr() == big_) h.mutable_memory()->set_in_peer(true);  // offset, length and checksums stay
  });
  auto img = ckpt::ImageReader::open_dir(c);
  ASSERT_FALSE(img.ok());
  EXPECT_EQ(img.status().code(), Code::kCorrupt) << img.status().to_string();
  EXPECT_NE(img.status().message().find("peer session"), std::string::npos) << img.status().to_string();
}

TEST(PeerMemoryCheck, RangesOutsideTheClientOverlappingUnalignedOrWithoutADescriptorAndBuffersOutsideThemAreRefused) {
  const uint64_t base = 1ull << 40, span = 1ull << 30, g = 2u << 20;
  auto ranges = [](std::initializer_list<std::tuple<uint64_t, uint64_t, int>> l) {
    std::vector<PeerMemory> v;
    for (const auto& [a, n, fd] : l) v.emplace_back(a, n, fd < 0 ? -1 : ::dup(fd));
    return v;
  };
  const int fd = 0;  // any open descriptor: check_peer_memory never reads it
  auto ok = check_peer_memory(ranges({{base + 4 * g, g, fd}, {base, 2 * g, fd}, {base + 2 * g, g, fd}}),
                              {{base + 4 * g + 16, 64}, {base + g, g}, {base, 8}, {base + g + 8, g + 16}}, base, span, g);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  // A buffer across two adjoining ranges comes in two pieces.
  std::vector<std::tuple<size_t, uint64_t, uint64_t>> got;
  for (const PeerPiece& x : *ok) got.emplace_back(x.range, x.addr, x.size);
  EXPECT_EQ(got, (std::vector<std::tuple<size_t, uint64_t, uint64_t>>{{0, base + 4 * g + 16, 64},
                                                                      {1, base + g, g},
                                                                      {1, base, 8},
                                                                      {1, base + g + 8, g - 8},
                                                                      {2, base + 2 * g, 24}}));
  struct Bad {
    std::vector<PeerMemory> rs;
    std::vector<PeerBuffer> bs;
    std::string says;
  };
  std::vector<Bad> bad;
  bad.push_back({ranges({{base - g, g, fd}}), {}, "outside the client's range"});
  bad.push_back({ranges({{base + span - g, 2 * g, fd}}), {}, "outside the client's range"});
  bad.push_back({ranges({{base, 2 * g, fd}, {base + g, g, fd}}), {}, "overlaps"});
  bad.push_back({ranges({{base + 4096, g, fd}}), {}, "not aligned"});
  bad.push_back({ranges({{base, 0, fd}}), {}, "empty"});
  bad.push_back({ranges({{base, g, -1}}), {}, "without its descriptor"});
  bad.push_back({ranges({{base + g, g, fd}}), {{base, 8}}, "not wholly inside the memory"});
  bad.push_back({ranges({{base, g, fd}}), {{base + g - 8, 16}}, "not wholly inside the memory"});
  bad.push_back({ranges({{base, g, fd}, {base + 2 * g, g, fd}}), {{base + g - 8, g + 16}}, "nothing at " + pos::hex(base + g)});
  bad.push_back({ranges({{base, g, fd}}), {{base, 0}}, "empty"});
  for (const Bad& b : bad) {
    auto r = check_peer_memory(b.rs, b.bs, base, span, g);
    ASSERT_FALSE(r.ok()) << b.says;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().to_string();
  }
}

// The peer table on a socket: what send_peer_table sends arrives whole, each range with a working
// descriptor; a failure header, a range without its descriptor, ranges out of order and a byte count
// that does not add up are refused.
TEST(PeerTable, ATableArrivesWithEveryDescriptorAndMalformedTablesAreRefused) {
  auto pair = [] {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    return std::make_pair(UniqueFd(sv[0]), UniqueFd(sv[1]));
  };
  auto memfd_with = [](char c) {
    const int fd = ::memfd_create("peer-test", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pwrite(fd, &c, 1, 0), 1);
    return fd;
  };
  {
    auto [a, b] = pair();
    std::vector<PeerMemory> out;
    out.emplace_back(0x1000, 4096, memfd_with('x'));
    out.emplace_back(0x3000, 8192, memfd_with('y'));
    ASSERT_TRUE(send_peer_table(a.get(), out).ok());
    auto in = recv_peer_table(b.get());
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    ASSERT_EQ(in->size(), 2u);
    EXPECT_EQ((*in)[1].addr, 0x3000u);
    EXPECT_EQ((*in)[1].size, 8192u);
    char c = 0;
    EXPECT_EQ(::pread((*in)[1].fd, &c, 1, 0), 1);
    EXPECT_EQ(c, 'y');
  }
  {  // a table of several batches (wire::kPeerBatch ranges each, the last one shorter), in order
    auto [a, b] = pair();
    std::vector<PeerMemory> out;
    const uint32_t n = 3 * wire::kPeerBatch + 5;
    for (uint32_t i = 0; i < n; ++i) out.emplace_back(0x100000 + 0x2000ull * i, 4096, memfd_with(static_cast<char>('a' + i % 26)));
    std::thread sender([&] { EXPECT_TRUE(send_peer_table(a.get(), out).ok()); });
    auto in = recv_peer_table(b.get());
    sender.join();
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    ASSERT_EQ(in->size(), n);
    for (uint32_t i = 0; i < n; ++i) {
      EXPECT_EQ((*in)[i].addr, 0x100000 + 0x2000ull * i);
      char c = 0;
      ASSERT_EQ(::pread((*in)[i].fd, &c, 1, 0), 1);
      EXPECT_EQ(c, static_cast<char>('a' + i % 26)) << "range " << i << " came with another range's descriptor";
    }
  }
  {
    auto [a, b] = pair();
    ASSERT_TRUE(send_peer_failure(a.get(), Status::Unsupported("no shareable handle")).ok());
    auto in = recv_peer_table(b.get());
    EXPECT_EQ(in.status().code(), Code::kUnsupported);
    EXPECT_NE(in.status().message().find("no shareable handle"), std::string::npos);
  }
  auto header = [](uint32_t count, uint64_t bytes) {
    wire::PeerHeader h;
    h.count = count, h.bytes = bytes;
    return h;
  };
  {  // a range without its descriptor
    auto [a, b] = pair();
    wire::PeerHeader h = header(1, 4096);
    wire::PeerRange r;
    r.addr = 0x1000, r.size = 4096;
    ASSERT_TRUE(send_all(a.get(), &h, sizeof(h)).ok());
    ASSERT_TRUE(send_all(a.get(), &r, sizeof(r)).ok());
    auto in = recv_peer_table(b.get());
    EXPECT_EQ(in.status().code(), Code::kInvalidArgument) << in.status().to_string();
    EXPECT_NE(in.status().message().find("without its descriptor"), std::string::npos);
  }
  {  // out of order
    auto [a, b] = pair();
    wire::PeerHeader h = header(1, 4096);
    wire::PeerRange r;
    r.index = 5, r.addr = 0x1000, r.size = 4096;
    const int fd = memfd_with('z');
    ASSERT_TRUE(send_all(a.get(), &h, sizeof(h)).ok());
    ASSERT_TRUE(send_with_fds(a.get(), &r, sizeof(r), {fd}).ok());
    ::close(fd);
    EXPECT_EQ(recv_peer_table(b.get()).status().code(), Code::kCorrupt);
  }
  {  // bytes that do not add up, and a count past the limit
    auto [a, b] = pair();
    wire::PeerHeader h = header(1, 1);
    wire::PeerRange r;
    r.addr = 0x1000, r.size = 4096;
    const int fd = memfd_with('z');
    ASSERT_TRUE(send_all(a.get(), &h, sizeof(h)).ok());
    ASSERT_TRUE(send_with_fds(a.get(), &r, sizeof(r), {fd}).ok());
    ::close(fd);
    EXPECT_EQ(recv_peer_table(b.get()).status().code(), Code::kCorrupt);
    auto [c, e] = pair();
    wire::PeerHeader big = header(wire::kMaxPeerRanges + 1, 0);
    ASSERT_TRUE(send_all(c.get(), &big, sizeof(big)).ok());
    EXPECT_EQ(recv_peer_table(e.get()).status().code(), Code::kInvalidArgument);
  }
}

// The descriptor table is grown ahead of a peer switch (the kernel's FDSize in /proc/self/status),
// and growing it takes no descriptor: the next one opened is still the lowest free.
TEST(PeerTable, ThePreparedDescriptorTableIsLargeAndHoldsNoExtraDescriptor) {
  auto fd_size = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("FDSize:", 0) == 0) return std::stol(line.substr(7));
    return 0L;
  };
  const int before = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(before, 0);
  ::close(before);
  prepare_descriptor_table(2048);
  rlimit r{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  EXPECT_GE(fd_size(), static_cast<long>(std::min<rlim_t>(r.rlim_cur, 2048)));
  const int after = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(after, before);
  ::close(after);
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

TEST_F(CheckpointTest, AnEstimateTellsWhatTheNextIncrementalImageStoresAndCutsAndWritesNothing) {
  build_state();
  const std::string base = temp_dir("est0"), next = temp_dir("est1");
  ASSERT_TRUE(dump(to_dir(base)).ok());
  // Nothing written since: everything is referenced.
  auto e0 = ws_->estimate_increment(client().uuid, base);
  ASSERT_TRUE(e0.ok()) << e0.status().to_string();
  EXPECT_EQ(e0->bytes_stored, 0u);
  EXPECT_EQ(e0->bytes_referenced, 4096u + (20u << 20) + 777u * 4);
  odd_data_ = pattern(777, 21);
  upload(odd_, odd_data_.data(), 777 * 4);
  auto e1 = ws_->estimate_increment(client().uuid, base);
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  EXPECT_EQ(e1->bytes_stored, 777u * 4);
  EXPECT_EQ(e1->bytes_referenced, 4096u + (20u << 20));
  EXPECT_GT(e1->handles, 0u);
  // It wrote nothing and changed nothing: the image taken next stores exactly what it said.
  EXPECT_FALSE(fs::exists(next));
  CheckpointRequest r = to_dir(next);
  r.parent_dir = base;
  auto i = dump(std::move(r));
  ASSERT_TRUE(i.ok()) << i.status().to_string();
  EXPECT_EQ(i->bytes_stored, e1->bytes_stored);
  EXPECT_EQ(i->bytes_referenced, e1->bytes_referenced);
  EXPECT_EQ(i->cut_pc, e1->cut_pc);  // no call in between: the estimate's point is the cut's
  // A directory that holds no image is refused.
  EXPECT_FALSE(ws_->estimate_increment(client().uuid, temp_dir("est-none")).ok());
  ASSERT_TRUE(kill_and_restore(next).ok());
  expect_state();
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
  std::atomic<bool>& hold = loader_hold();
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
  std::atomic<bool>& hold = loader_hold();
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

// A large buffer loads in parts (here a part per 8 MiB chunk: big_ has three), taken by the worker,
// by the background loaders, or by both: its bytes arrive whole either way, and a damaged chunk in
// any part fails the calls that name it.
TEST_F(CheckpointTest, ABufferLoadedInPartsArrivesWholeWhoeverTakesItsPartsAndADamagedPartFailsIt) {
  set_lazy_part_bytes_for_test(1);
  struct Reset {
    ~Reset() { set_lazy_part_bytes_for_test(0); }
  } reset;
  build_state();
  const std::string d = temp_dir("lazy-parts");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  {  // the worker alone (the loaders are held)
    std::atomic<bool>& hold = loader_hold();
    ASSERT_TRUE(kill_and_restore_lazily(d, &hold).ok());
    EXPECT_EQ(download<unsigned>(big_, big_data_.size()), big_data_);
    EXPECT_EQ(live_client().restore_stats().loaded_on_demand, 1u);
    hold.store(false);
    ASSERT_TRUE(live_client().wait_restored().ok());
  }
  {  // the loaders, then the worker on whatever is left
    ASSERT_TRUE(kill_and_restore_lazily(d).ok());
    EXPECT_EQ(download<unsigned>(big_, big_data_.size()), big_data_);
    ASSERT_TRUE(live_client().wait_restored().ok());
    EXPECT_EQ(download<unsigned>(small_, 1024), small_data_);
    EXPECT_EQ(download<unsigned>(odd_, 777), odd_data_);
  }
  {  // a damaged chunk
    const std::string bad = corrupt_copy(d, big_, "lazy-parts-bad");
    std::atomic<bool>& hold = loader_hold();
    ASSERT_TRUE(kill_and_restore_lazily(bad, &hold).ok());
    std::vector<unsigned> got(big_data_.size());
    Status s = api().memcpy(reinterpret_cast<uint64_t>(got.data()), big_, 20u << 20, cuda::kMemcpyDeviceToHost);
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.to_string();
    EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.to_string();
    hold.store(false);
    EXPECT_EQ(live_client().wait_restored().code(), Code::kCorrupt);
  }
}

TEST_F(CheckpointTest, ACheckpointOfAClientStillLoadingLazilyWaitsForEveryBuffer) {
  build_state();
  const std::string d = temp_dir("lazy-src");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  std::atomic<bool>& hold = loader_hold();
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

TEST_F(CheckpointTest, WithLazyOkAClientStillLoadingIsCheckpointedAtOnceTakingUnloadedBuffersFromItsImage) {
  build_state();
  const std::string d = temp_dir("lazyok-src");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  for (CheckpointMode mode : {CheckpointMode::kSync, CheckpointMode::kAsync}) {
    std::atomic<bool>& hold = loader_hold();  // the background loaders load nothing during this test
    ASSERT_TRUE(kill_and_restore_lazily(d, &hold).ok());
    // One buffer is named by a call (loaded on demand, then written); the others stay unloaded.
    auto a = args(client().fill, static_cast<uint64_t>(odd_), 5u, 50);
    ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(1, 64), stream_, a).ok());
    ASSERT_TRUE(api().stream_synchronize(stream_).ok());
    std::vector<unsigned> odd = odd_data_;
    for (unsigned i = 0; i < 50; ++i) odd[i] = 5u + i;
    const std::string again = temp_dir(mode == CheckpointMode::kSync ? "lazyok-sync" : "lazyok-async");
    CheckpointRequest r = to_dir(again, mode);
    r.lazy_ok = true;
    std::atomic<bool> cut{false};
    std::atomic<bool> hold_drain{mode == CheckpointMode::kAsync};
    r.hold_drain = &hold_drain;
    r.on_cut = [&](uint64_t) { cut.store(true); };
    StatusOr<CheckpointResult> res = Status::Internal("not run");
    std::thread t([&] { res = dump(std::move(r)); });
    if (mode == CheckpointMode::kAsync) {
      while (!cut.load()) std::this_thread::yield();
      // After the cut the job writes a buffer that was unloaded at the cut: it is loaded, written,
      // and the image still gets the cut's bytes (from the image, no shadow needed).
      ASSERT_TRUE(api().memset(big_, 0x7f, 4096).ok());
      hold_drain.store(false);
    }
    t.join();
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_FALSE(live_client().restore_stats().complete) << "the checkpoint waited for the lazy restore";
    EXPECT_EQ(res->bytes_from_image, (20u << 20) + 4096u);  // big_ and small_ were unloaded at the cut
    EXPECT_EQ(res->bytes_stored, (20u << 20) + 4096u + 777u * 4);
    EXPECT_EQ(res->shadow_bytes, 0u);
    EXPECT_EQ(res->shadow_s, 0.0);  // nothing shadowed, so the job's calls waited for none
    hold.store(false);
    ASSERT_TRUE(kill_and_restore(again).ok());
    EXPECT_EQ(download<unsigned>(odd_, 777), odd);
    EXPECT_EQ(download<unsigned>(big_, big_data_.size()), big_data_);
    EXPECT_EQ(download<unsigned>(small_, 1024), small_data_);
  }
}

TEST_F(CheckpointTest, ALazyRestoresLoadersTakeTheStagingChunksKeptAheadAndGiveThemBack) {
  build_state();
  const std::string d = temp_dir("kept");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  DeviceBackend& backend = ws_->backend();
  // The dump gave its staging chunks back: kept for the next checkpoint or restore.
  const size_t after_dump = backend.staging_chunks_kept();
  EXPECT_GE(after_dump, 2u);
  backend.release_staging_chunks();
  EXPECT_EQ(backend.staging_chunks_kept(), 0u);
  const size_t ahead = restore_loader_threads() + 1;
  ASSERT_EQ(backend.keep_staging_chunks(ahead), ahead);
  EXPECT_EQ(backend.keep_staging_chunks(ahead), ahead) << "kept once: a second call makes none";
  std::atomic<bool>& hold = loader_hold();
  ASSERT_TRUE(kill_and_restore_lazily(d, &hold).ok());
  // Each background loader (one per buffer, at most restore_loader_threads()) and the worker took one.
  const uint64_t buffers = live_client().restore_stats().buffers;
  ASSERT_GE(buffers, 3u);
  const size_t taken = std::min<uint64_t>(buffers, restore_loader_threads()) + 1;
  EXPECT_EQ(backend.staging_chunks_kept(), ahead - taken);
  hold.store(false);
  expect_state();
  // A loader gives its chunk back when it is done.
  for (int i = 0; i < 500 && backend.staging_chunks_kept() < ahead - 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(backend.staging_chunks_kept(), ahead - 1) << "the worker's chunk goes with the client";
  // A checkpoint drains through the kept chunks and gives them back.
  const size_t before = backend.staging_chunks_kept();
  ASSERT_TRUE(dump(to_dir(temp_dir("kept-again"))).ok());
  EXPECT_EQ(backend.staging_chunks_kept(), before);
  backend.release_staging_chunks();
  EXPECT_EQ(backend.staging_chunks_kept(), 0u);
}

TEST_F(CheckpointTest, WithLazyOkADamagedBufferOfTheImageBeingLoadedFailsTheCheckpointNotCopiedOn) {
  build_state();
  const std::string d = temp_dir("lazyok-good");
  ASSERT_TRUE(dump(to_dir(d)).ok());
  const std::string bad = corrupt_copy(d, big_, "lazyok-bad");
  std::atomic<bool>& hold = loader_hold();
  ASSERT_TRUE(kill_and_restore_lazily(bad, &hold).ok());
  const std::string again = temp_dir("lazyok-again");
  CheckpointRequest r = to_dir(again);
  r.lazy_ok = true;
  auto res = dump(std::move(r));
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), Code::kCorrupt) << res.status().to_string();
  EXPECT_FALSE(fs::exists(again)) << "a failed checkpoint left a partial image";
  EXPECT_EQ(download<unsigned>(small_, 1024), small_data_);  // the client runs on
  hold.store(false);
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
  auto ws = create_workspace(other);
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
  auto one = create_workspace(test_config());
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

// ---------------- stop checkpoints: pending calls ----------------

TEST_F(CheckpointTest, CallsIssuedWhileAStopCheckpointDrainsAreReplayedAfterRestoreAsIfNeverInterrupted) {
  build_state();
  // The uninterrupted run: the same state and the same calls on another client.
  TestClient& ref = add_client("reference");
  const uint64_t rs = alloc(4096, 1), rb = alloc(20u << 20, 1), ro = alloc(777 * 4, 1);
  upload(rs, small_data_.data(), 4096, 1);
  upload(rb, big_data_.data(), 20u << 20, 1);
  upload(ro, odd_data_.data(), 777 * 4, 1);
  uint64_t rstream = 0;
  ASSERT_TRUE(api(1).stream_create_with_flags(&rstream, 1).ok());
  async_work(api(1), ref.fill, rs, rb, ro, rstream);
  ASSERT_TRUE(api(1).device_synchronize().ok());
  const auto want_small = download<unsigned>(rs, 1024, 1);
  const auto want_big = download<unsigned>(rb, big_data_.size(), 1);
  const auto want_odd = download<unsigned>(ro, 777, 1);
  ASSERT_EQ(want_small, filled(1024, 500u));

  const std::string d = temp_dir("stop");
  Stopping st;
  start_stop(st, to_dir(d));
  std::shared_ptr<POSClient> stopped = ws_->find_client(client().uuid);
  const uint64_t executed_at_cut = stopped->stats().calls_executed;
  async_work(api(), client().fill, small_, big_, odd_, stream_);  // every call returns at once
  EXPECT_EQ(stopped->stats().calls_executed, executed_at_cut);   // held, not run
  auto r = finish_stop(st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->pending_calls, kAsyncWorkCalls);
  EXPECT_TRUE(stopped->stopped());

  // The stopped client runs nothing: new calls and checkpoints are refused, at once.
  Status late = api().memset(small_, 0, 4096);
  EXPECT_EQ(late.code(), Code::kUnavailable) << late.to_string();
  EXPECT_EQ(dump(to_dir(temp_dir("stop-again"))).status().code(), Code::kFailedPrecondition);
  // Removing it neither hangs nor runs the pending calls.
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  EXPECT_EQ(stopped->stats().calls_executed, executed_at_cut);

  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  const auto& pending = (*img)->client().pending();
  ASSERT_EQ(pending.size(), static_cast<int>(kAsyncWorkCalls));
  EXPECT_EQ(pending[0].pc(), r->cut_pc);
  EXPECT_EQ(pending[0].api_id(), static_cast<uint32_t>(ApiId::kMemsetAsync));
  EXPECT_EQ(pending[2].api_id(), static_cast<uint32_t>(ApiId::kMemcpyAsync));
  EXPECT_EQ(pending[2].params(5), std::string(reinterpret_cast<const char*>(pattern(777, 40).data()), 777 * 4));

  // A restarted daemon restores it; the job goes on with a synchronous copy.
  fresh_workspace();
  Status s = restore_from(d);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(api().device_synchronize().ok());  // stream_ does not sync with the legacy stream
  EXPECT_EQ(download<unsigned>(small_, 1024), want_small);
  EXPECT_EQ(download<unsigned>(big_, big_data_.size()), want_big);
  EXPECT_EQ(download<unsigned>(odd_, 777), want_odd);
  EXPECT_TRUE(api().get_last_error().ok());
  // The client's own calls continue after the last replayed one.
  auto again = dump(to_dir(temp_dir("after-replay")));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_GT(again->cut_pc, pending.rbegin()->pc());
  EXPECT_TRUE(api().event_query(event_).ok());
}

TEST_F(CheckpointTest, APendingMallocReplaysToTheAddressTheApplicationGot) {
  build_state();
  const std::string d = temp_dir("stop-malloc");
  Stopping st;
  start_stop(st, to_dir(d));
  // The free is never run by this client, so its range stays taken: the allocation gets another
  // address. On replay the free may already be done when the allocation is parsed, and first fit
  // would hand out odd_'s range; the image's answer decides.
  ASSERT_TRUE(api().free(odd_).ok());
  uint64_t p = 0;
  ASSERT_TRUE(api().malloc(&p, 777 * 4).ok());
  EXPECT_NE(p, odd_);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, args(client().fill, p, 3u, 777)).ok());
  PointerAttributes attrs{};
  ASSERT_TRUE(api().pointer_get_attributes(&attrs, p).ok());  // answered by the parser: pending too
  auto r = finish_stop(st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->pending_calls, 4u);
  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok());
  const auto& pending = (*img)->client().pending();
  ASSERT_EQ(pending.size(), 4);
  ASSERT_EQ(pending[1].api_id(), static_cast<uint32_t>(ApiId::kMalloc));
  EXPECT_EQ(pending[1].ret(), std::string(reinterpret_cast<const char*>(&p), 8));

  for (int round = 0; round < 3; ++round) {  // whatever the worker's timing on replay
    SCOPED_TRACE(round);
    Status s = kill_and_restore(d);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_TRUE(api().device_synchronize().ok());
    EXPECT_EQ(download<unsigned>(p, 777), filled(777, 3u));
    EXPECT_EQ(api().pointer_get_attributes(&attrs, odd_).api_error(), cuda::kErrorInvalidValue);
  }
}

TEST_F(CheckpointTest, TheReplayPlacesAnAllocationWhereTheImageSaysAndRefusesAnImpossibleOne) {
  build_state();
  const std::string d = temp_dir("stop-place");
  Stopping st;
  start_stop(st, to_dir(d));
  uint64_t p = 0;
  ASSERT_TRUE(api().malloc(&p, 8192).ok());
  ASSERT_TRUE(finish_stop(st).ok());
  // Somewhere first fit would never choose (it would take p again): the replay must put it there.
  // Halfway up the client's buffer range (the sanitizer setups shrink client.va_size).
  const Config cfg = test_config();
  const uint64_t far = p + cfg.va_size / 4 / (2u << 20) * (2u << 20);
  const std::string moved = edited_copy(d, "stop-place-far", [&](auto&, ckpt::pb::ClientImage& c) {
    c.mutable_pending(0)->set_ret(std::string(reinterpret_cast<const char*>(&far), 8));
  });
  // On a live buffer: it cannot be there; the restore is refused and changes nothing.
  const std::string clash = edited_copy(d, "stop-place-clash", [&](auto&, ckpt::pb::ClientImage& c) {
    c.mutable_pending(0)->set_ret(std::string(reinterpret_cast<const char*>(&big_), 8));
  });
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  Status s = restore_from(clash);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.to_string();
  EXPECT_NE(s.message().find("replaying pending call"), std::string::npos) << s.to_string();
  s = restore_from(moved);
  ASSERT_TRUE(s.ok()) << s.to_string();
  PointerAttributes attrs{};
  EXPECT_TRUE(api().pointer_get_attributes(&attrs, far).ok());
  EXPECT_FALSE(api().pointer_get_attributes(&attrs, p).ok());
  ASSERT_TRUE(api().memset(far, 0x7f, 8192).ok());
  EXPECT_EQ(download<unsigned>(far, 2048), std::vector<unsigned>(2048, 0x7f7f7f7fu));
  expect_state();
}

TEST_F(CheckpointTest, ASyncCallDuringAStopDrainIsAnsweredUnavailableAndIsNotInTheImage) {
  build_state();
  const std::string d = temp_dir("stop-sync");
  Stopping st;
  start_stop(st, to_dir(d));
  ASSERT_TRUE(api().memset_async(small_, 0x01, 4096, stream_).ok());  // pending
  // A synchronous call waits for the worker, which runs nothing past the cut: it is held, and
  // answered once the image is sealed.
  std::atomic<bool> sync_done{false};
  Status sync_status;
  std::vector<unsigned> got(1024);
  std::thread t([&] {
    sync_status = api().memcpy(reinterpret_cast<uint64_t>(got.data()), small_, 4096, cuda::kMemcpyDeviceToHost);
    sync_done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(sync_done.load());
  auto r = finish_stop(st);
  t.join();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->pending_calls, 1u);
  EXPECT_EQ(sync_status.code(), Code::kUnavailable) << sync_status.to_string();
  EXPECT_NE(sync_status.message().find("not in the image"), std::string::npos) << sync_status.to_string();
  ASSERT_TRUE(kill_and_restore(d).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(download<unsigned>(small_, 1024), std::vector<unsigned>(1024, 0x01010101u));
}

TEST_F(CheckpointTest, AStopCheckpointThatFailsLetsTheClientRunOnWithEveryCall) {
  build_state();
  // A memory image whose host memory cannot be had: the drain fails after the cut.
  ckpt::MemoryImage mem(ckpt::HostAllocator{[](uint64_t) -> void* { return nullptr; }, [](void*) {}});
  CheckpointRequest req;
  req.memory = &mem;
  Stopping st;
  start_stop(st, std::move(req));
  async_work(api(), client().fill, small_, big_, odd_, stream_);
  std::vector<unsigned> got(1024);
  Status sync_status = Status::Internal("not run");
  std::thread t([&] {  // held until the checkpoint's outcome; then it runs
    sync_status = api().stream_synchronize(stream_);
    if (sync_status.ok())
      sync_status = api().memcpy(reinterpret_cast<uint64_t>(got.data()), small_, 4096, cuda::kMemcpyDeviceToHost);
  });
  auto r = finish_stop(st);
  t.join();
  EXPECT_EQ(r.status().code(), Code::kOutOfMemory) << r.status().to_string();
  EXPECT_FALSE(live_client().stopped());
  ASSERT_TRUE(sync_status.ok()) << sync_status.to_string();
  EXPECT_EQ(got, filled(1024, 500u));  // the held calls ran first, in order
  EXPECT_EQ(download<unsigned>(odd_, 100), filled(100, 9u));
  // And it can be checkpointed (and stopped) again.
  const std::string d = temp_dir("stop-after-failure");
  CheckpointRequest again = to_dir(d);
  again.stop = true;
  auto r2 = dump(std::move(again));
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->pending_calls, 0u);
}

TEST_F(CheckpointTest, AStopCheckpointThatFailsAfterItsSealRunsTheHeldCallsAndGoesOn) {
  build_state();
  const std::string d = temp_dir("stop-late-failure");
  Stopping st;
  start_stop(st, to_dir(d));
  async_work(api(), client().fill, small_, big_, odd_, stream_);
  // Something takes the image's place meanwhile: the records are sealed, then publishing fails.
  fs::create_directories(d + "/in-the-way");
  auto r = finish_stop(st);
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().to_string();
  EXPECT_FALSE(live_client().stopped());
  ASSERT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(download<unsigned>(small_, 1024), filled(1024, 500u));
  EXPECT_EQ(download<unsigned>(odd_, 100), filled(100, 9u));
  fs::remove_all(d);
  CheckpointRequest again = to_dir(d);
  again.stop = true;
  auto r2 = dump(std::move(again));
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  ASSERT_TRUE(kill_and_restore(d).ok());
  EXPECT_EQ(download<unsigned>(small_, 1024), filled(1024, 500u));
}

// The in-process runtime's then=restore (POS_CHECKPOINT): another app thread's synchronous call,
// refused by the stop, is issued again to the restored client, as a system call interrupted by a
// dump is restarted.
TEST_F(CheckpointTest, ACallAStopRefusedGoesThroughTheRestoreGateAgainToTheRestoredClient) {
  build_state();
  RestoreGate gate;
  GatedTransport transport(std::make_unique<InProcessTransport>(ws_, client().uuid), &gate);
  ApiClient app(&transport);
  const std::string d = temp_dir("stop-gate");
  Stopping st;
  gate.begin_stop();
  start_stop(st, to_dir(d));
  ASSERT_TRUE(app.memset_async(small_, 0x09, 4096, stream_).ok());  // pending
  std::atomic<bool> done{false};
  Status sync_status;
  std::vector<unsigned> got(1024);
  std::thread t([&] {
    sync_status = app.stream_synchronize(stream_);
    if (sync_status.ok())
      sync_status = app.memcpy(reinterpret_cast<uint64_t>(got.data()), small_, 4096, cuda::kMemcpyDeviceToHost);
    done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto r = finish_stop(st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->pending_calls, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load()) << "the refused call must wait for the restore";
  {
    std::unique_lock<RestoreGate> lk(gate);
    ASSERT_TRUE(kill_and_restore(d).ok());
  }
  gate.end_stop();
  t.join();
  ASSERT_TRUE(sync_status.ok()) << sync_status.to_string();
  EXPECT_EQ(got, std::vector<unsigned>(1024, 0x09090909u));
}

TEST_F(CheckpointTest, AStopCheckpointWithNothingPendingAndAnOrdinaryOneRestoreAsBefore) {
  build_state();
  const std::string plain = temp_dir("plain"), stop = temp_dir("stop-empty");
  ASSERT_TRUE(dump(to_dir(plain)).ok());
  CheckpointRequest r = to_dir(stop);
  r.stop = true;
  auto res = dump(std::move(r));
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->pending_calls, 0u);
  for (const std::string& d : {plain, stop}) {
    auto img = ckpt::ImageReader::open_dir(d);
    ASSERT_TRUE(img.ok());
    EXPECT_EQ((*img)->client().pending_size(), 0);
    EXPECT_EQ((*img)->inventory().format_version(), ckpt::kFormatVersion);
    ASSERT_TRUE(kill_and_restore(d).ok());
    expect_state();
  }
  // Async stop makes no sense (nothing runs past the cut to protect): refused up front.
  CheckpointRequest bad = to_dir(temp_dir("stop-async"), CheckpointMode::kAsync);
  bad.stop = true;
  EXPECT_EQ(dump(std::move(bad)).status().code(), Code::kInvalidArgument);
}

TEST_F(CheckpointTest, AVersionOneImageStillRestoresButCannotHoldPendingCalls) {
  build_state();
  const std::string d = temp_dir("v2");
  Stopping st;
  start_stop(st, to_dir(d));
  ASSERT_TRUE(api().memset_async(small_, 0x03, 4096, stream_).ok());
  ASSERT_TRUE(finish_stop(st).ok());
  const std::string v1 = edited_copy(d, "v1", [](ckpt::pb::Inventory& inv, ckpt::pb::ClientImage& c) {
    inv.set_format_version(1);
    c.clear_pending();
  });
  const std::string v1_pending = edited_copy(d, "v1-pending", [](ckpt::pb::Inventory& inv, auto&) {
    inv.set_format_version(1);
  });
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  Status s = restore_from(v1_pending);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.to_string();
  s = restore_from(v1);
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_state();
}

TEST_F(CheckpointTest, CorruptPendingCallRecordsAreRefusedBeforeAnythingChanges) {
  build_state();
  const std::string d = temp_dir("stop-good");
  Stopping st;
  start_stop(st, to_dir(d));
  ASSERT_TRUE(api().memset_async(small_, 0x05, 4096, stream_).ok());
  ASSERT_TRUE(api().memset_async(odd_, 0x06, 777 * 4, stream_).ok());
  auto r = finish_stop(st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const uint64_t cut = r->cut_pc;
  ASSERT_TRUE(ws_->remove_client(client().uuid).ok());
  using Edit = std::function<void(ckpt::pb::Inventory&, ckpt::pb::ClientImage&)>;
  const std::vector<std::tuple<std::string, std::string, Edit>> cases = {
      {"unknown-api", "unknown api id", [](auto&, auto& c) { c.mutable_pending(0)->set_api_id(0x999); }},
      {"sync-api", "cannot be pending",
       [](auto&, auto& c) { c.mutable_pending(0)->set_api_id(static_cast<uint32_t>(ApiId::kMemcpy)); }},
      {"before-cut", "before the cut", [&](auto&, auto& c) { c.mutable_pending(0)->set_pc(cut - 1); }},
      {"out-of-order", "out of order", [&](auto&, auto& c) { c.mutable_pending(1)->set_pc(c.pending(0).pc()); }},
      {"too-many-params", "parameters, more than",
       [](auto&, auto& c) {
         for (int i = 0; i < 20; ++i) c.mutable_pending(0)->add_params("x");
       }},
      {"oversized-answer", "answer, more than",
       [](auto&, auto& c) { c.mutable_pending(1)->set_ret(std::string(ckpt::kMaxPendingRetBytes + 1, 'r')); }},
  };
  for (const auto& [name, why, edit] : cases) {
    SCOPED_TRACE(name);
    Status s = restore_from(edited_copy(d, "bad-" + name, edit));
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.to_string();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.to_string();
    EXPECT_EQ(ws_->find_client(client().uuid), nullptr);
  }
  // Nothing changed: the good image restores into the same slot.
  ASSERT_TRUE(restore_from(d).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(download<unsigned>(small_, 1024), std::vector<unsigned>(1024, 0x05050505u));
  EXPECT_EQ(download<unsigned>(odd_, 777), std::vector<unsigned>(777, 0x06060606u));
}

TEST_F(CheckpointTest, AStickyErrorCrossesAStopOnceAndAReplayedCallThatFailsSetsIt) {
  build_state();
  uint64_t h = 0;
  ASSERT_TRUE(api().cublas_create(&h).ok());
  GemmArgs bad = sgemm_args(0, 0, 4, 4, 4, 1, small_, 4, small_, 4, 0, small_, 4);
  bad.a_type = bad.b_type = bad.c_type = 3;  // int8 with float compute: the parser accepts, the device refuses
  bad.compute_type = kCublasCompute32F;
  ASSERT_TRUE(api().cublas_gemm_ex(h, bad).ok());
  const int32_t e = api().device_synchronize().api_error();
  ASSERT_NE(e, 0);
  // Not read before the dump: the restored client still has it.
  const std::string d0 = temp_dir("stop-err0"), d1 = temp_dir("stop-err1"), d2 = temp_dir("stop-err2");
  {
    CheckpointRequest r = to_dir(d0);
    r.stop = true;
    ASSERT_TRUE(dump(std::move(r)).ok());
  }
  ASSERT_TRUE(kill_and_restore(d0).ok());
  EXPECT_EQ(api().peek_at_last_error().api_error(), e);
  // Read while the image drains (cudaGetLastError is answered by the parser): not seen twice.
  Stopping st1;
  start_stop(st1, to_dir(d1));
  EXPECT_EQ(api().get_last_error().api_error(), e);
  ASSERT_TRUE(finish_stop(st1).ok());
  ASSERT_TRUE(kill_and_restore(d1).ok());
  EXPECT_TRUE(api().get_last_error().ok());
  // A pending call that fails when it is replayed: its caller had success long ago, so the failure
  // is the client's sticky error, as for any asynchronous call.
  Stopping st2;
  start_stop(st2, to_dir(d2));
  ASSERT_TRUE(api().cublas_gemm_ex(h, bad).ok());
  auto r2 = finish_stop(st2);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->pending_calls, 1u);
  ASSERT_TRUE(kill_and_restore(d2).ok());
  EXPECT_EQ(api().device_synchronize().api_error(), e);
  EXPECT_EQ(api().get_last_error().api_error(), e);
  EXPECT_TRUE(api().get_last_error().ok());
}

TEST_F(CheckpointTest, InspectListsThePendingCalls) {
  build_state();
  const std::string d = temp_dir("stop-inspect");
  Stopping st;
  start_stop(st, to_dir(d));
  uint64_t p = 0;
  ASSERT_TRUE(api().malloc(&p, 4096).ok());
  ASSERT_TRUE(api().memset_async(p, 0, 4096, stream_).ok());
  auto r = finish_stop(st);
  ASSERT_TRUE(r.ok());
  auto img = ckpt::ImageReader::open_dir(d);
  ASSERT_TRUE(img.ok());
  const std::string text = ckpt::describe_image(**img, false);
  EXPECT_NE(text.find("2 pending calls"), std::string::npos) << text;
  EXPECT_NE(text.find("pc " + std::to_string(r->cut_pc)), std::string::npos) << text;
  EXPECT_NE(text.find("cudaMalloc"), std::string::npos) << text;
  EXPECT_NE(text.find("cudaMemsetAsync"), std::string::npos) << text;
  EXPECT_NE(text.find("pending-calls"), std::string::npos) << text;  // the feature
  const std::string json = ckpt::describe_image(**img, true);
  EXPECT_NE(json.find("\"pending_calls\":[{\"pc\":\"" + std::to_string(r->cut_pc) + "\",\"api_id\":513,\"api\":\"cudaMalloc\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"api\":\"cudaMemsetAsync\""), std::string::npos) << json;
}

TEST_F(CheckpointTest, ALazyRestoreReplaysPendingCallsAndTheirErrorsBecomeTheStickyError) {
  build_state();
  const std::string d = temp_dir("stop-lazy");
  Stopping st;
  start_stop(st, to_dir(d));
  auto a = args(client().fill, static_cast<uint64_t>(odd_), 21u, 777);
  ASSERT_TRUE(api().launch_kernel(client().fill.handle, dims(4, 256), stream_, a).ok());
  ASSERT_TRUE(api().memset_async(big_, 0x44, 4096, stream_).ok());
  ASSERT_TRUE(finish_stop(st).ok());
  // Lazily, loaders held: the replayed calls load what they name first.
  std::atomic<bool>& hold = loader_hold();
  ASSERT_TRUE(kill_and_restore_lazily(d, &hold).ok());
  ASSERT_TRUE(api().device_synchronize().ok());
  EXPECT_EQ(download<unsigned>(odd_, 777), filled(777, 21u));
  std::vector<unsigned> big = big_data_;
  std::fill(big.begin(), big.begin() + 1024, 0x44444444u);
  EXPECT_EQ(download<unsigned>(big_, big.size()), big);
  EXPECT_TRUE(api().get_last_error().ok());
  hold.store(false);
  ASSERT_TRUE(live_client().wait_restored().ok());

  // A replayed call that fails on the device: its caller had its answer long ago, so the error
  // is the client's sticky error, as for any asynchronous call.
  const std::string bad = corrupt_copy(d, big_, "stop-lazy-bad");
  std::atomic<bool>& hold2 = loader_hold();
  ASSERT_TRUE(kill_and_restore_lazily(bad, &hold2).ok());
  EXPECT_EQ(api().device_synchronize().api_error(), cuda::kErrorEccUncorrectable);
  EXPECT_EQ(api().get_last_error().api_error(), cuda::kErrorEccUncorrectable);
  EXPECT_EQ(download<unsigned>(odd_, 777), filled(777, 21u));  // the other replayed call ran
  hold2.store(false);
  EXPECT_EQ(live_client().wait_restored().code(), Code::kCorrupt);
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
        auto ws = create_workspace(cfg);
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
      auto ws = create_workspace(cfg);
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
