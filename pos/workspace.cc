// workspace.cc — client registry and the pos_process front door.
// A client uuid encodes its slot and a generation, so a stale uuid can never reach a newer client.
#include "pos/workspace.h"

#include <algorithm>
#include <mutex>

#include "pos/base/log.h"
#include "pos/base/text.h"

namespace pos {

namespace {
constexpr uint64_t kSlotBits = 16;
uint32_t slot_of(ClientUuid u) { return static_cast<uint32_t>(u & ((1u << kSlotBits) - 1)); }
}  // namespace

POSWorkspace::POSWorkspace(const Config& config, std::unique_ptr<DeviceBackend> backend, const ApiTable& table)
    : config_(config),
      backend_(std::move(backend)),
      table_(table),
      slots_(config.max_clients),
      fast_(std::make_unique<FastSlot[]>(config.max_clients)) {}

POSWorkspace::~POSWorkspace() {
  std::vector<std::shared_ptr<POSClient>> clients;
  {
    std::unique_lock lk(mu_);
    for (size_t i = 0; i < slots_.size(); ++i) {
      fast_[i].client.store(nullptr, std::memory_order_seq_cst);
      if (slots_[i]) clients.push_back(std::move(slots_[i]));
    }
  }
  for (auto& c : clients) c->shutdown();
}

StatusOr<std::unique_ptr<POSWorkspace>> POSWorkspace::create(const Config& config,
                                                             std::unique_ptr<DeviceBackend> backend,
                                                             const ApiTable& table) {
  if (!backend) return Status::InvalidArgument("no backend");
  if (config.max_clients == 0 || config.max_clients > (1u << kSlotBits))
    return Status::InvalidArgument("max_clients out of range");
  return std::unique_ptr<POSWorkspace>(new POSWorkspace(config, std::move(backend), table));
}

namespace {
// Every client passes create_client (posd's hello, the in-process POS_JOB_NAME) or restore, and
// its name goes into logs, `pos-cli ps` and the image's `string` job_name: bytes that are not
// UTF-8 and control characters become visible escapes, and the length is bounded
// (docs/remoting.md, "Job names"). Idempotent, so a restored name stays as it was.
constexpr size_t kMaxJobNameBytes = 256;
std::string safe_job_name(std::string_view job) { return printable(job, kMaxJobNameBytes); }
}  // namespace

StatusOr<ClientUuid> POSWorkspace::create_client(const std::string& job_name, const ClientOptions& options) {
  std::unique_lock lk(mu_);
  size_t slot = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    // A slot whose removal is still under way is not free: its old client's calls may be inside,
    // and its backend client still holds the slot's address range.
    if (!slots_[i] && fast_[i].users.is_open()) {
      slot = i;
      break;
    }
  }
  if (slot == slots_.size())
    return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation,
                  "all " + std::to_string(slots_.size()) + " client slots are in use");
  const int count = backend_->device_count();
  for (size_t i = 0; i < options.devices.size(); ++i) {
    const int32_t d = options.devices[i];
    if (d < 0 || d >= count)
      return Status(Code::kInvalidArgument, cuda::kErrorInvalidDevice,
                    "device " + std::to_string(d) + " does not exist (the " + std::string(backend_->name()) +
                        " backend has " + std::to_string(count) + ")");
    if (std::find(options.devices.begin(), options.devices.begin() + i, d) != options.devices.begin() + i)
      return Status::InvalidArgument("device " + std::to_string(d) + " is listed twice");
  }
  const int device = options.devices.empty() ? 0 : options.devices[0];
  if (options.generation >= (1ull << (64 - kSlotBits)))
    return Status::InvalidArgument("client generation " + std::to_string(options.generation) + " does not fit a uuid");
  const ClientUuid uuid = ((options.generation != 0 ? options.generation : ++generation_) << kSlotBits) | slot;
  auto client = std::make_shared<POSClient>(uuid, static_cast<uint32_t>(slot), safe_job_name(job_name), config_,
                                            backend_.get(), &table_, device);
  client->set_options(options);
  Status s = client->start();
  if (!s.ok()) return s;
  fast_[slot].client.store(client.get(), std::memory_order_release);
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
    // From here pos_process turns calls away (the gate), and none finds the client.
    fast_[slot].users.close();
    fast_[slot].client.store(nullptr, std::memory_order_relaxed);
    c = std::move(slots_[slot]);
  }
  c->shutdown();  // refuses new calls, drains the ones in flight
  // Calls that entered before the close are leaving (they see an inactive client); the client may
  // be freed only after the last of them. Then the slot may take a new client.
  FastSlot& fs = fast_[slot_of(uuid)];
  fs.users.wait_drained(config_.spin_ns);
  fs.users.reopen();
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
  const uint32_t slot = slot_of(uuid);
  if (slot >= slots_.size()) return Status::NotFound("no client " + std::to_string(uuid));
  FastSlot& fs = fast_[slot];
  // Pin the client (one RMW on the slot's line): a removal closes the gate, then waits for the
  // calls inside to leave. A call the closed gate turns away finds no client.
  Gate::Holder pin(fs.users);
  POSClient* client = pin ? fs.client.load(std::memory_order_acquire) : nullptr;
  if (client == nullptr || client->uuid() != uuid) [[unlikely]]
    return Status::NotFound("no client " + std::to_string(uuid));
  return client->submit(*api, params, ret_data, ret_data_len, ret_written);
}

