// staged_lanes.cc — pieces claimed in order from one counter; each lane double-buffers: the DMA of
// its next piece runs while it copies the last one out of its other slot.
#include "pos/backends/staged_lanes.h"

#include <algorithm>
#include <cstring>

#include "pos/base/sync.h"
#include "pos/base/thread.h"

namespace pos {

StagedLanes::StagedLanes(unsigned lanes, std::vector<std::byte*> slots, uint64_t slot_bytes)
    : lanes_(std::max(1u, lanes)), slots_(std::move(slots)), slot_bytes_(slot_bytes) {}

StagedLanes::~StagedLanes() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

std::vector<HostSpan> StagedLanes::plan(std::span<const HostSpan> spans, uint64_t slot_bytes) {
  std::vector<HostSpan> out;
  for (const HostSpan& s : spans) {
    uint64_t done = 0;
    while (done < s.n) {
      const uint64_t at = reinterpret_cast<uintptr_t>(s.host) + done;
      const uint64_t to_boundary = slot_bytes - at % slot_bytes;
      const uint64_t n = std::min(to_boundary, s.n - done);
      out.push_back(HostSpan{s.host + done, s.dev + done, n});
      done += n;
    }
  }
  return out;
}

void StagedLanes::start_helpers() {
  if (helpers_tried_) return;
  helpers_tried_ = true;
  for (unsigned lane = 1; lane < lanes_; ++lane) {
    std::thread t;
    // A helper the kernel refuses only means fewer lanes: the batch still completes.
    if (!start_thread(&t, "a checkpoint copy thread", [this, lane] {
           name_this_thread("pos-ckpt-copy");
           helper_main(lane);
         }).ok())
      break;
    helpers_.push_back(std::move(t));
  }
}

void StagedLanes::helper_main(unsigned lane) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || gen_ != seen; });
      if (stop_) return;
      seen = gen_;
    }
    Status s = run_lane(lane);
    std::lock_guard<std::mutex> lk(mu_);
    if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
    if (--busy_ == 0) done_cv_.notify_all();
  }
}

Status StagedLanes::run_lane(unsigned lane) {
  LaneDevice& dev = *dev_;
  std::byte* const slot[2] = {slots_[2 * lane], slots_[2 * lane + 1]};
  Status st = dev.enter(lane);
  bool queued = false;  // a DMA of this lane may still run (waited for below, whatever happens)
  size_t prev = pieces_.size();
  unsigned prev_slot = 0, k = 0;
  while (st.ok() && !failed_.load(std::memory_order_acquire)) {
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces_.size()) break;
    const HostSpan& p = pieces_[i];
    queued = true;
    st = dev.to_host(lane, slot[k], p.dev, p.n);
    if (st.ok()) st = dev.fence(lane, k);
    if (st.ok() && prev < pieces_.size()) {
      st = dev.wait(lane, prev_slot);
      if (st.ok()) std::memcpy(pieces_[prev].host, slot[prev_slot], pieces_[prev].n);
    }
    prev = i, prev_slot = k, k ^= 1;
  }
  if (st.ok() && prev < pieces_.size() && !failed_.load(std::memory_order_acquire)) {
    st = dev.wait(lane, prev_slot);
    if (st.ok()) std::memcpy(pieces_[prev].host, slot[prev_slot], pieces_[prev].n);
    if (st.ok()) queued = false;
  }
  if (!st.ok()) failed_.store(true, std::memory_order_release);
  // Whatever stopped the lane, its slots must be idle before d2h returns.
  if (queued) {
    Status d = dev.drain(lane);
    if (st.ok() && failed_.load(std::memory_order_acquire)) return Status::Ok();  // another lane's error counts
    if (st.ok()) st = std::move(d);
  }
  return st;
}

Status StagedLanes::d2h(LaneDevice& dev, std::span<const HostSpan> spans) {
  pieces_ = plan(spans, slot_bytes_);
  if (pieces_.empty()) return Status::Ok();
  dev_ = &dev;
  next_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  // Helpers only where there is more than one piece to share.
  if (pieces_.size() > 1) start_helpers();
  const unsigned helpers = pieces_.size() > 1 ? static_cast<unsigned>(helpers_.size()) : 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    first_error_ = Status::Ok();
    if (helpers > 0) {
      busy_ = static_cast<unsigned>(helpers_.size());
      ++gen_;
    }
  }
  if (helpers > 0) work_cv_.notify_all();
  Status mine = run_lane(0);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return busy_ == 0; });
  if (!mine.ok()) return mine;
  return first_error_;
}

}  // namespace pos
