// driver_checkpoint.cc — the cuCheckpointProcess* calls through dlopen: pos-cli needs no CUDA
// toolkit to build and runs on hosts without a driver (it then says so when asked to use one).
#include "ckpt/driver_checkpoint.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pos::ckpt {

namespace {
// The argument structs of CUDA 13.0's cuda.h, all 64 bytes; zeroed means "no options".
struct LockArgs {
  unsigned timeout_ms;
  unsigned reserved0;
  uint64_t reserved1[7];
};
struct Reserved64 {
  uint64_t reserved[8];
};
// CUcheckpointRestoreArgs: the pairs, their count, the rest reserved (zeroed).
struct RestoreArgs {
  const void* gpu_pairs;
  unsigned gpu_pairs_count;
  char reserved[52 - sizeof(void*)];
  uint64_t reserved1;
};
static_assert(sizeof(LockArgs) == 64 && sizeof(Reserved64) == 64 && sizeof(RestoreArgs) == 64);
static_assert(sizeof(DriverCheckpoint::GpuPair) == 32);  // CUcheckpointGpuPair: two CUuuid
}  // namespace

StatusOr<std::unique_ptr<DriverCheckpoint>> DriverCheckpoint::open() {
  const char* env = std::getenv("POS_REAL_LIBCUDA");
  const std::string path = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  std::unique_ptr<DriverCheckpoint> d(new DriverCheckpoint);
  d->lib_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (d->lib_ == nullptr) {
    const char* e = ::dlerror();
    return Status::Unavailable("no CUDA driver to checkpoint the job's driver state with (" +
                               std::string(e != nullptr ? e : path) + ")");
  }
  const auto get = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(::dlsym(d->lib_, name));
    return *fn != nullptr;
  };
  int (*init)(unsigned) = nullptr;
  if (!get(&init, "cuInit") || !get(&d->get_error_name_, "cuGetErrorName"))
    return Status::Unavailable(path + " is no CUDA driver (no cuInit)");
  if (!get(&d->get_state_, "cuCheckpointProcessGetState") || !get(&d->lock_, "cuCheckpointProcessLock") ||
      !get(&d->checkpoint_, "cuCheckpointProcessCheckpoint") || !get(&d->restore_, "cuCheckpointProcessRestore") ||
      !get(&d->unlock_, "cuCheckpointProcessUnlock"))
    return Status::Unsupported("this CUDA driver has no process checkpoint calls (cuCheckpointProcessLock: driver 570 "
                               "or newer)");
  if (const int rc = init(0); rc != 0) return d->check("cuInit", 0, rc);
  return d;
}

DriverCheckpoint::~DriverCheckpoint() {
  // The driver stays loaded: unloading libcuda from a process that initialized it is not supported.
}

Status DriverCheckpoint::check(const char* call, pid_t pid, int rc) const {
  if (rc == 0) return Status::Ok();
  const char* name = nullptr;
  if (get_error_name_ == nullptr || get_error_name_(rc, &name) != 0 || name == nullptr) name = "unknown error";
  return Status::Unavailable(std::string(call) + " of pid " + std::to_string(pid) + " failed: " + name + " (" +
                             std::to_string(rc) + ")");
}

Status DriverCheckpoint::lock(pid_t pid, unsigned timeout_ms) {
  LockArgs a{};
  a.timeout_ms = timeout_ms;
  return check("cuCheckpointProcessLock", pid, lock_(pid, &a));
}

Status DriverCheckpoint::checkpoint(pid_t pid) {
  Reserved64 a{};
  return check("cuCheckpointProcessCheckpoint", pid, checkpoint_(pid, &a));
}

Status DriverCheckpoint::restore(pid_t pid) { return restore(pid, {}); }

Status DriverCheckpoint::restore(pid_t pid, const std::vector<GpuPair>& pairs) {
  RestoreArgs a{};  // no GPU pairs: the same devices
  if (!pairs.empty()) {
    a.gpu_pairs = pairs.data();
    a.gpu_pairs_count = static_cast<unsigned>(pairs.size());
  }
  return check("cuCheckpointProcessRestore", pid, restore_(pid, &a));
}

Status DriverCheckpoint::unlock(pid_t pid) {
  Reserved64 a{};
  return check("cuCheckpointProcessUnlock", pid, unlock_(pid, &a));
}

StatusOr<DriverCheckpoint::State> DriverCheckpoint::state(pid_t pid) {
  int s = 0;
  POS_RETURN_IF_ERROR(check("cuCheckpointProcessGetState", pid, get_state_(pid, &s)));
  if (s < kRunning || s > kFailed) return Status::Corrupt("the driver reports an unknown process state " + std::to_string(s));
  return static_cast<State>(s);
}

Status DriverCheckpoint::release(pid_t pid) {
  auto s = state(pid);
  if (!s.ok()) return s.status();
  if (*s == kCheckpointed) {
    POS_RETURN_IF_ERROR(restore(pid));
    *s = kLocked;
  }
  if (*s == kLocked) return unlock(pid);
  if (*s == kFailed) return Status::Unavailable("the driver reports pid " + std::to_string(pid) + " FAILED");
  return Status::Ok();
}

}  // namespace pos::ckpt
