// isolation_probe.cu — measures on one GPU what separates posd's tenants (memory reach, fault blast radius) and
// what a context, a process or an MPS client per tenant costs; its table fills docs/isolation.md.
#ifdef ISOLATION_PROBE_KERNELS
// Device half: bench/meson.build compiles this part alone (`nvcc --fatbin`) and embeds it with bin2c; the host
// half loads it into every context with cuModuleLoadData, so the program needs no CUDA runtime at all.

extern "C" __global__ void probe_empty() {}

// One load and two stores where the host says: p[1] = p[0]; p[0] += add. The host checks both words, so
// "could read" and "could write" are each verified; a bad address faults on the first load.
extern "C" __global__ void probe_rw(unsigned* p, unsigned add) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned v = *static_cast<volatile unsigned*>(p);
    p[1] = v;
    p[0] = v + add;
  }
}

// A compute step whose length the host calibrates through iters: a chain of dependent FMAs in every thread.
// The store is never taken but depends on every thread's result, so the loop stays in all of them.
extern "C" __global__ void probe_compute(float* out, int iters) {
  float x = threadIdx.x * 1e-3f;
  for (int i = 0; i < iters; ++i) x = fmaf(x, 0.999f, 1e-4f);
  if (x == -1.0f) out[blockIdx.x] = x;
}

// Runs for ns nanoseconds of wall time (%globaltimer keeps counting while the context is switched out), then
// writes marker to p[2]: the kernel a tenant has in flight while another one faults.
extern "C" __global__ void probe_spin(unsigned long long ns, unsigned* p, unsigned marker) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  if (blockIdx.x == 0 && threadIdx.x == 0) p[2] = marker;
}

#else  // host half

#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "isolation_probe_fatbin.h"  // kIsolationProbeFatbin: the device half above, as bytes

extern char** environ;

namespace {

// ---------------------------------------------------------------------------------------------------------
// Common helpers

// posd's default client.va_base (pos/config.h): VMM buffers go where posd would put a client's memory.
constexpr uint64_t kVaBase = 0x110000000000ull;
constexpr unsigned kSpinMarker = 0xC0FFEEu;

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // system-wide: timestamps compare across processes
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string hex(uint64_t v) { return fmt("0x%llx", static_cast<unsigned long long>(v)); }

std::string cu(CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) return fmt("CUresult %d", static_cast<int>(r));
  if (r == CUDA_SUCCESS) return name;
  return fmt("%s (%d)", name, static_cast<int>(r));
}

// The table is tab-separated on the wire between processes and '|'-separated on paper.
std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r' || c == '|') c = c == '|' ? '/' : ' ';
  return s;
}

// Set by --section / --tag when a mode runs in another setting (under MPS): its rows go to that section,
// their findings prefixed with the tag.
std::string g_section_override;
std::string g_tag;
bool g_quick = false;

void row(const std::string& section, const std::string& finding, const std::string& result,
         const std::string& evidence) {
  const std::string sec = g_section_override.empty() ? section : g_section_override;
  std::printf("ROW\t%s\t%s\t%s\t%s\n", clean(sec).c_str(), clean(g_tag + finding).c_str(), clean(result).c_str(),
              clean(evidence).c_str());
  std::fflush(stdout);
}

void info(const char* key, const std::string& value) {
  std::printf("INFO\t%s\t%s\n", key, clean(value).c_str());
  std::fflush(stdout);
}

// The experiment a mode is running, named by the row a failed setup call produces.
std::string g_cur_section = "?";
std::string g_cur_finding = "?";
std::string g_failed_call;  // innermost failing call of a helper

void begin(const char* section, const std::string& finding) {
  g_cur_section = section;
  g_cur_finding = finding;
  std::fprintf(stderr, "isolation_probe[%d]: %s\n", static_cast<int>(getpid()), finding.c_str());
}

int setup_failed(const char* call, CUresult r) {
  std::string where = call;
  if (!g_failed_call.empty()) where += " <- " + g_failed_call;
  row(g_cur_section, g_cur_finding, "not measured: setup failed", where + " -> " + cu(r));
  return 1;
}

// CK: a setup call in a mode; failing, the mode prints why and ends. TRY: the same inside a helper that
// returns CUresult, remembering which call failed.
#define CK(call)                                          \
  do {                                                    \
    const CUresult ck_r_ = (call);                        \
    if (ck_r_ != CUDA_SUCCESS) return setup_failed(#call, ck_r_); \
  } while (0)
#define TRY(call)                                 \
  do {                                            \
    const CUresult try_r_ = (call);               \
    if (try_r_ != CUDA_SUCCESS) {                 \
      g_failed_call = #call;                      \
      return try_r_;                              \
    }                                             \
  } while (0)

// ---------------------------------------------------------------------------------------------------------
// Processes: every experiment runs in a child started by fork + exec of this binary, so that a fault, a hang
// or a wedged driver state ends that child only. Everything a child needs is prepared before fork: a parent
// with CUDA initialized has driver threads, and only async-signal-safe calls are allowed until exec.

std::string g_self;  // this binary, exec'd for every child

struct Spawn {
  std::vector<std::string> args;  // argv; args[0] is the program's name
  std::string exe;                // what to exec (default: this binary)
  std::vector<std::string> env;   // KEY=VALUE added to, or replacing in, this process's environment
  bool capture_out = false;       // stdout to a pipe (Child::out); otherwise inherited
  bool pipe_in = false;           // stdin from a pipe (Child::in); otherwise /dev/null
  int out_file = -1;              // stdout and stderr to this descriptor instead (a daemon's log)
  int keep_fd = -1;               // stays open across exec, under its number
  bool own_group = false;         // a new process group: a timeout kills the child and all it started
};

struct Child {
  pid_t pid = -1;
  int out = -1;
  int in = -1;
};

std::string env_key(const std::string& kv) { return kv.substr(0, kv.find('=')); }

void close_from(int first, int keep, long maxfd) {  // async-signal-safe
#ifdef SYS_close_range
  bool done = false;
  if (keep < first) {
    done = syscall(SYS_close_range, first, ~0u, 0) == 0;
  } else {
    done = (keep == first || syscall(SYS_close_range, first, keep - 1, 0) == 0) &&
           syscall(SYS_close_range, keep + 1, ~0u, 0) == 0;
  }
  if (done) return;
#endif
  for (long fd = first; fd < maxfd; ++fd)
    if (fd != keep) close(static_cast<int>(fd));
}

Child start(const Spawn& sp) {
  Child c;
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s = *e;
    bool replaced = false;
    for (const auto& x : sp.env) replaced = replaced || env_key(x) == env_key(s);
    if (!replaced) envs.push_back(s);
  }
  for (const auto& x : sp.env) envs.push_back(x);
  std::vector<char*> argv, envp;
  for (const auto& a : sp.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exe = sp.exe.empty() ? g_self : sp.exe;
  int outp[2] = {-1, -1}, inp[2] = {-1, -1};
  if (sp.capture_out && pipe2(outp, O_CLOEXEC) != 0) return c;
  if (sp.pipe_in && pipe2(inp, O_CLOEXEC) != 0) return c;
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  long maxfd = sysconf(_SC_OPEN_MAX);
  if (maxfd < 0 || maxfd > 65536) maxfd = 65536;
  const pid_t pid = fork();
  if (pid == 0) {
    if (sp.own_group) setpgid(0, 0);
    if (sp.pipe_in) dup2(inp[0], 0);
    else if (devnull >= 0) dup2(devnull, 0);
    if (sp.out_file >= 0) {
      dup2(sp.out_file, 1);
      dup2(sp.out_file, 2);
    } else if (sp.capture_out) {
      dup2(outp[1], 1);
    }
    if (sp.keep_fd >= 0) fcntl(sp.keep_fd, F_SETFD, 0);
    close_from(3, sp.keep_fd, maxfd);
    execve(exe.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (pid > 0 && sp.own_group) setpgid(pid, pid);  // both sides set it: no race with an early kill
  if (devnull >= 0) close(devnull);
  if (outp[1] >= 0) close(outp[1]);
  if (inp[0] >= 0) close(inp[0]);
  if (pid < 0) {
    if (outp[0] >= 0) close(outp[0]);
    if (inp[1] >= 0) close(inp[1]);
    return c;
  }
  c.pid = pid;
  c.out = outp[0];
  c.in = inp[1];
  return c;
}

struct End {
  bool exited = false;
  int code = -1;
  int sig = 0;
  bool timed_out = false;
  double waited_s = 0;
  bool clean() const { return exited && code == 0; }
  std::string text() const {
    if (timed_out) return fmt("hung: killed after %.0f s", waited_s);
    if (sig != 0) return fmt("killed by signal %d (%s)", sig, strsignal(sig));
    return fmt("exit %d", code);
  }
};

// Waits for pid until deadline; then kills it (and its group, if it leads one) with SIGKILL. A group leader's
// stragglers are killed after it exits too: nothing an experiment started outlives it.
End wait_child(pid_t pid, double deadline, bool group) {
  End e;
  const double t0 = now_s();
  for (;;) {
    int st = 0;
    const pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(st)) e.exited = true, e.code = WEXITSTATUS(st);
      if (WIFSIGNALED(st)) e.sig = WTERMSIG(st);
      break;
    }
    if (r < 0 && errno != EINTR) break;
    if (now_s() > deadline) {
      kill(group ? -pid : pid, SIGKILL);
      waitpid(pid, &st, 0);
      e.timed_out = true;
      break;
    }
    usleep(2000);
  }
  if (group) kill(-pid, SIGKILL);
  e.waited_s = now_s() - t0;
  return e;
}

// Line-at-a-time reads from a child's pipe, with a deadline.
struct LineReader {
  int fd = -1;
  std::string buf;
  // 1: a line in *line; 0: end of file; -1: deadline passed.
  int next(std::string* line, double deadline) {
    for (;;) {
      const size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        *line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return 1;
      }
      const double left = deadline - now_s();
      if (left <= 0) return -1;
      pollfd p{fd, POLLIN, 0};
      const int pr = poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 200.0)) + 1);
      if (pr < 0 && errno != EINTR) return 0;
      if (pr <= 0) continue;
      char tmp[4096];
      const ssize_t n = read(fd, tmp, sizeof tmp);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        if (buf.empty()) return 0;
        *line = buf;
        buf.clear();
        return 1;
      }
      buf.append(tmp, static_cast<size_t>(n));
    }
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    const size_t j = s.find(sep, i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return out;
    i = j + 1;
  }
}

