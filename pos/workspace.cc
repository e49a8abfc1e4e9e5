// workspace.cc — client registry and the pos_process front door.
// A client uuid encodes its slot and a generation, so a stale uuid can never reach a newer client.
#include "pos/workspace.h"

#include <mutex>

#include "pos/cuda_impl/api_functions.h"
#include "pos/log.h"

namespace pos {

namespace {
constexpr uint64_t kSlotBits = 16;
uint32_t slot_of(ClientUuid u) { return static_cast<uint32_t>(u & ((1u << kSlotBits) - 1)); }
}  // namespace

POSWorkspace::POSWorkspace(const Config& config, std::unique_ptr<DeviceBackend> backend)
    : config_(config), backend_(std::move(backend)), slots_(config.max_clients) {
  cuda_impl::fill_api_table(&table_);
}

POSWorkspace::~POSWorkspace() {
  std::vector<std::shared_ptr<POSClient>> clients;
  {
    std::unique_lock lk(mu_);
    for (auto& c : slots_) {
      if (c) clients.push_back(std::move(c));
    }
  }
  for (auto& c : clients) c->shutdown();
}

StatusOr<std::unique_ptr<POSWorkspace>> POSWorkspace::create(const Config& config) {
  set_log_level(config.log_level);
  auto backend = make_backend(config);
  if (!backend.ok()) return backend.status();
  return create_with_backend(config, std::move(backend.value()));
}

StatusOr<std::unique_ptr<POSWorkspace>> POSWorkspace::create_with_backend(const Config& config,
                                                                          std::unique_ptr<DeviceBackend> backend) {
  if (!backend) return Status::InvalidArgument("no backend");
  if (config.max_clients == 0 || config.max_clients > (1u << kSlotBits))
    return Status::InvalidArgument("max_clients out of range");
  return std::unique_ptr<POSWorkspace>(new POSWorkspace(config, std::move(backend)));
}

StatusOr<ClientUuid> POSWorkspace::create_client(const std::string& job_name) {
  std::unique_lock lk(mu_);
  size_t slot = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i]) {
      slot = i;
      break;
    }
  }
  if (slot == slots_.size())
    return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation,
                  "all " + std::to_string(slots_.size()) + " client slots are in use");
  const ClientUuid uuid = ((++generation_) << kSlotBits) | slot;
  auto client = std::make_shared<POSClient>(uuid, static_cast<uint32_t>(slot), job_name, config_, backend_.get(),
                                            &table_);
  Status s = client->start();
  if (!s.ok()) return s;
  slots_[slot] = std::move(client);
  return uuid;
}

Status POSWorkspace::remove_client(ClientUuid uuid) {
  std::shared_ptr<POSClient> c;
  {
    std::unique_lock lk(mu_);
    const uint32_t slot = slot_of(uuid);
    if (slot >= slots_.size() || !slots_[slot] || slots_[slot]->uuid() != uuid)
      return Status::NotFound("no client " + std::to_string(uuid));
    c = std::move(slots_[slot]);
  }
  c->shutdown();
  return Status::Ok();
}

std::shared_ptr<POSClient> POSWorkspace::find_client(ClientUuid uuid) const {
  std::shared_lock lk(mu_);
  const uint32_t slot = slot_of(uuid);
  if (slot >= slots_.size()) return nullptr;
  const auto& c = slots_[slot];
  if (!c || c->uuid() != uuid) return nullptr;
  return c;
}

Status POSWorkspace::pos_process(uint32_t api_id, ClientUuid uuid, std::span<const Param> params, void* ret_data,
                                 uint64_t ret_data_len, uint64_t* ret_written) {
  const ApiInfo* api = find_api(api_id);
  if (api == nullptr) return Status::InvalidArgument("unknown api id " + std::to_string(api_id));
  auto client = find_client(uuid);
  if (!client) return Status::NotFound("no client " + std::to_string(uuid));
  return client->submit(*api, params, ret_data, ret_data_len, ret_written);
}

Status POSWorkspace::run_command(ClientUuid uuid, Command& cmd) {
  auto client = find_client(uuid);
  if (!client) return Status::NotFound("no client " + std::to_string(uuid));
  return client->run_command(cmd);
}

std::vector<ClientInfo> POSWorkspace::list_clients() const {
  std::shared_lock lk(mu_);
  std::vector<ClientInfo> out;
  for (const auto& c : slots_) {
    if (c) out.push_back(ClientInfo{c->uuid(), c->job_name(), c->stats()});
  }
  return out;
}

}  // namespace pos
