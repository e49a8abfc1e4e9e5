// snapshot.h — an asynchronous, consistent copy of an in-process job's device memory (the GPU part
// of `pos-cli pre-dump` of a `pos run` job): at a cut, every stream's work so far is followed by
// device-to-device copies of the placed allocations into a shadow, and every stream's later work
// waits for those copies, all ordered on the device; the job's threads wait only while the copies
// are enqueued (docs/driver_runtime.md, "GPU-only checkpoints").
//
// Device-neutral like placement.h: the driver's calls come in as function pointers, so CI runs it
// against the fake driver. The shadow is shareable memory: pos-cli imports it and writes the image
// from it while the job runs on.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pos/base/status.h"
#include "remoting/driver/device_image.h"
#include "remoting/driver/placement.h"

namespace pos::driver {

struct SnapCalls {
  VmmCalls vmm;
  CopyCalls copy;  // the context calls
  CUresult (*stream_create)(CUstream* s, unsigned int flags) = nullptr;
  CUresult (*stream_destroy)(CUstream s) = nullptr;
  CUresult (*event_create)(CUevent* e, unsigned int flags) = nullptr;
  CUresult (*event_destroy)(CUevent e) = nullptr;
  CUresult (*event_record)(CUevent e, CUstream s) = nullptr;
  CUresult (*event_synchronize)(CUevent e) = nullptr;
  CUresult (*stream_wait_event)(CUstream s, CUevent e, unsigned int flags) = nullptr;
  CUresult (*dtod_async)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) = nullptr;
  // cuStreamIsCapturing (optional): a cut must not touch a stream that is capturing a CUDA graph.
  CUresult (*is_capturing)(CUstream s, int* status) = nullptr;
  bool complete() const {
    return vmm.complete() && vmm.export_fd && copy.primary_ctx_retain && copy.primary_ctx_release &&
           copy.ctx_set_current && stream_create && stream_destroy && event_create && event_destroy && event_record &&
           event_synchronize && stream_wait_event && dtod_async;
  }
};

// The streams the job made (cuStreamCreate*), so that a cut orders itself after each one's work.
// The legacy default stream is always part of a cut and is not listed. Thread-safe.
class StreamSet {
 public:
  void add(CUstream s);
  void remove(CUstream s);
  std::vector<CUstream> list() const;

 private:
  mutable std::mutex mu_;
  std::unordered_set<CUstream> set_;
};

// Shareable device memory mapped in this process (cuMemCreate with a POSIX-descriptor handle,
// reserved and mapped at an address the driver picks). Released on destruction.
class DeviceShadow {
 public:
  // At least `bytes` on device `dev` (rounded up to its granularity); the context must be current.
  static StatusOr<std::unique_ptr<DeviceShadow>> create(const VmmCalls& calls, int dev, uint64_t bytes);
  ~DeviceShadow();
  DeviceShadow(const DeviceShadow&) = delete;
  DeviceShadow& operator=(const DeviceShadow&) = delete;
  uint64_t base() const { return base_; }
  uint64_t size() const { return size_; }
  // A new descriptor of the memory (the caller owns it); -1 and the driver's error otherwise.
  CUresult export_fd(int* fd) const;