// The arguments a mode needs to pass on to its own children (setting and tag).
std::vector<std::string> passthrough() {
  std::vector<std::string> a;
  if (!g_section_override.empty()) a.insert(a.end(), {"--section", g_section_override});
  if (!g_tag.empty()) a.insert(a.end(), {"--tag", g_tag});
  return a;
}

// Sends a small struct and one descriptor over a Unix socket (SCM_RIGHTS), and receives them.
bool send_fd(int sock, int fd, const void* data, size_t len) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return sendmsg(sock, &m, 0) == static_cast<ssize_t>(len);
}

bool wait_readable(int fd, double deadline) {
  for (;;) {
    const double left = deadline - now_s();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left * 1000.0) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool recv_fd(int sock, int* fd, void* data, size_t len, double deadline) {
  if (!wait_readable(sock, deadline)) return false;
  iovec iov{data, len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != static_cast<ssize_t>(len)) return false;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return false;
  std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  return true;
}

bool read_byte(int fd, char* b, double deadline) {
  if (!wait_readable(fd, deadline)) return false;
  return read(fd, b, 1) == 1;
}

// ---------------------------------------------------------------------------------------------------------
// CUDA helpers (children only: the orchestrating parent never initializes CUDA)

struct Kernels {
  CUmodule mod = nullptr;
  CUfunction empty = nullptr, rw = nullptr, compute = nullptr, spin = nullptr;
};

// bin2c's array has byte alignment; the driver reads the fatbin header in wider words.
const void* fatbin() {
  static std::vector<uint64_t> copy;
  if (copy.empty()) {
    copy.resize(sizeof(kIsolationProbeFatbin) / 8 + 1);
    std::memcpy(copy.data(), kIsolationProbeFatbin, sizeof(kIsolationProbeFatbin));
  }
  return copy.data();
}

CUresult load_kernels(Kernels* k) {  // into the current context
  TRY(cuModuleLoadData(&k->mod, fatbin()));
  TRY(cuModuleGetFunction(&k->empty, k->mod, "probe_empty"));
  TRY(cuModuleGetFunction(&k->rw, k->mod, "probe_rw"));
  TRY(cuModuleGetFunction(&k->compute, k->mod, "probe_compute"));
  TRY(cuModuleGetFunction(&k->spin, k->mod, "probe_spin"));
  return CUDA_SUCCESS;
}

// CUDA 13's cuCtxCreate takes CUctxCreateParams*. 13.0's cuda.h says one of its two pointers must be set,
// later documentation says both NULL (or no struct) makes a plain context: try NULL, then an empty struct.
std::string g_ctx_api = "cuCtxCreate(ctx, NULL, 0, dev)";
CUresult make_ctx(CUcontext* c, CUdevice d) {
  CUresult r = cuCtxCreate(c, nullptr, 0, d);
  if (r == CUDA_ERROR_INVALID_VALUE) {
    CUctxCreateParams p{};
    r = cuCtxCreate(c, &p, 0, d);
    if (r == CUDA_SUCCESS) g_ctx_api = "cuCtxCreate(ctx, &{NULL,0,NULL}, 0, dev)";
  }
  if (r != CUDA_SUCCESS) g_failed_call = "cuCtxCreate";
  return r;
}

// A tenant as posd would serve it: a context (its own, or the shared primary one), the kernels and a stream.
struct Client {
  CUcontext ctx = nullptr;
  Kernels k;
  CUstream s = nullptr;
};

CUresult open_client(Client* c, CUdevice dev, bool primary) {
  if (primary) {
    TRY(cuDevicePrimaryCtxRetain(&c->ctx, dev));
    TRY(cuCtxSetCurrent(c->ctx));
  } else {
    TRY(make_ctx(&c->ctx, dev));  // and current
  }
  TRY(load_kernels(&c->k));
  TRY(cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING));  // as posd's streams: no legacy-stream coupling
  return CUDA_SUCCESS;
}

CUresult init_dev(CUdevice* dev) {
  TRY(cuInit(0));
  TRY(cuDeviceGet(dev, 0));
  return CUDA_SUCCESS;
}

int attr(CUdevice dev, CUdevice_attribute a) {
  int v = -1;
  if (cuDeviceGetAttribute(&v, a, dev) != CUDA_SUCCESS) return -1;
  return v;
}

// Device memory the way posd maps a client's: reserve a range at a chosen address, create a physical chunk,
// map it, grant this device read-write (pos/backends/cuda/cuda_backend.cc, map_chunk).
struct VmmBuf {
  CUdeviceptr va = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle h = 0;
  bool at_hint = false;
};

CUresult vmm_alloc(VmmBuf* b, CUdevice dev, size_t size, uint64_t hint, bool exportable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  if (exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  TRY(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  b->size = (size + g - 1) / g * g;
  TRY(cuMemAddressReserve(&b->va, b->size, g, hint, 0));
  b->at_hint = b->va == hint;
  TRY(cuMemCreate(&b->h, b->size, &prop, 0));
  TRY(cuMemMap(b->va, b->size, 0, b->h, 0));
  CUmemAccessDesc a{};
  a.location = prop.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  TRY(cuMemSetAccess(b->va, b->size, &a, 1));
  return CUDA_SUCCESS;
}

CUresult launch_rw(const Client& c, CUdeviceptr p, unsigned add) {
  void* a[] = {&p, &add};
  return cuLaunchKernel(c.k.rw, 1, 1, 1, 32, 1, 1, 0, c.s, a, nullptr);
}

CUresult launch_spin(const Client& c, CUdeviceptr p, double seconds, unsigned marker) {
  unsigned long long ns = static_cast<unsigned long long>(seconds * 1e9);
  void* a[] = {&ns, &p, &marker};
  return cuLaunchKernel(c.k.spin, 1, 1, 1, 32, 1, 1, 0, c.s, a, nullptr);
}

CUresult launch_empty(const Kernels& k, CUstream s) {
  return cuLaunchKernel(k.empty, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr);
}

CUresult launch_compute(const Kernels& k, CUstream s, CUdeviceptr out, int iters, int blocks, int threads) {
  void* a[] = {&out, &iters};
  return cuLaunchKernel(k.compute, static_cast<unsigned>(blocks), 1, 1, static_cast<unsigned>(threads), 1, 1, 0, s, a,
                        nullptr);
}

// Words 0..3 of a probe buffer, through the current context.
CUresult seed(CUdeviceptr p, unsigned v) {
  const unsigned h[4] = {v, 0, 0, 0};
  return cuMemcpyHtoD(p, h, sizeof h);
}
CUresult peek(CUdeviceptr p, unsigned out[4]) { return cuMemcpyDtoH(out, p, 4 * sizeof(unsigned)); }

// One tenant's read-write check on a device buffer it owns: seed, run probe_rw, read back.
struct RwCheck {
  CUresult seed = CUDA_SUCCESS, launch = CUDA_SUCCESS, sync = CUDA_SUCCESS, peek = CUDA_SUCCESS;
  unsigned w[4] = {0, 0, 0, 0};
  bool ok = false;
  std::string text() const {
    if (ok) return "ok";
    return fmt("seed %s, launch %s, sync %s, read-back %s, words 0x%x 0x%x", cu(seed).c_str(), cu(launch).c_str(),
               cu(sync).c_str(), cu(peek).c_str(), w[0], w[1]);
  }
};

RwCheck rw_check(const Client& c, CUdeviceptr p, unsigned v) {
  RwCheck r;
  r.seed = seed(p, v);
  r.launch = launch_rw(c, p, 5);
  r.sync = cuStreamSynchronize(c.s);
  r.peek = peek(p, r.w);
  r.ok = r.seed == CUDA_SUCCESS && r.launch == CUDA_SUCCESS && r.sync == CUDA_SUCCESS && r.peek == CUDA_SUCCESS &&
         r.w[0] == v + 5 && r.w[1] == v;
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Modes: each runs in its own process and prints ROW / INFO lines.

int mode_info() {
  begin("0", "machine");
  const double t0 = now_s();
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client c;
  CK(open_client(&c, dev, true));
  CK(launch_empty(c.k, c.s));
  CK(cuStreamSynchronize(c.s));
  const double t1 = now_s();
  char name[256] = {};
  CK(cuDeviceGetName(name, sizeof name, dev));
  int drv = 0, count = 0;
  CK(cuDriverGetVersion(&drv));
  CK(cuDeviceGetCount(&count));
  size_t total = 0;
  CK(cuDeviceTotalMem(&total, dev));
  info("gpu", name);
  info("gpus", fmt("%d", count));
  info("driver_api", fmt("%d.%d", drv / 1000, drv % 1000 / 10));
  info("cc", fmt("%d.%d", attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                 attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)));
  info("sms", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)));
  info("mem_gib", fmt("%.1f", static_cast<double>(total) / (1ull << 30)));
  info("vmm", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)));
  info("posix_fd", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)));
  info("uva", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)));
  info("host_ptr_registered", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)));
  info("pageable_access", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)));
  info("pageable_host_tables", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES)));
  const int mode = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE);
  info("compute_mode", mode == CU_COMPUTEMODE_DEFAULT             ? "DEFAULT"
                       : mode == CU_COMPUTEMODE_PROHIBITED        ? "PROHIBITED"
                       : mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS ? "EXCLUSIVE_PROCESS"
                                                                  : fmt("%d", mode));
  info("mps_enabled", fmt("%d", attr(dev, CU_DEVICE_ATTRIBUTE_MPS_ENABLED)));
  info("init_ms", fmt("%.0f", (t1 - t0) * 1e3));
  CUcontext extra = nullptr;
  const CUresult r = make_ctx(&extra, dev);
  info("ctx_api", r == CUDA_SUCCESS ? g_ctx_api : "cuCtxCreate failed: " + cu(r));
  if (r == CUDA_SUCCESS) cuCtxDestroy(extra);
  row("0", "module, context, first launch", "ok",
      fmt("cuInit + primary context + module + first launch: %.0f ms; extra contexts by %s", (t1 - t0) * 1e3,
          g_ctx_api.c_str()));
  return 0;
}

