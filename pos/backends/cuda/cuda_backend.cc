// cuda_backend.cc — the CUDA device backend: the worker's calls on a real GPU through the driver API
// and cuBLAS. Built as libpos_cuda.so, which libpos loads on demand, so hosts without a driver run.
#include <cublas_v2.h>
#include <cuda.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <shared_mutex>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pos/backend.h"
#include "pos/config.h"
#include "pos/backends/cuda/mangled_params.h"
#include "pos/base/log.h"
#include "pos/base/parallel_copy.h"
#include "pos/base/text.h"
#include "pos/backends/staged_copy.h"
#include "pos/backends/staged_lanes.h"

namespace pos::cudabk {
namespace {

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof(b), "0x%lx", static_cast<unsigned long>(v));
  return b;
}

// CUresult → the cudaError_t the runtime reports for it. Since CUDA 10 the runtime's codes equal the
// driver's for every error a driver call here can return (checked against the headers at build time).
int32_t runtime_error(CUresult r) {
  switch (r) {
    case CUDA_ERROR_NOT_FOUND: return 500;  // cudaErrorSymbolNotFound
    default: return static_cast<int32_t>(r);
  }
}
static_assert(static_cast<int>(CUDA_ERROR_ILLEGAL_ADDRESS) == 700 && static_cast<int>(CUDA_ERROR_NOT_READY) == 600 &&
              static_cast<int>(CUDA_ERROR_INVALID_HANDLE) == 400 && static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY) == 2 &&
              static_cast<int>(CUDA_ERROR_NO_BINARY_FOR_GPU) == 209 && static_cast<int>(CUDA_ERROR_LAUNCH_FAILED) == 719);

Status cu_status(CUresult r, const char* call, const std::string& what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &text);
  std::string m = std::string(call) + (what.empty() ? "" : " (" + what + ")") + ": " + (name ? name : "?") + " — " +
                  (text ? text : "unknown driver error");
  // NOT_READY is an answer (stream/event queries), not a failure worth a log line.
  if (r != CUDA_ERROR_NOT_READY) POS_WARN("cuda backend", "%s", m.c_str());
  return Status::Cuda(runtime_error(r), std::move(m));
}
// `what` is built only on failure: the hot paths (launches, async copies) name their handle in
// it, and formatting that on every success would cost the worker an allocation per call.
#define POS_CU(call, what)                                       \
  do {                                                           \
    const CUresult pos_cu_r_ = (call);                           \
    if (pos_cu_r_ != CUDA_SUCCESS) return cu_status(pos_cu_r_, #call, (what)); \
  } while (0)

Status blas_status(cublasStatus_t r, const char* call, const std::string& what) {
  if (r == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string m = std::string(call) + " (" + what + "): " + cublasGetStatusName(r);
  POS_WARN("cuda backend", "%s", m.c_str());
  return Status::Cublas(static_cast<int32_t>(r), std::move(m));
}

// A driver stream plus the bookkeeping that emulates the legacy default stream per client. Every
// driver stream is created non-blocking so that clients sharing the device's context never wait for
// each other through the process-wide legacy stream; the ordering the app asked for is rebuilt
// with events (see CudaClient::order_before).
struct CuStream {
  CUstream s = nullptr;
  CUevent join = nullptr;      // recorded when another stream must wait for this one's work so far
  uint32_t flags = 0;          // the app's flags (cudaStreamNonBlocking)
  bool pending = false;        // blocking stream: work queued since the default stream last joined it
  uint64_t seen_default = 0;   // blocking stream: default-stream epoch it last waited for
  uint64_t seen_fence = 0;     // the client's ShadowFence epoch it last waited for
  bool blocking() const { return (flags & 0x1u) == 0; }
};

struct CuFunction {
  CUfunction f = nullptr;
  std::vector<uint32_t> offsets;  // parameter offsets, from cuFuncGetParamInfo
  uint32_t param_bytes = 0;
};

struct CuBlas {
  cublasHandle_t h = nullptr;
  BackendObj stream = 0;
};

// Physical memory behind the client's reserved range: chunks of whole granules, each shared by
// every allocation that overlaps it (several small buffers live in one 2 MiB granule), released
// when the last one is freed. Addresses come from the parser; this only backs them.
struct Chunk {
  uint64_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  uint32_t refs = 0;
  bool shareable = false;  // made with a POSIX-descriptor handle type: export_memory can hand it out
};

// Exports each shareable chunk once, on a thread of its own, soon after the chunk is made, and
// keeps the descriptor: a chunk's first export costs the driver about 0.5 ms (measured on the H200,
// docs/migration.md), which a peer switch would otherwise pay for every chunk inside the job's stop.
// The lock is held across an export, so a chunk is never released while it is being exported.
class ChunkExporter {
 public:
  explicit ChunkExporter(CUcontext ctx) : ctx_(ctx) {}
  ~ChunkExporter() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto& [start, fd] : fds_) ::close(fd);
  }
  ChunkExporter(const ChunkExporter&) = delete;
  ChunkExporter& operator=(const ChunkExporter&) = delete;

  // At most this many descriptors are kept (a job of many small chunks exports the rest at the
  // stop): the session's open-file limit is shared with its clients' transports.
  static constexpr size_t kMaxKept = 2048;

  void add(uint64_t start, CUmemGenericAllocationHandle h) {
    std::lock_guard<std::mutex> l(mu_);
    if (fds_.size() + queue_.size() >= kMaxKept) return;
    queue_.emplace_back(start, h);
    last_add_ = std::chrono::steady_clock::now();
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_one();
  }
  // Before the chunk's handle is released: waits for an export of it in flight.
  void remove(uint64_t start) {
    std::lock_guard<std::mutex> l(mu_);
    std::erase_if(queue_, [&](const auto& q) { return q.first == start; });
    if (auto it = fds_.find(start); it != fds_.end()) {
      ::close(it->second);
      fds_.erase(it);
    }
  }
  // A descriptor of the chunk for the caller to own: a duplicate of the kept one, or a new export.
  CUresult take(uint64_t start, CUmemGenericAllocationHandle h, int* out) {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = fds_.find(start); it != fds_.end()) {
      *out = ::fcntl(it->second, F_DUPFD_CLOEXEC, 0);
      if (*out >= 0) return CUDA_SUCCESS;
    }
    return export_one(h, out);
  }

 private:
  static CUresult export_one(CUmemGenericAllocationHandle h, int* out) {
    int fd = -1;
    CUresult r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r == CUDA_SUCCESS) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);  // not into what a session may start
    *out = fd;
    return r;
  }
  void run() {
    if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return;
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      // Only once no chunk was made for a moment: exports beside a burst of allocations (a job's
      // start, a restore) slowed the driver's other calls there (a peer switch's target: its
      // allocations, imports and unmaps, 2-10x on the H200). Not longer: a job that allocates
      // every step would never be quiet for long, and its chunks would be exported at the stop.
      while (!stop_ && std::chrono::steady_clock::now() - last_add_ < kQuiet) cv_.wait_until(l, last_add_ + kQuiet);
      if (stop_) return;
      if (queue_.empty()) continue;
      const auto [start, h] = queue_.front();
      queue_.pop_front();
      int fd = -1;
      // Best effort: a chunk whose export fails here is exported (and its error reported) at the stop.
      if (export_one(h, &fd) == CUDA_SUCCESS) fds_[start] = fd;
    }
  }

  const CUcontext ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, CUmemGenericAllocationHandle>> queue_;
  std::unordered_map<uint64_t, int> fds_;  // chunk start -> its kept descriptor
  static constexpr std::chrono::milliseconds kQuiet{100};
  std::chrono::steady_clock::time_point last_add_;
  bool stop_ = false;
  std::thread thread_;
};

thread_local CUcontext t_current = nullptr;

Status make_current(CUcontext ctx) {
  if (t_current == ctx) return Status::Ok();
  POS_CU(cuCtxSetCurrent(ctx), "primary context");
  t_current = ctx;
  return Status::Ok();
}

// Whether the driver knows [p, p + n) as page-locked host memory (cuMemHostAlloc, cudaMallocHost,
// cuMemHostRegister, posd's arena): it answers CUDA_ERROR_INVALID_VALUE for pageable memory. Both
// ends are asked, so a copy that runs off a pinned block into pageable memory is staged.
bool page_locked(const void* p, uint64_t n) {
  auto ask = [](const void* q) {
    unsigned int type = 0;  // CUmemorytype
    return cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(q)) ==
               CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_HOST;
  };
  return ask(p) && ask(static_cast<const std::byte*>(p) + n - 1);
}