 private:
  DeviceShadow(const VmmCalls& calls) : calls_(calls) {}
  const VmmCalls calls_;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr base_ = 0;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

// The device-side order of a cut, enqueued (nothing waits here): an event recorded on the legacy
// default stream and on each of `streams`; `copy_stream` waits for all of them, copies region i to
// shadow_base + the sum of the sizes before it (allocations back to back are one copy), and records
// `done`; then every stream (the legacy one included) waits for `done`, so that nothing the job
// enqueues later runs before the copies.
// The caller holds the job at its gate, with the context current. On an error part way, what was
// enqueued stays enqueued (harmless: copies into the shadow, waits that end) and the error is
// returned.
// Whether any of `streams` is capturing a CUDA graph now (a capture started before the job was
// held): the cut must wait, since its waits on such a stream would join the capture. Unknown (the
// driver lacks cuStreamIsCapturing, or it fails) counts as capturing.
bool any_capturing(const SnapCalls& calls, const std::vector<CUstream>& streams);

CUresult enqueue_cut(const SnapCalls& calls, CUstream copy_stream, const std::vector<CUstream>& streams,
                     const std::vector<Placement::Region>& regions, uint64_t shadow_base, CUevent done);

// The per-thread default stream's handle (CU_STREAM_PER_THREAD): what a _ptsz call's null stream is.
inline const CUstream kPerThreadStream = reinterpret_cast<CUstream>(uintptr_t{2});
// Where cuLaunchKernelEx's CUlaunchConfig keeps its stream: after seven unsigned ints (grid, block,
// shared memory), pointer-aligned (checked against cuda.h in driver_abi_test).
inline constexpr size_t kLaunchConfigStreamOffset = 32;

// A cut whose copies run ahead of the job (docs/driver_runtime.md, "GPU-only checkpoints"): ordered
// after every stream's work at the cut, as enqueue_cut orders them, but the job's streams do not
// wait for all of them. Instead, before the job's later work that may touch a region (a launch whose
// parameters name it, a copy or memset into it: the hooks of "Written memory"), that work's stream
// waits for the copy of that region only, so the job stalls only where it overtakes the copies. The
// regions are copied in the order the job is expected to touch them next (Placement::Region::order:
// the order its previous step first touched them in), so the copies tend to stay ahead of it.
// They go in at most kBatches batches, each followed by an event a stream can wait for.
// Work the hooks cannot see into (a launch whose parameters cannot be read, a graph) waits for all.
// The hooks do not see memory the job maps itself: a cut with such memory uses enqueue_cut.
// Not thread-safe: the caller serializes its calls (interpose.cc holds a mutex).
class CopyAhead {
 public:
  static constexpr size_t kBatches = 64;
  // Its events made, ahead of the cut (outside the job's hold); the context must be current.
  static StatusOr<std::unique_ptr<CopyAhead>> create(const SnapCalls& calls);
  // Destroys the events; work still waiting for one keeps what it needs (the driver's rule).
  ~CopyAhead();
  CopyAhead(const CopyAhead&) = delete;
  CopyAhead& operator=(const CopyAhead&) = delete;

  // Under the job's hold, the context current: the events on every stream, the copies of
  // `regions` (by address, into shadow_base + the sizes of the regions before each) in copy_order,
  // an event after each batch, and `done` after the last. Nothing the job enqueues later waits yet.
  // On an error part way, what was enqueued stays enqueued and the error is returned: the caller
  // then orders every stream after `done` (order_all), as enqueue_cut would have.
  CUresult enqueue(CUstream copy_stream, const std::vector<CUstream>& streams,
                   const std::vector<Placement::Region>& regions, uint64_t shadow_base, CUevent done);
  // Before work on stream `s` (kPerThreadStream for this thread's) that may touch the memory at
  // these addresses: `s` waits for the batches that copy it, unless it has waited for them already.
  // Addresses outside the cut's regions need no wait.
  CUresult before_touch(CUstream s, const uint64_t* addrs, size_t n);
  // Likewise for every region overlapping [addr, addr + len).
  CUresult before_range(CUstream s, uint64_t addr, uint64_t len);
  // Before work on `s` that may touch anything: it waits for every copy.
  CUresult before_all(CUstream s);
  // The waits the job's streams were given so far, and the batches the copies went in.
  uint64_t waits() const { return waits_; }
  size_t batches() const { return used_; }

  // The order the copies go in, as positions in `regions`: by Region::order, then by address.
  static std::vector<size_t> copy_order(const std::vector<Placement::Region>& regions);

 private:
  explicit CopyAhead(const SnapCalls& calls) : calls_(calls) {}
  CUresult wait_for(CUstream s, int batch);
  int batch_of(uint64_t addr) const;  // -1: in no region of the cut

  const SnapCalls calls_;
  std::vector<CUevent> events_;             // kBatches, made by create()
  size_t used_ = 0;                         // batches recorded
  std::vector<uint64_t> begin_, end_;       // the cut's regions, by address
  std::vector<int> batch_;                  // per region: the batch that copies it
  // Per stream (and, for the per-thread stream, per thread): the last batch it waits for.
  std::map<std::pair<CUstream, std::thread::id>, int> waited_;
  uint64_t waits_ = 0;
};

}  // namespace pos::driver
