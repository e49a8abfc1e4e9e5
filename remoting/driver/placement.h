// placement.h — device memory of an in-process job at addresses POS chooses: each device's
// allocations live in one fixed virtual range (cuMemAddressReserve at a known base), backed by
// cuMemCreate + cuMemMap + cuMemSetAccess, so that a restore can put every buffer back at the
// address it had (docs/driver_runtime.md, "Placement").
//
// Device-neutral: the driver's VMM calls come in as function pointers, so tests drive it against a
// fake driver. Thread-safe (one mutex: allocations are rare, PyTorch caches them).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "remoting/driver/driver_api.h"

namespace pos::driver {

// The driver's ABI for the VMM calls (CUDA 13.0 cuda.h; checked against it in driver_abi_test).
struct CUmemLocation {
  int type;  // CUmemLocationType: 1 = device
  int id;
};
struct CUmemAllocationProp {
  int type;                  // CUmemAllocationType: 1 = pinned
  int requestedHandleTypes;  // CUmemAllocationHandleType: 0 = none
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CUmemAccess_flags: 3 = read-write
};

struct VmmCalls {
  CUresult (*ctx_get_device)(CUdevice* dev) = nullptr;
  CUresult (*reserve)(CUdeviceptr* p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) = nullptr;
  CUresult (*address_free)(CUdeviceptr p, size_t size) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle h) = nullptr;
  CUresult (*map)(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) = nullptr;
  CUresult (*unmap)(CUdeviceptr p, size_t size) = nullptr;
  CUresult (*set_access)(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) = nullptr;
  CUresult (*granularity)(size_t* g, const CUmemAllocationProp* prop, int option) = nullptr;
  CUresult (*synchronize)() = nullptr;  // cuCtxSynchronize: a free waits for the device, as cuMemFree does
  // For the dump's hand-off (optional: without them a dump copies): cuMemExportToShareableHandle
  // and cuMemImportFromShareableHandle with POSIX file descriptors.
  CUresult (*export_fd)(void* fd_out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) = nullptr;
  CUresult (*import_fd)(CUmemGenericAllocationHandle* h, void* fd, int type) = nullptr;
  bool complete() const {
    return ctx_get_device && reserve && address_free && create && release && map && unmap && set_access &&
           granularity && synchronize;
  }
};

class Placement {
 public:
  // Device d's range is [base + d * span, + span); at most kMaxDevices devices.
  static constexpr int kMaxDevices = 16;
  Placement(const VmmCalls& calls, uint64_t base, uint64_t span);

  // An allocation of `bytes` on the current context's device, at the lowest free address of its
  // range (rounded up to the device's granularity). *placed false: placement is off for that
  // device (its range could not be reserved where it must be, or the driver lacks a call) and the
  // caller allocates through the driver as usual; the reason is in stats().error.
  CUresult alloc(CUdeviceptr* out, size_t bytes, bool* placed);
  // Frees `p` if it was placed here (*ours true; its range is reused); else leaves it to the caller.
  CUresult free(CUdeviceptr p, bool* ours);

  // A live placed allocation: its device, address and (granule-rounded) size.
  struct Region {
    int dev;
    uint64_t addr, size;
    bool written = false;  // written since the last cut() (cut() only)
    // (cut() only) How soon the job is expected to touch it again, relative to the others: lower
    // sooner (snapshot.h, CopyAhead copies in this order). See new_epoch().
    uint64_t order = 0;
  };
  // Every live allocation, by address.
  std::vector<Region> regions() const;

  // Written memory (docs/driver_runtime.md, "Written memory"): the hooks mark the allocations the
  // job's launches, copies and memsets may write; a cut takes the marks. A new allocation counts as
  // written. in_window() is the lock-free first filter of the launch hooks: whether `v` lies in
  // POS's address ranges at all.
  bool in_window(uint64_t v) const { return v - base_ < span_ * kMaxDevices; }
  // The allocation holding each address (of `n`) marked written; addresses outside every
  // allocation are ignored.
  void mark_written(const uint64_t* addrs, size_t n);
  // Every allocation overlapping [addr, addr + len) marked written.
  void mark_range_written(uint64_t addr, uint64_t len);
  // Every live allocation marked written (a launch whose parameters could not be read).
  void mark_all_written();
  // Every live allocation, by address, with its mark; the marks cleared. The caller holds the job
  // at its gate, so that no launch falls between the marks read and the cut.
  std::vector<Region> cut();
  // The job's synchronizing calls (a stream's, an event's or the context's synchronize, a
  // synchronous copy to the host) divide its work into epochs: a training job's steps, typically,
  // each ending where it reads its loss. Each allocation remembers when the job first touched it
  // in the latest epoch that touched it, and in the one before. A cut orders the allocations the
  // current epoch has not touched yet by that first touch (the job's previous step touched them in
  // that order: its next step will too), then the ones it has, by their first touch the epoch
  // before (Region::order). Lock-free: called by the synchronizing hooks.
  void new_epoch() { epoch_.fetch_add(1, std::memory_order_relaxed); }

