// sm_limit_probe.cu — measures which SM-limiting mechanisms the driver offers on device 0 (green contexts, MPS
// execution affinity) by the SMs a spinning kernel really lands on and how long it takes; the facts for issue #24.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

// One kernel, spin(), records %smid per block and spins on %globaltimer. Each block asks for the most dynamic shared
// memory a block may have, so one block fits an SM at a time: with B blocks on S SMs the launch takes
// ceil(B / S) "waves" of the spin time, and the time says how many SMs really ran it. Rows:
//   baseline           the primary context, every SM;
//   green context N    cuDevSmResourceSplitByCount → cuDevResourceGenerateDesc → cuGreenCtxCreate, launched on a
//                      cuGreenCtxStreamCreate stream with the green-derived context current;
//   MPS exec affinity  cuCtxCreate with CU_EXEC_AFFINITY_TYPE_SM_COUNT (CUDA 13: CUctxCreateParams); only an MPS
//                      client has it, so without the daemon the row says so.
// The kernel is compiled into this file; the CUDA runtime is used for one call only (cudaGetKernel), which gives the
// context-independent CUkernel that cuLaunchKernel runs in the context of the stream it is given. Everything else is
// the driver API. A mechanism that fails is reported as "unsupported: <error name>" and the program still exits 0;
// no usable device or driver exits 1.

// Thread 0 of each block records the SM it runs on (0xFFFFFFFF stays where a block never ran); every thread spins
// for ns nanoseconds of wall time from the moment its block started.
__global__ void spin(unsigned* smids, unsigned long long ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) {
    unsigned smid = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    smids[blockIdx.x] = smid;
  }
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

namespace {

std::string err_name(CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) == CUDA_SUCCESS && name != nullptr) return name;
  // The driver stub names nothing: the errors cuInit can give on a machine without a usable driver.
  switch (r) {
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY (the toolkit's stub libcuda, no real driver)";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    default: return "CUresult " + std::to_string(static_cast<int>(r));
  }
}

// The driver call that failed last inside a measurement (TRY records it for the table's result column).
const char* g_failed = "";

