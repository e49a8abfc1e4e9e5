// launch_params.h — what a kernel launch may write: the launch's parameter bytes, read with the
// layout the driver gives (cuFuncGetParamInfo / cuKernelGetParamInfo), scanned for addresses.
// interpose.cc marks the placed allocations those addresses fall in as written since the last cut
// (Placement::mark_written), which is what incremental and copy-on-write checkpoints need.
//
// Conservative by construction: every 8-byte-aligned word of every parameter that can hold a
// pointer is looked at, inside structs passed by value too (PyTorch's TensorIterator kernels pass
// their data pointers in arrays inside a struct), so a pointer argument is never missed; a word
// that merely looks like an address marks memory that was not written, which costs bytes, not
// correctness. A launch whose parameters cannot be read (no layout) tells the caller so, and the
// caller then counts every allocation as written. Device-neutral: the driver's calls come in as
// function pointers, so CI drives it with a fake driver (docs/driver_runtime.md, "Written memory").
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remoting/driver/driver_api.h"

namespace pos::driver {

struct ParamInfoCalls {
  // cuFuncGetParamInfo / cuKernelGetParamInfo (CUDA 12.4+): parameter `index`'s offset and size;
  // CUDA_ERROR_INVALID_VALUE past the last one.
  CUresult (*func_param_info)(CUfunction f, size_t index, size_t* offset, size_t* size) = nullptr;
  CUresult (*kernel_param_info)(void* kernel, size_t index, size_t* offset, size_t* size) = nullptr;
};

// cuLaunchKernel's `extra` keys (cuda.h: CU_LAUNCH_PARAM_*).
inline constexpr uintptr_t kLaunchParamEnd = 0, kLaunchParamBufferPointer = 1, kLaunchParamBufferSize = 2;
// A parameter larger than the driver allows (32 KiB since CUDA 12.1) is a layout we do not trust.
inline constexpr size_t kMaxParamBytes = 32768;

// A kernel's parameters, (offset, size) each in order. `known` false: the driver gave no layout
// (an old driver, or a handle it does not recognize).
struct ParamLayout {
  std::vector<std::pair<uint32_t, uint32_t>> params;
  bool known = false;
};

// The layout of a kernel from the driver's answers for indices 0, 1, ...: a parameter while it
// answers success, the end at CUDA_ERROR_INVALID_VALUE. `query` is either call, bound to the handle.
template <typename Query>
ParamLayout read_layout(Query query) {
  ParamLayout l;
  for (size_t i = 0; i < 4096; ++i) {
    size_t off = 0, size = 0;
    const CUresult rc = query(i, &off, &size);
    if (rc == 1 /* CUDA_ERROR_INVALID_VALUE: past the last */) {
      l.known = true;
      return l;
    }
    if (rc != kSuccess || size > kMaxParamBytes || off > kMaxParamBytes) return ParamLayout{};
    l.params.emplace_back(static_cast<uint32_t>(off), static_cast<uint32_t>(size));
  }
  return ParamLayout{};
}

class LaunchScanner {
 public:
  explicit LaunchScanner(const ParamInfoCalls& calls) : calls_(calls) {}

  // Calls visit(word) for every 8-byte-aligned word of the launch's parameters that could hold a
  // pointer: `extra`'s buffer (CU_LAUNCH_PARAM_BUFFER_POINTER) whole, else each of `params`'s
  // parameters of 8 bytes or more at an 8-byte-aligned offset. False when the parameters cannot
  // be read: `params` given and `f` has no layout, or `extra` malformed.
  template <typename Visit>
  bool scan(CUfunction f, void** params, void** extra, Visit&& visit) {
    if (extra != nullptr) return scan_extra(extra, visit);
    if (params == nullptr) {  // no parameters at all
      scanned_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    const std::shared_ptr<const ParamLayout> l = layout(f);
    if (l == nullptr || !l->known) {
      unparsed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    for (size_t i = 0; i < l->params.size(); ++i) {
      const auto [off, size] = l->params[i];
      if (size < 8 || off % 8 != 0 || params[i] == nullptr) continue;
      const auto* p = static_cast<const unsigned char*>(params[i]);
      for (size_t at = 0; at + 8 <= size; at += 8) visit(word_at(p + at));
    }
    scanned_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // The layout of `f`, asked of the driver once (cuFuncGetParamInfo, else cuKernelGetParamInfo:
  // cuLaunchKernel also takes a CUkernel); null when neither call exists.
  std::shared_ptr<const ParamLayout> layout(CUfunction f);
  // Modules or libraries were unloaded: their handles may come back for other kernels.
  void forget();

  struct Stats {
    uint64_t scanned = 0, unparsed = 0, layouts = 0;
  };
  Stats stats() const;

 private:
  static uint64_t word_at(const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  template <typename Visit>
  bool scan_extra(void** extra, Visit& visit) {
    const unsigned char* buf = nullptr;
    size_t size = 0;
    bool have_size = false;
    for (int i = 0; i < 64; i += 2) {
      const auto key = reinterpret_cast<uintptr_t>(extra[i]);
      if (key == kLaunchParamEnd) {
        if (buf == nullptr || !have_size || size > kMaxParamBytes) break;
        for (size_t at = 0; at + 8 <= size; at += 8) visit(word_at(buf + at));
        scanned_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      if (key == kLaunchParamBufferPointer) buf = static_cast<const unsigned char*>(extra[i + 1]);
      else if (key == kLaunchParamBufferSize && extra[i + 1] != nullptr) {
        size = *static_cast<const size_t*>(extra[i + 1]);
        have_size = true;
      } else break;  // a key this layer does not know: the buffer cannot be trusted
    }
    unparsed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  const ParamInfoCalls calls_;
  mutable std::shared_mutex mu_;
  std::unordered_map<CUfunction, std::shared_ptr<const ParamLayout>> layouts_;  // under mu_
  std::atomic<uint64_t> scanned_{0}, unparsed_{0};
};

}  // namespace pos::driver