// 1. Two contexts of one process: is what context A mapped reachable from a kernel in context B?
int mode_cross(const std::string& kind) {
  const std::map<std::string, std::string> what = {
      {"vmm", "VMM memory mapped while ctx A was current (reserve+create+map+setAccess)"},
      {"alloc", "cuMemAlloc memory of ctx A"},
      {"host-portable", "host memory registered in ctx A with CU_MEMHOSTREGISTER_PORTABLE (posd's arenas)"},
      {"host-plain", "host memory registered in ctx A without PORTABLE (flags 0)"},
      {"host-pageable", "pageable host memory, never registered (malloc)"},
  };
  const auto it = what.find(kind);
  if (it == what.end()) return 2;
  begin("1", "same process, kernel in ctx B on " + it->second);
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client a, b;
  CK(open_client(&a, dev, false));
  CK(open_client(&b, dev, false));
  CK(cuCtxSetCurrent(a.ctx));
  const unsigned v = 0x1234;
  CUdeviceptr dptr = 0;
  unsigned* host = nullptr;
  const size_t host_bytes = 64 << 10;
  std::string ev;
  if (kind == "vmm") {
    VmmBuf buf;
    CK(vmm_alloc(&buf, dev, 1, kVaBase, false));
    dptr = buf.va;
    ev = fmt("VA %s%s; ", hex(dptr).c_str(), buf.at_hint ? " (posd's va_base)" : "");
  } else if (kind == "alloc") {
    CK(cuMemAlloc(&dptr, 4096));
    ev = fmt("VA %s; ", hex(dptr).c_str());
  } else {
    host = static_cast<unsigned*>(std::aligned_alloc(4096, host_bytes));
    if (host == nullptr) return 1;
    std::memset(host, 0, host_bytes);
    if (kind == "host-portable") CK(cuMemHostRegister(host, host_bytes, CU_MEMHOSTREGISTER_PORTABLE));
    if (kind == "host-plain") CK(cuMemHostRegister(host, host_bytes, 0));
    ev = fmt("pageable access %d, host pointer usable for registered memory %d; ",
             attr(dev, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS),
             attr(dev, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM));
  }
  if (host == nullptr) {
    const RwCheck own = rw_check(a, dptr, 0x1111);
    ev += "ctx A itself: " + own.text() + "; ";
    CK(seed(dptr, v));
  } else if (kind != "host-pageable") {
    CUdeviceptr da = 0;
    const CUresult r = cuMemHostGetDevicePointer(&da, host, 0);
    host[0] = 0x1111, host[1] = 0;
    CUresult ls = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
      ls = launch_rw(a, da, 5);
      if (ls == CUDA_SUCCESS) ls = cuStreamSynchronize(a.s);
    }
    ev += fmt("ctx A itself: cuMemHostGetDevicePointer %s (%s), kernel %s; ", cu(r).c_str(),
              da == reinterpret_cast<uintptr_t>(host) ? "= host pointer" : hex(da).c_str(),
              r != CUDA_SUCCESS ? "not run"
              : ls == CUDA_SUCCESS && host[0] == 0x1116 && host[1] == 0x1111 ? "read+wrote"
                                                                              : cu(ls).c_str());
  }
  if (host != nullptr) host[0] = v, host[1] = 0;
  // Context B: the other tenant.
  CK(cuCtxSetCurrent(b.ctx));
  CUdeviceptr target = dptr;
  if (host != nullptr) {
    target = reinterpret_cast<uintptr_t>(host);
    if (kind != "host-pageable") {
      CUdeviceptr db = 0;
      const CUresult r = cuMemHostGetDevicePointer(&db, host, 0);
      ev += "in ctx B cuMemHostGetDevicePointer " + cu(r) + "; ";
      if (r == CUDA_SUCCESS) target = db;
      else ev += "kernel given the host pointer (UVA); ";
    }
  } else if (kind == "alloc") {
    CUcontext owner = nullptr;
    const CUresult r = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, dptr);
    ev += fmt("pointer's context from B: %s; ", r != CUDA_SUCCESS ? cu(r).c_str()
                                                : owner == a.ctx ? "A"
                                                : owner == b.ctx ? "B"
                                                                 : "other");
  }
  const CUresult l = launch_rw(b, target, 7);
  const CUresult s = cuStreamSynchronize(b.s);
  unsigned w[4] = {0, 0, 0, 0};
  CUresult p = CUDA_SUCCESS;
  if (host != nullptr) {
    std::memcpy(w, host, sizeof w);
  } else if (s == CUDA_SUCCESS) {
    p = peek(dptr, w);
  } else {
    CK(cuCtxSetCurrent(a.ctx));  // B is dead: read through the owner
    p = peek(dptr, w);
  }
  const bool read = s == CUDA_SUCCESS && w[1] == v;
  const bool wrote = s == CUDA_SUCCESS && w[0] == v + 7;
  std::string result;
  if (l != CUDA_SUCCESS) result = "no: launch " + cu(l);
  else if (s != CUDA_SUCCESS) result = "no: " + cu(s) + " in B";
  else if (read && wrote) result = "yes: B read and wrote it";
  else result = fmt("partly: read %s, wrote %s", read ? "yes" : "no", wrote ? "yes" : "no");
  ev += fmt("B's kernel: launch %s, sync %s; words after 0x%x 0x%x (read-back %s)", cu(l).c_str(), cu(s).c_str(), w[0],
            w[1], cu(p).c_str());
  if (host == nullptr) {
    CK(cuCtxSetCurrent(a.ctx));
    ev += "; ctx A after: " + rw_check(a, dptr, 0x2222).text();
  }
  row("1", it->second + ": kernel in ctx B reaches it?", result, ev);
  return 0;
}

