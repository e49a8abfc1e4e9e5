// driver_checkpoint.h — NVIDIA's driver checkpoint of another process (cuCheckpointProcess*: lock,
// checkpoint, restore, unlock), loaded from libcuda at run time: pos-cli's way to put an in-process
// job's remaining driver state in host memory before CRIU dumps it, and back after CRIU restores it.
#pragma once

#include <sys/types.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos::ckpt {

class DriverCheckpoint {
 public:
  // The process states the driver reports (CUprocessState).
  enum State { kRunning = 0, kLocked = 1, kCheckpointed = 2, kFailed = 3 };

  // libcuda.so.1 ($POS_REAL_LIBCUDA where set) with the checkpoint calls (driver 570 or newer),
  // initialized (cuInit: a restore needs it in the calling process). An error names what is
  // missing: no driver, or one too old.
  static StatusOr<std::unique_ptr<DriverCheckpoint>> open();
  ~DriverCheckpoint();
  DriverCheckpoint(const DriverCheckpoint&) = delete;
  DriverCheckpoint& operator=(const DriverCheckpoint&) = delete;

  // Each as the driver does it; an error names the call, the pid and the driver's error name.
  Status lock(pid_t pid, unsigned timeout_ms);
  Status checkpoint(pid_t pid);
  Status restore(pid_t pid);
  // A restore onto other GPUs of the same model (CUDA 13's gpuPairs: CUuuid bytes, old → new). The
  // driver wants every GPU the process had named, and no new GPU twice (gpu_remap_pairs builds
  // them); empty `pairs` is restore(pid). A driver without the remap answers with its error.
  struct GpuPair {
    std::array<unsigned char, 16> old_uuid, new_uuid;
  };
  Status restore(pid_t pid, const std::vector<GpuPair>& pairs);
  Status unlock(pid_t pid);
  StatusOr<State> state(pid_t pid);
  // Whatever the state, brings the process back to running (restore, unlock) as far as the
  // driver lets it: for undoing a dump that failed part way.
  Status release(pid_t pid);
  // The loaded driver (dlopen's handle), for other calls this process makes (the memory hand-off).
  void* library() const { return lib_; }

 private:
  DriverCheckpoint() = default;
  Status check(const char* call, pid_t pid, int rc) const;

  void* lib_ = nullptr;
  int (*get_error_name_)(int, const char**) = nullptr;
  int (*get_state_)(int, int*) = nullptr;
  int (*lock_)(int, void*) = nullptr;
  int (*checkpoint_)(int, void*) = nullptr;
  int (*restore_)(int, void*) = nullptr;
  int (*unlock_)(int, void*) = nullptr;
};

}  // namespace pos::ckpt
