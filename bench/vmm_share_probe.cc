// vmm_share_probe.cc — measures whether a job's device memory can leave it for a driver checkpoint
// without being copied: exported (POSIX fd) to a helper process, released by the job, checkpointed, and imported back.
// The facts behind the dump's memory hand-off (docs/driver_runtime.md, "Dump and restore"): a forked child plays the
// job, the parent plays pos-cli; every step is timed and every byte checked.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kMaxChunks = 200;  // fds in one message (SCM_MAX_FD is 253)

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define CK(call)                                                                 \
  do {                                                                           \
    const CUresult rc_ = (call);                                                 \
    if (rc_ != CUDA_SUCCESS) {                                                   \
      const char* name_ = nullptr;                                               \
      cuGetErrorName(rc_, &name_);                                               \
      std::fprintf(stderr, "[%d] %s: %s (line %d)\n", static_cast<int>(getpid()), #call, \
                   name_ ? name_ : "?", __LINE__);                               \
      std::exit(2);                                                              \
    }                                                                            \
  } while (0)

struct Msg {
  char what[16];
  int count;
  double value;
};

void send_msg(int sock, const char* what, const std::vector<int>& fds = {}, double value = 0) {
  Msg m{};
  std::snprintf(m.what, sizeof(m.what), "%s", what);
  m.count = static_cast<int>(fds.size());
  m.value = value;
  iovec iov{&m, sizeof(m)};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  std::vector<char> ctl(CMSG_SPACE(sizeof(int) * kMaxChunks));
  if (!fds.empty()) {
    h.msg_control = ctl.data();
    h.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (sendmsg(sock, &h, 0) != static_cast<ssize_t>(sizeof(m))) {
    std::perror("sendmsg");
    std::exit(2);
  }
}

Msg recv_msg(int sock, const char* expect, std::vector<int>* fds = nullptr) {
  Msg m{};
  iovec iov{&m, sizeof(m)};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  std::vector<char> ctl(CMSG_SPACE(sizeof(int) * kMaxChunks));
  h.msg_control = ctl.data();
  h.msg_controllen = ctl.size();
  if (recvmsg(sock, &h, MSG_WAITALL) != static_cast<ssize_t>(sizeof(m))) {
    std::fprintf(stderr, "[%d] peer gone waiting for %s\n", static_cast<int>(getpid()), expect);
    std::exit(2);
  }
  if (std::strcmp(m.what, expect) != 0) {
    std::fprintf(stderr, "[%d] expected %s, got %s\n", static_cast<int>(getpid()), expect, m.what);
    std::exit(2);
  }
  if (fds != nullptr) {
    fds->clear();
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
        fds->assign(p, p + n);
      }
  }
  return m;
}

CUmemAllocationProp shareable_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

void map_rw(CUdeviceptr at, size_t size, CUmemGenericAllocationHandle h) {
  CK(cuMemMap(at, size, 0, h, 0));
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(at, size, &a, 1));
}

// Every chunk's first and last words and one in the middle equal `seed + i`.
bool check(CUdeviceptr base, size_t chunk, int n, unsigned seed, const char* when) {
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    for (size_t off : {size_t{0}, chunk / 2, chunk - 4}) {
      unsigned v = 0;
      CK(cuMemcpyDtoH(&v, base + i * chunk + off, 4));
      if (v != seed + static_cast<unsigned>(i)) {
        std::fprintf(stderr, "[job] %s: chunk %d offset %zu holds %u, not %u\n", when, i, off, v, seed + i);
        ok = false;
      }
    }
  }
  return ok;
}

void fill(CUdeviceptr base, size_t chunk, int n, unsigned seed) {
  for (int i = 0; i < n; ++i) CK(cuMemsetD32(base + i * chunk, seed + i, chunk / 4));
  CK(cuCtxSynchronize());
}

