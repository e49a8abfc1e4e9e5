// interpose.cc — libpos_driver.so's exports: `dlsym`, the hooked driver entry points and both
// cuGetProcAddress versions, over one process-wide Resolver and Census (driver_hooks.h), and the
// job's control socket for pos-cli (remoting/common/job_control.h).
//
// Preloaded (`pos run`, docs/driver_runtime.md), the library sees every way a process reaches the
// driver: direct linking (the preload's exports come first), dlopen + dlsym (our dlsym), and
// cuGetProcAddress (ours, asked through either). Each hook counts its call and forwards to the
// real driver's export; what it knows (device allocations today) goes to the census. Everything
// not hooked is the driver's own function, so it costs nothing.
#include <dlfcn.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>

#include "pos/base/gate.h"
#include "pos/base/parse.h"
#include "pos/base/text.h"
#include "remoting/common/job_control.h"
#include "remoting/common/process_info.h"
#include "remoting/common/share_gate.h"
#include "remoting/common/usage_region.h"
#include "remoting/driver/app_vmm.h"
#include "remoting/driver/device_image.h"
#include "remoting/driver/driver_hooks.h"
#include "remoting/driver/gpu_identity.h"
#include "remoting/driver/graph_touches.h"
#include "remoting/driver/held_memory.h"
#include "remoting/driver/lazy_load.h"
#include "remoting/driver/launch_params.h"
#include "remoting/driver/memory_limit.h"
#include "remoting/driver/placement.h"
#include "remoting/driver/sm_limit.h"
#include "remoting/driver/snapshot.h"
#include "remoting/driver/stream_pool.h"

#define POS_DRIVER_EXPORT extern "C" __attribute__((visibility("default")))

namespace pos::driver {
namespace {

using DlsymFn = void* (*)(void*, const char*) noexcept;  // noexcept: else no tail call (see dlsym)

// glibc's dlsym, found by version so that ours is skipped (GLIBC_2.34 where libdl moved into libc).
DlsymFn real_dlsym() noexcept {
  static std::atomic<DlsymFn> fn{nullptr};
  DlsymFn f = fn.load(std::memory_order_acquire);
  if (f != nullptr) return f;
  for (const char* v : {"GLIBC_2.34", "GLIBC_2.2.5"}) {
    f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", v));
    if (f != nullptr) break;
  }
  fn.store(f, std::memory_order_release);
  return f;
}

struct Runtime {
  std::string driver_path;
  std::string error;  // why the driver could not be loaded (empty when it was)
  void* driver = nullptr;
  Resolver resolver;
  Census census;
  std::unique_ptr<Placement> placement;             // device memory at POS's addresses (null: off)
  std::unique_ptr<AppVmm> app_vmm;                  // device memory the job maps itself
  // Stream-ordered memory (cuMemAllocAsync from the device's default pool) carved out of placed
  // segments (stream_pool.h; null: placement off, or POS_DRIVER_PLACE_ASYNC=0).
  std::unique_ptr<StreamPool> pool;
  CUresult (*device_mem_pool)(CUmemoryPool* pool, CUdevice dev) = nullptr;   // cuDeviceGetMemPool
  CUresult (*default_mem_pool)(CUmemoryPool* pool, CUdevice dev) = nullptr;  // cuDeviceGetDefaultMemPool
  std::array<std::atomic<CUmemoryPool>, 16> default_pools{};  // each device's, once asked (it never changes)
  std::string placement_error;                      // why placement is off although asked for
  std::unique_ptr<pos::JobControlServer> control;  // pos-cli's way in (null: off or failed)
  std::string control_error;
  std::string job;  // POS_JOB_NAME, else the process's name
  // Device memory the job holds, against its limit (POS_MEMORY_LIMIT, `pos-cli limit`): docs/limits.md.
  MemoryLimit memory;
  std::string memory_error;  // why POS_MEMORY_LIMIT was not taken (empty when it was, or is unset)
  CUresult (*total_mem)(size_t* bytes, CUdevice d) = nullptr;  // the real cuDeviceTotalMem_v2
  // The job's SM limit (POS_SM_LIMIT, `pos run --sms`): a green context in place of each GPU's
  // primary context (sm_limit.h). Set before the runtime is published; thread-safe after.
  SmLimit sms;
  struct {  // the real driver's, for adopt_green
    CUresult (*get_current)(CUcontext* ctx) = nullptr;
    CUresult (*set_current)(CUcontext ctx) = nullptr;
    CUresult (*get_device)(CUdevice* dev) = nullptr;
    CUresult (*retain)(CUcontext* ctx, CUdevice dev) = nullptr;
    CUresult (*release)(CUdevice dev) = nullptr;
  } smc;
  // This user's jobs' shared accounting (remoting/common/usage_region.h), and this process's slot
  // in it (under usage_mu: rejoined when it is not this process's any more, after a CRIU restore).
  std::unique_ptr<pos::UsageRegion> usage;
  std::string usage_error;
  std::mutex usage_mu;
  int usage_slot = -1;
  uint64_t usage_start = 0;  // under usage_mu: the start time the slot was joined with
  int attached_slot = -1, attached_device = -1;  // under usage_mu: what the share gate was last attached with
  // The job's GPU-time share (POS_GPU_SHARE, `pos-cli limit --gpu-share`), per mille, as asked and
  // as the region took it (it refuses shares that add up past the GPU): under usage_mu.
  uint32_t share_wanted = 0, share_set = 0;
  std::string share_error;  // under usage_mu
  pos::ShareGate share;     // launches wait here for the job's turn when its GPU is contended
  // The job's driver work passes this gate (every hook but cuGetProcAddress); a dump closes it so
  // that nothing touches device memory while POS saves and unmaps it (docs/driver_runtime.md).
  pos::Gate gate;
  CopyCalls copy;  // the real driver's, for saving and loading device memory
  // What the job's launches, copies and memsets may write (placed memory only: marks go to
  // Placement), and the streams a cut orders itself after (docs/driver_runtime.md, "Written memory").
  std::unique_ptr<LaunchScanner> scanner;
  GraphCalls graph_reads;  // the real driver's, to read a graph as it is instantiated (graph_touches.h)
  GraphBook graphs;        // what each executable graph may write
  bool graph_reads_off = false;  // POS_GRAPH_WRITES=0
  std::atomic<uint64_t> marked{0};  // addresses found in launch parameters
  StreamSet streams;
  SnapCalls snap;  // the real driver's, for GPU-only checkpoints
  GpuIdCalls ids;  // the real driver's device queries, for pos-cli's `gpus`
  std::mutex dump_mu;
  std::unique_ptr<DeviceShadow> shadow;  // under dump_mu: a GPU-only checkpoint's copy, until snap-release
  // under dump_mu: the caller of the last cut wrote its copy and let go of it with `snap-release
  // keep`: the next cut may copy into the same shadow instead of making one (a policy's ticks).
  bool shadow_free = false;
  // While a GPU-only checkpoint's copies run ahead of the job (snapshot.h, CopyAhead): the hooks
  // make each call's stream wait for the copies of what it may touch. `ahead_on` is read first,
  // without the mutex, so that a hook pays one load when no cut is running.
  std::atomic<bool> ahead_on{false};
  std::mutex ahead_mu;
  std::unique_ptr<CopyAhead> ahead;  // under ahead_mu
  uint64_t ahead_errors = 0;         // under ahead_mu: waits the driver refused (the cut then fails)
  // A cut that waits for the job's step boundary (`snap-cut align=MS`): the job's threads inside a
  // synchronizing call (cuStreamSynchronize and the like), and, while a cut waits (`align_wanted`,
  // read without the mutex), the returns from them counted and told to it. At a step's end the
  // job's stream-ordered temporaries are free, and a cut does not copy them (live_only;
  // docs/driver_runtime.md, "GPU-only checkpoints").
  std::atomic<int> in_sync{0};
  std::atomic<bool> align_wanted{false};
  std::atomic<int> capture_waiters{0};  // capture-begin hooks held by a cut: the cut waits no more
  std::mutex align_mu;
  std::condition_variable align_cv;
  uint64_t sync_returns = 0;  // under align_mu
  // While a GPU-only checkpoint is prepared no CUDA graph capture may begin: the checkpoint's own
  // driver calls (a shadow's cuMemCreate, say) are prohibited while a capture runs, and would end
  // it. cuStreamBeginCapture's hooks wait for this to clear (GatePass).
  std::atomic<bool> captures_held{false};
  std::mutex capture_mu;
  std::condition_variable capture_cv;
  // under dump_mu: the id of the last cut (a GPU-only checkpoint or a dump's hold), which the
  // written marks are relative to: an image of that cut is the only valid --prev of the next one.
  uint64_t last_cut = 0;
  bool saved = false;     // under dump_mu: memory saved and unmapped, the gate closed
  bool shared = false;    // under dump_mu: memory handed out as descriptors (dump-share), the gate closed
  uint32_t shared_list = 0;  // under dump_mu: the checksum of the allocation list handed out
  std::string saved_dir;  // under dump_mu
  int saved_dev = 0;      // under dump_mu
  // A lazy restore's load (lazy_load.h): while `lazy` is set, pos-cli (pid lazy_loader) is still
  // loading the memory the job runs on; every stream waits on the device for its flag. Under
  // lazy_mu (taken after dump_mu where both are); lazy_pending is read without it by the
  // stream-creating hooks first.
  LazyCalls lazy_calls;
  std::mutex lazy_mu;
  std::condition_variable lazy_cv;
  std::unique_ptr<LazyLoad> lazy;
  std::atomic<bool> lazy_pending{false};  // the flag not yet seen set: new streams must wait too
  bool lazy_gate_held = false;            // a stream could not be made to wait: the gate stays closed until loaded
  pid_t lazy_loader = 0;
  bool lazy_finished = false;  // the last lazy load ended and its flag was let go
};

// Device allocations POS placed, as the census counts them: Placement's, with the stream pool's
// segments counted as the blocks carved out of them.
uint64_t placed_live(Runtime* rt) {
  if (!rt->placement) return 0;
  uint64_t n = rt->placement->stats().live;
  if (rt->pool) {
    const StreamPool::Stats st = rt->pool->stats();
    n = n - st.segments + (st.allocs - st.frees);
  }
  return n;
}

// The hook depth of this thread: a driver that calls its own exports (through the preload's
// symbols) re-enters the hooks, and an inner call must not wait at a gate its outer call holds.
thread_local int t_hook_depth = 0;

// A hook's passage through the gate: waits while a dump holds the job's device memory.
constexpr bool begins_capture(HookId id) {
  return id == HookId::cuStreamBeginCapture_v2 || id == HookId::cuStreamBeginCapture_v2_ptsz;
}

// `capture`: the runtime, for the hooks that begin a CUDA graph capture, which also wait while a
// GPU-only checkpoint holds captures back (checked again once inside the gate, so that one that
// was held at the gate while the checkpoint began does not slip through).
class GatePass {
 public:
  explicit GatePass(pos::Gate& g, Runtime* capture = nullptr) : gate_(t_hook_depth++ == 0 ? &g : nullptr) {
    if (gate_ == nullptr) return;
    for (;;) {
      if (capture != nullptr && capture->captures_held.load(std::memory_order_acquire)) {
        capture->capture_waiters.fetch_add(1, std::memory_order_acq_rel);
        if (capture->align_wanted.load(std::memory_order_acquire)) {  // a cut waiting for a step's end goes now
          std::lock_guard<std::mutex> al(capture->align_mu);
          capture->align_cv.notify_all();
        }
        std::unique_lock<std::mutex> lk(capture->capture_mu);
        capture->capture_cv.wait(lk, [&] { return !capture->captures_held.load(std::memory_order_acquire); });
        capture->capture_waiters.fetch_sub(1, std::memory_order_acq_rel);
      }
      gate_->enter(0);
      if (capture == nullptr || !capture->captures_held.load(std::memory_order_acquire)) return;
      gate_->leave();
    }
  }
  ~GatePass() {
    --t_hook_depth;
    if (gate_ != nullptr) gate_->leave();
  }
  GatePass(const GatePass&) = delete;
  GatePass& operator=(const GatePass&) = delete;

 private:
  pos::Gate* gate_;
};

// The job's name as ps shows it: POS_JOB_NAME, else /proc/self/comm.
std::string job_name() {
  if (const char* n = std::getenv("POS_JOB_NAME"); n != nullptr && *n != '\0') return pos::printable(n, 64);
  char buf[64] = {};
  if (FILE* f = std::fopen("/proc/self/comm", "r")) {
    if (std::fgets(buf, sizeof(buf), f) == nullptr) buf[0] = '\0';
    std::fclose(f);
  }
  std::string s = buf;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return pos::printable(s, 64);
}

// The census with what only the runtime knows: why the driver or the control socket is missing,
// and where device memory was placed.
// What the job holds and its limit, published in the usage region (a process restored under this
// pid has another start time: its slot was freed, or is about to be, and it joins anew).
// Called on every allocation and free (a cudaMallocAsync job makes hundreds per step), so the
// process's start time (a read of /proc, ~10 us) is read only when the slot is not this
// process's under the start time it joined with, and the share gate is re-attached only when
// something it uses changed (re-attaching makes its next launch check the region).
void publish_usage(Runtime* rt) {
  if (!rt->usage) return;
  std::lock_guard<std::mutex> lk(rt->usage_mu);
  const uint32_t pid = static_cast<uint32_t>(::getpid());
  bool changed = false;
  if (rt->usage_slot < 0 || !rt->usage->holds(rt->usage_slot, pid, rt->usage_start)) {
    const uint64_t start = pos::process_start_time(pid);
    if (!rt->usage->holds(rt->usage_slot, pid, start)) {
      pos::UsageRegion::Entry e;
      e.pid = pid, e.start_time = start;
      auto slot = rt->usage->join(e);
      rt->usage_slot = slot.ok() ? *slot : -1;
      rt->share_set = 0;
      if (!slot.ok()) {
        rt->usage_start = start;
        rt->usage_error = slot.status().message();
        rt->share.attach(nullptr, -1, -1);
        rt->attached_slot = -1;
        return;
      }
      rt->usage_error.clear();
    }
    rt->usage_start = start;
    changed = true;
  }
  const int device = rt->census.first_device();
  if (changed || rt->attached_device != device) rt->usage->set_device(rt->usage_slot, device);
  rt->usage->set_used(rt->usage_slot, rt->memory.used());
  rt->usage->set_limit(rt->usage_slot, rt->memory.limit());
  // The share counts once the job's GPU is known (the shares of one GPU must not pass 100 %).
  if (device >= 0 && rt->share_wanted != rt->share_set) {
    const pos::Status st = rt->usage->set_share(rt->usage_slot, rt->share_wanted);
    if (st.ok()) rt->share_set = rt->share_wanted, rt->share_error.clear();
    else rt->share_error = st.message() + ": no share set";
    changed = true;
  }
  if (changed || rt->attached_slot != rt->usage_slot || rt->attached_device != device) {
    rt->share.attach(rt->usage.get(), rt->usage_slot, device);
    rt->attached_slot = rt->usage_slot, rt->attached_device = device;
  }
}

// After the memory comes back from a dump (dump-take, dump-resume): this may be a process CRIU
// restored under the same pid, which must join under its own start time.
void rejoin_usage(Runtime* rt) {
  if (!rt->usage) return;
  {
    std::lock_guard<std::mutex> lk(rt->usage_mu);
    rt->usage_start = 0;
  }
  publish_usage(rt);
}

// The share gate's check, every 10 ms of launches: the slot still this process's (else, after a
// CRIU restore under the same pid, it joins anew).
void verify_usage(Runtime* rt) {
  bool ours = false;
  {
    std::lock_guard<std::mutex> lk(rt->usage_mu);
    ours = rt->usage->holds(rt->usage_slot, static_cast<uint32_t>(::getpid()), rt->usage_start);
  }
  if (!ours) publish_usage(rt);
}

// The job's limits and what it holds against them (ps, `limit`).
int dump_device(Runtime* rt);

std::string limits_json(Runtime* rt) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "{\"memory\":%llu,\"memory_used\":%llu,\"memory_refused\":%llu",
                static_cast<unsigned long long>(rt->memory.limit()), static_cast<unsigned long long>(rt->memory.used()),
                static_cast<unsigned long long>(rt->memory.refused()));
  std::string out = buf;
  if (!rt->memory_error.empty()) out += ",\"memory_error\":" + pos::json_string(rt->memory_error);
  if (const unsigned asked = rt->sms.asked(); asked != 0) {
    const int dev = dump_device(rt);
    out += ",\"sms\":" + std::to_string(asked) + ",\"sms_granted\":" + std::to_string(rt->sms.granted(dev)) +
           ",\"sms_total\":" + std::to_string(rt->sms.total(dev));
  }
  if (const std::string e = rt->sms.error(); !e.empty()) out += ",\"sms_error\":" + pos::json_string(e);
  if (rt->usage) out += ",\"usage_region\":" + pos::json_string(rt->usage->path());
  std::lock_guard<std::mutex> lk(rt->usage_mu);  // the job's threads may set usage_error meanwhile
  if (!rt->usage_error.empty()) out += ",\"usage_error\":" + pos::json_string(rt->usage_error);
  out += ",\"gpu_share\":" + std::to_string(rt->share_set) + ",\"gpu_share_asked\":" + std::to_string(rt->share_wanted);
  if (!rt->share_error.empty()) out += ",\"gpu_share_error\":" + pos::json_string(rt->share_error);
  std::snprintf(buf, sizeof(buf), ",\"turn_waits\":%llu,\"turn_wait_ns\":%llu,\"turn_yields\":%llu",
                static_cast<unsigned long long>(rt->share.waits()), static_cast<unsigned long long>(rt->share.wait_ns()),
                static_cast<unsigned long long>(rt->share.yields()));
  out += buf;
  return out + "}";
}

