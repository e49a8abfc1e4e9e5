// host_backend.cc — host backend implementation. Each client's device range is one PROT_NONE
// reservation; allocations make pages accessible, frees drop them, so stale pointers cannot read old data.
#include "pos/backends/host/host_backend.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>

#include "pos/backends/host/cpu_blas.h"
#include "pos/backends/host/host_kernels.h"
#include "pos/backends/host/host_stream.h"
#include "pos/base/hex.h"
#include "pos/base/log.h"

namespace pos::host {
namespace {

constexpr uint64_t kPage = 4096;
constexpr int32_t kDriverVersion = 13000;

struct HostEvent {
  uint32_t flags = 0;
  std::shared_ptr<HostStream> stream;  // of the latest record
  uint64_t seq = 0;
  std::shared_ptr<std::atomic<uint64_t>> time_ns;  // set when the record op runs
};

struct HostFunction {
  const HostKernel* kernel = nullptr;  // null: not in the library (launch refused earlier)
  int32_t max_dynamic_smem = 48 << 10;
  int32_t carveout = -1;
};

struct HostBlas {
  BackendObj stream = 0;
  int32_t math_mode = 0;
};

// Device memory is host memory at the same addresses, so the checkpoint engine's copies are plain
// memcpy on the calling thread (they finish before the call returns; lanes need no waiting).
class HostCopier final : public DeviceCopier {
 public:
  ~HostCopier() override {
    for (auto& [p, n] : shadows_) std::free(reinterpret_cast<void*>(p));
  }
  Status to_host_async(void* dst, uint64_t src, uint64_t n, int) override {
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return Status::Ok();
  }
  Status to_device_async(uint64_t dst, const void* src, uint64_t n, int) override {
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
    return Status::Ok();
  }
  Status device_copy_async(uint64_t dst, uint64_t src, uint64_t n, int) override {
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return Status::Ok();
  }
  Status wait(int) override { return Status::Ok(); }
  StatusOr<uint64_t> shadow_alloc(uint64_t n) override {
    void* p = std::malloc(n == 0 ? 1 : n);
    if (p == nullptr) return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation, "no memory for a shadow");
    shadows_[reinterpret_cast<uint64_t>(p)] = n;
    return reinterpret_cast<uint64_t>(p);
  }
  void shadow_free(uint64_t addr) override {
    if (shadows_.erase(addr) != 0) std::free(reinterpret_cast<void*>(addr));
  }

 private:
  std::unordered_map<uint64_t, uint64_t> shadows_;
};

class HostClient final : public BackendClient {
 public:
  HostClient(uint64_t base, uint64_t size, uint64_t spin_ns) : base_(base), size_(size), spin_ns_(spin_ns) {
    default_ = std::make_shared<HostStream>(0, 0, spin_ns_);
  }
  ~HostClient() override;

  Status reserve() {
    void* p = mmap(reinterpret_cast<void*>(base_), size_, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED || p != reinterpret_cast<void*>(base_)) {
      if (p != MAP_FAILED) munmap(p, size_);
      return Status(Code::kUnavailable, cuda::kErrorMemoryAllocation,
                    "cannot reserve device range " + std::to_string(base_) + ": " + std::strerror(errno));
    }
    reserved_ = true;
    return Status::Ok();
  }

  Status alloc_at(uint64_t addr, uint64_t size) override;
  Status free_at(uint64_t addr, uint64_t size) override;
  StatusOr<std::vector<PeerMemory>> export_memory() override;
  Status copy_from_peer(const std::vector<PeerMemory>& ranges, const std::vector<PeerBuffer>& buffers) override;
  StatusOr<std::unique_ptr<DeviceCopier>> make_copier() override {
    return std::unique_ptr<DeviceCopier>(std::make_unique<HostCopier>());
  }

