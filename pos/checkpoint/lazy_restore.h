// lazy_restore.h — loading a restored client's device bytes: one verified chunk at a time (eager
// restore's loaders use it too), and LazyLoader, which loads each buffer on first use or in the background.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckpt/image.h"
#include "pos/backend.h"
#include "pos/checkpoint/checkpoint.h"
#include "pos/base/status.h"

namespace pos {

struct APIContext;

// How many loader threads a restore runs (one per core, 8 to 16): each takes one chunk, the
// lazy restore's worker one more.
size_t restore_loader_threads();

// One thread's page-locked staging buffer for chunk reads from files (kChunkSize bytes, the device
// backend's kept staging chunks, taken on first use and given back). Confined to one thread.
class ChunkStaging {
 public:
  explicit ChunkStaging(DeviceBackend* device) : device_(device) {}
  ~ChunkStaging();
  ChunkStaging(const ChunkStaging&) = delete;
  ChunkStaging& operator=(const ChunkStaging&) = delete;
  StatusOr<std::byte*> get();

 private:
  DeviceBackend* device_;
  std::byte* p_ = nullptr;
};

// Bytes [off, off+n) of blob `ref` of `img` (one chunk) to device address addr + off: read and
// checksum-verified (in place for a memory image), copied on lane 0 of `copier` and waited for.
Status load_chunk(const ckpt::ImageReader& img, const ckpt::pb::BlobRef& ref, uint64_t off, uint64_t n, uint64_t addr,
                  DeviceCopier& copier, ChunkStaging& staging);

// Test hook: lazy restores made from now on load buffers in parts of `bytes` (rounded up to a
// whole chunk) instead of LazyLoader::kPartBytes; 0 goes back to that. Thread-safe.
void set_lazy_part_bytes_for_test(uint64_t bytes);

// The buffers of a lazily restored client. Built by the restoring thread (add, then start) before
// the client's threads run; then the worker calls before_call (and only it: by_addr_ is the
// worker's), background threads load the rest, and any thread may call wait / stats / stop.
// Region states and the counters are guarded by mu_: a region changes state twice at most, so one
// lock for all of them is never contended for long.
class LazyLoader {
 public:
  // `who` names the client in errors and is the component of its log lines (client_component():
  // "client 65537 (job train)").
  LazyLoader(std::shared_ptr<const ckpt::ImageReader> image, DeviceBackend* device, std::string who);
  ~LazyLoader();
  LazyLoader(const LazyLoader&) = delete;
  LazyLoader& operator=(const LazyLoader&) = delete;

  // Restoring thread: a buffer at `addr` whose bytes are blob `ref` of `img` (the image or one of
  // its ancestors, all owned by the image given to the constructor).
  void add(uint64_t addr, uint64_t size, const ckpt::ImageReader* img, const ckpt::pb::BlobRef* ref);
  // Restoring thread, last: copiers from the client's backend for the worker and `threads`
  // background loaders, which start loading now (in image order) unless *hold is true.
  Status start(BackendClient& backend, size_t threads, std::atomic<bool>* hold);

  // Worker, before it executes `c`: every restored buffer an edge of `c` names is loaded first (by
  // the worker itself unless a loader has it in flight). A buffer that cannot be loaded fails the
  // call (Code::kCorrupt for a checksum mismatch; the API error is cudaErrorECCUncorrectable, or
  // CUBLAS_STATUS_EXECUTION_FAILED for cuBLAS), now and every time a later call names it. A Delete
  // edge drops the buffer (after a load in flight has finished) instead of loading it.
  Status before_call(const APIContext& c);
  // Nothing left for before_call to do: every buffer loaded or dropped, none failed and still live.
  bool worker_done() const { return worker_done_.load(std::memory_order_acquire); }

