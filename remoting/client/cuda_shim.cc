// cuda_shim.cc — the CUDA runtime and cuBLAS entry points an unmodified program calls, nvcc's hidden
// registration hooks included; each goes through ClientRuntime (in libpos_client and libpos_inproc).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "pos/base/cuda_errors.h"
#include "pos/base/fatbin.h"
#include "remoting/client/client_runtime.h"

using pos::ClientRuntime;
using pos::Status;

namespace {

ClientRuntime* rt() { return ClientRuntime::get(); }
cudaError_t done(const Status& s) { return static_cast<cudaError_t>(rt()->record(s)); }
cublasStatus_t blas_done(const Status& s) { return static_cast<cublasStatus_t>(s.ok() ? 0 : s.api_error()); }
uint64_t u64(const void* p) { return reinterpret_cast<uint64_t>(p); }
// Stream and device synchronizations are the points POS_CHECKPOINT counts (the app's own notion
// of "a step is done"); only successful ones count, and a checkpoint's error becomes the call's.
Status synced(const Status& s) { return s.ok() ? rt()->after_sync() : s; }

struct LaunchConfig {
  dim3 grid, block;
  size_t shared = 0;
  cudaStream_t stream = nullptr;
};
thread_local std::vector<LaunchConfig> t_configs;

struct ModuleRecord {
  uint64_t module = 0;
};

struct FatbinWrapper {  // __fatBinC_Wrapper_t
  int magic;
  int version;
  const unsigned long long* data;
  void* filename_or_fatbins;
};

cudaError_t launch(const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream) {
  const pos::RegisteredFunction* f = rt()->function(func);
  if (f == nullptr) return done(Status::Cuda(pos::cuda::kErrorInvalidDeviceFunction, "unknown kernel"));
  if (!f->found) return done(Status::Cuda(pos::cuda::kErrorInvalidDeviceFunction, "kernel not available on the device"));
  // Serialize each argument by the layout the device reported.
  thread_local std::vector<std::byte> buf;
  buf.assign(f->param_bytes, std::byte{0});
  for (size_t i = 0; i < f->params.size(); ++i) std::memcpy(buf.data() + f->params[i].offset, args[i], f->params[i].size);
  pos::LaunchDims d{{grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, shared};
  return done(rt()->api().launch_kernel(f->handle, d, u64(stream), buf));
}

}  // namespace

// The libraries are built with hidden visibility; these are what they export (with
// cuda_entry_points.map).
#pragma GCC visibility push(default)
extern "C" {

// ---------------- hidden registration hooks ----------------
void** __cudaRegisterFatBinary(void* fat_cubin) {
  auto* rec = new ModuleRecord();
  const auto* w = static_cast<const FatbinWrapper*>(fat_cubin);
  if (w == nullptr || static_cast<uint32_t>(w->magic) != pos::kFatbinWrapperMagic || w->data == nullptr) {
    rt()->record(Status::Cuda(pos::cuda::kErrorInvalidKernelImage, "bad fatbin wrapper"));
    return reinterpret_cast<void**>(rec);
  }
  pos::FatbinHeader h{};
  std::memcpy(&h, w->data, sizeof(h));
  const auto* bytes = reinterpret_cast<const std::byte*>(w->data);
  const size_t n = static_cast<size_t>(h.header_size) + static_cast<size_t>(h.fat_size);
  rt()->record(rt()->api().register_fatbin(&rec->module, std::span<const std::byte>(bytes, n)));
  return reinterpret_cast<void**>(rec);
}

void __cudaRegisterFatBinaryEnd(void**) {}

void __cudaUnregisterFatBinary(void** handle) {
  auto* rec = reinterpret_cast<ModuleRecord*>(handle);
  if (rec == nullptr) return;
  if (rec->module != 0) (void)rt()->api().unregister_fatbin(rec->module);
  delete rec;
}

void __cudaRegisterFunction(void** handle, const char* host_fun, char* device_fun, const char*, int, uint3*, uint3*,
                            dim3*, dim3*, int*) {
  auto* rec = reinterpret_cast<ModuleRecord*>(handle);
  pos::RegisteredFunction f;
  Status s = rt()->api().register_function(&f, rec->module, device_fun);
  if (s.ok()) rt()->add_function(host_fun, std::move(f));
  rt()->record(s);
}

void __cudaRegisterVar(void** handle, char* host_var, char*, const char* device_name, int, size_t size, int constant,
                       int) {
  auto* rec = reinterpret_cast<ModuleRecord*>(handle);
  uint64_t addr = 0;
  Status s = rt()->api().register_var(&addr, rec->module, device_name, size, constant != 0);
  if (s.ok()) rt()->add_var(host_var, addr);
  rt()->record(s);
}

char __cudaInitModule(void**) { return 1; }

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream) {
  t_configs.push_back(LaunchConfig{grid, block, shared, stream});
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  if (t_configs.empty()) return cudaErrorMissingConfiguration;
  const LaunchConfig c = t_configs.back();
  t_configs.pop_back();
  *grid = c.grid, *block = c.block, *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_fun) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(host_fun));  // the stub's address is the key
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                               cudaStream_t stream) {
  return launch(reinterpret_cast<const void*>(kernel), grid, block, args, shared, stream);
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                                    cudaStream_t stream) {
  return launch(reinterpret_cast<const void*>(kernel), grid, block, args, shared, stream);
}
cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream) {
  return launch(func, grid, block, args, shared, stream);
}