// Host memory page-locked on first use (DeviceBackend::host_register_on_use): a posd session's
// arena, most of which a job never touches. Only a prefix of it is page-locked, grown (doubled, in
// 4 MiB steps at least) when a copy names memory past it: the shim hands out arena blocks first-fit
// from the bottom, so the prefix covers what the job uses, and the rest stays unresident, out of
// CRIU's images at a dump (docs/dump_restore.md). One registration, not one per piece: the driver
// refuses a copy whose host range spans two registrations. Growing re-registers the prefix, so it
// first waits for the calling thread's context (no DMA may use the old registration); posd's
// session processes serve one client each, whose worker is the only thread copying to or from it.
// Thread-safe; the fast path (inside the prefix) is one atomic load and takes no lock.
class OnUsePins {
 public:
  static constexpr uint64_t kStep = 4ull << 20;
  void add(std::byte* base, uint64_t bytes) {
    auto w = std::make_shared<Window>();
    w->base = base, w->bytes = bytes;
    std::unique_lock lk(mu_);
    windows_.push_back(std::move(w));
  }
  // Unlocks what was locked; false if `base` is no window.
  bool remove(std::byte* base) {
    std::shared_ptr<Window> w;
    {
      std::unique_lock lk(mu_);
      for (auto it = windows_.begin(); it != windows_.end(); ++it)
        if ((*it)->base == base) {
          w = *it;
          windows_.erase(it);
          break;
        }
    }
    if (!w) return false;
    std::lock_guard<std::mutex> g(w->grow_mu);
    if (w->locked.load(std::memory_order_acquire) > 0) cuMemHostUnregister(w->base);
    return true;
  }
  // Before a copy of [p, p+n) on the calling thread's (current) context: if it lies in a window,
  // that window's page-locked prefix covers it. A failure to lock only means the copy takes the
  // pageable path, as natively; it is logged once per window.
  void ensure(const void* p, uint64_t n) {
    if (n == 0) return;
    std::shared_ptr<Window> w;
    {
      std::shared_lock lk(mu_);
      if (windows_.empty()) return;
      const auto* b = static_cast<const std::byte*>(p);
      for (const auto& x : windows_)
        if (b >= x->base && b < x->base + x->bytes) w = x;
    }
    if (!w) return;
    const uint64_t end = std::min(static_cast<uint64_t>(static_cast<const std::byte*>(p) - w->base) + n, w->bytes);
    if (end <= w->locked.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> g(w->grow_mu);
    const uint64_t had = w->locked.load(std::memory_order_relaxed);
    if (end <= had || w->failed) return;
    const uint64_t want = std::min(w->bytes, std::max((end + kStep - 1) / kStep * kStep, 2 * had));
    if (had > 0) {
      (void)cuCtxSynchronize();  // no DMA in flight reads or writes through the old registration
      cuMemHostUnregister(w->base);
      w->locked.store(0, std::memory_order_release);
    }
    CUresult r = cuMemHostRegister(w->base, want, CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_SUCCESS) {
      w->locked.store(want, std::memory_order_release);
      return;
    }
    w->failed = true;
    POS_WARN("cuda backend", "page-locking %llu bytes of a session arena failed (CUresult %d): copies past its first "
             "%llu bytes take the pageable path", static_cast<unsigned long long>(want), static_cast<int>(r),
             static_cast<unsigned long long>(had));
    if (had > 0 && cuMemHostRegister(w->base, had, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS)
      w->locked.store(had, std::memory_order_release);
  }

 private:
  struct Window {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
    std::atomic<uint64_t> locked{0};  // the page-locked prefix's length (written under grow_mu)
    std::mutex grow_mu;               // serializes growing the prefix
    bool failed = false;              // under grow_mu: a registration failed, stop trying
  };
  std::shared_mutex mu_;  // guards windows_
  std::vector<std::shared_ptr<Window>> windows_;
};

// Pageable copies through page-locked slots (pos/staged_copy.h): the slots, an event per slot
// (its fence) and the threads that copy into and out of them. A client makes one on its first
// large pageable copy; confined to that client's worker, whose context is current in every call.
class CuStaging final : public StagingDevice {
 public:
  CuStaging(const StagingOptions& o, uint64_t spin_ns) : opts_(o), copier_(o.threads, spin_ns) {}
  // Every slot is idle here: each pipeline call returns with its DMAs finished.
  ~CuStaging() override {
    for (CUevent e : events_) cuEventDestroy(e);
    for (std::byte* p : slots_) cuMemFreeHost(p);
  }
  // On failure what was made is freed by the destructor.
  Status open() {
    for (unsigned i = 0; i < opts_.slots; ++i) {
      void* p = nullptr;
      POS_CU(cuMemHostAlloc(&p, opts_.slot_bytes, 0), "staging slot of " + std::to_string(opts_.slot_bytes) + " bytes");
      slots_.push_back(static_cast<std::byte*>(p));
      CUevent e = nullptr;
      POS_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "staging slot event");
      events_.push_back(e);
    }
    pipeline_.emplace(slots_, opts_.slot_bytes, &copier_);
    return Status::Ok();
  }
  Status h2d(CUstream s, CUdeviceptr dst, const void* src, uint64_t n) {
    stream_ = s;
    return pipeline_->h2d(*this, dst, src, n);
  }
  Status d2h(CUstream s, void* dst, CUdeviceptr src, uint64_t n) {
    stream_ = s;
    return pipeline_->d2h(*this, dst, src, n);
  }

  Status to_device(uint64_t dst, const void* slot, uint64_t n) override {
    POS_CU(cuMemcpyHtoDAsync(dst, slot, n, stream_), "staged copy to " + hex(dst));
    return Status::Ok();
  }
  Status to_host(void* slot, uint64_t src, uint64_t n) override {
    POS_CU(cuMemcpyDtoHAsync(slot, src, n, stream_), "staged copy from " + hex(src));
    return Status::Ok();
  }
  Status fence(unsigned slot) override {
    POS_CU(cuEventRecord(events_[slot], stream_), "staging slot " + std::to_string(slot));
    return Status::Ok();
  }
  Status wait(unsigned slot) override {
    POS_CU(cuEventSynchronize(events_[slot]), "staging slot " + std::to_string(slot));
    return Status::Ok();
  }
  Status drain() override {
    POS_CU(cuStreamSynchronize(stream_), "staged copy stream");
    return Status::Ok();
  }

 private:
  const StagingOptions opts_;
  ParallelCopier copier_;
  std::vector<std::byte*> slots_;
  std::vector<CUevent> events_;
  std::optional<StagingPipeline> pipeline_;
  CUstream stream_ = nullptr;  // the stream of the copy in progress
};

// The checkpoint copier's lanes into pageable images (pos/staged_lanes.h): two page-locked slots,
// two events and a non-blocking stream per lane, in the client's context.
class CuLanes final : public LaneDevice {
 public:
  CuLanes(CUcontext ctx, LanePlan plan) : ctx_(ctx), plan_(plan) {}
  ~CuLanes() override {
    lanes_.reset();  // its threads first: they use the streams
    if (!make_current(ctx_).ok()) return;
    for (CUstream s : streams_) {
      cuStreamSynchronize(s);
      cuStreamDestroy(s);
    }
    for (CUevent e : events_) cuEventDestroy(e);
    for (std::byte* p : slots_) cuMemFreeHost(p);
  }
  // On failure what was made is freed by the destructor.
  Status open() {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    for (unsigned i = 0; i < 2 * plan_.lanes; ++i) {
      void* p = nullptr;
      POS_CU(cuMemHostAlloc(&p, plan_.slot_bytes, 0), "checkpoint staging slot of " + std::to_string(plan_.slot_bytes) + " bytes");
      slots_.push_back(static_cast<std::byte*>(p));
      CUevent e = nullptr;
      POS_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "checkpoint staging event");
      events_.push_back(e);
    }
    for (unsigned i = 0; i < plan_.lanes; ++i) {
      CUstream s = nullptr;
      POS_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "checkpoint staging stream");
      streams_.push_back(s);
    }
    lanes_ = std::make_unique<StagedLanes>(plan_.lanes, slots_, plan_.slot_bytes);
    return Status::Ok();
  }
  Status d2h(std::span<const HostSpan> parts) { return lanes_->d2h(*this, parts); }

  Status enter(unsigned) override { return make_current(ctx_); }
  Status to_host(unsigned lane, void* slot, uint64_t src, uint64_t n) override {
    POS_CU(cuMemcpyDtoHAsync(slot, src, n, streams_[lane]), "checkpoint copy from " + hex(src));
    return Status::Ok();
  }
  Status fence(unsigned lane, unsigned slot) override {
    POS_CU(cuEventRecord(events_[2 * lane + slot], streams_[lane]), "checkpoint staging fence");
    return Status::Ok();
  }
  Status wait(unsigned lane, unsigned slot) override {
    POS_CU(cuEventSynchronize(events_[2 * lane + slot]), "checkpoint staging fence");
    return Status::Ok();
  }
  Status drain(unsigned lane) override {
    POS_CU(cuStreamSynchronize(streams_[lane]), "checkpoint staging stream");
    return Status::Ok();
  }

 private:
  CUcontext ctx_;
  const LanePlan plan_;
  std::vector<std::byte*> slots_;
  std::vector<CUevent> events_;
  std::vector<CUstream> streams_;
  std::unique_ptr<StagedLanes> lanes_;
};

// A session's copy-on-write shadows come from a stream-ordered pool of its own. With `keep` (config
// checkpoint.keep_shadows; posd sets it for the jobs its checkpoint policy names) the pool holds
// on to what a checkpoint freed, so that the next tick's shadows are not mapped by the driver
// again: on the H200 that was 8.4 of the 18.5 ms a tick's calls waited for them. The job takes
// the room back when its own allocation needs it (CudaClient::map_chunk trims the pool).
// Without `keep` the pool gives memory back at each synchronization, as the device's default
// pool does, and all of it at a checkpoint's end (settle). No pool (the device has no
// stream-ordered allocator): shadows are cuMemAlloc'd.
class ShadowPool {
 public:
  static std::shared_ptr<ShadowPool> make(CUdevice dev, bool keep) {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CUmemoryPool p = nullptr;
    if (cuMemPoolCreate(&p, &props) != CUDA_SUCCESS) return nullptr;
    cuuint64_t threshold = keep ? UINT64_MAX : 0;
    if (cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) != CUDA_SUCCESS) {
      cuMemPoolDestroy(p);
      return nullptr;
    }
    return std::shared_ptr<ShadowPool>(new ShadowPool(p, keep));
  }
  ~ShadowPool() { cuMemPoolDestroy(pool_); }  // memory still allocated goes once it is freed
  CUmemoryPool get() const { return pool_; }
  // The first time only (a session's first checkpoint): grows the pool to `bytes`, in pieces of at
  // most kPiece (the job's larger buffers' size, so that their shadows fit one, and so that a trim
  // can give whole pieces back). The calling thread has the context current. A piece the device
  // refuses ends it: the rest is allocated as shadows need it, as without.
  static constexpr uint64_t kPiece = 1ull << 30;
  uint64_t grow_once(uint64_t bytes) {
    if (grown_.exchange(true)) return 0;
    const uint64_t have = reserved();
    if (bytes <= have) return 0;
    CUstream s = nullptr;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 0;
    std::vector<CUdeviceptr> got;
    for (uint64_t left = bytes - have; left > 0;) {
      const uint64_t n = std::min(left, kPiece);
      CUdeviceptr p = 0;
      if (cuMemAllocFromPoolAsync(&p, n, pool_, s) != CUDA_SUCCESS) break;
      got.push_back(p);
      left -= n;
    }
    for (CUdeviceptr p : got) cuMemFreeAsync(p, s);
    cuStreamSynchronize(s);
    cuStreamDestroy(s);
    cuuint64_t zero = 0;  // from here the high mark counts the checkpoint's shadows only
    cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
    settle_pending_.store(!got.empty());
    const uint64_t now = reserved();
    return now > have ? now - have : 0;
  }
  // A checkpoint's shadows are freed: after the one grow_once served, what they did not use goes;
  // a pool that does not keep gives back everything now. Returns what the pool keeps.
  uint64_t settle() {
    if (!keep_) {
      cuMemPoolTrimTo(pool_, 0);
    } else if (settle_pending_.exchange(false)) {
      cuuint64_t high = 0;
      if (cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high) == CUDA_SUCCESS) cuMemPoolTrimTo(pool_, high);
    }
    return reserved();
  }
  // Gives every byte no shadow holds back to the device; what it gave (0 if nothing).
  uint64_t trim() {
    const uint64_t before = reserved();
    cuMemPoolTrimTo(pool_, 0);
    const uint64_t after = reserved();
    return before > after ? before - after : 0;
  }
  uint64_t reserved() const {
    cuuint64_t v = 0;
    return cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS ? v : 0;
  }

 private:
  ShadowPool(CUmemoryPool p, bool keep) : pool_(p), keep_(keep) {}
  CUmemoryPool pool_;
  const bool keep_;
  std::atomic<bool> grown_{false}, settle_pending_{false};
};