// A lazy restore still loading (lazy_load.h), for ps: {"loader":PID,"waits":N,"gate_held":B}, or
// empty when none is.
std::string lazy_state(Runtime* rt) {
  std::lock_guard<std::mutex> lz(rt->lazy_mu);
  if (!rt->lazy || !rt->lazy_pending.load(std::memory_order_relaxed)) return "";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "{\"loader\":%d,\"waits\":%llu,\"gate_held\":%s}", static_cast<int>(rt->lazy_loader),
                static_cast<unsigned long long>(rt->lazy->holds()), rt->lazy_gate_held ? "true" : "false");
  return buf;
}

std::string census_json(Runtime* rt) {
  std::string text = rt->census.json(rt->driver_path);
  if (!rt->error.empty()) text.insert(text.size() - 1, ",\"error\":" + pos::json_string(rt->error));
  if (rt->placement) text.insert(text.size() - 1, ",\"placement\":" + rt->placement->json());
  if (!rt->placement_error.empty())
    text.insert(text.size() - 1, ",\"placement_error\":" + pos::json_string(rt->placement_error));
  if (!rt->control_error.empty()) text.insert(text.size() - 1, ",\"control_error\":" + pos::json_string(rt->control_error));
  text.insert(text.size() - 1, ",\"limits\":" + limits_json(rt));
  if (const std::string l = lazy_state(rt); !l.empty()) text.insert(text.size() - 1, ",\"lazy_load\":" + l);
  if (rt->scanner) {
    const LaunchScanner::Stats w = rt->scanner->stats();
    char buf[224];
    std::snprintf(buf, sizeof(buf),
                  ",\"writes\":{\"launches_scanned\":%llu,\"launches_unparsed\":%llu,\"layouts\":%llu,\"addresses\":%llu,"
                  "\"streams\":%zu}",
                  static_cast<unsigned long long>(w.scanned), static_cast<unsigned long long>(w.unparsed),
                  static_cast<unsigned long long>(w.layouts),
                  static_cast<unsigned long long>(rt->marked.load(std::memory_order_relaxed)), rt->streams.list().size());
    text.insert(text.size() - 1, buf);
    // CUDA graphs read at instantiation (graph_touches.h): their launches mark only what they name.
    const GraphBook::Stats g = rt->graphs.stats();
    std::snprintf(buf, sizeof(buf),
                  ",\"graph_writes\":{\"graphs_read\":%llu,\"graphs_unread\":%llu,\"launches_read\":%llu,"
                  "\"launches_unread\":%llu",
                  static_cast<unsigned long long>(g.read), static_cast<unsigned long long>(g.unread),
                  static_cast<unsigned long long>(g.launches_read), static_cast<unsigned long long>(g.launches_unread));
    text.insert(text.size() - 1, std::string(buf) +
                                     (g.last_unread.empty() ? "" : ",\"last_unread\":" + pos::json_string(g.last_unread)) +
                                     "}");
  }
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string dump_error(const std::string& why) { return "{\"ok\":false,\"error\":" + pos::json_string(why) + "}"; }

// A job still starting (a PyTorch job importing its modules: no context, no device memory) has no
// GPU state to save: its checkpoints, dumps and moves answer so ("not_yet"), and a policy waits for
// it instead of counting failures. A dump could not go on anyway: holding the job takes its device
// context, which a job that never initialized the driver cannot give, and which a job that did
// would get from the hold, unasked. Empty when the job has used the GPU.
std::string not_started_answer(Runtime* rt) {
  if (rt->census.first_device() >= 0 || rt->census.memory().live != 0) return "";
  return "{\"ok\":false,\"not_yet\":true,\"error\":\"the job has not used the GPU yet: it has no GPU state to "
         "save\"}";
}

// Every allocation a dump saves: POS's placed ones and the job's own mappings, by address.
std::vector<SavedRegion> dump_regions(Runtime* rt) {
  std::vector<SavedRegion> out;
  if (rt->placement)
    for (const Placement::Region& r : rt->placement->regions()) out.push_back(SavedRegion{r.dev, r.addr, r.size, 0, {}});
  if (rt->app_vmm)
    for (const AppVmm::Region& r : rt->app_vmm->regions()) out.push_back(SavedRegion{r.dev, r.addr, r.size, 0, {}});
  std::sort(out.begin(), out.end(), [](const SavedRegion& a, const SavedRegion& b) { return a.addr < b.addr; });
  return out;
}

// Both kinds unmapped (the memory released), or both mapped again.
CUresult unmap_all(Runtime* rt) {
  CUresult rc = rt->placement ? rt->placement->unmap() : kSuccess;
  if (rc == kSuccess && rt->app_vmm) rc = rt->app_vmm->unmap_all();
  return rc;
}
CUresult remap_all(Runtime* rt) {
  CUresult rc = rt->placement ? rt->placement->remap() : kSuccess;
  if (rc == kSuccess && rt->app_vmm) rc = rt->app_vmm->remap_all();
  return rc;
}

// Why this job cannot be dumped now, or empty: what the census names (IPC, managed memory, several
// GPUs), memory the job maps itself in ways POS cannot make again.
std::string dump_blockers(Runtime* rt) {
  std::string why;
  const auto add = [&](const std::string& w) { why += (why.empty() ? "" : "; ") + w; };
  for (const std::string& w : rt->census.not_checkpointable()) add(w);
  if (!rt->app_vmm) add("the driver lacks a virtual memory call");
  else if (std::string w = rt->app_vmm->blocker(); !w.empty()) add(w);
  if (!rt->copy.complete()) add("the driver lacks a call POS copies device memory with");
  {
    std::lock_guard<std::mutex> lk(rt->lazy_mu);
    if (rt->lazy)
      add("it is still loading its device memory after a lazy restore (pos-cli pid " + std::to_string(rt->lazy_loader) +
          " loads it): try again once that is done");
  }
  return why;
}

// What the dump takes otherwise than through POS, for its report: device memory POS did not place
// (stream-ordered pools, pitched, or all of it with placement off) stays mapped, so NVIDIA's
// checkpoint copies it, correctly but more slowly; CUDA graphs go with the driver's state.
std::string dump_notes(Runtime* rt) {
  std::string note;
  const auto add = [&](const std::string& w) { note += (note.empty() ? "" : "; ") + w; };
  const Census::Memory m = rt->census.memory();
  const Placement::Stats ps = rt->placement ? rt->placement->stats() : Placement::Stats{};
  if (!rt->placement)
    add("placement is off (" + (rt->placement_error.empty() ? std::string("POS_DRIVER_PLACE=0") : rt->placement_error) +
        "): NVIDIA's checkpoint copies all device memory");
  else if (const uint64_t placed = placed_live(rt); m.live > placed)
    add(std::to_string(m.live - placed) + " device allocation(s) POS did not place (pitched memory, stream-ordered " +
        "pools, allocations inside graph captures) went through NVIDIA's checkpoint");
  const uint64_t graphs = rt->census.calls(HookId::cuStreamBeginCapture_v2) +
                          rt->census.calls(HookId::cuStreamBeginCapture_v2_ptsz) + rt->census.calls(HookId::cuGraphLaunch) +
                          rt->census.calls(HookId::cuGraphLaunch_ptsz);
  if (graphs > 0) add("CUDA graphs went with the driver's state");
  return note;
}

// A directory the job may write its device memory to: absolute, printable, an existing directory.
std::string check_dir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/' || pos::printable(dir) != dir) return "the image directory must be an absolute, printable path";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return dir + " is no directory";
  return "";
}

// The job's driver work stopped at the gate and the device idle: empty, or why not (the gate
// open again).
// The gate closed and every call inside it returned (a copy waits for its kernels); one that
// does not within the bound fails the caller rather than hanging it: empty, or why (gate open).
std::string close_gate(Runtime* rt) {
  rt->gate.close();
  for (int i = 0; !rt->gate.drained(); ++i) {
    if (i == 200000) {
      rt->gate.reopen();
      return "a driver call of the job did not return within 10 s";
    }
    if (i < 100) continue;  // most calls inside are launches of a few microseconds: spin first
    ::usleep(50);
  }
  return "";
}

std::string hold(Runtime* rt, int dev) {
  if (std::string why = close_gate(rt); !why.empty()) return why + ": not dumped";
  CUcontext ctx = nullptr;
  const bool idle = rt->copy.primary_ctx_retain(&ctx, dev) == kSuccess && rt->copy.ctx_set_current(ctx) == kSuccess &&
                    rt->copy.ctx_synchronize() == kSuccess;
  (void)rt->copy.ctx_set_current(nullptr);
  (void)rt->copy.primary_ctx_release(dev);
  if (!idle) {
    rt->gate.reopen();
    return "the device did not finish the job's work (cuCtxSynchronize failed): not dumped";
  }
  return "";
}

int dump_device(Runtime* rt) {
  const std::vector<int> devices = rt->census.devices();
  return devices.empty() ? 0 : devices.front();
}

// The device's primary context current on this (control) thread for a scope.
class CurrentContext {
 public:
  CurrentContext(const CopyCalls& c, int dev) : c_(c), dev_(dev) {
    ok_ = c_.primary_ctx_retain(&ctx_, dev) == kSuccess;
    ok_ = ok_ && c_.ctx_set_current(ctx_) == kSuccess;
  }
  ~CurrentContext() {
    (void)c_.ctx_set_current(nullptr);
    if (ctx_ != nullptr) (void)c_.primary_ctx_release(dev_);
  }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;
  bool ok() const { return ok_; }

 private:
  const CopyCalls& c_;
  int dev_;
  CUcontext ctx_ = nullptr;
  bool ok_ = false;
};

// A new cut (under dump_mu, the job held): its id, random so that no two cuts of any job share one
// (a restored job goes on from its image's id); *since gets the previous one.
uint64_t new_cut(Runtime* rt, uint64_t* since) {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lk(mu);
  uint64_t id = 0;
  while (id == 0 || id == rt->last_cut) id = gen() >> 2;  // 62 bits: below 10^19, which manifests hold
  *since = std::exchange(rt->last_cut, id);
  return id;
}

// A GPU-only checkpoint's shadow let go (under dump_mu): pos-cli imported it, or never will.
// `ctx_current`: the caller has the device's context current already (and keeps it).
void drop_shadow(Runtime* rt, bool ctx_current = false) {
  rt->shadow_free = false;
  if (!rt->shadow) return;
  if (ctx_current) {
    rt->shadow.reset();
    return;
  }
  CurrentContext cc(rt->copy, dump_device(rt));
  rt->shadow.reset();
}


// CUDA graph captures held back for a scope, in a job that captures them: the checkpoint's own
// driver calls (a shadow's cuMemCreate, its release, stream and event calls) are prohibited while
// a capture runs and would end it. acquire() holds the job for a moment to check that none is in
// progress (a capture begins through a hooked call: once held back, none can begin), then lets it
// run; cuStreamBeginCapture's hooks wait until the hold ends (GatePass).
class CaptureHold {
 public:
  CaptureHold() = default;
  CaptureHold(const CaptureHold&) = delete;
  CaptureHold& operator=(const CaptureHold&) = delete;
  // Empty: held, or the job never began a capture. Else why not (the job runs on either way).
  std::string acquire(Runtime* rt, double* held_s) {
    if (rt->census.calls(HookId::cuStreamBeginCapture_v2) + rt->census.calls(HookId::cuStreamBeginCapture_v2_ptsz) == 0)
      return "";
    if (rt->snap.is_capturing == nullptr)
      return "the job captures CUDA graphs and the driver cannot say whether a capture is in progress "
             "(no cuStreamIsCapturing)";
    const auto t = std::chrono::steady_clock::now();
    if (std::string why = close_gate(rt); !why.empty()) return why;
    const bool busy = any_capturing(rt->snap, rt->streams.list());
    if (!busy) {
      rt->captures_held.store(true, std::memory_order_release);
      rt_ = rt;
    }
    rt->gate.reopen();
    *held_s = seconds_since(t);
    return busy ? "a CUDA graph capture is in progress (the checkpoint's calls would end it): try again" : "";
  }
  ~CaptureHold() {
    if (rt_ == nullptr) return;
    {
      std::lock_guard<std::mutex> lk(rt_->capture_mu);
      rt_->captures_held.store(false, std::memory_order_release);
    }
    rt_->capture_cv.notify_all();
  }

 private:
  Runtime* rt_ = nullptr;
};

// A cut's allocation list as its answers carry it ([addr,size,written],... in address order),
// with its totals.
struct RegionList {
  std::string json;
  uint64_t bytes = 0, written = 0, written_bytes = 0;
};
RegionList region_list(const std::vector<Placement::Region>& regions) {
  RegionList l;
  for (const Placement::Region& r : regions) {
    l.json += (l.json.empty() ? "[" : ",[") + std::to_string(r.addr) + "," + std::to_string(r.size) + "," +
              (r.written ? "1" : "0") + "]";
    l.bytes += r.size;
    if (r.written) ++l.written, l.written_bytes += r.size;
  }
  return l;
}

// The checksum both ends of a hand-off compute over the allocation list, so that descriptors come
// back only to the allocations they left.
uint32_t list_checksum(const std::vector<Placement::Region>& regions) {
  std::vector<SavedRegion> list;
  for (const Placement::Region& r : regions) list.push_back(SavedRegion{r.dev, r.addr, r.size, 0, {}});
  return allocation_list_checksum(list);
}

