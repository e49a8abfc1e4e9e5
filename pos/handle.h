// handle.h — resources as handles (id, type, client-visible address, size, parents, version) and
// their per-type managers. Parser functions allocate "mocked" handles; the worker makes them real.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pos/base/resource_type.h"
#include "pos/base/status.h"

namespace pos {


enum class HandleState : uint8_t {
  kActive,         // usable by later calls (the worker may not have created it yet: "mocked")
  kPendingDelete,  // deleted by the parser; the worker has not destroyed it yet
  kDeleted,        // gone; address may be reused
};

// A kernel parameter as the backend describes it (cuFuncGetParamInfo, or the host kernel library).
struct KernelParam {
  uint32_t offset = 0;
  uint32_t size = 0;
  bool read_only = false;  // proven read-only (const pointer): recorded as an In edge
};

// Field ownership (the client's parser and worker threads share handles):
//  - identity (id, type, client_addr, size, parents, created_pc): immutable after creation;
//  - parser fields (state, version, dirty, per-type config): parser thread only;
//  - worker fields (backend_obj, layout*, resolved): worker thread only, except where a sync
//    call publishes them (RegisterFunction writes layout; the caller's wait orders later reads).
struct Handle {
  uint64_t id = 0;
  ResourceType type = ResourceType::kMemory;
  uint64_t client_addr = 0;  // what the app sees (device pointer, cudaStream_t, ...)
  uint64_t size = 0;         // bytes for memory / vars; 0 otherwise
  uint64_t reserved_size = 0;  // address-space footprint: size + 1 rounded up to the granularity, so
                               // a buffer's one-past-the-end address is never another buffer's start
  uint64_t charged = 0;        // bytes counted against quota / device memory (size rounded up)
  std::vector<Handle*> parents;
  uint64_t created_pc = 0;

  // parser-owned
  HandleState state = HandleState::kActive;
  uint64_t version = 0;  // api_inst_pc of the last call that wrote this handle
  bool dirty = false;    // written since the last dirty-set collection
  uint32_t flags = 0;    // stream / event flags
  int32_t priority = 0;  // stream priority
  int32_t math_mode = 0;           // cuBLAS
  uint64_t bound_stream = 0;       // cuBLAS: client-visible stream
  Handle* bound_stream_handle = nullptr;
  std::string name;                // function / var name
  std::vector<std::byte> blob;     // module fatbin (kept for checkpoint / restore)
  bool recorded = false;           // event: recorded at least once
  std::vector<std::pair<int32_t, int32_t>> func_attrs;  // cudaFuncSetAttribute history (stateful)

  // worker-owned
  uint64_t backend_obj = 0;        // the backend's object id (stream, event, module, function...)
  bool resolved = false;           // function: backend knows it (layout valid)
  std::vector<KernelParam> layout;  // function parameter layout
  uint32_t param_bytes = 0;
};

// One manager per resource type, per client. Confined to the client's parser thread.
class HandleManager {
 public:
  // Addresses for this type come from [base, base+size). Memory-like types (memory, vars) use a
  // first-fit range allocator at `granularity`; the others get one 16-byte slot each.
  HandleManager(ResourceType type, uint64_t base, uint64_t size, uint64_t granularity);

  ResourceType type() const { return type_; }

  // Create a handle whose client-visible address is final now (before the worker runs).
  StatusOr<Handle*> allocate_mocked_resource(uint64_t size, std::vector<Handle*> parents, uint64_t pc);
  // Adopt a handle at a fixed address (default stream = 0, restore at the same address). A nonzero
  // `id` keeps the handle's id (restore: incremental images name buffers by id).
  StatusOr<Handle*> adopt_at(uint64_t addr, uint64_t size, std::vector<Handle*> parents, uint64_t pc,
                             uint64_t id = 0);

  // Exact lookup of an active handle by client-visible address (streams, events, ...).
  Handle* get(uint64_t addr);
  // Any address inside an active buffer: the handle and the offset into it.
  Handle* find_containing(uint64_t addr, uint64_t* offset);
  // Any handle (also pending delete) whose reserved range contains addr.
  Handle* find_any_containing(uint64_t addr);
  Handle* latest_used_handle() const { return latest_; }

  // Parser: the app deleted it; later lookups fail, the address stays reserved.
  void mark_deleted(Handle* h);
  // After the worker destroyed it: the address may be reused, the handle is freed.
  void release(Handle* h);

  bool contains_range(uint64_t addr) const { return addr >= base_ && addr < base_ + size_; }
  size_t active_count() const { return active_; }
  uint64_t granularity() const { return granularity_; }
  uint64_t round_up(uint64_t n) const { return (n + granularity_ - 1) / granularity_ * granularity_; }
  uint64_t bytes_reserved() const { return bytes_reserved_; }
  // Allocation cursors, saved in an image so that a restored client hands out fresh values.
  uint64_t next_id() const { return next_id_; }
  uint64_t next_slot() const { return next_slot_; }
  void set_cursors(uint64_t next_id, uint64_t next_slot) {
    next_id_ = std::max(next_id_, next_id);
    next_slot_ = std::max(next_slot_, next_slot);
  }
  template <typename F>
  void for_each(F&& f) {
    for (auto& [id, h] : handles_) f(h.get());
  }
  // Whether f holds for some active handle; stops at the first (a client may hold many buffers).
  template <typename F>
  bool any_active(F&& f) const {
    if (active_ == 0) return false;
    for (const auto& [id, h] : handles_)
      if (h->state == HandleState::kActive && f(static_cast<const Handle&>(*h))) return true;
    return false;
  }

 private:
  StatusOr<uint64_t> reserve_range(uint64_t bytes);
  void unreserve_range(uint64_t addr, uint64_t bytes);
  Handle* insert(uint64_t addr, uint64_t size, uint64_t reserved, std::vector<Handle*> parents, uint64_t pc,
                 uint64_t id = 0);

  ResourceType type_;
  uint64_t base_, size_, granularity_;
  bool ranged_;
  uint64_t next_id_ = 1;
  uint64_t next_slot_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Handle>> handles_;  // by id: owns every handle
  std::map<uint64_t, Handle*> by_addr_;                            // active handles, by address
  std::map<uint64_t, uint64_t> free_;                              // free address ranges (ranged types)
  Handle* latest_ = nullptr;
  size_t active_ = 0;
  uint64_t bytes_reserved_ = 0;
};

}  // namespace pos