// Copy-on-write ordered on the device: a shadow's copy is queued on a copier lane, which then
// records `ev`; each of the client's streams waits for the newest record before its next work
// (CudaClient::order_before). So the job's calls never wait on the host for a shadow's copy: the
// kernel that writes the buffer waits for it on the device, usually not at all, since the copy
// starts at once, beside the kernels queued before it. (The lane runs in order, so the newest
// record covers every copy before it.) Worker thread only, as the client is.
struct ShadowFence {
  CUevent ev = nullptr;
  uint64_t epoch = 0;  // bumped at each record; 0: never recorded
};

// The checkpoint engine's copies: its own non-blocking streams (lanes) in the client's context,
// so they never queue behind the job's kernels. Binds the context on whichever thread uses it.
class CudaCopier final : public DeviceCopier {
 public:
  // `staging`: the client's; the copier stages through slots of its own, smaller and more of them
  // (kSlotBytes × kSlots, bounded), since its copies come one 8 MiB chunk at a time: four pieces
  // per chunk keep the DMA of one piece under the memcpy of the last.
  CudaCopier(CUcontext ctx, StagingOptions staging, uint64_t spin_ns, std::shared_ptr<ShadowPool> pool,
             ShadowFence* fence)
      : ctx_(ctx), staging_opts_(staging), spin_ns_(spin_ns), pool_(std::move(pool)), fence_(fence) {
    staging_opts_.slot_bytes = kSlotBytes;
    staging_opts_.slots = kSlots;
    staging_opts_.min_bytes = kSlotBytes;
  }
  static constexpr uint64_t kSlotBytes = 2ull << 20;
  static constexpr unsigned kSlots = 8;
  ~CudaCopier() override {
    if (make_current(ctx_).ok()) {
      for (CUdeviceptr p : shadows_) {
        if (!pool_ || lanes_[0] == nullptr) cuMemFree(p);
        else cuMemFreeAsync(p, lanes_[0]);
      }
      for (CUstream s : lanes_)
        if (s != nullptr) {
          cuStreamSynchronize(s);
          cuStreamDestroy(s);
        }
    }
  }
  // The lanes have the context's highest priority: a shadow's copy that runs on SMs gets them as
  // the job's running kernel frees them, ahead of the job's queued blocks.
  Status open() {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    int least = 0, greatest = 0;
    if (cuCtxGetStreamPriorityRange(&least, &greatest) != CUDA_SUCCESS) greatest = 0;
    for (CUstream& s : lanes_)
      POS_CU(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest), "checkpoint copy stream");
    return Status::Ok();
  }
  // Into or out of pageable host memory (an image whose memory was never page-locked) the copy
  // goes through the copier's own bounded slots, with several threads; it has finished when the
  // call returns. Page-locked memory is one DMA, queued on the lane.
  Status to_host_async(void* dst, uint64_t src, uint64_t n, int lane) override {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    if (CuStaging* st = staging_for(dst, n)) return st->d2h(lanes_[lane & 1], dst, src, n);
    POS_CU(cuMemcpyDtoHAsync(dst, src, n, lanes_[lane & 1]), "checkpoint copy from " + hex(src));
    return Status::Ok();
  }
  Status to_device_async(uint64_t dst, const void* src, uint64_t n, int lane) override {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    if (CuStaging* st = staging_for(src, n)) return st->h2d(lanes_[lane & 1], dst, src, n);
    POS_CU(cuMemcpyHtoDAsync(dst, src, n, lanes_[lane & 1]), "restore copy to " + hex(dst));
    return Status::Ok();
  }
  // A drain's few chunks at once: into pageable memory through the staging lanes, all of them in
  // flight together; otherwise one DMA each on the lane.
  Status to_host_batch(std::span<const HostSpan> parts, int lane) override {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    if (CuLanes* l = lanes_for(parts)) return l->d2h(parts);
    for (const HostSpan& p : parts) POS_RETURN_IF_ERROR(to_host_async(p.host, p.dev, p.n, lane));
    return wait(lane);
  }
  Status device_copy_async(uint64_t dst, uint64_t src, uint64_t n, int lane) override {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    POS_CU(cuMemcpyDtoDAsync(dst, src, n, lanes_[lane & 1]), "shadow copy of " + hex(src));
    return Status::Ok();
  }
  Status wait(int lane) override {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    POS_CU(cuStreamSynchronize(lanes_[lane & 1]), "checkpoint copy stream");
    return Status::Ok();
  }
  uint64_t settle_shadows() override {
    if (!pool_ || !wait(0).ok()) return 0;  // (the frees were queued on lane 0)
    return pool_->settle();
  }
  Status order_client_after(int lane) override {
    if (fence_ == nullptr || fence_->ev == nullptr) return wait(lane);
    POS_RETURN_IF_ERROR(make_current(ctx_));
    POS_CU(cuEventRecord(fence_->ev, lanes_[lane & 1]), "shadow fence");
    ++fence_->epoch;
    return Status::Ok();
  }
  // Shadows come from the session's stream-ordered pool (ShadowPool): cuMemFree would wait for
  // the whole device (the job's kernels included), so a drainer freeing shadows would stall behind
  // the job and the job's next writes behind a full pool. cuMemAlloc only where pools are missing.
  StatusOr<uint64_t> shadow_alloc(uint64_t n) override {
    POS_RETURN_IF_ERROR(make_current(ctx_));
    CUdeviceptr p = 0;
    const size_t bytes = n == 0 ? 1 : n;
    if (pool_) POS_CU(cuMemAllocFromPoolAsync(&p, bytes, pool_->get(), lanes_[0]), "shadow of " + std::to_string(n) + " bytes");
    else POS_CU(cuMemAlloc(&p, bytes), "shadow of " + std::to_string(n) + " bytes");
    shadows_.insert(p);
    return static_cast<uint64_t>(p);
  }
  void shadow_free(uint64_t addr) override {
    if (shadows_.erase(addr) == 0 || !make_current(ctx_).ok()) return;
    // The caller has waited for every copy that reads the shadow; freed on the lane that wrote it,
    // so that even a copy nobody waited for (a failed checkpoint's) comes first.
    if (!pool_) cuMemFree(addr);
    else cuMemFreeAsync(addr, lanes_[0]);
  }

 private:
  // The slots, made on the first copy that needs them; none (the driver's own staging) if the
  // options say so or they cannot be had.
  CuStaging* staging_for(const void* p, uint64_t n) {
    if (!should_stage(n, staging_opts_, [&] { return page_locked(p, n); })) return nullptr;
    if (!staging_) {
      auto st = std::make_unique<CuStaging>(staging_opts_, spin_ns_);
      if (!st->open().ok()) {
        staging_opts_.threads = 0;
        return nullptr;
      }
      staging_ = std::move(st);
    }
    return staging_.get();
  }

  // The lanes, made on the first batch into pageable memory; none if staging is off, the batch is
  // small, any part is page-locked, or they cannot be had (then the warning says why, once).
  CuLanes* lanes_for(std::span<const HostSpan> parts) {
    if (lanes_off_ || staging_opts_.threads == 0) return nullptr;
    uint64_t total = 0;
    for (const HostSpan& p : parts) total += p.n;
    if (total < 2 * kSlotBytes) return nullptr;
    for (const HostSpan& p : parts)
      if (p.n > 0 && page_locked(p.host, p.n)) return nullptr;
    if (!staged_lanes_) {
      const LanePlan plan = plan_lanes(staging_opts_.ckpt_lanes, staging_opts_.ckpt_staging_bytes,
                                       std::thread::hardware_concurrency());
      auto l = std::make_unique<CuLanes>(ctx_, plan);
      Status st = plan.lanes == 0 ? Status::InvalidArgument("checkpoint.staging is too small for one lane") : l->open();
      if (!st.ok()) {
        POS_WARN("ckpt", "no staging lanes for checkpoints into pageable memory (%s): the driver's copies are used",
                 st.to_string().c_str());
        lanes_off_ = true;
        return nullptr;
      }
      POS_INFO("ckpt", "checkpoint staging: %u lanes, 2 x %llu KiB page-locked each", plan.lanes,
               static_cast<unsigned long long>(plan.slot_bytes >> 10));
      staged_lanes_ = std::move(l);
    }
    return staged_lanes_.get();
  }

  CUcontext ctx_;
  StagingOptions staging_opts_;
  uint64_t spin_ns_ = 0;
  std::unique_ptr<CuStaging> staging_;  // idle whenever no call runs: a staged copy returns once done
  std::unique_ptr<CuLanes> staged_lanes_;  // likewise
  bool lanes_off_ = false;
  CUstream lanes_[kLanes] = {};
  std::set<CUdeviceptr> shadows_;
  std::shared_ptr<ShadowPool> pool_;  // null: the device has no stream-ordered allocator
  ShadowFence* fence_;                // the client's (outlives the copier); null: order_client_after waits
};

// A peer switch's scratch mapping of the source session's memory (CudaClient::copy_from_peer):
// one reservation, each range imported and mapped side by side, and the copy streams.
struct PeerScratch {
  CUdeviceptr va = 0;
  uint64_t total = 0;
  std::vector<uint64_t> offset, size;
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<bool> mapped;
  std::vector<CUstream> streams;
  void release() {
    for (CUstream x : streams) {
      cuStreamSynchronize(x);
      cuStreamDestroy(x);
    }
    for (size_t i = 0; i < handles.size(); ++i) {
      if (mapped[i]) cuMemUnmap(va + offset[i], size[i]);
      if (handles[i] != 0) cuMemRelease(handles[i]);
    }
    if (va != 0) cuMemAddressFree(va, total);
    streams.clear(), handles.clear(), mapped.clear(), va = 0;
  }
};

class CudaClient final : public BackendClient {
 public:
  CudaClient(CUcontext ctx, CUdevice dev, uint64_t granule, uint64_t base, uint64_t size, const StagingOptions& staging,
             uint64_t spin_ns, OnUsePins* pins, uint32_t sms_granted = 0)
      : ctx_(ctx), dev_(dev), granule_(granule), base_(base), size_(size), staging_opts_(staging), spin_ns_(spin_ns),
        pins_(pins), sms_granted_(sms_granted) {}
  ~CudaClient() override;
  uint32_t sms_granted() const override { return sms_granted_; }

