// host_kernels.h — the host backend's kernel library: CUDA kernels compiled for the CPU, by mangled name.
// Kernels are written once in CUDA C++; on the host they run through cuda_emulation.h, one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pos::host {

namespace emu {
// Stand-in for CUDA's dim3 / uint3 builtins inside host-compiled kernels.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
// thread_local: several host streams may run kernels at once.
inline thread_local Dim3 threadIdx{0, 0, 0};
inline thread_local Dim3 blockIdx{0, 0, 0};
inline thread_local Dim3 blockDim{1, 1, 1};
inline thread_local Dim3 gridDim{1, 1, 1};
}  // namespace emu

struct LaunchGeometry {
  emu::Dim3 grid, block;
  uint64_t shared_mem = 0;
};

// One kernel parameter as cuFuncGetParamInfo would describe it, plus what the host knows from types.
struct ParamInfo {
  uint32_t offset = 0;
  uint32_t size = 0;
  bool read_only_pointer = false;  // `const T*`: the kernel never writes through it
};

using KernelEntry = void (*)(const LaunchGeometry&, const std::byte* params);

struct HostKernel {
  std::string name;  // mangled name, as __cudaRegisterFunction passes it
  std::vector<ParamInfo> layout;
  uint32_t param_bytes = 0;
  KernelEntry entry = nullptr;
};

// Process-wide kernel library. Thread-safe: registration usually happens in static initializers,
// lookups on worker threads.
class KernelRegistry {
 public:
  static KernelRegistry& global();
  void add(HostKernel k);
  const HostKernel* find(std::string_view name) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, HostKernel> kernels_;  // guarded by mu_
};

namespace detail {
template <typename F>
struct FnTraits;
template <typename... A>
struct FnTraits<void (*)(A...)> {
  using Args = std::tuple<std::decay_t<A>...>;
  static constexpr size_t kCount = sizeof...(A);
};

template <typename T>
constexpr bool is_read_only_pointer() {
  if constexpr (std::is_pointer_v<T>) return std::is_const_v<std::remove_pointer_t<T>>;
  return false;
}

// CUDA's parameter buffer: each parameter at its natural alignment, in order.
template <typename Tuple, size_t... I>
std::vector<ParamInfo> layout_of(std::index_sequence<I...>, uint32_t* total) {
  std::vector<ParamInfo> out;
  uint32_t off = 0;
  auto one = [&](auto tag) {
    using T = typename decltype(tag)::type;
    off = (off + alignof(T) - 1) / alignof(T) * alignof(T);
    out.push_back(ParamInfo{off, static_cast<uint32_t>(sizeof(T)), is_read_only_pointer<T>()});
    off += sizeof(T);
  };
  (one(std::type_identity<std::tuple_element_t<I, Tuple>>{}), ...);
  *total = off;
  return out;
}

template <auto Fn, size_t... I>
void run_grid(const LaunchGeometry& g, const std::byte* params, std::index_sequence<I...>) {
  using Tuple = typename FnTraits<decltype(Fn)>::Args;
  static const std::vector<ParamInfo> kLayout = [] {
    uint32_t t = 0;
    return layout_of<Tuple>(std::index_sequence<I...>{}, &t);
  }();
  Tuple args;
  ((std::memcpy(&std::get<I>(args), params + kLayout[I].offset, sizeof(std::tuple_element_t<I, Tuple>))), ...);
  emu::gridDim = g.grid;
  emu::blockDim = g.block;
  for (unsigned bz = 0; bz < g.grid.z; ++bz)
    for (unsigned by = 0; by < g.grid.y; ++by)
      for (unsigned bx = 0; bx < g.grid.x; ++bx) {
        emu::blockIdx = emu::Dim3{bx, by, bz};
        for (unsigned tz = 0; tz < g.block.z; ++tz)
          for (unsigned ty = 0; ty < g.block.y; ++ty)
            for (unsigned tx = 0; tx < g.block.x; ++tx) {
              emu::threadIdx = emu::Dim3{tx, ty, tz};
              Fn(std::get<I>(args)...);
            }
      }
}
}  // namespace detail

// Describe kernel Fn (a plain function compiled with cuda_emulation.h) under its mangled name.
template <auto Fn>
HostKernel make_host_kernel(std::string mangled_name) {
  using Traits = detail::FnTraits<decltype(Fn)>;
  HostKernel k;
  k.name = std::move(mangled_name);
  k.layout = detail::layout_of<typename Traits::Args>(std::make_index_sequence<Traits::kCount>{}, &k.param_bytes);
  k.entry = [](const LaunchGeometry& g, const std::byte* p) {
    detail::run_grid<Fn>(g, p, std::make_index_sequence<Traits::kCount>{});
  };
  return k;
}

// Run kernel Fn directly on this thread, as a reference computation would (no pipeline).
template <auto Fn, typename... A>
void run_kernel_direct(emu::Dim3 grid, emu::Dim3 block, A... args) {
  using Tuple = typename detail::FnTraits<decltype(Fn)>::Args;
  Tuple t{args...};
  uint32_t total = 0;
  constexpr size_t n = std::tuple_size_v<Tuple>;
  auto layout = detail::layout_of<Tuple>(std::make_index_sequence<n>{}, &total);
  std::vector<std::byte> buf(total + 8);
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((std::memcpy(buf.data() + layout[I].offset, &std::get<I>(t), sizeof(std::tuple_element_t<I, Tuple>))), ...);
  }(std::make_index_sequence<n>{});
  LaunchGeometry g{grid, block, 0};
  detail::run_grid<Fn>(g, buf.data(), std::make_index_sequence<n>{});
}

// Registers kernels at static-initialization time. Use POS_HOST_KERNEL below: its priority runs
// the registration before ordinary constructors, such as the module registration nvcc emits into a
// program that runs POS in-process (which looks the kernels up).
struct KernelRegistrar {
  explicit KernelRegistrar(HostKernel k) { KernelRegistry::global().add(std::move(k)); }
};

#define POS_HOST_KERNEL(var, fn, mangled_name)                                          \
  static ::pos::host::KernelRegistrar var __attribute__((init_priority(200))){           \
      ::pos::host::make_host_kernel<fn>(mangled_name)}

}  // namespace pos::host
