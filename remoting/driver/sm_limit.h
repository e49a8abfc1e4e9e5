// sm_limit.h — an in-process job's SM limit (issue #24): its kernels run on a green context that
// holds only the SMs asked for, handed to the job in place of each GPU's primary context.
//
// `pos run --sms N` sets POS_SM_LIMIT=N. The driver layer's cuDevicePrimaryCtxRetain hook (what
// the CUDA runtime makes its contexts with) answers with a context made from a green context of N
// SMs (rounded up to the GPU's SM group size), and POS's own calls that act in the job's context
// (a dump's synchronize, a cut's stream order, a lazy load's waits) use the same context, so they
// see the job's work. Memory is the primary context's: green contexts share it. cuDeviceGetAttribute
// reports the granted SMs as the multiprocessor count. docs/limits.md, "SM limits".
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "remoting/driver/driver_api.h"

namespace pos::driver {

// The driver's green-context calls, with its own minimal types (driver_api.h's reasons): a
// CUdevResource is 144 bytes in CUDA 13.0 (type, 92 bytes of padding, a 48-byte union whose SM
// member begins with smCount); the layout is checked against cuda.h where the toolkit is present
// (unittest/sm_limit_test.cc).
struct DevResource {
  int type = 0;  // CU_DEV_RESOURCE_TYPE_SM = 1
  unsigned char padding[92] = {};
  union {
    struct {
      unsigned sm_count;
      unsigned min_partition;
      unsigned coscheduled_alignment;
    } sm;
    unsigned char oversize[48];
  };
  DevResource() : oversize{} {}
};
static_assert(sizeof(DevResource) == 144, "CUdevResource of CUDA 13.0");

inline constexpr int kDevResourceTypeSm = 1;
inline constexpr unsigned kGreenCtxDefaultStream = 1;  // CU_GREEN_CTX_DEFAULT_STREAM
inline constexpr int kAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
inline constexpr CUresult kErrorInvalidValue = 1;
inline constexpr CUresult kErrorNotSupported = 801;

struct GreenCalls {
  CUresult (*device_resource)(CUdevice dev, DevResource* r, int type) = nullptr;        // cuDeviceGetDevResource
  CUresult (*split_by_count)(DevResource* result, unsigned* groups, const DevResource* input, DevResource* rest,
                             unsigned flags, unsigned min_count) = nullptr;             // cuDevSmResourceSplitByCount
  CUresult (*generate_desc)(void** desc, DevResource* r, unsigned n) = nullptr;       // cuDevResourceGenerateDesc
  CUresult (*green_create)(void** green, void* desc, CUdevice dev, unsigned flags) = nullptr;  // cuGreenCtxCreate
  CUresult (*ctx_from_green)(CUcontext* ctx, void* green) = nullptr;                    // cuCtxFromGreenCtx
  bool complete() const {
    return device_resource && split_by_count && generate_desc && green_create && ctx_from_green;
  }
};

class SmLimit {
 public:
  static constexpr int kMaxDevices = 16;

  // `asked`: POS_SM_LIMIT's value (nullptr or "": no limit). A value that is no whole number from
  // 1 to 100000 is no limit, said by error().
  void configure(const char* asked, const GreenCalls& calls);
  // The SMs asked for (0: no limit).
  unsigned asked() const { return asked_; }

  // The context the job gets for `dev` in place of its primary context, made on the first call:
  // nullptr when there is no limit, or the limit cannot be had on that GPU (the reason in
  // error(); the job then runs on the whole GPU). Thread-safe.
  // `primary`: the real primary context of `dev` (remembered, for instead_of).
  CUcontext context(CUdevice dev, CUcontext primary);
  // The context to make current in place of `ctx`: the green context's when `ctx` is the real
  // primary context of a GPU with one (what the CUDA runtime sets current), else `ctx` itself.
  // Lock-free (the hooks ask it on every call under a limit).
  CUcontext instead_of(CUcontext ctx) const;
  // Whether `ctx` is one of the green contexts handed out. Lock-free.
  bool is_green(CUcontext ctx) const;
  // The SMs the limit gives the job on `dev` (0: no limit there), worked out without making a
  // context: what cuDeviceGetAttribute reports as the multiprocessor count.
  unsigned planned(CUdevice dev);
  // SMs of the green context on `dev` (0: none made), and of the whole GPU (0: not known yet).
  unsigned granted(CUdevice dev) const;
  unsigned total(CUdevice dev) const;
  std::string error() const;

 private:
  struct Device {
    bool planned = false, tried = false;
    DevResource group;      // the split's group of SMs (group.sm.sm_count: 0 when none)
    // Written once under mu_, read without it: the green-derived context and the real primary
    // context it stands in for.
    std::atomic<CUcontext> ctx{nullptr};
    std::atomic<CUcontext> primary{nullptr};
    void* green = nullptr;  // kept for the process's life: the job's context is made from it
    unsigned granted = 0, total = 0;
  };
  // Under mu_: the split for `dev` worked out once; false (the reason in error_) when there is none.
  bool plan(Device& d, CUdevice dev);
  mutable std::mutex mu_;
  GreenCalls calls_;
  unsigned asked_ = 0;
  std::string error_;  // under mu_
  std::array<Device, kMaxDevices> dev_{};
};

}  // namespace pos::driver
