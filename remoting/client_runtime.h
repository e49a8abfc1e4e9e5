// client_runtime.h — the application-side CUDA runtime state behind libpos_client: the transport,
// last-error semantics, and maps from host-side symbols (kernel stubs, variables) to POS handles.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "pos/status.h"
#include "remoting/api_client.h"

namespace pos {

class POSWorkspace;

// Process-wide; thread-safe (maps under mu_, last error per thread as in CUDA).
class ClientRuntime {
 public:
  // Created on first use. In-process mode: a private workspace (config from POS_CONFIG /
  // POS_BACKEND) with one client; the remoting transport replaces this in posd mode.
  static ClientRuntime* get();

  ApiClient& api() { return *api_; }
  const Status& init_status() const { return init_; }

  // Records a call's result as the thread's last error (CUDA runtime rule) and returns its code.
  int32_t record(const Status& s);
  int32_t take_last_error();
  int32_t peek_last_error();

  // cudaMallocHost / cudaFreeHost in-process: page-locked memory from the device backend.
  Status host_alloc(uint64_t bytes, void** out);
  Status host_free(void* p);

  void add_function(const void* host_fun, RegisteredFunction f);
  const RegisteredFunction* function(const void* host_fun);
  void add_var(const void* host_var, uint64_t device_addr);
  uint64_t var(const void* host_var);

 private:
  ClientRuntime();
  static void shutdown_at_exit();

  Status init_;
  std::unique_ptr<POSWorkspace> ws_;
  uint64_t uuid_ = 0;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ApiClient> api_;
  std::mutex mu_;
  std::unordered_map<const void*, RegisteredFunction> functions_;  // guarded by mu_
  std::unordered_map<const void*, uint64_t> vars_;                // guarded by mu_
};

}  // namespace pos