// ---------------- errors (answered locally) ----------------
const char* cudaGetErrorName(cudaError_t e) { return pos::cuda::error_name(e).data(); }
const char* cudaGetErrorString(cudaError_t e) { return pos::cuda::error_name(e).data(); }
cudaError_t cudaGetLastError(void) { return static_cast<cudaError_t>(rt()->take_last_error()); }
cudaError_t cudaPeekAtLastError(void) { return static_cast<cudaError_t>(rt()->peek_last_error()); }

// ---------------- device ----------------
cudaError_t cudaGetDeviceCount(int* n) {
  int32_t v = 0;
  Status s = rt()->api().get_device_count(&v);
  if (s.ok()) *n = v;
  return done(s);
}
cudaError_t cudaGetDevice(int* d) {
  int32_t v = 0;
  Status s = rt()->api().get_device(&v);
  if (s.ok()) *d = v;
  return done(s);
}
cudaError_t cudaSetDevice(int d) { return done(rt()->api().set_device(d)); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  pos::DeviceProps p{};
  Status s = rt()->api().get_device_properties(&p, device);
  if (!s.ok()) return done(s);
  std::memset(prop, 0, sizeof(*prop));
  std::memcpy(prop->name, p.name, sizeof(prop->name));
  prop->totalGlobalMem = p.total_global_mem;
  prop->sharedMemPerBlock = p.shared_mem_per_block;
  prop->regsPerBlock = p.regs_per_block;
  prop->warpSize = p.warp_size;
  prop->maxThreadsPerBlock = p.max_threads_per_block;
  for (int i = 0; i < 3; ++i) prop->maxThreadsDim[i] = p.max_threads_dim[i], prop->maxGridSize[i] = p.max_grid_size[i];
  prop->major = p.major;
  prop->minor = p.minor;
  prop->multiProcessorCount = p.multi_processor_count;
  prop->maxThreadsPerMultiProcessor = p.max_threads_per_multi_processor;
  prop->l2CacheSize = p.l2_cache_size;
  prop->memoryBusWidth = p.memory_bus_width;
  prop->totalConstMem = p.total_const_mem;
  prop->unifiedAddressing = p.unified_addressing;
  prop->pciBusID = p.pci_bus_id;
  prop->pciDeviceID = p.pci_device_id;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  int32_t v = 0;
  Status s = rt()->api().device_get_attribute(&v, static_cast<int32_t>(attr), device);
  if (s.ok()) *value = v;
  return done(s);
}
cudaError_t cudaDeviceSynchronize(void) { return done(synced(rt()->api().device_synchronize())); }
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  uint64_t f = 0, t = 0;
  Status s = rt()->api().mem_get_info(&f, &t);
  if (s.ok()) *free = f, *total = t;
  return done(s);
}
cudaError_t cudaDriverGetVersion(int* v) {
  int32_t x = 0;
  Status s = rt()->api().driver_get_version(&x);
  if (s.ok()) *v = x;
  return done(s);
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  int32_t x = 0;
  Status s = rt()->api().runtime_get_version(&x);
  if (s.ok()) *v = x;
  return done(s);
}

