// driver_hooks.cc — the hook table, cuGetProcAddress's answers turned into hooks, and the census.
// No process-wide state here (interpose.cc has it), so tests drive it against fake tables.
#include "remoting/driver/driver_hooks.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "pos/base/text.h"

namespace pos::driver {

namespace {

constexpr HookInfo kHooks[kHookCount] = {
#define POS_DRIVER_HOOK_INFO(name, base, per_thread, min_version, role, ...) \
  HookInfo{#name, #base, per_thread, min_version, Role::role},
    POS_DRIVER_HOOKS(POS_DRIVER_HOOK_INFO)
#undef POS_DRIVER_HOOK_INFO
};

}  // namespace

const HookInfo& hook_info(HookId id) { return kHooks[static_cast<size_t>(id)]; }

std::optional<HookId> hook_by_export(std::string_view name) {
  // A few dozen names, asked a few thousand times a run: a scan is cheap enough and needs no
  // initialization (dlsym may be called before any constructor of ours has run).
  for (size_t i = 0; i < kHookCount; ++i)
    if (name == kHooks[i].name) return static_cast<HookId>(i);
  return std::nullopt;
}

bool hooked_base(std::string_view base) {
  return std::any_of(std::begin(kHooks), std::end(kHooks), [&](const HookInfo& h) { return base == h.base; });
}

std::optional<HookId> hook_by_rule(std::string_view base, int version, uint64_t flags) {
  const bool want_pt = (flags & kProcAddressPerThread) != 0;
  std::optional<HookId> best;
  int best_version = -1;
  bool best_pt = false;
  for (size_t i = 0; i < kHookCount; ++i) {
    const HookInfo& h = kHooks[i];
    if (base != h.base || h.min_version > version) continue;
    if (h.per_thread && !want_pt) continue;
    // A per-thread variant beats a legacy one when asked for; then the newest ABI wins.
    const bool better = !best || (h.per_thread && !best_pt) || (h.per_thread == best_pt && h.min_version > best_version);
    if (better) best = static_cast<HookId>(i), best_version = h.min_version, best_pt = h.per_thread;
  }
  return best;
}

void Resolver::set_real(const std::array<void*, kHookCount>& real, const std::array<void*, kHookCount>& hooks) {
  real_ = real;
  hooks_ = hooks;
  by_real_.clear();
  for (size_t i = 0; i < kHookCount; ++i) {
    if (real_[i] != nullptr) by_real_.emplace(real_[i], static_cast<HookId>(i));
    if (hooks_[i] != nullptr) by_real_.emplace(hooks_[i], static_cast<HookId>(i));
  }
}

Resolver::Answer Resolver::substitute(std::string_view symbol, int version, uint64_t flags, void* p) const {
  if (p == nullptr) return {p, std::nullopt, false};
  if (auto it = by_real_.find(p); it != by_real_.end() && hooks_[static_cast<size_t>(it->second)] != nullptr)
    return {hooks_[static_cast<size_t>(it->second)], it->second, false};
  if (!hooked_base(symbol)) return {p, std::nullopt, false};
  const auto id = hook_by_rule(symbol, version, flags);
  if (!id || real_[static_cast<size_t>(*id)] == nullptr || hooks_[static_cast<size_t>(*id)] == nullptr)
    return {p, std::nullopt, false};
  return {hooks_[static_cast<size_t>(*id)], id, true};
}

Resolver::Answer Resolver::for_dlsym(std::string_view name, void* p) const {
  const auto id = hook_by_export(name);
  if (!id || p == nullptr) return {p, std::nullopt, false};
  const size_t i = static_cast<size_t>(*id);
  if (hooks_[i] == nullptr || real_[i] == nullptr || (p != real_[i] && p != hooks_[i])) return {p, std::nullopt, false};
  return {hooks_[i], id, false};
}

void Census::resolved(std::string_view name, const char* via, const Resolver::Answer& a) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = resolved_.find(name);
  if (it == resolved_.end()) it = resolved_.emplace(std::string(name), Resolution{}).first;
  Resolution& r = it->second;
  ++r.n;
  if (r.via.find(via) == std::string::npos) r.via += r.via.empty() ? via : std::string("+") + via;
  r.hooked = r.hooked || a.hook.has_value();
  r.by_rule = r.by_rule || a.by_rule;
}

void Census::device_alloc(uint64_t addr, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  ++mem_.allocations;
  auto [it, fresh] = live_.emplace(addr, bytes);
  if (!fresh) {  // the driver reused an address we never saw freed (freed outside the hooks)
    mem_.live_bytes -= it->second;
    it->second = bytes;
  } else {
    ++mem_.live;
  }
  mem_.live_bytes += bytes;
  mem_.peak_bytes = std::max(mem_.peak_bytes, mem_.live_bytes);
}

void Census::device_free(uint64_t addr) {
  std::lock_guard<std::mutex> lk(mu_);
  ++mem_.frees;
  auto it = live_.find(addr);
  if (it == live_.end()) {
    ++mem_.unknown_frees;
    return;
  }
  mem_.live_bytes -= it->second;
  --mem_.live;
  live_.erase(it);
}

Census::Memory Census::memory() const {
  std::lock_guard<std::mutex> lk(mu_);
  return mem_;
}

uint64_t Census::allocation_at(uint64_t addr) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(addr);
  return it == live_.end() ? 0 : it->second;
}