// `dump-share`: the job held as for dump-save, but its device memory leaves as descriptors (one per
// placed allocation, in address order, on the answer) instead of being copied: pos-cli imports
// them, and only then sends dump-release. Refused with "share":false when the memory cannot leave
// this way (memory the job maps itself, an allocation without a shareable handle): pos-cli then
// uses dump-save.
pos::ControlMessage dump_share(Runtime* rt) {
  pos::ControlMessage out;
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  if (rt->saved || rt->shared) {
    out.text = dump_error("a dump holds this job already: dump-resume first");
    return out;
  }
  if (std::string no = not_started_answer(rt); !no.empty()) {
    out.text = std::move(no);
    return out;
  }
  drop_shadow(rt);  // a checkpoint's copy pos-cli never released: not for NVIDIA's checkpoint to take
  if (std::string why = dump_blockers(rt); !why.empty()) {
    out.text = dump_error("this job cannot be dumped: " + why);
    return out;
  }
  std::string no_share = rt->placement ? rt->placement->share_blocker() : "placement is off";
  if (no_share.empty() && rt->app_vmm && !rt->app_vmm->regions().empty()) no_share = "the job maps device memory itself";
  if (!no_share.empty()) {
    out.text = "{\"ok\":false,\"share\":false,\"error\":" + pos::json_string("device memory cannot be handed off: " + no_share) + "}";
    return out;
  }
  const int dev = dump_device(rt);
  // One descriptor per allocation: the job's limit may be lower than a big job's count.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (std::string why = hold(rt, dev); !why.empty()) {
    out.text = dump_error(why);
    return out;
  }
  const double quiesce_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<int> fds;
  if (const CUresult rc = rt->placement->share(&fds); rc != kSuccess) {
    rt->gate.reopen();
    out.text = "{\"ok\":false,\"share\":false,\"error\":" +
               pos::json_string("exporting device memory failed: CUDA driver error " + std::to_string(rc)) + "}";
    return out;
  }
  for (int fd : fds) out.fds.emplace_back(fd);
  // The dump is a cut: what was written since the last one is marked (an incremental image keeps
  // only that), and the marks start again from here.
  uint64_t since = 0;
  const uint64_t cut = new_cut(rt, &since);
  const std::vector<Placement::Region> regions = rt->placement->cut();
  const RegionList list = region_list(regions);
  const uint64_t bytes = list.bytes;
  rt->shared = true;
  rt->shared_list = list_checksum(regions);
  rt->saved_dev = dev;
  char head[320];
  std::snprintf(head, sizeof(head),
                "{\"ok\":true,\"share\":true,\"device\":%d,\"bytes\":%llu,\"count\":%zu,\"list\":%u,\"since\":%llu,"
                "\"cut\":%llu,\"quiesce_s\":%.6f,\"export_s\":%.6f,\"note\":",
                dev, static_cast<unsigned long long>(bytes), regions.size(), rt->shared_list,
                static_cast<unsigned long long>(since), static_cast<unsigned long long>(cut), quiesce_s, seconds_since(t1));
  out.text = head + pos::json_string(dump_notes(rt)) + ",\"regions\":[" + list.json + "]}";
  return out;
}

// `dump-release`: after dump-share, once pos-cli holds the descriptors: the memory unmapped and the
// job's references dropped (its addresses kept reserved), so the driver's checkpoint has none left.
std::string dump_release(Runtime* rt) {
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  if (!rt->shared || rt->saved) return dump_error("no dump-share holds this job: nothing to release");
  const auto t0 = std::chrono::steady_clock::now();
  if (const CUresult rc = unmap_all(rt); rc != kSuccess) {
    // What was unmapped is held by pos-cli's descriptors: it comes back with dump-take.
    rt->saved = true;
    return dump_error("unmapping device memory failed: CUDA driver error " + std::to_string(rc) +
                      " (the job stays stopped; dump-take gives it back)");
  }
  rt->saved = true;
  rt->saved_dir.clear();
  char out[96];
  std::snprintf(out, sizeof(out), "{\"ok\":true,\"unmap_s\":%.6f}", seconds_since(t0));
  return out;
}

const CUstream kLegacyStream = reinterpret_cast<CUstream>(uintptr_t{1});  // CU_STREAM_LEGACY

// A lazy load's watcher, on a thread of its own from dump-take on: once pos-cli sets the flag, new
// streams stop waiting, a held gate opens, and once the job's queued work is done (no wait pending
// on the device) the flag is let go. If pos-cli ends before it set the flag, the job's memory will
// never be whole: the job is ended rather than let run on wrong bytes (its image is unchanged).
void watch_lazy_load(Runtime* rt, int dev) {
  {
    std::unique_lock<std::mutex> lz(rt->lazy_mu);
    while (!rt->lazy->loaded()) {
      rt->lazy_cv.wait_for(lz, std::chrono::milliseconds(20));
      if (rt->lazy->loaded()) break;
      if (::kill(rt->lazy_loader, 0) != 0 && errno == ESRCH) {
        std::fprintf(stderr,
                     "pos: pos-cli (pid %d), which was loading this job's device memory after a lazy restore, ended "
                     "before the load did: ending the job (its image is unchanged: restore it again)\n",
                     static_cast<int>(rt->lazy_loader));
        ::kill(::getpid(), SIGKILL);
      }
    }
    rt->lazy_pending.store(false, std::memory_order_release);
    if (rt->lazy_gate_held) rt->gate.reopen();
    rt->lazy_gate_held = false;
    rt->lazy_cv.notify_all();
  }
  {
    CurrentContext ctx(rt->copy, dev);
    if (ctx.ok()) (void)rt->copy.ctx_synchronize();
  }
  std::lock_guard<std::mutex> lz(rt->lazy_mu);
  rt->lazy.reset();
  rt->lazy_finished = true;
}

// `dump-take COUNT LIST CUT` with COUNT descriptors: the memory handed out comes back (after
// dump-share and dump-release, or after a restore of such a dump, the descriptors then pos-cli's
// new memory holding the image's bytes); COUNT and LIST (the allocation list's checksum) must match
// this job's, and CUT the cut that holds it: a process restored under the same pid must not take
// the memory an earlier incarnation's dump still held (that dump's undo, or its guardian, reaches
// the same socket). Mapped again at the same addresses, the gate opened. Without dump-release first
// the memory never left: the descriptors are dropped and the gate opens.
std::string dump_take(Runtime* rt, const std::string& args, std::vector<pos::UniqueFd>& in) {
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  if (!rt->saved && !rt->shared) return dump_error("no dump holds this job: nothing to take back");
  unsigned long long count = 0, cut = 0;
  unsigned list = 0;
  int used = 0;
  if (std::sscanf(args.c_str(), "%llu %u %llu%n", &count, &list, &cut, &used) != 3)
    return dump_error("dump-take wants COUNT LIST CUT [lazy PID] (the allocation count, the list's checksum, the dump's cut)");
  // "lazy PID": the memory is still being loaded by pos-cli (pid PID); the last descriptor is the
  // flag it sets once it is (lazy_load.h).
  long loader = 0;
  const std::string tail = args.substr(static_cast<size_t>(used));
  const bool lazy = !tail.empty();
  pos::UniqueFd flag;
  if (lazy) {
    char extra = 0;
    if (std::sscanf(tail.c_str(), " lazy %ld %c", &loader, &extra) != 1 || loader <= 0 || tail.rfind(" lazy ", 0) != 0)
      return dump_error("dump-take's tail must be 'lazy PID' (the loading pos-cli's pid)");
    if (in.size() != count + 1) return dump_error("dump-take ... lazy wants the allocations' descriptors and the flag's");
    flag = std::move(in.back());
    in.pop_back();
  }
  if (cut != rt->last_cut)
    return dump_error("the memory offered is from cut " + std::to_string(cut) + ", and cut " +
                      std::to_string(rt->last_cut) + " holds this job (an earlier incarnation's dump?): not taken");
  const std::vector<Placement::Region> regions = rt->placement ? rt->placement->regions() : std::vector<Placement::Region>{};
  if (count != in.size() || count != regions.size() || list != list_checksum(regions))
    return dump_error("the memory offered (" + std::to_string(in.size()) + " descriptor(s), list " + std::to_string(list) +
                      ") is not this job's (" + std::to_string(regions.size()) + " allocation(s), list " +
                      std::to_string(list_checksum(regions)) + "): not taken");
  const auto t0 = std::chrono::steady_clock::now();
  if (rt->saved) {
    if (rt->app_vmm && !rt->app_vmm->regions().empty())
      return dump_error("the job maps device memory itself: dump-resume DIR brings it back");
    std::unique_ptr<LazyLoad> waits;
    std::unique_ptr<CurrentContext> ctx;
    if (lazy) {  // the flag registered before anything is taken: refused, the memory stays with pos-cli
      ctx = std::make_unique<CurrentContext>(rt->copy, rt->saved_dev);
      auto l = ctx->ok() ? LazyLoad::open(rt->lazy_calls, std::move(flag))
                         : StatusOr<std::unique_ptr<LazyLoad>>(Status::FailedPrecondition("the job's context cannot be made current"));
      if (!l.ok())
        return "{\"ok\":false,\"lazy\":false,\"error\":" + pos::json_string("cannot load lazily: " + l.status().message()) + "}";
      waits = std::move(*l);
    }
    std::vector<int> fds;
    for (const pos::UniqueFd& f : in) fds.push_back(f.get());
    // Right after NVIDIA's restore + unlock the driver has once answered CUDA_ERROR_DEINITIALIZED
    // (a 12 GB job on an H200; a retry by the dump's guardian then succeeded): a take part way can
    // be repeated, so such answers are retried for a while before the dump is told.
    CUresult rc = rt->placement->take(fds);
    for (int i = 0; i < 40 && (rc == kErrorNotInitialized || rc == 4 /* CUDA_ERROR_DEINITIALIZED */); ++i) {
      ::usleep(50000);
      rc = rt->placement->take(fds);
    }
    if (rc != kSuccess)
      return dump_error("mapping the memory handed back failed: CUDA driver error " + std::to_string(rc) +
                        " (the job stays stopped; dump-take again)");
    if (waits) {
      // Every stream the job has waits for the flag before its next work: the legacy default one
      // (which blocking streams order themselves after) and each one the job made; streams made
      // from now until the flag is set get the same wait (after_call). The job's threads are all
      // at the gate, so no stream appears meanwhile.
      std::lock_guard<std::mutex> lz(rt->lazy_mu);
      bool all = waits->hold(kLegacyStream) == kSuccess;
      for (CUstream st : rt->streams.list()) all = waits->hold(st) == kSuccess && all;
      rt->lazy = std::move(waits);
      rt->lazy_finished = false;
      rt->lazy_loader = static_cast<pid_t>(loader);
      rt->lazy_gate_held = !all;  // one could not wait: the job's calls wait at the gate instead
      rt->lazy_pending.store(true, std::memory_order_release);
      std::thread(watch_lazy_load, rt, rt->saved_dev).detach();
    }
  }
  rt->saved = false;
  rt->shared = false;
  bool gate_held = false;
  uint64_t holds = 0;
  if (lazy) {
    std::lock_guard<std::mutex> lz(rt->lazy_mu);
    gate_held = rt->lazy_gate_held;
    holds = rt->lazy ? rt->lazy->holds() : 0;
  }
  rejoin_usage(rt);
  if (!gate_held) rt->gate.reopen();
  char out[160];
  std::snprintf(out, sizeof(out), "{\"ok\":true,\"count\":%llu,\"take_s\":%.6f,\"lazy\":%s,\"waits\":%llu,\"gate_held\":%s}",
                count, seconds_since(t0), lazy ? "true" : "false", static_cast<unsigned long long>(holds),
                gate_held ? "true" : "false");
  return out;
}

// `lazy-done`: pos-cli set the flag (its load complete); the job's watcher lets go of it.
std::string lazy_done(Runtime* rt) {
  std::lock_guard<std::mutex> lz(rt->lazy_mu);
  if (!rt->lazy && rt->lazy_finished) return "{\"ok\":true,\"waits\":0,\"finished\":true}";  // the watcher was quicker
  if (!rt->lazy) return dump_error("no lazy load is in progress");
  if (!rt->lazy->loaded()) return dump_error("the lazy load's flag is not set: the memory is not loaded yet");
  rt->lazy_cv.notify_all();
  return "{\"ok\":true,\"waits\":" + std::to_string(rt->lazy->holds()) + "}";
}

// A cut's allocations with the stream-ordered pool's segments cut down to what live blocks hold
// (StreamPool::live_pieces, in 64 KiB pieces): a block freed before the cut is dead at it, so its
// bytes need no copy. For a job that frees its step's temporaries (PyTorch on cudaMallocAsync),
// that is most of what a cut at its step boundary would otherwise copy. *skipped: the bytes left out.
std::vector<Placement::Region> live_only(std::vector<Placement::Region> regions, const StreamPool* pool,
                                         uint64_t* skipped) {
  *skipped = 0;
  if (pool == nullptr) return regions;
  const auto pieces = pool->live_pieces(64 << 10);
  std::vector<Placement::Region> out;
  out.reserve(regions.size());
  for (const Placement::Region& r : regions) {
    const auto it = pieces.find(r.addr);
    // A segment whose pieces do not lie inside its region (never: the pool's segments are
    // Placement's allocations) is copied whole rather than trusted.
    if (it == pieces.end() || std::any_of(it->second.begin(), it->second.end(), [&](const auto& p) {
          return p.first < r.addr || p.second > r.addr + r.size || p.first >= p.second;
        })) {
      out.push_back(r);
      continue;
    }
    uint64_t kept = 0;
    for (const auto& [lo, hi] : it->second) {
      Placement::Region piece = r;
      piece.addr = lo, piece.size = hi - lo;
      out.push_back(piece);
      kept += piece.size;
    }
    *skipped += r.size - kept;
  }
  return out;
}

// How a cut's wait for the job's step boundary ended (`snap-cut align=MS`).
struct StepAlign {
  double waited_s = 0;
  // sync (a synchronizing call returned), idle, timeout, capture; off (not asked); none (the job
  // has no stream-ordered memory: nothing to leave out at a step's end)
  const char* how = "off";
};

// Waits up to align_ms for the job's next return from a synchronizing call (one in progress counts):
// the job has just found its device idle, and the cut's copies, begun there, run where the job's
// next step has not begun its work yet. A job that makes no driver calls and is in no such call
// for 50 ms is idle: nothing to align with. A capture-begin hook held by the cut ends the wait too.
StepAlign align_to_step(Runtime* rt, int align_ms) {
  StepAlign a;
  if (align_ms <= 0) return a;
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(align_ms);
  rt->align_wanted.store(true, std::memory_order_release);
  {
    std::unique_lock<std::mutex> lk(rt->align_mu);
    const uint64_t start = rt->sync_returns;
    uint64_t calls = rt->census.total_calls();
    a.how = "timeout";
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      if (rt->capture_waiters.load(std::memory_order_acquire) > 0) {
        a.how = "capture";
        break;
      }
      rt->align_cv.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(50)));
      if (rt->sync_returns != start) {
        a.how = "sync";
        break;
      }
      const uint64_t c = rt->census.total_calls();
      if (c == calls && rt->in_sync.load(std::memory_order_acquire) == 0 &&
          std::chrono::steady_clock::now() - now >= std::chrono::milliseconds(50)) {
        a.how = "idle";
        break;
      }
      calls = c;
    }
  }
  rt->align_wanted.store(false, std::memory_order_release);
  a.waited_s = seconds_since(t0);
  return a;
}

