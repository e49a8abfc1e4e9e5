// app_vmm.h — device memory the job maps itself through the driver's virtual memory calls
// (cuMemCreate + cuMemMap + cuMemSetAccess: PyTorch's `expandable_segments`), tracked so that a
// dump can save, unmap and release it like placed memory, and a resume can create it anew and map
// it at the same addresses (docs/driver_runtime.md, "Memory the job maps itself").
//
// The job keeps the handle values cuMemCreate gave it; after a resume their memory has new handles,
// so the hooks that take a handle (cuMemMap, cuMemRelease) translate the job's value to the one
// that is live now. The job's own address reservations are the job's (they survive NVIDIA's
// checkpoint). Thread-safe (one mutex: these calls are rare).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "remoting/driver/placement.h"

namespace pos::driver {

class AppVmm {
 public:
  explicit AppVmm(const VmmCalls& calls) : calls_(calls) {}

  // The hooks, each doing the driver call itself with the job's handle translated, and recording
  // what succeeded. Same answers as the driver's.
  CUresult create(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop, unsigned long long flags);
  CUresult release(CUmemGenericAllocationHandle h);
  CUresult map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags);
  CUresult unmap(CUdeviceptr p, size_t size);
  CUresult set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count);

  struct Region {
    int dev;
    uint64_t addr, size;
    bool accessible = true;  // its access was set (else no copy may touch it yet)
  };
  // Every live mapping, by address.
  std::vector<Region> regions() const;
  // Why a dump cannot take this memory, or empty: a mapping of a handle POS did not see created
  // (imported from another process), or of memory that is not plain device memory.
  std::string blocker() const;

  // For a dump: every mapping unmapped and the physical memory released (the job's handles stay
  // known); then the bytes are the image's. remap(): the same memory created anew (same
  // properties), mapped at the same addresses with the same access, the job's handles pointing at
  // it. A failure part way can be retried.
  CUresult unmap_all();
  CUresult remap_all();

 private:
  struct Handle {
    uint64_t size = 0;
    CUmemAllocationProp prop{};
    CUmemGenericAllocationHandle live = 0;  // the driver's handle now (0 while unmapped for a dump)
    bool released = false;                  // the job released it (its mappings keep the memory)
  };
  struct Mapping {
    uint64_t size = 0, offset = 0;
    CUmemGenericAllocationHandle handle = 0;  // the job's value
    std::vector<CUmemAccessDesc> access;      // as the job last set it
    bool mapped = true;                       // false while unmapped for a dump
  };
  // The driver's handle for the job's value `h` (h itself if POS does not know it).
  CUmemGenericAllocationHandle live_of(CUmemGenericAllocationHandle h) const;
  void forget_if_unused(CUmemGenericAllocationHandle h);

  const VmmCalls calls_;
  mutable std::mutex mu_;
  std::map<CUmemGenericAllocationHandle, Handle> handles_;  // the job's value → its memory
  std::map<uint64_t, Mapping> maps_;                        // address → mapping
  bool unmapped_ = false;
  uint64_t foreign_maps_ = 0;  // live mappings of handles POS did not see created
};

}  // namespace pos::driver
