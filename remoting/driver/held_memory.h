// held_memory.h — pos-cli's side of an in-process job's device-memory hand-off: the job's memory,
// imported from the descriptors the job sent (a dump), or made anew here and loaded from an image (a
// restore), mapped in this process so the image can be written from it or loaded into it, and
// handed back as descriptors (docs/driver_runtime.md, "Dump and restore").
//
// Device-neutral like device_image.h: the driver's calls come in as function pointers (peer_calls()
// looks them up in a loaded libcuda), so CI runs it against the fake driver.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "remoting/common/unique_fd.h"
#include "remoting/driver/device_image.h"
#include "remoting/driver/placement.h"

namespace pos::driver {

struct PeerCalls {
  VmmCalls vmm;
  CopyCalls copy;
  CUresult (*dtod)(CUdeviceptr dst, CUdeviceptr src, size_t n) = nullptr;  // cuMemcpyDtoD_v2: the shadow (optional)
  bool complete() const { return vmm.complete() && vmm.export_fd && vmm.import_fd && copy.complete(); }
};
// The calls from a loaded driver library (dlopen's handle).
PeerCalls peer_calls(void* driver);

// The checksum both ends of a hand-off compute over the allocation list ("dev:addr:size," each, in
// order, CRC-32C), so that descriptors go back only to the allocations they came from.
uint32_t allocation_list_checksum(const std::vector<SavedRegion>& regions);

class HeldMemory {
 public:
  // Device `dev`'s primary context retained for this process (the costly part, done before the
  // job is stopped). kUnsupported when the driver lacks a call the hand-off needs.
  static StatusOr<std::unique_ptr<HeldMemory>> open(const PeerCalls& calls, int dev);
  ~HeldMemory();
  HeldMemory(const HeldMemory&) = delete;
  HeldMemory& operator=(const HeldMemory&) = delete;

  // The job's memory: `fds[i]` (kept) for regions[i], imported and mapped here.
  Status import(const std::vector<SavedRegion>& regions, std::vector<UniqueFd> fds);
  // A GPU-only checkpoint's copy (the job's snap-cut): one shareable allocation of `shadow_bytes`
  // holding `regions` back to back, in order, imported from `fd` and mapped here; save() then
  // writes the image from it. The regions must fit in it.
  Status import_copy(const std::vector<SavedRegion>& regions, UniqueFd fd, uint64_t shadow_bytes);
  // New shareable memory for `regions`, mapped here (contents undefined until loaded).
  Status create(const std::vector<SavedRegion>& regions);
  // The image's device part written from the memory held (save_regions: all of it but
  // options.inherited, which the table names as inherited), or loaded into it (load_regions: the
  // image's table must name exactly the regions held; inherited ones come from options.parents).
  StatusOr<CopyReport> save(const std::string& dir, CopyOptions options) const;
  StatusOr<CopyReport> load(const std::string& dir, CopyOptions options) const;
  // A device-side copy of the memory held, so that the memory itself can go back to the job before
  // the image is written from the copy (a --leave-running dump: the job runs while it is written).
  // reserve_shadow() makes room for `bytes` ahead of time (kOutOfMemory when the device has not got
  // it: then there is no shadow); snapshot() copies every region into it (device to device), after
  // which save() reads the shadow. kFailedPrecondition when the shadow is missing or too small.
  Status reserve_shadow(uint64_t bytes);
  Status snapshot();
  bool snapshotted() const { return snapped_; }
  // The bytes of `src` (the same regions, held on another device of this process) copied into the
  // memory held here, device to device: `src`'s mappings are opened to this device first (peer
  // access over NVLink or PCIe; kUnavailable naming the call when the driver refuses). Moves a
  // job's memory to another GPU (pos-cli migrate --device).
  Status copy_from(const HeldMemory& src);
  int device() const { return dev_; }
  // Descriptors of the memory held, in region order, for the job (dump-take); this keeps its own.
  StatusOr<std::vector<UniqueFd>> descriptors() const;
  // Kept descriptors, for a guardian that must be able to hand them back if this process dies.
  std::vector<int> raw_fds() const;
  const std::vector<SavedRegion>& regions() const { return regions_; }
  uint64_t bytes() const;

 private:
  HeldMemory(const PeerCalls& calls, int dev) : calls_(calls), dev_(dev) {}
  Status map_all(const std::vector<CUmemGenericAllocationHandle>& handles);  // at base_ onwards
  CopyOptions with_addresses(CopyOptions o) const;
  // shadow_ (made or imported) reserved, mapped with read-write access; `g` the granularity.
  Status map_shadow(uint64_t size, size_t g);

  const PeerCalls calls_;
  const int dev_;
  CUcontext ctx_ = nullptr;
  std::vector<SavedRegion> regions_;
  std::vector<uint64_t> at_;  // where region i is mapped here
  std::vector<CUmemGenericAllocationHandle> handles_;
  std::vector<UniqueFd> fds_;
  CUdeviceptr base_ = 0;
  uint64_t span_ = 0;
  size_t mapped_ = 0;
  CUmemGenericAllocationHandle shadow_ = 0;
  CUdeviceptr shadow_base_ = 0;
  uint64_t shadow_size_ = 0;  // mapped at shadow_base_ when non-zero
  bool snapped_ = false;
  bool copy_only_ = false;  // import_copy(): regions_ live in the shadow's one mapping
};

}  // namespace pos::driver