// ---------------- memory ----------------
cudaError_t cudaMalloc(void** ptr, size_t size) {
  uint64_t p = 0;
  Status s = rt()->api().malloc(&p, size);
  if (s.ok()) *ptr = reinterpret_cast<void*>(p);
  return done(s);
}
cudaError_t cudaFree(void* ptr) { return done(rt()->api().free(u64(ptr))); }
// Pinned host memory: page-locked by the device backend in-process (the shared-memory arena with
// remoting), so copies from it go straight to DMA.
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return done(Status::Cuda(pos::cuda::kErrorInvalidValue, "null pointer"));
  return done(rt()->host_alloc(size, ptr));
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }
cudaError_t cudaFreeHost(void* ptr) { return done(rt()->host_free(ptr)); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return done(rt()->api().memcpy(u64(dst), u64(src), n, kind));
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  int32_t k = kind;
  if (k == cudaMemcpyDefault) {
    // Resolve here: a host→device copy must carry its bytes.
    pos::PointerAttributes pd{}, ps{};
    const bool dd = rt()->api().pointer_get_attributes(&pd, u64(dst)).ok() && pd.type == pos::cuda::kMemoryTypeDevice;
    const bool sd = rt()->api().pointer_get_attributes(&ps, u64(src)).ok() && ps.type == pos::cuda::kMemoryTypeDevice;
    k = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  return done(rt()->api().memcpy_async(u64(dst), u64(src), n, k, u64(stream)));
}
cudaError_t cudaMemset(void* dst, int value, size_t n) { return done(rt()->api().memset(u64(dst), value, n)); }
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream) {
  return done(rt()->api().memset_async(u64(dst), value, n, u64(stream)));
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  pos::PointerAttributes a{};
  Status s = rt()->api().pointer_get_attributes(&a, u64(ptr));
  if (!s.ok()) return done(s);
  attr->type = static_cast<cudaMemoryType>(a.type);
  attr->device = a.device;
  attr->devicePointer = reinterpret_cast<void*>(a.device_pointer);
  attr->hostPointer = reinterpret_cast<void*>(a.host_pointer);
  return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t n, size_t offset, cudaMemcpyKind kind) {
  const uint64_t addr = rt()->var(symbol);
  if (addr == 0) return done(Status::Cuda(pos::cuda::kErrorInvalidSymbol, "unknown symbol"));
  return done(rt()->api().memcpy_to_symbol(addr, u64(src), n, offset, kind));
}
cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t n, size_t offset, cudaMemcpyKind kind) {
  const uint64_t addr = rt()->var(symbol);
  if (addr == 0) return done(Status::Cuda(pos::cuda::kErrorInvalidSymbol, "unknown symbol"));
  return done(rt()->api().memcpy_from_symbol(u64(dst), addr, n, offset, kind));
}

// ---------------- streams and events ----------------
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  uint64_t v = 0;
  Status st = rt()->api().stream_create(&v);
  if (st.ok()) *s = reinterpret_cast<cudaStream_t>(v);
  return done(st);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  uint64_t v = 0;
  Status st = rt()->api().stream_create_with_flags(&v, flags);
  if (st.ok()) *s = reinterpret_cast<cudaStream_t>(v);
  return done(st);
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  uint64_t v = 0;
  Status st = rt()->api().stream_create_with_priority(&v, flags, priority);
  if (st.ok()) *s = reinterpret_cast<cudaStream_t>(v);
  return done(st);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { return done(rt()->api().stream_destroy(u64(s))); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return done(synced(rt()->api().stream_synchronize(u64(s)))); }
cudaError_t cudaStreamQuery(cudaStream_t s) {
  Status st = rt()->api().stream_query(u64(s));
  return st.api_error() == cudaErrorNotReady ? cudaErrorNotReady : done(st);  // not an error to remember
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  return done(rt()->api().stream_wait_event(u64(s), u64(e), flags));
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  uint64_t v = 0;
  Status st = rt()->api().event_create(&v);
  if (st.ok()) *e = reinterpret_cast<cudaEvent_t>(v);
  return done(st);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  uint64_t v = 0;
  Status st = rt()->api().event_create_with_flags(&v, flags);
  if (st.ok()) *e = reinterpret_cast<cudaEvent_t>(v);
  return done(st);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { return done(rt()->api().event_destroy(u64(e))); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return done(rt()->api().event_record(u64(e), u64(s))); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return done(rt()->api().event_synchronize(u64(e))); }
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Status st = rt()->api().event_query(u64(e));
  return st.api_error() == cudaErrorNotReady ? cudaErrorNotReady : done(st);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  float v = 0;
  Status st = rt()->api().event_elapsed_time(&v, u64(a), u64(b));
  if (st.ok()) *ms = v;
  return done(st);
}

