// api_client.cc — parameter packing for every API; the one place that knows each API's parameter order.
// docs/api_set.md lists the same order; parser functions read it back.
#include "remoting/common/api_client.h"

#include <cstring>

#include <array>

namespace pos {

namespace {
template <typename... T>
std::array<Param, sizeof...(T)> pack(const T&... v) {
  return {Param{&v, sizeof(T)}...};
}
}  // namespace

Status ApiClient::get_device_count(int32_t* n) { return call_packed(ApiId::kGetDeviceCount, {}, n); }
Status ApiClient::get_device(int32_t* d) { return call_packed(ApiId::kGetDevice, {}, d); }
Status ApiClient::set_device(int32_t d) { auto p = pack(d); return t_->call(ApiId::kSetDevice, p, nullptr, 0, nullptr); }
Status ApiClient::get_device_properties(DeviceProps* out, int32_t d) {
  auto p = pack(d);
  return call_packed(ApiId::kGetDeviceProperties, p, out);
}
Status ApiClient::device_get_attribute(int32_t* v, int32_t attr, int32_t d) {
  auto p = pack(attr, d);
  return call_packed(ApiId::kDeviceGetAttribute, p, v);
}
Status ApiClient::device_synchronize() { return t_->call(ApiId::kDeviceSynchronize, {}, nullptr, 0, nullptr); }
Status ApiClient::mem_get_info(uint64_t* free, uint64_t* total) {
  MemInfo m{};
  Status s = call_packed(ApiId::kMemGetInfo, {}, &m);
  *free = m.free, *total = m.total;
  return s;
}
Status ApiClient::driver_get_version(int32_t* v) { return call_packed(ApiId::kDriverGetVersion, {}, v); }
Status ApiClient::runtime_get_version(int32_t* v) { return call_packed(ApiId::kRuntimeGetVersion, {}, v); }
Status ApiClient::get_last_error() { return t_->call(ApiId::kGetLastError, {}, nullptr, 0, nullptr); }
Status ApiClient::peek_at_last_error() { return t_->call(ApiId::kPeekAtLastError, {}, nullptr, 0, nullptr); }

Status ApiClient::malloc(uint64_t* ptr, uint64_t size) {
  auto p = pack(size);
  return call_packed(ApiId::kMalloc, p, ptr);
}
Status ApiClient::free(uint64_t ptr) { auto p = pack(ptr); return t_->call(ApiId::kFree, p, nullptr, 0, nullptr); }
Status ApiClient::memcpy(uint64_t dst, uint64_t src, uint64_t n, int32_t kind) {
  auto p = pack(dst, src, n, kind);
  return t_->call(ApiId::kMemcpy, p, nullptr, 0, nullptr);
}
Status ApiClient::memcpy_async(uint64_t dst, uint64_t src, uint64_t n, int32_t kind, uint64_t stream) {
  // A host→device copy carries its bytes (staged now, like CUDA's pageable path).
  const bool h2d = kind == cuda::kMemcpyHostToDevice;
  std::array<Param, 6> p{Param{&dst, 8}, Param{&src, 8}, Param{&n, 8}, Param{&kind, 4}, Param{&stream, 8},
                         Param{reinterpret_cast<const void*>(src), n}};
  return t_->call(ApiId::kMemcpyAsync, std::span<const Param>(p.data(), h2d ? 6 : 5), nullptr, 0, nullptr);
}
Status ApiClient::memset(uint64_t dst, int32_t value, uint64_t n) {
  auto p = pack(dst, value, n);
  return t_->call(ApiId::kMemset, p, nullptr, 0, nullptr);
}
Status ApiClient::memset_async(uint64_t dst, int32_t value, uint64_t n, uint64_t stream) {
  auto p = pack(dst, value, n, stream);
  return t_->call(ApiId::kMemsetAsync, p, nullptr, 0, nullptr);
}
Status ApiClient::pointer_get_attributes(PointerAttributes* a, uint64_t ptr) {
  auto p = pack(ptr);
  return call_packed(ApiId::kPointerGetAttributes, p, a);
}
Status ApiClient::memcpy_to_symbol(uint64_t symbol, uint64_t src, uint64_t n, uint64_t offset, int32_t kind) {
  auto p = pack(symbol, src, n, offset, kind);
  return t_->call(ApiId::kMemcpyToSymbol, p, nullptr, 0, nullptr);
}
Status ApiClient::memcpy_from_symbol(uint64_t dst, uint64_t symbol, uint64_t n, uint64_t offset, int32_t kind) {
  auto p = pack(dst, symbol, n, offset, kind);
  return t_->call(ApiId::kMemcpyFromSymbol, p, nullptr, 0, nullptr);
}

Status ApiClient::stream_create(uint64_t* s) { return call_packed(ApiId::kStreamCreate, {}, s); }
Status ApiClient::stream_create_with_flags(uint64_t* s, uint32_t flags) {
  auto p = pack(flags);
  return call_packed(ApiId::kStreamCreateWithFlags, p, s);
}
Status ApiClient::stream_create_with_priority(uint64_t* s, uint32_t flags, int32_t priority) {
  auto p = pack(flags, priority);
  return call_packed(ApiId::kStreamCreateWithPriority, p, s);
}
Status ApiClient::stream_destroy(uint64_t s) { auto p = pack(s); return t_->call(ApiId::kStreamDestroy, p, nullptr, 0, nullptr); }
Status ApiClient::stream_synchronize(uint64_t s) { auto p = pack(s); return t_->call(ApiId::kStreamSynchronize, p, nullptr, 0, nullptr); }
Status ApiClient::stream_query(uint64_t s) { auto p = pack(s); return t_->call(ApiId::kStreamQuery, p, nullptr, 0, nullptr); }
Status ApiClient::stream_wait_event(uint64_t s, uint64_t e, uint32_t flags) {
  auto p = pack(s, e, flags);
  return t_->call(ApiId::kStreamWaitEvent, p, nullptr, 0, nullptr);
}
Status ApiClient::event_create(uint64_t* e) { return call_packed(ApiId::kEventCreate, {}, e); }
Status ApiClient::event_create_with_flags(uint64_t* e, uint32_t flags) {
  auto p = pack(flags);
  return call_packed(ApiId::kEventCreateWithFlags, p, e);
}
Status ApiClient::event_destroy(uint64_t e) { auto p = pack(e); return t_->call(ApiId::kEventDestroy, p, nullptr, 0, nullptr); }
Status ApiClient::event_record(uint64_t e, uint64_t s) { auto p = pack(e, s); return t_->call(ApiId::kEventRecord, p, nullptr, 0, nullptr); }
Status ApiClient::event_synchronize(uint64_t e) { auto p = pack(e); return t_->call(ApiId::kEventSynchronize, p, nullptr, 0, nullptr); }
Status ApiClient::event_query(uint64_t e) { auto p = pack(e); return t_->call(ApiId::kEventQuery, p, nullptr, 0, nullptr); }
Status ApiClient::event_elapsed_time(float* ms, uint64_t start, uint64_t end) {
  auto p = pack(start, end);
  return call_packed(ApiId::kEventElapsedTime, p, ms);
}

Status ApiClient::register_fatbin(uint64_t* module, std::span<const std::byte> fatbin) {
  Param p{fatbin.data(), fatbin.size()};
  return call_packed(ApiId::kRegisterFatBinary, std::span<const Param>(&p, 1), module);
}
Status ApiClient::register_function(RegisteredFunction* out, uint64_t module, const std::string& name) {
  std::array<Param, 2> p{Param{&module, 8}, Param{name.data(), name.size()}};
  std::vector<std::byte> buf(sizeof(FunctionRegistration) + 512 * sizeof(RegisteredParam));
  uint64_t written = 0;
  Status s = t_->call(ApiId::kRegisterFunction, p, buf.data(), buf.size(), &written);
  if (!s.ok()) return s;
  if (written < sizeof(FunctionRegistration)) return Status::Internal("short registration result");
  FunctionRegistration r{};
  std::memcpy(&r, buf.data(), sizeof(r));
  if (written != sizeof(r) + r.param_count * sizeof(RegisteredParam)) return Status::Internal("bad registration result");
  out->handle = r.handle;
  out->found = r.found != 0;
  out->param_bytes = r.param_bytes;
  out->params.resize(r.param_count);
  if (r.param_count > 0) std::memcpy(out->params.data(), buf.data() + sizeof(r), r.param_count * sizeof(RegisteredParam));
  return s;
}
Status ApiClient::register_var(uint64_t* addr, uint64_t module, const std::string& name, uint64_t size, bool constant) {
  const int32_t c = constant ? 1 : 0;
  std::array<Param, 4> p{Param{&module, 8}, Param{name.data(), name.size()}, Param{&size, 8}, Param{&c, 4}};
  return call_packed(ApiId::kRegisterVar, p, addr);
}
Status ApiClient::unregister_fatbin(uint64_t module) {
  auto p = pack(module);
  return t_->call(ApiId::kUnregisterFatBinary, p, nullptr, 0, nullptr);
}
Status ApiClient::launch_kernel(uint64_t function, const LaunchDims& dims, uint64_t stream,
                                std::span<const std::byte> params) {
  std::array<Param, 4> p{Param{&function, 8}, Param{&dims, sizeof(dims)}, Param{&stream, 8},
                         Param{params.data(), params.size()}};
  return t_->call(ApiId::kLaunchKernel, p, nullptr, 0, nullptr);
}
Status ApiClient::func_get_attributes(FuncAttributes* a, uint64_t function) {
  auto p = pack(function);
  return call_packed(ApiId::kFuncGetAttributes, p, a);
}
Status ApiClient::func_set_attribute(uint64_t function, int32_t attr, int32_t value) {
  auto p = pack(function, attr, value);
  return t_->call(ApiId::kFuncSetAttribute, p, nullptr, 0, nullptr);
}
Status ApiClient::occupancy(int32_t* blocks, uint64_t function, int32_t block_size, uint64_t dyn_smem) {
  auto p = pack(function, block_size, dyn_smem);
  return call_packed(ApiId::kOccupancyMaxActiveBlocks, p, blocks);
}
Status ApiClient::occupancy_with_flags(int32_t* blocks, uint64_t function, int32_t block_size, uint64_t dyn_smem,
                                       uint32_t flags) {
  auto p = pack(function, block_size, dyn_smem, flags);
  return call_packed(ApiId::kOccupancyMaxActiveBlocksWithFlags, p, blocks);
}

Status ApiClient::cublas_create(uint64_t* h) { return call_packed(ApiId::kCublasCreate, {}, h); }
Status ApiClient::cublas_destroy(uint64_t h) { auto p = pack(h); return t_->call(ApiId::kCublasDestroy, p, nullptr, 0, nullptr); }
Status ApiClient::cublas_set_stream(uint64_t h, uint64_t s) {
  auto p = pack(h, s);
  return t_->call(ApiId::kCublasSetStream, p, nullptr, 0, nullptr);
}
Status ApiClient::cublas_get_stream(uint64_t h, uint64_t* s) {
  auto p = pack(h);
  return call_packed(ApiId::kCublasGetStream, p, s);
}
Status ApiClient::cublas_set_math_mode(uint64_t h, int32_t mode) {
  auto p = pack(h, mode);
  return t_->call(ApiId::kCublasSetMathMode, p, nullptr, 0, nullptr);
}
Status ApiClient::cublas_sgemm(uint64_t h, const GemmArgs& g) {
  auto p = pack(h, g);
  return t_->call(ApiId::kCublasSgemm, p, nullptr, 0, nullptr);
}
Status ApiClient::cublas_gemm_ex(uint64_t h, const GemmArgs& g) {
  auto p = pack(h, g);
  return t_->call(ApiId::kCublasGemmEx, p, nullptr, 0, nullptr);
}
Status ApiClient::cublas_sgemm_strided_batched(uint64_t h, const GemmArgs& g) {
  auto p = pack(h, g);
  return t_->call(ApiId::kCublasSgemmStridedBatched, p, nullptr, 0, nullptr);
}

GemmArgs sgemm_args(int32_t ta, int32_t tb, int32_t m, int32_t n, int32_t k, float alpha, uint64_t a, int32_t lda,
                    uint64_t b, int32_t ldb, float beta, uint64_t c, int32_t ldc) {
  GemmArgs g{};
  g.transa = ta, g.transb = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
  g.a = a, g.b = b, g.c = c, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.a_type = g.b_type = g.c_type = kCudaR32F;
  g.compute_type = kCublasCompute32F;
  g.batch = 1;
  return g;
}

}  // namespace pos