// `snap-cut`: a GPU-only checkpoint's cut (snapshot.h). A shadow as large as the placed memory is
// made first, while the job runs; then the job's driver calls wait at the gate only while the
// events, copies and waits are enqueued (the answer's stall_s); the copies then run on the device
// in stream order while the job goes on, and this thread waits for them. The answer names every
// allocation, whether it was written since the previous cut ([addr,size,written]), and comes with
// one descriptor: the shadow, which this job keeps until snap-release (or the next cut or dump).
pos::ControlMessage snap_cut(Runtime* rt, bool run_ahead, int align_ms) {
  pos::ControlMessage out;
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  const auto refuse = [](const std::string& why) {
    pos::ControlMessage m;
    m.text = dump_error(why);
    return m;
  };
  if (rt->saved || rt->shared) return refuse("a dump holds this job: no GPU-only checkpoint until it ends");
  if (std::string no = not_started_answer(rt); !no.empty()) {
    pos::ControlMessage m;
    m.text = std::move(no);
    return m;
  }
  if (std::string why = dump_blockers(rt); !why.empty()) return refuse("this job cannot be checkpointed: " + why);
  if (!rt->placement)
    return refuse("GPU-only checkpoints take memory POS placed, and placement is off (" +
                  (rt->placement_error.empty() ? std::string("POS_DRIVER_PLACE=0") : rt->placement_error) + ")");
  const Census::Memory m = rt->census.memory();
  const Placement::Stats ps = rt->placement->stats();
  uint64_t placed = placed_live(rt);
  uint64_t live = m.live;
  if (live > placed && close_gate(rt).empty()) {
    // Read while the job runs, the two counts may straddle a free (the pool's counted, the
    // census's not yet): read again with the job held.
    placed = placed_live(rt), live = rt->census.memory().live;
    rt->gate.reopen();
  }
  if (live > placed)
    return refuse(std::to_string(live - placed) + " device allocation(s) POS did not place (pitched memory, "
                  "stream-ordered pools, allocations inside graph captures): a GPU-only checkpoint cannot take "
                  "them; use pos-cli dump, or start the job without POS_DRIVER_PLACE_ASYNC=0 so that stream-ordered "
                  "memory from the device's default pool is placed");
  // A job that captures CUDA graphs is cut only between captures (CaptureHold below).
  const bool captures = rt->census.calls(HookId::cuStreamBeginCapture_v2) +
                            rt->census.calls(HookId::cuStreamBeginCapture_v2_ptsz) > 0;
  if (!rt->snap.complete()) return refuse("the driver lacks a call GPU-only checkpoints need");
  const int dev = dump_device(rt);
  CurrentContext cc(rt->copy, dev);
  if (!cc.ok()) return refuse("cannot use the job's device context");
  // No capture may run while this prepares: checked under a short hold, and held back after it.
  double precheck_s = 0;
  CaptureHold capture_hold;
  if (std::string why = capture_hold.acquire(rt, &precheck_s); !why.empty()) return refuse(why);
  // A shadow its last reader let go of with `snap-release keep` is copied into again; any other
  // (a reader may still be writing from it) is let go of here: the reader's import keeps it alive.
  const bool reusable = rt->shadow && rt->shadow_free;
  rt->shadow_free = false;
  if (!reusable) drop_shadow(rt, true);
  bool reused = false;
  CUstream copy_stream = nullptr;
  CUevent done = nullptr;
  if (rt->snap.stream_create(&copy_stream, 1 /* CU_STREAM_NON_BLOCKING */) != kSuccess)
    return refuse("cannot create a stream for the checkpoint's copies");
  if (rt->snap.event_create(&done, 2 /* CU_EVENT_DISABLE_TIMING */) != kSuccess) {
    (void)rt->snap.stream_destroy(copy_stream);
    return refuse("cannot create an event for the checkpoint's copies");
  }
  struct Cleanup {
    Runtime* rt;
    CUstream s;
    CUevent e;
    ~Cleanup() {
      (void)rt->snap.event_destroy(e);
      (void)rt->snap.stream_destroy(s);
    }
  } cleanup{rt, copy_stream, done};
  // The shadow is made while the job runs; allocations it makes meanwhile may outgrow it, and then
  // it is made again, larger.
  // Memory the job maps itself (expandable segments) is copied too; the launch scan does not mark
  // it, so it always counts as written.
  const auto app_regions = [&] { return rt->app_vmm ? rt->app_vmm->regions() : std::vector<AppVmm::Region>{}; };
  uint64_t want = ps.live_bytes;
  for (const AppVmm::Region& r : app_regions()) want += r.size;
  std::vector<Placement::Region> regions;
  uint64_t cut_id = 0, since_id = 0;
  double quiesce_s = 0, stall_s = 0;
  std::chrono::steady_clock::time_point open_at;
  // The copies run ahead of the job where the hooks can see what it touches (snapshot.h,
  // CopyAhead): placed memory with launch scanning on, unless the caller asked for the copies to be
  // ordered before all of the job's later work (`snap-cut order=all`). Its events are made here,
  // outside the hold.
  std::unique_ptr<CopyAhead> ahead;
  if (rt->scanner && run_ahead) {
    auto a = CopyAhead::create(rt->snap);
    if (a.ok()) ahead = std::move(*a);  // else the copies are ordered before everything, as without it
  }
  bool ran_ahead = false;
  StepAlign step_align;
  uint64_t pool_free = 0;  // bytes of the stream-ordered pool's segments no live block held: not copied
  for (int attempt = 0;; ++attempt) {
    reused = rt->shadow && rt->shadow->size() >= want;
    if (!reused) {
      drop_shadow(rt, true);
      auto shadow = DeviceShadow::create(rt->snap.vmm, dev, want);
      if (!shadow.ok())
        return refuse("no room on the device for the checkpoint's copy of " + std::to_string(want) +
                      " bytes: " + shadow.status().message());
      rt->shadow = std::move(*shadow);
    }
    // Everything else is ready: the cut waits for a step's end, where the job's stream-ordered
    // temporaries are free (live_only leaves them out). Without stream-ordered memory there is
    // nothing to gain (measured: docs/BENCHMARKS.md), and the cut does not wait.
    if (attempt == 0 && align_ms > 0) {
      if (rt->pool && rt->pool->stats().segments > 0) step_align = align_to_step(rt, align_ms);
      else step_align.how = "none";
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (std::string why = close_gate(rt); !why.empty()) {
      drop_shadow(rt, true);
      return refuse(why + ": no checkpoint taken");
    }
    quiesce_s = seconds_since(t0);
    uint64_t total = 0;
    for (const Placement::Region& r : rt->placement->regions()) total += r.size;
    const std::vector<AppVmm::Region> app = app_regions();
    bool accessible = true;
    for (const AppVmm::Region& r : app) {
      total += r.size;
      accessible = accessible && r.accessible;
    }
    if (captures && any_capturing(rt->snap, rt->streams.list())) {
      rt->gate.reopen();
      drop_shadow(rt, true);
      return refuse("a CUDA graph capture is in progress (the checkpoint's calls would end it): try again");
    }
    if (!accessible) {  // mapped, its access not set yet: copying it would fault the job's context
      rt->gate.reopen();
      drop_shadow(rt, true);
      return refuse("the job is mapping device memory right now (a mapping without access yet): try again");
    }
    if (total > rt->shadow->size()) {
      rt->gate.reopen();
      drop_shadow(rt, true);
      if (attempt == 2) return refuse("the job's device memory kept growing while its checkpoint was prepared: try again");
      want = total + total / 8;
      continue;
    }
    cut_id = new_cut(rt, &since_id);
    regions = live_only(rt->placement->cut(), rt->pool.get(), &pool_free);
    for (const AppVmm::Region& r : app) regions.push_back(Placement::Region{r.dev, r.addr, r.size, true});
    std::sort(regions.begin(), regions.end(),
              [](const Placement::Region& a, const Placement::Region& b) { return a.addr < b.addr; });
    CUresult rc = kSuccess;
    if (ahead && app.empty()) {  // the hooks do not see memory the job maps itself
      rc = ahead->enqueue(copy_stream, rt->streams.list(), regions, rt->shadow->base(), done);
      if (rc == kSuccess) {
        std::lock_guard<std::mutex> al(rt->ahead_mu);
        rt->ahead = std::move(ahead);
        rt->ahead_errors = 0;
        rt->ahead_on.store(true, std::memory_order_release);
        ran_ahead = true;
      }
    } else {
      rc = enqueue_cut(rt->snap, copy_stream, rt->streams.list(), regions, rt->shadow->base(), done);
    }
    rt->gate.reopen();
    open_at = std::chrono::steady_clock::now();
    stall_s = std::chrono::duration<double>(open_at - t0).count();
    if (rc != kSuccess) {
      rt->placement->mark_all_written();  // the marks were taken: the next checkpoint must take all
      // Copies may be queued that no event covers: the shadow goes only once the device is done.
      (void)rt->copy.ctx_synchronize();
      drop_shadow(rt, true);
      return refuse("ordering the checkpoint's copies failed: CUDA driver error " + std::to_string(rc));
    }
    break;
  }
  const CUresult copied = rt->snap.event_synchronize(done);
  // The copies are done (or failed): the job's calls stop waiting for them.
  uint64_t ahead_waits = 0, ahead_errors = 0;
  if (ran_ahead) {
    std::lock_guard<std::mutex> al(rt->ahead_mu);
    rt->ahead_on.store(false, std::memory_order_release);
    ahead_waits = rt->ahead->waits();
    ahead_errors = rt->ahead_errors;
    rt->ahead.reset();
  }
  if (copied != kSuccess) {
    rt->placement->mark_all_written();
    drop_shadow(rt, true);
    return refuse("the checkpoint's copies failed: CUDA driver error " + std::to_string(copied));
  }
  if (ahead_errors > 0) {  // some of the job's work may have run before the copy of what it wrote
    rt->placement->mark_all_written();
    drop_shadow(rt, true);
    return refuse("the driver refused " + std::to_string(ahead_errors) +
                  " wait(s) of the job's work for the checkpoint's copies: no checkpoint taken");
  }
  const double copy_s = seconds_since(open_at);
  int fd = -1;
  if (const CUresult rc = rt->shadow->export_fd(&fd); rc != kSuccess) {
    rt->placement->mark_all_written();
    drop_shadow(rt, true);
    return refuse("exporting the checkpoint's copy failed: CUDA driver error " + std::to_string(rc));
  }
  out.fds.emplace_back(fd);
  const RegionList list = region_list(regions);
  const uint64_t bytes = list.bytes, written = list.written, written_bytes = list.written_bytes;
  char head[768];
  std::snprintf(head, sizeof(head),
                "{\"ok\":true,\"device\":%d,\"since\":%llu,\"cut\":%llu,\"bytes\":%llu,\"count\":%zu,\"written\":%llu,"
                "\"written_bytes\":%llu,\"shadow_bytes\":%llu,\"streams\":%zu,\"precheck_s\":%.6f,\"quiesce_s\":%.6f,"
                "\"stall_s\":%.6f,\"copy_s\":%.6f,\"ahead\":%s,\"ahead_waits\":%llu,\"shadow_reused\":%s,"
                "\"align\":\"%s\",\"align_s\":%.6f,\"pool_free_bytes\":%llu,\"regions\":[",
                dev, static_cast<unsigned long long>(since_id), static_cast<unsigned long long>(cut_id),
                static_cast<unsigned long long>(bytes), regions.size(), static_cast<unsigned long long>(written),
                static_cast<unsigned long long>(written_bytes), static_cast<unsigned long long>(rt->shadow->size()),
                rt->streams.list().size() + 1, precheck_s, quiesce_s, stall_s, copy_s, ran_ahead ? "true" : "false",
                static_cast<unsigned long long>(ahead_waits), reused ? "true" : "false", step_align.how,
                step_align.waited_s, static_cast<unsigned long long>(pool_free));
  out.text = head + list.json + "]}";
  return out;
}

// `snap-release [keep]`: the shadow of the last snap-cut let go (pos-cli holds its own reference),
// or, with `keep` (sent once the caller has written its copy), kept for the next cut to copy into.
std::string snap_release(Runtime* rt, bool keep) {
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  if (!rt->shadow) return dump_error("no GPU-only checkpoint holds a copy: nothing to release");
  if (keep) {
    rt->shadow_free = true;
    return "{\"ok\":true,\"kept\":" + std::to_string(rt->shadow->size()) + "}";
  }
  double held_s = 0;
  CaptureHold capture_hold;
  if (std::string why = capture_hold.acquire(rt, &held_s); !why.empty())  // let go at the next cut or dump
    return "{\"ok\":true,\"deferred\":" + pos::json_string(why) + "}";
  drop_shadow(rt);
  return "{\"ok\":true}";
}

// `dump-save DIR`: the job's driver work stopped at the gate, the device idle, every placed
// allocation saved to DIR (device_image.h) and unmapped, its addresses kept reserved. The gate stays
// closed until dump-resume: pos-cli then runs the driver's checkpoint and CRIU.
std::string dump_save(Runtime* rt, const std::string& dir) {
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  if (rt->saved || rt->shared) return dump_error("a dump holds this job already: dump-resume first");
  if (std::string no = not_started_answer(rt); !no.empty()) return no;
  if (std::string why = dump_blockers(rt); !why.empty()) return dump_error("this job cannot be dumped: " + why);
  if (std::string why = check_dir(dir); !why.empty()) return dump_error(why);
  drop_shadow(rt);
  const int dev = dump_device(rt);
  const auto t0 = std::chrono::steady_clock::now();
  if (std::string why = hold(rt, dev); !why.empty()) return dump_error(why);
  const auto fail = [&](const std::string& why) {
    rt->gate.reopen();
    return dump_error(why);
  };
  const double quiesce_s = seconds_since(t0);
  uint64_t since = 0;
  const uint64_t cut = new_cut(rt, &since);  // a whole image: the marks only start again
  if (rt->placement) (void)rt->placement->cut();
  const std::vector<SavedRegion> regions = dump_regions(rt);
  auto saved = save_regions(rt->copy, dev, regions, dir, CopyOptions{});
  if (!saved.ok()) return fail("saving device memory failed: " + saved.status().message());
  const auto t1 = std::chrono::steady_clock::now();
  const std::string note = dump_notes(rt);
  if (const CUresult rc = unmap_all(rt); rc != kSuccess) {
    (void)remap_all(rt);
    // The bytes are still on the device where the unmap failed; elsewhere they must come back.
    auto back = load_regions(rt->copy, dev, regions, dir, CopyOptions{});
    remove_saved(dir);
    if (!back.ok()) return dump_error("unmapping failed (" + std::to_string(rc) + ") and reloading failed: " +
                                      back.status().message() + "; the job stays stopped");
    return fail("unmapping device memory failed: CUDA driver error " + std::to_string(rc) + "; not dumped");
  }
  rt->saved = true;
  rt->saved_dir = dir;
  rt->saved_dev = dev;
  char out[320];
  std::snprintf(out, sizeof(out),
                "{\"ok\":true,\"bytes\":%llu,\"regions\":%llu,\"device\":%d,\"since\":%llu,\"cut\":%llu,\"quiesce_s\":%.6f,"
                "\"save_s\":%.6f,\"unmap_s\":%.6f,\"note\":",
                static_cast<unsigned long long>(saved->bytes), static_cast<unsigned long long>(saved->regions), dev,
                static_cast<unsigned long long>(since), static_cast<unsigned long long>(cut), quiesce_s, saved->seconds,
                seconds_since(t1));
  return out + pos::json_string(note) + "}";
}

// `dump-resume [DIR]`: physical memory mapped again at every allocation's address, the bytes
// loaded from DIR (default: where dump-save put them), the gate opened. After a restore the
// driver's own state is back first (pos-cli: cuCheckpointProcessRestore + Unlock).
std::string dump_resume(Runtime* rt, std::string dir) {
  std::lock_guard<std::mutex> lk(rt->dump_mu);
  if (rt->shared && !rt->saved) {  // handed out but never released: the memory is still here
    rt->shared = false;
    rt->gate.reopen();
    return "{\"ok\":true,\"bytes\":0,\"regions\":0,\"remap_s\":0,\"load_s\":0}";
  }
  if (!rt->saved) return dump_error("no dump holds this job: nothing to resume");
  if (dir.empty() && rt->saved_dir.empty())
    return dump_error("the memory was handed off (dump-share): dump-take brings it back, or dump-resume DIR from an image");
  if (dir.empty()) dir = rt->saved_dir;
  if (std::string why = check_dir(dir); !why.empty()) return dump_error(why);
  const auto t0 = std::chrono::steady_clock::now();
  if (const CUresult rc = remap_all(rt); rc != kSuccess)
    return dump_error("mapping device memory again failed: CUDA driver error " + std::to_string(rc) +
                      " (the job stays stopped; dump-resume again)");
  const double remap_s = seconds_since(t0);
  auto loaded = load_regions(rt->copy, rt->saved_dev, dump_regions(rt), dir, CopyOptions{});
  if (!loaded.ok())
    return dump_error("loading device memory failed: " + loaded.status().message() + " (the job stays stopped)");
  rt->saved = false;
  rt->shared = false;
  rejoin_usage(rt);
  rt->gate.reopen();
  char out[192];
  std::snprintf(out, sizeof(out), "{\"ok\":true,\"bytes\":%llu,\"regions\":%llu,\"remap_s\":%.6f,\"load_s\":%.6f}",
                static_cast<unsigned long long>(loaded->bytes), static_cast<unsigned long long>(loaded->regions), remap_s,
                loaded->seconds);
  return out;
}

// `gpus`: the GPUs this job's driver enumerates (its CUDA_VISIBLE_DEVICES applies), by UUID in its
// ordinal order, and the ones it uses (the devices it took a context on or holds memory of): a
// dump records them, and a restore onto another GPU checks with them that the driver's restore
// put the job's devices where pos-cli put its memory. Asked fresh each time (a restore may have
// moved the job), and never by pos-cli while the driver holds the job locked (the queries would
// wait for it); `ps` asks the driver nothing for that reason.
std::string gpus_answer(Runtime* rt) {
  auto gpus = list_gpus(rt->ids);
  if (!gpus.ok()) return dump_error(gpus.status().message());
  std::vector<int> used = rt->census.devices();
  const auto add = [&](int d) {
    if (std::find(used.begin(), used.end(), d) == used.end()) used.push_back(d);
  };
  if (rt->placement)
    for (const Placement::Region& r : rt->placement->regions()) add(r.dev);
  if (rt->app_vmm)
    for (const AppVmm::Region& r : rt->app_vmm->regions()) add(r.dev);
  std::sort(used.begin(), used.end());
  std::vector<std::string> seen, uuids;
  for (const GpuInfo& g : *gpus) seen.push_back(g.uuid);
  std::string name;
  for (int d : used) {
    if (d < 0 || static_cast<size_t>(d) >= gpus->size())
      return dump_error("the job uses device " + std::to_string(d) + ", which its driver does not list");
    uuids.push_back(seen[static_cast<size_t>(d)]);
    if (name.empty()) name = (*gpus)[static_cast<size_t>(d)].name;
  }
  // A flat object (pos-cli reads it with the manifest's strict reader).
  return "{\"ok\":true,\"gpus_visible\":" + pos::json_string(join_gpu_uuids(seen)) +
         ",\"gpu_uuids\":" + pos::json_string(join_gpu_uuids(uuids)) + ",\"gpu_name\":" +
         pos::json_string(pos::printable(name, 128)) + "}";
}

// `limit [memory=BYTES | share=PERMILLE]`: the job's limits and what it holds, after setting the
// memory limit or the GPU-time share when asked (0: none). A limit above every device's memory is refused (when the driver can say it); one
// below what the job holds is taken: its next allocations fail until it frees enough.
std::string limit_answer(Runtime* rt, const std::string& args) {
  if (args.rfind("share=", 0) == 0) {
    // `share=PERMILLE` (0: none): taken only if the shares of the job's GPU stay within it.
    auto pm = pos::parse_uint(args.substr(6));
    if (!pm.ok() || *pm > pos::UsageRegion::kMaxShare)
      return dump_error("share=" + pos::printable(args.substr(6), 32) + ": a share is 0 to 1000 per mille");
    if (!rt->usage) return dump_error("this job has no usage region (" + rt->usage_error + "): no share can be set");
    {
      std::lock_guard<std::mutex> lk(rt->usage_mu);
      if (rt->usage_slot >= 0 && rt->usage->holds(rt->usage_slot, static_cast<uint32_t>(::getpid()), rt->usage_start) &&
          !rt->census.devices().empty()) {
        const pos::Status st = rt->usage->set_share(rt->usage_slot, static_cast<uint32_t>(*pm));
        if (!st.ok()) return dump_error(st.message() + ": not set");
        rt->share_set = static_cast<uint32_t>(*pm);
        rt->share_error.clear();
      }
      rt->share_wanted = static_cast<uint32_t>(*pm);
    }
    publish_usage(rt);
    return "{\"ok\":true,\"limits\":" + limits_json(rt) + "}";
  }
  if (!args.empty()) {
    if (args.rfind("memory=", 0) != 0)
      return dump_error("limit wants memory=BYTES or share=PERMILLE, not '" + pos::printable(args, 64) + "'");
    auto bytes = pos::parse_uint(args.substr(7));
    if (!bytes.ok()) return dump_error("memory=" + pos::printable(args.substr(7), 32) + ": " + bytes.status().message());
    int n = 0;
    uint64_t largest = 0;
    if (*bytes != 0 && rt->ids.device_get_count != nullptr && rt->ids.device_get != nullptr && rt->total_mem != nullptr &&
        rt->ids.device_get_count(&n) == kSuccess) {
      for (int i = 0; i < n; ++i) {
        CUdevice d = 0;
        size_t total = 0;
        if (rt->ids.device_get(&d, i) == kSuccess && rt->total_mem(&total, d) == kSuccess) largest = std::max<uint64_t>(largest, total);
      }
      if (largest != 0 && *bytes > largest)
        return dump_error("a memory limit of " + std::to_string(*bytes) + " bytes is more than the job's GPUs have (" +
                          std::to_string(largest) + " bytes): not set");
    }
    rt->memory.set(*bytes);
    rt->memory_error.clear();
    publish_usage(rt);
  }
  return "{\"ok\":true,\"limits\":" + limits_json(rt) + "}";
}

// pos-cli's questions (remoting/common/job_control.h): "ps" (one JSON object), "ps-row" (one
// line of pos-cli ps's table of in-process jobs), "gpus", "dump-save DIR" and "dump-resume [DIR]".
pos::ControlMessage answer_fds(Runtime* rt, pos::ControlMessage& msg);
std::string answer(Runtime* rt, const std::string& cmd) {
  if (cmd.rfind("dump-save ", 0) == 0) return dump_save(rt, cmd.substr(10));
  if (cmd == "dump-release") return dump_release(rt);
  if (cmd == "snap-release") return snap_release(rt, false);
  if (cmd == "snap-release keep") return snap_release(rt, true);
  if (cmd == "lazy-done") return lazy_done(rt);
  if (cmd == "gpus") return gpus_answer(rt);
  if (cmd == "limit" || cmd.rfind("limit ", 0) == 0) return limit_answer(rt, cmd.size() > 6 ? cmd.substr(6) : std::string());
  if (cmd == "dump-resume") return dump_resume(rt, "");
  if (cmd.rfind("dump-resume @", 0) == 0) {  // "dump-resume @CUT [DIR]": only the dump of that cut
    unsigned long long cut = 0;
    int used = 0;
    if (std::sscanf(cmd.c_str() + 13, "%llu%n", &cut, &used) != 1 || (cmd[13 + used] != '\0' && cmd[13 + used] != ' '))
      return dump_error("dump-resume @CUT wants the cut as a number");
    if (std::lock_guard<std::mutex> lk(rt->dump_mu); cut != rt->last_cut)
      return dump_error("cut " + std::to_string(cut) + " does not hold this job (cut " + std::to_string(rt->last_cut) +
                        " does; an earlier incarnation's dump?): nothing resumed");
    const std::string rest = cmd.substr(13 + static_cast<size_t>(used));
    return dump_resume(rt, rest.empty() ? rest : rest.substr(1));
  }
  if (cmd.rfind("dump-resume ", 0) == 0) return dump_resume(rt, cmd.substr(12));
  const Census::Memory m = rt->census.memory();
  if (cmd == "ps")
    return "{\"pid\":" + std::to_string(::getpid()) + ",\"uid\":" + std::to_string(::geteuid()) +
           ",\"job\":" + pos::json_string(rt->job) + ",\"runtime\":\"driver\",\"census\":" + census_json(rt) + "}";
  if (cmd == "ps-row") {
    std::string devices, blocked;
    for (int d : rt->census.devices()) devices += (devices.empty() ? "" : ",") + std::to_string(d);
    for (const std::string& w : rt->census.not_checkpointable()) blocked += (blocked.empty() ? "" : "; ") + w;
    if (!lazy_state(rt).empty()) blocked += (blocked.empty() ? "" : "; ") + std::string("loading its memory (restore --lazy)");
    char row[352], limit[24] = "-", share[16] = "-", sms[16] = "-";
    // The SMs the job's kernels run on (asked in parentheses while not in force: no context yet,
    // or refused, which `pos-cli limit` says).
    if (const unsigned asked = rt->sms.asked(); asked != 0) {
      const unsigned granted = rt->sms.granted(dump_device(rt));
      if (granted != 0) std::snprintf(sms, sizeof(sms), "%u", granted);
      else std::snprintf(sms, sizeof(sms), "(%u)", asked);
    }
    if (rt->memory.limit() != 0) std::snprintf(limit, sizeof(limit), "%llu", static_cast<unsigned long long>(rt->memory.limit()));
    {
      std::lock_guard<std::mutex> lk(rt->usage_mu);
      if (rt->share_set != 0) std::snprintf(share, sizeof(share), "%u.%u%%", rt->share_set / 10, rt->share_set % 10);
      else if (rt->share_wanted != 0) std::snprintf(share, sizeof(share), "(%u.%u%%)", rt->share_wanted / 10, rt->share_wanted % 10);
    }
    std::snprintf(row, sizeof(row), "%-8d %-8u %s %-8s %14llu %14s %9s %5s %8llu %12llu  ", static_cast<int>(::getpid()),
                  static_cast<unsigned>(::geteuid()), pos::fit_columns(rt->job, 24).c_str(),
                  devices.empty() ? "-" : devices.c_str(), static_cast<unsigned long long>(m.live_bytes), limit, share, sms,
                  static_cast<unsigned long long>(m.live), static_cast<unsigned long long>(rt->census.launches()));
    return row + (blocked.empty() ? std::string("-") : blocked);
  }
  return "{\"error\":" + pos::json_string("unknown command '" + pos::printable(cmd, 64) +
                                         "' (ps, ps-row, gpus, dump-save DIR, dump-share, dump-release, dump-take COUNT LIST CUT [lazy PID], "
                                         "dump-resume [@CUT] [DIR], lazy-done, snap-cut [order=all] [align=MS], snap-release [keep], limit [memory=BYTES|share=PERMILLE])") + "}";
}

// The commands with descriptors (dump-share answers with them, dump-take comes with them); every
// other command answered by answer(), descriptors sent along with it dropped.
pos::ControlMessage answer_fds(Runtime* rt, pos::ControlMessage& msg) {
  if (msg.text == "dump-share") return dump_share(rt);
  if (msg.text == "snap-cut" || msg.text.rfind("snap-cut ", 0) == 0) {
    // snap-cut [order=all] [align=MS]: the copies ordered before all of the job's later work; the
    // cut waits up to MS ms (0..60000) for the job's step boundary.
    bool ahead = true;
    int align_ms = 0;
    std::string bad;
    bool refused = false;
    size_t at = 8;
    while (!refused && at < msg.text.size()) {
      const size_t end = std::min(msg.text.find(' ', at + 1), msg.text.size());
      const std::string word = msg.text.substr(at + 1, end - at - 1);
      at = end;
      if (word == "order=all") {
        ahead = false;
        continue;
      }
      auto ms = word.rfind("align=", 0) == 0 ? pos::parse_uint(word.substr(6)) : StatusOr<uint64_t>(Status::InvalidArgument(""));
      if (ms.ok() && *ms <= 60000) align_ms = static_cast<int>(*ms);
      else bad = word, refused = true;
    }
    if (refused) {
      pos::ControlMessage m;
      m.text = dump_error("snap-cut takes order=all and align=MS (0 to 60000), not '" + pos::printable(bad, 40) + "'");
      return m;
    }
    return snap_cut(rt, ahead, align_ms);
  }
  pos::ControlMessage out;
  if (msg.text.rfind("dump-take ", 0) == 0) out.text = dump_take(rt, msg.text.substr(10), msg.fds);
  else out.text = answer(rt, msg.text);
  return out;
}

std::array<void*, kHookCount> hook_addresses();

// *fn = the real driver's `name` (null if it lacks it).
template <typename Fn>
void lookup(void* driver, Fn* fn, const char* name) {
  *fn = reinterpret_cast<Fn>(real_dlsym()(driver, name));
}

// The real driver's virtual memory calls (placement.h), looked up once.
VmmCalls vmm_calls(void* driver) {
  VmmCalls c;
  const auto get = [driver](auto* fn, const char* name) { lookup(driver, fn, name); };
  get(&c.ctx_get_device, "cuCtxGetDevice");
  get(&c.reserve, "cuMemAddressReserve");
  get(&c.address_free, "cuMemAddressFree");
  get(&c.create, "cuMemCreate");
  get(&c.release, "cuMemRelease");
  get(&c.map, "cuMemMap");
  get(&c.unmap, "cuMemUnmap");
  get(&c.set_access, "cuMemSetAccess");
  get(&c.granularity, "cuMemGetAllocationGranularity");
  get(&c.synchronize, "cuCtxSynchronize");
  get(&c.export_fd, "cuMemExportToShareableHandle");
  get(&c.import_fd, "cuMemImportFromShareableHandle");
  return c;
}

// POS_DRIVER_PLACE=1: device allocations (cuMemAlloc) at POS's addresses, from POS_DRIVER_VA_BASE
// (hex; default 0x200000000000), 1 TiB of address space per device. Off by default while it is new.
// A value it cannot use leaves placement off and says why in *error (the job runs on).
std::unique_ptr<Placement> make_placement(void* driver, std::string* error) {
  const char* on = std::getenv("POS_DRIVER_PLACE");
  if (on == nullptr || *on == '\0' || std::strcmp(on, "0") == 0) return nullptr;
  if (std::strcmp(on, "1") != 0) {
    *error = "POS_DRIVER_PLACE must be 0 or 1, not '" + pos::printable(on, 32) + "': placement is off";
    return nullptr;
  }
  uint64_t base = 0x200000000000ull;
  if (const char* b = std::getenv("POS_DRIVER_VA_BASE"); b != nullptr && *b != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(b, &end, 16);
    constexpr uint64_t kUserTop = 1ull << 47;  // the x86-64 user address space
    if (errno != 0 || end == b || *end != '\0' || v == 0 || v % (1ull << 30) != 0 || v >= kUserTop) {
      *error = "POS_DRIVER_VA_BASE must be a hex address, a multiple of 1 GiB below 0x800000000000, not '" +
               pos::printable(b, 32) + "': placement is off";
      return nullptr;
    }
    base = v;
  }
  return std::make_unique<Placement>(vmm_calls(driver), base, 1ull << 40);
}

// With placement on, stream-ordered allocations come from placed segments too (POS_DRIVER_PLACE_ASYNC=0:
// the driver's pools serve them; dumps then take them through NVIDIA's checkpoint, and GPU-only
// checkpoints refuse the job). On by default since its cost measured within the noise of the H200
// (docs/BENCHMARKS.md); the 40 % a cudaMallocAsync job paid before was a /proc read per allocation.
std::unique_ptr<StreamPool> make_stream_pool(void* driver, Placement* placement) {
  if (placement == nullptr) return nullptr;
  if (const char* on = std::getenv("POS_DRIVER_PLACE_ASYNC"); on != nullptr && std::strcmp(on, "0") == 0) return nullptr;
  StreamPoolCalls c;
  const auto get = [driver](auto* fn, const char* name) { lookup(driver, fn, name); };
  get(&c.ctx_get_device, "cuCtxGetDevice");
  get(&c.event_create, "cuEventCreate");
  get(&c.event_record, "cuEventRecord");
  get(&c.event_query, "cuEventQuery");
  get(&c.event_destroy, "cuEventDestroy_v2");
  get(&c.synchronize, "cuCtxSynchronize");
  if (!c.complete()) return nullptr;
  SegmentSource src;
  src.alloc = [placement](CUdeviceptr* out, size_t bytes, bool* placed) { return placement->alloc(out, bytes, placed); };
  src.free = [placement](CUdeviceptr p) {
    bool ours = false;
    return placement->free(p, &ours);
  };
  return std::make_unique<StreamPool>(c, std::move(src));
}

// POS's own calls that act in the job's context (a dump's synchronize, a cut's stream order, a lazy
// load's waits) must use the context the job got: under an SM limit, the green context's, whose
// default stream and work are not the primary context's. Set before the runtime is published.
SmLimit* g_sms = nullptr;
CUresult (*g_real_primary_retain)(CUcontext* ctx, CUdevice dev) = nullptr;
CUresult job_primary_ctx_retain(CUcontext* ctx, CUdevice dev) {
  const CUresult rc = g_real_primary_retain(ctx, dev);
  if (rc == kSuccess && g_sms != nullptr)
    if (CUcontext g = g_sms->context(dev, *ctx); g != nullptr) *ctx = g;
  return rc;
}

// The real driver's copy calls (device_image.h), looked up once.
CopyCalls copy_calls(void* driver) {
  CopyCalls c;
  const auto get = [driver](auto* fn, const char* name) { lookup(driver, fn, name); };
  get(&c.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  get(&c.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  get(&c.ctx_set_current, "cuCtxSetCurrent");
  get(&c.ctx_synchronize, "cuCtxSynchronize");
  get(&c.stream_create, "cuStreamCreate");
  get(&c.stream_destroy, "cuStreamDestroy_v2");
  get(&c.stream_synchronize, "cuStreamSynchronize");
  get(&c.host_alloc, "cuMemHostAlloc");
  get(&c.free_host, "cuMemFreeHost");
  get(&c.dtoh_async, "cuMemcpyDtoHAsync_v2");
  get(&c.htod_async, "cuMemcpyHtoDAsync_v2");
  if (g_sms != nullptr && g_sms->asked() != 0 && c.primary_ctx_retain != nullptr) {
    g_real_primary_retain = c.primary_ctx_retain;
    c.primary_ctx_retain = &job_primary_ctx_retain;
  }
  return c;
}

// The real driver's calls for GPU-only checkpoints (snapshot.h), looked up once.
SnapCalls snap_calls(void* driver) {
  SnapCalls c;
  c.vmm = vmm_calls(driver);
  c.copy = copy_calls(driver);
  const auto get = [driver](auto* fn, const char* name) { lookup(driver, fn, name); };
  get(&c.stream_create, "cuStreamCreate");
  get(&c.stream_destroy, "cuStreamDestroy_v2");
  get(&c.event_create, "cuEventCreate");
  get(&c.event_destroy, "cuEventDestroy_v2");
  get(&c.event_record, "cuEventRecord");
  get(&c.event_synchronize, "cuEventSynchronize");
  get(&c.stream_wait_event, "cuStreamWaitEvent");
  get(&c.dtod_async, "cuMemcpyDtoDAsync_v2");
  get(&c.is_capturing, "cuStreamIsCapturing");
  return c;
}

// The real driver's calls that read a CUDA graph's nodes (graph_touches.h).
GraphCalls graph_calls(void* driver) {
  GraphCalls c;
  const auto get = [driver](auto* fn, const char* name) { lookup(driver, fn, name); };
  get(&c.get_nodes, "cuGraphGetNodes");
  get(&c.node_type, "cuGraphNodeGetType");
  get(&c.kernel_params, "cuGraphKernelNodeGetParams_v2");
  get(&c.memcpy_params, "cuGraphMemcpyNodeGetParams");
  get(&c.memset_params, "cuGraphMemsetNodeGetParams");
  get(&c.child_graph, "cuGraphChildGraphNodeGetGraph");
  return c;
}

std::atomic<Runtime*> g_runtime{nullptr};
std::once_flag g_once;
thread_local bool t_starting = false;

// The process's runtime, made on first use: the real driver loaded (POS_REAL_LIBCUDA, else
// libcuda.so.1) and each hook's real function looked up in it. nullptr while it is being made on
// this thread (the driver's own constructors may call dlsym): callers then pass through.
Runtime* runtime() {
  Runtime* r = g_runtime.load(std::memory_order_acquire);
  if (r != nullptr || t_starting) return r;
  std::call_once(g_once, [] {
    t_starting = true;
    auto* rt = new Runtime;  // never freed: hooks may run on other threads during exit
    const char* path = std::getenv("POS_REAL_LIBCUDA");
    rt->driver_path = (path != nullptr && *path != '\0') ? path : "libcuda.so.1";
    rt->driver = dlopen(rt->driver_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::array<void*, kHookCount> real{};
    if (rt->driver == nullptr) {
      const char* e = dlerror();
      rt->error = e != nullptr ? e : "dlopen failed";
    } else {
      for (size_t i = 0; i < kHookCount; ++i) real[i] = real_dlsym()(rt->driver, hook_info(static_cast<HookId>(i)).name);
    }
    rt->resolver.set_real(real, hook_addresses());
    rt->job = job_name();
    // The job's memory limit from `pos run --memory` (a size: "8GiB"); one that does not parse is
    // no limit, said in ps and on stderr, and the job runs.
    if (const char* lim = std::getenv("POS_MEMORY_LIMIT"); lim != nullptr && *lim != '\0') {
      auto bytes = pos::parse_size(lim);
      if (bytes.ok()) rt->memory.set(*bytes);
      else rt->memory_error = "POS_MEMORY_LIMIT='" + pos::printable(lim, 64) + "': " + bytes.status().message() + ": no limit set";
      if (!bytes.ok()) std::fprintf(stderr, "pos: %s\n", rt->memory_error.c_str());
    }
    // The job's GPU-time share from `pos run --gpu-share` ("30%"); one that does not parse is none.
    if (const char* sh = std::getenv("POS_GPU_SHARE"); sh != nullptr && *sh != '\0') {
      auto pm = pos::parse_share(sh);
      if (pm.ok()) rt->share_wanted = *pm;
      else rt->share_error = "POS_GPU_SHARE='" + pos::printable(sh, 64) + "': " + pm.status().message() + ": no share set";
      if (!pm.ok()) std::fprintf(stderr, "pos: %s\n", rt->share_error.c_str());
    }
    rt->share.set_verify([rt] { verify_usage(rt); });
    if (rt->driver != nullptr) {
      // The job's SM limit from `pos run --sms` (a number of SMs); one that cannot be had is none.
      GreenCalls green;
      lookup(rt->driver, &green.device_resource, "cuDeviceGetDevResource");
      lookup(rt->driver, &green.split_by_count, "cuDevSmResourceSplitByCount");
      lookup(rt->driver, &green.generate_desc, "cuDevResourceGenerateDesc");
      lookup(rt->driver, &green.green_create, "cuGreenCtxCreate");
      lookup(rt->driver, &green.ctx_from_green, "cuCtxFromGreenCtx");
      lookup(rt->driver, &rt->smc.get_current, "cuCtxGetCurrent");
      lookup(rt->driver, &rt->smc.set_current, "cuCtxSetCurrent");
      lookup(rt->driver, &rt->smc.get_device, "cuCtxGetDevice");
      lookup(rt->driver, &rt->smc.retain, "cuDevicePrimaryCtxRetain");
      lookup(rt->driver, &rt->smc.release, "cuDevicePrimaryCtxRelease_v2");
      const bool smc = rt->smc.get_current && rt->smc.set_current && rt->smc.get_device && rt->smc.retain &&
                       rt->smc.release;
      rt->sms.configure(smc ? std::getenv("POS_SM_LIMIT") : nullptr, green);
      if (const std::string e = rt->sms.error(); !e.empty()) std::fprintf(stderr, "pos: %s\n", e.c_str());
      g_sms = &rt->sms;
      rt->placement = make_placement(rt->driver, &rt->placement_error);
      rt->pool = make_stream_pool(rt->driver, rt->placement.get());
      lookup(rt->driver, &rt->device_mem_pool, "cuDeviceGetMemPool");
      lookup(rt->driver, &rt->default_mem_pool, "cuDeviceGetDefaultMemPool");
      rt->copy = copy_calls(rt->driver);
      rt->snap = snap_calls(rt->driver);
      lookup(rt->driver, &rt->lazy_calls.host_register, "cuMemHostRegister_v2");
      lookup(rt->driver, &rt->lazy_calls.host_device_pointer, "cuMemHostGetDevicePointer_v2");
      lookup(rt->driver, &rt->lazy_calls.host_unregister, "cuMemHostUnregister");
      lookup(rt->driver, &rt->lazy_calls.wait_value32, "cuStreamWaitValue32_v2");
      rt->ids = gpu_id_calls([rt](const char* name) { return real_dlsym()(rt->driver, name); });
      rt->total_mem = reinterpret_cast<decltype(rt->total_mem)>(real_dlsym()(rt->driver, "cuDeviceTotalMem_v2"));
      ParamInfoCalls pi;
      pi.func_param_info = reinterpret_cast<decltype(pi.func_param_info)>(real_dlsym()(rt->driver, "cuFuncGetParamInfo"));
      pi.kernel_param_info =
          reinterpret_cast<decltype(pi.kernel_param_info)>(real_dlsym()(rt->driver, "cuKernelGetParamInfo"));
      rt->scanner = std::make_unique<LaunchScanner>(pi);
      // POS_GRAPH_WRITES=0: graphs are not read, and each launch counts as writing everything.
      if (const char* gw = std::getenv("POS_GRAPH_WRITES"); gw == nullptr || std::strcmp(gw, "0") != 0)
        rt->graph_reads = graph_calls(rt->driver);
      else
        rt->graph_reads_off = true;
      if (const VmmCalls v = vmm_calls(rt->driver); v.complete()) rt->app_vmm = std::make_unique<AppVmm>(v);
    }
    // A job on a driver gets a control socket for pos-cli (POS_CONTROL=0: none). Failing to make
    // one never fails the job: the census says why. Its answers read the runtime only through
    // thread-safe parts (census, placement) and fields set before it starts.
    const char* ctl = std::getenv("POS_CONTROL");
    if (rt->driver != nullptr && (ctl == nullptr || std::strcmp(ctl, "0") != 0)) {
      auto server = pos::JobControlServer::start_with_fds(pos::default_jobs_dir(),
                                                          [rt](pos::ControlMessage& m) { return answer_fds(rt, m); });
      if (server.ok()) rt->control = std::move(*server);
      else rt->control_error = server.status().message();
    }
    // The shared accounting of this user's jobs (POS_USAGE=0: none). A region that cannot be used
    // is said in ps; the job runs as it would without it.
    if (const char* u = std::getenv("POS_USAGE"); rt->driver != nullptr && (u == nullptr || std::strcmp(u, "0") != 0)) {
      // POS_USAGE_REGION: the region posd keeps for several users' jobs; else this user's own.
      const pos::UsageRegionChoice use = pos::choose_usage_region(pos::default_jobs_dir(), pos::kept_usage_region());
      auto region = pos::UsageRegion::open(use.path, use.access);
      if (region.ok()) rt->usage = std::move(*region);
      else rt->usage_error = region.status().message();
      publish_usage(rt);
    }
    g_runtime.store(rt, std::memory_order_release);  // complete before any other thread sees it
    t_starting = false;
  });
  return g_runtime.load(std::memory_order_acquire);
}

// ", a, b" for (a, b) and nothing for (): a hook's arguments after the runtime's own (some have none).
#define POS_TAIL_(...) __VA_OPT__(, ) __VA_ARGS__
#define POS_TAIL(args) POS_TAIL_ args

// A stream argument that names this thread's per-thread default stream: a null one of a _ptsz
// entry point, or CU_STREAM_PER_THREAD itself.
inline bool per_thread_stream(bool ptsz, CUstream s) {
  return (ptsz && s == nullptr) || s == reinterpret_cast<CUstream>(StreamPool::kStreamPerThread);
}
// Whether `s` is capturing a CUDA graph (an unanswerable query counts as capturing): its
// allocations become the graph's memory nodes, which the driver keeps.
inline bool capturing(Runtime* rt, bool ptsz, CUstream s) {
  if (rt->snap.is_capturing == nullptr) return true;
  int status = 0;
  const CUstream q = ptsz && s == nullptr ? reinterpret_cast<CUstream>(StreamPool::kStreamPerThread) : s;
  return rt->snap.is_capturing(q, &status) != kSuccess || status != 0;
}
// Whether the stream pool serves this allocation: the device's default pool (for cuMemAllocAsync,
// the device's current pool is that one), and no capture on the stream.
inline bool pool_serves(Runtime* rt, bool from_pool, CUmemoryPool asked, bool ptsz, CUstream s, CUdevice* out_dev) {
  if (rt->default_mem_pool == nullptr || rt->snap.vmm.ctx_get_device == nullptr) return false;
  CUdevice& dev = *out_dev;
  CUmemoryPool def = nullptr;
  if (rt->snap.vmm.ctx_get_device(&dev) != kSuccess) return false;
  const bool cached = dev >= 0 && dev < static_cast<int>(rt->default_pools.size());
  if (cached) def = rt->default_pools[dev].load(std::memory_order_relaxed);
  if (def == nullptr) {
    if (rt->default_mem_pool(&def, dev) != kSuccess) return false;
    if (cached) rt->default_pools[dev].store(def, std::memory_order_relaxed);
  }
  if (!from_pool) {
    if (rt->device_mem_pool == nullptr || rt->device_mem_pool(&asked, dev) != kSuccess) return false;
  }
  return asked == def && !capturing(rt, ptsz, s);
}

// Before the driver: a hook that answers the call itself (device memory placed by POS) says so.
template <HookId kId, typename... A>
inline bool answer_here(Runtime* rt, CUresult* rc, A... a) {
  if constexpr (kId == HookId::cuMemAlloc_v2) {
    if (!rt->placement) return false;
    auto t = std::make_tuple(a...);
    bool placed = false;
    *rc = rt->placement->alloc(std::get<0>(t), std::get<1>(t), &placed);
    return placed;
  } else if constexpr (kId == HookId::cuMemFree_v2) {
    if (!rt->placement) return false;
    bool ours = false;
    const CUdeviceptr p = std::get<0>(std::make_tuple(a...));
    if (rt->pool) {  // stream-ordered memory freed synchronously: a block of a segment, not the segment
      *rc = rt->pool->free_now(p, &ours);
      if (ours) return true;
    }
    *rc = rt->placement->free(p, &ours);
    return ours;
  } else if constexpr (kId == HookId::cuMemAllocAsync || kId == HookId::cuMemAllocAsync_ptsz ||
                       kId == HookId::cuMemAllocFromPoolAsync || kId == HookId::cuMemAllocFromPoolAsync_ptsz) {
    if (!rt->pool) return false;
    auto t = std::make_tuple(a...);
    constexpr bool from_pool = kId == HookId::cuMemAllocFromPoolAsync || kId == HookId::cuMemAllocFromPoolAsync_ptsz;
    constexpr bool ptsz = kId == HookId::cuMemAllocAsync_ptsz || kId == HookId::cuMemAllocFromPoolAsync_ptsz;
    const CUstream s = std::get<std::tuple_size_v<decltype(t)> - 1>(t);
    CUmemoryPool asked = nullptr;
    if constexpr (from_pool) asked = std::get<2>(t);
    CUdevice dev = 0;
    if (!pool_serves(rt, from_pool, asked, ptsz, s, &dev)) return false;
    bool placed = false;
    *rc = rt->pool->alloc(std::get<0>(t), std::get<1>(t), s, per_thread_stream(ptsz, s), &placed, dev);
    return placed;
  } else if constexpr (kId == HookId::cuMemFreeAsync || kId == HookId::cuMemFreeAsync_ptsz) {
    if (!rt->pool) return false;
    auto t = std::make_tuple(a...);
    constexpr bool ptsz = kId == HookId::cuMemFreeAsync_ptsz;
    const CUdeviceptr p = std::get<0>(t);
    const CUstream s = std::get<1>(t);
    bool ours = false;
    if (!rt->pool->owns(p)) return false;
    if (capturing(rt, ptsz, s)) *rc = rt->pool->free_deferred(p, &ours);
    else *rc = rt->pool->free_async(p, s, per_thread_stream(ptsz, s), &ours);
    return ours;
  } else if constexpr (kId == HookId::cuDevicePrimaryCtxRetain) {
    // Under an SM limit the job's "primary context" is the green context's (sm_limit.h). The real
    // one is retained too, so that the job's releases balance as they would.
    if (rt->sms.asked() == 0) return false;
    auto t = std::make_tuple(a...);
    using Fn = CUresult (*)(CUcontext*, CUdevice);
    *rc = reinterpret_cast<Fn>(rt->resolver.real(kId))(std::get<0>(t), std::get<1>(t));
    if (*rc == kSuccess && std::get<0>(t) != nullptr)
      if (CUcontext g = rt->sms.context(std::get<1>(t), *std::get<0>(t)); g != nullptr) *std::get<0>(t) = g;
    return true;
  } else if constexpr (kId == HookId::cuCtxSetCurrent || kId == HookId::cuCtxPushCurrent_v2) {
    // The CUDA runtime makes the primary context current by its own handle: under an SM limit the
    // green context's is made current in its place.
    if (rt->sms.asked() == 0) return false;
    using Fn = CUresult (*)(CUcontext);
    *rc = reinterpret_cast<Fn>(rt->resolver.real(kId))(rt->sms.instead_of(std::get<0>(std::make_tuple(a...))));
    return true;
  } else if constexpr (kId == HookId::cuDeviceGetAttribute) {
    // The multiprocessor count of a GPU under an SM limit is the limit's (what occupancy and
    // cooperative-launch sizing must use); every other attribute is the driver's.
    auto t = std::make_tuple(a...);
    if (rt->sms.asked() == 0 || std::get<1>(t) != kAttributeMultiprocessorCount) return false;
    using Fn = CUresult (*)(int*, int, CUdevice);
    *rc = reinterpret_cast<Fn>(rt->resolver.real(kId))(std::get<0>(t), std::get<1>(t), std::get<2>(t));
    if (*rc == kSuccess && std::get<0>(t) != nullptr)
      if (const unsigned n = rt->sms.planned(std::get<2>(t)); n != 0) *std::get<0>(t) = static_cast<int>(n);
    return true;
  } else if constexpr (kId == HookId::cuMemPoolTrimTo) {
    // The pool's wholly free segments go back too; the driver trims its own pool as well.
    if (rt->pool) (void)rt->pool->trim(std::get<1>(std::make_tuple(a...)));
    return false;
  } else if constexpr (kId == HookId::cuMemCreate || kId == HookId::cuMemRelease || kId == HookId::cuMemMap ||
                       kId == HookId::cuMemUnmap || kId == HookId::cuMemSetAccess) {
    // The job's own VMM memory: recorded, and its handles translated after a resume (app_vmm.h).
    if (!rt->app_vmm) return false;
    if constexpr (kId == HookId::cuMemCreate) *rc = rt->app_vmm->create(a...);
    else if constexpr (kId == HookId::cuMemRelease) *rc = rt->app_vmm->release(a...);
    else if constexpr (kId == HookId::cuMemMap) *rc = rt->app_vmm->map(a...);
    else if constexpr (kId == HookId::cuMemUnmap) *rc = rt->app_vmm->unmap(a...);
    else *rc = rt->app_vmm->set_access(a...);
    return true;
  } else {
    return false;
  }
}

// Under an SM limit, the job's work must run in the green context (sm_limit.h). The CUDA runtime
// makes its primary context current on each thread by its own means, not only through the hooked
// cuCtxSetCurrent, so every hooked call that acts in the current context first looks: a real
// primary context current where a green context stands in for it is replaced by the green one; a
// context seen for the first time is asked whether it is its device's primary context (the
// green context is made then). Under a limit that costs a cuCtxGetCurrent and compares; without
// one, the hooks only read `asked`.
template <HookId kId>
constexpr bool adopts_context() {
  using H = HookId;
  return kId != H::cuGetProcAddress && kId != H::cuGetProcAddress_v2 && kId != H::cuDevicePrimaryCtxRetain &&
         kId != H::cuCtxSetCurrent && kId != H::cuCtxPushCurrent_v2 && kId != H::cuDeviceGetAttribute;
}
inline void adopt_green(Runtime* rt) {
  thread_local CUcontext t_plain = nullptr;  // the last context found to be no primary one with a limit
  CUcontext cur = nullptr;
  if (rt->smc.get_current(&cur) != kSuccess || cur == nullptr || cur == t_plain) return;
  CUcontext g = rt->sms.instead_of(cur);
  if (g == cur) {
    if (rt->sms.is_green(cur)) return;
    CUdevice dev = 0;
    CUcontext p = nullptr;
    if (rt->smc.get_device(&dev) != kSuccess || rt->smc.retain(&p, dev) != kSuccess) return;
    if (p != cur) {
      (void)rt->smc.release(dev);
      t_plain = cur;
      return;
    }
    g = rt->sms.context(dev, p);  // keeps the retain: the green context is the job's for good
    if (g == nullptr) {
      t_plain = cur;
      return;
    }
  }
  (void)rt->smc.set_current(g);
}

// The job's memory limit (docs/limits.md): an allocation is charged before the driver is asked and
// refused as the driver refuses memory it lacks when it would pass the limit; what fails or is
// freed is given back. Only the outermost hook charges (a driver calling its own exports re-enters).
template <HookId kId>
constexpr bool allocates() {
  using H = HookId;
  return kId == H::cuMemAlloc_v2 || kId == H::cuMemAllocManaged || kId == H::cuMemAllocAsync ||
         kId == H::cuMemAllocAsync_ptsz || kId == H::cuMemAllocFromPoolAsync || kId == H::cuMemAllocFromPoolAsync_ptsz ||
         kId == H::cuMemCreate;
}
template <HookId kId>
constexpr bool frees() {
  using H = HookId;
  return kId == H::cuMemFree_v2 || kId == H::cuMemFreeAsync || kId == H::cuMemFreeAsync_ptsz;
}
template <HookId kId, typename... A>
inline bool admit(Runtime* rt, uint64_t* bytes, A... a) {
  if constexpr (allocates<kId>() || frees<kId>() || kId == HookId::cuMemRelease) {
    if (t_hook_depth != 1) return true;
    auto t = std::make_tuple(a...);
    if constexpr (allocates<kId>()) {
      *bytes = static_cast<uint64_t>(std::get<1>(t));
      return rt->memory.charge(*bytes);
    } else if constexpr (frees<kId>()) {
      *bytes = rt->census.allocation_at(std::get<0>(t));
    } else {
      *bytes = rt->memory.size_of(std::get<0>(t));
    }
  }
  return true;
}
template <HookId kId, typename... A>
inline void settle(Runtime* rt, CUresult rc, uint64_t bytes, A... a) {
  if constexpr (allocates<kId>() || frees<kId>() || kId == HookId::cuMemRelease || kId == HookId::cuMemGetInfo_v2) {
    if (t_hook_depth != 1) return;
    auto t = std::make_tuple(a...);
    if constexpr (allocates<kId>()) {
      if (rc != kSuccess) rt->memory.uncharge(bytes);
      else if constexpr (kId == HookId::cuMemCreate) rt->memory.created(*std::get<0>(t), bytes);
      if (rc == kSuccess) publish_usage(rt);
    } else if constexpr (frees<kId>()) {
      if (rc == kSuccess) rt->memory.uncharge(bytes);
      if (rc == kSuccess && bytes != 0) publish_usage(rt);
    } else if constexpr (kId == HookId::cuMemRelease) {
      if (rc == kSuccess && rt->memory.released(std::get<0>(t)) != 0) rt->memory.uncharge(bytes), publish_usage(rt);
    } else {
      if (rc == kSuccess) rt->memory.narrow(std::get<0>(t), std::get<1>(t));
    }
  }
}

// The GPU-time scheduler (share_gate.h): a launch waits for the job's turn when its GPU is
// contended; a call that waits on the job's own work marks it busy (a holder inside one is not
// idle). Only the outermost hook: a driver calling its own exports does not wait twice.
template <HookId kId>
inline int share_enter(Runtime* rt) {
  using H = HookId;
  if (t_hook_depth != 1) return 0;
  if constexpr (kId == H::cuLaunchKernel || kId == H::cuLaunchKernel_ptsz || kId == H::cuLaunchKernelEx ||
                kId == H::cuLaunchKernelEx_ptsz || kId == H::cuLaunchCooperativeKernel ||
                kId == H::cuLaunchCooperativeKernel_ptsz || kId == H::cuGraphLaunch || kId == H::cuGraphLaunch_ptsz) {
    return rt->share.enter([rt] {
      if (rt->copy.ctx_synchronize != nullptr) (void)rt->copy.ctx_synchronize();
    });
  } else if constexpr (kId == H::cuStreamSynchronize || kId == H::cuStreamSynchronize_ptsz ||
                       kId == H::cuEventSynchronize || kId == H::cuCtxSynchronize || kId == H::cuCtxSynchronize_v2 || kId == H::cuMemcpyDtoH_v2 || kId == H::cuMemcpyDtoH_v2_ptds ||
                       kId == H::cuMemcpy || kId == H::cuMemcpy_ptds || kId == H::cuMemcpyDtoD_v2 ||
                       kId == H::cuMemcpyDtoD_v2_ptds || kId == H::cuMemcpyHtoD_v2 || kId == H::cuMemcpyHtoD_v2_ptds) {
    return rt->share.busy_begin();
  } else {
    return 0;
  }
}

// Before work on stream `s` that may touch placed memory while a cut's copies run ahead: `s` waits
// for the copies of what it touches (`addrs`; all of them when `all`). A refused wait leaves the
// cut to order everything (snap_cut sees ahead_errors).
void ahead_wait(Runtime* rt, CUstream s, const uint64_t* addrs, size_t n, bool all) {
  std::lock_guard<std::mutex> lk(rt->ahead_mu);
  if (!rt->ahead) return;
  const CUresult rc = all ? rt->ahead->before_all(s) : rt->ahead->before_touch(s, addrs, n);
  if (rc != kSuccess) ++rt->ahead_errors;
}
void ahead_wait_range(Runtime* rt, CUstream s, uint64_t addr, uint64_t len) {
  std::lock_guard<std::mutex> lk(rt->ahead_mu);
  if (rt->ahead && rt->ahead->before_range(s, addr, len) != kSuccess) ++rt->ahead_errors;
}
bool ahead_running(Runtime* rt) { return rt->ahead_on.load(std::memory_order_acquire); }

// A launch's parameters scanned for placed memory, which is marked written; a launch whose
// parameters cannot be read marks all of it (launch_params.h). While a cut's copies run ahead, the
// launch's stream `s` first waits for the copies of what it may touch.
void mark_launch(Runtime* rt, CUfunction f, void** params, void** extra, CUstream s) {
  Placement* p = rt->placement.get();
  const bool ahead = ahead_running(rt);
  uint64_t hits[32];
  size_t n = 0;
  uint64_t found = 0;
  const bool read = rt->scanner->scan(f, params, extra, [&](uint64_t w) {
    if (!p->in_window(w)) return;
    if (n == 32) {
      if (ahead) ahead_wait(rt, s, hits, n, false);
      p->mark_written(hits, n);
      n = 0;
    }
    hits[n++] = w;
    ++found;
  });
  if (!read) {
    if (ahead) ahead_wait(rt, s, nullptr, 0, true);
    p->mark_all_written();
    return;
  }
  if (n > 0) {
    if (ahead) ahead_wait(rt, s, hits, n, false);
    p->mark_written(hits, n);
  }
  if (found > 0) rt->marked.fetch_add(found, std::memory_order_relaxed);
}

// A graph launch: what the graph was read to write at its instantiation (graph_touches.h) is marked,
// and while a cut's copies run ahead its stream waits for their copies alone; a graph not known
// (not read, or changed since) marks everything and waits for every copy, as a graph launch did
// before graphs were read.
void mark_graph_launch(Runtime* rt, CUgraphExec e, CUstream s) {
  Placement* p = rt->placement.get();
  const std::shared_ptr<const GraphTouches> g = rt->graphs.find(e);
  rt->graphs.count_launch(g != nullptr);
  const bool ahead = ahead_running(rt);
  if (g == nullptr) {
    if (ahead) ahead_wait(rt, s, nullptr, 0, true);
    p->mark_all_written();
    return;
  }
  if (ahead) {
    if (!g->words.empty()) ahead_wait(rt, s, g->words.data(), g->words.size(), false);
    for (const auto& [at, len] : g->ranges) ahead_wait_range(rt, s, at, len);
  }
  if (!g->words.empty()) p->mark_written(g->words.data(), g->words.size());
  for (const auto& [at, len] : g->ranges) p->mark_range_written(at, len);
  rt->marked.fetch_add(g->words.size(), std::memory_order_relaxed);
}

// An executable graph made: what it may write, read from the graph it was made of.
void learn_graph(Runtime* rt, CUgraphExec e, CUgraph g) {
  if (!rt->placement || !rt->scanner) return;
  if (rt->graph_reads_off) {
    rt->graphs.count_unread("POS_GRAPH_WRITES=0");  // nothing is learnt, so the book never knows `e`
    return;
  }
  std::string why;
  Placement* p = rt->placement.get();
  std::shared_ptr<const GraphTouches> t =
      read_graph(rt->graph_reads, *rt->scanner, g, [p](uint64_t w) { return p->in_window(w); }, &why);
  if (t == nullptr) rt->graphs.count_unread(why);
  rt->graphs.learn(e, std::move(t));
}

// The calls after which an executable graph may write other memory than it was read to, or is gone.
constexpr bool changes_graph(HookId id) {
  using H = HookId;
  return id == H::cuGraphExecDestroy || id == H::cuGraphExecUpdate || id == H::cuGraphExecUpdate_v2 ||
         id == H::cuGraphExecKernelNodeSetParams || id == H::cuGraphExecKernelNodeSetParams_v2 ||
         id == H::cuGraphExecMemcpyNodeSetParams || id == H::cuGraphExecMemsetNodeSetParams ||
         id == H::cuGraphExecChildGraphNodeSetParams || id == H::cuGraphExecBatchMemOpNodeSetParams ||
         id == H::cuGraphExecNodeSetParams;
}

// The stream a hooked call runs on, as a stream handle that means the same from any thread.
template <HookId kId>
inline CUstream call_stream(CUstream s) {
  return s == nullptr && per_thread_hook(kId) ? kPerThreadStream : s;
}

// The stream of a cuLaunchKernelEx (its config's; kLaunchConfigStreamOffset).
inline CUstream config_stream(const CUlaunchConfig* config) {
  if (config == nullptr) return nullptr;
  CUstream s = nullptr;
  std::memcpy(&s, reinterpret_cast<const char*>(config) + kLaunchConfigStreamOffset, sizeof(s));
  return s;
}

// A copy or memset into placed memory: marked written, and, while a cut's copies run ahead, its
// stream waits for the copies of that range first.
inline void mark_range(Runtime* rt, CUstream s, uint64_t dst, uint64_t len) {
  if (!rt->placement->in_window(dst)) return;
  if (ahead_running(rt)) ahead_wait_range(rt, s, dst, len);
  rt->placement->mark_range_written(dst, len);
}

// The calls with which the job waits for its device: where its steps end, typically.
constexpr bool synchronizes(HookId id) {
  using H = HookId;
  return id == H::cuStreamSynchronize || id == H::cuStreamSynchronize_ptsz || id == H::cuEventSynchronize ||
         id == H::cuCtxSynchronize || id == H::cuCtxSynchronize_v2 || id == H::cuMemcpyDtoH_v2 ||
         id == H::cuMemcpyDtoH_v2_ptds;
}

// Inside the gate, before the driver runs a hooked call: what it may write, marked (placement on).
template <HookId kId, typename... A>
inline void before_call(Runtime* rt, A... a) {
  using H = HookId;
  if constexpr (synchronizes(kId)) rt->in_sync.fetch_add(1, std::memory_order_acq_rel);
  if (!rt->placement || !rt->scanner) return;
  [[maybe_unused]] auto t = std::make_tuple(a...);
  if constexpr (kId == H::cuLaunchKernel || kId == H::cuLaunchKernel_ptsz) {
    mark_launch(rt, std::get<0>(t), std::get<9>(t), std::get<10>(t), call_stream<kId>(std::get<8>(t)));
  } else if constexpr (kId == H::cuLaunchCooperativeKernel || kId == H::cuLaunchCooperativeKernel_ptsz) {
    mark_launch(rt, std::get<0>(t), std::get<9>(t), nullptr, call_stream<kId>(std::get<8>(t)));
  } else if constexpr (kId == H::cuLaunchKernelEx || kId == H::cuLaunchKernelEx_ptsz) {
    mark_launch(rt, std::get<1>(t), std::get<2>(t), std::get<3>(t), call_stream<kId>(config_stream(std::get<0>(t))));
  } else if constexpr (kId == H::cuMemcpyAsync || kId == H::cuMemcpyAsync_ptsz || kId == H::cuMemcpyHtoDAsync_v2 ||
                       kId == H::cuMemcpyHtoDAsync_v2_ptsz || kId == H::cuMemcpyDtoDAsync_v2 ||
                       kId == H::cuMemcpyDtoDAsync_v2_ptsz || kId == H::cuMemsetD8Async ||
                       kId == H::cuMemsetD8Async_ptsz) {
    mark_range(rt, call_stream<kId>(std::get<3>(t)), std::get<0>(t), std::get<2>(t));
  } else if constexpr (kId == H::cuMemcpy || kId == H::cuMemcpy_ptds || kId == H::cuMemcpyHtoD_v2 ||
                       kId == H::cuMemcpyHtoD_v2_ptds || kId == H::cuMemcpyDtoD_v2 || kId == H::cuMemcpyDtoD_v2_ptds ||
                       kId == H::cuMemsetD8_v2 || kId == H::cuMemsetD8_v2_ptds) {
    mark_range(rt, call_stream<kId>(nullptr), std::get<0>(t), std::get<2>(t));  // on the default stream
  } else if constexpr (kId == H::cuMemsetD32Async || kId == H::cuMemsetD32Async_ptsz) {
    mark_range(rt, call_stream<kId>(std::get<3>(t)), std::get<0>(t), uint64_t{4} * std::get<2>(t));
  } else if constexpr (kId == H::cuMemsetD32_v2 || kId == H::cuMemsetD32_v2_ptds) {
    mark_range(rt, call_stream<kId>(nullptr), std::get<0>(t), uint64_t{4} * std::get<2>(t));
  } else if constexpr (kId == H::cuGraphLaunch || kId == H::cuGraphLaunch_ptsz) {
    mark_graph_launch(rt, std::get<0>(t), call_stream<kId>(std::get<1>(t)));
  } else if constexpr (changes_graph(kId)) {
    rt->graphs.forget(std::get<0>(t));  // destroyed, or what it writes may have changed: not known now
  } else if constexpr (synchronizes(kId)) {
    rt->placement->new_epoch();  // the job waits for its device: a step's end, typically (Placement::new_epoch)
  } else if constexpr (kId == H::cuStreamDestroy_v2) {
    rt->streams.remove(std::get<0>(t));
    if (rt->pool) rt->pool->stream_ending(std::get<0>(t));  // its pending frees get their events now
  } else if constexpr (kId == H::cuModuleUnload || kId == H::cuLibraryUnload) {
    rt->scanner->forget();  // their function handles may be handed out again for other kernels
  }
}

// After the driver answered: the streams the job made, for the cuts to order themselves after.
template <HookId kId, typename... A>
inline void after_call(Runtime* rt, CUresult rc, A... a) {
  if constexpr (synchronizes(kId)) {
    rt->in_sync.fetch_sub(1, std::memory_order_acq_rel);
    if (rt->align_wanted.load(std::memory_order_acquire)) {  // a cut waits for this: the step's end
      {
        std::lock_guard<std::mutex> al(rt->align_mu);
        ++rt->sync_returns;
      }
      rt->align_cv.notify_all();
    }
  }
  if constexpr (kId == HookId::cuGraphInstantiateWithFlags || kId == HookId::cuGraphInstantiateWithParams ||
                kId == HookId::cuGraphInstantiateWithParams_ptsz) {
    auto t = std::make_tuple(a...);
    if (rc == kSuccess && std::get<0>(t) != nullptr) learn_graph(rt, *std::get<0>(t), std::get<1>(t));
  }
  if constexpr (kId == HookId::cuStreamCreate || kId == HookId::cuStreamCreateWithPriority) {
    auto t = std::make_tuple(a...);
    if (rc == kSuccess && std::get<0>(t) != nullptr) {
      rt->streams.add(*std::get<0>(t));
      // A lazy restore still loading: the new stream waits for the load too, or, if it cannot,
      // this thread waits until the load is done before the job may use the stream.
      if (rt->lazy_pending.load(std::memory_order_acquire)) {
        std::unique_lock<std::mutex> lz(rt->lazy_mu);
        if (rt->lazy_pending.load(std::memory_order_relaxed) && rt->lazy && rt->lazy->hold(*std::get<0>(t)) != kSuccess)
          rt->lazy_cv.wait(lz, [rt] { return !rt->lazy_pending.load(std::memory_order_relaxed); });
      }
    }
  }
}

// After the driver answered a hooked call: what the hook learns from it.
template <Role kRole, int kSizeIdx, typename... A>
inline void learn(Census& c, CUresult rc, A... a) {
  if (rc != kSuccess) return;
  if constexpr (kRole == Role::kDeviceAlloc) {
    auto t = std::make_tuple(a...);
    if (std::get<0>(t) != nullptr) c.device_alloc(*std::get<0>(t), static_cast<uint64_t>(std::get<kSizeIdx>(t)));
  } else if constexpr (kRole == Role::kDeviceFree) {
    c.device_free(std::get<0>(std::make_tuple(a...)));
  } else if constexpr (kRole == Role::kDeviceUse) {
    c.device_used(std::get<1>(std::make_tuple(a...)));
  }
}

}  // namespace
}  // namespace pos::driver

using namespace pos::driver;  // NOLINT: the exports below are extern "C" and spell the driver's names

// The generic hooks: count, forward to the real export, learn from the answer. A hook called before
// a driver could be loaded fails like a driver that is not there.
#define POS_DEFINE_HOOK(name, base, per_thread, min_version, role, R, params, args, size_idx) \
  POS_DRIVER_EXPORT R name params {                                                          \
    Runtime* rt = runtime();                                                                 \
    using Fn = R(*) params;                                                                  \
    auto real = rt != nullptr ? reinterpret_cast<Fn>(rt->resolver.real(HookId::name)) : nullptr; \
    if (real == nullptr) return kErrorNotInitialized;                                        \
    rt->census.count(HookId::name);                                                          \
    GatePass pass(rt->gate, begins_capture(HookId::name) ? rt : nullptr);                    \
    if constexpr (adopts_context<HookId::name>())                                            \
      if (rt->sms.asked() != 0) adopt_green(rt);                                             \
    uint64_t pos_charged = 0;                                                                \
    if (!admit<HookId::name>(rt, &pos_charged POS_TAIL(args))) return kErrorOutOfMemory;   \
    before_call<HookId::name>(rt POS_TAIL(args));                                            \
    const int pos_turn = share_enter<HookId::name>(rt);                                      \
    R rc{};                                                                                  \
    if (!answer_here<HookId::name>(rt, &rc POS_TAIL(args))) rc = real args;                \
    rt->share.done(pos_turn);                                                                \
    settle<HookId::name>(rt, rc, pos_charged POS_TAIL(args));                                \
    learn<Role::role, size_idx>(rt->census, rc POS_TAIL(args));                              \
    after_call<HookId::name>(rt, rc POS_TAIL(args));                                         \
    return rc;                                                                               \
  }
#define POS_DEFINE_HOOK_kCount POS_DEFINE_HOOK
#define POS_DEFINE_HOOK_kDeviceAlloc POS_DEFINE_HOOK
#define POS_DEFINE_HOOK_kDeviceFree POS_DEFINE_HOOK
#define POS_DEFINE_HOOK_kLaunch POS_DEFINE_HOOK
#define POS_DEFINE_HOOK_kDeviceUse POS_DEFINE_HOOK
#define POS_DEFINE_HOOK_kProcAddress(...)  // written out below
#define POS_DEFINE_BY_ROLE(name, base, per_thread, min_version, role, ...) \
  POS_DEFINE_HOOK_##role(name, base, per_thread, min_version, role, __VA_ARGS__)
POS_DRIVER_HOOKS(POS_DEFINE_BY_ROLE)

namespace {
// cuGetProcAddress, both versions: the driver's answer, with a hook put in place of what it stands for.
CUresult substitute_answer(Runtime* rt, CUresult rc, const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (rc != kSuccess || pfn == nullptr || symbol == nullptr) return rc;
  const Resolver::Answer a = rt->resolver.substitute(symbol, version, flags, *pfn);
  *pfn = a.fn;
  rt->census.resolved(symbol, "proc", a);
  return rc;
}
}  // namespace

POS_DRIVER_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  Runtime* rt = runtime();
  using Fn = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto real = rt != nullptr ? reinterpret_cast<Fn>(rt->resolver.real(HookId::cuGetProcAddress)) : nullptr;
  if (real == nullptr) return kErrorNotInitialized;
  rt->census.count(HookId::cuGetProcAddress);
  return substitute_answer(rt, real(symbol, pfn, version, flags), symbol, pfn, version, flags);
}

POS_DRIVER_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                               CUdriverProcAddressQueryResult* status) {
  Runtime* rt = runtime();
  using Fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto real = rt != nullptr ? reinterpret_cast<Fn>(rt->resolver.real(HookId::cuGetProcAddress_v2)) : nullptr;
  if (real == nullptr) return kErrorNotInitialized;
  rt->census.count(HookId::cuGetProcAddress_v2);
  return substitute_answer(rt, real(symbol, pfn, version, flags, status), symbol, pfn, version, flags);
}

