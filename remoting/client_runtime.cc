// client_runtime.cc — in-process runtime bootstrap and last-error bookkeeping.
// The workspace is torn down at exit, after nvcc's own atexit handlers unregistered the modules.
#include "remoting/client_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "pos/workspace.h"

namespace pos {
namespace {
thread_local int32_t t_last_error = 0;
ClientRuntime* g_runtime = nullptr;
std::once_flag g_once;
}  // namespace

ClientRuntime* ClientRuntime::get() {
  std::call_once(g_once, [] {
    g_runtime = new ClientRuntime();
    std::atexit(&ClientRuntime::shutdown_at_exit);
  });
  return g_runtime;
}

ClientRuntime::ClientRuntime() {
  auto cfg = config_from_environment();
  if (!cfg.ok()) {
    init_ = cfg.status();
  } else {
    auto ws = POSWorkspace::create(*cfg);
    if (!ws.ok()) {
      init_ = ws.status();
    } else {
      ws_ = std::move(ws.value());
      const char* job = std::getenv("POS_JOB_NAME");
      auto uuid = ws_->create_client(job != nullptr ? job : "in-process");
      if (!uuid.ok()) {
        init_ = uuid.status();
      } else {
        uuid_ = *uuid;
        transport_ = std::make_unique<InProcessTransport>(ws_.get(), uuid_);
      }
    }
  }
  if (!init_.ok()) {
    std::fprintf(stderr, "pos: cannot start the POS runtime: %s\n", init_.to_string().c_str());
    // Calls fail with cudaErrorInitializationError instead of crashing the app.
    struct FailingTransport final : Transport {
      Status call(ApiId, std::span<const Param>, void*, uint64_t, uint64_t*) override {
        return Status(Code::kUnavailable, cuda::kErrorInitializationError, "POS runtime not initialized");
      }
    };
    transport_ = std::make_unique<FailingTransport>();
  }
  api_ = std::make_unique<ApiClient>(transport_.get());
}

void ClientRuntime::shutdown_at_exit() {
  if (g_runtime == nullptr || !g_runtime->ws_) return;
  // Drain the app's outstanding work, then free its device state.
  (void)g_runtime->ws_->remove_client(g_runtime->uuid_);
  g_runtime->ws_.reset();
}

int32_t ClientRuntime::record(const Status& s) {
  const int32_t e = s.ok() ? 0 : s.api_error();
  if (e != 0) t_last_error = e;
  return e;
}

int32_t ClientRuntime::take_last_error() {
  int32_t e = t_last_error;
  t_last_error = 0;
  // Errors of calls that had returned success are known to the worker only.
  Status s = api_->get_last_error();
  if (e == 0 && !s.ok()) e = s.api_error();
  return e;
}

int32_t ClientRuntime::peek_last_error() {
  if (t_last_error != 0) return t_last_error;
  Status s = api_->peek_at_last_error();
  return s.ok() ? 0 : s.api_error();
}

Status ClientRuntime::host_alloc(uint64_t bytes, void** out) {
  if (!ws_) return init_;
  auto p = ws_->backend().host_alloc(bytes);
  if (!p.ok()) return p.status();
  *out = *p;
  return Status::Ok();
}

Status ClientRuntime::host_free(void* p) {
  if (!ws_) return init_;
  return ws_->backend().host_free(p);
}

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
