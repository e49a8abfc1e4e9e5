// backend.cc — what every device backend shares: device-wide memory accounting and plain host memory.
// The backends themselves live in pos/backends/; pos/backends/factory.cc picks one.
#include "pos/backend.h"

#include <cstdlib>
#include <string>


namespace pos {

bool DeviceBackend::try_reserve(uint64_t bytes) {
  uint64_t cur = reserved_.load();
  do {
    if (bytes > capacity_ || cur > capacity_ - bytes) return false;
  } while (!reserved_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

StatusOr<void*> DeviceBackend::host_alloc(uint64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0)
    return Status::Cuda(cuda::kErrorMemoryAllocation, "host allocation of " + std::to_string(bytes) + " bytes failed");
  return p;
}

Status DeviceBackend::host_free(void* p) {
  std::free(p);
  return Status::Ok();
}


}  // namespace pos
