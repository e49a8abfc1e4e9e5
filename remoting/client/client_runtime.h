// client_runtime.h — the application-side CUDA runtime state behind libpos_client: the transport,
// last-error semantics, and maps from host-side symbols (kernel stubs, variables) to POS handles.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pos/checkpoint/checkpoint.h"
#include "pos/base/status.h"
#include "remoting/common/api_client.h"
#include "pos/checkpoint/restore_gate.h"

namespace pos {

class POSWorkspace;
class ShmSession;

// What POS_CHECKPOINT asks for (docs/inprocess_checkpoint.md): checkpoints of this process's client
// after chosen synchronizing calls, each optionally followed by a restore from the image just written.
struct CheckpointPlan {
  std::vector<uint64_t> at;  // 1-based counts of successful stream/device synchronizations, increasing
  CheckpointMode mode = CheckpointMode::kSync;
  std::string dir;           // image k goes to "<dir>-<k>"
  bool incremental = false;  // image k > 1 names image k-1 as its parent
  bool restore = false;      // then=restore: drop the client's device state, restore it from the image
  bool lazy = false;         // lazy=1 (then=restore only): buffers load on first use and in the background
};
// Strict: unknown or repeated keys, empty items, missing `at` / `dir` and bad values are errors
// whose message names POS_CHECKPOINT.
StatusOr<CheckpointPlan> parse_checkpoint_plan(std::string_view spec);

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

  // The shim calls this after cudaStreamSynchronize / cudaDeviceSynchronize succeeded: takes the
  // checkpoints POS_CHECKPOINT asks for. An error is the synchronizing call's result, so a failed
  // checkpoint or restore stops the app loudly instead of letting it run on silently wrong.
  Status after_sync();

 private:
  // An async checkpoint with then=continue: the app runs on while its image drains.
  struct PendingCheckpoint;

  ClientRuntime();
  static void shutdown_at_exit();
  // All three under ckpt_mu_. reap: reports a pending async checkpoint once it is durable (wait:
  // blocks until it is) and returns its error.
  Status take_checkpoint(size_t k, uint64_t n);
  Status restore_from(const std::string& dir);
  Status reap(bool wait);
  // A lazy restore still loading: once it has finished (wait: blocks until it has), prints its
  // line and returns its error.
  Status report_lazy_restore(bool wait);
  Status checkpoint_failed(const Status& s);  // prints it; the returned error is never cudaSuccess
  std::string image_dir(size_t k) const;

  Status init_;
  std::unique_ptr<POSWorkspace> ws_;
  uint64_t uuid_ = 0;
  std::unique_ptr<Transport> transport_;
  ShmSession* shm_ = nullptr;  // libpos_client: transport_ is this posd session
  std::unique_ptr<ApiClient> api_;
  std::mutex mu_;
  std::unordered_map<const void*, RegisteredFunction> functions_;  // guarded by mu_
  std::unordered_map<const void*, uint64_t> vars_;                // guarded by mu_

  // POS_CHECKPOINT state; plan_ is null when the variable is unset (after_sync returns at once).
  std::unique_ptr<CheckpointPlan> plan_;
  std::atomic<uint64_t> sync_calls_{0};
  // Calls take it shared (through the transport), a restore exclusively: while the client is
  // removed and rebuilt, the app's other threads wait instead of seeing an unknown client. Calls
  // a stop checkpoint refused are issued again after the restore (remoting/restore_gate.h).
  RestoreGate gate_;
  std::mutex ckpt_mu_;  // one checkpoint at a time
  std::unique_ptr<PendingCheckpoint> pending_;  // guarded by ckpt_mu_
  size_t taken_ = 0;                            // guarded by ckpt_mu_; checkpoints started
  std::string lazy_dir_;                        // guarded by ckpt_mu_; a lazy restore not yet reported
};

}  // namespace pos
