// sm_limit.cc — an in-process job's SM limit: one green context per GPU the job uses, made on the
// job's first context for it (sm_limit.h, docs/limits.md).
#include "remoting/driver/sm_limit.h"

#include <cerrno>
#include <cstdlib>

#include "pos/base/text.h"

namespace pos::driver {

void SmLimit::configure(const char* asked, const GreenCalls& calls) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_ = calls;
  asked_ = 0;
  if (asked == nullptr || *asked == '\0') return;
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(asked, &end, 10);
  if (errno != 0 || end == asked || *end != '\0' || asked[0] == '-' || asked[0] == '+' || v == 0 || v > 100000) {
    error_ = "POS_SM_LIMIT='" + pos::printable(asked, 64) + "': not a number of SMs from 1 to 100000: no SM limit set";
    return;
  }
  if (!calls.complete()) {
    error_ = "POS_SM_LIMIT=" + std::to_string(v) +
             ": this driver has no green contexts (cuGreenCtxCreate, CUDA 12.4 and later): no SM limit set";
    return;
  }
  asked_ = static_cast<unsigned>(v);
}

bool SmLimit::plan(Device& d, CUdevice dev) {
  if (d.planned) return d.group.sm.sm_count != 0;
  d.planned = true;
  const std::string where = "POS_SM_LIMIT=" + std::to_string(asked_) + " on GPU " + std::to_string(dev) + ": ";
  const auto fail = [&](const std::string& why) {
    if (error_.empty()) error_ = where + why + ": it runs on all its SMs";
    return false;
  };
  DevResource all;
  if (const CUresult rc = calls_.device_resource(dev, &all, kDevResourceTypeSm); rc != kSuccess)
    return fail("cuDeviceGetDevResource failed (CUresult " + std::to_string(rc) + ")");
  d.total = all.sm.sm_count;
  if (asked_ > d.total) return fail("the GPU has " + std::to_string(d.total) + " SMs");
  if (asked_ == d.total) {  // the whole GPU: nothing to limit
    d.granted = d.total;
    return false;
  }
  // One group of at least `asked_` SMs: the driver rounds up to its group size (8 on an H200).
  DevResource rest;
  unsigned groups = 1;
  const CUresult rc = calls_.split_by_count(&d.group, &groups, &all, &rest, 0, asked_);
  if (rc != kSuccess || groups == 0 || d.group.sm.sm_count == 0) {
    d.group.sm.sm_count = 0;
    return fail("cuDevSmResourceSplitByCount gave no group of that size (CUresult " + std::to_string(rc) + ")");
  }
  if (d.group.sm.sm_count >= d.total) {  // rounded up to the whole GPU
    d.group.sm.sm_count = 0;
    d.granted = d.total;
    return false;
  }
  return true;
}

unsigned SmLimit::planned(CUdevice dev) {
  if (asked_ == 0 || dev < 0 || dev >= kMaxDevices) return 0;
  std::lock_guard<std::mutex> lk(mu_);
  Device& d = dev_[static_cast<size_t>(dev)];
  return plan(d, dev) ? d.group.sm.sm_count : 0;
}

CUcontext SmLimit::instead_of(CUcontext ctx) const {
  if (asked_ == 0 || ctx == nullptr) return ctx;
  for (const Device& d : dev_) {
    const CUcontext g = d.ctx.load(std::memory_order_acquire);
    if (g != nullptr && d.primary.load(std::memory_order_relaxed) == ctx) return g;
  }
  return ctx;
}

bool SmLimit::is_green(CUcontext ctx) const {
  if (asked_ == 0 || ctx == nullptr) return false;
  for (const Device& d : dev_)
    if (d.ctx.load(std::memory_order_acquire) == ctx) return true;
  return false;
}

CUcontext SmLimit::context(CUdevice dev, CUcontext primary) {
  if (asked_ == 0 || dev < 0 || dev >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  Device& d = dev_[static_cast<size_t>(dev)];
  if (d.primary.load(std::memory_order_relaxed) == nullptr && primary != nullptr &&
      primary != d.ctx.load(std::memory_order_relaxed))
    d.primary.store(primary, std::memory_order_relaxed);
  if (d.tried) return d.ctx.load(std::memory_order_relaxed);
  d.tried = true;
  if (!plan(d, dev)) return nullptr;
  const std::string where = "POS_SM_LIMIT=" + std::to_string(asked_) + " on GPU " + std::to_string(dev) + ": ";
  const auto fail = [&](const std::string& why) -> CUcontext {
    if (error_.empty()) error_ = where + why + ": it runs on all its SMs";
    return nullptr;
  };
  DevResource group = d.group;  // the call may write to it
  void* desc = nullptr;
  if (const CUresult rc = calls_.generate_desc(&desc, &group, 1); rc != kSuccess)
    return fail("cuDevResourceGenerateDesc failed (CUresult " + std::to_string(rc) + ")");
  // With its own default stream: the job's legacy and per-thread default streams must exist in it.
  if (const CUresult rc = calls_.green_create(&d.green, desc, dev, kGreenCtxDefaultStream); rc != kSuccess)
    return fail("cuGreenCtxCreate failed (CUresult " + std::to_string(rc) + ")");
  CUcontext ctx = nullptr;
  if (const CUresult rc = calls_.ctx_from_green(&ctx, d.green); rc != kSuccess || ctx == nullptr)
    return fail("cuCtxFromGreenCtx failed (CUresult " + std::to_string(rc) + ")");
  d.granted = d.group.sm.sm_count;
  d.ctx.store(ctx, std::memory_order_release);  // after primary: instead_of reads them in this order
  return ctx;
}

unsigned SmLimit::granted(CUdevice dev) const {
  if (dev < 0 || dev >= kMaxDevices) return 0;
  std::lock_guard<std::mutex> lk(mu_);
  return dev_[static_cast<size_t>(dev)].granted;
}

unsigned SmLimit::total(CUdevice dev) const {
  if (dev < 0 || dev >= kMaxDevices) return 0;
  std::lock_guard<std::mutex> lk(mu_);
  return dev_[static_cast<size_t>(dev)].total;
}

std::string SmLimit::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

}  // namespace pos::driver
