// app_vmm.cc — the job's own VMM memory: handles and mappings recorded as the driver grants them,
// released for a dump and made again for a resume with the job's handle values kept meaningful.
#include "remoting/driver/app_vmm.h"

namespace pos::driver {

namespace {
constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorNotPermitted = 800;
}  // namespace

CUmemGenericAllocationHandle AppVmm::live_of(CUmemGenericAllocationHandle h) const {
  auto it = handles_.find(h);
  return it != handles_.end() && it->second.live != 0 ? it->second.live : h;
}

void AppVmm::forget_if_unused(CUmemGenericAllocationHandle h) {
  auto it = handles_.find(h);
  if (it == handles_.end() || !it->second.released) return;
  for (const auto& [at, m] : maps_)
    if (m.handle == h) return;
  handles_.erase(it);
}

CUresult AppVmm::create(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                        unsigned long long flags) {
  std::lock_guard<std::mutex> lk(mu_);
  if (unmapped_) return kErrorNotPermitted;  // a dump holds the job's memory (its calls wait at the gate first)
  const CUresult rc = calls_.create(h, size, prop, flags);
  if (rc != kSuccess || h == nullptr || prop == nullptr) return rc;
  Handle rec;
  rec.size = size;
  rec.prop = *prop;
  rec.live = *h;
  handles_[*h] = rec;  // a value the driver hands out again after a release names new memory
  return rc;
}

CUresult AppVmm::release(CUmemGenericAllocationHandle h) {
  std::lock_guard<std::mutex> lk(mu_);
  if (unmapped_) return kErrorNotPermitted;
  const CUresult rc = calls_.release(live_of(h));
  if (rc != kSuccess) return rc;
  if (auto it = handles_.find(h); it != handles_.end()) {
    it->second.released = true;
    forget_if_unused(h);
  }
  return rc;
}

CUresult AppVmm::map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
  std::lock_guard<std::mutex> lk(mu_);
  if (unmapped_) return kErrorNotPermitted;
  const CUresult rc = calls_.map(p, size, offset, live_of(h), flags);
  if (rc != kSuccess) return rc;
  Mapping m;
  m.size = size;
  m.offset = offset;
  m.handle = h;
  maps_[p] = m;
  if (handles_.find(h) == handles_.end()) ++foreign_maps_;
  return rc;
}

CUresult AppVmm::unmap(CUdeviceptr p, size_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  if (unmapped_) return kErrorNotPermitted;
  const CUresult rc = calls_.unmap(p, size);
  if (rc != kSuccess) return rc;
  // The driver unmapped [p, p + size): every mapping inside it is gone.
  for (auto it = maps_.lower_bound(p); it != maps_.end() && it->first < p + size;) {
    const CUmemGenericAllocationHandle h = it->second.handle;
    if (handles_.find(h) == handles_.end() && foreign_maps_ > 0) --foreign_maps_;
    it = maps_.erase(it);
    forget_if_unused(h);
  }
  return rc;
}

CUresult AppVmm::set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) {
  std::lock_guard<std::mutex> lk(mu_);
  const CUresult rc = calls_.set_access(p, size, desc, count);
  if (rc != kSuccess || desc == nullptr) return rc;
  // Recorded on each mapping the range covers, to be set again after a resume.
  for (auto it = maps_.lower_bound(p); it != maps_.end() && it->first < p + size; ++it)
    it->second.access.assign(desc, desc + count);
  return rc;
}

std::vector<AppVmm::Region> AppVmm::regions() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Region> out;
  for (const auto& [at, m] : maps_) {
    auto h = handles_.find(m.handle);
    out.push_back(Region{h != handles_.end() ? h->second.prop.location.id : 0, at, m.size, !m.access.empty()});
  }
  return out;
}

std::string AppVmm::blocker() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (foreign_maps_ > 0)
    return std::to_string(foreign_maps_) + " mapping(s) of device memory the job imported (cuMemImportFromShareableHandle)";
  // Made anew with the same properties, shareable ones included (PyTorch asks for them); an actual
  // export or import is the census's to refuse.
  for (const auto& [h, rec] : handles_)
    if (rec.prop.type != 1 || rec.prop.location.type != 1)
      return "device memory the job created other than as pinned memory of a device";
  for (const auto& [at, m] : maps_)
    if (m.access.empty()) return "a mapping the job made without setting its access";
  return "";
}

CUresult AppVmm::unmap_all() {
  std::lock_guard<std::mutex> lk(mu_);
  unmapped_ = true;
  for (auto& [at, m] : maps_) {
    if (!m.mapped) continue;
    if (const CUresult rc = calls_.unmap(at, m.size); rc != kSuccess) return rc;
    m.mapped = false;
  }
  for (auto& [h, rec] : handles_) {
    // The job's own reference: dropped now (its memory goes with the last mapping, already gone).
    // A handle the job released was freed by the driver with its last unmap above.
    if (rec.live != 0 && !rec.released && calls_.release(rec.live) != kSuccess) return kErrorInvalidValue;
    rec.live = 0;
  }
  return kSuccess;
}

CUresult AppVmm::remap_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [h, rec] : handles_) {
    if (rec.live != 0) continue;
    CUmemGenericAllocationHandle fresh = 0;
    if (const CUresult rc = calls_.create(&fresh, rec.size, &rec.prop, 0); rc != kSuccess) return rc;
    rec.live = fresh;
  }
  for (auto& [at, m] : maps_) {
    if (m.mapped) continue;
    auto h = handles_.find(m.handle);
    if (h == handles_.end()) return kErrorInvalidValue;  // blocker() refused such a dump
    if (const CUresult rc = calls_.map(at, m.size, m.offset, h->second.live, 0); rc != kSuccess) return rc;
    if (const CUresult rc = calls_.set_access(at, m.size, m.access.data(), m.access.size()); rc != kSuccess) {
      (void)calls_.unmap(at, m.size);
      return rc;
    }
    m.mapped = true;
  }
  // Handles the job had released live on only through their mappings, as before.
  for (auto& [h, rec] : handles_)
    if (rec.released && rec.live != 0) {
      (void)calls_.release(rec.live);
      rec.live = ~0ull;  // not 0: remapped; its value is never used again (the job released it)
    }
  unmapped_ = false;
  return kSuccess;
}

}  // namespace pos::driver