Status POSWorkspace::run_command(ClientUuid uuid, Command& cmd) {
  auto client = find_client(uuid);
  if (!client) return Status::NotFound("no client " + std::to_string(uuid));
  return client->run_command(cmd);
}

StatusOr<CheckpointResult> POSWorkspace::checkpoint(ClientUuid uuid, CheckpointRequest request) {
  auto client = find_client(uuid);
  if (!client) return Status::NotFound("no client " + std::to_string(uuid));
  return client->checkpoint(std::move(request));
}

StatusOr<CheckpointResult> POSWorkspace::estimate_increment(ClientUuid uuid, const std::string& parent_dir,
                                                           uint64_t since_call) {
  auto client = find_client(uuid);
  if (!client) return Status::NotFound("no client " + std::to_string(uuid));
  return client->estimate_increment(parent_dir, since_call);
}

StatusOr<ClientUuid> POSWorkspace::restore(const ckpt::ImageReader& image, const RestoreOptions& options) {
  if (options.lazy)
    return Status::InvalidArgument("a lazy restore reads the image after it returns: pass the image as a shared_ptr");
  // Not owned: the restore is eager, so nothing keeps the pointer past this call.
  return restore(std::shared_ptr<const ckpt::ImageReader>(&image, [](const ckpt::ImageReader*) {}), options);
}

StatusOr<ClientUuid> POSWorkspace::restore(std::shared_ptr<const ckpt::ImageReader> image_ptr,
                                           const RestoreOptions& options) {
  if (!image_ptr) return Status::InvalidArgument("no image to restore");
  const ckpt::ImageReader& image = *image_ptr;
  const auto& inv = image.inventory();
  const auto& cr = image.client().client();
  if (inv.backend() != backend_->name())
    return Status::FailedPrecondition("image was taken on the " + inv.backend() + " backend; this workspace runs " +
                                      std::string(backend_->name()));
  const int count = backend_->device_count();
  // The image's own device, unless told another; restored under a device list (posd.devices of
  // the posd restoring it), the state goes where the list puts the job's own number for it: a job
  // that ran on its device 0 under a posd serving GPU 0 runs on GPU 1 under one serving GPU 1.
  int device = options.device;
  if (device < 0) {
    device = cr.device();
    if (!options.devices.empty() && cr.has_device_index() && cr.device_index() >= 0 &&
        static_cast<size_t>(cr.device_index()) < options.devices.size())
      device = options.devices[static_cast<size_t>(cr.device_index())];
  }
  if (device < 0 || device >= count)
    return Status::FailedPrecondition(
        (options.device < 0 ? "the image's device " + std::to_string(device) + " is not present here"
                            : "restore onto device " + std::to_string(device) + ": no such device") +
        " (this workspace has " + std::to_string(count) + "; RestoreOptions::device maps an image onto another)");
  if (inv.device_name() != backend_->device_name(device))
    return Status::FailedPrecondition("image was taken on a " + inv.device_name() + " (device " +
                                      std::to_string(cr.device()) + "); device " + std::to_string(device) +
                                      " here is a " + backend_->device_name(device) +
                                      ": restore needs the same device model");
  // The application's own device number (cudaGetDevice) must still name a device.
  if (cr.current_device() < 0 || cr.current_device() >= count)
    return Status::FailedPrecondition("the job had selected device " + std::to_string(cr.current_device()) +
                                      ", not present here (this workspace has " + std::to_string(count) + ")");
  if (cr.va_base() < config_.va_base || cr.va_size() != config_.va_size ||
      (cr.va_base() - config_.va_base) % config_.va_size != 0 ||
      (cr.va_base() - config_.va_base) / config_.va_size >= config_.max_clients)
    return Status::FailedPrecondition("image's client range " + std::to_string(cr.va_base()) +
                                      " does not fit this workspace's client.va_base / va_size / max_clients");
  const uint32_t slot = static_cast<uint32_t>((cr.va_base() - config_.va_base) / config_.va_size);
  if (slot_of(cr.uuid()) != slot) return Status::Corrupt("image's client uuid and range disagree");
  std::unique_lock lk(mu_);
  if (slots_[slot]) return Status::Busy("client slot " + std::to_string(slot) + " (the image's addresses) is in use");
  if (!fast_[slot].users.is_open())
    return Status::Busy("client slot " + std::to_string(slot) + " (the image's addresses) is still being freed");
  const ClientUuid uuid = cr.uuid();
  generation_ = std::max(generation_, uuid >> kSlotBits);
  // An image from before names were sanitized may hold control characters (UTF-8 it must be).
  auto client = std::make_shared<POSClient>(uuid, slot, safe_job_name(cr.job_name()), config_, backend_.get(), &table_,
                                            device);
  ClientOptions co;
  co.host_base = options.host_base, co.host_size = options.host_size;
  co.devices = options.devices;
  co.sms = options.sms;
  client->set_options(co);
  Status s = client->start_restored(image_ptr, options);
  if (!s.ok()) return s.with_context("restore");
  fast_[slot].client.store(client.get(), std::memory_order_release);
  slots_[slot] = std::move(client);
  return uuid;
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