  // For a full dump (docs/driver_runtime.md, "Dump"): the physical memory behind every live
  // allocation unmapped and released, its address range kept reserved, so that the driver's own
  // checkpoint has no device memory left to copy. The caller has stopped the job's work and saved
  // the bytes. Allocation and free fail with an error while unmapped. A failure part way leaves
  // what was unmapped unmapped: remap() maps all of it again.
  CUresult unmap();
  // New physical memory mapped at every live allocation's address (contents undefined: the caller
  // loads them). Idempotent per allocation; a failure part way can be retried.
  CUresult remap();

  // The hand-off (docs/driver_runtime.md, "Dump and restore"): device memory leaves the job as file
  // descriptors another process imports, so that neither the job nor the driver's checkpoint copies
  // it. Empty, or why it cannot be done now (an allocation made without a shareable handle, or
  // the driver lacks the calls): then a dump copies.
  std::string share_blocker() const;
  // A descriptor of every live allocation's memory, in regions() order (exported now, or a copy
  // of the one kept since it came back): the caller owns them. Nothing changes in here; unmap()
  // follows once the receiver holds them. On an error every descriptor made is closed.
  CUresult share(std::vector<int>* fds);
  // After unmap(): the memory that left comes back, `fds[i]` for regions()[i], imported and mapped
  // at its address with read-write access; each descriptor is kept (an imported allocation cannot
  // be exported again, so the next hand-off sends it). The count must match. A failure part way
  // leaves what was mapped mapped, and can be retried with the same descriptors.
  CUresult take(const std::vector<int>& fds);

  struct Stats {
    uint64_t placed = 0, freed = 0, live = 0, live_bytes = 0, peak_bytes = 0;
    std::vector<int> devices;  // devices with a reserved range
    std::string error;         // why placement is off for a device, if it is
  };
  Stats stats() const;
  // stats() as one JSON object (for the census).
  std::string json() const;

 private:
  struct Range {
    bool tried = false, ok = false;
    uint64_t base = 0, granule = 0;
    std::map<uint64_t, uint64_t> free;  // start → length, coalesced
  };
  struct Block {
    int dev;
    uint64_t size;  // rounded to the granule
    CUmemGenericAllocationHandle handle;  // 0 while unmapped
    bool shareable = false;  // made with a POSIX-descriptor handle type (or imported from one)
    int fd = -1;             // the descriptor it was imported from, kept for the next hand-off
    bool written = true;     // since the last cut()
    // The epoch that last touched it, the mark count of its first touch in that epoch, and of its
    // first touch in the epoch that touched it before (0: none).
    uint64_t epoch = 0, first = 0, prev_first = 0;
  };
  void touch(Block& b, uint64_t now, uint64_t epoch);  // under mu_
  CUresult map_block(uint64_t at, Block* b);  // under mu_: create, map, set access
  bool ready(int dev);  // under mu_: the device's range reserved (tries once)
  static uint64_t take(Range& r, uint64_t size);  // first fit; 0 when full
  static void give(Range& r, uint64_t addr, uint64_t size);

  const VmmCalls calls_;
  const uint64_t base_, span_;
  mutable std::mutex mu_;
  Range ranges_[kMaxDevices];     // under mu_
  std::map<uint64_t, Block> live_;  // under mu_: address → block
  Stats stats_;                     // under mu_
  bool unmapped_ = false;           // under mu_: unmap() ran and remap() has not finished
  uint64_t marks_ = 0;              // under mu_: marks so far (Block::first)
  std::atomic<uint64_t> epoch_{1};  // new_epoch()
};

}  // namespace pos::driver
