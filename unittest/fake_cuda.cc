// fake_cuda.cc — a stand-in for libcuda.so.1 with a handful of entry points, for driver_hooks_test:
// libpos_driver loads it as "the real driver" (POS_REAL_LIBCUDA) and the test's probe program links it.
//
// Each function counts its runs (fake_calls), so a test can tell a call that reached the driver
// from one that did not. cuGetProcAddress answers as the real driver does (base name + version +
// per-thread flag → versioned function); with FAKE_CUDA_INDIRECT=1 it hands out internal copies
// instead of the exported functions, as a driver may, to exercise the hooks' name-based matching.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "unittest/fake_cuda.h"

namespace {
std::mutex mu;
std::map<std::string, int>& counts() {
  static std::map<std::string, int> m;
  return m;
}
void bump(const char* name) {
  std::lock_guard<std::mutex> lk(mu);
  ++counts()[name];
}
unsigned long long next_address = 0x7f0000000000ull;

// Stream waits on a memory word (cuStreamWaitValue32, "greater or equal"): the fake runs work at
// once, so work enqueued after a wait runs only once every pending wait is satisfied, a stand-in
// for stream order (every stream counts as one).
std::vector<std::pair<const volatile uint32_t*, uint32_t>> waits;  // under mu
void drain_waits() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu);
      std::erase_if(waits, [](const auto& w) { return static_cast<int32_t>(*w.first - w.second) >= 0; });
      if (waits.empty()) return;
    }
    usleep(1000);
  }
}
}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT int fake_calls(const char* name) {
  std::lock_guard<std::mutex> lk(mu);
  auto it = counts().find(name);
  return it == counts().end() ? 0 : it->second;
}