  Status open() {
    POS_RETURN_IF_ERROR(bind());
    CUdeviceptr got = 0;
    CUresult r = cuMemAddressReserve(&got, size_, granule_, base_, 0);
    if (r == CUDA_SUCCESS && got != base_) {
      cuMemAddressFree(got, size_);
      return Status(Code::kUnavailable, cuda::kErrorMemoryAllocation,
                    "cuda backend: the driver would not reserve the client range at " + hex(base_) + " (offered " +
                        hex(got) + "); choose another client.va_base");
    }
    POS_CU(r, "client range " + hex(base_));
    reserved_ = true;
    // Copy-on-write's pool and fence, made now so that a checkpoint's control thread may grow the
    // pool ahead of the cut (reserve_shadows). Without them shadows are cuMemAlloc'd and waited for.
    shadow_pool_ = ShadowPool::make(dev_, staging_opts_.keep_shadows);
    if (cuEventCreate(&fence_.ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) fence_.ev = nullptr;
    auto d = make_stream(0, 0);
    if (!d.ok()) return d.status();
    default_ = std::move(d.value());
    return Status::Ok();
  }

  Status alloc_at(uint64_t addr, uint64_t size) override;
  Status free_at(uint64_t addr, uint64_t size) override;
  StatusOr<std::vector<PeerMemory>> export_memory() override;
  Status copy_from_peer(const std::vector<PeerMemory>& ranges, const std::vector<PeerBuffer>& buffers) override;

  uint64_t reserve_shadows(uint64_t bytes) override {
    return staging_opts_.keep_shadows && shadow_pool_ && bind().ok() ? shadow_pool_->grow_once(bytes) : 0;
  }
  StatusOr<std::unique_ptr<DeviceCopier>> make_copier() override {
    auto c = std::make_unique<CudaCopier>(ctx_, staging_opts_, spin_ns_, shadow_pool_, &fence_);
    POS_RETURN_IF_ERROR(c->open());
    return std::unique_ptr<DeviceCopier>(std::move(c));
  }

  Status memcpy_h2d(uint64_t dst, const void* src, uint64_t n) override {
    POS_RETURN_IF_ERROR(bind());
    pins_->ensure(src, n);
    CuStream& s = *default_;
    order_before(s);
    if (CuStaging* st = staging_for(src, n)) POS_RETURN_IF_ERROR(st->h2d(s.s, xlate(dst), src, n));
    else POS_CU(cuMemcpyHtoDAsync(xlate(dst), src, n, s.s), hex(dst));
    POS_CU(cuStreamSynchronize(s.s), "default stream");
    return Status::Ok();
  }
  Status memcpy_h2d_async(uint64_t dst, std::vector<std::byte>&& buf, uint64_t offset, uint64_t n,
                          BackendObj stream) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(stream);
    if (s == nullptr) return not_found("stream", stream);
    order_before(*s);
    // From pageable memory the driver stages the bytes before it returns, so `buf` may go now.
    POS_CU(cuMemcpyHtoDAsync(xlate(dst), buf.data() + offset, n, s->s), hex(dst));
    return Status::Ok();
  }
  Status memcpy_d2h(void* dst, uint64_t src, uint64_t n) override {
    POS_RETURN_IF_ERROR(bind());
    pins_->ensure(dst, n);
    CuStream& s = *default_;
    order_before(s);
    if (CuStaging* st = staging_for(dst, n)) POS_RETURN_IF_ERROR(st->d2h(s.s, dst, xlate(src), n));
    else POS_CU(cuMemcpyDtoHAsync(dst, xlate(src), n, s.s), hex(src));
    POS_CU(cuStreamSynchronize(s.s), "default stream");
    return Status::Ok();
  }
  Status memcpy_d2h_async(void* dst, uint64_t src, uint64_t n, BackendObj stream) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(stream);
    if (s == nullptr) return not_found("stream", stream);
    pins_->ensure(dst, n);
    order_before(*s);
    // To pageable memory the driver's copy returns only once the bytes are there (CUDA semantics),
    // ordered on the stream; the staged one does the same, on the same stream.
    if (CuStaging* st = staging_for(dst, n)) return st->d2h(s->s, dst, xlate(src), n);
    POS_CU(cuMemcpyDtoHAsync(dst, xlate(src), n, s->s), hex(src));
    return Status::Ok();
  }
  Status memcpy_d2d(uint64_t dst, uint64_t src, uint64_t n, BackendObj stream, bool sync) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(stream);
    if (s == nullptr) return not_found("stream", stream);
    order_before(*s);
    POS_CU(cuMemcpyDtoDAsync(xlate(dst), xlate(src), n, s->s), hex(src) + " -> " + hex(dst));
    if (sync) POS_CU(cuStreamSynchronize(s->s), "copy stream");
    return Status::Ok();
  }
  Status memset(uint64_t dst, int value, uint64_t n, BackendObj stream, bool sync) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(stream);
    if (s == nullptr) return not_found("stream", stream);
    order_before(*s);
    POS_CU(cuMemsetD8Async(xlate(dst), static_cast<unsigned char>(value), n, s->s), hex(dst));
    if (sync) POS_CU(cuStreamSynchronize(s->s), "memset stream");
    return Status::Ok();
  }

  StatusOr<BackendObj> stream_create(uint32_t flags, int32_t priority) override {
    POS_RETURN_IF_ERROR(bind());
    auto st = make_stream(flags, priority);
    if (!st.ok()) return st.status();
    const BackendObj id = next_id_++;
    streams_[id] = std::move(st.value());
    return id;
  }
  Status stream_destroy(BackendObj id) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = streams_.find(id);
    if (it == streams_.end() || id == 0) return not_found("stream", id);
    std::unique_ptr<CuStream> st = std::move(it->second);
    streams_.erase(it);
    // Queued work still runs (CUDA semantics); the default stream must still wait for it.
    if (st->blocking() && st->pending) {
      POS_CU(cuEventRecord(st->join, st->s), "stream join");
      POS_CU(cuStreamWaitEvent(default_->s, st->join, 0), "stream join");
    }
    std::erase(pending_, st.get());
    destroy_stream(*st);
    return Status::Ok();
  }
  Status stream_synchronize(BackendObj id) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(id);
    if (s == nullptr) return not_found("stream", id);
    if (s == default_.get()) order_before(*s);  // legacy: also waits for the blocking streams
    POS_CU(cuStreamSynchronize(s->s), "stream " + std::to_string(id));
    return Status::Ok();
  }
  Status stream_query(BackendObj id) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(id);
    if (s == nullptr) return not_found("stream", id);
    if (s == default_.get()) {
      for (CuStream* b : pending_) POS_RETURN_IF_ERROR(cu_status(cuStreamQuery(b->s), "cuStreamQuery", ""));
    }
    return cu_status(cuStreamQuery(s->s), "cuStreamQuery", "stream " + std::to_string(id));
  }
  Status stream_wait_event(BackendObj sid, BackendObj eid) override {
    POS_RETURN_IF_ERROR(bind());
    CuStream* s = find_stream(sid);
    if (s == nullptr) return not_found("stream", sid);
    auto e = events_.find(eid);
    if (e == events_.end()) return not_found("event", eid);
    order_before(*s);
    POS_CU(cuStreamWaitEvent(s->s, e->second, 0), "event " + std::to_string(eid));
    return Status::Ok();
  }

  StatusOr<BackendObj> event_create(uint32_t flags) override {
    POS_RETURN_IF_ERROR(bind());
    CUevent e = nullptr;
    // cudaEvent* flag bits equal CU_EVENT_* (blocking sync 1, disable timing 2, interprocess 4).
    POS_CU(cuEventCreate(&e, flags), "flags " + std::to_string(flags));
    const BackendObj id = next_id_++;
    events_[id] = e;
    return id;
  }
  Status event_destroy(BackendObj id) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = events_.find(id);
    if (it == events_.end()) return not_found("event", id);
    CUevent e = it->second;
    events_.erase(it);
    POS_CU(cuEventDestroy(e), "event " + std::to_string(id));
    return Status::Ok();
  }
  Status event_record(BackendObj eid, BackendObj sid) override {
    POS_RETURN_IF_ERROR(bind());
    auto e = events_.find(eid);
    if (e == events_.end()) return not_found("event", eid);
    CuStream* s = find_stream(sid);
    if (s == nullptr) return not_found("stream", sid);
    order_before(*s);
    POS_CU(cuEventRecord(e->second, s->s), "event " + std::to_string(eid));
    return Status::Ok();
  }
  Status event_synchronize(BackendObj eid) override {
    POS_RETURN_IF_ERROR(bind());
    auto e = events_.find(eid);
    if (e == events_.end()) return not_found("event", eid);
    POS_CU(cuEventSynchronize(e->second), "event " + std::to_string(eid));
    return Status::Ok();
  }
  Status event_query(BackendObj eid) override {
    POS_RETURN_IF_ERROR(bind());
    auto e = events_.find(eid);
    if (e == events_.end()) return not_found("event", eid);
    return cu_status(cuEventQuery(e->second), "cuEventQuery", "event " + std::to_string(eid));
  }
  StatusOr<float> event_elapsed_ms(BackendObj a, BackendObj b) override {
    POS_RETURN_IF_ERROR(bind());
    auto ea = events_.find(a), eb = events_.find(b);
    if (ea == events_.end()) return not_found("event", a);
    if (eb == events_.end()) return not_found("event", b);
    float ms = 0;
    POS_CU(cuEventElapsedTime(&ms, ea->second, eb->second), "events " + std::to_string(a) + ", " + std::to_string(b));
    return ms;
  }

  Status synchronize_all() override {
    POS_RETURN_IF_ERROR(bind());
    // This client's streams only: cuCtxSynchronize would also wait for every other tenant.
    POS_CU(cuStreamSynchronize(default_->s), "default stream");
    for (auto& [id, s] : streams_) POS_CU(cuStreamSynchronize(s->s), "stream " + std::to_string(id));
    return Status::Ok();
  }

  StatusOr<BackendObj> module_load(std::span<const std::byte> fatbin) override {
    POS_RETURN_IF_ERROR(bind());
    CUmodule m = nullptr;
    // The parser checked that the blob is exactly one fatbin; the driver picks the SASS or JITs PTX.
    POS_CU(cuModuleLoadData(&m, fatbin.data()), std::to_string(fatbin.size()) + "-byte fatbin");
    const BackendObj id = next_id_++;
    modules_[id] = m;
    return id;
  }
  Status module_unload(BackendObj id) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = modules_.find(id);
    if (it == modules_.end()) return not_found("module", id);
    for (auto f = functions_.begin(); f != functions_.end();) {
      f = function_module_[f->first] == id ? (function_module_.erase(f->first), functions_.erase(f)) : std::next(f);
    }
    for (auto v = vars_.begin(); v != vars_.end();) v = v->second.module == id ? vars_.erase(v) : std::next(v);
    CUmodule m = it->second;
    modules_.erase(it);
    POS_CU(cuModuleUnload(m), "module " + std::to_string(id));
    return Status::Ok();
  }
  StatusOr<FunctionInfo> function_get(BackendObj mid, const std::string& name) override {
    POS_RETURN_IF_ERROR(bind());
    auto m = modules_.find(mid);
    if (m == modules_.end()) return not_found("module", mid);
    FunctionInfo info;
    CuFunction fn;
    CUresult r = cuModuleGetFunction(&fn.f, m->second, name.c_str());
    // The name is the client's bytes: logs and errors get it as printable text.
    const std::string shown = "'" + printable(name, 256) + "'";
    if (r == CUDA_ERROR_NOT_FOUND) {
      POS_INFO("cuda backend", "module has no kernel %s (launches will fail)", shown.c_str());
      info.found = false;
      return info;
    }
    POS_CU(r, shown);
    (void)cuFuncLoad(fn.f);  // lazy loading: the layout query below needs the function resident
    // The driver gives offsets and sizes; constness comes from the mangled name where it can be read.
    const std::optional<std::vector<bool>> ro = const_pointer_params(name);
    for (size_t i = 0;; ++i) {
      size_t off = 0, size = 0;
      r = cuFuncGetParamInfo(fn.f, i, &off, &size);
      if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
      POS_CU(r, shown + " parameter " + std::to_string(i));
      info.layout.push_back(KernelParam{static_cast<uint32_t>(off), static_cast<uint32_t>(size), false});
      fn.offsets.push_back(static_cast<uint32_t>(off));
      fn.param_bytes = std::max<uint32_t>(fn.param_bytes, static_cast<uint32_t>(off + size));
    }
    // Only when the name's parameter list matches the driver's: otherwise every pointer is InOut.
    if (ro && ro->size() == info.layout.size()) {
      for (size_t i = 0; i < ro->size(); ++i) info.layout[i].read_only = (*ro)[i] && info.layout[i].size == 8;
    }
    info.param_bytes = fn.param_bytes;
    info.found = true;
    info.obj = next_id_++;
    functions_[info.obj] = std::move(fn);
    function_module_[info.obj] = mid;
    return info;
  }
  Status var_bind(BackendObj mid, const std::string& name, uint64_t addr, uint64_t size) override {
    POS_RETURN_IF_ERROR(bind());
    auto m = modules_.find(mid);
    if (m == modules_.end()) return not_found("module", mid);
    CUdeviceptr p = 0;
    size_t bytes = 0;
    const std::string shown = "'" + printable(name, 256) + "'";  // the client's bytes, as text
    POS_CU(cuModuleGetGlobal(&p, &bytes, m->second, name.c_str()), shown);
    if (bytes < size)
      return Status::Cuda(cuda::kErrorInvalidSymbol, "cuda backend: " + shown + " has " + std::to_string(bytes) +
                                                         " bytes on the device, registered as " + std::to_string(size));
    // The app sees the parser's address; copies to it land in the module's global.
    vars_[addr] = Var{p, size, mid};
    return Status::Ok();
  }
  Status launch(BackendObj fid, const LaunchDims& d, std::span<const std::byte> params, BackendObj sid) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = functions_.find(fid);
    if (it == functions_.end()) return not_found("function", fid);
    CuStream* s = find_stream(sid);
    if (s == nullptr) return not_found("stream", sid);
    const CuFunction& fn = it->second;
    if (params.size() != fn.param_bytes)
      return Status::Cuda(cuda::kErrorInvalidValue, "cuda backend: parameter bytes do not match the kernel's layout");
    void* args[64];
    std::vector<void*> many;
    void** argv = args;
    if (fn.offsets.size() > 64) {
      many.resize(fn.offsets.size());
      argv = many.data();
    }
    // cuLaunchKernel copies the values before it returns: pointers into `params` suffice.
    for (size_t i = 0; i < fn.offsets.size(); ++i) argv[i] = const_cast<std::byte*>(params.data()) + fn.offsets[i];
    order_before(*s);
    POS_CU(cuLaunchKernel(fn.f, d.grid[0], d.grid[1], d.grid[2], d.block[0], d.block[1], d.block[2],
                          static_cast<unsigned>(d.shared_mem), s->s, fn.offsets.empty() ? nullptr : argv, nullptr),
           "function " + std::to_string(fid));
    return Status::Ok();
  }
  StatusOr<FuncAttributes> function_attributes(BackendObj fid) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = functions_.find(fid);
    if (it == functions_.end()) return not_found("function", fid);
    CUfunction f = it->second.f;
    int v[9] = {};
    const CUfunction_attribute attrs[9] = {
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,  CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_NUM_REGS,    CU_FUNC_ATTRIBUTE_PTX_VERSION,
        CU_FUNC_ATTRIBUTE_BINARY_VERSION,     CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT};
    for (int i = 0; i < 9; ++i) POS_CU(cuFuncGetAttribute(&v[i], attrs[i], f), "function " + std::to_string(fid));
    FuncAttributes a{};
    a.shared_size_bytes = static_cast<uint64_t>(v[0]);
    a.const_size_bytes = static_cast<uint64_t>(v[1]);
    a.local_size_bytes = static_cast<uint64_t>(v[2]);
    a.max_threads_per_block = v[3];
    a.num_regs = v[4];
    a.ptx_version = v[5];
    a.binary_version = v[6];
    a.max_dynamic_shared_size_bytes = v[7];
    a.preferred_shmem_carveout = v[8];
    return a;
  }
  Status function_set_attribute(BackendObj fid, int32_t attr, int32_t value) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = functions_.find(fid);
    if (it == functions_.end()) return not_found("function", fid);
    // cudaFuncAttribute values 8.. equal CUfunction_attribute's (max dynamic smem, carveout, cluster...).
    if (attr < 8) return Status::Cuda(cuda::kErrorInvalidValue, "function attribute " + std::to_string(attr) + " is read-only");
    POS_CU(cuFuncSetAttribute(it->second.f, static_cast<CUfunction_attribute>(attr), value),
           "attribute " + std::to_string(attr));
    return Status::Ok();
  }
  StatusOr<int32_t> occupancy(BackendObj fid, int32_t block, uint64_t smem, uint32_t flags) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = functions_.find(fid);
    if (it == functions_.end()) return not_found("function", fid);
    int n = 0;
    POS_CU(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&n, it->second.f, block, smem, flags),
           "function " + std::to_string(fid));
    return n;
  }

  StatusOr<BackendObj> blas_create() override {
    POS_RETURN_IF_ERROR(bind());
    CuBlas b;
    POS_RETURN_IF_ERROR(blas_status(cublasCreate(&b.h), "cublasCreate", "new handle"));
    // The handle starts on this client's default stream, not the process's legacy stream.
    if (cublasStatus_t r = cublasSetStream(b.h, default_->s); r != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(b.h);
      return blas_status(r, "cublasSetStream", "new handle");
    }
    const BackendObj id = next_id_++;
    blas_[id] = b;
    return id;
  }
  Status blas_destroy(BackendObj id) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = blas_.find(id);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    cublasHandle_t h = it->second.h;
    blas_.erase(it);
    return blas_status(cublasDestroy(h), "cublasDestroy", "handle " + std::to_string(id));
  }
  Status blas_set_stream(BackendObj id, BackendObj sid) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = blas_.find(id);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    CuStream* s = find_stream(sid);
    if (s == nullptr) return Status::Cublas(cuda::kCublasInvalidValue, "unknown stream");
    POS_RETURN_IF_ERROR(blas_status(cublasSetStream(it->second.h, s->s), "cublasSetStream", "handle " + std::to_string(id)));
    it->second.stream = sid;
    return Status::Ok();
  }
  Status blas_set_math_mode(BackendObj id, int32_t mode) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = blas_.find(id);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    return blas_status(cublasSetMathMode(it->second.h, static_cast<cublasMath_t>(mode)), "cublasSetMathMode",
                       "handle " + std::to_string(id));
  }
  Status blas_gemm(BackendObj id, const GemmArgs& g) override {
    POS_RETURN_IF_ERROR(bind());
    auto it = blas_.find(id);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    CuStream* s = find_stream(it->second.stream);
    if (s == nullptr) return Status::Cublas(cuda::kCublasInvalidValue, "the handle's stream is gone");
    order_before(*s);
    cublasHandle_t h = it->second.h;
    const auto ta = static_cast<cublasOperation_t>(g.transa), tb = static_cast<cublasOperation_t>(g.transb);
    const auto* A = reinterpret_cast<const float*>(xlate(g.a));
    const auto* B = reinterpret_cast<const float*>(xlate(g.b));
    auto* C = reinterpret_cast<float*>(xlate(g.c));
    // The entry point the app called, so cuBLAS picks the same kernels it would natively.
    cublasStatus_t r;
    switch (g.entry) {
      case kGemmEntrySgemm:
        r = cublasSgemm(h, ta, tb, g.m, g.n, g.k, &g.alpha, A, g.lda, B, g.ldb, &g.beta, C, g.ldc);
        break;
      case kGemmEntryGemmEx:
        r = cublasGemmEx(h, ta, tb, g.m, g.n, g.k, &g.alpha, A, static_cast<cudaDataType>(g.a_type), g.lda, B,
                         static_cast<cudaDataType>(g.b_type), g.ldb, &g.beta, C, static_cast<cudaDataType>(g.c_type),
                         g.ldc, static_cast<cublasComputeType_t>(g.compute_type), static_cast<cublasGemmAlgo_t>(g.algo));
        break;
      default:
        r = cublasSgemmStridedBatched(h, ta, tb, g.m, g.n, g.k, &g.alpha, A, g.lda, g.stride_a, B, g.ldb, g.stride_b,
                                      &g.beta, C, g.ldc, g.stride_c, g.batch);
        break;
    }
    if (r == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    return blas_status(r, "cublas gemm", "handle " + std::to_string(id));
  }

 private:
  struct Var {
    CUdeviceptr dev = 0;
    uint64_t size = 0;
    BackendObj module = 0;
  };

  Status bind() { return make_current(ctx_); }
  // The slots for a copy of n bytes at host address p, or null where the driver's own path is
  // right: small copies, page-locked memory, staging off, or slots that could not be made.
  CuStaging* staging_for(const void* p, uint64_t n) {
    if (!should_stage(n, staging_opts_, [&] { return page_locked(p, n); })) return nullptr;
    if (staging_ == nullptr) {
      auto st = std::make_unique<CuStaging>(staging_opts_, spin_ns_);
      if (Status s = st->open(); !s.ok()) {
        // Not a failure of the copy: the driver stages it, as it does natively.
        POS_WARN("cuda backend", "no pinned staging slots (%s); pageable copies take the driver's path",
                 s.message().c_str());
        staging_opts_.threads = 0;
        return nullptr;
      }
      POS_INFO("cuda backend", "pageable copies of %lu bytes and more go through %u pinned slots of %lu bytes, %u threads",
               static_cast<unsigned long>(staging_opts_.min_bytes), staging_opts_.slots,
               static_cast<unsigned long>(staging_opts_.slot_bytes), staging_opts_.threads);
      staging_ = std::move(st);
    }
    return staging_.get();
  }
  static Status not_found(const char* what, BackendObj id) {
    return Status::Cuda(cuda::kErrorInvalidResourceHandle,
                        std::string("cuda backend: unknown ") + what + " " + std::to_string(id));
  }
  CuStream* find_stream(BackendObj id) {
    if (id == 0) return default_.get();
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second.get();
  }
  StatusOr<std::unique_ptr<CuStream>> make_stream(uint32_t flags, int32_t priority) {
    auto st = std::make_unique<CuStream>();
    st->flags = flags;
    POS_CU(cuStreamCreateWithPriority(&st->s, CU_STREAM_NON_BLOCKING, priority), "priority " + std::to_string(priority));
    if (CUresult r = cuEventCreate(&st->join, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
      cuStreamDestroy(st->s);
      return cu_status(r, "cuEventCreate", "stream join event");
    }
    return st;
  }
  static void destroy_stream(CuStream& s) {
    if (s.join != nullptr) cuEventDestroy(s.join);
    if (s.s != nullptr) cuStreamDestroy(s.s);
    s.join = nullptr, s.s = nullptr;
  }
  // Legacy default-stream semantics, per client: work on the default stream waits for all work
  // queued so far on the client's blocking streams, and work on a blocking stream waits for the
  // default stream's work so far. Costs an event only when the app switches between them.
  void order_before(CuStream& s) {
    if (s.seen_fence != fence_.epoch) {  // a shadow's copy was queued since this stream's last work
      cuStreamWaitEvent(s.s, fence_.ev, 0);
      s.seen_fence = fence_.epoch;
    }
    if (&s == default_.get()) {
      for (CuStream* b : pending_) {
        cuEventRecord(b->join, b->s);
        cuStreamWaitEvent(default_->s, b->join, 0);
        b->pending = false;
      }
      pending_.clear();
      ++default_epoch_;
      return;
    }
    if (!s.blocking()) return;
    if (s.seen_default != default_epoch_) {
      cuEventRecord(default_->join, default_->s);
      cuStreamWaitEvent(s.s, default_->join, 0);
      s.seen_default = default_epoch_;
    }
    if (!s.pending) {
      s.pending = true;
      pending_.push_back(&s);
    }
  }
  // Addresses of module globals: the app holds the parser's address; the device's is elsewhere.
  uint64_t xlate(uint64_t addr) const {
    if (vars_.empty()) return addr;
    auto it = vars_.upper_bound(addr);
    if (it == vars_.begin()) return addr;
    --it;
    if (addr - it->first < it->second.size) return it->second.dev + (addr - it->first);
    return addr;
  }
  void release_chunk(std::map<uint64_t, Chunk>::iterator it) {
    if (it->second.shareable) exporter_.remove(it->first);
    cuMemUnmap(it->first, it->second.size);
    cuMemRelease(it->second.handle);
    chunks_.erase(it);
  }
  Status map_chunk(uint64_t start, uint64_t size);
  bool unshareable_ = false;  // the driver made no shareable chunk: the peer switch is refused

  CUcontext ctx_;
  CUdevice dev_;
  const uint64_t granule_, base_, size_;
  bool reserved_ = false;
  BackendObj next_id_ = 1;
  std::unique_ptr<CuStream> default_;
  uint64_t default_epoch_ = 0;
  std::vector<CuStream*> pending_;  // blocking streams with work the default stream has not joined
  std::unordered_map<BackendObj, std::unique_ptr<CuStream>> streams_;
  std::unordered_map<BackendObj, CUevent> events_;
  std::unordered_map<BackendObj, CUmodule> modules_;
  std::unordered_map<BackendObj, CuFunction> functions_;
  std::unordered_map<BackendObj, BackendObj> function_module_;
  std::unordered_map<BackendObj, CuBlas> blas_;
  std::map<uint64_t, Var> vars_;
  std::map<uint64_t, Chunk> chunks_;             // start → chunk, non-overlapping
  std::map<uint64_t, uint64_t> allocations_;     // addr → size, as the parser placed them
  StagingOptions staging_opts_;
  const uint64_t spin_ns_;                       // the copier threads spin this long between chunks
  OnUsePins* const pins_;                        // the backend's: session arenas locked on first use
  const uint32_t sms_granted_;                   // ctx_ is a green context of that many SMs (0: the primary)
  std::unique_ptr<CuStaging> staging_;           // made on the first large pageable copy
  std::thread scratch_release_;                  // the last peer switch's scratch, unmapped after the restore
  std::shared_ptr<ShadowPool> shadow_pool_;      // made by open(); shared with the copiers
  ShadowFence fence_;                            // its event made by open()
  ChunkExporter exporter_{ctx_};                 // last: made after ctx_; the destructor's body releases chunks through it
};

CudaClient::~CudaClient() {
  if (scratch_release_.joinable()) scratch_release_.join();
  if (!bind().ok()) return;
  (void)synchronize_all();
  if (fence_.ev != nullptr) {  // a shadow's copy may still read the memory released below
    cuEventSynchronize(fence_.ev);
    cuEventDestroy(fence_.ev);
  }
  staging_.reset();
  for (auto& [id, b] : blas_) cublasDestroy(b.h);
  for (auto& [id, e] : events_) cuEventDestroy(e);
  for (auto& [id, s] : streams_) destroy_stream(*s);
  if (default_) destroy_stream(*default_);
  for (auto& [id, m] : modules_) cuModuleUnload(m);
  while (!chunks_.empty()) release_chunk(chunks_.begin());
  if (reserved_) cuMemAddressFree(base_, size_);
}

Status CudaClient::map_chunk(uint64_t start, uint64_t size) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev_;
  // Shareable as a POSIX descriptor, so that pos-cli migrate can hand the memory to another session
  // (export_memory); a driver that cannot gets plain memory (the peer switch is then refused).
  CUmemGenericAllocationHandle h = 0;
  bool shareable = !unshareable_;
  prop.requestedHandleTypes = shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  CUresult made = cuMemCreate(&h, size, &prop, 0);
  // Shadows the pool kept for the next checkpoint yield to the job's own memory.
  if (made == CUDA_ERROR_OUT_OF_MEMORY && shadow_pool_ && shadow_pool_->trim() > 0) made = cuMemCreate(&h, size, &prop, 0);
  if (shareable && (made == CUDA_ERROR_NOT_SUPPORTED || made == CUDA_ERROR_INVALID_VALUE)) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    made = cuMemCreate(&h, size, &prop, 0);
    shareable = false;
    if (made == CUDA_SUCCESS) unshareable_ = true;  // not asked again
  }
  POS_CU(made, std::to_string(size) + " bytes at " + hex(start));
  if (CUresult r = cuMemMap(start, size, 0, h, 0); r != CUDA_SUCCESS) {
    cuMemRelease(h);
    return cu_status(r, "cuMemMap", hex(start));
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = cuMemSetAccess(start, size, &access, 1); r != CUDA_SUCCESS) {
    cuMemUnmap(start, size);
    cuMemRelease(h);
    return cu_status(r, "cuMemSetAccess", hex(start));
  }
  chunks_[start] = Chunk{size, h, 1, shareable};
  if (shareable) exporter_.add(start, h);
  return Status::Ok();
}

