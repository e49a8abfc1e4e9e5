// api_fixture.h — a workspace with one or more clients on the backend under test, and helpers.
// The backend comes from POS_TEST_BACKEND (default host), so the same tests can run on a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "pos/base/fatbin.h"
#include "pos/workspace.h"
#include "remoting/common/api_client.h"
#include "remoting/server/posd_server.h"
#include "remoting/client/shm_client.h"
#include "unittest/test_kernels.h"
#include "pos/runtime.h"
#include "remoting/inproc/inproc_transport.h"

namespace pos::test {

inline Config test_config() {
  Config c;
  const char* b = std::getenv("POS_TEST_BACKEND");
  c.backend = (b != nullptr && *b != '\0') ? b : "host";
  c.spin_ns = 20000;
  c.max_clients = 16;
  c.host_device_memory = 4ull << 30;
  // Sanitizer runtimes own parts of the address space (TSan's shadow); their setups move the window.
  if (const char* v = std::getenv("POS_TEST_VA_BASE")) c.va_base = std::strtoull(v, nullptr, 0);
  if (const char* v = std::getenv("POS_TEST_VA_SIZE")) c.va_size = std::strtoull(v, nullptr, 0);
  return c;
}

// The module the tests register: the nvcc-built fatbin of test_kernels.cu when POS_TEST_FATBIN names
// it (the `gpu` suite; a real device needs real code), else a minimal blob (the host backend runs
// the host versions of the same kernels).
inline std::vector<std::byte> test_fatbin() {
  const char* path = std::getenv("POS_TEST_FATBIN");
  if (path == nullptr || *path == '\0') return make_test_fatbin(64);
  std::vector<std::byte> blob;
  if (FILE* f = std::fopen(path, "rb")) {
    std::byte buf[65536];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) blob.insert(blob.end(), buf, buf + n);
    std::fclose(f);
  }
  EXPECT_FALSE(blob.empty()) << "cannot read the test fatbin " << path;
  return blob;
}

inline std::string backend_name() { return test_config().backend; }
// POS_TEST_TRANSPORT=posd: the same tests with every call through a posd session (an embedded
// PosdServer, the shared-memory transport and its frame decoder) instead of in-process.
inline bool through_posd() {
  const char* t = std::getenv("POS_TEST_TRANSPORT");
  return t != nullptr && std::string(t) == "posd";
}
// GEMM results against a double-precision reference: full float on the host; TF32 (10 mantissa
// bits) where a GPU's math mode allows it.
inline float gemm_tolerance() { return backend_name() == "host" ? 1e-4f : 2e-2f; }

