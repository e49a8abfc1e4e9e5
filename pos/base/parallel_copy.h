// parallel_copy.h — memcpy of large blocks by the calling thread and a few helper threads.
// Pageable bytes reach the device through pinned staging slots: the app side of a posd session
// through the shared arena's (docs/remoting.md), the in-process CUDA backend through its own
// (pos/staged_copy.h, docs/cuda_backend.md). One core's memcpy (about 10 GB/s) is slower than the
// DMA that fills or drains a slot (PCIe, about 50 GB/s), so each staged chunk is split among
// several threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "pos/base/sync.h"

namespace pos {

// One caller at a time (ShmSession calls it under its mutex, a CUDA client from its worker); the
// helpers are internal.
// Helpers start on the first copy large enough to split, spin for `spin_ns` after each piece of
// work (the next chunk of a large copy is usually a DMA away), then sleep on a futex.
class ParallelCopier {
 public:
  // A copy is split into pieces of at least this many bytes (smaller ones are one memcpy).
  static constexpr uint64_t kMinPiece = 256 << 10;

  // `threads`: how many threads copy a large block, the caller included (1: the caller alone).
  ParallelCopier(unsigned threads, uint64_t spin_ns);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  // Copies n bytes from src to dst (not overlapping); returns once all of them are copied.
  void copy(void* dst, const void* src, uint64_t n);
  unsigned threads() const { return threads_; }
  // Helper threads running now (0 until the first large copy).
  unsigned helpers_started() const { return static_cast<unsigned>(helpers_.size()); }

 private:
  // claim_ packs the job's generation (high 32 bits), its piece count (16) and the next unclaimed
  // piece (16): one CAS both checks that a piece belongs to the current job and takes it, so a
  // helper never reads a job's fields unless it holds one of its pieces (the caller moves on to
  // the next job only once every piece is done).
  static uint64_t pack(uint64_t gen, uint64_t pieces, uint64_t next) { return gen << 32 | pieces << 16 | next; }
  void helper_main();
  void run_pieces(uint32_t gen);  // takes and copies pieces of job `gen` until none is left

  const unsigned threads_;
  const uint64_t spin_ns_;
  // The current job: written by the caller before it publishes claim_, read by piece holders.
  std::byte* dst_ = nullptr;
  const std::byte* src_ = nullptr;
  uint64_t n_ = 0, piece_bytes_ = 0;
  uint32_t gen_ = 0;  // caller only

  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<uint32_t> done_{0};  // pieces of the current job copied
  std::atomic<bool> stop_{false};
  Doorbell work_bell_;  // helpers sleep here between jobs
  Doorbell done_bell_;  // the caller sleeps here (rarely: it spins) for the last piece
  std::vector<std::thread> helpers_;
};

}  // namespace pos
