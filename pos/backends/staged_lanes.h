// staged_lanes.h — a checkpoint's large copies from a device into pageable host memory, by several
// threads at once, each with a stream ("lane") and two page-locked slots of its own. The CUDA
// backend's checkpoint copier uses it for images in memory that was never page-locked
// (docs/cuda_backend.md); the scheduling is device-neutral and tested against a fake device.
//
// Why lanes rather than one pipeline split among threads (staged_copy.h): a first dump writes host
// memory nobody has touched, and the kernel zeroes every page on its first write (2 MiB at a time
// where transparent huge pages are on). A memcpy split among threads within one slot puts them all
// on the same huge page, so the faults run one at a time; with lanes each thread copies whole
// pieces that never share a slot-sized stretch of host addresses, so faults and copies run in
// parallel, and the DMAs of all lanes keep the copy engine busy meanwhile.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "pos/backend.h"
#include "pos/base/status.h"

namespace pos {

// The device side: one stream per lane, two fences (slots 0 and 1) per lane. Each lane's calls
// come from one thread at a time; different lanes from different threads concurrently.
class LaneDevice {
 public:
  virtual ~LaneDevice() = default;
  virtual Status enter(unsigned lane) = 0;  // on the thread about to run `lane` (binds the context)
  virtual Status to_host(unsigned lane, void* slot, uint64_t src, uint64_t n) = 0;  // queue device → slot
  virtual Status fence(unsigned lane, unsigned slot) = 0;  // mark the lane's DMAs queued so far
  virtual Status wait(unsigned lane, unsigned slot) = 0;   // until that slot's last fence has passed
  virtual Status drain(unsigned lane) = 0;                 // until every DMA of the lane has finished
};

class StagedLanes {
 public:
  // `slots`: 2 × lanes page-locked buffers of `slot_bytes` (lane L owns 2L and 2L + 1), owned by the
  // caller and idle whenever no d2h runs. Helper threads (lanes - 1) start on the first d2h.
  StagedLanes(unsigned lanes, std::vector<std::byte*> slots, uint64_t slot_bytes);
  ~StagedLanes();
  StagedLanes(const StagedLanes&) = delete;
  StagedLanes& operator=(const StagedLanes&) = delete;

  // Copies every span from the device into host memory. Returns once all bytes are there, or with
  // the first failure; either way with every lane's DMAs finished (the slots are idle). If a
  // helper thread cannot be started, the lanes that exist do the work. One caller at a time.
  Status d2h(LaneDevice& dev, std::span<const HostSpan> spans);

  unsigned lanes() const { return lanes_; }
  unsigned helpers_started() const { return static_cast<unsigned>(helpers_.size()); }

  // The pieces a batch is copied in: no piece crosses a multiple of `slot_bytes` in host addresses
  // (so two lanes never write one huge page), none is longer than a slot, empty spans are dropped.
  static std::vector<HostSpan> plan(std::span<const HostSpan> spans, uint64_t slot_bytes);

 private:
  void start_helpers();
  void helper_main(unsigned lane);
  Status run_lane(unsigned lane);

  const unsigned lanes_;
  const std::vector<std::byte*> slots_;
  const uint64_t slot_bytes_;

  // The current batch: written by d2h before it bumps gen_ (under mu_), read by the lanes.
  LaneDevice* dev_ = nullptr;
  std::vector<HostSpan> pieces_;
  std::atomic<size_t> next_{0};      // the next unclaimed piece
  std::atomic<bool> failed_{false};  // a lane failed: the others stop claiming

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  uint64_t gen_ = 0;      // batches started
  unsigned busy_ = 0;     // helpers still running the current batch
  bool stop_ = false;
  Status first_error_;    // of the current batch (under mu_)
  std::vector<std::thread> helpers_;
  bool helpers_tried_ = false;
};

}  // namespace pos