FAKE_EXPORT int cuMemAlloc_v2(unsigned long long* p, size_t n) {
  bump("cuMemAlloc_v2");
  std::lock_guard<std::mutex> lk(mu);
  *p = next_address;
  next_address += (n + 0xfffff) & ~0xfffffull;
  return 0;
}
FAKE_EXPORT int cuMemFree_v2(unsigned long long) {
  bump("cuMemFree_v2");
  return 0;
}
// Each fake GPU has 80 GiB, all of it free (what a job's memory limit narrows).
constexpr unsigned long long kFakeGpuBytes = 80ull << 30;
FAKE_EXPORT int cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  bump("cuMemGetInfo_v2");
  *free_bytes = kFakeGpuBytes, *total_bytes = kFakeGpuBytes;
  return 0;
}
FAKE_EXPORT int cuDeviceTotalMem_v2(size_t* bytes, int) {
  *bytes = kFakeGpuBytes;
  return 0;
}
// The driver's own pool: addresses of its own (not through the exported cuMemAlloc_v2, which a
// preloaded runtime would take for the job's own call).
FAKE_EXPORT int cuMemAllocAsync(unsigned long long* p, size_t n, void*) {
  bump("cuMemAllocAsync");
  std::lock_guard<std::mutex> lk(mu);
  *p = next_address;
  next_address += (n + 0xfffff) & ~0xfffffull;
  return 0;
}
FAKE_EXPORT int cuMemFreeAsync(unsigned long long, void*) {
  bump("cuMemFreeAsync");
  return 0;
}
namespace {
int run_kernel(void* f, void** params, void** extra);  // below, with the memory it writes
}
FAKE_EXPORT int cuLaunchKernel(void* f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                               void** params, void** extra) {
  bump("cuLaunchKernel");
  drain_waits();
  return run_kernel(f, params, extra);
}
FAKE_EXPORT int cuLaunchKernel_ptsz(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                                    void**, void**) {
  bump("cuLaunchKernel_ptsz");
  return 0;
}
FAKE_EXPORT int cuCtxGetDevice(int* d) {
  bump("cuCtxGetDevice");
  *d = 0;
  return 0;
}
// Primary contexts are counted as the driver does: the first retain of a device's makes it, the
// last release lets it go; with FAKE_CUDA_STATE both are logged ("context PID DEV", "context-gone
// PID DEV"), so that a test can count the contexts a process made.
namespace {
int primary_refs[64];
void log_line(const std::string& line);
}  // namespace
FAKE_EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  bump("cuDevicePrimaryCtxRetain");
  if (dev < 0 || dev >= 64) return 101;
  bool made = false;
  {
    std::lock_guard<std::mutex> lk(mu);
    made = primary_refs[dev]++ == 0;
  }
  if (made) log_line("context " + std::to_string(::getpid()) + " " + std::to_string(dev));
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + dev));
  return 0;
}
// Green contexts (POS_SM_LIMIT, sm_limit.h): a GPU of 132 SMs split in groups of 8, as an H200's;
// FAKE_CUDA_NO_GREEN=1 makes cuGreenCtxCreate fail as a driver without them would.
namespace {
struct FakeResource {  // CUdevResource of CUDA 13.0: type, 92 bytes of padding, the SM member
  int type;
  unsigned char padding[92];
  unsigned sm_count, min_partition, alignment;
  unsigned char rest[36];
};
static_assert(sizeof(FakeResource) == 144);
constexpr unsigned kFakeSms = 132;
}  // namespace
FAKE_EXPORT int cuDeviceGetDevResource(int, FakeResource* r, int type) {
  bump("cuDeviceGetDevResource");
  if (type != 1) return 1;
  std::memset(r, 0, sizeof(*r));
  r->type = 1, r->sm_count = kFakeSms, r->min_partition = 8, r->alignment = 8;
  return 0;
}
FAKE_EXPORT int cuDevSmResourceSplitByCount(FakeResource* result, unsigned* groups, const FakeResource* input,
                                            FakeResource* rest, unsigned, unsigned min_count) {
  bump("cuDevSmResourceSplitByCount");
  const unsigned size = (min_count + 7) / 8 * 8;
  if (input == nullptr || input->type != 1 || groups == nullptr || size > input->sm_count) {
    if (groups != nullptr) *groups = 0;
    return 914;  // CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
  }
  *groups = 1;
  *result = *input;
  result->sm_count = size;
  if (rest != nullptr) *rest = *input, rest->sm_count = input->sm_count - size;
  return 0;
}
FAKE_EXPORT int cuDevResourceGenerateDesc(void** desc, FakeResource* r, unsigned n) {
  bump("cuDevResourceGenerateDesc");
  if (n != 1 || r == nullptr) return 1;
  *desc = new FakeResource(*r);  // never freed, as the driver keeps its descriptors
  return 0;
}
FAKE_EXPORT int cuGreenCtxCreate(void** green, void* desc, int dev, unsigned flags) {
  bump("cuGreenCtxCreate");
  if (const char* no = std::getenv("FAKE_CUDA_NO_GREEN"); no != nullptr && *no == '1') return 801;
  if (desc == nullptr || flags != 1) return 1;  // POS asks for the green context's own default stream
  *green = reinterpret_cast<void*>(static_cast<uintptr_t>(0x6000 + dev));
  return 0;
}
FAKE_EXPORT int cuCtxFromGreenCtx(void** ctx, void* green) {
  bump("cuCtxFromGreenCtx");
  *ctx = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(green) + 0x1000);  // 0x7000 + dev
  return 0;
}
FAKE_EXPORT int cuDeviceGetAttribute(int* v, int attrib, int) {
  bump("cuDeviceGetAttribute");
  *v = attrib == 16 ? static_cast<int>(kFakeSms) : 1024;
  return 0;
}
namespace {
std::map<void*, bool> capturing;  // under mu: streams in a capture (cuStreamBeginCapture .. End)
}
FAKE_EXPORT int cuStreamBeginCapture_v2(void* s, int) {
  bump("cuStreamBeginCapture_v2");
  std::lock_guard<std::mutex> lk(mu);
  capturing[s] = true;
  return 0;
}
FAKE_EXPORT int cuStreamEndCapture(void* s, void** graph) {
  std::lock_guard<std::mutex> lk(mu);
  capturing.erase(s);
  if (graph != nullptr) *graph = nullptr;
  return 0;
}
FAKE_EXPORT int cuStreamIsCapturing(void* s, int* status) {
  std::lock_guard<std::mutex> lk(mu);
  *status = capturing.count(s) != 0 ? 1 : 0;  // CU_STREAM_CAPTURE_STATUS_ACTIVE : NONE
  return 0;
}
// CUDA graphs of kernel nodes (FakeKernels): a graph is a list of nodes, each holding its kernel and
// a copy of its parameter values; an executable graph copies the list at instantiation, and its
// launch runs each node's kernel at once, after the pending stream waits.
namespace {
struct FakeNode {
  void* func = nullptr;
  std::vector<std::vector<unsigned char>> values;
  std::vector<void*> ptrs;  // into values: what cuGraphKernelNodeGetParams_v2 hands out
  void set(void* f, void** params) {
    func = f;
    values.clear();
    const auto* k = static_cast<const FakeKernel*>(f);
    for (uint32_t i = 0; k != nullptr && params != nullptr && i < k->n && i < 8; ++i) {
      const auto* b = static_cast<const unsigned char*>(params[i]);
      values.emplace_back(b, b + k->size[i]);
    }
    point();
  }
  void point() {
    ptrs.clear();
    for (auto& v : values) ptrs.push_back(v.data());
  }
};
struct FakeGraph {
  std::vector<FakeNode*> nodes;
};
struct FakeExec {
  std::vector<std::pair<FakeNode*, FakeNode>> nodes;  // (the graph's node, the executable's copy)
};
int run_kernel(void* f, void** params, void** extra);
}  // namespace
FAKE_EXPORT int cuGraphCreate(void** g, unsigned) {
  *g = new FakeGraph;
  return 0;
}
FAKE_EXPORT int cuGraphAddKernelNode_v2(void** node, void* g, const void*, size_t, const FakeKernelNodeParams* p) {
  if (g == nullptr || p == nullptr) return 1;
  auto* n = new FakeNode;
  n->set(p->func, p->kernel_params);
  static_cast<FakeGraph*>(g)->nodes.push_back(n);
  *node = n;
  return 0;
}
FAKE_EXPORT int cuGraphGetNodes(void* g, void** nodes, size_t* n) {
  const auto& v = static_cast<FakeGraph*>(g)->nodes;
  if (nodes == nullptr) {
    *n = v.size();
    return 0;
  }
  for (size_t i = 0; i < *n && i < v.size(); ++i) nodes[i] = v[i];
  *n = std::min(*n, v.size());
  return 0;
}
FAKE_EXPORT int cuGraphNodeGetType(void*, int* type) {
  *type = 0;  // CU_GRAPH_NODE_TYPE_KERNEL: the only kind the fake makes
  return 0;
}
FAKE_EXPORT int cuGraphKernelNodeGetParams_v2(void* node, FakeKernelNodeParams* p) {
  auto* n = static_cast<FakeNode*>(node);
  *p = FakeKernelNodeParams{};
  p->func = n->func;
  p->kernel_params = n->ptrs.data();
  return 0;
}
// Node kinds the fake never makes: asked of no node.
FAKE_EXPORT int cuGraphMemcpyNodeGetParams(void*, void*) { return 1; }
FAKE_EXPORT int cuGraphMemsetNodeGetParams(void*, void*) { return 1; }
FAKE_EXPORT int cuGraphChildGraphNodeGetGraph(void*, void**) { return 1; }
FAKE_EXPORT int cuGraphInstantiateWithFlags(void** e, void* g, unsigned long long) {
  bump("cuGraphInstantiateWithFlags");
  auto* x = new FakeExec;
  for (FakeNode* n : static_cast<FakeGraph*>(g)->nodes) x->nodes.emplace_back(n, *n);
  for (auto& [from, copy] : x->nodes) copy.point();
  *e = x;
  return 0;
}
FAKE_EXPORT int cuGraphExecKernelNodeSetParams_v2(void* e, void* node, const FakeKernelNodeParams* p) {
  bump("cuGraphExecKernelNodeSetParams_v2");
  for (auto& [from, copy] : static_cast<FakeExec*>(e)->nodes)
    if (from == node) {
      copy.set(p->func, p->kernel_params);
      return 0;
    }
  return 1;
}
FAKE_EXPORT int cuGraphExecDestroy(void* e) {
  bump("cuGraphExecDestroy");
  delete static_cast<FakeExec*>(e);
  return 0;
}
FAKE_EXPORT int cuGraphLaunch(void* e, void*) {
  bump("cuGraphLaunch");
  if (e == nullptr) return 0;
  drain_waits();
  int rc = 0;
  for (auto& [from, copy] : static_cast<FakeExec*>(e)->nodes) rc |= run_kernel(copy.func, copy.ptrs.data(), nullptr);
  return rc;
}
// An IPC handle is 64 bytes passed by value: the fake fills one with a pattern and checks it
// arrives whole, so a hook that forwarded it with the wrong ABI fails the call.
struct IpcHandle {
  unsigned char bytes[64];
};
FAKE_EXPORT int cuIpcGetMemHandle(IpcHandle* h, unsigned long long) {
  bump("cuIpcGetMemHandle");
  for (int i = 0; i < 64; ++i) h->bytes[i] = static_cast<unsigned char>(i * 3 + 1);
  return 0;
}
FAKE_EXPORT int cuIpcOpenMemHandle_v2(unsigned long long* p, IpcHandle h, unsigned int) {
  bump("cuIpcOpenMemHandle_v2");
  for (int i = 0; i < 64; ++i)
    if (h.bytes[i] != static_cast<unsigned char>(i * 3 + 1)) return 1;  // CUDA_ERROR_INVALID_VALUE
  *p = 0x7e0000000000ull;
  return 0;
}
// Virtual memory management, checked as the driver would: a mapping must lie inside a reserved
// range, at the granularity, over nothing mapped; an unmap must name a whole mapping. With
// FAKE_CUDA_VA_MOVE=1 a reservation ignores the address asked for (someone else holds it).
namespace {
constexpr unsigned long long kGranule = 2ull << 20;
std::map<unsigned long long, unsigned long long> reserved, mapped;  // start → size, under mu
std::map<unsigned long long, unsigned long long> mapped_handle;  // mapping start → its handle, under mu
std::map<unsigned long long, int> handles;  // live handle → references (its own, and each mapping's), under mu
// Each handle's memory is a memfd, so that another process can import it (cuMemExportToShareableHandle
// gives a duplicate descriptor) and see the same bytes, as with a GPU's shareable allocations.
std::map<unsigned long long, int> handle_fd;  // under mu
void drop_handle(std::map<unsigned long long, int>::iterator it) {  // under mu: its last reference went
  auto f = handle_fd.find(it->first);
  if (f != handle_fd.end()) {
    ::close(f->second);
    handle_fd.erase(f);
  }
  handles.erase(it);
}
unsigned long long next_handle = 1;
}  // namespace
FAKE_EXPORT int cuCtxSynchronize() {
  bump("cuCtxSynchronize");
  drain_waits();
  return 0;
}
FAKE_EXPORT int cuMemGetAllocationGranularity(size_t* g, const void*, int) {
  *g = kGranule;
  return 0;
}
FAKE_EXPORT int cuMemAddressReserve(unsigned long long* p, size_t size, size_t, unsigned long long addr,
                                    unsigned long long) {
  bump("cuMemAddressReserve");
  const char* move = std::getenv("FAKE_CUDA_VA_MOVE");
  std::lock_guard<std::mutex> lk(mu);
  // Where the caller asked, else the next free place of a range of its own (as the driver does).
  static unsigned long long next_free = 0x7a0000000000ull;
  if ((move != nullptr && std::strcmp(move, "1") == 0) || addr == 0) {
    *p = next_free;
    next_free += (size + kGranule - 1) / kGranule * kGranule;
  } else {
    *p = addr;
  }
  reserved[*p] = size;
  return 0;
}
FAKE_EXPORT int cuMemAddressFree(unsigned long long p, size_t) {
  bump("cuMemAddressFree");
  std::lock_guard<std::mutex> lk(mu);
  return reserved.erase(p) == 1 ? 0 : 1;
}
namespace {
void log_line(const std::string& line);
}
FAKE_EXPORT int cuMemCreate(unsigned long long* h, size_t size, const void* prop, unsigned long long) {
  bump("cuMemCreate");
  // CUmemAllocationProp: type, requestedHandleTypes, location {type, id}: the device is the 4th int.
  if (prop != nullptr)
    log_line("create " + std::to_string(::getpid()) + " " + std::to_string(static_cast<const int*>(prop)[3]));
  if (size % kGranule != 0) return 1;
  const int fd = ::memfd_create("fake-cuda-memory", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) ::close(fd);
    return 2;
  }
  std::lock_guard<std::mutex> lk(mu);
  *h = next_handle++;
  handles[*h] = 1;
  handle_fd[*h] = fd;
  return 0;
}
FAKE_EXPORT int cuMemExportToShareableHandle(void* out, unsigned long long h, int type, unsigned long long) {
  bump("cuMemExportToShareableHandle");
  std::lock_guard<std::mutex> lk(mu);
  auto it = handles.find(h);
  if (type != 1 || it == handles.end() || it->second <= 0 || std::getenv("FAKE_CUDA_NO_EXPORT") != nullptr) return 1;
  const int fd = ::fcntl(handle_fd[h], F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return 2;
  *static_cast<int*>(out) = fd;
  return 0;
}
FAKE_EXPORT int cuMemImportFromShareableHandle(unsigned long long* h, void* handle, int type) {
  bump("cuMemImportFromShareableHandle");
  const int fd = ::fcntl(static_cast<int>(reinterpret_cast<uintptr_t>(handle)), F_DUPFD_CLOEXEC, 0);
  if (type != 1 || fd < 0) {
    if (fd >= 0) ::close(fd);
    return 1;
  }
  std::lock_guard<std::mutex> lk(mu);
  *h = next_handle++;
  handles[*h] = 1;
  handle_fd[*h] = fd;
  return 0;
}
// As the driver: a handle is valid until released; the memory lives while a mapping holds it.
FAKE_EXPORT int cuMemRelease(unsigned long long h) {
  bump("cuMemRelease");
  std::lock_guard<std::mutex> lk(mu);
  auto it = handles.find(h);
  if (it == handles.end() || it->second <= 0) return 1;
  it->second = -it->second + 1;  // released: negative counts the mappings still holding it
  if (it->second == 0) drop_handle(it);
  return 0;
}
FAKE_EXPORT int cuMemMap(unsigned long long p, size_t size, size_t, unsigned long long h, unsigned long long) {
  bump("cuMemMap");
  std::lock_guard<std::mutex> lk(mu);
  if (handles.find(h) == handles.end() || handles[h] <= 0) return 1;  // a released or unknown handle
  if (p % kGranule != 0 || size % kGranule != 0) return 1;
  bool inside = false;
  for (const auto& [at, n] : reserved) inside = inside || (p >= at && p + size <= at + n);
  for (const auto& [at, n] : mapped)
    if (p < at + n && at < p + size) return 1;  // overlaps a mapping
  if (!inside) return 1;
  // Backed by host memory at the very address, so that copies through it are plain memcpy and a
  // test can see bytes survive an unmap and a remap (new memory: zeros until loaded).
  void* at = ::mmap(reinterpret_cast<void*>(p), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                    handle_fd[h], 0);
  if (at != reinterpret_cast<void*>(p)) {
    if (at != MAP_FAILED) ::munmap(at, size);
    return 2;  // out of memory, as the driver would say
  }
  mapped[p] = size;
  mapped_handle[p] = h;
  ++handles[h];
  return 0;
}
FAKE_EXPORT int cuMemUnmap(unsigned long long p, size_t size) {
  bump("cuMemUnmap");
  std::lock_guard<std::mutex> lk(mu);
  auto it = mapped.find(p);
  if (it == mapped.end() || it->second != size) return 1;
  ::munmap(reinterpret_cast<void*>(p), size);
  mapped.erase(it);
  auto h = handles.find(mapped_handle[p]);
  if (h != handles.end()) {
    h->second += h->second > 0 ? -1 : 1;  // one reference fewer, released or not
    if (h->second == 0) drop_handle(h);
  }
  mapped_handle.erase(p);
  return 0;
}
namespace {
// A copy touching device memory must lie inside mapped memory: one mapping, or mappings back to
// back (else CUDA_ERROR_INVALID_VALUE, as a copy to memory that was unmapped would fail on a GPU).
bool in_mapping(unsigned long long p, size_t n) {
  std::lock_guard<std::mutex> lk(mu);
  auto it = mapped.upper_bound(p);
  if (it == mapped.begin()) return false;
  --it;
  if (p >= it->first + it->second) return false;
  unsigned long long end = it->first + it->second;
  while (p + n > end) {
    if (++it == mapped.end() || it->first != end) return false;
    end += it->second;
  }
  return true;
}
}  // namespace
namespace {
// A FakeKernel's launch: one 4 KiB page at the address it is given set to its value byte, "on the
// device" at once (the fake runs everything synchronously). A handle that is no FakeKernel, or one
// that writes nothing, does nothing.
int run_kernel(void* f, void** params, void** extra) {
  const auto* k = static_cast<const FakeKernel*>(f);
  if (k == nullptr || (k->magic != kFakeFunc && k->magic != kFakeKernel && k->magic != 0) || k->ptr_param < 0) return 0;
  const unsigned char* buf = nullptr;
  if (extra != nullptr && extra[0] == reinterpret_cast<void*>(1)) buf = static_cast<const unsigned char*>(extra[1]);
  unsigned long long dst = 0;
  unsigned char v = 0;
  if (buf != nullptr) {
    std::memcpy(&dst, buf + k->ptr_at, 8);
    v = buf[k->val_at];
  } else if (params != nullptr) {
    std::memcpy(&dst, static_cast<const unsigned char*>(params[k->ptr_param]) + k->ptr_at, 8);
    v = static_cast<const unsigned char*>(params[k->val_param])[k->val_at];
  } else {
    return 1;
  }
  if (!in_mapping(dst, 4096)) return 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
  std::memset(reinterpret_cast<void*>(dst), v, 4096);
  return 0;
}
int param_info(const void* f, uint32_t magic, size_t i, size_t* off, size_t* size) {
  const auto* k = static_cast<const FakeKernel*>(f);
  if (k == nullptr || k->magic != magic) return 400;  // CUDA_ERROR_INVALID_HANDLE
  if (i >= k->n) return 1;                            // CUDA_ERROR_INVALID_VALUE: past the last
  *off = k->off[i];
  *size = k->size[i];
  return 0;
}
}  // namespace
FAKE_EXPORT int cuFuncGetParamInfo(void* f, size_t i, size_t* off, size_t* size) {
  bump("cuFuncGetParamInfo");
  return param_info(f, kFakeFunc, i, off, size);
}
FAKE_EXPORT int cuKernelGetParamInfo(void* k, size_t i, size_t* off, size_t* size) {
  bump("cuKernelGetParamInfo");
  return param_info(k, kFakeKernel, i, off, size);
}
// Events and stream waits: the fake runs every call at once, so an event is always complete and a
// wait has nothing to wait for; they are counted so a test sees a cut's order was asked for.
FAKE_EXPORT int cuEventCreate(void** e, unsigned) {
  bump("cuEventCreate");
  *e = std::malloc(1);
  return 0;
}
FAKE_EXPORT int cuEventDestroy_v2(void* e) {
  bump("cuEventDestroy_v2");
  std::free(e);
  return 0;
}
FAKE_EXPORT int cuEventRecord(void*, void*) {
  bump("cuEventRecord");
  return 0;
}
FAKE_EXPORT int cuEventQuery(void*) {
  bump("cuEventQuery");
  return 0;  // complete: the fake runs every call at once
}
// Each device's default stream-ordered pool, and its current one (the default unless set).
FAKE_EXPORT int cuDeviceGetDefaultMemPool(void** pool, int dev) {
  *pool = reinterpret_cast<void*>(static_cast<uintptr_t>(0x9000 + dev));
  return 0;
}
FAKE_EXPORT int cuDeviceGetMemPool(void** pool, int dev) {
  const char* other = std::getenv("FAKE_CUDA_OTHER_POOL");  // 1: a pool the job made is current
  *pool = reinterpret_cast<void*>(static_cast<uintptr_t>((other != nullptr && *other == '1' ? 0xa000 : 0x9000) + dev));
  return 0;
}
FAKE_EXPORT int cuMemPoolTrimTo(void*, size_t) {
  bump("cuMemPoolTrimTo");
  return 0;
}
FAKE_EXPORT int cuEventSynchronize(void*) {
  bump("cuEventSynchronize");
  // FAKE_CUDA_EVENT_SYNC_MS: each wait takes this long, as a device still copying would (a test's
  // window to call in while a checkpoint's copies "run").
  if (const char* ms = std::getenv("FAKE_CUDA_EVENT_SYNC_MS"); ms != nullptr) ::usleep(static_cast<useconds_t>(std::atoi(ms)) * 1000);
  drain_waits();
  return 0;
}
FAKE_EXPORT int cuStreamWaitEvent(void*, void*, unsigned) {
  bump("cuStreamWaitEvent");
  return 0;
}
FAKE_EXPORT int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t n, void*) {
  bump("cuMemcpyDtoDAsync_v2");
  drain_waits();
  if (!in_mapping(dst, n) || !in_mapping(src, n)) return 1;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return 0;
}
FAKE_EXPORT int cuMemsetD8_v2(unsigned long long dst, unsigned char v, size_t n) {
  bump("cuMemsetD8_v2");
  drain_waits();
  if (!in_mapping(dst, n)) return 1;
  std::memset(reinterpret_cast<void*>(dst), v, n);
  return 0;
}
// The current context of the calling thread, as the driver keeps it; fake_set_current sets it the
// way the CUDA runtime does, without the exported (hooked) cuCtxSetCurrent.
thread_local void* t_current_ctx = nullptr;
FAKE_EXPORT int cuCtxSetCurrent(void* ctx) {
  t_current_ctx = ctx;
  return 0;
}
FAKE_EXPORT int cuCtxGetCurrent(void** ctx) {
  *ctx = t_current_ctx;
  return 0;
}
FAKE_EXPORT void fake_set_current(void* ctx) { t_current_ctx = ctx; }
FAKE_EXPORT int fake_primary_refs(int dev) {
  std::lock_guard<std::mutex> lk(mu);
  return dev >= 0 && dev < 64 ? primary_refs[dev] : -1;
}
FAKE_EXPORT int cuDevicePrimaryCtxRelease_v2(int dev) {
  if (dev < 0 || dev >= 64) return 101;
  bool gone = false;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (primary_refs[dev] == 0) return 201;  // CUDA_ERROR_INVALID_CONTEXT: nothing retained
    gone = --primary_refs[dev] == 0;
  }
  if (gone) log_line("context-gone " + std::to_string(::getpid()) + " " + std::to_string(dev));
  return 0;
}
FAKE_EXPORT int cuStreamCreate(void** s, unsigned) {
  *s = reinterpret_cast<void*>(0x5);
  return 0;
}
FAKE_EXPORT int cuStreamDestroy_v2(void*) { return 0; }
FAKE_EXPORT int cuStreamSynchronize(void*) {
  drain_waits();
  return 0;
}
// FAKE_CUDA_NO_HOST_REGISTER=1: host memory cannot be registered (CUDA_ERROR_NOT_SUPPORTED).
FAKE_EXPORT int cuMemHostRegister_v2(void* p, size_t n, unsigned) {
  bump("cuMemHostRegister_v2");
  if (const char* e = std::getenv("FAKE_CUDA_NO_HOST_REGISTER"); e != nullptr && e[0] == '1') return 801;
  return p != nullptr && n != 0 ? 0 : 1;
}
FAKE_EXPORT int cuMemHostGetDevicePointer_v2(unsigned long long* d, void* p, unsigned) {
  *d = reinterpret_cast<uintptr_t>(p);
  return 0;
}
FAKE_EXPORT int cuMemHostUnregister(void*) {
  bump("cuMemHostUnregister");
  return 0;
}
// FAKE_CUDA_NO_STREAM_WAIT=1: a driver without stream memory operations (CUDA_ERROR_NOT_SUPPORTED).
FAKE_EXPORT int cuStreamWaitValue32_v2(void*, unsigned long long addr, uint32_t value, unsigned flags) {
  bump("cuStreamWaitValue32_v2");
  if (const char* e = std::getenv("FAKE_CUDA_NO_STREAM_WAIT"); e != nullptr && e[0] == '1') return 801;
  if (flags != 0 || addr == 0) return 1;
  std::lock_guard<std::mutex> lk(mu);
  waits.emplace_back(reinterpret_cast<const volatile uint32_t*>(addr), value);
  return 0;
}
FAKE_EXPORT int cuMemHostAlloc(void** p, size_t n, unsigned) {
  bump("cuMemHostAlloc");
  *p = std::malloc(n);
  return *p != nullptr ? 0 : 2;
}
FAKE_EXPORT int cuMemFreeHost(void* p) {
  std::free(p);
  return 0;
}
FAKE_EXPORT int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void*) {
  bump("cuMemcpyDtoHAsync_v2");
  drain_waits();
  if (!in_mapping(src, n)) return 1;
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return 0;
}
FAKE_EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void*) {
  bump("cuMemcpyHtoDAsync_v2");
  drain_waits();
  if (!in_mapping(dst, n)) return 1;
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return 0;
}
// FAKE_CUDA_FAIL_DTOD=1: device-to-device copies fail (a GPU pair without peer access, say).
FAKE_EXPORT int cuMemcpyDtoD_v2(unsigned long long dst, unsigned long long src, size_t n) {
  bump("cuMemcpyDtoD_v2");
  if (const char* e = std::getenv("FAKE_CUDA_FAIL_DTOD"); e != nullptr && e[0] == '1') return 1;
  drain_waits();
  if (!in_mapping(dst, n) || !in_mapping(src, n)) return 1;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return 0;
}
FAKE_EXPORT int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t n) { return cuMemcpyDtoHAsync_v2(dst, src, n, nullptr); }
FAKE_EXPORT int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t n) { return cuMemcpyHtoDAsync_v2(dst, src, n, nullptr); }
FAKE_EXPORT int cuMemSetAccess(unsigned long long, size_t, const void*, size_t count) {
  bump("cuMemSetAccess");
  return count == 1 ? 0 : 1;
}
FAKE_EXPORT int fake_live_handles() {
  std::lock_guard<std::mutex> lk(mu);
  return static_cast<int>(handles.size());
}
FAKE_EXPORT int fake_mapped_bytes() {
  std::lock_guard<std::mutex> lk(mu);
  unsigned long long n = 0;
  for (const auto& m : mapped) n += m.second;
  return static_cast<int>(n >> 20);  // MiB
}
// The calls pos-cli makes on its own side (ckpt/driver_checkpoint.cc). The fake holds no driver
// state in the job to take, so NVIDIA's process checkpoint is a no-op that succeeds: what a test
// sees is POS's own save, unmap, CRIU and reload around it.
FAKE_EXPORT int cuInit(unsigned) { return 0; }
FAKE_EXPORT int cuGetErrorName(int, const char** name) {
  *name = "FAKE_ERROR";
  return 0;
}
FAKE_EXPORT int cuCheckpointProcessGetState(int, int* state) {
  *state = 0;  // running
  return 0;
}
FAKE_EXPORT int cuCheckpointProcessLock(int, void*) { return 0; }
FAKE_EXPORT int cuCheckpointProcessCheckpoint(int, void*) { return 0; }
FAKE_EXPORT int cuCheckpointProcessUnlock(int, void*) { return 0; }