namespace pos::driver {
namespace {
std::array<void*, kHookCount> hook_addresses() {
  return {
#define POS_HOOK_ADDRESS(name, ...) reinterpret_cast<void*>(&::name),
      POS_DRIVER_HOOKS(POS_HOOK_ADDRESS)
#undef POS_HOOK_ADDRESS
  };
}
}  // namespace
}  // namespace pos::driver

namespace {
// dlsym of a driver symbol: the hook when one stands for what glibc found, else glibc's answer.
// Out of line, so that dlsym itself stays two tail calls.
__attribute__((noinline)) void* cu_dlsym(void* handle, const char* name) noexcept {
  Runtime* rt = runtime();
  if (rt == nullptr || rt->driver == nullptr) return real_dlsym()(handle, name);
  void* p = real_dlsym()(handle, name);
  const Resolver::Answer a = rt->resolver.for_dlsym(name, p);
  if (p != nullptr) rt->census.resolved(name, "dlsym", a);
  return a.fn;
}
}  // namespace

// Every dlsym of the process. Anything that is no driver symbol is glibc's answer through a tail
// call, so that glibc sees our caller's return address, which RTLD_NEXT is relative to (tested by
// driver_hooks_test; it needs the optimizer's sibling calls, on in every build type but plain).
// glibc declares `name` nonnull, but a caller's NULL must reach glibc's dlsym, not crash here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnonnull-compare"
POS_DRIVER_EXPORT void* dlsym(void* handle, const char* name) noexcept {
  // Driver API names are "cu" and a capital (cuInit, cuMemAlloc_v2); cuda*, cublas*, curl_* are not,
  // and must not load the driver into a process that never asked for it.
  if (name != nullptr && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z')
    return cu_dlsym(handle, name);
  return real_dlsym()(handle, name);
}
#pragma GCC diagnostic pop

namespace {
// POS_DRIVER_CENSUS=FILE (or "-" for stderr): the census as one JSON line when the process exits.
__attribute__((destructor)) void write_census() {
  const char* where = std::getenv("POS_DRIVER_CENSUS");
  Runtime* rt = g_runtime.load(std::memory_order_acquire);
  if (rt != nullptr && rt->control) rt->control->remove_socket();  // the job is ending: pos-cli stops seeing it
  if (where == nullptr || *where == '\0') return;
  std::string text = rt != nullptr ? census_json(rt) : std::string("{\"driver\":null}");
  text += "\n";
  if (std::strcmp(where, "-") == 0) {
    (void)!::write(2, text.data(), text.size());
    return;
  }
  if (FILE* f = std::fopen(where, "w")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}
}  // namespace
