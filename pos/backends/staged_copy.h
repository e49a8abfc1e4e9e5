// staged_copy.h — copies between pageable host memory and a device through a few page-locked
// staging slots. A DMA from pageable memory makes the driver stage the bytes itself, with one
// thread (10–20 GB/s on an H200 against 55 GB/s from pinned memory). Copying through our own
// pinned slots instead, with several threads (ParallelCopier) and the DMA of one slot overlapping
// the memcpy of the next, runs near pinned speed. The CUDA backend owns the slots and the DMA
// (pos/cuda_impl/cuda_backend.cc); what is decided and pipelined here is device-neutral, so it is
// tested on the host against a fake device (unittest/staged_copy_test.cc). docs/cuda_backend.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pos/base/parallel_copy.h"
#include "pos/base/status.h"

namespace pos {

struct StagingOptions {
  // Copies below this go straight to the driver: the slots' pipeline only pays once a copy spans
  // several pieces per thread (ParallelCopier splits from 2 × 256 KiB), and below 1 MiB the
  // driver's own staging costs a few tens of µs at most.
  static constexpr uint64_t kDefaultMinBytes = 1ull << 20;
  // 4 × 8 MiB: with two slots filling while two drain the DMA engine never idles, and 8 MiB per
  // DMA amortizes its ~10 µs launch; 32 MiB pinned per client that makes such a copy.
  static constexpr uint64_t kDefaultSlotBytes = 8ull << 20;
  static constexpr unsigned kDefaultSlots = 4;
  static constexpr unsigned kMaxThreads = 64;

  uint64_t min_bytes = kDefaultMinBytes;
  uint64_t slot_bytes = kDefaultSlotBytes;
  unsigned slots = kDefaultSlots;
  // Threads that copy a chunk into or out of a slot, the calling (worker) thread included.
  // 0: no staging at all (every copy is the driver's).
  unsigned threads = 4;
  // The checkpoint copier's lanes into pageable images (staged_lanes.h): threads (0: min(8, cores))
  // and the page-locked bytes they share, two slots per lane (config checkpoint.copy_threads and
  // checkpoint.staging).
  unsigned ckpt_lanes = 0;
  uint64_t ckpt_staging_bytes = 32ull << 20;
  // The session's pool of copy-on-write shadows keeps what one checkpoint freed for the next one
  // (config checkpoint.keep_shadows; the CUDA backend's ShadowPool).
  bool keep_shadows = false;
};

// How the checkpoint copier's staging is cut: `lanes` threads, each with two slots of `slot_bytes`
// (a power of two, so that pieces split at slot boundaries never share a huge page between lanes;
// at least 256 KiB). Fewer lanes than asked where the staging is too small for them.
struct LanePlan {
  unsigned lanes = 0;
  uint64_t slot_bytes = 0;
};
LanePlan plan_lanes(unsigned lanes_asked, uint64_t staging_bytes, unsigned cores);

// POS_COPY_THREADS (nullptr or "" when unset): a number 0..64; unset: min(4, cores).
// Anything else is an InvalidArgument naming the variable.
StatusOr<unsigned> copy_threads_from_env(const char* value, unsigned cores);

// Whether a copy of `n` bytes goes through the slots. `page_locked` (a callable returning bool)
// asks the driver about the host end; it is called only for copies large enough to stage, so
// small copies cost no driver query. Page-locked memory DMAs at full speed by itself.
template <typename PageLocked>
bool should_stage(uint64_t n, const StagingOptions& o, PageLocked&& page_locked) {
  if (o.threads == 0 || o.slots == 0 || o.slot_bytes == 0 || n < o.min_bytes) return false;
  return !page_locked();
}

// Chunk i of a staged copy: bytes [offset, offset + bytes) of the copy, through slot `slot`.
struct StagedChunk {
  uint64_t offset = 0, bytes = 0;
  unsigned slot = 0;
};
uint64_t staged_chunk_count(uint64_t n, uint64_t slot_bytes);
StagedChunk staged_chunk(uint64_t i, uint64_t n, uint64_t slot_bytes, unsigned slots);

// The device side of the pipeline: DMAs queued in order on one stream, and a fence per slot.
// The CUDA backend: cuMemcpy{HtoD,DtoH}Async on the copy's stream, an event per slot.
class StagingDevice {
 public:
  virtual ~StagingDevice() = default;
  virtual Status to_device(uint64_t dst, const void* slot, uint64_t n) = 0;  // queue slot → device
  virtual Status to_host(void* slot, uint64_t src, uint64_t n) = 0;          // queue device → slot
  virtual Status fence(unsigned slot) = 0;  // mark the slot's DMAs queued so far
  virtual Status wait(unsigned slot) = 0;   // block until the slot's last fence has passed
  // After a failure: block until every DMA queued so far has finished (stream sync), fenced or not.
  virtual Status drain() = 0;
};

// Runs staged copies through `slots` (each `slot_bytes`, page-locked, owned by the caller).
// A slot is refilled (H2D) or read (D2H) only after its fence has passed. Every call returns with
// every slot idle, also on failure (it waits for whatever it queued), so the caller may free the
// slots or reuse them on another stream. Confined to one thread (a CUDA client's worker).
class StagingPipeline {
 public:
  StagingPipeline(std::vector<std::byte*> slots, uint64_t slot_bytes, ParallelCopier* copier);

  // n bytes from pageable `src` to device `dst`: memcpy chunk i into its slot, queue its DMA.
  Status h2d(StagingDevice& dev, uint64_t dst, const void* src, uint64_t n);
  // n bytes from device `src` to pageable `dst`: DMAs run up to `slots` chunks ahead of the
  // memcpy out of the slots.
  Status d2h(StagingDevice& dev, void* dst, uint64_t src, uint64_t n);

  unsigned slots() const { return static_cast<unsigned>(slots_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  Status wait_slot(StagingDevice& dev, unsigned slot);
  Status queue_d2h(StagingDevice& dev, uint64_t i, uint64_t src, uint64_t n);
  // After a failure: drains the device (best effort) so no DMA still uses a slot, returns `first`.
  Status fail(StagingDevice& dev, Status first);

  std::vector<std::byte*> slots_;
  const uint64_t slot_bytes_;
  ParallelCopier* copier_;
  std::vector<bool> fenced_;  // the slot has a fence this call has not waited for yet
};

}  // namespace pos