// One client: its transport and typed API.
struct TestClient {
  uint64_t uuid = 0;
  std::unique_ptr<Transport> transport;  // in-process, or a posd session
  std::unique_ptr<ApiClient> api;
  uint64_t module = 0;
  RegisteredFunction axpy, scale_struct, fill, noop;
};

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override { make_workspace(test_config()); }
  void TearDown() override {
    clients_.clear();
    server_.reset();
    own_ws_.reset();
    ws_ = nullptr;
  }

  void make_workspace(Config c) {
    clients_.clear();
    server_.reset();
    own_ws_.reset();
    if (through_posd()) {
      c.posd_socket = ::testing::TempDir() + "posd-api-" + std::to_string(::getpid()) + "/posd.sock";  // posd makes the directory
      c.posd_arena_bytes = 16ull << 20;
      // These tests look into the workspace behind the session: posd's own (remoting_test covers
      // the session processes of the default isolation).
      c.posd_isolation = Isolation::kShared;
      auto srv = PosdServer::start(c);
      ASSERT_TRUE(srv.ok()) << srv.status().to_string();
      server_ = std::move(srv.value());
      ws_ = server_->workspace();
    } else {
      auto ws = create_workspace(c);
      ASSERT_TRUE(ws.ok()) << ws.status().to_string();
      own_ws_ = std::move(ws.value());
      ws_ = own_ws_.get();
    }
    add_client("test-a");
  }

  TestClient& add_client(const std::string& job) {
    auto tc = std::make_unique<TestClient>();
    if (server_) {
      auto session = ShmSession::connect(server_->socket_path(), job);
      EXPECT_TRUE(session.ok()) << session.status().to_string();
      if (!session.ok()) std::abort();
      // Calls wait for posd's verdict, so a bad launch fails at the launch as in-process.
      (*session)->set_post_async(false);
      tc->uuid = (*session)->client_uuid();
      tc->transport = std::move(session.value());
    } else {
      auto uuid = ws_->create_client(job);
      EXPECT_TRUE(uuid.ok()) << uuid.status().to_string();
      tc->uuid = *uuid;
      tc->transport = std::make_unique<InProcessTransport>(ws_, tc->uuid);
    }
    tc->api = std::make_unique<ApiClient>(tc->transport.get());
    const std::vector<std::byte> fatbin = test_fatbin();
    EXPECT_TRUE(tc->api->register_fatbin(&tc->module, fatbin).ok());
    EXPECT_TRUE(tc->api->register_function(&tc->axpy, tc->module, kTestAxpyName).ok());
    EXPECT_TRUE(tc->api->register_function(&tc->scale_struct, tc->module, kTestScaleStructName).ok());
    EXPECT_TRUE(tc->api->register_function(&tc->fill, tc->module, kTestFillName).ok());
    EXPECT_TRUE(tc->api->register_function(&tc->noop, tc->module, kTestNoopName).ok());
    clients_.push_back(std::move(tc));
    return *clients_.back();
  }

  ApiClient& api(size_t i = 0) { return *clients_[i]->api; }
  TestClient& client(size_t i = 0) { return *clients_[i]; }

  uint64_t alloc(uint64_t n, size_t client_index = 0) {
    uint64_t p = 0;
    Status s = api(client_index).malloc(&p, n);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return p;
  }
  void upload(uint64_t dst, const void* src, uint64_t n, size_t ci = 0) {
    Status s = api(ci).memcpy(dst, reinterpret_cast<uint64_t>(src), n, cuda::kMemcpyHostToDevice);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  template <typename T>
  std::vector<T> download(uint64_t src, size_t count, size_t ci = 0) {
    std::vector<T> out(count);
    Status s = api(ci).memcpy(reinterpret_cast<uint64_t>(out.data()), src, count * sizeof(T), cuda::kMemcpyDeviceToHost);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }
  // Page-locked host memory, as cudaMallocHost gives it: the backend's in-process, the session's
  // arena through posd.
  void* pinned_alloc(uint64_t n) {
    void* p = nullptr;
    Status s;
    if (server_) {
      s = static_cast<ShmSession*>(clients_[0]->transport.get())->host_alloc(n, &p);
    } else {
      auto r = ws_->backend().host_alloc(n);
      s = r.status();
      if (r.ok()) p = *r;
    }
    EXPECT_TRUE(s.ok()) << s.to_string();
    return p;
  }
  void pinned_free(void* p) {
    Status s = server_ ? static_cast<ShmSession*>(clients_[0]->transport.get())->host_free(p) : ws_->backend().host_free(p);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  // Packs kernel arguments by the registered layout (what the client shim does).
  template <typename... A>
  static std::vector<std::byte> args(const RegisteredFunction& f, const A&... a) {
    std::vector<std::byte> buf(f.param_bytes);
    const void* ptrs[] = {&a...};
    const size_t sizes[] = {sizeof(A)...};
    EXPECT_EQ(sizeof...(A), f.params.size());
    for (size_t i = 0; i < sizeof...(A) && i < f.params.size(); ++i) {
      EXPECT_EQ(sizes[i], f.params[i].size);
      std::memcpy(buf.data() + f.params[i].offset, ptrs[i], sizes[i]);
    }
    return buf;
  }
  static LaunchDims dims(uint32_t grid, uint32_t block) { return LaunchDims{{grid, 1, 1}, {block, 1, 1}, 0}; }

  POSWorkspace* ws_ = nullptr;  // own_ws_, or the server's
  std::unique_ptr<POSWorkspace> own_ws_;
  std::unique_ptr<PosdServer> server_;
  std::vector<std::unique_ptr<TestClient>> clients_;
};

}  // namespace pos::test
