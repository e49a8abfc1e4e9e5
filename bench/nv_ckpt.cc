// nv_ckpt.cc — times the driver's lock, checkpoint, restore and unlock of another running CUDA process.
// NVIDIA's driver checkpoint API measured on another process, for docs/BENCHMARKS.md's comparison with POS.
#include <cuda.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <system_error>

// cuCheckpointProcessLock and its timeout arrived with CUDA 12.8 (driver 570); older headers lack them.
#if CUDA_VERSION < 12080
#error "nv_ckpt needs cuda.h from CUDA 12.8 or newer (cuCheckpointProcessLock)"
#endif

namespace {

// Long enough for the target's already-submitted work to drain (lock waits for it), short enough
// that a target stuck in a kernel fails the bench instead of hanging it.
constexpr unsigned kLockTimeoutMs = 10000;

int g_pid = 0;

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s PID [--repeat N] [--bytes N] [--only checkpoint|restore]\n"
               "  PID        a running CUDA process (same user, or run as root)\n"
               "  --repeat N lock/checkpoint/restore/unlock cycles, N >= 1 (default 1)\n"
               "  --bytes N  device memory the target holds, as its launcher knows it; adds bytes= and\n"
               "             GB/s (1e9 bytes/s) to the output (the driver does not report it)\n"
               "  --only checkpoint  lock and checkpoint once, and leave the target CHECKPOINTED (its device\n"
               "             state in host memory: then CRIU can dump it, as cuda-checkpoint + CRIU do)\n"
               "  --only restore     restore and unlock a CHECKPOINTED target (after CRIU restored it)\n",
               argv0);
}

const char* state_name(CUprocessState s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING: return "RUNNING";
    case CU_PROCESS_STATE_LOCKED: return "LOCKED";
    case CU_PROCESS_STATE_CHECKPOINTED: return "CHECKPOINTED";
    case CU_PROCESS_STATE_FAILED: return "FAILED";
  }
  return "UNKNOWN";
}

// Prints the failing call with the driver's own name and text for the code. cuGetErrorName/String
// leave the pointer NULL for codes they do not know, so that case is printed as the bare number.
void report(const char* api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  if (cuGetErrorString(r, &text) != CUDA_SUCCESS || text == nullptr) text = "no description";
  std::fprintf(stderr, "nv_ckpt: %s failed (target pid=%d): %d %s: %s\n", api, g_pid, static_cast<int>(r),
               name, text);
}

// A failed step can leave the target locked or with its memory off the GPU, i.e. frozen for good.
// Before exiting, try once to hand it back RUNNING so the caller's workload can still finish (the
// driver may refuse: a failed restore is not always retryable). Each outcome is printed.
[[noreturn]] void fail_and_release() {
  CUprocessState s{};
  CUresult r = cuCheckpointProcessGetState(g_pid, &s);
  if (r != CUDA_SUCCESS) {
    report("cuCheckpointProcessGetState", r);
    std::exit(1);
  }
  if (s == CU_PROCESS_STATE_CHECKPOINTED) {
    CUcheckpointRestoreArgs ra{};
    r = cuCheckpointProcessRestore(g_pid, &ra);
    if (r != CUDA_SUCCESS) {
      report("cuCheckpointProcessRestore (recovery)", r);
      std::exit(1);
    }
    s = CU_PROCESS_STATE_LOCKED;
  }
  if (s == CU_PROCESS_STATE_LOCKED) {
    CUcheckpointUnlockArgs ua{};
    r = cuCheckpointProcessUnlock(g_pid, &ua);
    if (r != CUDA_SUCCESS) report("cuCheckpointProcessUnlock (recovery)", r);
    else std::fprintf(stderr, "nv_ckpt: target pid=%d handed back RUNNING\n", g_pid);
  }
  std::exit(1);
}