// 2. A kernel of tenant B faults. Contexts: B and A each their own (--where ctx), or both in the primary
// context as posd runs them today (--where primary). A has a kernel in flight at the fault.
int mode_fault(const std::string& where, const std::string& target_kind) {
  const bool primary = where == "primary";
  const std::string tdesc = target_kind == "null" ? "writes to 0x10" : "touches a reserved, unmapped VA";
  const std::string setting = std::string(primary ? "primary ctx shared" : "own ctxs") + ", B's kernel " + tdesc + ": ";
  begin("2", setting);
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client a, b;
  CK(open_client(&a, dev, primary));
  if (primary) {
    b.ctx = a.ctx;
    b.k = a.k;
    CK(cuStreamCreate(&b.s, CU_STREAM_NON_BLOCKING));
  } else {
    CK(open_client(&b, dev, false));
  }
  CK(cuCtxSetCurrent(a.ctx));
  VmmBuf buf;
  CK(vmm_alloc(&buf, dev, 1, kVaBase, false));
  CK(seed(buf.va, 0x1111));
  CK(cuCtxSynchronize());
  CUdeviceptr target = 0x10;
  if (target_kind != "null") {
    CK(cuMemAddressReserve(&target, buf.size, 0, 0, 0));  // process-wide VA, never mapped
  }
  const double spin_s = 0.3;
  CK(launch_spin(a, buf.va, spin_s, kSpinMarker));  // A is mid-kernel when B faults
  CK(cuCtxSetCurrent(b.ctx));
  const double t0 = now_s();
  const CUresult bl = launch_rw(b, target, 1);
  const CUresult bs = cuStreamSynchronize(b.s);
  const double t1 = now_s();
  const CUresult bs2 = cuCtxSynchronize();
  const CUresult bl2 = launch_empty(b.k, b.s);
  row("2", setting + "error the faulting tenant B gets", cu(bs),
      fmt("launch %s; cuStreamSynchronize returned after %.1f ms; then in B: cuCtxSynchronize %s, a new launch %s",
          cu(bl).c_str(), (t1 - t0) * 1e3, cu(bs2).c_str(), cu(bl2).c_str()));
  // Tenant A. Its kernel should still be running (CUDA_ERROR_NOT_READY): the fault came while it was in flight.
  CK(cuCtxSetCurrent(a.ctx));
  const CUresult aq = cuStreamQuery(a.s);
  const CUresult as = cuStreamSynchronize(a.s);
  unsigned w[4] = {0, 0, 0, 0};
  const CUresult ap = peek(buf.va, w);
  const RwCheck after = rw_check(a, buf.va, 0x2222);
  const bool a_ok = as == CUDA_SUCCESS && ap == CUDA_SUCCESS && w[2] == kSpinMarker && after.ok;
  row("2", setting + "tenant A after B's fault", a_ok ? "A unaffected" : "A broken",
      fmt("A's kernel (%.0f ms spin; at B's error its stream query said %s): sync %s, its marker %s (read-back %s); a new "
          "kernel in A: %s",
          spin_s * 1e3, cu(aq).c_str(), cu(as).c_str(), w[2] == kSpinMarker ? "written" : "missing", cu(ap).c_str(),
          after.text().c_str()));
  if (!primary) {
    // Can the daemon give B a fresh context in the same process?
    const CUresult d = cuCtxDestroy(b.ctx);
    Client b2;
    const CUresult o = open_client(&b2, dev, false);
    std::string ev = fmt("cuCtxDestroy(B) %s, new context %s", cu(d).c_str(), cu(o).c_str());
    bool ok = false;
    if (o == CUDA_SUCCESS) {
      VmmBuf nb;
      const CUresult m = vmm_alloc(&nb, dev, 1, 0, false);
      if (m == CUDA_SUCCESS) {
        const RwCheck c = rw_check(b2, nb.va, 0x3333);
        ok = c.ok;
        ev += ", kernel on new memory: " + c.text();
      } else {
        ev += ", new memory: " + cu(m);
      }
    }
    row("2", setting + "B's session rebuilt in the same process (destroy + new context)", ok ? "yes" : "no", ev);
    return 0;
  }
  // Primary context: can the other tenants' memory be saved (read from a fresh context), and does a reset
  // of the primary context keep VMM mappings?
  CUcontext c = nullptr;
  const CUresult cr = make_ctx(&c, dev);
  std::string ev = "new context after the fault: " + cu(cr);
  bool salvage = false;
  if (cr == CUDA_SUCCESS) {
    unsigned x[4] = {0, 0, 0, 0};
    const CUresult r = peek(buf.va, x);
    salvage = r == CUDA_SUCCESS && x[2] == kSpinMarker;
    ev += fmt("; reading A's VMM memory from it: %s, words 0x%x 0x%x 0x%x", cu(r).c_str(), x[0], x[1], x[2]);
    Client cc;
    cc.ctx = c;
    if (load_kernels(&cc.k) == CUDA_SUCCESS && cuStreamCreate(&cc.s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS)
      ev += "; a kernel there on A's VMM memory: " + rw_check(cc, buf.va, 0x4444).text();
  }
  row("2", setting + "A's VMM memory read from a fresh context after the fault (salvage for a checkpoint)",
      salvage ? "yes" : "no", ev);
  CK(cuCtxSetCurrent(nullptr));
  const CUresult rel = cuDevicePrimaryCtxRelease(dev);
  const CUresult rst = cuDevicePrimaryCtxReset(dev);
  Client p2;
  const CUresult o = open_client(&p2, dev, true);
  ev = fmt("release %s, cuDevicePrimaryCtxReset %s, retain+module %s", cu(rel).c_str(), cu(rst).c_str(), cu(o).c_str());
  bool kept = false;
  if (o == CUDA_SUCCESS) {
    unsigned x[4] = {0, 0, 0, 0};
    const CUresult r = peek(buf.va, x);
    kept = r == CUDA_SUCCESS && x[2] == kSpinMarker;
    ev += fmt("; A's VMM memory after the reset: %s, words 0x%x 0x%x 0x%x; a kernel on it: %s", cu(r).c_str(), x[0],
              x[1], x[2], rw_check(p2, buf.va, 0x5555).text().c_str());
  }
  row("2", setting + "cuDevicePrimaryCtxReset after the fault: context usable again, VMM mappings kept?",
      o != CUDA_SUCCESS ? "context not usable" : kept ? "usable, mappings kept" : "usable, mappings lost", ev);
  return 0;
}

// 3. Two processes. P1 owns memory at posd's VA and has a kernel in flight; P2 (xproc-fault) launches at P1's
// address; then P2 (xproc-import) receives a VMM allocation of P1 as a file descriptor.
struct Handoff {
  uint64_t bytes;
  uint64_t va;
  double t_export;  // P1's clock (CLOCK_MONOTONIC) just before cuMemExportToShareableHandle
};

int mode_xproc(size_t export_bytes) {
  begin("3", "two processes: P1 owns memory; P2 faults at it, then imports it");
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client p1;
  CK(open_client(&p1, dev, true));
  const int fd_ok = attr(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  VmmBuf small;
  CK(vmm_alloc(&small, dev, 1, kVaBase, fd_ok == 1));
  CK(seed(small.va, 0x1111));
  CK(cuCtxSynchronize());
  const double spin_s = 2.0;  // covers P2's start-up and fault; checked below
  CK(launch_spin(p1, small.va, spin_s, kSpinMarker));
  Spawn sp;
  sp.args = {g_self, "--mode", "xproc-fault", "--va", hex(small.va)};
  for (const auto& a : passthrough()) sp.args.push_back(a);
  const Child f = start(sp);
  End fe;
  if (f.pid > 0) fe = wait_child(f.pid, now_s() + 60, false);
  const CUresult q = cuStreamQuery(p1.s);  // CUDA_ERROR_NOT_READY: P1's kernel outlived P2's fault
  const CUresult s = cuStreamSynchronize(p1.s);
  unsigned w[4] = {0, 0, 0, 0};
  const CUresult pk = peek(small.va, w);
  const RwCheck after = rw_check(p1, small.va, 0x2222);
  const bool ok = s == CUDA_SUCCESS && pk == CUDA_SUCCESS && w[2] == kSpinMarker && after.ok;
  row("3", "P1 after P2's fault", ok ? "P1 unaffected" : "P1 broken",
      fmt("P1's kernel (%.0f ms spin; when P2 had exited its stream query said %s): sync %s, marker %s; a new kernel in "
          "P1: %s; P2 %s",
          spin_s * 1e3, cu(q).c_str(), cu(s).c_str(), w[2] == kSpinMarker ? "written" : "missing", after.text().c_str(),
          f.pid > 0 ? fe.text().c_str() : "did not start"));
  // The broker's hand-over: export a VMM allocation as a POSIX fd, pass it over a Unix socket.
  begin("3", "two processes: VMM allocation exported to P2 as a POSIX fd");
  if (fd_ok != 1) {
    row("3", "VMM allocation shared with P2 (cuMemExportToShareableHandle, POSIX fd)", "not supported",
        fmt("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = %d", fd_ok));
    return 0;
  }
  VmmBuf big;
  CK(vmm_alloc(&big, dev, export_bytes, kVaBase + (64ull << 30), true));
  CK(cuMemsetD32(big.va, 0xA5A5A5A5u, big.size / 4));
  const unsigned head = 0x1234, tail = 0x5678;
  CK(cuMemcpyHtoD(big.va, &head, 4));
  CK(cuMemcpyHtoD(big.va + big.size - 4, &tail, 4));
  CK(cuCtxSynchronize());
  int sv[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    row("3", "VMM allocation shared with P2", "not measured", std::string("socketpair: ") + std::strerror(errno));
    return 1;
  }
  fcntl(sv[0], F_SETFD, FD_CLOEXEC);
  Spawn ip;
  ip.args = {g_self, "--mode", "xproc-import", "--sock", fmt("%d", sv[1]), "--read-bytes",
             fmt("%zu", g_quick ? std::min<size_t>(big.size, 256ull << 20) : big.size)};
  for (const auto& a : passthrough()) ip.args.push_back(a);
  ip.keep_fd = sv[1];
  const Child imp = start(ip);
  close(sv[1]);
  if (imp.pid < 0) {
    row("3", "VMM allocation shared with P2", "not measured", "could not start P2");
    return 1;
  }
  char b = 0;
  std::string ev;
  CUresult er = CUDA_ERROR_UNKNOWN;
  if (!read_byte(sv[0], &b, now_s() + 60)) {
    ev = "P2 never became ready";
  } else {
    Handoff h{big.size, big.va, now_s()};
    int fd = -1;
    er = cuMemExportToShareableHandle(&fd, big.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    const double t1 = now_s();
    ev = fmt("cuMemExportToShareableHandle %s in %.3f ms for %zu MiB", cu(er).c_str(), (t1 - h.t_export) * 1e3,
             big.size >> 20);
    row("3", "P1 exports a VMM allocation as a POSIX fd (sent to P2 over a Unix socket, SCM_RIGHTS)", cu(er), ev);
    ev.clear();
    if (er == CUDA_SUCCESS) {
      const bool sent = send_fd(sv[0], fd, &h, sizeof h);
      close(fd);
      if (!sent) ev += std::string("; sendmsg: ") + std::strerror(errno);
      else if (!read_byte(sv[0], &b, now_s() + 120)) ev += "; P2 did not finish";
      else {
        unsigned x[2] = {0, 0};
        const CUresult r = cuMemcpyDtoH(x, big.va + 16, sizeof x);
        const bool seen = r == CUDA_SUCCESS && x[0] == 0xA5A5A5A6u && x[1] == 0xA5A5A5A5u;
        row("3", "P2's kernel writes through the imported mapping; P1 sees them", seen ? "yes" : "no",
            fmt("P1 reads words 4,5: %s 0x%x 0x%x (expected 0xa5a5a5a6 0xa5a5a5a5)", cu(r).c_str(), x[0], x[1]));
      }
    }
  }
  const End ie = wait_child(imp.pid, now_s() + 120, false);
  if (!ev.empty() || !ie.clean()) row("3", "P2 importing P1's allocation", "failed", ev + (ev.empty() ? "" : "; ") + "P2 " + ie.text());
  return 0;
}

int mode_xproc_fault(uint64_t va) {
  begin("3", "P2 launches at P1's device address");
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client p2;
  CK(open_client(&p2, dev, true));
  CUcontext owner = nullptr;
  const CUresult pa = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, va);
  const CUresult l = launch_rw(p2, va, 1);
  const CUresult s = cuStreamSynchronize(p2.s);
  row("3", "P2's kernel at P1's device address " + hex(va),
      s == CUDA_SUCCESS ? "reached it (no fault)" : "cannot: " + cu(s) + " in P2",
      fmt("the address in P2's driver: cuPointerGetAttribute %s; launch %s, sync %s", cu(pa).c_str(), cu(l).c_str(),
          cu(s).c_str()));
  return 0;
}

int mode_xproc_import(int sock, size_t read_bytes) {
  begin("3", "P2 imports P1's VMM allocation");
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client p2;
  CK(open_client(&p2, dev, true));
  void* host = nullptr;
  CK(cuMemHostAlloc(&host, read_bytes, 0));  // the drainer's pinned landing zone, made before the clock starts
  if (write(sock, "R", 1) != 1) return 1;
  Handoff h{};
  int fd = -1;
  if (!recv_fd(sock, &fd, &h, sizeof h, now_s() + 60)) {
    row("3", "P2 imports P1's memory", "not measured", "no descriptor arrived");
    return 1;
  }
  const double t0 = now_s();
  CUmemGenericAllocationHandle mh = 0;
  const CUresult ri =
      cuMemImportFromShareableHandle(&mh, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  const double t1 = now_s();
  CUdeviceptr va = 0;
  const CUresult rr = ri == CUDA_SUCCESS ? cuMemAddressReserve(&va, h.bytes, 0, h.va, 0) : ri;
  const double t2 = now_s();
  const CUresult rm = rr == CUDA_SUCCESS ? cuMemMap(va, h.bytes, 0, mh, 0) : rr;
  const double t3 = now_s();
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult ra = rm == CUDA_SUCCESS ? cuMemSetAccess(va, h.bytes, &a, 1) : rm;
  const double t4 = now_s();
  close(fd);
  bool data_ok = false;
  std::string check;
  if (ra == CUDA_SUCCESS) {
    unsigned x[3] = {0, 0, 0};
    const CUresult c0 = cuMemcpyDtoH(&x[0], va, 4);
    const CUresult c1 = cuMemcpyDtoH(&x[1], va + h.bytes / 2, 4);
    const CUresult c2 = cuMemcpyDtoH(&x[2], va + h.bytes - 4, 4);
    data_ok = c0 == CUDA_SUCCESS && c1 == CUDA_SUCCESS && c2 == CUDA_SUCCESS && x[0] == 0x1234 &&
              x[1] == 0xA5A5A5A5u && x[2] == 0x5678;
    check = fmt("; P1's bytes as P2 reads them (head, middle, tail): 0x%x 0x%x 0x%x", x[0], x[1], x[2]);
  }
  row("3", "P2 imports P1's allocation from the fd and maps it", data_ok ? "works" : "fails: " + cu(ra),
      fmt("import %.3f ms, reserve %.3f ms (at P1's VA %s: %s), map %.3f ms, setAccess %.3f ms; end to end from P1's "
          "export to a usable mapping: %.3f ms for %llu MiB",
          (t1 - t0) * 1e3, (t2 - t1) * 1e3, hex(h.va).c_str(), va == h.va ? "yes" : "no", (t3 - t2) * 1e3,
          (t4 - t3) * 1e3, (t4 - h.t_export) * 1e3, static_cast<unsigned long long>(h.bytes >> 20)) +
          check);
  if (ra == CUDA_SUCCESS) {
    const CUresult l = launch_rw(p2, va + 16, 1);  // P1 checks words 4,5 afterwards
    const CUresult s = cuStreamSynchronize(p2.s);
    const double d0 = now_s();
    const CUresult c = cuMemcpyDtoH(host, va, read_bytes);
    const double d1 = now_s();
    row("3", "P2 reads the imported memory to pinned host memory (a drainer in another process)",
        c == CUDA_SUCCESS ? fmt("%.1f GB/s", static_cast<double>(read_bytes) / (d1 - d0) / 1e9) : cu(c),
        fmt("%zu MiB cuMemcpyDtoH in %.1f ms; P2's kernel write: launch %s, sync %s", read_bytes >> 20, (d1 - d0) * 1e3,
            cu(l).c_str(), cu(s).c_str()));
  }
  if (write(sock, "D", 1) != 1) return 1;
  return 0;
}

// 4a. Device memory an extra context costs, in this process and as another process.
int mode_mem() {
  begin("4a", "memory of an extra context");
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client p;
  CK(open_client(&p, dev, true));
  size_t f[6] = {}, total = 0;
  CK(cuMemGetInfo(&f[0], &total));
  CK(launch_empty(p.k, p.s));
  CK(cuStreamSynchronize(p.s));
  CK(cuMemGetInfo(&f[1], &total));
  const double t0 = now_s();
  CUcontext b = nullptr;
  CK(make_ctx(&b, dev));
  const double t1 = now_s();
  CK(cuMemGetInfo(&f[2], &total));
  Client bc;
  bc.ctx = b;
  CK(load_kernels(&bc.k));
  CK(cuStreamCreate(&bc.s, CU_STREAM_NON_BLOCKING));
  CK(launch_empty(bc.k, bc.s));
  CK(cuStreamSynchronize(bc.s));
  const double t2 = now_s();
  CK(cuMemGetInfo(&f[3], &total));
  Client cc;
  CK(open_client(&cc, dev, false));
  CK(launch_empty(cc.k, cc.s));
  CK(cuStreamSynchronize(cc.s));
  CK(cuMemGetInfo(&f[4], &total));
  auto mib = [](size_t before, size_t after) { return (static_cast<double>(before) - static_cast<double>(after)) / (1 << 20); };
  row("4a", "extra context in the same process (cuCtxCreate + module + stream + first launch)",
      fmt("%.0f MiB", mib(f[1], f[3])),
      fmt("cuCtxCreate alone %.0f MiB in %.1f ms, module+stream+launch %.1f ms; a third context %.0f MiB; the "
          "primary context's module+first launch %.0f MiB",
          mib(f[1], f[2]), (t1 - t0) * 1e3, (t2 - t1) * 1e3, mib(f[3], f[4]), mib(f[0], f[1])));
  Spawn sp;
  sp.args = {g_self, "--mode", "hold"};
  sp.capture_out = true;
  sp.pipe_in = true;
  const Child h = start(sp);
  if (h.pid < 0) return 1;
  LineReader lr{h.out, {}};
  std::string line;
  const int got = lr.next(&line, now_s() + 60);
  CK(cuMemGetInfo(&f[5], &total));
  close(h.in);  // the holder exits on end of file
  const End e = wait_child(h.pid, now_s() + 30, false);
  close(h.out);
  if (got != 1 || line.rfind("R ", 0) != 0) {
    row("4a", "extra process (its own context + module + stream + first launch)", "not measured",
        "holder: " + (got == 1 ? line : std::string("no answer")) + ", " + e.text());
    return 0;
  }
  row("4a", "extra process (its own context + module + stream + first launch)", fmt("%.0f MiB", mib(f[4], f[5])),
      fmt("cuInit + context + module + first launch in the new process: %s ms", line.substr(2).c_str()));
  return 0;
}

// A process that sets up a context, reports, and holds it until its stdin closes.
int mode_hold() {
  const double t0 = now_s();
  CUdevice dev = 0;
  Client c;
  CUresult r = init_dev(&dev);
  if (r == CUDA_SUCCESS) r = open_client(&c, dev, true);
  if (r == CUDA_SUCCESS) r = launch_empty(c.k, c.s);
  if (r == CUDA_SUCCESS) r = cuStreamSynchronize(c.s);
  if (r != CUDA_SUCCESS) {
    std::printf("E %s %s\n", g_failed_call.c_str(), cu(r).c_str());
    return 1;
  }
  std::printf("R %.0f\n", (now_s() - t0) * 1e3);
  std::fflush(stdout);
  char b = 0;
  while (read(0, &b, 1) > 0) {
  }
  return 0;
}

// 4b. Launch cost: one context; two streams of it from one thread; two contexts from one thread (switching
// with cuCtxSetCurrent, as a one-thread daemon would); two threads in one context; two threads each with
// its own context.
int mode_launch(int n, int rtt_n) {
  begin("4b", "launch latency");
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client a, b;
  CK(open_client(&a, dev, false));
  CUstream a2 = nullptr;
  CK(cuStreamCreate(&a2, CU_STREAM_NON_BLOCKING));
  CK(open_client(&b, dev, false));
  for (const Client* c : {&a, &b}) {
    CK(cuCtxSetCurrent(c->ctx));
    for (int i = 0; i < 1000; ++i) CK(launch_empty(c->k, c->s));
    CK(cuStreamSynchronize(c->s));
  }
  auto report = [&](const std::string& what, double submit, double total, int launches, const std::string& extra) {
    row("4b", what, fmt("%.2f µs/launch", total / launches * 1e6),
        fmt("%d empty launches; submitting %.2f µs each, to completion %.2f µs each%s", launches, submit / launches * 1e6,
            total / launches * 1e6, extra.c_str()));
  };
  {  // one context, one stream
    CK(cuCtxSetCurrent(a.ctx));
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) CK(launch_empty(a.k, a.s));
    const double t1 = now_s();
    CK(cuStreamSynchronize(a.s));
    report("one context, one stream, one thread", t1 - t0, now_s() - t0, n, "");
  }
  {  // one context, two streams alternating (posd today, were one thread to serve two clients)
    CK(cuCtxSetCurrent(a.ctx));
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) CK(launch_empty(a.k, (i & 1) != 0 ? a2 : a.s));
    const double t1 = now_s();
    CK(cuStreamSynchronize(a.s));
    CK(cuStreamSynchronize(a2));
    report("one context, two streams alternating, one thread", t1 - t0, now_s() - t0, n, "");
  }
  {  // two contexts alternating from one thread
    double set_s = 0;
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
      const Client& c = (i & 1) != 0 ? b : a;
      CK(cuCtxSetCurrent(c.ctx));
      CK(launch_empty(c.k, c.s));
    }
    const double t1 = now_s();
    CK(cuCtxSetCurrent(a.ctx));
    CK(cuStreamSynchronize(a.s));
    CK(cuCtxSetCurrent(b.ctx));
    CK(cuStreamSynchronize(b.s));
    const double t2 = now_s();
    const double s0 = now_s();
    for (int i = 0; i < n; ++i) CK(cuCtxSetCurrent((i & 1) != 0 ? b.ctx : a.ctx));
    set_s = now_s() - s0;
    report("two contexts alternating, one thread (cuCtxSetCurrent before each launch)", t1 - t0, t2 - t0, n,
           fmt("; cuCtxSetCurrent alone %.3f µs", set_s / n * 1e6));
  }
  // Two threads launching at once: in one context (own streams), and each in its own context.
  auto threaded = [&](bool own, double* wall, double per[2], CUresult* err) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    CUresult res[2] = {CUDA_SUCCESS, CUDA_SUCCESS};
    double end[2] = {0, 0};
    double start = 0;
    std::vector<std::thread> th;
    for (int t = 0; t < 2; ++t) {
      th.emplace_back([&, t] {
        const Client& c = (own && t == 1) ? b : a;
        const CUstream s = (!own && t == 1) ? a2 : c.s;
        CUresult r = cuCtxSetCurrent(c.ctx);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        for (int i = 0; i < n && r == CUDA_SUCCESS; ++i) r = launch_empty(c.k, s);
        if (r == CUDA_SUCCESS) r = cuStreamSynchronize(s);
        end[t] = now_s();
        res[t] = r;
      });
    }
    while (ready.load() < 2) {
    }
    start = now_s();
    go.store(true, std::memory_order_release);
    for (auto& x : th) x.join();
    *wall = std::max(end[0], end[1]) - start;
    per[0] = end[0] - start, per[1] = end[1] - start;
    *err = res[0] != CUDA_SUCCESS ? res[0] : res[1];
  };
  for (const bool own : {false, true}) {
    double wall = 0, per[2] = {0, 0};
    CUresult err = CUDA_SUCCESS;
    threaded(own, &wall, per, &err);
    const std::string what = own ? "two threads, each its own context, launching at once"
                                 : "two threads, one context (own streams), launching at once";
    if (err != CUDA_SUCCESS) {
      row("4b", what, "failed", cu(err));
      continue;
    }
    row("4b", what, fmt("%.2f µs/launch per thread", (per[0] + per[1]) / 2 / n * 1e6),
        fmt("%d launches per thread; threads done after %.1f and %.1f ms; %.2f M launches/s in all", n, per[0] * 1e3,
            per[1] * 1e3, 2.0 * n / wall / 1e6));
  }
  // Round trip: launch and wait, one at a time (a synchronous step of a small job).
  {
    CK(cuCtxSetCurrent(a.ctx));
    const double t0 = now_s();
    for (int i = 0; i < rtt_n; ++i) {
      CK(launch_empty(a.k, a.s));
      CK(cuStreamSynchronize(a.s));
    }
    const double one = (now_s() - t0) / rtt_n;
    const double t1 = now_s();
    for (int i = 0; i < rtt_n; ++i) {
      const Client& c = (i & 1) != 0 ? b : a;
      CK(cuCtxSetCurrent(c.ctx));
      CK(launch_empty(c.k, c.s));
      CK(cuStreamSynchronize(c.s));
    }
    const double two = (now_s() - t1) / rtt_n;
    row("4b", "launch + synchronize round trip: one context vs two alternating", fmt("%.2f vs %.2f µs", one * 1e6, two * 1e6),
        fmt("%d round trips each; the second switches context before each", rtt_n));
  }
  return 0;
}