// The job: memory in `n` shareable chunks at one reserved range, handed away and back twice.
int job(int sock, size_t chunk, int n) {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = shareable_prop();
  size_t g = 0;
  CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (chunk % g != 0) {
    std::fprintf(stderr, "[job] chunk %zu is not a multiple of the granularity %zu\n", chunk, g);
    return 2;
  }
  CUdeviceptr base = 0;
  CK(cuMemAddressReserve(&base, chunk * n, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> hs(n);
  for (int i = 0; i < n; ++i) {
    CK(cuMemCreate(&hs[i], chunk, &prop, 0));
    map_rw(base + i * chunk, chunk, hs[i]);
  }
  unsigned seed = 1000;
  fill(base, chunk, n, seed);
  std::vector<int> fds(n, -1);
  send_msg(sock, "ready");
  for (int round = 1; round <= 2; ++round) {
    recv_msg(sock, "export");
    CK(cuCtxSynchronize());
    double t = now_s();
    // Round 1 exports the job's own handles; in round 2 they are imports, which the driver does not
    // export again (CUDA_ERROR_INVALID_VALUE), so the job sends the descriptors it imported from.
    if (round == 1)
      for (int i = 0; i < n; ++i)
        CK(cuMemExportToShareableHandle(&fds[i], hs[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    const double export_s = now_s() - t;
    send_msg(sock, "fds", fds, export_s);
    for (int fd : fds) close(fd);
    t = now_s();
    for (int i = 0; i < n; ++i) {
      CK(cuMemUnmap(base + i * chunk, chunk));
      CK(cuMemRelease(hs[i]));
    }
    send_msg(sock, "released", {}, now_s() - t);
    // The helper checkpoints and restores this process now; then the memory comes back.
    recv_msg(sock, "back", &fds);
    if (static_cast<int>(fds.size()) != n) {
      std::fprintf(stderr, "[job] %zu fds came back, not %d\n", fds.size(), n);
      return 2;
    }
    t = now_s();
    for (int i = 0; i < n; ++i) {
      CK(cuMemImportFromShareableHandle(&hs[i], reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      map_rw(base + i * chunk, chunk, hs[i]);  // the descriptor kept: the next hand-off sends it
    }
    const double import_s = now_s() - t;
    if (!check(base, chunk, n, seed, round == 1 ? "after the first hand-back" : "after the second hand-back")) return 1;
    seed += 1000;
    fill(base, chunk, n, seed);  // the job works on: round 2 must carry these values
    send_msg(sock, "imported", {}, import_s);
  }
  // The helper has let go of everything and exits: the memory must stay the job's.
  recv_msg(sock, "gone");
  for (int fd : fds) close(fd);
  if (!check(base, chunk, n, seed, "after the helper exited")) return 1;
  fill(base, chunk, n, seed + 7);
  if (!check(base, chunk, n, seed + 7, "written after the helper exited")) return 1;
  for (int i = 0; i < n; ++i) {
    CK(cuMemUnmap(base + i * chunk, chunk));
    CK(cuMemRelease(hs[i]));
  }
  CK(cuMemAddressFree(base, chunk * n));
  std::printf("job: every check passed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 8;
  int n = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--gib") == 0) gib = std::atof(argv[i + 1]);
    else if (std::strcmp(argv[i], "--chunks") == 0) n = std::atoi(argv[i + 1]);
  }
  if (n < 1 || n > kMaxChunks || gib <= 0) {
    std::fprintf(stderr, "usage: %s [--gib G] [--chunks N<=%d]\n", argv[0], kMaxChunks);
    return 2;
  }
  const size_t gran = 2u << 20;
  const size_t chunk = (static_cast<size_t>(gib * (1ull << 30)) / n + gran - 1) / gran * gran;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 2;
  const pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    std::exit(job(sv[1], chunk, n));
  }
  close(sv[1]);
  const int sock = sv[0];
  double t = now_s();
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  const double helper_init_s = now_s() - t;
  recv_msg(sock, "ready");
  const double bytes = static_cast<double>(chunk) * n;
  std::printf("memory: %d chunks of %zu MiB = %.2f GB; helper's context %.3f s\n", n, chunk >> 20, bytes / 1e9,
              helper_init_s);
  std::printf("%-6s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "round", "export_s", "import_s", "release_s", "lock_s",
              "ckpt_s", "d2d_GB/s", "d2h_GB/s", "restore_s", "jobimp_s");
  CUdeviceptr mine = 0, shadow = 0;
  CK(cuMemAddressReserve(&mine, chunk * n, 0, 0, 0));
  CK(cuMemAlloc(&shadow, chunk * n));
  void* pinned = nullptr;
  const size_t pinned_bytes = 256u << 20;
  CK(cuMemHostAlloc(&pinned, pinned_bytes, 0));
  std::vector<CUmemGenericAllocationHandle> hs(n);
  for (int round = 1; round <= 2; ++round) {
    send_msg(sock, "export");
    std::vector<int> fds;
    const Msg got = recv_msg(sock, "fds", &fds);
    if (static_cast<int>(fds.size()) != n) {
      std::fprintf(stderr, "[helper] %zu fds, not %d\n", fds.size(), n);
      return 2;
    }
    t = now_s();
    for (int i = 0; i < n; ++i) {
      CK(cuMemImportFromShareableHandle(&hs[i], reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    }
    const double import_s = now_s() - t;
    const Msg rel = recv_msg(sock, "released");
    CUcheckpointLockArgs la{};
    la.timeoutMs = 10000;
    t = now_s();
    CK(cuCheckpointProcessLock(pid, &la));
    const double lock_s = now_s() - t;
    t = now_s();
    CK(cuCheckpointProcessCheckpoint(pid, nullptr));
    const double ckpt_s = now_s() - t;
    // While the job is checkpointed: the helper maps the memory, copies it whole on the device and
    // streams a share of it to host memory, as a dump's writer would.
    for (int i = 0; i < n; ++i) map_rw(mine + i * chunk, chunk, hs[i]);
    t = now_s();
    CK(cuMemcpyDtoD(shadow, mine, chunk * n));
    CK(cuCtxSynchronize());
    const double d2d = bytes / (now_s() - t) / 1e9;
    t = now_s();
    const size_t part = std::min<size_t>(chunk * n, 4ull << 30);
    for (size_t off = 0; off < part; off += pinned_bytes)
      CK(cuMemcpyDtoH(pinned, mine + off, std::min(pinned_bytes, part - off)));
    const double d2h = static_cast<double>(part) / (now_s() - t) / 1e9;
    unsigned v = 0;
    CK(cuMemcpyDtoH(&v, shadow + chunk, 4));
    if (v != 1000u * round + 1) {
      std::fprintf(stderr, "[helper] round %d: the shadow holds %u, not %u\n", round, v, 1000u * round + 1);
      return 1;
    }
    for (int i = 0; i < n; ++i) CK(cuMemUnmap(mine + i * chunk, chunk));
    CUcheckpointRestoreArgs ra{};
    t = now_s();
    CK(cuCheckpointProcessRestore(pid, &ra));
    CUcheckpointUnlockArgs ua{};
    CK(cuCheckpointProcessUnlock(pid, &ua));
    const double restore_s = now_s() - t;
    // Back to the job: the descriptors it sent (an imported handle cannot be exported again).
    send_msg(sock, "back", fds);
    for (int fd : fds) close(fd);
    const Msg imp = recv_msg(sock, "imported");
    for (int i = 0; i < n; ++i) CK(cuMemRelease(hs[i]));
    std::printf("%-6d %9.4f %9.4f %9.4f %9.4f %9.4f %9.1f %9.1f %9.4f %9.4f\n", round, got.value, import_s, rel.value,
                lock_s, ckpt_s, d2d, d2h, restore_s, imp.value);
  }
  CK(cuMemFree(shadow));
  CK(cuMemFreeHost(pinned));
  CK(cuMemAddressFree(mine, chunk * n));
  CK(cuDevicePrimaryCtxRelease(dev));
  send_msg(sock, "gone");
  int status = 0;
  waitpid(pid, &status, 0);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("%s\n", ok ? "PASS: memory left the job, was checkpointed around, and came back intact twice"
                         : "FAIL: the job's checks failed");
  return ok ? 0 : 1;
}
