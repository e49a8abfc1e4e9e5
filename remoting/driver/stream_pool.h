// stream_pool.h — stream-ordered device memory (cuMemAllocAsync / cuMemFreeAsync, PyTorch's
// `backend:cudaMallocAsync`) carved out of placed segments, so that it too lives at POS's addresses
// and is dumped, handed off and checkpointed like any placed allocation (docs/driver_runtime.md).
//
// The driver's own pool would put that memory where POS cannot place it. This sub-allocator keeps
// the driver's ordering rule instead: a block freed on stream S is reused at once by an allocation on
// S (the stream orders the two), and by an allocation on another stream only once an event recorded
// at the free has completed. Device-neutral (the driver comes in as function pointers, segments
// from a callback), so tests drive it without a GPU. Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "remoting/driver/driver_api.h"

namespace pos::driver {

struct StreamPoolCalls {
  CUresult (*ctx_get_device)(CUdevice* dev) = nullptr;
  CUresult (*event_create)(CUevent* e, unsigned int flags) = nullptr;
  CUresult (*event_record)(CUevent e, CUstream s) = nullptr;
  CUresult (*event_query)(CUevent e) = nullptr;
  CUresult (*event_destroy)(CUevent e) = nullptr;
  CUresult (*synchronize)() = nullptr;  // cuCtxSynchronize: before a trim, and a cuMemFree of pool memory
  bool complete() const {
    return ctx_get_device && event_create && event_record && event_query && event_destroy && synchronize;
  }
};

// Where segments come from and go (Placement::alloc / free in the runtime).
struct SegmentSource {
  std::function<CUresult(CUdeviceptr* out, size_t bytes, bool* placed)> alloc;
  std::function<CUresult(CUdeviceptr p)> free;
};

class StreamPool {
 public:
  // Segments are at least this large (a larger request gets a segment of its own, rounded up to
  // kSegmentAlign); blocks are rounded to kBlockAlign, cudaMallocAsync's alignment.
  static constexpr uint64_t kSegmentBytes = 32ull << 20;
  static constexpr uint64_t kSegmentAlign = 2ull << 20;
  static constexpr uint64_t kBlockAlign = 512;
  // CUstream values the driver gives meaning to: the legacy and the per-thread default streams.
  static constexpr uintptr_t kStreamLegacy = 0x1, kStreamPerThread = 0x2;

  StreamPool(const StreamPoolCalls& calls, SegmentSource segments);
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // `bytes` on the current device, usable in stream order on `s`. `per_thread`: `s` is this
  // thread's per-thread default stream (the _ptsz entry points with a null stream): never reused
  // by identity, only through its event. *placed false: no segment could be placed (the caller
  // leaves the allocation to the driver).
  // `dev`: the current device if the caller knows it (-1: asked of the driver).
  CUresult alloc(CUdeviceptr* out, size_t bytes, CUstream s, bool per_thread, bool* placed, int dev = -1);
  // Frees `p` in stream order on `s` (*ours false: not this pool's; the caller passes it on). A
  // pointer that is not a live block's start is CUDA_ERROR_INVALID_VALUE, as the driver says.
  CUresult free_async(CUdeviceptr p, CUstream s, bool per_thread, bool* ours);
  // cuMemFree of pool memory: the device finishes first (as cuMemFree does), then the block is free.
  CUresult free_now(CUdeviceptr p, bool* ours);
  // A free inside a stream capture: the block waits for a trim (which synchronizes the device)
  // before it is used again, since no event can be recorded outside the graph.
  CUresult free_deferred(CUdeviceptr p, bool* ours);
  bool owns(CUdeviceptr p) const;
  // Gives wholly free segments back until at most `keep` bytes are held (cuMemPoolTrimTo); the
  // device is synchronized first, so every pending free has completed.
  CUresult trim(size_t keep);
  // Before cuStreamDestroy(s): frees on `s` whose event was not recorded yet get it now.
  void stream_ending(CUstream s);

  // What of each segment live blocks hold now, for a cut that copies only those (docs/driver_runtime.md,
  // "GPU-only checkpoints"): segment start -> its pieces [begin, end), each live block rounded out to
  // `align` (a power of two) within its segment, overlapping ones merged; empty for a segment with
  // no live block. A block freed inside a capture still counts as live (the graph may use it).
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> live_pieces(uint64_t align) const;

  struct Stats {
    uint64_t reserved = 0, used = 0, reserved_high = 0, used_high = 0;
    uint64_t allocs = 0, frees = 0, reused_same_stream = 0, reused_after_event = 0, segments = 0;
    uint64_t events_recorded = 0;
  };
  Stats stats() const;

 private:
  // A pending free's ordering: the block may be used on `stream` at once, elsewhere once an event
  // recorded on `stream` after the free has completed (shared by the pieces a block is split into).
  // The event is recorded only when another stream asks (an event recorded later on the same
  // stream waits for at least as much): a job on one stream never pays for events. A free on a
  // per-thread default stream records at once (only its own thread can name that stream).
  struct Fence {
    StreamPool* pool = nullptr;
    CUstream stream = nullptr;
    bool per_thread = false;
    CUevent event = nullptr;  // null until recorded
    bool done = false;        // no event could be had: the device was synchronized instead
    bool stream_ended = false;  // `stream` was destroyed: its handle may name another stream now
    ~Fence();
  };
  struct Block {
    int dev = 0;
    uint64_t seg = 0;       // the segment's start
    uint64_t size = 0;
    bool free = false;
    bool deferred = false;  // freed in a capture: waits for a trim
    std::shared_ptr<Fence> fence;  // null: usable anywhere
  };
  bool record(Fence& f);      // under mu_: f's event recorded now (false: synchronized instead)
  bool complete(Fence& f);    // under mu_: whether f's event has completed (recording it if need be)
  static CUstream named(CUstream s, bool per_thread);  // the legacy stream's one name
  bool usable(Block& b, CUstream s, bool per_thread, bool* same);  // under mu_
  void index(uint64_t addr);    // under mu_: a free block into the best-fit index
  void unindex(uint64_t addr);  // under mu_
  void merge_around(uint64_t addr);  // under mu_: a free block joined with free neighbours of its segment
  CUresult release(uint64_t addr, bool deferred, CUstream s, bool per_thread);  // under mu_

  const StreamPoolCalls calls_;
  const SegmentSource segments_;
  mutable std::mutex mu_;
  std::vector<CUevent> spare_events_;                 // under mu_: recycled (before blocks_: outlives their fences)
  std::map<uint64_t, Block> blocks_;                  // address -> block, every block of every segment
  std::set<std::pair<uint64_t, uint64_t>> by_size_;   // free blocks: (size, address)
  std::map<uint64_t, std::pair<int, uint64_t>> segs_;  // segment start -> (device, size)
  Stats stats_;
};

}  // namespace pos::driver