  // Any thread: waits until nothing is left to load; the error of a live buffer that could not be
  // loaded, if any. kUnavailable if stop() came first.
  Status wait();
  LazyRestoreStats stats() const;
  // Worker, at a checkpoint's cut: the live buffers no call has named yet and no loader has
  // finished (so their bytes are still exactly the image's), with the image that owns their blobs
  // (null and none once everything is loaded). A loader may finish one meanwhile: its bytes are the
  // same. Failed buffers are included (reading them from the image fails the checkpoint), or, once
  // the image is released, their error is returned: their device bytes are not theirs.
  struct Unloaded {
    uint64_t addr = 0;
    const ckpt::ImageReader* img = nullptr;
    const ckpt::pb::BlobRef* ref = nullptr;
  };
  StatusOr<std::shared_ptr<const ckpt::ImageReader>> unloaded(std::vector<Unloaded>* out) const;
  // The client is shutting down (its worker has stopped): loaders finish the buffer in hand and
  // exit; copiers and the image are released. Idempotent.
  void stop();

 private:
  enum class State : uint8_t { kPending, kLoading, kLoaded, kFailed, kDropped };
  // A large buffer loads in parts (whole chunks, kPartBytes or so each), taken one at a time by
  // any loader or the worker: a few large buffers then load on all loader threads at once, not on
  // one each (a job's first call needs its first layer whole). It is loaded once every part is.
  struct Region {
    uint64_t addr = 0, size = 0;
    const ckpt::ImageReader* img = nullptr;
    const ckpt::pb::BlobRef* ref = nullptr;
    uint64_t part_bytes = 0;        // a multiple of the blob's chunk size
    uint32_t parts = 1;
    State state = State::kPending;  // guarded by mu_
    uint32_t parts_taken = 0, parts_done = 0;  // guarded by mu_ (kLoading)
    Status error;                   // guarded by mu_ (kFailed; while loading, a part's first error)
    bool open() const { return state == State::kPending || (state == State::kLoading && parts_taken < parts); }
  };
  static constexpr uint64_t kPartBytes = 64ull << 20;

  Status load_part(const Region& r, uint32_t part, DeviceCopier& copier, ChunkStaging& staging) const;
  // mu_ held in `lk`: takes the next part of `r` (open), loads it unlocked, and settles `r` if
  // it was the last one.
  void load_next_part(Region& r, std::unique_lock<std::mutex>& lk, DeviceCopier& copier, ChunkStaging& staging,
                      bool on_demand);
  void loader_main(size_t i);
  void settle(Region& r, const Status& s, bool on_demand);  // mu_ held
  void update_done();                                       // mu_ held
  void complete();                                          // mu_ held: the last region settled

  std::shared_ptr<const ckpt::ImageReader> image_;  // guarded by mu_ once started; reset when all is loaded
  DeviceBackend* const device_;
  const std::string who_;
  std::vector<Region> regions_;                      // the vector is fixed once started
  std::unordered_map<uint64_t, size_t> by_addr_;     // worker: live restored buffers by address
  std::unique_ptr<DeviceCopier> worker_copier_;      // worker
  std::unique_ptr<ChunkStaging> worker_staging_;     // worker
  std::vector<std::unique_ptr<DeviceCopier>> copiers_;  // one per loader thread
  std::vector<std::unique_ptr<ChunkStaging>> stagings_;  // one per loader thread
  std::vector<std::thread> threads_;
  std::atomic<bool>* hold_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a region settled, or stop
  size_t next_ = 0;             // guarded by mu_: loaders' cursor into regions_
  uint64_t remaining_ = 0;      // guarded by mu_: regions pending or loading
  uint64_t failed_live_ = 0;    // guarded by mu_: failed and not dropped
  LazyRestoreStats stats_;      // guarded by mu_
  double t0_ = 0, t_done_ = 0;  // guarded by mu_
  bool stopped_ = false;        // guarded by mu_
  std::atomic<bool> stopping_{false};  // read by held loaders without the lock
  std::atomic<bool> worker_done_{false};
};

}  // namespace pos
