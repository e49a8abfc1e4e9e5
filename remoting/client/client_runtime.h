// client_runtime.h — the application-side CUDA runtime state behind the shim (libpos_client and
// libpos_inproc): last-error semantics, maps from host-side symbols to POS handles, and the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "pos/base/status.h"
#include "remoting/common/api_client.h"

namespace pos {

// Where the shim's calls go: a posd session (libpos_client, remoting/client/posd_backend.cc) or a
// workspace in this process (libpos_inproc, remoting/inproc/inproc_backend.cc). Each library links
// exactly one, which defines make_runtime_backend(); so this header, and the shim, carry neither
// the session's nor the workspace's headers. (Not a device backend: this is the application side.)
class RuntimeBackend {
 public:
  virtual ~RuntimeBackend() = default;
  // What the shim's ApiClient calls through; lives as long as the backend.
  virtual Transport* transport() = 0;
  // cudaMallocHost / cudaFreeHost.
  virtual Status host_alloc(uint64_t bytes, void** out) = 0;
  virtual Status host_free(void* p) = 0;
  // A worker's asynchronous error known here outside any call's result (posd: what a posted
  // cudaGetLastError took, reported by a later reply); 0: none. take_ clears it, peek_ keeps it.
  virtual int32_t take_async_error() { return 0; }
  virtual int32_t peek_async_error() { return 0; }
  // After a successful cudaStreamSynchronize / cudaDeviceSynchronize (POS_CHECKPOINT in-process).
  // An error becomes the synchronizing call's result.
  virtual Status after_sync() { return Status::Ok(); }
  // At exit, after nvcc's own atexit handlers unregistered the modules.
  virtual void shutdown() {}
};

// Defined by the backend linked into the library. An error means the runtime cannot start; its
// message says why (every call then fails with cudaErrorInitializationError).
StatusOr<std::unique_ptr<RuntimeBackend>> make_runtime_backend();

// Process-wide; thread-safe (maps under mu_, last error per thread as in CUDA).
class ClientRuntime {
 public:
  // Created on first use, with the backend make_runtime_backend() gives.
  static ClientRuntime* get();

  ApiClient& api() { return *api_; }
  const Status& init_status() const { return init_; }

  // Records a call's result as the thread's last error (CUDA runtime rule) and returns its code.
  int32_t record(const Status& s);
  int32_t take_last_error();
  int32_t peek_last_error();

  // cudaMallocHost / cudaFreeHost: the backend's page-locked memory.
  Status host_alloc(uint64_t bytes, void** out);
  Status host_free(void* p);

  void add_function(const void* host_fun, RegisteredFunction f);
  const RegisteredFunction* function(const void* host_fun);
  void add_var(const void* host_var, uint64_t device_addr);
  uint64_t var(const void* host_var);

  // The shim calls this after cudaStreamSynchronize / cudaDeviceSynchronize succeeded. An error is
  // the synchronizing call's result, so a failed checkpoint or restore stops the app loudly instead
  // of letting it run on silently wrong.
  Status after_sync();

 private:
  ClientRuntime();
  static void shutdown_at_exit();
  Status not_started() const;  // what host memory calls return when the backend did not start

  Status init_;
  std::unique_ptr<RuntimeBackend> backend_;  // null when init_ is an error
  std::unique_ptr<Transport> failing_;       // the transport when backend_ is null
  std::unique_ptr<ApiClient> api_;
  std::mutex mu_;
  std::unordered_map<const void*, RegisteredFunction> functions_;  // guarded by mu_
  std::unordered_map<const void*, uint64_t> vars_;                // guarded by mu_
};

}  // namespace pos
