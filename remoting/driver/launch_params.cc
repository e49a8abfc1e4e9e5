// launch_params.cc — the kernel parameter layouts a LaunchScanner asks the driver for, cached per
// function handle (launches are hot, layouts never change while the handle lives).
#include "remoting/driver/launch_params.h"

#include <mutex>

namespace pos::driver {

std::shared_ptr<const ParamLayout> LaunchScanner::layout(CUfunction f) {
  {
    std::shared_lock<std::shared_mutex> lk(mu_);
    if (auto it = layouts_.find(f); it != layouts_.end()) return it->second;
  }
  if (calls_.func_param_info == nullptr && calls_.kernel_param_info == nullptr) return nullptr;
  ParamLayout l;
  if (calls_.func_param_info != nullptr)
    l = read_layout([&](size_t i, size_t* off, size_t* size) { return calls_.func_param_info(f, i, off, size); });
  if (!l.known && calls_.kernel_param_info != nullptr)
    l = read_layout([&](size_t i, size_t* off, size_t* size) { return calls_.kernel_param_info(f, i, off, size); });
  std::unique_lock<std::shared_mutex> lk(mu_);
  // Shared, so that forget() on another thread never pulls a layout from under a launch.
  return layouts_.emplace(f, std::make_shared<const ParamLayout>(std::move(l))).first->second;
}

void LaunchScanner::forget() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  layouts_.clear();
}

LaunchScanner::Stats LaunchScanner::stats() const {
  Stats s;
  s.scanned = scanned_.load(std::memory_order_relaxed);
  s.unparsed = unparsed_.load(std::memory_order_relaxed);
  std::shared_lock<std::shared_mutex> lk(mu_);
  s.layouts = layouts_.size();
  return s;
}

}  // namespace pos::driver