uint64_t Census::launches() const {
  uint64_t n = 0;
  for (size_t i = 0; i < kHookCount; ++i)
    if (kHooks[i].role == Role::kLaunch) n += calls_[i].n.load(std::memory_order_relaxed);
  return n;
}

uint64_t Census::total_calls() const {
  uint64_t n = 0;
  for (const Counter& c : calls_) n += c.n.load(std::memory_order_relaxed);
  return n;
}

void Census::device_used(int dev) {
  if (dev >= 0 && dev < 64) devices_.fetch_or(1ull << dev, std::memory_order_relaxed);
}

int Census::first_device() const {
  const uint64_t m = devices_.load(std::memory_order_relaxed);
  return m == 0 ? -1 : std::countr_zero(m);
}

std::vector<int> Census::devices() const {
  std::vector<int> out;
  const uint64_t m = devices_.load(std::memory_order_relaxed);
  for (int d = 0; d < 64; ++d)
    if (m & (1ull << d)) out.push_back(d);
  return out;
}

std::vector<std::string> Census::not_checkpointable() const {
  std::vector<std::string> out;
  // CUDA graphs are the driver's state, which NVIDIA's checkpoint takes; the memory they name comes
  // back at the same addresses. So they are counted (json: cuda_graphs), not refused.
  const uint64_t ipc = calls(HookId::cuIpcGetMemHandle) + calls(HookId::cuIpcOpenMemHandle_v2);
  if (ipc > 0) out.push_back("CUDA IPC memory handles (" + std::to_string(ipc) + " calls)");
  // Memory shared with other processes through the VMM calls: created shareable is fine (PyTorch's
  // expandable segments ask for it), exported or imported is not (the other side would keep the old memory).
  const uint64_t shared = calls(HookId::cuMemExportToShareableHandle) + calls(HookId::cuMemImportFromShareableHandle);
  if (shared > 0) out.push_back("device memory shared between processes (" + std::to_string(shared) + " exports and imports)");
  if (const uint64_t n = calls(HookId::cuMemAllocManaged); n > 0)
    out.push_back("managed memory (" + std::to_string(n) + " allocations)");
  if (const std::vector<int> d = devices(); d.size() > 1) {
    std::string list;
    for (int x : d) list += (list.empty() ? "" : ", ") + std::to_string(x);
    out.push_back("several GPUs (" + list + ")");
  }
  return out;
}

std::string Census::json(std::string_view driver_path) const {
  std::string o = "{\"driver\":" + json_string(driver_path) + ",\"calls\":{";
  bool first = true;
  for (size_t i = 0; i < kHookCount; ++i) {
    const uint64_t n = calls_[i].n.load(std::memory_order_relaxed);
    if (n == 0) continue;
    o += (first ? "" : ",") + json_string(kHooks[i].name) + ":" + std::to_string(n);
    first = false;
  }
  o += "},\"resolved\":{";
  std::lock_guard<std::mutex> lk(mu_);
  first = true;
  for (const auto& [name, r] : resolved_) {
    o += (first ? "" : ",") + json_string(name) + ":{\"n\":" + std::to_string(r.n) + ",\"via\":" + json_string(r.via) +
         ",\"hooked\":" + (r.hooked ? "true" : "false") + ",\"by_rule\":" + (r.by_rule ? "true" : "false") + "}";
    first = false;
  }
  o += "},\"device_memory\":{\"allocations\":" + std::to_string(mem_.allocations) +
       ",\"frees\":" + std::to_string(mem_.frees) + ",\"unknown_frees\":" + std::to_string(mem_.unknown_frees) +
       ",\"live\":" + std::to_string(mem_.live) + ",\"live_bytes\":" + std::to_string(mem_.live_bytes) +
       ",\"peak_bytes\":" + std::to_string(mem_.peak_bytes) + "},\"devices\":[";
  first = true;
  for (int d : devices()) o += (std::exchange(first, false) ? "" : ",") + std::to_string(d);
  o += "],\"cuda_graphs\":{\"captures\":" +
       std::to_string(calls(HookId::cuStreamBeginCapture_v2) + calls(HookId::cuStreamBeginCapture_v2_ptsz)) +
       ",\"launches\":" + std::to_string(calls(HookId::cuGraphLaunch) + calls(HookId::cuGraphLaunch_ptsz)) +
       "},\"not_checkpointable\":[";
  first = true;
  for (const std::string& w : not_checkpointable()) o += (std::exchange(first, false) ? "" : ",") + json_string(w);
  return o + "]}";
}

}  // namespace pos::driver
