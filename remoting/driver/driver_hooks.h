// driver_hooks.h — the in-process runtime's interception core, without the process-wide state:
// which exported driver symbol each hook stands for, which hook a cuGetProcAddress answer becomes,
// and the census of what a process resolved and called (docs/driver_runtime.md).
//
// interpose.cc exports the hooks and `dlsym` from libpos_driver.so and owns one Resolver and one
// Census per process; this part is plain code so that unit tests drive it against fake tables.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "remoting/driver/driver_api.h"

namespace pos::driver {

struct HookInfo {
  const char* name;  // the driver's exported (versioned) symbol
  const char* base;  // what cuGetProcAddress is asked for
  bool per_thread;   // the per-thread default stream variant (_ptsz / _ptds)
  int min_version;   // the lowest cudaVersion for which cuGetProcAddress(base) returns this variant
  Role role;
};
const HookInfo& hook_info(HookId id);

// The hook of an exported symbol name ("cuMemAlloc_v2"), if there is one.
std::optional<HookId> hook_by_export(std::string_view name);
// Whether some hook answers cuGetProcAddress(base).
bool hooked_base(std::string_view base);
// The variant cuGetProcAddress(base, version, flags) returns, among the hooked ones: the per-thread
// variant when the flags ask for it and one exists, and of those the one of the highest
// min_version not above `version`. None when the version predates every hooked variant (the
// driver then returns an older ABI that no hook has: it passes through).
std::optional<HookId> hook_by_rule(std::string_view base, int version, uint64_t flags);

// Maps what the real driver hands out to the hooks that stand in for it. Filled once (set_real),
// then read-only: thread-safe for readers after that.
class Resolver {
 public:
  // `real`: the driver's own address of each hook's export (nullptr where it has none);
  // `hooks`: the address of each hook.
  void set_real(const std::array<void*, kHookCount>& real, const std::array<void*, kHookCount>& hooks);
  void* real(HookId id) const { return real_[static_cast<size_t>(id)]; }
  void* hook(HookId id) const { return hooks_[static_cast<size_t>(id)]; }

  struct Answer {
    void* fn;                    // what the caller gets
    std::optional<HookId> hook;  // the hook it is, if any
    bool by_rule;                // matched by name and version, not by address
  };
  // A driver function `p` that cuGetProcAddress returned for (symbol, version, flags): the hook of
  // the same export when `p` is that export's address (or already the hook: a driver that takes
  // its exports' addresses through its GOT gets ours, the preload's); else, for a hooked base name, the hook the
  // rule names (the driver may hand out internal addresses that differ from its exports); else `p`.
  Answer substitute(std::string_view symbol, int version, uint64_t flags, void* p) const;
  // What dlsym found (`p`, possibly our own export, which the preload puts first) for `name`: the
  // hook when `p` is the driver's export or the hook itself; else `p`.
  Answer for_dlsym(std::string_view name, void* p) const;

 private:
  std::array<void*, kHookCount> real_{};
  std::array<void*, kHookCount> hooks_{};
  std::unordered_map<const void*, HookId> by_real_;  // the driver's exports and our hooks alike
};

// What a process resolved and called through the driver, for `POS_DRIVER_CENSUS` and tests.
// Thread-safe. count() is the only call on hot paths: one relaxed atomic add on the hook's own
// cache line.
class Census {
 public:
  void count(HookId id) { calls_[static_cast<size_t>(id)].n.fetch_add(1, std::memory_order_relaxed); }
  uint64_t calls(HookId id) const { return calls_[static_cast<size_t>(id)].n.load(std::memory_order_relaxed); }

  // A driver symbol asked for through dlsym ("dlsym") or cuGetProcAddress ("proc").
  void resolved(std::string_view name, const char* via, const Resolver::Answer& a);

  // Device memory handed out and given back through the hooks (cuMemAlloc*, cuMemFree*).
  void device_alloc(uint64_t addr, uint64_t bytes);
  void device_free(uint64_t addr);
  struct Memory {
    uint64_t allocations = 0, frees = 0, unknown_frees = 0, live = 0, live_bytes = 0, peak_bytes = 0;
  };
  Memory memory() const;
  // The size of the live allocation at `addr`, or 0.
  uint64_t allocation_at(uint64_t addr) const;

  // Kernel launches of every kind (cuLaunchKernel*, cuLaunchCooperativeKernel*).
  uint64_t launches() const;
  // Hooked calls of every kind: whether the job has called its driver lately.
  uint64_t total_calls() const;

  // A context of device `dev` was taken (cuDevicePrimaryCtxRetain).
  void device_used(int dev);
  // The devices the job used (0..63), ascending.
  std::vector<int> devices() const;
  // The lowest of them, or -1: without building the list (asked on every allocation).
  int first_device() const;
  // What the job did that POS cannot checkpoint yet, each named for an operator ("CUDA IPC memory
  // handles (2 calls)", "several GPUs (0, 1)", ...): a dump refuses these by name.
  std::vector<std::string> not_checkpointable() const;

  // One JSON object: hooks called (non-zero counts), symbols resolved, device memory, devices and
  // what cannot be checkpointed.
  std::string json(std::string_view driver_path) const;

 private:
  struct alignas(64) Counter {
    std::atomic<uint64_t> n{0};
  };
  std::array<Counter, kHookCount> calls_{};
  std::atomic<uint64_t> devices_{0};  // bit d: device d used
  struct Resolution {
    uint64_t n = 0;
    std::string via;
    bool hooked = false;
    bool by_rule = false;
  };
  mutable std::mutex mu_;
  std::map<std::string, Resolution, std::less<>> resolved_;  // under mu_
  std::unordered_map<uint64_t, uint64_t> live_;              // under mu_: address → bytes
  Memory mem_;                                               // under mu_
};

}  // namespace pos::driver
