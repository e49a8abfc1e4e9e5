// parallel_copy.cc — the caller publishes a job, helpers and caller take pieces of it by CAS, the
// caller waits for the last piece.
#include "pos/base/parallel_copy.h"

#include <algorithm>
#include <cstring>

namespace pos {

ParallelCopier::ParallelCopier(unsigned threads, uint64_t spin_ns)
    : threads_(std::clamp(threads, 1u, 64u)), spin_ns_(spin_ns) {}

ParallelCopier::~ParallelCopier() {
  stop_.store(true, std::memory_order_release);
  work_bell_.ring();
  for (auto& t : helpers_) t.join();
}

void ParallelCopier::copy(void* dst, const void* src, uint64_t n) {
  if (threads_ == 1 || n < 2 * kMinPiece) {
    std::memcpy(dst, src, n);
    return;
  }
  while (helpers_.size() + 1 < threads_) helpers_.emplace_back([this] {
    name_this_thread("pos-copy");
    helper_main();
  });
  // A few pieces per thread, each a whole number of pages: a thread that starts late (or is
  // descheduled) still takes a share, and with a page-aligned destination no two threads write
  // one page.
  const uint64_t want = std::min<uint64_t>(4ull * threads_, n / kMinPiece);
  piece_bytes_ = ((n + want - 1) / want + 4095) / 4096 * 4096;
  const uint64_t pieces = (n + piece_bytes_ - 1) / piece_bytes_;
  dst_ = static_cast<std::byte*>(dst);
  src_ = static_cast<const std::byte*>(src);
  n_ = n;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = ++gen_;
  claim_.store(pack(gen, pieces, 0), std::memory_order_release);  // publishes the fields above
  work_bell_.ring();
  run_pieces(gen);
  spin_then_block(done_bell_, spin_ns_, [&] { return done_.load(std::memory_order_acquire) == pieces; });
}

void ParallelCopier::run_pieces(uint32_t gen) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t pieces = (c >> 16) & 0xffff, next = c & 0xffff;
    if (static_cast<uint32_t>(c >> 32) != gen || next >= pieces) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Holding piece `next`: the job's fields stay as they are until it is done.
    const uint64_t off = next * piece_bytes_;
    std::memcpy(dst_ + off, src_ + off, std::min(piece_bytes_, n_ - off));
    done_.fetch_add(1, std::memory_order_release);
    done_bell_.ring();
    c = claim_.load(std::memory_order_acquire);
  }
}

void ParallelCopier::helper_main() {
  uint32_t seen = 0;
  for (;;) {
    spin_then_block(work_bell_, spin_ns_, [&] {
      return stop_.load(std::memory_order_acquire) ||
             static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32) != seen;
    });
    if (stop_.load(std::memory_order_acquire)) return;
    seen = static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32);
    run_pieces(seen);
  }
}

}  // namespace pos
