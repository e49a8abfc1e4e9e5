// lazy_load.cc — both ends of a lazy restore's flag (lazy_load.h): pos-cli's page, and the job's
// registration of it and the waits its streams get.
#include "remoting/driver/lazy_load.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace pos::driver {
namespace {

constexpr unsigned kHostRegisterPortable = 0x01;   // CU_MEMHOSTREGISTER_PORTABLE
constexpr unsigned kHostRegisterDeviceMap = 0x02;  // CU_MEMHOSTREGISTER_DEVICEMAP
constexpr unsigned kWaitValueGeq = 0x0;            // CU_STREAM_WAIT_VALUE_GEQ

std::string cu_error(const char* what, CUresult rc) {
  return std::string(what) + " failed: CUDA driver error " + std::to_string(rc);
}

}  // namespace

StatusOr<std::unique_ptr<LazyFlag>> LazyFlag::make() {
  std::unique_ptr<LazyFlag> f(new LazyFlag());
  f->fd_.reset(::memfd_create("pos-lazy-restore", MFD_CLOEXEC));
  if (!f->fd_) return Status::Unavailable(std::string("memfd_create: ") + std::strerror(errno));
  if (::ftruncate(f->fd_.get(), kLazyFlagBytes) != 0) return Status::Unavailable(std::string("ftruncate: ") + std::strerror(errno));
  void* p = ::mmap(nullptr, kLazyFlagBytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd_.get(), 0);
  if (p == MAP_FAILED) return Status::Unavailable(std::string("mmap: ") + std::strerror(errno));
  f->word_ = static_cast<std::atomic<uint32_t>*>(p);
  f->word_->store(0, std::memory_order_relaxed);
  return f;
}

LazyFlag::~LazyFlag() {
  if (word_ != nullptr) ::munmap(static_cast<void*>(word_), kLazyFlagBytes);
}

void LazyFlag::set() { word_->store(kLazyLoaded, std::memory_order_seq_cst); }

StatusOr<std::unique_ptr<LazyLoad>> LazyLoad::open(const LazyCalls& calls, UniqueFd fd) {
  if (!calls.complete())
    return Status::FailedPrecondition("the driver lacks a call a lazy load needs (host registration, stream waits)");
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  if (size != static_cast<off_t>(kLazyFlagBytes))
    return Status::FailedPrecondition("the lazy load's flag is not one page of shared memory");
  std::unique_ptr<LazyLoad> l(new LazyLoad(calls));
  l->fd_ = std::move(fd);
  void* p = ::mmap(nullptr, kLazyFlagBytes, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd_.get(), 0);
  if (p == MAP_FAILED) return Status::FailedPrecondition(std::string("mapping the lazy load's flag: ") + std::strerror(errno));
  l->page_ = p;
  if (const CUresult rc = calls.host_register(p, kLazyFlagBytes, kHostRegisterPortable | kHostRegisterDeviceMap); rc != kSuccess)
    return Status::FailedPrecondition(cu_error("cuMemHostRegister", rc));
  l->registered_ = true;
  if (const CUresult rc = calls.host_device_pointer(&l->device_, p, 0); rc != kSuccess)
    return Status::FailedPrecondition(cu_error("cuMemHostGetDevicePointer", rc));
  return l;
}

LazyLoad::~LazyLoad() {
  if (registered_) (void)calls_.host_unregister(page_);
  if (page_ != nullptr) ::munmap(page_, kLazyFlagBytes);
}

CUresult LazyLoad::hold(CUstream s) {
  const CUresult rc = calls_.wait_value32(s, device_, kLazyLoaded, kWaitValueGeq);
  if (rc == kSuccess) ++holds_;
  return rc;
}

bool LazyLoad::loaded() const {
  return static_cast<const std::atomic<uint32_t>*>(page_)->load(std::memory_order_acquire) >= kLazyLoaded;
}

}  // namespace pos::driver
