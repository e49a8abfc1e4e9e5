// host_kernels.cc — the process-wide host kernel registry.
// A function-local static avoids initialization-order problems with static registrars.
#include "pos/backends/host/host_kernels.h"

namespace pos::host {

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry r;
  return r;
}

void KernelRegistry::add(HostKernel k) {
  std::lock_guard<std::mutex> lk(mu_);
  kernels_[k.name] = std::move(k);
}

const HostKernel* KernelRegistry::find(std::string_view name) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = kernels_.find(std::string(name));
  return it == kernels_.end() ? nullptr : &it->second;
}

size_t KernelRegistry::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return kernels_.size();
}

}  // namespace pos::host
