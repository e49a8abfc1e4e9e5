// host_kernels.h — the host backend's kernel library: CUDA kernels compiled for the CPU, by mangled name.
// Kernels are written once in CUDA C++; on the host they run through cuda_emulation.h, one thread at a time.
#pragma once

#include <array>
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
  bool pointer = false;            // a pointer by its C++ type, not by its value: an integer never is
};

// A pointer the kernel will follow: where it lies in the parameter buffer, and which parameter
// holds it (the parameter itself, or a struct parameter with it as a member). The host backend
// checks each against the launching client's own memory before the kernel runs (it runs inside
// posd, beside every other client's memory).
struct PointerSlot {
  uint32_t offset = 0;
  uint32_t param = 0;
};

// Where a struct kernel parameter keeps its pointers. A member's type cannot be read off a struct
// in C++20, so each struct (or union) a registered kernel takes by value must be described at
// namespace scope, next to the struct, by POS_HOST_POINTER_MEMBERS(Type, offsetof(Type, m), ...)
// or POS_HOST_NO_POINTER_MEMBERS(Type); a kernel taking an undescribed one does not compile, so a
// pointer can never slip past the host backend's check unannounced.
template <typename T>
struct PointerMembers {
  static constexpr bool kDescribed = false;
  static constexpr std::array<uint32_t, 0> kOffsets{};
};

#define POS_HOST_POINTER_MEMBERS(Type, ...)                                          \
  template <>                                                                        \
  struct pos::host::PointerMembers<Type> {                                           \
    static constexpr bool kDescribed = true;                                         \
    static constexpr std::array kOffsets = std::to_array<uint32_t>({__VA_ARGS__});   \
  }
#define POS_HOST_NO_POINTER_MEMBERS(Type)                 \
  template <>                                             \
  struct pos::host::PointerMembers<Type> {                \
    static constexpr bool kDescribed = true;              \
    static constexpr std::array<uint32_t, 0> kOffsets{};  \
  }

using KernelEntry = void (*)(const LaunchGeometry&, const std::byte* params);

struct HostKernel {
  std::string name;  // mangled name, as __cudaRegisterFunction passes it
  std::vector<ParamInfo> layout;
  uint32_t param_bytes = 0;
  KernelEntry entry = nullptr;
  std::vector<PointerSlot> pointers;  // every pointer parameter and pointer member, in order
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

// A described struct's pointer members lie wholly inside it, at a pointer's alignment.
template <typename T>
constexpr bool pointer_members_fit() {
  for (uint32_t off : PointerMembers<T>::kOffsets)
    if (off % alignof(void*) != 0 || off + sizeof(void*) > sizeof(T)) return false;
  return true;
}

// CUDA's parameter buffer: each parameter at its natural alignment, in order.
template <typename Tuple, size_t... I>
std::vector<ParamInfo> layout_of(std::index_sequence<I...>, uint32_t* total) {
  std::vector<ParamInfo> out;
  uint32_t off = 0;
  auto one = [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_class_v<T> || std::is_union_v<T>) {
      static_assert(PointerMembers<T>::kDescribed,
                    "a struct kernel parameter needs POS_HOST_POINTER_MEMBERS or POS_HOST_NO_POINTER_MEMBERS");
      static_assert(pointer_members_fit<T>(), "a pointer member offset is misaligned or outside the struct");
    }
    off = (off + alignof(T) - 1) / alignof(T) * alignof(T);
    out.push_back(ParamInfo{off, static_cast<uint32_t>(sizeof(T)), is_read_only_pointer<T>(), std::is_pointer_v<T>});
    off += sizeof(T);
  };
  (one(std::type_identity<std::tuple_element_t<I, Tuple>>{}), ...);
  *total = off;
  return out;
}

// The pointers a kernel will follow, from its parameter types (see PointerSlot).
template <typename Tuple, size_t... I>
std::vector<PointerSlot> pointers_of(std::index_sequence<I...>, const std::vector<ParamInfo>& layout) {
  static_assert(sizeof(void*) == 8, "pointer slots are read as 8-byte words");
  std::vector<PointerSlot> out;
  auto one = [&](auto tag, uint32_t i) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_pointer_v<T>) {
      out.push_back(PointerSlot{layout[i].offset, i});
    } else if constexpr (std::is_class_v<T> || std::is_union_v<T>) {
      for (uint32_t m : PointerMembers<T>::kOffsets) out.push_back(PointerSlot{layout[i].offset + m, i});
    }
  };
  (one(std::type_identity<std::tuple_element_t<I, Tuple>>{}, static_cast<uint32_t>(I)), ...);
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
  k.pointers = detail::pointers_of<typename Traits::Args>(std::make_index_sequence<Traits::kCount>{}, k.layout);
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
