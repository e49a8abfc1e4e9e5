// device_image.h — the device memory of an in-process job on disk: POS's placed allocations saved
// to DIR/memory.<i>.bin with a checked region table (DIR/regions), and loaded back at their addresses.
// The GPU part of a `pos-cli dump` of a `pos run` job (docs/image_format.md, "Driver memory image").
//
// Device-neutral: the driver's copy calls come in as function pointers, so CI tests it against a
// fake driver whose "device memory" is host memory. Copies go through page-locked staging buffers,
// several threads each with its own stream, and are checksummed per chunk (CRC-32C).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ckpt/region_table.h"
#include "pos/base/status.h"
#include "remoting/common/unique_fd.h"
#include "remoting/driver/driver_api.h"

namespace pos::driver {

using ckpt::ChunkPlace;
using ckpt::chunk_places;
using ckpt::file_sizes;
using ckpt::memory_file_name;
using ckpt::RegionTable;
using ckpt::SavedRegion;
using ckpt::parse_region_table;
using ckpt::read_region_table;
using ckpt::region_table_text;

struct CopyCalls {
  CUresult (*primary_ctx_retain)(CUcontext* ctx, CUdevice dev) = nullptr;
  CUresult (*primary_ctx_release)(CUdevice dev) = nullptr;
  CUresult (*ctx_set_current)(CUcontext ctx) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*stream_create)(CUstream* s, unsigned int flags) = nullptr;
  CUresult (*stream_destroy)(CUstream s) = nullptr;
  CUresult (*stream_synchronize)(CUstream s) = nullptr;
  CUresult (*host_alloc)(void** p, size_t bytes, unsigned int flags) = nullptr;
  CUresult (*free_host)(void* p) = nullptr;
  CUresult (*dtoh_async)(void* dst, CUdeviceptr src, size_t n, CUstream s) = nullptr;
  CUresult (*htod_async)(CUdeviceptr dst, const void* src, size_t n, CUstream s) = nullptr;
  bool complete() const {
    return primary_ctx_retain && primary_ctx_release && ctx_set_current && ctx_synchronize && stream_create &&
           stream_destroy && stream_synchronize && host_alloc && free_host && dtoh_async && htod_async;
  }
};

struct CopyOptions {
  int threads = 16;               // copy threads (and memory files), each with a stream and two staging buffers
  // The copy threads' nice value (each thread's own, setpriority): a checkpoint written while the
  // job runs on yields the CPU to it. 0: unchanged. Measured on the H200 (docs/BENCHMARKS.md): with
  // 19, a 12 GB write beside a PyTorch job took as long and slowed 1-3 of its ~75 steps over 1.2x
  // the median instead of 3-14.
  int nice = 0;
  // The copy threads under SCHED_IDLE (Linux): they run only on a CPU nothing else wants, a step
  // below nice 19. For a copy written while the job runs on.
  bool idle = false;
  uint64_t chunk = 8ull << 20;    // copy and checksum unit
  // save_regions: a chunk is checksummed and written in pieces of this many bytes (a multiple of
  // 4096 dividing `chunk`; 0: whole), each written while it is still in the CPU's cache, so that the
  // host reads each byte from memory once, not twice. A chunk later found unchanged
  // (`unchanged`) has its written bytes punched out of the file again.
  uint64_t piece = 0;
  // Bytes done so far of the total, from the copy threads (serialized), at most every chunk.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Where a region's bytes are in this process: its address in the table (the job's) → the one
  // to copy at (pos-cli maps a job's memory elsewhere). Unset: the same address.
  std::function<uint64_t(uint64_t region_addr)> address;
  // save_regions: allocations the image names without holding their bytes (an incremental image:
  // unchanged since the previous one). load_regions: the previous images' directories, nearest
  // first, where inherited allocations are looked for.
  std::vector<SavedRegion> inherited;
  std::vector<std::string> parents;
  // save_regions: whether chunk `index` of the region at `addr` (of `size` bytes), whose bytes are
  // `bytes` (n of them, checksum `crc`), is byte for byte in the previous images too; then it is
  // left there (marked `same`; its place in the memory file stays a hole). Unset: every chunk
  // stored. PreviousChunks::unchanged is the one pos-cli uses.
  std::function<bool(uint64_t addr, uint64_t size, size_t index, uint32_t crc, const void* bytes, uint64_t n)> unchanged;
};

// The chunks of a chain of previous images (nearest first), for an incremental image's writer: a
// chunk is left to them only when one of them stores the same bytes (checksum first, then every
// byte compared: a checksum alone could collide). Thread-safe after open().
class PreviousChunks {
 public:
  // The images' tables and memory files opened; an empty chain holds nothing.
  static StatusOr<PreviousChunks> open(const std::vector<std::string>& dirs);
  bool unchanged(uint64_t addr, uint64_t size, size_t index, uint32_t crc, const void* bytes, uint64_t n) const;
  size_t chunks() const { return where_.size(); }

 private:
  struct Place {
    size_t image;
    uint32_t file;
    uint64_t off, n;
    uint32_t crc;
  };
  struct Key {
    uint64_t addr, size;
    size_t index;
    bool operator<(const Key& o) const {
      return addr != o.addr ? addr < o.addr : size != o.size ? size < o.size : index < o.index;
    }
  };
  std::map<Key, Place> where_;              // the nearest image storing each chunk
  std::vector<std::vector<UniqueFd>> fds_;  // per image, per memory file
};

struct CopyReport {
  uint64_t bytes = 0, regions = 0;
  uint64_t same_bytes = 0;  // save_regions: of `bytes`, left to the previous image (CopyOptions::unchanged)
  double seconds = 0;
};

// Saves the bytes of `regions` (device `dev`'s, whose primary context is made current on the copy
// threads) into DIR/memory.<i>.bin (one per thread) and then DIR/regions (written last, atomically: a table names only
// bytes that are on disk in the page cache). DIR must exist and hold neither. The device must be idle
// (the caller stopped and synchronized the job's work). Not fsynced: pos-cli makes the files
// durable once the job runs again.
StatusOr<CopyReport> save_regions(const CopyCalls& calls, int dev, const std::vector<SavedRegion>& regions,
                                  const std::string& dir, const CopyOptions& options);

// Loads DIR's bytes back to the addresses its table names, every chunk's checksum verified before
// it is copied. `expected` (the allocations the job has now) must match the table's allocations
// exactly (stored and inherited): same addresses and sizes. An inherited allocation is loaded from
// the nearest of options.parents that stores it (one that neither stores nor inherits it is kCorrupt).
StatusOr<CopyReport> load_regions(const CopyCalls& calls, int dev, const std::vector<SavedRegion>& expected,
                                  const std::string& dir, const CopyOptions& options);

// Removes what save_regions writes in DIR (a dump undone).
void remove_saved(const std::string& dir);

}  // namespace pos::driver
