// api_client.h — typed encoders for the API set: one method per API that packs parameters the way
// the parser functions expect and sends them through a Transport (in-process or a posd session),
// and a generic call by ApiId, so that a new API's entry point needs no method of its own here.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "pos/base/param.h"
#include "pos/base/api_id.h"
#include "pos/base/api_types.h"
#include "pos/base/fatbin.h"
#include "pos/base/status.h"

namespace pos {

// How calls reach a POSWorkspace. Implementations decide where it lives.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual Status call(ApiId api, std::span<const Param> params, void* ret, uint64_t ret_len,
                      uint64_t* ret_written) = 0;
};

namespace api_client_detail {
template <typename T>
inline constexpr bool kIsSpan = false;
template <typename T, size_t N>
inline constexpr bool kIsSpan<std::span<T, N>> = true;
}  // namespace api_client_detail

// One argument of ApiClient::call as the parameter the parser reads: a value as its bytes (the
// parser's POS_PARAM type must match it exactly: int32_t, not int64_t), or a byte string (a name,
// a blob) as its contents. Device pointers, streams and handles go as uint64_t values.
template <typename T>
  requires(std::is_trivially_copyable_v<T> && !std::is_convertible_v<const T&, std::span<const std::byte>> &&
           !std::is_convertible_v<const T&, std::string_view>)
Param call_param(const T& v) {
  // Either would send the pointer's own bytes, not what it points to.
  static_assert(!std::is_pointer_v<T> && !api_client_detail::kIsSpan<T>,
                "pass a device pointer or handle as uint64_t, host bytes as std::span<const std::byte>");
  return Param{&v, sizeof(T)};
}
inline Param call_param(std::span<const std::byte> b) { return Param{b.data(), b.size()}; }
inline Param call_param(std::string_view s) { return Param{s.data(), s.size()}; }

struct RegisteredFunction {
  uint64_t handle = 0;
  bool found = false;
  uint32_t param_bytes = 0;
  std::vector<RegisteredParam> params;
};

// Thread-compatible: share one per thread, or guard it; the transport decides thread-safety.
class ApiClient {
 public:
  explicit ApiClient(Transport* t) : t_(t) {}

  // device
  Status get_device_count(int32_t* n);
  Status get_device(int32_t* d);
  Status set_device(int32_t d);
  Status get_device_properties(DeviceProps* p, int32_t d);
  Status device_get_attribute(int32_t* v, int32_t attr, int32_t d);
  Status device_synchronize();
  Status mem_get_info(uint64_t* free, uint64_t* total);
  Status driver_get_version(int32_t* v);
  Status runtime_get_version(int32_t* v);
  Status get_last_error();
  Status peek_at_last_error();
  // memory
  Status malloc(uint64_t* ptr, uint64_t size);
  Status free(uint64_t ptr);
  Status memcpy(uint64_t dst, uint64_t src, uint64_t n, int32_t kind);
  Status memcpy_async(uint64_t dst, uint64_t src, uint64_t n, int32_t kind, uint64_t stream);
  Status memset(uint64_t dst, int32_t value, uint64_t n);
  Status memset_async(uint64_t dst, int32_t value, uint64_t n, uint64_t stream);
  Status pointer_get_attributes(PointerAttributes* a, uint64_t ptr);
  Status memcpy_to_symbol(uint64_t symbol, uint64_t src, uint64_t n, uint64_t offset, int32_t kind);
  Status memcpy_from_symbol(uint64_t dst, uint64_t symbol, uint64_t n, uint64_t offset, int32_t kind);
  // streams and events
  Status stream_create(uint64_t* s);
  Status stream_create_with_flags(uint64_t* s, uint32_t flags);
  Status stream_create_with_priority(uint64_t* s, uint32_t flags, int32_t priority);
  Status stream_destroy(uint64_t s);
  Status stream_synchronize(uint64_t s);
  Status stream_query(uint64_t s);
  Status stream_wait_event(uint64_t s, uint64_t e, uint32_t flags);
  Status event_create(uint64_t* e);
  Status event_create_with_flags(uint64_t* e, uint32_t flags);
  Status event_destroy(uint64_t e);
  Status event_record(uint64_t e, uint64_t s);
  Status event_synchronize(uint64_t e);
  Status event_query(uint64_t e);
  Status event_elapsed_time(float* ms, uint64_t start, uint64_t end);
  // modules and kernels
  Status register_fatbin(uint64_t* module, std::span<const std::byte> fatbin);
  Status register_function(RegisteredFunction* out, uint64_t module, const std::string& name);
  Status register_var(uint64_t* addr, uint64_t module, const std::string& name, uint64_t size, bool constant);
  Status unregister_fatbin(uint64_t module);
  Status launch_kernel(uint64_t function, const LaunchDims& dims, uint64_t stream, std::span<const std::byte> params);
  Status func_get_attributes(FuncAttributes* a, uint64_t function);
  Status func_set_attribute(uint64_t function, int32_t attr, int32_t value);
  Status occupancy(int32_t* blocks, uint64_t function, int32_t block_size, uint64_t dyn_smem);
  Status occupancy_with_flags(int32_t* blocks, uint64_t function, int32_t block_size, uint64_t dyn_smem,
                              uint32_t flags);
  // cuBLAS
  Status cublas_create(uint64_t* h);
  Status cublas_destroy(uint64_t h);
  Status cublas_set_stream(uint64_t h, uint64_t s);
  Status cublas_get_stream(uint64_t h, uint64_t* s);
  Status cublas_set_math_mode(uint64_t h, int32_t mode);
  Status cublas_sgemm(uint64_t h, const GemmArgs& g);
  Status cublas_gemm_ex(uint64_t h, const GemmArgs& g);
  Status cublas_sgemm_strided_batched(uint64_t h, const GemmArgs& g);

  // Any API by id, each argument one parameter (call_param), in the order its parser reads them:
  // what a new API's entry point uses (docs/adding_an_api.md). call_ret also takes the result,
  // which must fill *out exactly.
  template <typename... Args>
  Status call(ApiId api, const Args&... args) {
    const std::array<Param, sizeof...(Args)> p{call_param(args)...};
    return t_->call(api, p, nullptr, 0, nullptr);
  }
  template <typename R, typename... Args>
  Status call_ret(ApiId api, R* out, const Args&... args) {
    const std::array<Param, sizeof...(Args)> p{call_param(args)...};
    return call_packed(api, p, out);
  }

  // Raw access (tests of malformed input).
  Status raw(ApiId api, std::span<const Param> params, void* ret = nullptr, uint64_t ret_len = 0,
             uint64_t* written = nullptr) {
    return t_->call(api, params, ret, ret_len, written);
  }

 private:
  template <typename R>
  Status call_packed(ApiId api, std::span<const Param> params, R* out) {
    uint64_t written = 0;
    Status s = t_->call(api, params, out, sizeof(R), &written);
    if (s.ok() && written != sizeof(R)) return Status::Internal("short result");
    return s;
  }
  Transport* t_;
};

// Fills a GemmArgs for cublasSgemm-style calls (float, unbatched).
GemmArgs sgemm_args(int32_t ta, int32_t tb, int32_t m, int32_t n, int32_t k, float alpha, uint64_t a, int32_t lda,
                    uint64_t b, int32_t ldb, float beta, uint64_t c, int32_t ldc);

}  // namespace pos
