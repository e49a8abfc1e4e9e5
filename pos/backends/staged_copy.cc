// staged_copy.cc — the slot pipeline: chunk i goes through slot i % slots; a slot is touched by the
// CPU only after the fence of its previous DMA has passed.
#include "pos/backends/staged_copy.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace pos {

StatusOr<unsigned> copy_threads_from_env(const char* value, unsigned cores) {
  if (value == nullptr || *value == '\0') return std::clamp(cores, 1u, 4u);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  if (errno != 0 || *value < '0' || *value > '9' || *end != '\0' || v < 0 || v > static_cast<long>(StagingOptions::kMaxThreads))
    return Status::InvalidArgument(std::string("POS_COPY_THREADS must be a number from 0 (no staging) to ") +
                                   std::to_string(StagingOptions::kMaxThreads) + ", not '" + value + "'");
  return static_cast<unsigned>(v);
}

LanePlan plan_lanes(unsigned lanes_asked, uint64_t staging_bytes, unsigned cores) {
  constexpr uint64_t kMinSlot = 256ull << 10, kMaxSlot = 8ull << 20;
  unsigned lanes = lanes_asked != 0 ? lanes_asked : std::clamp(cores, 1u, 8u);
  lanes = std::min(lanes, StagingOptions::kMaxThreads);
  while (lanes > 1 && staging_bytes / (2ull * lanes) < kMinSlot) --lanes;
  uint64_t per = staging_bytes / (2ull * lanes);
  if (per < kMinSlot) return LanePlan{};
  uint64_t slot = kMinSlot;
  while (slot * 2 <= per && slot * 2 <= kMaxSlot) slot *= 2;
  return LanePlan{lanes, slot};
}

uint64_t staged_chunk_count(uint64_t n, uint64_t slot_bytes) { return (n + slot_bytes - 1) / slot_bytes; }

StagedChunk staged_chunk(uint64_t i, uint64_t n, uint64_t slot_bytes, unsigned slots) {
  StagedChunk c;
  c.offset = i * slot_bytes;
  c.bytes = std::min(slot_bytes, n - c.offset);
  c.slot = static_cast<unsigned>(i % slots);
  return c;
}

StagingPipeline::StagingPipeline(std::vector<std::byte*> slots, uint64_t slot_bytes, ParallelCopier* copier)
    : slots_(std::move(slots)), slot_bytes_(slot_bytes), copier_(copier), fenced_(slots_.size(), false) {}

Status StagingPipeline::wait_slot(StagingDevice& dev, unsigned slot) {
  if (!fenced_[slot]) return Status::Ok();
  fenced_[slot] = false;
  return dev.wait(slot);
}

Status StagingPipeline::fail(StagingDevice& dev, Status first) {
  (void)dev.drain();  // the first failure is the one the app sees
  std::fill(fenced_.begin(), fenced_.end(), false);
  return first;
}

Status StagingPipeline::h2d(StagingDevice& dev, uint64_t dst, const void* src, uint64_t n) {
  const auto* from = static_cast<const std::byte*>(src);
  const uint64_t chunks = staged_chunk_count(n, slot_bytes_);
  for (uint64_t i = 0; i < chunks; ++i) {
    const StagedChunk c = staged_chunk(i, n, slot_bytes_, slots());
    // The slot's previous DMA (chunk i - slots) must have read it before it is refilled.
    if (Status st = wait_slot(dev, c.slot); !st.ok()) return fail(dev, std::move(st));
    copier_->copy(slots_[c.slot], from + c.offset, c.bytes);
    if (Status st = dev.to_device(dst + c.offset, slots_[c.slot], c.bytes); !st.ok()) return fail(dev, std::move(st));
    if (Status st = dev.fence(c.slot); !st.ok()) return fail(dev, std::move(st));
    fenced_[c.slot] = true;
  }
  for (unsigned s = 0; s < slots(); ++s)
    if (Status st = wait_slot(dev, s); !st.ok()) return fail(dev, std::move(st));
  return Status::Ok();
}

Status StagingPipeline::queue_d2h(StagingDevice& dev, uint64_t i, uint64_t src, uint64_t n) {
  const StagedChunk c = staged_chunk(i, n, slot_bytes_, slots());
  POS_RETURN_IF_ERROR(dev.to_host(slots_[c.slot], src + c.offset, c.bytes));
  POS_RETURN_IF_ERROR(dev.fence(c.slot));
  fenced_[c.slot] = true;
  return Status::Ok();
}

Status StagingPipeline::d2h(StagingDevice& dev, void* dst, uint64_t src, uint64_t n) {
  auto* to = static_cast<std::byte*>(dst);
  const uint64_t chunks = staged_chunk_count(n, slot_bytes_);
  const uint64_t ahead = std::min<uint64_t>(chunks, slots());
  for (uint64_t i = 0; i < ahead; ++i)
    if (Status st = queue_d2h(dev, i, src, n); !st.ok()) return fail(dev, std::move(st));
  for (uint64_t i = 0; i < chunks; ++i) {
    const StagedChunk c = staged_chunk(i, n, slot_bytes_, slots());
    if (Status st = wait_slot(dev, c.slot); !st.ok()) return fail(dev, std::move(st));
    copier_->copy(to + c.offset, slots_[c.slot], c.bytes);
    // The slot is free again: it takes the chunk `slots` ahead while the others' DMAs run.
    if (i + slots() < chunks)
      if (Status st = queue_d2h(dev, i + slots(), src, n); !st.ok()) return fail(dev, std::move(st));
  }
  return Status::Ok();
}

}  // namespace pos