  Status memcpy_h2d(uint64_t dst, const void* src, uint64_t n) override {
    return run_sync([=] { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
  }
  Status memcpy_h2d_async(uint64_t dst, std::vector<std::byte>&& buf, uint64_t offset, uint64_t n,
                          BackendObj stream) override {
    auto data = std::make_shared<std::vector<std::byte>>(std::move(buf));
    return enqueue(stream, [=] { std::memcpy(reinterpret_cast<void*>(dst), data->data() + offset, n); });
  }
  Status memcpy_d2h(void* dst, uint64_t src, uint64_t n) override {
    return run_sync([=] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
  }
  Status memcpy_d2h_async(void* dst, uint64_t src, uint64_t n, BackendObj stream) override {
    return enqueue(stream, [=] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
  }
  Status memcpy_d2d(uint64_t dst, uint64_t src, uint64_t n, BackendObj stream, bool sync) override {
    auto fn = [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); };
    return sync ? run_sync(fn) : enqueue(stream, fn);
  }
  Status memset(uint64_t dst, int value, uint64_t n, BackendObj stream, bool sync) override {
    auto fn = [=] { std::memset(reinterpret_cast<void*>(dst), value, n); };
    return sync ? run_sync(fn) : enqueue(stream, fn);
  }

  StatusOr<BackendObj> stream_create(uint32_t flags, int32_t priority) override {
    const BackendObj id = next_id_++;
    streams_[id] = std::make_shared<HostStream>(flags, priority, spin_ns_);
    return id;
  }
  Status stream_destroy(BackendObj s) override {
    auto it = streams_.find(s);
    if (it == streams_.end()) return not_found("stream", s);
    streams_.erase(it);  // the executor finishes queued work before it goes (CUDA semantics)
    return Status::Ok();
  }
  Status stream_synchronize(BackendObj s) override {
    auto st = stream(s);
    if (!st) return not_found("stream", s);
    st->wait_idle();
    return Status::Ok();
  }
  Status stream_query(BackendObj s) override {
    auto st = stream(s);
    if (!st) return not_found("stream", s);
    return st->idle() ? Status::Ok() : Status::Cuda(cuda::kErrorNotReady, "stream has pending work");
  }
  Status stream_wait_event(BackendObj s, BackendObj e) override {
    auto st = stream(s);
    auto ev = events_.find(e);
    if (!st) return not_found("stream", s);
    if (ev == events_.end()) return not_found("event", e);
    if (!ev->second.stream) return Status::Ok();  // never recorded: no dependency (CUDA)
    std::vector<StreamDep> deps = deps_for(st);
    deps.push_back(StreamDep{ev->second.stream, ev->second.seq});
    st->enqueue([] {}, std::move(deps));
    return Status::Ok();
  }

  StatusOr<BackendObj> event_create(uint32_t flags) override {
    const BackendObj id = next_id_++;
    events_[id].flags = flags;
    return id;
  }
  Status event_destroy(BackendObj e) override {
    if (events_.erase(e) == 0) return not_found("event", e);
    return Status::Ok();
  }
  Status event_record(BackendObj e, BackendObj s) override {
    auto ev = events_.find(e);
    if (ev == events_.end()) return not_found("event", e);
    auto st = stream(s);
    if (!st) return not_found("stream", s);
    auto t = std::make_shared<std::atomic<uint64_t>>(0);
    ev->second.stream = st;
    ev->second.time_ns = t;
    ev->second.seq = st->enqueue([t] { t->store(now_ns(), std::memory_order_release); }, deps_for(st));
    return Status::Ok();
  }
  Status event_synchronize(BackendObj e) override {
    auto ev = events_.find(e);
    if (ev == events_.end()) return not_found("event", e);
    if (ev->second.stream) ev->second.stream->wait_for(ev->second.seq);
    return Status::Ok();
  }
  Status event_query(BackendObj e) override {
    auto ev = events_.find(e);
    if (ev == events_.end()) return not_found("event", e);
    if (ev->second.stream && ev->second.stream->completed() < ev->second.seq)
      return Status::Cuda(cuda::kErrorNotReady, "event not reached yet");
    return Status::Ok();
  }
  StatusOr<float> event_elapsed_ms(BackendObj a, BackendObj b) override {
    auto ea = events_.find(a), eb = events_.find(b);
    if (ea == events_.end()) return not_found("event", a);
    if (eb == events_.end()) return not_found("event", b);
    if (!ea->second.time_ns || !eb->second.time_ns)
      return Status::Cuda(cuda::kErrorInvalidResourceHandle, "event was never recorded");
    const uint64_t ta = ea->second.time_ns->load(std::memory_order_acquire);
    const uint64_t tb = eb->second.time_ns->load(std::memory_order_acquire);
    if (ta == 0 || tb == 0) return Status::Cuda(cuda::kErrorNotReady, "event not reached yet");
    return static_cast<float>((static_cast<double>(tb) - static_cast<double>(ta)) / 1e6);
  }

  Status synchronize_all() override {
    default_->wait_idle();
    for (auto& [id, s] : streams_) s->wait_idle();
    return Status::Ok();
  }

  StatusOr<BackendObj> module_load(std::span<const std::byte> fatbin) override {
    (void)fatbin;  // the host runs kernels from its library; the container was validated by the parser
    const BackendObj id = next_id_++;
    modules_.emplace(id, 0);
    return id;
  }
  Status module_unload(BackendObj m) override {
    if (modules_.erase(m) == 0) return not_found("module", m);
    for (auto it = functions_.begin(); it != functions_.end();) {
      if (function_module_[it->first] == m) {
        function_module_.erase(it->first);
        it = functions_.erase(it);
      } else {
        ++it;
      }
    }
    return Status::Ok();
  }
  StatusOr<FunctionInfo> function_get(BackendObj m, const std::string& name) override {
    if (modules_.count(m) == 0) return not_found("module", m);
    FunctionInfo info;
    const HostKernel* k = KernelRegistry::global().find(name);
    info.obj = next_id_++;
    info.found = k != nullptr;
    if (k != nullptr) {
      for (const ParamInfo& p : k->layout) info.layout.push_back(KernelParam{p.offset, p.size, p.read_only_pointer});
      info.param_bytes = k->param_bytes;
    } else {
      POS_INFO("host backend", "no host kernel named '%s' (launches will fail)", name.c_str());
    }
    functions_[info.obj] = HostFunction{k};
    function_module_[info.obj] = m;
    return info;
  }
  Status var_bind(BackendObj m, const std::string&, uint64_t addr, uint64_t size) override {
    if (modules_.count(m) == 0) return not_found("module", m);
    return alloc_at(addr, size);
  }
  Status launch(BackendObj f, const LaunchDims& d, std::span<const std::byte> params, BackendObj s) override {
    auto it = functions_.find(f);
    if (it == functions_.end()) return not_found("function", f);
    const HostKernel* k = it->second.kernel;
    if (k == nullptr) return Status::Cuda(cuda::kErrorInvalidDeviceFunction, "no host kernel for this function");
    if (d.shared_mem > static_cast<uint64_t>(it->second.max_dynamic_smem) && d.shared_mem > (48u << 10))
      return Status::Cuda(cuda::kErrorInvalidValue, "dynamic shared memory above the function's maximum");
    // One record: entry, geometry, parameter bytes; it rides in the stream's queue slot.
    struct Header {
      KernelEntry entry;
      LaunchGeometry g;
    };
    alignas(16) std::byte rec[sizeof(Header) + 4096];
    if (params.size() > 4096) return Status::Cuda(cuda::kErrorInvalidValue, "kernel parameters exceed 4 KiB");
    if (params.size() < k->param_bytes)
      return Status::Cuda(cuda::kErrorInvalidValue, "'" + k->name + "' takes " + std::to_string(k->param_bytes) +
                                                        " parameter bytes, got " + std::to_string(params.size()));
    POS_RETURN_IF_ERROR(check_pointers(*k, params));
    Header hdr{k->entry, LaunchGeometry{emu::Dim3{d.grid[0], d.grid[1], d.grid[2]},
                                        emu::Dim3{d.block[0], d.block[1], d.block[2]}, d.shared_mem}};
    std::memcpy(rec, &hdr, sizeof(hdr));
    if (!params.empty()) std::memcpy(rec + sizeof(hdr), params.data(), params.size());
    auto run = [](const std::byte* bytes) {
      Header h;
      std::memcpy(&h, bytes, sizeof(h));
      h.entry(h.g, bytes + sizeof(Header));
    };
    // Borrowed, not copied: a shared_ptr copy is two locked instructions on every launch.
    const std::shared_ptr<HostStream>* stp = stream_ref(s);
    if (stp == nullptr) return not_found("stream", s);
    const std::shared_ptr<HostStream>& st = *stp;
    std::vector<StreamDep> deps = deps_for(st);
    if (deps.empty()) {
      st->enqueue_inline(run, rec, sizeof(hdr) + params.size());
      return Status::Ok();
    }
    std::vector<std::byte> copy(rec, rec + sizeof(hdr) + params.size());
    st->enqueue([run, c = std::move(copy)] { run(c.data()); }, std::move(deps));
    return Status::Ok();
  }
  StatusOr<FuncAttributes> function_attributes(BackendObj f) override {
    auto it = functions_.find(f);
    if (it == functions_.end()) return not_found("function", f);
    FuncAttributes a{};
    a.max_threads_per_block = 1024;
    a.ptx_version = 90;
    a.binary_version = 90;
    a.max_dynamic_shared_size_bytes = it->second.max_dynamic_smem;
    a.preferred_shmem_carveout = it->second.carveout;
    return a;
  }
  Status function_set_attribute(BackendObj f, int32_t attr, int32_t value) override {
    auto it = functions_.find(f);
    if (it == functions_.end()) return not_found("function", f);
    if (attr == 8) {  // cudaFuncAttributeMaxDynamicSharedMemorySize
      if (value < 0 || value > (227 << 10)) return Status::Cuda(cuda::kErrorInvalidValue, "shared memory size out of range");
      it->second.max_dynamic_smem = value;
      return Status::Ok();
    }
    if (attr == 9) {  // cudaFuncAttributePreferredSharedMemoryCarveout
      if (value < -1 || value > 100) return Status::Cuda(cuda::kErrorInvalidValue, "carveout out of range");
      it->second.carveout = value;
      return Status::Ok();
    }
    return Status::Cuda(cuda::kErrorInvalidValue, "function attribute " + std::to_string(attr) + " not supported");
  }
  StatusOr<int32_t> occupancy(BackendObj f, int32_t block, uint64_t smem, uint32_t) override {
    auto it = functions_.find(f);
    if (it == functions_.end()) return not_found("function", f);
    if (block > 1024) return 0;
    // A Hopper-like SM: 2048 threads, 32 blocks, 228 KiB shared memory.
    const int32_t warps = (block + 31) / 32;
    int32_t n = std::min(32, 64 / warps);
    if (smem > 0) n = std::min<int64_t>(n, static_cast<int64_t>((228u << 10) / (smem + 1024)));
    return n;
  }

  StatusOr<BackendObj> blas_create() override {
    const BackendObj id = next_id_++;
    blas_[id] = HostBlas{};
    return id;
  }
  Status blas_destroy(BackendObj h) override {
    if (blas_.erase(h) == 0) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    return Status::Ok();
  }
  Status blas_set_stream(BackendObj h, BackendObj s) override {
    auto it = blas_.find(h);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    if (!stream(s)) return Status::Cublas(cuda::kCublasInvalidValue, "unknown stream");
    it->second.stream = s;
    return Status::Ok();
  }
  Status blas_set_math_mode(BackendObj h, int32_t mode) override {
    auto it = blas_.find(h);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    it->second.math_mode = mode;
    return Status::Ok();
  }
  Status blas_gemm(BackendObj h, const GemmArgs& g) override {
    auto it = blas_.find(h);
    if (it == blas_.end()) return Status::Cublas(cuda::kCublasNotInitialized, "unknown cuBLAS handle");
    if (g.a_type != kCudaR32F || g.b_type != kCudaR32F || g.c_type != kCudaR32F)
      return Status::Cublas(cuda::kCublasNotSupported, "the host backend computes float GEMMs only");
    if (g.compute_type != 0 && g.compute_type != kCublasCompute32F && g.compute_type != kCublasCompute32FFastTF32)
      return Status::Cublas(cuda::kCublasNotSupported, "unsupported compute type on the host backend");
    // TF32 modes compute in full float here: the host has no reduced-precision path.
    Status s = enqueue(it->second.stream, [g] {
      sgemm_strided_batched(static_cast<BlasOp>(g.transa), static_cast<BlasOp>(g.transb), g.m, g.n, g.k, g.alpha,
                            reinterpret_cast<const float*>(g.a), g.lda, g.stride_a, reinterpret_cast<const float*>(g.b),
                            g.ldb, g.stride_b, g.beta, reinterpret_cast<float*>(g.c), g.ldc, g.stride_c,
                            std::max(1, g.batch));
    });
    if (!s.ok()) return Status::Cublas(cuda::kCublasExecutionFailed, s.message());
    return s;
  }

 private:
  static Status not_found(const char* what, BackendObj id) {
    return Status::Cuda(cuda::kErrorInvalidResourceHandle, std::string("host backend: unknown ") + what + " " +
                                                               std::to_string(id));
  }
  std::shared_ptr<HostStream> stream(BackendObj s) {
    const std::shared_ptr<HostStream>* p = stream_ref(s);
    return p == nullptr ? nullptr : *p;
  }
  const std::shared_ptr<HostStream>* stream_ref(BackendObj s) const {
    if (s == 0) return &default_;
    auto it = streams_.find(s);
    return it == streams_.end() ? nullptr : &it->second;
  }
  // Legacy default-stream semantics: the default stream waits for all blocking streams, and a
  // blocking stream waits for the default stream. Non-blocking streams do neither.
  std::vector<StreamDep> deps_for(const std::shared_ptr<HostStream>& s) {
    std::vector<StreamDep> deps;
    if (s == default_) {
      for (auto& [id, t] : streams_) {
        if ((t->flags() & cuda::kStreamNonBlocking) == 0 && !t->idle()) deps.push_back({t, t->submitted()});
      }
    } else if ((s->flags() & cuda::kStreamNonBlocking) == 0 && !default_->idle()) {
      deps.push_back({default_, default_->submitted()});
    }
    return deps;
  }
  Status enqueue(BackendObj s, std::function<void()> fn) {
    auto st = stream(s);
    if (!st) return not_found("stream", s);
    st->enqueue(std::move(fn), deps_for(st));
    return Status::Ok();
  }
  Status run_sync(std::function<void()> fn) {
    const uint64_t seq = default_->enqueue(std::move(fn), deps_for(default_));
    default_->wait_for(seq);
    return Status::Ok();
  }
  bool in_range(uint64_t addr, uint64_t size) const {
    return addr >= base_ && size <= size_ && addr - base_ <= size_ - size;
  }
  // A host kernel runs in this process (posd: beside every other session's memory and pinned
  // arena), so each pointer it will follow must be null or this client's own: inside one of its
  // live buffers or variables, or one past the end (an end pointer, as CUDA allows). The parser
  // cannot tell a pointer outside the POS window from an integer; the kernel's C++ types can.
  // Anything else fails the launch as a device fault would, and no thread runs.
  Status check_pointers(const HostKernel& k, std::span<const std::byte> params) const {
    for (const PointerSlot& p : k.pointers) {
      uint64_t v = 0;
      std::memcpy(&v, params.data() + p.offset, sizeof v);
      if (v == 0 || owns(v)) [[likely]] continue;
      return Status::Cuda(cuda::kErrorIllegalAddress, "parameter " + std::to_string(p.param) + " of '" + k.name +
                                                          "' (" + hex(v) +
                                                          ") is in no buffer or variable of this client: not run");
    }
    return Status::Ok();
  }
  bool owns(uint64_t v) const {
    auto it = allocations_.upper_bound(v);  // the first buffer that starts above v
    if (it == allocations_.begin()) return false;
    --it;
    return v - it->first <= it->second;
  }

  const uint64_t base_, size_, spin_ns_;
  bool reserved_ = false;
  BackendObj next_id_ = 1;
  std::shared_ptr<HostStream> default_;
  std::unordered_map<BackendObj, std::shared_ptr<HostStream>> streams_;
  std::unordered_map<BackendObj, HostEvent> events_;
  std::unordered_map<BackendObj, int> modules_;
  std::unordered_map<BackendObj, HostFunction> functions_;
  std::unordered_map<BackendObj, BackendObj> function_module_;
  std::unordered_map<BackendObj, HostBlas> blas_;
  // Live buffers and variables, addr → the bytes asked for (mapped: whole pages): sorted, so a
  // launch finds the one below a pointer in one lookup.
  std::map<uint64_t, uint64_t> allocations_;
};

class HostBackend final : public DeviceBackend {
 public:
  explicit HostBackend(const Config& c) : config_(c) { set_memory_capacity(c.host_device_memory); }
  std::string_view name() const override { return "host"; }
  std::string device_name(int) const override { return config_.host_device_name; }
  int device_count() const override { return static_cast<int>(config_.host_device_count); }
  uint64_t granularity() const override { return kPage; }
  Status properties(int device, DeviceProps* p) const override {
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    *p = DeviceProps{};
    std::snprintf(p->name, sizeof(p->name), "%s", config_.host_device_name.c_str());
    p->total_global_mem = config_.host_device_memory;
    p->shared_mem_per_block = 48 << 10;
    p->regs_per_block = 65536;
    p->warp_size = 32;
    p->max_threads_per_block = 1024;
    p->max_threads_dim[0] = 1024, p->max_threads_dim[1] = 1024, p->max_threads_dim[2] = 64;
    p->max_grid_size[0] = 0x7fffffff, p->max_grid_size[1] = 65535, p->max_grid_size[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multi_processor_count = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    p->max_threads_per_multi_processor = 2048;
    p->l2_cache_size = 50 << 20;
    p->memory_bus_width = 5120;
    p->total_const_mem = 64 << 10;
    p->unified_addressing = 1;
    p->pci_bus_id = 0;
    p->pci_device_id = device;
    return Status::Ok();
  }
  Status attribute(int32_t attr, int device, int32_t* out) const override {
    DeviceProps p{};
    POS_RETURN_IF_ERROR(properties(device, &p));
    switch (attr) {  // cudaDeviceAttr values
      case 1: *out = p.max_threads_per_block; break;
      case 2: *out = p.max_threads_dim[0]; break;
      case 3: *out = p.max_threads_dim[1]; break;
      case 4: *out = p.max_threads_dim[2]; break;
      case 5: *out = p.max_grid_size[0]; break;
      case 6: *out = p.max_grid_size[1]; break;
      case 7: *out = p.max_grid_size[2]; break;
      case 8: *out = static_cast<int32_t>(p.shared_mem_per_block); break;
      case 9: *out = static_cast<int32_t>(p.total_const_mem); break;
      case 10: *out = p.warp_size; break;
      case 12: *out = p.regs_per_block; break;
      case 16: *out = p.multi_processor_count; break;
      case 33: *out = p.pci_bus_id; break;
      case 34: *out = p.pci_device_id; break;
      case 39: *out = p.max_threads_per_multi_processor; break;
      case 41: *out = p.unified_addressing; break;
      case 75: *out = p.major; break;
      case 76: *out = p.minor; break;
      case 97: *out = 227 << 10; break;  // MaxSharedMemoryPerBlockOptin
      default:
        return Status::Cuda(cuda::kErrorInvalidValue, "device attribute " + std::to_string(attr) +
                                                          " is not reported by the host backend");
    }
    return Status::Ok();
  }
  int32_t driver_version() const override { return kDriverVersion; }
  Status mem_info(int device, MemInfo* out) const override {
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    const uint64_t used = reserved_bytes();
    out->total = config_.host_device_memory;
    out->free = used >= out->total ? 0 : out->total - used;
    return Status::Ok();
  }
  // The host backend has no SMs: an SM limit (posd.limits' sms) leaves its clients as they are.
  StatusOr<std::unique_ptr<BackendClient>> open_client(uint64_t base, uint64_t size, int device, uint32_t) override {
    // Every device is this process's memory; the index only has to exist (a client on device 1
    // is what a restore onto another GPU produces).
    if (device < 0 || device >= device_count()) return Status::Cuda(cuda::kErrorInvalidDevice, "no such device");
    auto c = std::make_unique<HostClient>(base, size, config_.spin_ns);
    POS_RETURN_IF_ERROR(c->reserve());
    return std::unique_ptr<BackendClient>(std::move(c));
  }

 private:
  const Config config_;
};

HostClient::~HostClient() {
  default_->wait_idle();
  streams_.clear();  // each executor drains, then joins
  default_.reset();
  if (reserved_) munmap(reinterpret_cast<void*>(base_), size_);
}

Status HostClient::alloc_at(uint64_t addr, uint64_t bytes) {
  const uint64_t size = (bytes + kPage - 1) / kPage * kPage;
  if (bytes == 0 || !in_range(addr, size) || addr % kPage != 0)
    return Status::Internal("host backend: allocation outside the client's range");
  if (mprotect(reinterpret_cast<void*>(addr), size, PROT_READ | PROT_WRITE) != 0) {
    return Status::Cuda(cuda::kErrorMemoryAllocation, std::string("mprotect: ") + std::strerror(errno));
  }
  allocations_[addr] = bytes;
  return Status::Ok();
}

Status HostClient::free_at(uint64_t addr, uint64_t bytes) {
  const uint64_t size = (bytes + kPage - 1) / kPage * kPage;
  auto it = allocations_.find(addr);
  if (it == allocations_.end() || (it->second + kPage - 1) / kPage * kPage != size)
    return Status::Internal("host backend: free of an address it did not allocate");
  // Work already queued may still use the buffer (cudaFree synchronizes too).
  POS_RETURN_IF_ERROR(synchronize_all());
  madvise(reinterpret_cast<void*>(addr), size, MADV_DONTNEED);  // contents gone: zero on reuse
  mprotect(reinterpret_cast<void*>(addr), size, PROT_NONE);
  allocations_.erase(it);
  return Status::Ok();
}

// The host backend's "device memory" is this process's private memory: what it hands another
// session is a memfd holding a copy of each allocation (the CUDA backend hands the memory itself).
StatusOr<std::vector<PeerMemory>> HostClient::export_memory() {
  POS_RETURN_IF_ERROR(synchronize_all());
  std::vector<PeerMemory> out;
  out.reserve(allocations_.size());
  for (const auto& [addr, bytes] : allocations_) {
    const uint64_t size = (bytes + kPage - 1) / kPage * kPage;
    const int fd = ::memfd_create("pos-peer", MFD_CLOEXEC);
    if (fd < 0) return Status::Unavailable(std::string("memfd_create: ") + std::strerror(errno));
    PeerMemory m(addr, size, fd);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
      return Status::Unavailable("sizing the copy of " + hex(addr) + ": " + std::strerror(errno));
    for (uint64_t off = 0; off < size;) {
      const ssize_t w = ::pwrite(fd, reinterpret_cast<const char*>(addr) + off, size - off, static_cast<off_t>(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Status::Unavailable("copying " + hex(addr) + ": " + std::strerror(errno));
      off += static_cast<uint64_t>(w);
    }
    out.push_back(std::move(m));
  }
  return out;
}

Status HostClient::copy_from_peer(const std::vector<PeerMemory>& ranges, const std::vector<PeerBuffer>& buffers) {
  auto at = check_peer_memory(ranges, buffers, base_, size_, kPage);
  if (!at.ok()) return at.status();
  for (const PeerBuffer& b : buffers) {
    auto it = allocations_.upper_bound(b.addr);
    if (it == allocations_.begin() || b.addr + b.size > std::prev(it)->first + std::prev(it)->second)
      return Status::InvalidArgument("buffer " + hex(b.addr) + " is not allocated in this client");
  }
  std::vector<void*> maps(ranges.size(), nullptr);
  Status st;
  for (size_t i = 0; i < ranges.size() && st.ok(); ++i) {
    struct stat sb {};
    if (::fstat(ranges[i].fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < ranges[i].size) {
      st = Status::InvalidArgument("peer memory " + hex(ranges[i].addr) + " is smaller than it says");
      break;
    }
    void* p = ::mmap(nullptr, ranges[i].size, PROT_READ, MAP_SHARED, ranges[i].fd, 0);
    if (p == MAP_FAILED) st = Status::Unavailable("mapping peer memory " + hex(ranges[i].addr) + ": " + std::strerror(errno));
    else maps[i] = p;
  }
  for (size_t k = 0; k < at->size() && st.ok(); ++k) {
    const PeerPiece& x = (*at)[k];
    std::memcpy(reinterpret_cast<void*>(x.addr), static_cast<const char*>(maps[x.range]) + (x.addr - ranges[x.range].addr),
                x.size);
  }
  for (size_t i = 0; i < maps.size(); ++i)
    if (maps[i] != nullptr) ::munmap(maps[i], ranges[i].size);
  return st;
}

}  // namespace

std::unique_ptr<DeviceBackend> make_host_backend(const Config& config) { return std::make_unique<HostBackend>(config); }

}  // namespace pos::host