// ---------------- functions ----------------
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  const pos::RegisteredFunction* f = rt()->function(func);
  if (f == nullptr) return done(Status::Cuda(pos::cuda::kErrorInvalidDeviceFunction, "unknown kernel"));
  pos::FuncAttributes a{};
  Status s = rt()->api().func_get_attributes(&a, f->handle);
  if (!s.ok()) return done(s);
  std::memset(attr, 0, sizeof(*attr));
  attr->sharedSizeBytes = a.shared_size_bytes;
  attr->constSizeBytes = a.const_size_bytes;
  attr->localSizeBytes = a.local_size_bytes;
  attr->maxThreadsPerBlock = a.max_threads_per_block;
  attr->numRegs = a.num_regs;
  attr->ptxVersion = a.ptx_version;
  attr->binaryVersion = a.binary_version;
  attr->maxDynamicSharedSizeBytes = a.max_dynamic_shared_size_bytes;
  attr->preferredShmemCarveout = a.preferred_shmem_carveout;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  const pos::RegisteredFunction* f = rt()->function(func);
  if (f == nullptr) return done(Status::Cuda(pos::cuda::kErrorInvalidDeviceFunction, "unknown kernel"));
  return done(rt()->api().func_set_attribute(f->handle, attr, value));
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* func, int block, size_t smem) {
  const pos::RegisteredFunction* f = rt()->function(func);
  if (f == nullptr) return done(Status::Cuda(pos::cuda::kErrorInvalidDeviceFunction, "unknown kernel"));
  int32_t v = 0;
  Status s = rt()->api().occupancy(&v, f->handle, block, smem);
  if (s.ok()) *n = v;
  return done(s);
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void* func, int block, size_t smem,
                                                                   unsigned int flags) {
  const pos::RegisteredFunction* f = rt()->function(func);
  if (f == nullptr) return done(Status::Cuda(pos::cuda::kErrorInvalidDeviceFunction, "unknown kernel"));
  int32_t v = 0;
  Status s = rt()->api().occupancy_with_flags(&v, f->handle, block, smem, flags);
  if (s.ok()) *n = v;
  return done(s);
}

// ---------------- cuBLAS ----------------
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  uint64_t v = 0;
  Status s = rt()->api().cublas_create(&v);
  if (s.ok()) *h = reinterpret_cast<cublasHandle_t>(v);
  return blas_done(s);
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { return blas_done(rt()->api().cublas_destroy(u64(h))); }
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  return blas_done(rt()->api().cublas_set_stream(u64(h), u64(s)));
}
cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t* s) {
  uint64_t v = 0;
  Status st = rt()->api().cublas_get_stream(u64(h), &v);
  if (st.ok()) *s = reinterpret_cast<cudaStream_t>(v);
  return blas_done(st);
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  return blas_done(rt()->api().cublas_set_math_mode(u64(h), static_cast<int32_t>(mode)));
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta,
                              float* c, int ldc) {
  pos::GemmArgs g = pos::sgemm_args(ta, tb, m, n, k, *alpha, u64(a), lda, u64(b), ldb, *beta, u64(c), ldc);
  return blas_done(rt()->api().cublas_sgemm(u64(h), g));
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* a, cudaDataType at, int lda, const void* b, cudaDataType bt,
                            int ldb, const void* beta, void* c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  // Host pointer mode with float scalars (32F compute types).
  pos::GemmArgs g = pos::sgemm_args(ta, tb, m, n, k, *static_cast<const float*>(alpha), u64(a), lda, u64(b), ldb,
                                    *static_cast<const float*>(beta), u64(c), ldc);
  g.a_type = at, g.b_type = bt, g.c_type = ct, g.compute_type = compute, g.algo = algo;
  return blas_done(rt()->api().cublas_gemm_ex(u64(h), g));
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float* alpha, const float* a, int lda, long long sa,
                                         const float* b, int ldb, long long sb, const float* beta, float* c, int ldc,
                                         long long sc, int batch) {
  pos::GemmArgs g = pos::sgemm_args(ta, tb, m, n, k, *alpha, u64(a), lda, u64(b), ldb, *beta, u64(c), ldc);
  g.stride_a = sa, g.stride_b = sb, g.stride_c = sc, g.batch = batch;
  return blas_done(rt()->api().cublas_sgemm_strided_batched(u64(h), g));
}

}  // extern "C"
#pragma GCC visibility pop
