// usage_region.h — the shared region where the jobs of one user on this machine say what they hold
// of the GPUs and under which limits (issue #24): one accounting that every job, pos-cli and later
// the GPU-time scheduler read, and that forgets a process the moment it is gone (kill -9 included).
//
// A small file (JOBS_DIR/usage, 0600, the user's own) mapped shared by every process: a header and
// 256 fixed slots, a robust process-shared mutex for joining and leaving, lock-free stores for usage.
// Format: docs/limits.md ("The usage region"). Base layer only, so the preloaded driver layer can
// carry it. Every field read from the file is checked: a foreign or malformed file is an error the
// caller reports, never a crash, and the job runs on without it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos {

class UsageRegion {
 public:
  static constexpr uint64_t kMagic = 0x4547415355534f50ull;  // "POSUSAGE" little-endian
  static constexpr uint32_t kVersion = 1;
  static constexpr uint32_t kSlots = 256;

  // What one process holds, as it says it.
  struct Entry {
    uint32_t pid = 0;
    int32_t device = -1;          // the CUDA device it uses (-1: none yet)
    uint64_t start_time = 0;      // /proc/PID/stat's: tells it from a later process under its pid
    uint64_t memory_limit = 0;    // 0: none
    uint64_t memory_used = 0;
  };

  // Opens the region at `path`, creating it (0600) when there is none. Refused: a file of another
  // user, of another size, or whose header is not this format's (named in the error).
  static StatusOr<std::unique_ptr<UsageRegion>> open(const std::string& path);
  ~UsageRegion();
  UsageRegion(const UsageRegion&) = delete;
  UsageRegion& operator=(const UsageRegion&) = delete;

  // A slot for `e` (its pid and start time must be set), claimed under the lock after the slots of
  // processes that are gone are freed. kBusy when all slots hold live processes.
  StatusOr<int> join(const Entry& e);
  // Whether `slot` still names `pid` started at `start_time` (another process may have freed it,
  // seeing that pid gone: a job restored by CRIU comes back with a new start time).
  bool holds(int slot, uint32_t pid, uint64_t start_time) const;
  // Lock-free updates of the caller's own slot.
  void set_used(int slot, uint64_t bytes);
  void set_limit(int slot, uint64_t bytes);
  void set_device(int slot, int32_t device);
  // The slot freed (the process ends).
  void leave(int slot);

  // Every live process's entry, by slot; the slots of processes that are gone are freed first.
  std::vector<Entry> list();
  // Frees the slots of processes that are gone; how many.
  size_t reap();

  const std::string& path() const { return path_; }

 private:
  struct Mapped;
  UsageRegion(std::string path, Mapped* m) : path_(std::move(path)), m_(m) {}
  bool lock();  // false when the mutex cannot be taken (then nothing is written)
  void unlock();
  size_t reap_locked();

  std::string path_;
  Mapped* m_;
};

// JOBS_DIR/usage: where the jobs of `jobs_dir` keep their region.
std::string usage_region_path(const std::string& jobs_dir);

}  // namespace pos
