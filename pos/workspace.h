// workspace.h — POSWorkspace: the daemon-side entry point. Owns the backend and all clients and
// routes every API call (pos_process) and control command to the right client's pipeline.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "pos/api_context.h"
#include "pos/api_table.h"
#include "pos/backend.h"
#include "pos/client.h"
#include "pos/config.h"
#include "pos/base/gate.h"
#include "pos/base/status.h"

namespace pos {

using ClientUuid = uint64_t;

struct ClientInfo {
  ClientUuid uuid;
  std::string job_name;
  ClientStats stats;
};

// Thread-safe: any thread may call pos_process / run_command. Clients are added and removed under
// mu_; pos_process finds its client without locks (a per-slot pointer, pinned by a per-slot Gate
// that removal closes and waits out), so clients never contend on a shared line.
class POSWorkspace {
 public:
  // The core knows no API semantics and no backend: both are handed in (pos/runtime.h assembles
  // the usual ones: the CUDA API set of pos/cuda_impl and the backend the config names).
  static StatusOr<std::unique_ptr<POSWorkspace>> create(const Config& config, std::unique_ptr<DeviceBackend> backend,
                                                        const ApiTable& table);
  ~POSWorkspace();

  StatusOr<ClientUuid> create_client(const std::string& job_name, const ClientOptions& options = {});
  // Drains the client's in-flight work, then frees all its device memory and handles.
  Status remove_client(ClientUuid uuid);

  // Executes API `api_id` for `uuid`. Parameters are copied; results go to ret_data (at most
  // ret_data_len bytes; *ret_written tells how many). The returned Status carries the API's
  // error code (cudaError_t / cublasStatus_t) as api_error().
  Status pos_process(uint32_t api_id, ClientUuid uuid, std::span<const Param> params, void* ret_data,
                     uint64_t ret_data_len, uint64_t* ret_written = nullptr);

  Status run_command(ClientUuid uuid, Command& cmd);

  // Checkpoints a client at a cut (see CheckpointRequest). Blocks until the image is durable; in
  // async mode the client keeps running meanwhile.
  StatusOr<CheckpointResult> checkpoint(ClientUuid uuid, CheckpointRequest request);
  // POSClient::estimate_increment for `uuid`.
  StatusOr<CheckpointResult> estimate_increment(ClientUuid uuid, const std::string& parent_dir, uint64_t since_call = 0);
  // A new client with an image's state, in the image's slot (so every address is the same) and
  // under the image's uuid. The image must come from the same backend and device model. On
  // error the workspace is as before. The image is read only during the call: options.lazy is
  // refused here (use the shared_ptr overload).
  StatusOr<ClientUuid> restore(const ckpt::ImageReader& image, const RestoreOptions& options = {});
  // Same; a lazy restore keeps `image` (and, for a memory image, needs its ckpt::MemoryImage)
  // until the client has loaded every buffer (POSClient::wait_restored).
  StatusOr<ClientUuid> restore(std::shared_ptr<const ckpt::ImageReader> image, const RestoreOptions& options = {});

  std::shared_ptr<POSClient> find_client(ClientUuid uuid) const;
  std::vector<ClientInfo> list_clients() const;
  const Config& config() const { return config_; }
  DeviceBackend& backend() { return *backend_; }

 private:
  POSWorkspace(const Config& config, std::unique_ptr<DeviceBackend> backend, const ApiTable& table);

  const Config config_;
  std::unique_ptr<DeviceBackend> backend_;
  ApiTable table_;
  mutable std::shared_mutex mu_;
  std::vector<std::shared_ptr<POSClient>> slots_;  // guarded by mu_; index = slot; owns the clients
  uint64_t generation_ = 0;                        // guarded by mu_
  // The hot-path view of slots_: written under mu_, read lock-free by pos_process.
  struct alignas(64) FastSlot {
    std::atomic<POSClient*> client{nullptr};
    // pos_process calls holding `client` are inside. A removal closes it and waits them out; it
    // stays closed (the slot is not handed out) until that removal is complete.
    Gate users;
  };
  std::unique_ptr<FastSlot[]> fast_;
};

}  // namespace pos
