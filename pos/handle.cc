// handle.cc — handle managers: mocked allocation at final addresses, containment lookup, reuse.
// Freed address ranges are coalesced and reused only after the worker has really freed them.
#include "pos/handle.h"

#include <algorithm>
#include <cstdio>

namespace pos {

HandleManager::HandleManager(ResourceType type, uint64_t base, uint64_t size, uint64_t granularity)
    : type_(type),
      base_(base),
      size_(size),
      granularity_(granularity == 0 ? 1 : granularity),
      ranged_(type == ResourceType::kMemory || type == ResourceType::kVar) {
  if (ranged_ && size_ > 0) free_.emplace(base_, size_);
}

StatusOr<uint64_t> HandleManager::reserve_range(uint64_t bytes) {
  const uint64_t need = (bytes + granularity_ - 1) / granularity_ * granularity_;
  if (need == 0 || need < bytes) return Status::Cuda(cuda::kErrorMemoryAllocation, "allocation size overflows");
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= need) {
      const uint64_t addr = it->first;
      const uint64_t rest = it->second - need;
      free_.erase(it);
      if (rest > 0) free_.emplace(addr + need, rest);
      return addr;
    }
  }
  return Status::Cuda(cuda::kErrorMemoryAllocation, "client address range exhausted");
}

void HandleManager::unreserve_range(uint64_t addr, uint64_t bytes) {
  auto [it, inserted] = free_.emplace(addr, bytes);
  (void)inserted;
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

Handle* HandleManager::insert(uint64_t addr, uint64_t size, uint64_t reserved, std::vector<Handle*> parents,
                              uint64_t pc, uint64_t id) {
  auto h = std::make_unique<Handle>();
  h->id = id != 0 ? id : next_id_;
  next_id_ = std::max(next_id_, h->id + 1);
  h->type = type_;
  h->client_addr = addr;
  h->size = size;
  h->reserved_size = reserved;
  h->parents = std::move(parents);
  h->created_pc = pc;
  h->version = pc;
  Handle* raw = h.get();
  handles_.emplace(raw->id, std::move(h));
  by_addr_[addr] = raw;
  ++active_;
  bytes_reserved_ += reserved;
  latest_ = raw;
  return raw;
}

StatusOr<Handle*> HandleManager::allocate_mocked_resource(uint64_t size, std::vector<Handle*> parents, uint64_t pc) {
  if (ranged_) {
    if (size > (1ull << 62)) return Status::Cuda(cuda::kErrorMemoryAllocation, "allocation size out of range");
    auto addr = reserve_range(size + 1);
    if (!addr.ok()) return addr.status();
    const uint64_t reserved = (size + 1 + granularity_ - 1) / granularity_ * granularity_;
    return insert(*addr, size, reserved, std::move(parents), pc);
  }
  // Opaque handles: 16-byte slots, so values look like (and cannot collide with) pointers.
  const uint64_t slot_addr = base_ + (next_slot_++) * 16;
  if (slot_addr >= base_ + size_) return Status::Cuda(cuda::kErrorMemoryAllocation, "handle slots exhausted");
  return insert(slot_addr, size, 0, std::move(parents), pc);
}

StatusOr<Handle*> HandleManager::adopt_at(uint64_t addr, uint64_t size, std::vector<Handle*> parents, uint64_t pc,
                                          uint64_t id) {
  if (by_addr_.count(addr) != 0) return Status::InvalidArgument("address already in use");
  if (id != 0 && handles_.count(id) != 0) return Status::InvalidArgument("handle id already in use");
  if (ranged_ && (addr < base_ || addr >= base_ + size_)) return Status::InvalidArgument("address outside the range");
  uint64_t reserved = 0;
  if (ranged_) {
    reserved = (size + 1 + granularity_ - 1) / granularity_ * granularity_;
    // Carve [addr, addr+reserved) out of the free list; it must be wholly free.
    auto it = free_.upper_bound(addr);
    if (it == free_.begin()) return Status::InvalidArgument("address not free");
    --it;
    const uint64_t fb = it->first, fs = it->second;
    if (addr < fb || addr + reserved > fb + fs) return Status::InvalidArgument("address not free");
    free_.erase(it);
    if (addr > fb) free_.emplace(fb, addr - fb);
    if (fb + fs > addr + reserved) free_.emplace(addr + reserved, fb + fs - addr - reserved);
  }
  if (!ranged_ && addr >= base_ && addr < base_ + size_) {
    // Later slots must not land on the adopted value.
    next_slot_ = std::max(next_slot_, (addr - base_) / 16 + 1);
  }
  return insert(addr, size, reserved, std::move(parents), pc, id);
}

Handle* HandleManager::get(uint64_t addr) {
  if (latest_ != nullptr && latest_->client_addr == addr && latest_->state == HandleState::kActive) return latest_;
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end() || it->second->state != HandleState::kActive) return nullptr;
  latest_ = it->second;
  return it->second;
}

Handle* HandleManager::find_containing(uint64_t addr, uint64_t* offset) {
  Handle* h = latest_;
  if (h == nullptr || h->state != HandleState::kActive || addr < h->client_addr ||
      addr - h->client_addr >= std::max<uint64_t>(h->size, 1)) {
    auto it = by_addr_.upper_bound(addr);
    if (it == by_addr_.begin()) return nullptr;
    --it;
    h = it->second;
    if (h->state != HandleState::kActive || addr - h->client_addr >= std::max<uint64_t>(h->size, 1)) return nullptr;
    latest_ = h;
  }
  if (offset != nullptr) *offset = addr - h->client_addr;
  return h;
}

Handle* HandleManager::find_any_containing(uint64_t addr) {
  auto it = by_addr_.upper_bound(addr);
  if (it == by_addr_.begin()) return nullptr;
  --it;
  Handle* h = it->second;
  const uint64_t extent = std::max<uint64_t>({h->reserved_size, h->size, 1});
  return addr - h->client_addr < extent ? h : nullptr;
}

void HandleManager::mark_deleted(Handle* h) {
  if (h->state != HandleState::kActive) return;
  h->state = HandleState::kPendingDelete;
  --active_;
  if (latest_ == h) latest_ = nullptr;
}

void HandleManager::release(Handle* h) {
  if (h->state == HandleState::kActive) --active_;
  h->state = HandleState::kDeleted;
  auto it = by_addr_.find(h->client_addr);
  if (it != by_addr_.end() && it->second == h) by_addr_.erase(it);
  if (ranged_ && h->reserved_size > 0) unreserve_range(h->client_addr, h->reserved_size);
  bytes_reserved_ -= h->reserved_size;
  if (latest_ == h) latest_ = nullptr;
  handles_.erase(h->id);
}

}  // namespace pos