// GPUs: FAKE_CUDA_GPUS of them (default 1), named by FAKE_CUDA_GPU_NAMES (comma-separated, default
// "Fake GPU"), GPU i's UUID GPU-face0000-0000-0000-0000-0000000000ii. A restore onto other GPUs
// (CUDA 13's gpuPairs) is checked as the driver documents it (every GPU the job saw, old → new, no
// new GPU twice) and, with FAKE_CUDA_STATE=DIR, moves the job as the driver does: its ordinals keep
// their numbers and name the new GPUs, which the restored job's fake (this library, loaded in it)
// reads from DIR/remap-PID. FAKE_CUDA_REMAP_IGNORED=1: a driver that accepts the pairs but leaves
// the job where it was. DIR/log gets one line per restore and per cuMemCreate (pid, device).
namespace {
int gpu_count() {
  const char* n = std::getenv("FAKE_CUDA_GPUS");
  const int v = n != nullptr ? std::atoi(n) : 1;
  return v > 0 && v < 100 ? v : 1;
}
std::string state_file(const std::string& name) {
  const char* d = std::getenv("FAKE_CUDA_STATE");
  return d != nullptr && *d != '\0' ? std::string(d) + "/" + name : std::string();
}
void log_line(const std::string& line) {
  const std::string f = state_file("log");
  if (f.empty()) return;
  if (FILE* out = std::fopen(f.c_str(), "a")) {
    std::fprintf(out, "%s\n", line.c_str());
    std::fclose(out);
  }
}
// The physical GPU ordinal d of process `pid` names now (DIR/remap-PID: one "d gpu" line each).
int physical(int pid, int d) {
  const std::string f = state_file("remap-" + std::to_string(pid));
  int at = d;
  if (FILE* in = f.empty() ? nullptr : std::fopen(f.c_str(), "r")) {
    int a = 0, b = 0;
    while (std::fscanf(in, "%d %d", &a, &b) == 2)
      if (a == d) at = b;
    std::fclose(in);
  }
  return at;
}
int gpu_of_uuid(const unsigned char* u) {
  static const unsigned char head[15] = {0xfa, 0xce};
  if (std::memcmp(u, head, 15) != 0 || u[15] >= gpu_count()) return -1;
  return u[15];
}
}  // namespace
FAKE_EXPORT int cuDeviceGetCount(int* n) {
  *n = gpu_count();
  return 0;
}
FAKE_EXPORT int cuDeviceGet(int* d, int ordinal) {
  if (ordinal < 0 || ordinal >= gpu_count()) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *d = ordinal;
  return 0;
}
FAKE_EXPORT int cuDeviceGetUuid_v2(unsigned char* u, int d) {
  if (d < 0 || d >= gpu_count()) return 101;
  std::memset(u, 0, 16);
  u[0] = 0xfa, u[1] = 0xce;
  u[15] = static_cast<unsigned char>(physical(static_cast<int>(::getpid()), d));
  return 0;
}
FAKE_EXPORT int cuDeviceGetName(char* name, int len, int d) {
  if (d < 0 || d >= gpu_count() || len <= 0) return 101;
  const char* names = std::getenv("FAKE_CUDA_GPU_NAMES");
  std::string all = names != nullptr ? names : "", one = "Fake GPU";
  for (int i = 0, at = 0; !all.empty(); ++i) {
    const size_t comma = all.find(',', static_cast<size_t>(at));
    if (i == physical(static_cast<int>(::getpid()), d)) {
      const size_t from = static_cast<size_t>(at);
      one = all.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
      break;
    }
    if (comma == std::string::npos) break;
    at = static_cast<int>(comma) + 1;
  }
  std::snprintf(name, static_cast<size_t>(len), "%s", one.c_str());
  return 0;
}
struct FakeRestoreArgs {  // CUcheckpointRestoreArgs
  const unsigned char* pairs;  // 32 bytes each: old UUID, new UUID
  unsigned count;
};
FAKE_EXPORT int cuCheckpointProcessRestore(int pid, void* args) {
  const FakeRestoreArgs* a = static_cast<const FakeRestoreArgs*>(args);
  if (a == nullptr || a->count == 0) {
    log_line("restore " + std::to_string(pid));
    return 0;
  }
  const int n = gpu_count();
  if (a->pairs == nullptr || static_cast<int>(a->count) != n) return 1;  // CUDA_ERROR_INVALID_VALUE
  std::vector<int> to(static_cast<size_t>(n), -1);
  std::vector<bool> taken(static_cast<size_t>(n), false);
  std::string line = "restore " + std::to_string(pid);
  for (unsigned i = 0; i < a->count; ++i) {
    const int from = gpu_of_uuid(a->pairs + 32 * i), into = gpu_of_uuid(a->pairs + 32 * i + 16);
    if (from < 0 || into < 0 || to[static_cast<size_t>(from)] >= 0 || taken[static_cast<size_t>(into)]) return 1;
    to[static_cast<size_t>(from)] = into;
    taken[static_cast<size_t>(into)] = true;
    line += " " + std::to_string(from) + "->" + std::to_string(into);
  }
  log_line(line);
  const char* ignored = std::getenv("FAKE_CUDA_REMAP_IGNORED");
  const std::string f = state_file("remap-" + std::to_string(pid));
  if (f.empty() || (ignored != nullptr && std::strcmp(ignored, "1") == 0)) return 0;
  std::string text;
  for (int d = 0; d < n; ++d)
    text += std::to_string(d) + " " + std::to_string(to[static_cast<size_t>(physical(pid, d))]) + "\n";
  if (FILE* out = std::fopen(f.c_str(), "w")) {
    std::fputs(text.c_str(), out);
    std::fclose(out);
  }
  return 0;
}
// Not a driver function: the RTLD_NEXT check of driver_hooks_test looks it up from the probe.
FAKE_EXPORT int probe_symbol() { return 2; }