// The state is read outside the timed region so that it costs the measured calls nothing.
void expect_state(CUprocessState want, const char* after) {
  CUprocessState s{};
  const CUresult r = cuCheckpointProcessGetState(g_pid, &s);
  if (r != CUDA_SUCCESS) {
    report("cuCheckpointProcessGetState", r);
    fail_and_release();
  }
  if (s != want) {
    std::fprintf(stderr, "nv_ckpt: pid=%d is %s after %s, expected %s\n", g_pid, state_name(s), after,
                 state_name(want));
    fail_and_release();
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Whole-string parse: "12x", "", "+3" and out-of-range values are all rejected.
template <typename T>
bool parse_num(std::string_view s, T& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 1;
  std::string_view only;  // "", "checkpoint", "restore"
  uint64_t bytes = 0;
  bool have_bytes = false;
  bool have_pid = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      return 0;
    }
    if (a == "--only") {
      if (i + 1 >= argc || (std::string_view(argv[i + 1]) != "checkpoint" && std::string_view(argv[i + 1]) != "restore")) {
        std::fprintf(stderr, "nv_ckpt: --only needs checkpoint or restore\n");
        usage(argv[0]);
        return 2;
      }
      only = argv[++i];
      continue;
    }
    if (a == "--repeat" || a == "--bytes") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "nv_ckpt: %s needs a value\n", argv[i]);
        usage(argv[0]);
        return 2;
      }
      const std::string_view v = argv[++i];
      const bool ok = a == "--repeat" ? parse_num(v, repeat) && repeat >= 1 : parse_num(v, bytes);
      if (!ok) {
        std::fprintf(stderr, "nv_ckpt: bad value for %s: '%s'\n", argv[i - 1], argv[i]);
        usage(argv[0]);
        return 2;
      }
      have_bytes = have_bytes || a == "--bytes";
      continue;
    }
    if (a.starts_with("-") || have_pid) {
      std::fprintf(stderr, "nv_ckpt: unexpected argument '%s'\n", argv[i]);
      usage(argv[0]);
      return 2;
    }
    if (!parse_num(a, g_pid) || g_pid <= 0) {
      std::fprintf(stderr, "nv_ckpt: bad pid '%s'\n", argv[i]);
      usage(argv[0]);
      return 2;
    }
    have_pid = true;
  }
  if (!have_pid) {
    usage(argv[0]);
    return 2;
  }

  // cuda.h: "CUDA process restore requires persistence mode to be enabled or cuInit to have been
  // called before execution". While the target is CHECKPOINTED it holds no GPU handle, so without
  // persistence mode and with no other client the driver could tear the GPU down; this process's
  // cuInit keeps it initialized. cuInit creates no context, so it takes no device memory.
  if (const CUresult r = cuInit(0); r != CUDA_SUCCESS) {
    report("cuInit", r);
    return 1;
  }

  if (only == "restore") {
    // The second half of cuda-checkpoint + CRIU: CRIU has restored the process, its device state
    // is still in host memory; put it back and let it run.
    expect_state(CU_PROCESS_STATE_CHECKPOINTED, "CRIU's restore");
    CUcheckpointRestoreArgs ra{};
    auto t0 = std::chrono::steady_clock::now();
    if (const CUresult r = cuCheckpointProcessRestore(g_pid, &ra); r != CUDA_SUCCESS) {
      report("cuCheckpointProcessRestore", r);
      return 1;
    }
    const double restore_ms = ms_since(t0);
    CUcheckpointUnlockArgs ua{};
    t0 = std::chrono::steady_clock::now();
    if (const CUresult r = cuCheckpointProcessUnlock(g_pid, &ua); r != CUDA_SUCCESS) {
      report("cuCheckpointProcessUnlock", r);
      return 1;
    }
    std::printf("nv_ckpt pid=%d restore_ms=%.3f unlock_ms=%.3f\n", g_pid, restore_ms, ms_since(t0));
    return 0;
  }
  if (only == "checkpoint") repeat = 1;
  for (int rep = 0; rep < repeat; ++rep) {
    // Only a RUNNING target can be locked; anything else means a previous run left it frozen.
    CUprocessState s{};
    if (const CUresult r = cuCheckpointProcessGetState(g_pid, &s); r != CUDA_SUCCESS) {
      report("cuCheckpointProcessGetState", r);
      return 1;
    }
    if (s != CU_PROCESS_STATE_RUNNING) {
      std::fprintf(stderr, "nv_ckpt: pid=%d is %s, expected RUNNING\n", g_pid, state_name(s));
      return 1;
    }

    // Reserved fields must be zero: value-initialize every argument struct.
    CUcheckpointLockArgs la{};
    la.timeoutMs = kLockTimeoutMs;
    auto t0 = std::chrono::steady_clock::now();
    if (const CUresult r = cuCheckpointProcessLock(g_pid, &la); r != CUDA_SUCCESS) {
      // On a timeout the driver leaves the target RUNNING; on other errors recovery looks.
      report("cuCheckpointProcessLock", r);
      fail_and_release();
    }
    const double lock_ms = ms_since(t0);
    expect_state(CU_PROCESS_STATE_LOCKED, "lock");

    CUcheckpointCheckpointArgs ca{};
    t0 = std::chrono::steady_clock::now();
    if (const CUresult r = cuCheckpointProcessCheckpoint(g_pid, &ca); r != CUDA_SUCCESS) {
      report("cuCheckpointProcessCheckpoint", r);
      fail_and_release();
    }
    const double ckpt_ms = ms_since(t0);
    expect_state(CU_PROCESS_STATE_CHECKPOINTED, "checkpoint");
    if (only == "checkpoint") {
      std::printf("nv_ckpt pid=%d lock_ms=%.3f checkpoint_ms=%.3f\n", g_pid, lock_ms, ckpt_ms);
      return 0;  // left CHECKPOINTED on purpose
    }

    // No GPU remapping: the target comes back on the GPUs it left.
    CUcheckpointRestoreArgs ra{};
    t0 = std::chrono::steady_clock::now();
    if (const CUresult r = cuCheckpointProcessRestore(g_pid, &ra); r != CUDA_SUCCESS) {
      report("cuCheckpointProcessRestore", r);
      fail_and_release();
    }
    const double restore_ms = ms_since(t0);
    expect_state(CU_PROCESS_STATE_LOCKED, "restore");

    CUcheckpointUnlockArgs ua{};
    t0 = std::chrono::steady_clock::now();
    if (const CUresult r = cuCheckpointProcessUnlock(g_pid, &ua); r != CUDA_SUCCESS) {
      report("cuCheckpointProcessUnlock", r);
      fail_and_release();
    }
    const double unlock_ms = ms_since(t0);
    expect_state(CU_PROCESS_STATE_RUNNING, "unlock");

    // One line per cycle, key=value, so a script can grep and split it. Without --bytes the
    // bytes and GB/s keys are left out rather than printed as a made-up zero.
    std::printf("nv_ckpt pid=%d", g_pid);
    if (have_bytes) std::printf(" bytes=%llu", static_cast<unsigned long long>(bytes));
    std::printf(" lock_ms=%.3f checkpoint_ms=%.3f restore_ms=%.3f unlock_ms=%.3f", lock_ms, ckpt_ms,
                restore_ms, unlock_ms);
    if (have_bytes) {
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf(" checkpoint_GBps=%.2f restore_GBps=%.2f", gb / (ckpt_ms / 1e3), gb / (restore_ms / 1e3));
    }
    std::printf("\n");
    std::fflush(stdout);  // lines reach a pipe as each cycle ends, not at exit
  }
  return 0;
}
