// lazy_load.h — an in-process job's side of a lazy restore (`pos-cli restore --lazy`): the job runs
// again before its device memory is loaded, and its GPU work waits, on the device, until it is.
//
// pos-cli hands the job its memory (empty, still loading) together with one page of shared memory,
// the flag. The job registers the page with the driver and enqueues on every stream it has (and on
// each one it makes before the load ends) a wait for the flag: its CPU side runs on at once, every
// kernel, copy and memset it enqueues runs after pos-cli's copies, which end with pos-cli setting
// the flag. The ordering is the device's own (stream order), so it does not depend on seeing which
// buffers a kernel reads (docs/driver_runtime.md, "Lazy restore"). Device-neutral: the driver's calls
// come in as function pointers, so CI runs it against the fake driver.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "pos/base/status.h"
#include "remoting/common/unique_fd.h"
#include "remoting/driver/driver_api.h"

namespace pos::driver {

struct LazyCalls {
  CUresult (*host_register)(void* p, size_t bytes, unsigned int flags) = nullptr;              // cuMemHostRegister_v2
  CUresult (*host_device_pointer)(CUdeviceptr* d, void* p, unsigned int flags) = nullptr;      // cuMemHostGetDevicePointer_v2
  CUresult (*host_unregister)(void* p) = nullptr;                                              // cuMemHostUnregister
  CUresult (*wait_value32)(CUstream s, CUdeviceptr addr, uint32_t value, unsigned int flags) = nullptr;  // cuStreamWaitValue32_v2
  bool complete() const { return host_register && host_device_pointer && host_unregister && wait_value32; }
};

// The flag page's size, and the value that says "loaded": both ends use these.
inline constexpr size_t kLazyFlagBytes = 4096;
inline constexpr uint32_t kLazyLoaded = 1;

// pos-cli's end: the page, made and mapped here, sent to the job as a descriptor.
class LazyFlag {
 public:
  static StatusOr<std::unique_ptr<LazyFlag>> make();
  ~LazyFlag();
  LazyFlag(const LazyFlag&) = delete;
  LazyFlag& operator=(const LazyFlag&) = delete;
  int fd() const { return fd_.get(); }
  // Called only once every copy of the load has completed (the device holds the bytes).
  void set();

 private:
  LazyFlag() = default;
  UniqueFd fd_;
  std::atomic<uint32_t>* word_ = nullptr;
};

// The job's end. Not thread-safe: the caller serializes hold() and the destructor.
class LazyLoad {
 public:
  // Maps the page `fd` (kLazyFlagBytes of shared memory) and registers it with the driver (the
  // caller has the job's context current). kFailedPrecondition with the reason when it cannot: the
  // caller then takes the memory only once it is loaded.
  static StatusOr<std::unique_ptr<LazyLoad>> open(const LazyCalls& calls, UniqueFd fd);
  // Unregisters and unmaps: only once no wait is pending on the device (the context synchronized).
  ~LazyLoad();
  LazyLoad(const LazyLoad&) = delete;
  LazyLoad& operator=(const LazyLoad&) = delete;

  // Enqueues on `s` (a stream of the current context) a wait for the flag.
  CUresult hold(CUstream s);
  bool loaded() const;
  uint64_t holds() const { return holds_; }

 private:
  LazyLoad(const LazyCalls& c) : calls_(c) {}
  const LazyCalls calls_;
  UniqueFd fd_;
  void* page_ = nullptr;
  bool registered_ = false;
  CUdeviceptr device_ = 0;
  uint64_t holds_ = 0;
};

}  // namespace pos::driver
