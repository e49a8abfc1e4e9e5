// client_runtime.cc — the runtime state both shim libraries share: bootstrap through the linked
// backend, last-error bookkeeping, symbol maps; the backend shuts down after nvcc's atexit handlers.
#include "remoting/client/client_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "pos/base/cuda_errors.h"

namespace pos {
namespace {
thread_local int32_t t_last_error = 0;
ClientRuntime* g_runtime = nullptr;
std::once_flag g_once;

// The transport of a runtime that did not start: calls fail with cudaErrorInitializationError
// instead of crashing the app.
struct FailingTransport final : Transport {
  Status call(ApiId, std::span<const Param>, void*, uint64_t, uint64_t*) override {
    return Status(Code::kUnavailable, cuda::kErrorInitializationError, "POS runtime not initialized");
  }
};
}  // namespace

ClientRuntime* ClientRuntime::get() {
  std::call_once(g_once, [] {
    g_runtime = new ClientRuntime();
    std::atexit(&ClientRuntime::shutdown_at_exit);
  });
  return g_runtime;
}

ClientRuntime::ClientRuntime() {
  auto backend = make_runtime_backend();
  Transport* transport = nullptr;
  if (backend.ok()) {
    backend_ = std::move(backend.value());
    transport = backend_->transport();
  } else {
    init_ = backend.status();
    std::fprintf(stderr, "pos: cannot start the POS runtime: %s\n", init_.to_string().c_str());
    failing_ = std::make_unique<FailingTransport>();
    transport = failing_.get();
  }
  api_ = std::make_unique<ApiClient>(transport);
}

void ClientRuntime::shutdown_at_exit() {
  if (g_runtime != nullptr && g_runtime->backend_) g_runtime->backend_->shutdown();
}

int32_t ClientRuntime::record(const Status& s) {
  const int32_t e = s.ok() ? 0 : s.api_error();
  if (e != 0) t_last_error = e;
  return e;
}

int32_t ClientRuntime::take_last_error() {
  int32_t e = t_last_error;
  t_last_error = 0;
  // Under posd an earlier cudaGetLastError's frame may have taken the worker's error: it came
  // back with a later reply.
  if (backend_) {
    const int32_t a = backend_->take_async_error();
    if (e == 0) e = a;
  }
  // Errors of calls that had returned success are known to the worker only. In-process the
  // parser answers at once; under posd the frame is posted (no round trip per launch check) and
  // what it takes is reported by a later call's reply.
  Status s = api_->get_last_error();
  if (e == 0 && !s.ok()) e = s.api_error();
  return e;
}

int32_t ClientRuntime::peek_last_error() {
  if (t_last_error != 0) return t_last_error;
  if (backend_) {
    if (const int32_t a = backend_->peek_async_error(); a != 0) return a;
  }
  Status s = api_->peek_at_last_error();
  return s.ok() ? 0 : s.api_error();
}

Status ClientRuntime::not_started() const {
  // Like every other call of a runtime that did not start: cudaErrorInitializationError.
  return Status(init_.code(), cuda::kErrorInitializationError, init_.message());
}

Status ClientRuntime::host_alloc(uint64_t bytes, void** out) {
  return backend_ ? backend_->host_alloc(bytes, out) : not_started();
}

Status ClientRuntime::host_free(void* p) { return backend_ ? backend_->host_free(p) : not_started(); }

Status ClientRuntime::after_sync() { return backend_ ? backend_->after_sync() : Status::Ok(); }

void ClientRuntime::add_function(const void* host_fun, RegisteredFunction f) {
  std::lock_guard<std::mutex> lk(mu_);
  functions_[host_fun] = std::move(f);
}

const RegisteredFunction* ClientRuntime::function(const void* host_fun) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = functions_.find(host_fun);
  return it == functions_.end() ? nullptr : &it->second;  // node-based map: stable pointers
}

void ClientRuntime::add_var(const void* host_var, uint64_t device_addr) {
  std::lock_guard<std::mutex> lk(mu_);
  vars_[host_var] = device_addr;
}

uint64_t ClientRuntime::var(const void* host_var) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = vars_.find(host_var);
  return it == vars_.end() ? 0 : it->second;
}

}  // namespace pos