StatusOr<std::vector<PeerMemory>> CudaClient::export_memory() {
  POS_RETURN_IF_ERROR(bind());
  std::vector<PeerMemory> out;
  out.reserve(chunks_.size());
  for (const auto& [start, c] : chunks_) {
    if (!c.shareable)
      return Status::Unsupported("device memory at " + hex(start) +
                                 " was made without a shareable handle (the driver offered none): it cannot be handed "
                                 "to another session");
    int fd = -1;
    POS_CU(exporter_.take(start, c.handle, &fd), "exporting " + hex(start));
    out.emplace_back(start, c.size, fd);
  }
  return out;
}

// The peer's memory is imported and mapped side by side in one scratch reservation of this context
// (its own addresses are this client's buffers), made readable by this client's device in one
// call: the same GPU, or another one that reaches it (peer access: NVLink or PCIe). Copies run on a
// few streams. One reservation and one access call rather than one per range: the access call maps
// page tables and, GPU -> GPU, the peer mapping, which the driver does faster in one piece.
Status CudaClient::copy_from_peer(const std::vector<PeerMemory>& ranges, const std::vector<PeerBuffer>& buffers) {
  POS_RETURN_IF_ERROR(bind());
  auto at = check_peer_memory(ranges, buffers, base_, size_, granule_);
  if (!at.ok()) return at.status();
  const auto t0 = std::chrono::steady_clock::now();
  if (scratch_release_.joinable()) scratch_release_.join();  // the last switch's scratch, gone
  PeerScratch sc;
  sc.offset.resize(ranges.size());
  sc.size.resize(ranges.size());
  uint64_t& total = sc.total;
  for (size_t i = 0; i < ranges.size(); ++i) {
    sc.offset[i] = total, sc.size[i] = ranges[i].size;
    total += ranges[i].size;  // granule multiples (checked)
  }
  std::vector<uint64_t>& offset = sc.offset;
  sc.handles.assign(ranges.size(), 0);
  sc.mapped.assign(ranges.size(), false);
  std::vector<CUmemGenericAllocationHandle>& handles = sc.handles;
  std::vector<bool>& mapped = sc.mapped;
  constexpr size_t kStreams = 8;
  std::vector<CUstream>& streams = sc.streams;
  CUdeviceptr& va = sc.va;
  Status st;
  if (total > 0) {
    if (CUresult e = cuMemAddressReserve(&va, total, granule_, 0, 0); e != CUDA_SUCCESS) {
      va = 0;
      st = cu_status(e, "cuMemAddressReserve", "a scratch range for " + std::to_string(total) + " bytes of peer memory");
    }
  }
  for (size_t i = 0; i < ranges.size() && st.ok(); ++i) {
    const PeerMemory& r = ranges[i];
    const std::string what = "peer memory " + hex(r.addr);
    CUresult e = cuMemImportFromShareableHandle(&handles[i], reinterpret_cast<void*>(static_cast<uintptr_t>(r.fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (e != CUDA_SUCCESS) {
      handles[i] = 0;
      st = cu_status(e, "cuMemImportFromShareableHandle", what);
      break;
    }
    // A descriptor of less memory than it claims fails here, before anything is read.
    if ((e = cuMemMap(va + offset[i], r.size, 0, handles[i], 0)) != CUDA_SUCCESS) {
      st = cu_status(e, "cuMemMap", what + " (is it as large as it says?)");
      break;
    }
    mapped[i] = true;
  }
  if (st.ok() && total > 0) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult e = cuMemSetAccess(va, total, &access, 1); e != CUDA_SUCCESS)
      st = cu_status(e, "cuMemSetAccess", "peer memory (can this GPU reach the GPU it is on? peer access is needed)");
  }
  for (size_t k = 0; k < std::min(kStreams, at->size()) && st.ok(); ++k) {
    CUstream x = nullptr;
    if (CUresult e = cuStreamCreate(&x, CU_STREAM_NON_BLOCKING); e != CUDA_SUCCESS) st = cu_status(e, "cuStreamCreate", "peer copy");
    else streams.push_back(x);
  }
  const auto t_mapped = std::chrono::steady_clock::now();
  for (size_t k = 0; k < at->size() && st.ok(); ++k) {
    const PeerPiece& x = (*at)[k];
    const uint64_t from = va + offset[x.range] + (x.addr - ranges[x.range].addr);
    if (CUresult e = cuMemcpyDtoDAsync(x.addr, from, x.size, streams[k % streams.size()]); e != CUDA_SUCCESS)
      st = cu_status(e, "cuMemcpyDtoDAsync", "buffer piece " + hex(x.addr));
  }
  for (CUstream x : streams)
    if (st.ok())
      if (CUresult e = cuStreamSynchronize(x); e != CUDA_SUCCESS) st = cu_status(e, "cuStreamSynchronize", "peer copy");
  const auto t_copied = std::chrono::steady_clock::now();
  using ms = std::chrono::duration<double, std::milli>;
  if (!st.ok()) {
    sc.release();
    return st;
  }
  POS_INFO("cuda", "peer copy: %zu ranges, %zu pieces, %.1f MB: import and map %.1f ms, copy %.1f ms", ranges.size(),
           at->size(), static_cast<double>(total) / 1e6, ms(t_mapped - t0).count(), ms(t_copied - t_mapped).count());
  // Unmapping the peer's memory took 2-60 ms on the H200: done on a thread of its own, after the
  // restore has answered (the copies are complete; nothing of this client reads the scratch).
  scratch_release_ = std::thread([ctx = ctx_, sc = std::move(sc)]() mutable {
    if (cuCtxSetCurrent(ctx) == CUDA_SUCCESS) sc.release();
  });
  return Status::Ok();
}

Status CudaClient::alloc_at(uint64_t addr, uint64_t size) {
  POS_RETURN_IF_ERROR(bind());
  if (size == 0 || addr < base_ || size > size_ || addr - base_ > size_ - size)
    return Status::Internal("cuda backend: allocation outside the client's range");
  const uint64_t lo = addr / granule_ * granule_;
  const uint64_t hi = (addr + size + granule_ - 1) / granule_ * granule_;
  // Walk [lo, hi): reference chunks that already back part of it, map new ones for the gaps.
  std::vector<uint64_t> touched;
  uint64_t pos = lo;
  Status st;
  while (pos < hi && st.ok()) {
    auto it = chunks_.upper_bound(pos);
    if (it != chunks_.begin()) {
      auto prev = std::prev(it);
      if (pos < prev->first + prev->second.size) {  // covered
        ++prev->second.refs;
        touched.push_back(prev->first);
        pos = prev->first + prev->second.size;
        continue;
      }
    }
    const uint64_t end = (it != chunks_.end() && it->first < hi) ? it->first : hi;
    st = map_chunk(pos, end - pos);
    if (st.ok()) touched.push_back(pos);
    pos = end;
  }
  if (!st.ok()) {  // undo: nothing of this allocation stays
    for (uint64_t t : touched) {
      auto it = chunks_.find(t);
      if (--it->second.refs == 0) release_chunk(it);
    }
    return st;
  }
  allocations_[addr] = size;
  return Status::Ok();
}

Status CudaClient::free_at(uint64_t addr, uint64_t size) {
  POS_RETURN_IF_ERROR(bind());
  if (auto v = vars_.find(addr); v != vars_.end()) {  // a module global: the module owns its memory
    vars_.erase(v);
    return Status::Ok();
  }
  auto a = allocations_.find(addr);
  if (a == allocations_.end() || a->second != size)
    return Status::Internal("cuda backend: free of an address it did not allocate");
  // cudaFree waits for the device: queued work may still use the buffer, and so may a shadow's
  // copy of it that the client's streams only wait for on the device (ShadowFence).
  POS_RETURN_IF_ERROR(synchronize_all());
  if (fence_.epoch != 0) POS_CU(cuEventSynchronize(fence_.ev), "shadow fence");
  allocations_.erase(a);
  const uint64_t lo = addr / granule_ * granule_;
  const uint64_t hi = (addr + size + granule_ - 1) / granule_ * granule_;
  auto it = chunks_.upper_bound(lo);
  if (it != chunks_.begin() && std::prev(it)->first + std::prev(it)->second.size > lo) --it;
  while (it != chunks_.end() && it->first < hi) {
    auto next = std::next(it);
    if (--it->second.refs == 0) release_chunk(it);
    it = next;
  }
  return Status::Ok();
}

class CudaBackend final : public DeviceBackend {
 public:
  // `home`: the device whose context serves the control thread and pinned host memory (posd's first
  // of posd.devices): a posd serving GPU 1 makes no context on GPU 0 (518 MiB there, and a restore
  // into GPU 1 waited for it).
  CudaBackend(const StagingOptions& staging, uint64_t spin_ns, int home)
      : staging_(staging), spin_ns_(spin_ns), home_(home) {}
  ~CudaBackend() override {
    release_staging_chunks();  // through this class's host_free, while the context is there
    for (int d = 0; d < static_cast<int>(ctx_.size()); ++d)
      if (ctx_[d] != nullptr) cuDevicePrimaryCtxRelease(devs_[d]);
  }

  Status init() {
    POS_CU(cuInit(0), "driver");
    int n = 0;
    POS_CU(cuDeviceGetCount(&n), "");
    if (n == 0) return Status::Cuda(cuda::kErrorNoDevice, "cuda backend: no CUDA device is visible");
    POS_CU(cuDriverGetVersion(&driver_version_), "");
    devs_.resize(n);
    ctx_.assign(n, nullptr);
    for (int d = 0; d < n; ++d) POS_CU(cuDeviceGet(&devs_[d], d), "device " + std::to_string(d));
    // A home device this process cannot see is device 0 (posd refuses such a posd.devices itself).
    if (home_ < 0 || home_ >= n) home_ = 0;
    const std::string home = "device " + std::to_string(home_);
    // The allocation granularity is the same for every device of a kind; take the home device's.
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = devs_[home_];
    size_t g = 0;
    POS_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), home);
    granule_ = g;
    POS_RETURN_IF_ERROR(use_device(home_));
    size_t free_b = 0, total_b = 0;
    POS_CU(cuMemGetInfo(&free_b, &total_b), home);
    // What clients may reserve: free memory now, less room for the driver, cuBLAS workspaces and
    // the granule rounding of small buffers.
    const uint64_t margin = std::min<uint64_t>(free_b / 16, 2ull << 30);
    // Clients open on the home device (one device per job for now), so its memory is what they share.
    set_memory_capacity(free_b > margin ? free_b - margin : 0);
    warm_up();
    return Status::Ok();
  }

  std::string_view name() const override { return "cuda"; }
  void set_keep_shadows(bool keep) override { keep_shadows_.store(keep, std::memory_order_relaxed); }
  std::string device_name(int device) const override {
    DeviceProps p{};
    if (!properties(device, &p).ok()) return "unknown";
    return p.name;
  }
  int device_count() const override { return static_cast<int>(devs_.size()); }
  // cudaMalloc's alignment; the physical backing is shared per granule (CudaClient::alloc_at).
  uint64_t granularity() const override { return 512; }
  Status properties(int device, DeviceProps* p) const override {
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    CUdevice dev = devs_[device];
    *p = DeviceProps{};
    POS_CU(cuDeviceGetName(p->name, sizeof(p->name) - 1, dev), "device " + std::to_string(device));
    size_t total = 0;
    POS_CU(cuDeviceTotalMem(&total, dev), "");
    p->total_global_mem = total;
    auto attr = [&](CUdevice_attribute a) {
      int v = 0;
      cuDeviceGetAttribute(&v, a, dev);
      return v;
    };
    p->shared_mem_per_block = static_cast<uint64_t>(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
    p->regs_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    p->warp_size = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    p->max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    p->max_threads_dim[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    p->max_threads_dim[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    p->max_threads_dim[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    p->max_grid_size[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    p->max_grid_size[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    p->max_grid_size[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    p->major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    p->minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    p->multi_processor_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    p->max_threads_per_multi_processor = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    p->l2_cache_size = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    p->memory_bus_width = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    p->total_const_mem = static_cast<uint64_t>(attr(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY));
    p->unified_addressing = attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    p->pci_bus_id = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    p->pci_device_id = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    return Status::Ok();
  }
  Status attribute(int32_t attr, int device, int32_t* out) const override {
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    int v = 0;
    // cudaDeviceAttr values equal CUdevice_attribute's.
    POS_CU(cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(attr), devs_[device]),
           "attribute " + std::to_string(attr));
    *out = v;
    return Status::Ok();
  }
  int32_t driver_version() const override { return driver_version_; }
  Status mem_info(int device, MemInfo* out) const override {
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    POS_RETURN_IF_ERROR(use_device(device));
    size_t f = 0, t = 0;
    POS_CU(cuMemGetInfo(&f, &t), "device " + std::to_string(device));
    out->free = f, out->total = t;
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<BackendClient>> open_client(uint64_t base, uint64_t size, int device, uint32_t sms) override {
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    auto ctx = context(device);
    if (!ctx.ok()) return ctx.status();
    if (base % granule_ != 0 || size % granule_ != 0)
      return Status::InvalidArgument("cuda backend: client range " + hex(base) + " + " + hex(size) +
                                     " is not aligned to the device's " + std::to_string(granule_) + "-byte granule");
    // An SM limit: the client lives in a green context of that many SMs, so every stream it makes
    // (its default one included) and every kernel it launches runs on those SMs only.
    uint32_t granted = 0;
    CUcontext use = *ctx;
    if (sms != 0)
      if (CUcontext g = green_context(device, sms, &granted); g != nullptr) use = g;
    StagingOptions staging = staging_;
    staging.keep_shadows = keep_shadows_.load(std::memory_order_relaxed);
    auto c = std::make_unique<CudaClient>(use, devs_[device], granule_, base, size, staging, spin_ns_, &pins_, granted);
    POS_RETURN_IF_ERROR(c->open());
    return std::unique_ptr<BackendClient>(std::move(c));
  }

  StatusOr<void*> host_alloc(uint64_t bytes) override {
    POS_RETURN_IF_ERROR(use_device(home_));
    void* p = nullptr;
    // Portable: every context of the process may DMA from it (clients share the primary one).
    POS_CU(cuMemHostAlloc(&p, bytes == 0 ? 1 : bytes, CU_MEMHOSTALLOC_PORTABLE), std::to_string(bytes) + " bytes");
    return p;
  }
  Status host_free(void* p) override {
    if (p == nullptr) return Status::Ok();
    POS_RETURN_IF_ERROR(use_device(home_));
    POS_CU(cuMemFreeHost(p), "pinned host memory");
    return Status::Ok();
  }
  Status host_register(void* p, uint64_t bytes) override {
    POS_RETURN_IF_ERROR(use_device(home_));
    POS_CU(cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE), "registering " + std::to_string(bytes) + " bytes of host memory");
    return Status::Ok();
  }
  Status host_unregister(void* p) override {
    POS_RETURN_IF_ERROR(use_device(home_));
    POS_CU(cuMemHostUnregister(p), "unregistering host memory");
    return Status::Ok();
  }
  Status host_register_on_use(void* p, uint64_t bytes) override {
    pins_.add(static_cast<std::byte*>(p), bytes);
    return Status::Ok();
  }
  Status host_unregister_on_use(void* p) override {
    POS_RETURN_IF_ERROR(use_device(home_));
    if (!pins_.remove(static_cast<std::byte*>(p))) return Status::NotFound("no host memory registered on use at that address");
    return Status::Ok();
  }

 private:
  // First uses that cost a process tens of milliseconds, paid at start rather than inside a move's
  // stop (a spare session starts long before the restore it serves): the driver's first export,
  // import and mapping of a shareable allocation, the first mapping of another GPU's memory, and
  // cuBLAS's first handle and GEMM (without them the job's first step at a migration's target was
  // about 50 ms slower on the H200). The first export of each of a session's own chunks still costs
  // about 0.5 ms: ChunkExporter pays it ahead. Best effort: a failure here only means the first real use pays.
  void warm_up() {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = devs_[home_];
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0, imported = 0;
    if (cuMemCreate(&h, granule_, &prop, 0) == CUDA_SUCCESS) {
      int fd = -1;
      if (cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS) {
        if (cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS) {
          CUdeviceptr va = 0;
          if (cuMemAddressReserve(&va, granule_, granule_, 0, 0) == CUDA_SUCCESS) {
            if (cuMemMap(va, granule_, 0, imported, 0) == CUDA_SUCCESS) {
              CUmemAccessDesc access{};
              access.location = prop.location;
              access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
              // No access through it: work still queued on unmapped memory would fault the context.
              (void)cuMemSetAccess(va, granule_, &access, 1);
              (void)cuMemUnmap(va, granule_);
            }
            (void)cuMemAddressFree(va, granule_);
          }
          (void)cuMemRelease(imported);
        }
        ::close(fd);
      }
      (void)cuMemRelease(h);
    }
    // Memory of every other GPU this one reaches, mapped once: a restore that copies from a peer
    // session on another GPU (GPU -> GPU migration) found its first such mapping 90 ms slower.
    for (int d = 0; d < static_cast<int>(devs_.size()); ++d) {
      int can = 0;
      if (d == home_ || cuDeviceCanAccessPeer(&can, devs_[home_], devs_[d]) != CUDA_SUCCESS || can == 0) continue;
      CUmemAllocationProp other = prop;
      other.location.id = devs_[d];
      other.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
      CUmemGenericAllocationHandle oh = 0;
      if (cuMemCreate(&oh, granule_, &other, 0) != CUDA_SUCCESS) continue;
      CUdeviceptr va = 0;
      if (cuMemAddressReserve(&va, granule_, granule_, 0, 0) == CUDA_SUCCESS) {
        if (cuMemMap(va, granule_, 0, oh, 0) == CUDA_SUCCESS) {
          CUmemAccessDesc access{};
          access.location = prop.location;  // this GPU's access to the other's memory
          access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
          (void)cuMemSetAccess(va, granule_, &access, 1);
          (void)cuMemUnmap(va, granule_);
        }
        (void)cuMemAddressFree(va, granule_);
      }
      (void)cuMemRelease(oh);
    }
    cublasHandle_t b = nullptr;
    if (cublasCreate(&b) == CUBLAS_STATUS_SUCCESS) {
      constexpr int n = 64;
      CUdeviceptr m = 0;
      if (cuMemAlloc(&m, 3 * n * n * sizeof(float)) == CUDA_SUCCESS) {
        const float one = 1.0f, zero = 0.0f;
        auto* a = reinterpret_cast<float*>(m);
        (void)cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, a + n * n, n, &zero, a + 2 * n * n, n);
        (void)cuCtxSynchronize();
        (void)cuMemFree(m);
      }
      cublasDestroy(b);
    }
  }

  // The device's primary context, current on the calling thread (control-thread queries).
  Status use_device(int device) const {
    auto ctx = context(device);
    if (!ctx.ok()) return ctx.status();
    return make_current(*ctx);
  }
  StatusOr<CUcontext> context(int device) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (ctx_[device] == nullptr) POS_CU(cuDevicePrimaryCtxRetain(&ctx_[device], devs_[device]), "device " + std::to_string(device));
    return ctx_[device];
  }

  // A green context of `sms` SMs on `device` (docs/limits.md), made once per (device, sms) and kept
  // for the backend's life; *granted: its SMs (the driver rounds up to its SM group). nullptr when
  // the limit cannot be had (more SMs than the device has, a driver without green contexts): the
  // client then runs on the whole device, and the log says why once.
  CUcontext green_context(int device, uint32_t sms, uint32_t* granted) const {
    std::lock_guard<std::mutex> lk(mu_);
    const auto key = std::make_pair(device, sms);
    if (auto it = greens_.find(key); it != greens_.end()) {
      *granted = it->second.granted;
      return it->second.ctx;
    }
    Green& g = greens_[key];  // a failure is remembered too: said once
    const std::string what = "SM limit " + std::to_string(sms) + " on device " + std::to_string(device);
    auto fail = [&](const std::string& why) -> CUcontext {
      POS_WARN("cuda backend", "%s: %s; its clients run on all its SMs", what.c_str(), why.c_str());
      return nullptr;
    };
    CUdevResource all{}, group{}, rest{};
    if (CUresult r = cuDeviceGetDevResource(devs_[device], &all, CU_DEV_RESOURCE_TYPE_SM); r != CUDA_SUCCESS)
      return fail("cuDeviceGetDevResource failed (" + std::to_string(static_cast<int>(r)) + ")");
    if (sms > all.sm.smCount) return fail("the device has " + std::to_string(all.sm.smCount) + " SMs");
    unsigned groups = 1;
    if (CUresult r = cuDevSmResourceSplitByCount(&group, &groups, &all, &rest, 0, sms); r != CUDA_SUCCESS || groups == 0)
      return fail("no group of that many SMs (" + std::to_string(static_cast<int>(r)) + ")");
    if (group.sm.smCount >= all.sm.smCount) return nullptr;  // rounded up to the whole device: no limit
    CUdevResourceDesc desc = nullptr;
    if (CUresult r = cuDevResourceGenerateDesc(&desc, &group, 1); r != CUDA_SUCCESS)
      return fail("cuDevResourceGenerateDesc failed (" + std::to_string(static_cast<int>(r)) + ")");
    if (CUresult r = cuGreenCtxCreate(&g.green, desc, devs_[device], CU_GREEN_CTX_DEFAULT_STREAM); r != CUDA_SUCCESS)
      return fail("cuGreenCtxCreate failed (" + std::to_string(static_cast<int>(r)) + ")");
    if (CUresult r = cuCtxFromGreenCtx(&g.ctx, g.green); r != CUDA_SUCCESS) {
      g.ctx = nullptr;
      return fail("cuCtxFromGreenCtx failed (" + std::to_string(static_cast<int>(r)) + ")");
    }
    g.granted = group.sm.smCount;
    *granted = g.granted;
    POS_INFO("cuda backend", "%s: a green context of %u SMs", what.c_str(), g.granted);
    return g.ctx;
  }
  struct Green {
    CUgreenCtx green = nullptr;  // never destroyed: clients' streams belong to it until posd ends
    CUcontext ctx = nullptr;
    uint32_t granted = 0;
  };
  mutable std::map<std::pair<int, uint32_t>, Green> greens_;  // under mu_

  const StagingOptions staging_;  // each client's pageable-copy staging (docs/cuda_backend.md)
  std::atomic<bool> keep_shadows_{staging_.keep_shadows};  // for clients opened from now on
  const uint64_t spin_ns_;
  OnUsePins pins_;  // session arenas, page-locked as copies name them (outlives every client)
  int home_ = 0;
  int driver_version_ = 0;
  uint64_t granule_ = 2u << 20;
  std::vector<CUdevice> devs_;
  mutable std::mutex mu_;  // guards ctx_
  mutable std::vector<CUcontext> ctx_;
};

}  // namespace
}  // namespace pos::cudabk

// The entry point libpos looks up after loading this library (pos/backend.cc).
extern "C" __attribute__((visibility("default"))) pos::DeviceBackend* pos_cuda_backend_create(const pos::Config* config,
                                                                                              pos::Status* status) {
  pos::StagingOptions staging;
  auto threads = pos::copy_threads_from_env(std::getenv("POS_COPY_THREADS"), std::thread::hardware_concurrency());
  if (!threads.ok()) {
    *status = threads.status();
    return nullptr;
  }
  staging.threads = *threads;
  if (config != nullptr) {
    staging.ckpt_lanes = config->ckpt_copy_threads;
    staging.ckpt_staging_bytes = config->ckpt_staging_bytes;
    staging.keep_shadows = config->ckpt_keep_shadows.value_or(false);
  }
  const uint64_t spin_ns = config != nullptr ? config->spin_ns : pos::Config{}.spin_ns;
  const int home = config != nullptr && !config->posd_devices.empty() ? config->posd_devices.front() : 0;
  auto b = std::make_unique<pos::cudabk::CudaBackend>(staging, spin_ns, home);
  *status = b->init();
  if (!status->ok()) return nullptr;
  return b.release();
}