// The compute kernel's shape for 4c, from calibration.
struct Shape {
  std::string name;
  int iters = 0, blocks = 0, threads = 0;
  double us = 0;
};

int mode_calibrate(double target_us) {
  begin("4c", "compute kernel calibration");
  CUdevice dev = 0;
  CK(init_dev(&dev));
  Client c;
  CK(open_client(&c, dev, true));
  CUdeviceptr out = 0;
  CK(cuMemAlloc(&out, 1 << 20));
  CUevent e0 = nullptr, e1 = nullptr;
  CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  int per_sm = 0;
  CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c.k.compute, 256, 0));
  const int sms = attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  std::vector<Shape> shapes(2);
  shapes[0] = {"small", 2000, 4, 128, 0};                          // leaves most SMs idle: room to overlap
  shapes[1] = {"full", 2000, std::max(1, sms * per_sm), 256, 0};  // every SM at full occupancy
  std::string ev;
  for (Shape& s : shapes) {
    for (int round = 0; round < 5; ++round) {
      constexpr int kReps = 50;
      CK(launch_compute(c.k, c.s, out, s.iters, s.blocks, s.threads));  // warm
      CK(cuEventRecord(e0, c.s));
      for (int i = 0; i < kReps; ++i) CK(launch_compute(c.k, c.s, out, s.iters, s.blocks, s.threads));
      CK(cuEventRecord(e1, c.s));
      CK(cuEventSynchronize(e1));
      float ms = 0;
      CK(cuEventElapsedTime(&ms, e0, e1));
      s.us = ms * 1e3 / kReps;
      if (round < 4) s.iters = std::max(16, static_cast<int>(s.iters * target_us / std::max(0.5, s.us)));
    }
    info(("cal_" + s.name).c_str(), fmt("%d %d %d %.2f", s.iters, s.blocks, s.threads, s.us));
    ev += fmt("%s%s: %d×%d threads, %d FMAs each, %.1f µs", ev.empty() ? "" : "; ", s.name.c_str(), s.blocks, s.threads,
              s.iters, s.us);
  }
  row("4c", "compute kernel (calibrated alone, back to back)", fmt("~%.0f µs per kernel", target_us), ev);
  return 0;
}

