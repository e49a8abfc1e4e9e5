// snapshot.cc — the cut of a GPU-only checkpoint of an in-process job: the shadow it copies into,
// the streams it orders itself after, and the device-side order of events, copies and waits.
#include "remoting/driver/snapshot.h"

#include <algorithm>
#include <string>

namespace pos::driver {
namespace {

constexpr int kPosixFd = 1;                  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
const CUstream kLegacyStream = nullptr;      // the legacy default stream of the current context

std::string cu_error(const char* what, CUresult rc) { return std::string(what) + " failed: CUDA driver error " + std::to_string(rc); }

}  // namespace

void StreamSet::add(CUstream s) {
  if (s == nullptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  set_.insert(s);
}
void StreamSet::remove(CUstream s) {
  std::lock_guard<std::mutex> lk(mu_);
  set_.erase(s);
}
std::vector<CUstream> StreamSet::list() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {set_.begin(), set_.end()};
}

StatusOr<std::unique_ptr<DeviceShadow>> DeviceShadow::create(const VmmCalls& calls, int dev, uint64_t bytes) {
  if (!calls.complete() || calls.export_fd == nullptr) return Status::Unsupported("the driver lacks a virtual memory call");
  std::unique_ptr<DeviceShadow> s(new DeviceShadow(calls));
  CUmemAllocationProp prop{};
  prop.type = 1;  // pinned device memory
  prop.location.type = 1;
  prop.location.id = dev;
  prop.requestedHandleTypes = kPosixFd;  // pos-cli imports it
  size_t g = 0;
  if (const CUresult rc = calls.granularity(&g, &prop, 0); rc != kSuccess || g == 0)
    return Status::Unavailable(cu_error("cuMemGetAllocationGranularity", rc));
  const uint64_t size = (bytes + g - 1) / g * g;
  if (size == 0) return Status::InvalidArgument("an empty shadow");
  if (const CUresult rc = calls.create(&s->handle_, size, &prop, 0); rc != kSuccess) {
    s->handle_ = 0;
    return Status(Code::kOutOfMemory, 0, cu_error("cuMemCreate (shadow)", rc));
  }
  if (const CUresult rc = calls.reserve(&s->base_, size, g, 0, 0); rc != kSuccess) {
    s->base_ = 0;
    return Status(Code::kOutOfMemory, 0, cu_error("cuMemAddressReserve (shadow)", rc));
  }
  s->size_ = size;
  if (const CUresult rc = calls.map(s->base_, size, 0, s->handle_, 0); rc != kSuccess)
    return Status::Unavailable(cu_error("cuMemMap (shadow)", rc));
  s->mapped_ = true;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = 3;  // read-write
  if (const CUresult rc = calls.set_access(s->base_, size, &access, 1); rc != kSuccess)
    return Status::Unavailable(cu_error("cuMemSetAccess (shadow)", rc));
  return s;
}

DeviceShadow::~DeviceShadow() {
  if (mapped_) (void)calls_.unmap(base_, size_);
  if (base_ != 0) (void)calls_.address_free(base_, size_);
  if (handle_ != 0) (void)calls_.release(handle_);
}

CUresult DeviceShadow::export_fd(int* fd) const {
  *fd = -1;
  return calls_.export_fd(fd, handle_, kPosixFd, 0);
}

bool any_capturing(const SnapCalls& calls, const std::vector<CUstream>& streams) {
  for (CUstream s : streams) {
    int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    if (calls.is_capturing == nullptr || calls.is_capturing(s, &status) != kSuccess || status != 0) return true;
  }
  return false;
}

namespace {

// Every stream in `all` gets an event where its work stands now, and `copy_stream` waits for each.
CUresult order_after(const SnapCalls& calls, CUstream copy_stream, const std::vector<CUstream>& all) {
  CUresult rc = kSuccess;
  for (CUstream s : all) {
    CUevent e = nullptr;
    if ((rc = calls.event_create(&e, 2 /* CU_EVENT_DISABLE_TIMING */)) != kSuccess) break;
    rc = calls.event_record(e, s);
    if (rc == kSuccess) rc = calls.stream_wait_event(copy_stream, e, 0);
    (void)calls.event_destroy(e);  // an event may be destroyed while work waits on it: the driver keeps what it needs
    if (rc != kSuccess) break;
  }
  return rc;
}

std::vector<CUstream> with_legacy(const std::vector<CUstream>& streams) {
  std::vector<CUstream> all;
  all.reserve(streams.size() + 1);
  all.push_back(kLegacyStream);
  all.insert(all.end(), streams.begin(), streams.end());
  return all;
}

}  // namespace

CUresult enqueue_cut(const SnapCalls& calls, CUstream copy_stream, const std::vector<CUstream>& streams,
                     const std::vector<Placement::Region>& regions, uint64_t shadow_base, CUevent done) {
  const std::vector<CUstream> all = with_legacy(streams);
  CUresult rc = order_after(calls, copy_stream, all);
  // Allocations placed back to back are one range of addresses (the point of the VMM calls), and
  // they are back to back in the shadow too: one copy each run, so the job waits for few calls.
  uint64_t off = 0;
  for (size_t i = 0; rc == kSuccess && i < regions.size();) {
    size_t j = i + 1;
    uint64_t n = regions[i].size;
    while (j < regions.size() && regions[j].addr == regions[i].addr + n) n += regions[j++].size;
    rc = calls.dtod_async(shadow_base + off, regions[i].addr, n, copy_stream);
    off += n;
    i = j;
  }
  if (rc == kSuccess) rc = calls.event_record(done, copy_stream);
  for (size_t i = 0; rc == kSuccess && i < all.size(); ++i) rc = calls.stream_wait_event(all[i], done, 0);
  return rc;
}

StatusOr<std::unique_ptr<CopyAhead>> CopyAhead::create(const SnapCalls& calls) {
  std::unique_ptr<CopyAhead> a(new CopyAhead(calls));
  a->events_.reserve(kBatches);
  for (size_t i = 0; i < kBatches; ++i) {
    CUevent e = nullptr;
    if (const CUresult rc = calls.event_create(&e, 2 /* CU_EVENT_DISABLE_TIMING */); rc != kSuccess)
      return Status::Unavailable(cu_error("cuEventCreate (the copies' batches)", rc));
    a->events_.push_back(e);
  }
  return a;
}

CopyAhead::~CopyAhead() {
  for (CUevent e : events_) (void)calls_.event_destroy(e);
}

std::vector<size_t> CopyAhead::copy_order(const std::vector<Placement::Region>& regions) {
  std::vector<size_t> order(regions.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (regions[a].order != regions[b].order) return regions[a].order < regions[b].order;
    return regions[a].addr < regions[b].addr;
  });
  return order;
}

