// resource_ops.h — the one descriptor per resource type: how a handle goes into an image, comes back
// from one, and follows its client to another device. The core calls the hooks; pos/cuda_impl fills them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pos/base/resource_type.h"
#include "pos/base/status.h"

namespace pos {

namespace ckpt::pb {
class ClientRecord;
class HandleRecord;
}  // namespace ckpt::pb

struct Handle;
struct ParserScope;
struct WorkerScope;
class BackendClient;

// Whether a type's handles carry device bytes the checkpoint engine copies (record, restore, lazy).
enum class DeviceBytes : uint8_t {
  kNone,
  // The client's own buffers: copied by the engine's copiers, taken from the parent image when
  // unchanged, loadable lazily. Charged against the device's memory.
  kBuffer,
  // A module's variables: always stored (kernels write them without naming them), loaded through
  // the worker's backend (their device address is the module's). Charged against the device's memory.
  kVariable,
};

// What a restore hook may touch. Restore runs before the client's threads start, so one thread
// holds both the parser's and the worker's state.
struct RestoreScope {
  ParserScope& ps;
  WorkerScope& ws;  // ws.backend: the client's device state; ws.loaded: as the worker keeps it
  const ckpt::pb::ClientRecord& client;
};

// What a move hook may touch (worker thread, POSClient::move_device).
struct MoveScope {
  BackendClient& backend;  // the client's new device state (a fresh context on `device`)
  int device;
  // What each handle moved so far became on `backend` (parents move before their children). The
  // engine installs them as the handles' backend objects only once every handle has moved, so a
  // failed move leaves nothing half-changed.
  std::unordered_map<const Handle*, uint64_t> objs;
};

// Parser thread, at the cut: the type's own fields into its record (the engine writes the identity,
// parents, version, charge and device bytes).
using RecordFn = void (*)(const Handle& h, ckpt::pb::HandleRecord* r);
// Restore, in record order (parents first): the type's own fields back from the record, and the
// backend object made again. The engine has adopted the handle at its address with its parents.
using RestoreFn = Status (*)(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h);
// Restore, once every handle exists: links to handles that may come later in the record order.
using LinkFn = Status (*)(RestoreScope& s, Handle* h);
// Parser thread, at cudaSetDevice: a live handle whose state a device move would lose (the client
// then stays on its device; ParserScope::holds_device_state).
using PinsFn = bool (*)(const ParserScope& ps, const Handle& h);
// Worker thread, during a device move: a handle the worker has loaded (WorkerScope::loaded) made
// again on the new device. Other types' hooks say why they need nothing (the new context brings
// them) or that a move cannot reach them (their handles pin the client).
using MoveFn = Status (*)(MoveScope& s, Handle* h);

struct ResourceOps {
  DeviceBytes bytes = DeviceBytes::kNone;
  RecordFn record = nullptr;    // optional: types with no fields of their own
  RestoreFn restore = nullptr;  // required
  LinkFn link = nullptr;        // optional
  PinsFn pins = nullptr;        // required
  MoveFn move = nullptr;        // required
};

// Indexed by ResourceType. A type lacking a required hook is a POS bug: gaps() names it, and the
// runtime refuses to start with one (pos/runtime.cc), so a forgotten hook never fails silently.
class ResourceTable {
 public:
  void set(ResourceType t, ResourceOps ops) { ops_[static_cast<size_t>(t)] = ops; }
  const ResourceOps& get(ResourceType t) const { return ops_[static_cast<size_t>(t)]; }
  // One line per missing required hook, naming the type ("resource type 'stream' has no restore
  // hook"); empty when the table is complete.
  std::vector<std::string> gaps() const;

 private:
  std::array<ResourceOps, kResourceTypeCount> ops_{};
};

}  // namespace pos
