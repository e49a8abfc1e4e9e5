// held_memory.cc — a job's device memory held in pos-cli for a dump or a restore: imported or made,
// mapped side by side in one reserved range, copied to or from an image, handed back as descriptors.
#include "remoting/driver/held_memory.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckpt/crc32c.h"

namespace pos::driver {

namespace {
constexpr int kPosixFd = 1;  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR

std::string cu_error(const char* what, CUresult rc) { return std::string(what) + " failed: CUDA driver error " + std::to_string(rc); }

CUmemAllocationProp prop_of(int dev) {
  CUmemAllocationProp p{};
  p.type = 1;
  p.location.type = 1;
  p.location.id = dev;
  p.requestedHandleTypes = kPosixFd;
  return p;
}
}  // namespace

uint32_t allocation_list_checksum(const std::vector<SavedRegion>& regions) {
  std::string text;
  for (const SavedRegion& r : regions)
    text += std::to_string(r.dev) + ":" + std::to_string(r.addr) + ":" + std::to_string(r.size) + ",";
  return ckpt::crc32c(text.data(), text.size());
}

PeerCalls peer_calls(void* driver) {
  PeerCalls c;
  const auto get = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(::dlsym(driver, name));
  };
  get(&c.vmm.ctx_get_device, "cuCtxGetDevice");
  get(&c.vmm.reserve, "cuMemAddressReserve");
  get(&c.vmm.address_free, "cuMemAddressFree");
  get(&c.vmm.create, "cuMemCreate");
  get(&c.vmm.release, "cuMemRelease");
  get(&c.vmm.map, "cuMemMap");
  get(&c.vmm.unmap, "cuMemUnmap");
  get(&c.vmm.set_access, "cuMemSetAccess");
  get(&c.vmm.granularity, "cuMemGetAllocationGranularity");
  get(&c.vmm.synchronize, "cuCtxSynchronize");
  get(&c.vmm.export_fd, "cuMemExportToShareableHandle");
  get(&c.vmm.import_fd, "cuMemImportFromShareableHandle");
  get(&c.copy.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  get(&c.copy.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  get(&c.copy.ctx_set_current, "cuCtxSetCurrent");
  get(&c.copy.ctx_synchronize, "cuCtxSynchronize");
  get(&c.copy.stream_create, "cuStreamCreate");
  get(&c.copy.stream_destroy, "cuStreamDestroy_v2");
  get(&c.copy.stream_synchronize, "cuStreamSynchronize");
  get(&c.copy.host_alloc, "cuMemHostAlloc");
  get(&c.copy.free_host, "cuMemFreeHost");
  get(&c.copy.dtoh_async, "cuMemcpyDtoHAsync_v2");
  get(&c.copy.htod_async, "cuMemcpyHtoDAsync_v2");
  get(&c.dtod, "cuMemcpyDtoD_v2");
  return c;
}

StatusOr<std::unique_ptr<HeldMemory>> HeldMemory::open(const PeerCalls& calls, int dev) {
  if (!calls.complete()) return Status::Unsupported("the driver lacks a call the device-memory hand-off needs");
  std::unique_ptr<HeldMemory> h(new HeldMemory(calls, dev));
  if (const CUresult rc = calls.copy.primary_ctx_retain(&h->ctx_, dev); rc != kSuccess)
    return Status::Unavailable(cu_error("cuDevicePrimaryCtxRetain", rc));
  return h;
}

HeldMemory::~HeldMemory() {
  if (ctx_ == nullptr) return;
  (void)calls_.copy.ctx_set_current(ctx_);
  if (!copy_only_)
    for (size_t i = 0; i < mapped_; ++i) (void)calls_.vmm.unmap(at_[i], regions_[i].size);
  for (CUmemGenericAllocationHandle h : handles_) (void)calls_.vmm.release(h);
  if (span_ > 0) (void)calls_.vmm.address_free(base_, span_);
  if (shadow_size_ > 0) {
    (void)calls_.vmm.unmap(shadow_base_, shadow_size_);
    (void)calls_.vmm.address_free(shadow_base_, shadow_size_);
  }
  if (shadow_ != 0) (void)calls_.vmm.release(shadow_);
  (void)calls_.copy.ctx_set_current(nullptr);
  (void)calls_.copy.primary_ctx_release(dev_);
}

uint64_t HeldMemory::bytes() const {
  uint64_t n = 0;
  for (const SavedRegion& r : regions_) n += r.size;
  return n;
}

Status HeldMemory::map_all(const std::vector<CUmemGenericAllocationHandle>& handles) {
  span_ = 0;
  for (const SavedRegion& r : regions_) span_ += r.size;
  if (span_ == 0) return Status::Ok();
  size_t g = 0;
  const CUmemAllocationProp prop = prop_of(dev_);
  if (const CUresult rc = calls_.vmm.granularity(&g, &prop, 0); rc != kSuccess || g == 0)
    return Status::Unavailable(cu_error("cuMemGetAllocationGranularity", rc));
  for (const SavedRegion& r : regions_)
    if (r.size % g != 0) return Status::InvalidArgument("a region's size is not a multiple of the granularity");
  if (const CUresult rc = calls_.vmm.reserve(&base_, span_, g, 0, 0); rc != kSuccess) {
    span_ = 0;
    return Status(Code::kOutOfMemory, 0, cu_error("cuMemAddressReserve", rc));
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = 3;
  uint64_t at = base_;
  for (size_t i = 0; i < regions_.size(); ++i) {
    at_.push_back(at);
    if (const CUresult rc = calls_.vmm.map(at, regions_[i].size, 0, handles[i], 0); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemMap", rc));
    ++mapped_;
    if (const CUresult rc = calls_.vmm.set_access(at, regions_[i].size, &access, 1); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemSetAccess", rc));
    at += regions_[i].size;
  }
  return Status::Ok();
}

Status HeldMemory::import(const std::vector<SavedRegion>& regions, std::vector<UniqueFd> fds) {
  if (!regions_.empty()) return Status::FailedPrecondition("memory is held already");
  if (fds.size() != regions.size())
    return Status::Corrupt(std::to_string(fds.size()) + " descriptors came for " + std::to_string(regions.size()) + " allocations");
  (void)calls_.copy.ctx_set_current(ctx_);
  regions_ = regions;
  fds_ = std::move(fds);
  for (const UniqueFd& fd : fds_) {
    CUmemGenericAllocationHandle h = 0;
    if (const CUresult rc = calls_.vmm.import_fd(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())), kPosixFd);
        rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemImportFromShareableHandle", rc));
    handles_.push_back(h);
  }
  return map_all(handles_);
}

Status HeldMemory::import_copy(const std::vector<SavedRegion>& regions, UniqueFd fd, uint64_t shadow_bytes) {
  if (!regions_.empty() || shadow_ != 0) return Status::FailedPrecondition("memory is held already");
  uint64_t total = 0;
  for (const SavedRegion& r : regions) total += r.size;
  if (total > shadow_bytes || shadow_bytes == 0)
    return Status::Corrupt("the checkpoint's copy (" + std::to_string(shadow_bytes) + " bytes) cannot hold the " +
                           std::to_string(total) + " bytes of its allocations");
  (void)calls_.copy.ctx_set_current(ctx_);
  size_t g = 0;
  const CUmemAllocationProp prop = prop_of(dev_);
  if (const CUresult rc = calls_.vmm.granularity(&g, &prop, 0); rc != kSuccess || g == 0)
    return Status::Unavailable(cu_error("cuMemGetAllocationGranularity", rc));
  if (shadow_bytes % g != 0) return Status::Corrupt("the checkpoint's copy is not a whole number of granules");
  if (const CUresult rc = calls_.vmm.import_fd(&shadow_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())), kPosixFd);
      rc != kSuccess) {
    shadow_ = 0;
    return Status::Unavailable(cu_error("cuMemImportFromShareableHandle (checkpoint copy)", rc));
  }
  // A size larger than the allocation fails to map: the job's answer cannot make this read past it.
  POS_RETURN_IF_ERROR(map_shadow(shadow_bytes, g));
  copy_only_ = true;
  regions_ = regions;
  uint64_t at = shadow_base_;
  for (const SavedRegion& r : regions_) {
    at_.push_back(at);
    at += r.size;
  }
  mapped_ = regions_.size();
  fds_.push_back(std::move(fd));
  return Status::Ok();
}

Status HeldMemory::create(const std::vector<SavedRegion>& regions) {
  if (!regions_.empty()) return Status::FailedPrecondition("memory is held already");
  (void)calls_.copy.ctx_set_current(ctx_);
  regions_ = regions;
  const CUmemAllocationProp prop = prop_of(dev_);
  for (const SavedRegion& r : regions_) {
    CUmemGenericAllocationHandle h = 0;
    if (const CUresult rc = calls_.vmm.create(&h, r.size, &prop, 0); rc != kSuccess)
      return Status(rc == 2 ? Code::kOutOfMemory : Code::kUnavailable, 0, cu_error("cuMemCreate", rc));
    handles_.push_back(h);
    int fd = -1;
    if (const CUresult rc = calls_.vmm.export_fd(&fd, h, kPosixFd, 0); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemExportToShareableHandle", rc));
    fds_.emplace_back(fd);
  }
  return map_all(handles_);
}

Status HeldMemory::reserve_shadow(uint64_t bytes) {
  if (shadow_ != 0) return Status::FailedPrecondition("a shadow is reserved already");
  if (calls_.dtod == nullptr) return Status::Unsupported("the driver lacks cuMemcpyDtoD");
  (void)calls_.copy.ctx_set_current(ctx_);
  CUmemAllocationProp prop = prop_of(dev_);
  prop.requestedHandleTypes = 0;  // never leaves this process
  size_t g = 0;
  if (const CUresult rc = calls_.vmm.granularity(&g, &prop, 0); rc != kSuccess || g == 0)
    return Status::Unavailable(cu_error("cuMemGetAllocationGranularity", rc));
  const uint64_t size = (bytes + g - 1) / g * g;
  if (size == 0) return Status::InvalidArgument("an empty shadow");
  if (const CUresult rc = calls_.vmm.create(&shadow_, size, &prop, 0); rc != kSuccess) {
    shadow_ = 0;
    return Status(Code::kOutOfMemory, 0, cu_error("cuMemCreate (shadow)", rc));
  }
  return map_shadow(size, g);
}

Status HeldMemory::map_shadow(uint64_t size, size_t g) {
  if (const CUresult rc = calls_.vmm.reserve(&shadow_base_, size, g, 0, 0); rc != kSuccess)
    return Status(Code::kOutOfMemory, 0, cu_error("cuMemAddressReserve (shadow)", rc));
  if (const CUresult rc = calls_.vmm.map(shadow_base_, size, 0, shadow_, 0); rc != kSuccess) {
    (void)calls_.vmm.address_free(shadow_base_, size);
    return Status::Unavailable(cu_error("cuMemMap (shadow)", rc));
  }
  shadow_size_ = size;
  CUmemAccessDesc access{};
  access.location = prop_of(dev_).location;
  access.flags = 3;
  if (const CUresult rc = calls_.vmm.set_access(shadow_base_, size, &access, 1); rc != kSuccess)
    return Status::Unavailable(cu_error("cuMemSetAccess (shadow)", rc));
  return Status::Ok();
}

Status HeldMemory::snapshot() {
  if (mapped_ != regions_.size()) return Status::FailedPrecondition("the memory is not all mapped here");
  if (shadow_size_ < span_) return Status::FailedPrecondition("no shadow large enough for the memory held");
  (void)calls_.copy.ctx_set_current(ctx_);
  for (size_t i = 0; i < regions_.size(); ++i)
    if (const CUresult rc = calls_.dtod(shadow_base_ + (at_[i] - base_), at_[i], regions_[i].size); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemcpyDtoD (shadow)", rc));
  if (const CUresult rc = calls_.copy.ctx_synchronize(); rc != kSuccess)
    return Status::Unavailable(cu_error("cuCtxSynchronize (shadow)", rc));
  snapped_ = true;
  return Status::Ok();
}

Status HeldMemory::copy_from(const HeldMemory& src) {
  if (mapped_ != regions_.size() || src.mapped_ != src.regions_.size())
    return Status::FailedPrecondition("the memory is not all mapped here");
  if (src.regions_.size() != regions_.size()) return Status::InvalidArgument("the two sets of memory differ");
  for (size_t i = 0; i < regions_.size(); ++i)
    if (src.regions_[i].addr != regions_[i].addr || src.regions_[i].size != regions_[i].size)
      return Status::InvalidArgument("the two sets of memory differ (region " + std::to_string(i) + ")");
  if (calls_.dtod == nullptr) return Status::Unsupported("the driver lacks cuMemcpyDtoD");
  // This device may read the source's mappings (their own device's access is left as it is).
  CUmemAccessDesc access{};
  access.location = prop_of(dev_).location;
  access.flags = 3;
  const std::string peer = "cuMemSetAccess (GPU " + std::to_string(dev_) + " reading GPU " + std::to_string(src.dev_) +
                           "'s memory: no peer access between them?)";
  for (size_t i = 0; i < src.regions_.size() && src.dev_ != dev_; ++i)
    if (const CUresult rc = calls_.vmm.set_access(src.at_[i], src.regions_[i].size, &access, 1); rc != kSuccess)
      return Status::Unavailable(cu_error(peer.c_str(), rc));
  (void)calls_.copy.ctx_set_current(ctx_);
  for (size_t i = 0; i < regions_.size(); ++i)
    if (const CUresult rc = calls_.dtod(at_[i], src.at_[i], regions_[i].size); rc != kSuccess)
      return Status::Unavailable(cu_error("cuMemcpyDtoD (to the new GPU)", rc));
  if (const CUresult rc = calls_.copy.ctx_synchronize(); rc != kSuccess)
    return Status::Unavailable(cu_error("cuCtxSynchronize (the copy to the new GPU)", rc));
  return Status::Ok();
}

CopyOptions HeldMemory::with_addresses(CopyOptions o) const {
  // Regions are in address order (a region table's): the one holding `addr` by binary search.
  o.address = [this](uint64_t addr) {
    auto it = std::upper_bound(regions_.begin(), regions_.end(), addr,
                               [](uint64_t a, const SavedRegion& r) { return a < r.addr; });
    if (it == regions_.begin()) return static_cast<uint64_t>(addr);
    const size_t i = static_cast<size_t>(it - regions_.begin()) - 1;
    const uint64_t here = at_[i] + (addr - regions_[i].addr);
    return snapped_ ? static_cast<uint64_t>(shadow_base_ + (here - base_)) : here;
  };
  return o;
}

StatusOr<CopyReport> HeldMemory::save(const std::string& dir, CopyOptions options) const {
  if (mapped_ != regions_.size()) return Status::FailedPrecondition("the memory is not all mapped here");
  // An incremental image stores what it does not inherit.
  std::vector<SavedRegion> stored;
  for (const SavedRegion& r : regions_)
    if (std::none_of(options.inherited.begin(), options.inherited.end(),
                     [&](const SavedRegion& i) { return i.addr == r.addr; }))
      stored.push_back(r);
  if (stored.size() + options.inherited.size() != regions_.size())
    return Status::InvalidArgument("the inherited allocations are not all held here");
  return save_regions(calls_.copy, dev_, stored, dir, with_addresses(std::move(options)));
}

StatusOr<CopyReport> HeldMemory::load(const std::string& dir, CopyOptions options) const {
  if (mapped_ != regions_.size()) return Status::FailedPrecondition("the memory is not all mapped here");
  return load_regions(calls_.copy, dev_, regions_, dir, with_addresses(std::move(options)));
}

StatusOr<std::vector<UniqueFd>> HeldMemory::descriptors() const {
  std::vector<UniqueFd> out;
  for (const UniqueFd& fd : fds_) {
    out.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!out.back()) return Status::Unavailable(std::string("cannot duplicate a descriptor: ") + std::strerror(errno));
  }
  return out;
}

std::vector<int> HeldMemory::raw_fds() const {
  std::vector<int> out;
  for (const UniqueFd& fd : fds_) out.push_back(fd.get());
  return out;
}

}  // namespace pos::driver
