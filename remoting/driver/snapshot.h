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
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
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

}  // namespace pos::driver