namespace {
// The internal copies a driver may hand out through cuGetProcAddress instead of its exports.
int alloc_internal(unsigned long long* p, size_t n) { return cuMemAlloc_v2(p, n); }
int free_internal(unsigned long long p) { return cuMemFree_v2(p); }
int launch_internal(void* f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned h, void* s,
                    void** k, void** x) {
  return cuLaunchKernel(f, a, b, c, d, e, g, h, s, k, x);
}
int launch_ptsz_internal(void* f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned h,
                         void* s, void** k, void** x) {
  return cuLaunchKernel_ptsz(f, a, b, c, d, e, g, h, s, k, x);
}
}  // namespace

FAKE_EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status);
FAKE_EXPORT int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
FAKE_EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status) {
  bump("cuGetProcAddress_v2");
  const char* ind = std::getenv("FAKE_CUDA_INDIRECT");
  const bool indirect = ind != nullptr && std::strcmp(ind, "1") == 0;
  const bool pt = (flags & 2) != 0;
  const std::string s = symbol != nullptr ? symbol : "";
  void* f = nullptr;
  if (s == "cuMemAlloc" && version >= 3020) f = indirect ? (void*)&alloc_internal : (void*)&cuMemAlloc_v2;
  else if (s == "cuMemFree" && version >= 3020) f = indirect ? (void*)&free_internal : (void*)&cuMemFree_v2;
  else if (s == "cuLaunchKernel" && pt) f = indirect ? (void*)&launch_ptsz_internal : (void*)&cuLaunchKernel_ptsz;
  else if (s == "cuLaunchKernel") f = indirect ? (void*)&launch_internal : (void*)&cuLaunchKernel;
  else if (s == "cuCtxGetDevice") f = (void*)&cuCtxGetDevice;
  else if (s == "cuGetProcAddress") f = version >= 12000 ? (void*)&cuGetProcAddress_v2 : (void*)&cuGetProcAddress;
  if (status != nullptr) *status = f != nullptr ? 0 : 1;
  if (f == nullptr) return 500;  // CUDA_ERROR_NOT_FOUND
  *pfn = f;
  return 0;
}