CUresult CopyAhead::enqueue(CUstream copy_stream, const std::vector<CUstream>& streams,
                            const std::vector<Placement::Region>& regions, uint64_t shadow_base, CUevent done) {
  const size_t n = regions.size();
  begin_.resize(n);
  end_.resize(n);
  batch_.assign(n, 0);
  std::vector<uint64_t> off(n);
  uint64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    begin_[i] = regions[i].addr, end_[i] = regions[i].addr + regions[i].size;
    off[i] = at;
    at += regions[i].size;
  }
  CUresult rc = order_after(calls_, copy_stream, with_legacy(streams));
  const std::vector<size_t> order = copy_order(regions);
  const size_t per = std::max<size_t>(1, (n + kBatches - 1) / kBatches);
  for (size_t k = 0; rc == kSuccess && k < n;) {
    // One batch: up to `per` regions in copy order; neighbours in both orders are one copy.
    const size_t last = std::min(n, k + per);
    const int b = static_cast<int>(used_);
    while (rc == kSuccess && k < last) {
      const size_t first = order[k];
      uint64_t bytes = regions[first].size;
      batch_[first] = b;
      size_t j = k + 1;
      while (j < last && order[j] == order[j - 1] + 1 && begin_[order[j]] == end_[order[j - 1]]) {
        batch_[order[j]] = b;
        bytes += regions[order[j++]].size;
      }
      rc = calls_.dtod_async(shadow_base + off[first], regions[first].addr, bytes, copy_stream);
      k = j;
    }
    if (rc == kSuccess) rc = calls_.event_record(events_[used_], copy_stream);
    if (rc == kSuccess) ++used_;
  }
  if (rc == kSuccess) rc = calls_.event_record(done, copy_stream);
  return rc;
}

int CopyAhead::batch_of(uint64_t addr) const {
  const auto it = std::upper_bound(begin_.begin(), begin_.end(), addr);
  if (it == begin_.begin()) return -1;
  const size_t i = static_cast<size_t>(it - begin_.begin()) - 1;
  return addr < end_[i] ? batch_[i] : -1;
}

CUresult CopyAhead::wait_for(CUstream s, int batch) {
  if (batch < 0 || used_ == 0) return kSuccess;
  batch = std::min<int>(batch, static_cast<int>(used_) - 1);
  const auto key = std::make_pair(s, s == kPerThreadStream ? std::this_thread::get_id() : std::thread::id{});
  const auto it = waited_.emplace(key, -1).first;
  if (it->second >= batch) return kSuccess;  // batches complete in order: an earlier wait covers it
  // The batch's event was recorded after every batch before it, on one stream: waiting for it
  // waits for all of those too.
  const CUresult rc = calls_.stream_wait_event(s, events_[static_cast<size_t>(batch)], 0);
  if (rc == kSuccess) it->second = batch, ++waits_;
  return rc;
}

CUresult CopyAhead::before_touch(CUstream s, const uint64_t* addrs, size_t n) {
  int need = -1;
  for (size_t i = 0; i < n; ++i) need = std::max(need, batch_of(addrs[i]));
  return wait_for(s, need);
}

CUresult CopyAhead::before_range(CUstream s, uint64_t addr, uint64_t len) {
  if (len == 0) return kSuccess;
  int need = -1;
  auto it = std::upper_bound(begin_.begin(), begin_.end(), addr);
  size_t i = it == begin_.begin() ? 0 : static_cast<size_t>(it - begin_.begin()) - 1;
  for (; i < begin_.size() && begin_[i] < addr + len; ++i)
    if (end_[i] > addr) need = std::max(need, batch_[i]);
  return wait_for(s, need);
}

CUresult CopyAhead::before_all(CUstream s) { return wait_for(s, static_cast<int>(used_) - 1); }

}  // namespace pos::driver