// TRY(fn, args...): inside a function returning CUresult, calls fn; on failure says so on stderr and returns the error.
#define TRY(fn, ...)                                                                                        \
  do {                                                                                                      \
    const CUresult rc_ = fn(__VA_ARGS__);                                                                   \
    if (rc_ != CUDA_SUCCESS) {                                                                              \
      g_failed = #fn;                                                                                       \
      std::fprintf(stderr, "sm_limit_probe: %s failed: %s (line %d)\n", #fn, err_name(rc_).c_str(), __LINE__); \
      return rc_;                                                                                           \
    }                                                                                                       \
  } while (0)

// CK(fn, args...): a call the whole probe needs; on failure says so and exits 1.
#define CK(fn, ...)                                                                                         \
  do {                                                                                                      \
    const CUresult rc_ = fn(__VA_ARGS__);                                                                   \
    if (rc_ != CUDA_SUCCESS) {                                                                              \
      std::fprintf(stderr, "sm_limit_probe: %s failed: %s (line %d)\n", #fn, err_name(rc_).c_str(), __LINE__); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

// For release calls on the way out: a failure is reported but changes nothing else.
void released(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) std::fprintf(stderr, "sm_limit_probe: %s failed: %s\n", what, err_name(r).c_str());
}

struct Config {
  unsigned spin_us = 200;        // per block
  unsigned blocks_per_sm = 4;    // grid = blocks_per_sm × SM count
  unsigned threads = 128;
  int reps = 3;                  // timed launches after one warm-up; the fastest counts
  std::vector<unsigned> counts;  // requested SM counts; default 16, 32, half the SMs
};

// How spin() is launched everywhere.
struct Launch {
  CUkernel kernel = nullptr;
  unsigned blocks = 0, threads = 0, shmem = 0;
  unsigned long long ns = 0;
  int reps = 0;
  int blocks_per_sm_resident = 0;  // occupancy with shmem (1 when the shared-memory request took); 0: unknown
};

struct Observed {
  unsigned distinct = 0, lo = 0, hi = 0;  // SM ids seen over all runs
  unsigned missing = 0;                    // block records left unwritten, summed over all runs
  float ms = 0;
};

struct Row {
  std::string mechanism, requested;
  unsigned granted = 0;  // 0: not known
  Observed seen;
  std::string result;    // "ok", a finding, or "unsupported: ..."
  bool measured = false;
};

// Device buffer and events of one measurement, released on every way out.
struct MeasureRes {
  CUdeviceptr d = 0;
  CUevent e0 = nullptr, e1 = nullptr;
  ~MeasureRes() {
    if (e1 != nullptr) released(cuEventDestroy(e1), "cuEventDestroy");
    if (e0 != nullptr) released(cuEventDestroy(e0), "cuEventDestroy");
    if (d != 0) released(cuMemFree(d), "cuMemFree");
  }
};

// Runs spin() on stream s (whose context must be current) once to warm up and reps times timed; keeps the fastest
// timed run and the SMs seen over all runs.
CUresult measure(const Launch& l, CUstream s, Observed* out) {
  MeasureRes r;
  const size_t bytes = sizeof(unsigned) * l.blocks;
  TRY(cuMemAlloc, &r.d, bytes);
  TRY(cuEventCreate, &r.e0, CU_EVENT_DEFAULT);
  TRY(cuEventCreate, &r.e1, CU_EVENT_DEFAULT);
  CUdeviceptr smids = r.d;
  unsigned long long ns = l.ns;
  void* args[] = {&smids, &ns};
  float best = -1;
  std::vector<unsigned> host(l.blocks);
  std::set<unsigned> sms;
  unsigned missing = 0;
  for (int rep = 0; rep <= l.reps; ++rep) {
    TRY(cuMemsetD32Async, r.d, 0xFFFFFFFFu, l.blocks, s);
    TRY(cuEventRecord, r.e0, s);
    TRY(cuLaunchKernel, reinterpret_cast<CUfunction>(l.kernel), l.blocks, 1, 1, l.threads, 1, 1, l.shmem, s, args,
        nullptr);
    TRY(cuEventRecord, r.e1, s);
    TRY(cuEventSynchronize, r.e1);
    float ms = 0;
    TRY(cuEventElapsedTime, &ms, r.e0, r.e1);
    if (rep > 0 && (best < 0 || ms < best)) best = ms;
    TRY(cuMemcpyDtoH, host.data(), r.d, bytes);  // the kernel is done: e1 was waited for
    for (unsigned v : host) {
      if (v == 0xFFFFFFFFu)
        ++missing;
      else
        sms.insert(v);
    }
  }
  out->distinct = static_cast<unsigned>(sms.size());
  out->lo = sms.empty() ? 0 : *sms.begin();
  out->hi = sms.empty() ? 0 : *sms.rbegin();
  out->missing = missing;
  out->ms = best;
  return CUDA_SUCCESS;
}

std::string unsupported(CUresult r) { return "unsupported: " + err_name(r) + " (" + g_failed + ")"; }

// The verdict for a measured row: does the kernel stay within the SMs granted?
std::string verdict(const Observed& o, unsigned granted) {
  std::string v;
  if (o.missing != 0) v = std::to_string(o.missing) + " block records unwritten; ";
  if (granted != 0 && o.distinct > granted)
    v += "ran on " + std::to_string(o.distinct - granted) + " SMs more than granted";
  else
    v += "ok";
  return v;
}

// --- Green contexts -------------------------------------------------------------------------------------------

// Green context, its stream, and the primary context to make current again, released on every way out.
struct GreenRes {
  CUcontext primary = nullptr;
  CUgreenCtx g = nullptr;
  CUstream s = nullptr;
  bool switched = false;
  ~GreenRes() {
    if (s != nullptr) released(cuStreamDestroy(s), "cuStreamDestroy");
    if (switched) released(cuCtxSetCurrent(primary), "cuCtxSetCurrent(primary)");
    if (g != nullptr) released(cuGreenCtxDestroy(g), "cuGreenCtxDestroy");
  }
};

// Which stream of the green context a row launches on: one made by cuGreenCtxStreamCreate, its NULL
// stream, CU_STREAM_LEGACY, or one made by cuStreamCreate while the green-derived context is current
// (how the CUDA runtime and PyTorch would use a context they were handed).
enum class GreenStream { kGreen, kNull, kLegacy, kCreated };
const char* green_stream_name(GreenStream k) {
  switch (k) {
    case GreenStream::kGreen: return "green context (cuGreenCtxStreamCreate stream)";
    case GreenStream::kNull: return "green context (NULL stream)";
    case GreenStream::kLegacy: return "green context (CU_STREAM_LEGACY)";
    default: return "green context (cuStreamCreate while current)";
  }
}

CUresult green_row(const Launch& l, CUdevice dev, CUcontext primary, const CUdevResource& full, unsigned want,
                   Row* row, GreenStream kind) {
  CUdevResource group{};
  CUdevResource rest{};
  unsigned groups = 1;
  TRY(cuDevSmResourceSplitByCount, &group, &groups, &full, &rest, 0u, want);
  if (groups == 0) {
    g_failed = "cuDevSmResourceSplitByCount gave no group";
    return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  }
  row->granted = group.sm.smCount;
  CUdevResourceDesc desc = nullptr;
  TRY(cuDevResourceGenerateDesc, &desc, &group, 1u);
  GreenRes r;
  r.primary = primary;
  TRY(cuGreenCtxCreate, &r.g, desc, dev, static_cast<unsigned>(CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext ctx = nullptr;
  TRY(cuCtxFromGreenCtx, &ctx, r.g);
  TRY(cuCtxSetCurrent, ctx);
  r.switched = true;
  // What the context itself says it has (should equal the split's group).
  CUdevResource got{};
  TRY(cuCtxGetDevResource, ctx, &got, CU_DEV_RESOURCE_TYPE_SM);
  if (got.sm.smCount != group.sm.smCount)
    std::fprintf(stderr, "sm_limit_probe: green context reports %u SMs, its split group %u\n", got.sm.smCount,
                 group.sm.smCount);
  CUstream use = nullptr;
  if (kind == GreenStream::kGreen) {
    TRY(cuGreenCtxStreamCreate, &r.s, r.g, static_cast<unsigned>(CU_STREAM_NON_BLOCKING), 0);
    use = r.s;
  } else if (kind == GreenStream::kCreated) {
    TRY(cuStreamCreate, &r.s, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
    use = r.s;
  } else if (kind == GreenStream::kLegacy) {
    use = CU_STREAM_LEGACY;
  }
  const CUresult m = measure(l, use, &row->seen);
  if (m != CUDA_SUCCESS) return m;
  row->measured = true;
  return CUDA_SUCCESS;
}

// --- MPS execution affinity ---------------------------------------------------------------------------------

struct AffinityRes {
  CUcontext primary = nullptr;
  CUcontext ctx = nullptr;
  CUstream s = nullptr;
  ~AffinityRes() {
    if (s != nullptr) released(cuStreamDestroy(s), "cuStreamDestroy");
    if (ctx != nullptr) released(cuCtxDestroy(ctx), "cuCtxDestroy");
    released(cuCtxSetCurrent(primary), "cuCtxSetCurrent(primary)");
  }
};

CUresult affinity_row(const Launch& l, CUdevice dev, CUcontext primary, unsigned want, Row* row) {
  CUexecAffinityParam p{};
  p.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
  p.param.smCount.val = want;
  CUctxCreateParams params{};
  params.execAffinityParams = &p;
  params.numExecAffinityParams = 1;
  params.cigParams = nullptr;
  AffinityRes r;
  r.primary = primary;
  TRY(cuCtxCreate, &r.ctx, &params, 0u, dev);  // CUDA 13: cuCtxCreate_v4, makes the new context current
  CUexecAffinityParam got{};
  TRY(cuCtxGetExecAffinity, &got, CU_EXEC_AFFINITY_TYPE_SM_COUNT);
  row->granted = got.param.smCount.val;
  TRY(cuStreamCreate, &r.s, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  const CUresult m = measure(l, r.s, &row->seen);
  if (m != CUDA_SUCCESS) return m;
  row->measured = true;
  return CUDA_SUCCESS;
}

// Where nvidia-cuda-mps-control is: a PATH entry, else a usual install place; empty if nowhere.
std::string find_mps_control() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string all = path;
    size_t start = 0;
    while (start <= all.size()) {
      const size_t end = std::min(all.find(':', start), all.size());
      if (end > start) dirs.push_back(all.substr(start, end - start));
      start = end + 1;
    }
  }
  for (const char* d : {"/usr/bin", "/usr/local/bin", "/usr/sbin", "/usr/local/cuda/bin"}) dirs.push_back(d);
  for (const std::string& d : dirs) {
    const std::string f = d + "/nvidia-cuda-mps-control";
    if (access(f.c_str(), X_OK) == 0) return f;
  }
  return "";
}

// --- Arguments and output -------------------------------------------------------------------------------------

bool parse_uint(const char* s, unsigned lo, unsigned hi, unsigned* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  const unsigned long v = std::strtoul(s, &end, 10);
  if (*end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<unsigned>(v);
  return true;
}

bool parse_counts(const char* s, std::vector<unsigned>* out) {
  if (s == nullptr) return false;
  std::string all = s;
  size_t start = 0;
  while (start <= all.size()) {
    const size_t end = std::min(all.find(',', start), all.size());
    unsigned v = 0;
    if (!parse_uint(all.substr(start, end - start).c_str(), 1, 1u << 20, &v)) return false;
    out->push_back(v);
    start = end + 1;
  }
  return !out->empty();
}

void usage() {
  std::fprintf(stderr,
               "usage: sm_limit_probe [--sms N,N,...] [--spin-us US] [--blocks-per-sm K] [--reps R]\n"
               "  --sms           SM counts to request (default: 16,32,half the SMs)\n"
               "  --spin-us       spin time of each block in microseconds (default 200)\n"
               "  --blocks-per-sm grid size as a multiple of the SM count (default 4)\n"
               "  --reps          timed launches per row after one warm-up; the fastest counts (default 3)\n");
}

bool parse_args(int argc, char** argv, Config* c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    unsigned u = 0;
    if (a == "--sms" && parse_counts(v, &c->counts)) {
      ++i;
    } else if (a == "--spin-us" && parse_uint(v, 1, 10'000'000, &c->spin_us)) {
      ++i;
    } else if (a == "--blocks-per-sm" && parse_uint(v, 1, 1024, &c->blocks_per_sm)) {
      ++i;
    } else if (a == "--reps" && parse_uint(v, 1, 1000, &u)) {
      c->reps = static_cast<int>(u);
      ++i;
    } else {
      return false;
    }
  }
  return true;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void print_row(const Row& r, const Launch& l, float base_ms) {
  std::string granted = r.granted != 0 ? std::to_string(r.granted) : "-";
  std::string distinct = "-", ids = "-", time = "-", rel = "-", waves = "-";
  if (r.measured) {
    const Observed& o = r.seen;
    distinct = std::to_string(o.distinct);
    ids = std::to_string(o.lo) + "–" + std::to_string(o.hi);
    time = fixed(o.ms, 3);
    if (base_ms > 0) rel = fixed(o.ms / base_ms, 2) + "×";
    const double spin_ms = static_cast<double>(l.ns) * 1e-6;
    const unsigned per_wave = (r.granted != 0 ? r.granted : o.distinct) * static_cast<unsigned>(l.blocks_per_sm_resident);
    const std::string expected = per_wave != 0 ? std::to_string((l.blocks + per_wave - 1) / per_wave) : "?";
    waves = fixed(o.ms / spin_ms, 2) + " / " + expected;
  }
  std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.mechanism.c_str(), r.requested.c_str(),
              granted.c_str(), distinct.c_str(), ids.c_str(), time.c_str(), rel.c_str(), waves.c_str(),
              r.result.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!parse_args(argc, argv, &cfg)) {
    usage();
    return 2;
  }

  const CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS) {
    std::fprintf(stderr, "sm_limit_probe: no CUDA device: cuInit failed with %s\n", err_name(init).c_str());
    return 1;
  }
  int ndev = 0;
  CK(cuDeviceGetCount, &ndev);
  if (ndev < 1) {
    std::fprintf(stderr, "sm_limit_probe: no CUDA device (cuDeviceGetCount = 0)\n");
    return 1;
  }
  CUdevice dev = 0;
  CK(cuDeviceGet, &dev, 0);
  char name[256] = {};
  CK(cuDeviceGetName, name, static_cast<int>(sizeof name), dev);
  int sm_count = 0, cc_major = 0, cc_minor = 0, shmem_optin = 0, driver = 0;
  CK(cuDeviceGetAttribute, &sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  CK(cuDeviceGetAttribute, &cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  CK(cuDeviceGetAttribute, &cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  CK(cuDeviceGetAttribute, &shmem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  CK(cuDriverGetVersion, &driver);
  if (sm_count < 1) {
    std::fprintf(stderr, "sm_limit_probe: device 0 reports %d SMs\n", sm_count);
    return 1;
  }
  if (cfg.counts.empty()) cfg.counts = {16, 32, static_cast<unsigned>(sm_count) / 2};
  std::vector<unsigned> counts;
  for (unsigned c : cfg.counts)
    if (c >= 1 && c <= static_cast<unsigned>(sm_count) && std::find(counts.begin(), counts.end(), c) == counts.end())
      counts.push_back(c);

  CUcontext primary = nullptr;
  CK(cuDevicePrimaryCtxRetain, &primary, dev);
  CK(cuCtxSetCurrent, primary);

  // The kernel as a context-independent CUkernel (cudaKernel_t is the same type): cuLaunchKernel runs it in the
  // context of the stream it is given, and the attributes set on it hold in every context on the device.
  CUkernel kernel = nullptr;
  const cudaError_t ke = cudaGetKernel(&kernel, spin);
  if (ke != cudaSuccess) {
    std::fprintf(stderr, "sm_limit_probe: cudaGetKernel(spin) failed: %s\n", cudaGetErrorName(ke));
    return 1;
  }

  Launch l;
  l.kernel = kernel;
  l.blocks = cfg.blocks_per_sm * static_cast<unsigned>(sm_count);
  l.threads = cfg.threads;
  l.ns = static_cast<unsigned long long>(cfg.spin_us) * 1000ull;
  l.reps = cfg.reps;
  // One block per SM at a time: ask for all the shared memory a block may have. If that fails, run without it
  // and count waves with the occupancy there is.
  std::string shmem_note;
  const CUresult sa = cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shmem_optin, kernel, dev);
  if (sa == CUDA_SUCCESS) {
    l.shmem = static_cast<unsigned>(shmem_optin);
  } else {
    std::fprintf(stderr, "sm_limit_probe: cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d) failed: %s\n",
                 shmem_optin, err_name(sa).c_str());
    shmem_note = " (the shared-memory request failed: " + err_name(sa) + ")";
  }
  std::vector<Row> rows;
  CUdevResource full{};
  std::string green_info;

  // 1. Baseline: the primary context, every SM.
  {
    Row r;
    r.mechanism = "baseline (primary context)";
    r.requested = "all";
    r.granted = static_cast<unsigned>(sm_count);
    CUstream s = nullptr;
    CK(cuStreamCreate, &s, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
    const CUresult m = measure(l, s, &r.seen);
    if (m != CUDA_SUCCESS) {
      std::fprintf(stderr, "sm_limit_probe: the baseline launch failed (%s in %s); nothing else can be measured\n",
                   err_name(m).c_str(), g_failed);
      return 1;
    }
    CK(cuStreamDestroy, s);
    r.measured = true;
    r.result = verdict(r.seen, r.granted);
    rows.push_back(r);
  }
  const float base_ms = rows[0].seen.ms;

  // Blocks of spin() resident per SM with that shared memory (the baseline has loaded it into the primary context).
  // Unknown, the expected waves print as "?".
  int resident = 0;
  {
    CUfunction func = nullptr;
    CUresult o = cuKernelGetFunction(&func, kernel);
    if (o == CUDA_SUCCESS)
      o = cuOccupancyMaxActiveBlocksPerMultiprocessor(&resident, func, static_cast<int>(l.threads),
                                                      static_cast<size_t>(l.shmem));
    if (o != CUDA_SUCCESS) {
      std::fprintf(stderr, "sm_limit_probe: occupancy of spin() unknown: %s\n", err_name(o).c_str());
      resident = 0;
    }
    l.blocks_per_sm_resident = resident;
  }

  // 2. Green contexts.
  const CUresult gr = cuDeviceGetDevResource(dev, &full, CU_DEV_RESOURCE_TYPE_SM);
  if (gr != CUDA_SUCCESS) {
    Row r;
    r.mechanism = "green context";
    r.requested = "-";
    g_failed = "cuDeviceGetDevResource";
    r.result = unsupported(gr);
    rows.push_back(r);
  } else {
    green_info = std::to_string(full.sm.smCount) + " SMs, minimum partition " + std::to_string(full.sm.minSmPartitionSize) +
                 ", co-scheduled alignment " + std::to_string(full.sm.smCoscheduledAlignment);
    for (unsigned want : counts)
      for (GreenStream kind : {GreenStream::kGreen, GreenStream::kNull, GreenStream::kLegacy, GreenStream::kCreated}) {
        Row r;
        r.mechanism = green_stream_name(kind);
        r.requested = std::to_string(want);
        g_failed = "";
        const CUresult e = green_row(l, dev, primary, full, want, &r, kind);
        r.result = e == CUDA_SUCCESS ? verdict(r.seen, r.granted) : unsupported(e);
        rows.push_back(r);
      }
  }

  // 3. MPS execution affinity.
  int affinity = 0;
  const CUresult ar = cuDeviceGetExecAffinitySupport(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT, dev);
  const std::string mps_control = find_mps_control();
  const char* pipe_env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string pipe = std::string(pipe_env != nullptr ? pipe_env : "/tmp/nvidia-mps") + "/control";
  struct stat st{};
  const bool pipe_present = stat(pipe.c_str(), &st) == 0;
  if (ar != CUDA_SUCCESS) {
    Row r;
    r.mechanism = "MPS exec affinity";
    r.requested = "-";
    g_failed = "cuDeviceGetExecAffinitySupport";
    r.result = unsupported(ar);
    rows.push_back(r);
  } else if (affinity == 0) {
    Row r;
    r.mechanism = "MPS exec affinity";
    r.requested = "-";
    r.result = "unsupported: needs an MPS client (cuDeviceGetExecAffinitySupport = 0); nvidia-cuda-mps-control " +
               (mps_control.empty() ? std::string("not found") : "at " + mps_control);
    rows.push_back(r);
  } else {
    for (unsigned want : counts) {
      Row r;
      r.mechanism = "MPS exec affinity";
      r.requested = std::to_string(want);
      g_failed = "";
      const CUresult e = affinity_row(l, dev, primary, want, &r);
      r.result = e == CUDA_SUCCESS ? verdict(r.seen, r.granted) : unsupported(e);
      rows.push_back(r);
    }
  }

  std::printf("## sm_limit_probe — device 0: %s (sm_%d%d), %d SMs, driver %d.%d\n\n", name, cc_major, cc_minor,
              sm_count, driver / 1000, driver % 1000 / 10);
  std::printf("- spin(): %u blocks × %u threads, %u µs each, %u B dynamic shared memory → %s block(s) per SM at a "
              "time%s; best of %d timed launches after a warm-up\n",
              l.blocks, l.threads, cfg.spin_us, l.shmem, resident > 0 ? std::to_string(resident).c_str() : "?",
              shmem_note.c_str(), cfg.reps);
  std::printf("- green-context SM resource: %s\n", green_info.empty() ? "unavailable" : green_info.c_str());
  std::printf("- MPS: nvidia-cuda-mps-control %s; control pipe %s %s; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s\n",
              mps_control.empty() ? "not found (PATH, /usr/bin, /usr/local/bin, /usr/local/cuda/bin)"
                                  : ("at " + mps_control).c_str(),
              pipe.c_str(), pipe_present ? "present (a daemon may be running)" : "absent",
              std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != nullptr ? std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                                                                            : "(unset)");
  std::printf("- waves: kernel time / spin time, against ceil(blocks / (granted SMs × blocks per SM)); "
              "more distinct SMs than granted means the limit leaks\n\n");
  std::printf("| mechanism | requested SMs | granted SMs | distinct SMs seen | SM ids | time (ms) | vs baseline | "
              "waves seen / expected | result |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) print_row(r, l, base_ms);

  CK(cuDevicePrimaryCtxRelease, dev);
  return 0;
}