// 4c. N tenants as threads of one process: in one (primary) context each with its own stream, as posd does
// today, or each in its own context.
int mode_tput_threads(bool own, int n, const Shape& sh, int launches) {
  const std::string what = fmt("%d tenant%s as threads, %s, %s kernel", n, n > 1 ? "s" : "",
                               own ? "each its own context" : "one shared context", sh.name.c_str());
  begin("4c", what);
  CUdevice dev = 0;
  CK(init_dev(&dev));
  std::vector<Client> cl(static_cast<size_t>(n));
  std::vector<CUdeviceptr> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Client& c = cl[static_cast<size_t>(i)];
    if (own || i == 0) {
      CK(open_client(&c, dev, !own));
    } else {
      c.ctx = cl[0].ctx;
      c.k = cl[0].k;
      CK(cuCtxSetCurrent(c.ctx));
      CK(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
    }
    CK(cuMemAlloc(&out[static_cast<size_t>(i)], 1 << 16));
    for (int w = 0; w < 10; ++w) CK(launch_compute(c.k, c.s, out[static_cast<size_t>(i)], sh.iters, sh.blocks, sh.threads));
    CK(cuStreamSynchronize(c.s));
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> end(static_cast<size_t>(n), 0);
  std::vector<CUresult> res(static_cast<size_t>(n), CUDA_SUCCESS);
  std::vector<std::thread> th;
  for (int t = 0; t < n; ++t) {
    th.emplace_back([&, t] {
      const Client& c = cl[static_cast<size_t>(t)];
      CUresult r = cuCtxSetCurrent(c.ctx);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      for (int i = 0; i < launches && r == CUDA_SUCCESS; ++i)
        r = launch_compute(c.k, c.s, out[static_cast<size_t>(t)], sh.iters, sh.blocks, sh.threads);
      if (r == CUDA_SUCCESS) r = cuStreamSynchronize(c.s);
      end[static_cast<size_t>(t)] = now_s();
      res[static_cast<size_t>(t)] = r;
    });
  }
  while (ready.load() < n) {
  }
  const double start = now_s();
  go.store(true, std::memory_order_release);
  for (auto& x : th) x.join();
  for (const CUresult r : res)
    if (r != CUDA_SUCCESS) {
      row("4c", what, "failed", cu(r));
      return 1;
    }
  std::vector<double> per;
  for (double e : end) per.push_back(e - start);
  const double wall = *std::max_element(per.begin(), per.end());
  std::string ms;
  double rate = 0;
  for (double p : per) ms += fmt(" %.1f", p * 1e3), rate += launches / p;
  row("4c", what, fmt("%.1f ms; %.1f k kernels/s in all, %.1f k/s per tenant", wall * 1e3, n * launches / wall / 1e3, rate / n / 1e3),
      fmt("%d kernels of %.1f µs each per tenant; tenants done after (ms)%s", launches, sh.us, ms.c_str()));
  return 0;
}

// 4c/4d. N tenants as processes (each its own context), started together: the coordinator (no CUDA) starts
// the workers, waits until each is set up, then tells all to go.
int mode_tput_procs(int n, const Shape& sh, int launches) {
  const std::string what = fmt("%d tenant%s as processes, %s kernel", n, n > 1 ? "s" : "", sh.name.c_str());
  begin("4c", what);
  std::vector<Child> ch;
  std::vector<LineReader> rd;
  for (int i = 0; i < n; ++i) {
    Spawn sp;
    sp.args = {g_self, "--mode", "tput-worker", "--shape", fmt("%d,%d,%d", sh.iters, sh.blocks, sh.threads),
               "--launches", fmt("%d", launches)};
    sp.capture_out = true;
    sp.pipe_in = true;
    const Child c = start(sp);
    if (c.pid < 0) {
      row("4c", what, "not measured", "could not start a worker");
      return 1;
    }
    ch.push_back(c);
    rd.push_back(LineReader{c.out, {}});
  }
  std::string err;
  auto finish = [&](const std::string& result, const std::string& ev) {
    for (const Child& c : ch) {
      close(c.in);
      wait_child(c.pid, now_s() + 10, false);
      close(c.out);
    }
    row("4c", what, result, ev);
    return result == "failed" ? 1 : 0;
  };
  for (int i = 0; i < n; ++i) {
    std::string line;
    if (rd[static_cast<size_t>(i)].next(&line, now_s() + 60) != 1 || line != "R")
      return finish("failed", fmt("worker %d at set-up: %s", i, line.empty() ? "no answer" : line.c_str()));
  }
  const double start = now_s();
  for (const Child& c : ch)
    if (write(c.in, "G", 1) != 1) return finish("failed", "could not start a worker's loop");
  std::vector<double> per;
  for (int i = 0; i < n; ++i) {
    std::string line;
    if (rd[static_cast<size_t>(i)].next(&line, now_s() + 60) != 1 || line.rfind("D ", 0) != 0)
      return finish("failed", fmt("worker %d: %s", i, line.empty() ? "no answer" : line.c_str()));
    double t1 = 0;
    if (std::sscanf(line.c_str(), "D %lf", &t1) != 1) return finish("failed", "worker said: " + line);
    per.push_back(t1 - start);
  }
  const double wall = *std::max_element(per.begin(), per.end());
  std::string ms;
  double rate = 0;
  for (double p : per) ms += fmt(" %.1f", p * 1e3), rate += launches / p;
  return finish(fmt("%.1f ms; %.1f k kernels/s in all, %.1f k/s per tenant", wall * 1e3, n * launches / wall / 1e3, rate / n / 1e3),
                fmt("%d kernels of %.1f µs each per tenant; tenants done after (ms)%s", launches, sh.us, ms.c_str()));
}

int mode_tput_worker(const Shape& sh, int launches) {
  CUdevice dev = 0;
  Client c;
  CUdeviceptr out = 0;
  CUresult r = init_dev(&dev);
  if (r == CUDA_SUCCESS) r = open_client(&c, dev, true);
  if (r == CUDA_SUCCESS) r = cuMemAlloc(&out, 1 << 16);
  for (int w = 0; w < 10 && r == CUDA_SUCCESS; ++w) r = launch_compute(c.k, c.s, out, sh.iters, sh.blocks, sh.threads);
  if (r == CUDA_SUCCESS) r = cuStreamSynchronize(c.s);
  if (r != CUDA_SUCCESS) {
    std::printf("E set-up: %s %s\n", g_failed_call.c_str(), cu(r).c_str());
    return 1;
  }
  std::printf("R\n");
  std::fflush(stdout);
  char b = 0;
  if (read(0, &b, 1) != 1) return 1;
  for (int i = 0; i < launches && r == CUDA_SUCCESS; ++i)
    r = launch_compute(c.k, c.s, out, sh.iters, sh.blocks, sh.threads);
  if (r == CUDA_SUCCESS) r = cuStreamSynchronize(c.s);
  const double t1 = now_s();
  if (r != CUDA_SUCCESS) std::printf("E %s\n", cu(r).c_str());
  else std::printf("D %.9f\n", t1);
  std::fflush(stdout);
  return r == CUDA_SUCCESS ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------------------
// The orchestrator: never touches CUDA; runs every experiment as a child with a timeout and prints the table.

struct Row {
  std::string section, finding, result, evidence;
};
std::vector<Row> g_rows;
std::map<std::string, std::string> g_info;
double g_t0 = 0;
double g_deadline = 0;  // optional steps (throughput, MPS) are skipped past this
double g_hard_end = 0;  // past this every step gets only kMinStepS, so hangs cannot stretch the run much
volatile pid_t g_current_group = 0;  // the child being waited for, killed if we are interrupted
volatile pid_t g_mps_pid = 0;        // our MPS control daemon, stopped if we are interrupted

void add_row(const std::string& s, const std::string& f, const std::string& r, const std::string& e) {
  g_rows.push_back({clean(s), clean(f), clean(r), clean(e)});
}

bool time_left() { return now_s() < g_deadline; }

constexpr double kMinStepS = 10;
double step_timeout(double want) { return std::max(kMinStepS, std::min(want, g_hard_end - now_s())); }

// Runs `this --mode ...` with a timeout; its ROW lines join the table, its INFO lines g_info (prefixed).
bool run_child(const std::vector<std::string>& mode_args, double timeout_s, const std::string& section,
               const std::string& what, const std::vector<std::string>& env = {}, const std::string& info_prefix = "") {
  Spawn sp;
  sp.args = {g_self};
  sp.args.insert(sp.args.end(), mode_args.begin(), mode_args.end());
  if (g_quick) sp.args.push_back("--quick");
  sp.env = env;
  sp.capture_out = true;
  sp.own_group = true;
  std::string cmd;
  for (size_t i = 1; i < sp.args.size(); ++i) cmd += (i > 1 ? " " : "") + sp.args[i];
  std::fprintf(stderr, "isolation_probe: [%5.1f s] %s\n", now_s() - g_t0, cmd.c_str());
  const Child c = start(sp);
  if (c.pid < 0) {
    add_row(section, what, "not measured", "could not start: " + cmd);
    return false;
  }
  g_current_group = c.pid;
  timeout_s = step_timeout(timeout_s);
  const double deadline = now_s() + timeout_s;
  LineReader lr{c.out, {}};
  std::string line;
  const size_t rows_before = g_rows.size();
  int r = 0;
  while ((r = lr.next(&line, deadline)) == 1) {
    const auto f = split(line, '\t');
    if (f[0] == "ROW" && f.size() == 5) add_row(f[1], f[2], f[3], f[4]);
    else if (f[0] == "INFO" && f.size() == 3) g_info[info_prefix + f[1]] = f[2];
    else std::fprintf(stderr, "  | %s\n", line.c_str());
  }
  const End e = wait_child(c.pid, r == -1 ? now_s() : deadline, true);
  g_current_group = 0;
  close(c.out);
  if (!e.clean() && (e.timed_out || e.sig != 0 || g_rows.size() == rows_before))
    add_row(section, what, e.timed_out ? fmt("hung: killed after %.0f s", timeout_s) : "child " + e.text(),
            "`" + cmd + "`" + (g_rows.size() > rows_before ? "; the rows above came before it ended" : ""));
  return e.clean();
}

std::string first_line(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return "";
  char buf[512] = {};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string s = ok ? buf : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<Shape> g_shapes;

void parse_shapes(const std::string& prefix) {
  g_shapes.clear();
  for (const char* name : {"small", "full"}) {
    Shape s;
    s.name = name;
    const auto it = g_info.find(prefix + "cal_" + name);
    if (it == g_info.end() ||
        std::sscanf(it->second.c_str(), "%d %d %d %lf", &s.iters, &s.blocks, &s.threads, &s.us) != 4)
      continue;
    if (g_quick && s.name == "full") continue;
    g_shapes.push_back(s);
  }
}

std::vector<std::string> shape_args(const Shape& s) {
  return {"--shape", fmt("%d,%d,%d", s.iters, s.blocks, s.threads), "--shape-name", s.name, "--shape-us", fmt("%.2f", s.us)};
}

int tput_launches() { return g_quick ? 500 : 2000; }

void run_tput_procs(const std::string& section, const std::vector<std::string>& env, const std::string& tag) {
  for (const Shape& s : g_shapes)
    for (int n : {1, 2, 4}) {
      if (!time_left()) {
        add_row(section, tag + fmt("%d tenants as processes, %s kernel", n, s.name.c_str()), "skipped", "time budget spent");
        continue;
      }
      std::vector<std::string> a = {"--mode", "tput-procs", "--n", fmt("%d", n), "--launches", fmt("%d", tput_launches())};
      for (const auto& x : shape_args(s)) a.push_back(x);
      if (!tag.empty()) a.insert(a.end(), {"--section", section, "--tag", tag});
      run_child(a, 30, section, tag + fmt("%d tenants as processes, %s kernel", n, s.name.c_str()), env);
    }
}

// MPS: a private control daemon (its pipe and log directories under /tmp), the clients pointed at it by
// environment; stopped with `quit` at the end whatever happened, and killed by pid if it will not go.
std::string find_mps_control() {
  std::vector<std::string> dirs;
  if (const char* p = std::getenv("PATH")) dirs = split(p, ':');
  for (const char* d : {"/usr/bin", "/usr/local/cuda/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/nvidia/bin"})
    dirs.push_back(d);
  for (const auto& d : dirs) {
    if (d.empty()) continue;
    const std::string p = d + "/nvidia-cuda-mps-control";
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs the control program with one command on stdin; its answer, or "" after the timeout.
std::string mps_command(const std::string& ctl, const std::vector<std::string>& env, const std::string& command,
                        double timeout_s, End* end) {
  Spawn sp;
  sp.exe = ctl;
  sp.args = {ctl};
  sp.env = env;
  sp.capture_out = true;
  sp.pipe_in = true;
  sp.own_group = true;
  const Child c = start(sp);
  if (c.pid < 0) return "";
  const std::string cmd = command + "\n";
  if (write(c.in, cmd.data(), cmd.size()) < 0) {
  }
  close(c.in);
  LineReader lr{c.out, {}};
  std::string line, out;
  const double deadline = now_s() + timeout_s;
  int r = 0;
  while ((r = lr.next(&line, deadline)) == 1) out += line + " ";
  *end = wait_child(c.pid, r == -1 ? now_s() : deadline, true);
  close(c.out);
  return out;
}

void remove_tree(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      const std::string p = dir + "/" + n;
      struct stat st{};
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
      else unlink(p.c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

void run_mps(bool no_mps) {
  const std::string ctl = find_mps_control();
  if (ctl.empty()) {
    add_row("4d", "MPS available?", "no",
            "nvidia-cuda-mps-control is not on PATH, nor in /usr/bin, /usr/local/cuda/bin, /usr/sbin, /usr/local/bin");
    return;
  }
  if (no_mps) {
    add_row("4d", "MPS available?", "found, not run (--no-mps)", ctl);
    return;
  }
  if (!time_left()) {
    add_row("4d", "MPS", "skipped", "time budget spent");
    return;
  }
  char tmpl[] = "/tmp/pos-mps-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    add_row("4d", "MPS", "not measured", std::string("mkdtemp: ") + std::strerror(errno));
    return;
  }
  const std::string dir = tmpl, pipe_dir = dir + "/pipe", log_dir = dir + "/log";
  mkdir(pipe_dir.c_str(), 0700);
  mkdir(log_dir.c_str(), 0700);
  const std::vector<std::string> env = {"CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir, "CUDA_MPS_LOG_DIRECTORY=" + log_dir};
  const int logfd = open((log_dir + "/control-stdout.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  Spawn sp;
  sp.exe = ctl;
  sp.args = {ctl, "-f"};  // foreground: it stays our child, so we can always stop it by pid
  sp.env = env;
  sp.out_file = logfd;
  sp.own_group = true;
  std::fprintf(stderr, "isolation_probe: [%5.1f s] starting %s -f (pipe dir %s)\n", now_s() - g_t0, ctl.c_str(),
               pipe_dir.c_str());
  const Child d = start(sp);
  if (logfd >= 0) close(logfd);
  if (d.pid < 0) {
    add_row("4d", "MPS daemon started without root (private pipe/log dirs)", "no", "could not start " + ctl);
    remove_tree(dir);
    return;
  }
  g_mps_pid = d.pid;
  bool up = false;
  int st = 0;
  bool died = false;
  for (double t = now_s() + 10; now_s() < t;) {
    struct stat s{};
    if (stat((pipe_dir + "/control").c_str(), &s) == 0) {
      up = true;
      break;
    }
    if (waitpid(d.pid, &st, WNOHANG) == d.pid) {
      died = true;
      break;
    }
    usleep(20000);
  }
  auto listing = [&] {
    std::string l;
    if (DIR* dd = opendir(pipe_dir.c_str())) {
      while (dirent* e = readdir(dd))
        if (e->d_name[0] != '.') l += std::string(" ") + e->d_name;
      closedir(dd);
    }
    return l.empty() ? std::string(" (empty)") : l;
  };
  if (died) {
    g_mps_pid = 0;
    add_row("4d", "MPS daemon started without root (private pipe/log dirs)", "no",
            "the control daemon exited (status " + fmt("%d", st) + "); its log: " +
                first_line((log_dir + "/control.log").c_str()) + " " + first_line((log_dir + "/control-stdout.log").c_str()));
    remove_tree(dir);
    return;
  }
  // Running but no socket named "control" seen: go on; the clients' MPS_ENABLED row shows whether they use it.
  add_row("4d", "MPS daemon started without root (private pipe/log dirs)", up ? "yes" : "running, no control socket seen",
          ctl + " -f, pipe dir " + pipe_dir + " holds:" + listing());
  // The clients: is MPS really in use, memory per client, throughput, then faults (last: a fault makes the
  // server refuse new clients until all the affected ones have exited).
  run_child({"--mode", "info", "--section", "4d", "--tag", "MPS: "}, 60, "4d", "MPS client set-up", env, "mps_");
  add_row("4d", "MPS: a client sees CU_DEVICE_ATTRIBUTE_MPS_ENABLED", g_info.count("mps_mps_enabled") != 0 ? g_info["mps_mps_enabled"] : "?",
          "cuInit + context + module + first launch as an MPS client: " +
              (g_info.count("mps_init_ms") != 0 ? g_info["mps_init_ms"] + " ms" : std::string("?")));
  if (time_left()) run_child({"--mode", "mem", "--section", "4d", "--tag", "MPS: "}, 45, "4d", "MPS: memory", env);
  run_tput_procs("4d", env, "MPS: ");
  End e;
  std::string servers = mps_command(ctl, env, "get_server_list", 10, &e);
  while (!servers.empty() && servers.back() == ' ') servers.pop_back();
  add_row("4d", "MPS servers that served the clients above (get_server_list)", servers.empty() ? "none" : "pid " + servers,
          "control answered: " + e.text());
  if (time_left())
    run_child({"--mode", "xproc", "--section", "4d", "--tag", "MPS: "}, 90, "4d", "MPS: two processes, fault and export",
              env);
  else
    add_row("4d", "MPS: fault containment", "skipped", "time budget spent");
  // Stop: quit, then the daemon's own exit; kill by pid only what we started and will not go.
  const std::string q = mps_command(ctl, env, "quit", 15, &e);
  const End de = wait_child(d.pid, now_s() + 15, true);
  g_mps_pid = 0;
  std::string left;
  for (const auto& s : split(servers, ' ')) {
    const int pid = std::atoi(s.c_str());
    if (pid <= 0) continue;
    const std::string comm = first_line(fmt("/proc/%d/comm", pid).c_str());
    if (comm.rfind("nvidia-cuda-mps", 0) == 0 && kill(pid, SIGKILL) == 0) left += fmt(" %d", pid);
  }
  add_row("4d", "MPS daemon stopped (`quit` to nvidia-cuda-mps-control)",
          !de.timed_out && left.empty() ? "yes" : "forced",
          "quit: " + e.text() + (q.empty() ? "" : " (" + q + ")") + "; control daemon " + de.text() +
              (left.empty() ? "" : "; servers killed by pid:" + left));
  remove_tree(dir);
}

void on_signal(int sig) {
  if (g_current_group > 0) kill(-g_current_group, SIGKILL);
  if (g_mps_pid > 0) kill(-g_mps_pid, SIGTERM);
  signal(sig, SIG_DFL);
  raise(sig);
}

int orchestrate(bool no_mps) {
  g_t0 = now_s();
  g_deadline = g_t0 + (g_quick ? 45 : 200);
  g_hard_end = g_t0 + (g_quick ? 75 : 240);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  std::fprintf(stderr, "isolation_probe: %s run; each step in its own process, with a timeout\n", g_quick ? "quick" : "full");
  run_child({"--mode", "info"}, 60, "0", "machine");
  // Costs first (their numbers must come from a clean GPU), then the experiments that fault.
  run_child({"--mode", "calibrate"}, 30, "4c", "compute kernel calibration");
  parse_shapes("");
  if (g_shapes.empty())
    add_row("4c", "throughput of concurrent tenants", "not measured", "no calibrated kernel (see the calibration row)");
  run_child({"--mode", "mem"}, 45, "4a", "memory of an extra context");
  run_child({"--mode", "launch", "--n", g_quick ? "20000" : "100000", "--rtt", g_quick ? "1000" : "5000"}, 60, "4b",
            "launch latency");
  for (const Shape& s : g_shapes)
    for (const bool own : {false, true})
      for (int n : {1, 2, 4}) {
        const std::string what = fmt("%d tenants as threads, %s, %s kernel", n, own ? "each its own context" : "one shared context", s.name.c_str());
        if (!time_left()) {
          add_row("4c", what, "skipped", "time budget spent");
          continue;
        }
        std::vector<std::string> a = {"--mode", "tput-threads", "--ctx", own ? "own" : "shared", "--n", fmt("%d", n),
                                      "--launches", fmt("%d", tput_launches())};
        for (const auto& x : shape_args(s)) a.push_back(x);
        run_child(a, 30, "4c", what);
      }
  run_tput_procs("4c", {}, "");
  for (const char* kind : {"vmm", "alloc", "host-portable", "host-plain", "host-pageable"})
    run_child({"--mode", "cross", "--kind", kind}, 30, "1", std::string("cross-context access: ") + kind);
  run_child({"--mode", "fault", "--where", "ctx", "--target", "null"}, 30, "2", "fault, own contexts, 0x10");
  run_child({"--mode", "fault", "--where", "ctx", "--target", "unmapped"}, 30, "2", "fault, own contexts, unmapped VA");
  run_child({"--mode", "fault", "--where", "primary", "--target", "null"}, 30, "2", "fault, primary context, 0x10");
  run_child({"--mode", "xproc"}, 90, "3", "two processes");
  run_mps(no_mps);
  // The report.
  std::printf("\n== bench/isolation_probe (%s run, %.0f s) ==\n", g_quick ? "quick" : "full", now_s() - g_t0);
  auto I = [](const char* k) { return g_info.count(k) != 0 ? g_info[k] : std::string("?"); };
  const std::string nvrm = first_line("/proc/driver/nvidia/version");
  std::printf("machine: %s (cc %s, %s SMs, %s GiB, %s GPU(s)); driver API %s; %s\n", I("gpu").c_str(), I("cc").c_str(),
              I("sms").c_str(), I("mem_gib").c_str(), I("gpus").c_str(), I("driver_api").c_str(),
              nvrm.empty() ? "/proc/driver/nvidia/version unreadable" : nvrm.c_str());
  std::printf("device: VMM %s, POSIX-fd export %s, UVA %s, host pointer for registered memory %s, pageable memory "
              "access (HMM/ATS) %s (host page tables %s), compute mode %s, MPS_ENABLED %s; start-up %s ms; %s\n",
              I("vmm").c_str(), I("posix_fd").c_str(), I("uva").c_str(), I("host_ptr_registered").c_str(),
              I("pageable_access").c_str(), I("pageable_host_tables").c_str(), I("compute_mode").c_str(),
              I("mps_enabled").c_str(), I("init_ms").c_str(), I("ctx_api").c_str());
  if (I("mps_enabled") == "1")
    std::printf("WARNING: the non-MPS runs were MPS clients (a system MPS daemon?): 4a-4c and 1-3 describe MPS\n");
  std::stable_sort(g_rows.begin(), g_rows.end(), [](const Row& a, const Row& b) { return a.section < b.section; });
  std::printf("\n| # | finding | result | evidence |\n|---|---|---|---|\n");
  for (const Row& r : g_rows)
    std::printf("| %s | %s | %s | %s |\n", r.section.c_str(), r.finding.c_str(), r.result.c_str(), r.evidence.c_str());
  std::fflush(stdout);
  return 0;
}

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--no-mps]\n"
               "  Probes isolation between tenants of one GPU (device 0) and what contexts, processes and MPS\n"
               "  cost; prints a table (docs/isolation.md). Every step runs in its own process with a timeout.\n"
               "  --quick   fewer launches, small kernels only, 256 MiB export (about a minute)\n"
               "  --no-mps  do not start an MPS daemon even if nvidia-cuda-mps-control is found\n",
               argv0);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a child that died must not kill its reader
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  g_self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(argv[0]);
      return 0;
    }
    if (a.rfind("--", 0) != 0) {
      usage(argv[0]);
      return 2;
    }
    const bool has_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
    kv[a] = has_value ? argv[++i] : "1";
  }
  g_quick = kv.count("--quick") != 0;
  if (kv.count("--section") != 0) g_section_override = kv["--section"];
  if (kv.count("--tag") != 0) g_tag = kv["--tag"];
  if (kv.count("--mode") == 0) {
    for (const auto& [k, v] : kv)
      if (k != "--quick" && k != "--no-mps") {
        usage(argv[0]);
        return 2;
      }
    return orchestrate(kv.count("--no-mps") != 0);
  }
  const std::string mode = kv["--mode"];
  auto num = [&](const char* k, long long def) { return kv.count(k) != 0 ? std::strtoll(kv[k].c_str(), nullptr, 0) : def; };
  Shape sh;
  if (kv.count("--shape") != 0) std::sscanf(kv["--shape"].c_str(), "%d,%d,%d", &sh.iters, &sh.blocks, &sh.threads);
  sh.name = kv.count("--shape-name") != 0 ? kv["--shape-name"] : "?";
  sh.us = kv.count("--shape-us") != 0 ? std::atof(kv["--shape-us"].c_str()) : 0;
  if (mode == "info") return mode_info();
  if (mode == "cross") return mode_cross(kv["--kind"]);
  if (mode == "fault") return mode_fault(kv["--where"], kv["--target"]);
  if (mode == "xproc") return mode_xproc(g_quick ? (256ull << 20) : (1ull << 30));
  if (mode == "xproc-fault") return mode_xproc_fault(static_cast<uint64_t>(num("--va", 0)));
  if (mode == "xproc-import")
    return mode_xproc_import(static_cast<int>(num("--sock", -1)), static_cast<size_t>(num("--read-bytes", 1 << 20)));
  if (mode == "mem") return mode_mem();
  if (mode == "hold") return mode_hold();
  if (mode == "launch") return mode_launch(static_cast<int>(num("--n", 100000)), static_cast<int>(num("--rtt", 5000)));
  if (mode == "calibrate") return mode_calibrate(20.0);
  if (mode == "tput-threads")
    return mode_tput_threads(kv["--ctx"] == "own", static_cast<int>(num("--n", 1)), sh, static_cast<int>(num("--launches", 2000)));
  if (mode == "tput-procs") return mode_tput_procs(static_cast<int>(num("--n", 1)), sh, static_cast<int>(num("--launches", 2000)));
  if (mode == "tput-worker") return mode_tput_worker(sh, static_cast<int>(num("--launches", 2000)));
  std::fprintf(stderr, "isolation_probe: unknown mode %s\n", mode.c_str());
  return 2;
}

#endif  // ISOLATION_PROBE_KERNELS
