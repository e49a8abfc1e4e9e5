// snapshot.cc — the cut of a GPU-only checkpoint of an in-process job: the shadow it copies into,
// the streams it orders itself after, and the device-side order of events, copies and waits.
#include "remoting/driver/snapshot.h"

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

CUresult enqueue_cut(const SnapCalls& calls, CUstream copy_stream, const std::vector<CUstream>& streams,
                     const std::vector<Placement::Region>& regions, uint64_t shadow_base, CUevent done) {
  std::vector<CUstream> all;
  all.reserve(streams.size() + 1);
  all.push_back(kLegacyStream);
  all.insert(all.end(), streams.begin(), streams.end());
  // One event per stream, each recorded where that stream's work stands now.
  std::vector<CUevent> marks;
  CUresult rc = kSuccess;
  for (CUstream s : all) {
    CUevent e = nullptr;
    if ((rc = calls.event_create(&e, 2 /* CU_EVENT_DISABLE_TIMING */)) != kSuccess) break;
    marks.push_back(e);
    if ((rc = calls.event_record(e, s)) != kSuccess) break;
    if ((rc = calls.stream_wait_event(copy_stream, e, 0)) != kSuccess) break;
  }
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
  // An event may be destroyed while work waits on it: the driver keeps what it needs.
  for (CUevent e : marks) (void)calls.event_destroy(e);
  return rc;
}

}  // namespace pos::driver
