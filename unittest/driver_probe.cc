// driver_probe.cc — a program that reaches "the driver" (unittest/fake_cuda.cc) every way a real
// process does, for driver_hooks_test: linked directly, dlopen + dlsym, cuGetProcAddress. It
// prints `key=value` lines: which library each function it was given lives in, and how many times
// the fake's own functions ran, so the test sees what libpos_driver intercepted.
//
//   driver_probe direct|dlsym|proc|features|place|wait|other|next|limit|sms|share|...   (FAKE_CUDA: the fake driver's path, for dlopen)
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

#include "unittest/fake_cuda.h"

extern "C" int fake_calls(const char* name);
extern "C" int cuMemAlloc_v2(unsigned long long* p, size_t n);
extern "C" int cuMemFree_v2(unsigned long long p);
extern "C" int probe_symbol() { return 1; }

namespace {

using AllocFn = int (*)(unsigned long long*, size_t);
using FreeFn = int (*)(unsigned long long);
using CtxFn = int (*)(int*);
using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                         void**);
using ProcFn = int (*)(const char*, void**, int, uint64_t, int*);

// Which library holds `p`: pos_driver, fake, or the file's name.
std::string where(const void* p) {
  if (p == nullptr) return "null";
  Dl_info info{};
  if (dladdr(p, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const std::string f = info.dli_fname;
  if (f.find("libpos_driver") != std::string::npos) return "pos_driver";
  if (f.find("fake_cuda") != std::string::npos) return "fake";
  return f;
}

void* open_driver() {
  const char* path = std::getenv("FAKE_CUDA");
  void* h = path != nullptr ? dlopen(path, RTLD_NOW) : nullptr;
  if (h == nullptr) std::printf("error=cannot open FAKE_CUDA\n");
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "direct") {
    unsigned long long a = 0, b = 0, c = 0;
    const int rc = cuMemAlloc_v2(&a, 1000) | cuMemAlloc_v2(&b, 3 << 20) | cuMemAlloc_v2(&c, 5) | cuMemFree_v2(b);
    std::printf("rc=%d\nwhere=%s\nfake_alloc=%d\nfake_free=%d\n", rc, where(reinterpret_cast<void*>(&cuMemAlloc_v2)).c_str(),
                fake_calls("cuMemAlloc_v2"), fake_calls("cuMemFree_v2"));
    return 0;
  }
  if (what == "dlsym") {
    void* h = open_driver();
    if (h == nullptr) return 1;
    auto alloc = reinterpret_cast<AllocFn>(dlsym(h, "cuMemAlloc_v2"));
    auto ctx = reinterpret_cast<CtxFn>(dlsym(h, "cuCtxGetDevice"));
    unsigned long long a = 0;
    int d = -1;
    const int rc = (alloc != nullptr ? alloc(&a, 4096) : -1) | (ctx != nullptr ? ctx(&d) : -1);
    std::printf("rc=%d\nalloc=%s\nctx=%s\nmissing=%s\nfake_alloc=%d\nfake_ctx=%d\n", rc,
                where(reinterpret_cast<void*>(alloc)).c_str(), where(reinterpret_cast<void*>(ctx)).c_str(),
                where(dlsym(h, "cuNoSuchFunction")).c_str(), fake_calls("cuMemAlloc_v2"), fake_calls("cuCtxGetDevice"));
    return 0;
  }
  if (what == "proc") {
    void* h = open_driver();
    if (h == nullptr) return 1;
    auto gpa = reinterpret_cast<ProcFn>(dlsym(h, "cuGetProcAddress_v2"));
    if (gpa == nullptr) return std::printf("error=no cuGetProcAddress_v2\n"), 1;
    void *alloc = nullptr, *freef = nullptr, *launch = nullptr, *launch_pt = nullptr, *ctx = nullptr, *self = nullptr,
         *none = nullptr;
    int st = -1;
    int rc = gpa("cuMemAlloc", &alloc, 13000, 0, &st) | gpa("cuMemFree", &freef, 13000, 0, &st) |
             gpa("cuLaunchKernel", &launch, 13000, 0, &st) | gpa("cuLaunchKernel", &launch_pt, 13000, 2, &st) |
             gpa("cuCtxGetDevice", &ctx, 13000, 0, &st) | gpa("cuGetProcAddress", &self, 13000, 0, &st);
    const int missing_rc = gpa("cuNoSuchFunction", &none, 13000, 0, &st);
    unsigned long long a = 0;
    rc |= reinterpret_cast<AllocFn>(alloc)(&a, 2 << 20) | reinterpret_cast<FreeFn>(freef)(a);
    rc |= reinterpret_cast<LaunchFn>(launch)(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
    rc |= reinterpret_cast<LaunchFn>(launch_pt)(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
    std::printf("rc=%d\nmissing_rc=%d\nmissing_status=%d\ngpa=%s\nalloc=%s\nfree=%s\nlaunch=%s\nlaunch_pt=%s\nctx=%s\n"
                "self=%s\nfake_alloc=%d\nfake_launch=%d\nfake_launch_pt=%d\n",
                rc, missing_rc, st, where(reinterpret_cast<void*>(gpa)).c_str(), where(alloc).c_str(),
                where(freef).c_str(), where(launch).c_str(), where(launch_pt).c_str(), where(ctx).c_str(),
                where(self).c_str(), fake_calls("cuMemAlloc_v2"), fake_calls("cuLaunchKernel"),
                fake_calls("cuLaunchKernel_ptsz"));
    return 0;
  }
  if (what == "features" || what == "features-wait") {
    // What POS cannot checkpoint yet, each used once through the driver: two GPUs, a graph
    // capture and launch, an IPC handle made and opened (64 bytes passed by value).
    void* h = open_driver();
    if (h == nullptr) return 1;
    struct Ipc {
      unsigned char b[64];
    } ipc{};
    void *c0 = nullptr, *c1 = nullptr;
    unsigned long long opened = 0;
    const int rc =
        reinterpret_cast<int (*)(void**, int)>(dlsym(h, "cuDevicePrimaryCtxRetain"))(&c0, 0) |
        reinterpret_cast<int (*)(void**, int)>(dlsym(h, "cuDevicePrimaryCtxRetain"))(&c1, 1) |
        reinterpret_cast<int (*)(void*, int)>(dlsym(h, "cuStreamBeginCapture_v2"))(nullptr, 0) |
        reinterpret_cast<int (*)(void*, void*)>(dlsym(h, "cuGraphLaunch"))(nullptr, nullptr) |
        reinterpret_cast<int (*)(Ipc*, unsigned long long)>(dlsym(h, "cuIpcGetMemHandle"))(&ipc, 0x7f0000000000ull) |
        reinterpret_cast<int (*)(unsigned long long*, Ipc, unsigned)>(dlsym(h, "cuIpcOpenMemHandle_v2"))(&opened, ipc, 1);
    std::printf("rc=%d\nopened=%llx\nwhere=%s\n", rc, opened, where(dlsym(h, "cuIpcOpenMemHandle_v2")).c_str());
    if (what == "features-wait") {  // then stays, as "wait" does, for a dump to be asked of it
      std::printf("ready\n");
      std::fflush(stdout);
      char buf[64];
      while (std::fread(buf, 1, sizeof(buf), stdin) > 0) {
      }
    }
    return 0;
  }
  if (what == "place") {
    // Allocations of 1000 B, 3 MiB and 5 MiB; the 3 MiB one freed and 2 MiB asked for; then all freed.
    unsigned long long a = 0, b = 0, c = 0, d = 0;
    int rc = cuMemAlloc_v2(&a, 1000) | cuMemAlloc_v2(&b, 3 << 20) | cuMemAlloc_v2(&c, 5 << 20);
    rc |= cuMemFree_v2(b);
    rc |= cuMemAlloc_v2(&d, 2 << 20);
    std::printf("a=%llx\nb=%llx\nc=%llx\nd=%llx\nmapped_mib=%d\n", a, b, c, d,
                reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "fake_mapped_bytes"))());
    rc |= cuMemFree_v2(a) | cuMemFree_v2(c) | cuMemFree_v2(d);
    std::printf("rc=%d\nmapped_after=%d\nfake_alloc=%d\nfake_free=%d\nfake_sync=%d\n", rc,
                reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "fake_mapped_bytes"))(), fake_calls("cuMemAlloc_v2"),
                fake_calls("cuMemFree_v2"), fake_calls("cuCtxSynchronize"));
    return 0;
  }
  if (what == "async-place") {
    // Stream-ordered memory: 1 MiB on stream 7, freed there and asked for again on 7 (the same
    // bytes), 1 MiB on stream 8 (beside them); a synchronous free of pool memory; a trim.
    auto sym = [](const char* n) { return dlsym(RTLD_DEFAULT, n); };
    auto alloc_async = reinterpret_cast<int (*)(unsigned long long*, size_t, void*)>(sym("cuMemAllocAsync"));
    auto free_async = reinterpret_cast<int (*)(unsigned long long, void*)>(sym("cuMemFreeAsync"));
    auto trim = reinterpret_cast<int (*)(void*, size_t)>(sym("cuMemPoolTrimTo"));
    void* s7 = reinterpret_cast<void*>(7);
    void* s8 = reinterpret_cast<void*>(8);
    unsigned long long a = 0, b = 0, c = 0;
    int rc = alloc_async(&a, 1 << 20, s7);
    rc |= free_async(a, s7);
    rc |= alloc_async(&b, 1 << 20, s7);
    rc |= alloc_async(&c, 1 << 20, s8);
    std::printf("a=%llx\nb=%llx\nc=%llx\nmapped_mib=%d\n", a, b, c,
                reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "fake_mapped_bytes"))());
    const int bad = free_async(c + 512, s8);  // not a block's start
    rc |= free_async(b, s7) | cuMemFree_v2(c);
    rc |= trim(nullptr, 0);
    std::printf("rc=%d\nbad_free=%d\nmapped_after=%d\nfake_alloc_async=%d\nfake_free_async=%d\nfake_trim=%d\n", rc,
                bad, reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "fake_mapped_bytes"))(),
                fake_calls("cuMemAllocAsync"), fake_calls("cuMemFreeAsync"), fake_calls("cuMemPoolTrimTo"));
    return 0;
  }
  if (what == "sms") {
    // Under POS_SM_LIMIT: the multiprocessor count before any context, the primary context the job
    // gets (twice: one green context), another attribute, and how often the driver made green
    // contexts; then "ready" and waits for stdin to close, for ps and limit to be asked.
    auto sym = [](const char* n) { return dlsym(RTLD_DEFAULT, n); };
    auto attr = reinterpret_cast<int (*)(int*, int, int)>(sym("cuDeviceGetAttribute"));
    auto retain = reinterpret_cast<int (*)(void**, int)>(sym("cuDevicePrimaryCtxRetain"));
    int sms = 0, threads = 0;
    void* c0 = nullptr;
    void* c1 = nullptr;
    auto set_current = reinterpret_cast<int (*)(void*)>(sym("cuCtxSetCurrent"));
    auto get_current = reinterpret_cast<int (*)(void**)>(sym("cuCtxGetCurrent"));
    auto raw_set = reinterpret_cast<void (*)(void*)>(sym("fake_set_current"));
    void* primary = reinterpret_cast<void*>(0x1000);  // the fake's primary context of device 0
    void* cur = nullptr;
    unsigned long long p = 0;
    int rc = attr(&sms, 16, 0);  // each call before its printf: argument order is unspecified
    std::printf("attr=%d sms=%d\n", rc, sms);
    std::printf("green_before=%d\n", fake_calls("cuGreenCtxCreate"));
    // The runtime's way: the primary context made current without the hooked call, then a hooked
    // call (an allocation): the green context must be current after it.
    raw_set(primary);
    rc = cuMemAlloc_v2(&p, 1 << 20);
    get_current(&cur);
    std::printf("alloc=%d adopted ctx=%lx\n", rc, reinterpret_cast<unsigned long>(cur));
    rc = retain(&c0, 0);
    std::printf("retain=%d ctx=%lx\n", rc, reinterpret_cast<unsigned long>(c0));
    rc = retain(&c1, 0);
    std::printf("retain=%d ctx=%lx\n", rc, reinterpret_cast<unsigned long>(c1));
    raw_set(nullptr);
    rc = set_current(primary);  // the hooked call: the green context in the primary's place
    get_current(&cur);
    std::printf("set=%d ctx=%lx\n", rc, reinterpret_cast<unsigned long>(cur));
    rc = attr(&threads, 1, 0);
    std::printf("attr=%d threads=%d\n", rc, threads);
    std::printf("green=%d real_retains=%d\n", fake_calls("cuGreenCtxCreate"), fake_calls("cuDevicePrimaryCtxRetain"));
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    }
    return 0;
  }
  if (what == "limit") {
    // Under POS_MEMORY_LIMIT=10MiB: what fits is given, what does not gets CUDA_ERROR_OUT_OF_MEMORY
    // (2), cuMemGetInfo says what the limit leaves, frees give room back; then "ready", and per
    // stdin line an 8 MiB allocation tried (and freed) under whatever limit holds now.
    auto sym = [](const char* n) { return dlsym(RTLD_DEFAULT, n); };
    auto alloc_async = reinterpret_cast<int (*)(unsigned long long*, size_t, void*)>(sym("cuMemAllocAsync"));
    auto free_async = reinterpret_cast<int (*)(unsigned long long, void*)>(sym("cuMemFreeAsync"));
    auto info = reinterpret_cast<int (*)(size_t*, size_t*)>(sym("cuMemGetInfo_v2"));
    using CreateFn = int (*)(unsigned long long*, size_t, const void*, unsigned long long);
    auto create = reinterpret_cast<CreateFn>(sym("cuMemCreate"));
    auto release = reinterpret_cast<int (*)(unsigned long long)>(sym("cuMemRelease"));
    struct Loc { int type, id; };
    struct Prop { int type, handles; Loc loc; void* win32; unsigned char flags[8]; } prop{1, 0, {1, 0}, nullptr, {}};
    const size_t mib = 1 << 20;
    unsigned long long a = 0, b = 0, c = 0, d = 0, h = 0;
    size_t fr = 0, tot = 0;
    int irc = 0;
    std::printf("a=%d\n", cuMemAlloc_v2(&a, 4 * mib));
    std::printf("over=%d\n", cuMemAlloc_v2(&b, 8 * mib));
    std::printf("async=%d\n", alloc_async(&c, 4 * mib, nullptr));
    irc = info(&fr, &tot);
    std::printf("info=%d free_mib=%zu total_mib=%zu\n", irc, fr / mib, tot / mib);
    std::printf("free_a=%d\n", cuMemFree_v2(a));
    std::printf("b=%d\n", cuMemAlloc_v2(&b, 6 * mib));
    std::printf("create_over=%d\n", create(&h, 2 * mib, &prop, 0));
    std::printf("free_async=%d\n", free_async(c, nullptr));
    std::printf("create=%d\n", create(&h, 2 * mib, &prop, 0));
    std::printf("d=%d\n", cuMemAlloc_v2(&d, 4 * mib));
    std::printf("release=%d\n", release(h));
    std::printf("d_after_release=%d\n", cuMemAlloc_v2(&d, 4 * mib));
    irc = info(&fr, &tot);
    std::printf("info=%d free_mib=%zu total_mib=%zu\n", irc, fr / mib, tot / mib);
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof(line), stdin) != nullptr) {
      unsigned long long e = 0;
      const int rc = cuMemAlloc_v2(&e, 8 * mib);
      if (rc == 0) cuMemFree_v2(e);
      std::printf("rc=%d\n", rc);
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "share") {
    // A job that wants the GPU all the time: its context on device 0, an allocation (the job
    // publishes its device), "ready"; per "go MS" line on stdin, launches for MS milliseconds, each
    // standing for 100 µs of the GPU's time, then "launches=N". EOF ends it.
    auto retain = reinterpret_cast<int (*)(void**, int)>(dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain"));
    auto launch = reinterpret_cast<LaunchFn>(dlsym(RTLD_DEFAULT, "cuLaunchKernel"));
    void* ctx = nullptr;
    unsigned long long a = 0;
    const int rc = retain(&ctx, 0) | cuMemAlloc_v2(&a, 1 << 20);
    std::printf("rc=%d\nready\n", rc);
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof(line), stdin) != nullptr) {
      const long ms = std::strtol(line + 3, nullptr, 10);
      timespec t0{}, t{};
      clock_gettime(CLOCK_MONOTONIC, &t0);
      long n = 0;
      for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms) break;
        launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
        timespec k{0, 100000};
        nanosleep(&k, nullptr);
        ++n;
      }
      std::printf("launches=%ld\n", n);
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "wait") {
    // A job that stays: two allocations, then "ready", then it runs until its stdin closes.
    unsigned long long a = 0, b = 0;
    const int rc = cuMemAlloc_v2(&a, 1 << 20) | cuMemAlloc_v2(&b, 3 << 20);
    std::printf("rc=%d\nready\n", rc);
    std::fflush(stdout);
    char buf[64];
    while (std::fread(buf, 1, sizeof(buf), stdin) > 0) {
    }
    return 0;
  }
  if (what == "memory") {
    // A job whose device memory a dump saves and a resume loads: two placed allocations filled
    // with a pattern, "ready"; then per stdin line, the bytes read back (a hooked copy, which waits
    // at the gate while a dump holds the memory) and "same=1" if they are the pattern. EOF ends it.
    unsigned long long a = 0, b = 0;
    const size_t na = 3 << 20, nb = 5 << 20;
    int rc = cuMemAlloc_v2(&a, na) | cuMemAlloc_v2(&b, nb);
    auto htod = reinterpret_cast<int (*)(unsigned long long, const void*, size_t)>(dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2"));
    auto dtoh = reinterpret_cast<int (*)(void*, unsigned long long, size_t)>(dlsym(RTLD_DEFAULT, "cuMemcpyDtoH_v2"));
    std::string pa(na, '\0'), pb(nb, '\0'), back;
    for (size_t i = 0; i < na; ++i) pa[i] = static_cast<char>(i * 7 + 1);
    for (size_t i = 0; i < nb; ++i) pb[i] = static_cast<char>(i * 13 + 5);
    rc |= htod(a, pa.data(), na) | htod(b, pb.data(), nb);
    std::printf("rc=%d\nready\n", rc);
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof(line), stdin) != nullptr) {
      std::string ra(na, '\0'), rb(nb, '\0');
      const int r = dtoh(ra.data(), a, na) | dtoh(rb.data(), b, nb);
      std::printf("rc=%d same=%d\n", r, ra == pa && rb == pb ? 1 : 0);
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "vmm") {
    // Device memory the job maps itself (PyTorch's expandable_segments does this): a reserved range
    // with two 4 MiB handles mapped in it and their access set, the second handle released while
    // mapped; beside them one placed cuMemAlloc. Patterns in all three, "ready"; then per stdin
    // line "check" the bytes read back (same=1), and "shrink": the first mapping unmapped and its
    // handle released by the value cuMemCreate gave (after a resume POS translates it).
    using CreateFn = int (*)(unsigned long long*, size_t, const void*, unsigned long long);
    using MapFn = int (*)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
    struct Loc { int type, id; };
    struct Prop { int type, handles; Loc loc; void* win32; unsigned char flags[8]; } prop{1, 0, {1, 0}, nullptr, {}};
    struct Access { Loc loc; int flags; } access{{1, 0}, 3};
    auto sym = [](const char* n) { return dlsym(RTLD_DEFAULT, n); };
    auto reserve = reinterpret_cast<int (*)(unsigned long long*, size_t, size_t, unsigned long long, unsigned long long)>(
        sym("cuMemAddressReserve"));
    auto create = reinterpret_cast<CreateFn>(sym("cuMemCreate"));
    auto map = reinterpret_cast<MapFn>(sym("cuMemMap"));
    auto set_access = reinterpret_cast<int (*)(unsigned long long, size_t, const void*, size_t)>(sym("cuMemSetAccess"));
    auto release = reinterpret_cast<int (*)(unsigned long long)>(sym("cuMemRelease"));
    auto unmap = reinterpret_cast<int (*)(unsigned long long, size_t)>(sym("cuMemUnmap"));
    auto htod = reinterpret_cast<int (*)(unsigned long long, const void*, size_t)>(sym("cuMemcpyHtoD_v2"));
    auto dtoh = reinterpret_cast<int (*)(void*, unsigned long long, size_t)>(sym("cuMemcpyDtoH_v2"));
    const size_t n = 4 << 20;
    unsigned long long base = 0, h1 = 0, h2 = 0, placed = 0;
    int rc = reserve(&base, 4 * n, 0, 0x300000000000ull, 0) | create(&h1, n, &prop, 0) | create(&h2, n, &prop, 0);
    rc |= map(base, n, 0, h1, 0) | map(base + n, n, 0, h2, 0) | set_access(base, 2 * n, &access, 1) | release(h2);
    rc |= cuMemAlloc_v2(&placed, 3 << 20);
    std::string p1(n, '\0'), p2(n, '\0'), p3(3 << 20, '\0');
    for (size_t i = 0; i < n; ++i) p1[i] = static_cast<char>(i * 3 + 1), p2[i] = static_cast<char>(i * 5 + 2);
    for (size_t i = 0; i < p3.size(); ++i) p3[i] = static_cast<char>(i * 11 + 7);
    rc |= htod(base, p1.data(), n) | htod(base + n, p2.data(), n) | htod(placed, p3.data(), p3.size());
    std::printf("rc=%d\nready\n", rc);
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof(line), stdin) != nullptr) {
      if (std::string(line) == "shrink\n") {
        std::printf("rc=%d\n", unmap(base, n) | release(h1));
      } else {
        std::string r1(n, '\0'), r2(n, '\0'), r3(p3.size(), '\0');
        const int r = dtoh(r1.data(), base, n) | dtoh(r2.data(), base + n, n) | dtoh(r3.data(), placed, r3.size());
        std::printf("rc=%d same=%d\n", r, r1 == p1 && r2 == p2 && r3 == p3 ? 1 : 0);
      }
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "writes") {
    // A job whose writes a GPU-only checkpoint's marks must follow: three placed allocations (2, 4
    // and 2 MiB) filled with 'a', 'b', 'c', their addresses, "ready"; then per stdin line
    // "HOW X V" writes byte V over the first 4 KiB of allocation X (0..2) and answers "done rc=N":
    // HOW is launch (parameters by pointer, layout from cuFuncGetParamInfo), kernel (the layout
    // from cuKernelGetParamInfo), struct (the address inside a struct passed by value), extra (a
    // parameter buffer), memset (cuMemsetD8), blind (a kernel with no layout: nothing can be told).
    // "nop" launches a kernel whose only parameter is a number; "capture" / "endcapture" begin and
    // end a CUDA graph capture on the probe's stream; "busy 0 MS" launches nops for MS ms without
    // waiting for the device (a step's work); "sync" waits for the probe's stream (a step's end);
    // "palloc I V" allocates 1 MiB of stream-ordered memory on the probe's stream as slot I (0..2)
    // and fills it with byte V, "pfree I 0" frees slot I on that stream; "busycapture 0 MS" is
    // "busy 0 MS" followed at once by "capture". "gmake X V" makes and instantiates graph X, one
    // kernel node writing V into allocation X; "glaunch X 0" launches it on the probe's stream;
    // "gset X Y" changes its executable's node to write into allocation Y instead.
    auto sym = [](const char* n) { return dlsym(RTLD_DEFAULT, n); };
    auto htod = reinterpret_cast<int (*)(unsigned long long, const void*, size_t)>(sym("cuMemcpyHtoD_v2"));
    auto memset8 = reinterpret_cast<int (*)(unsigned long long, unsigned char, size_t)>(sym("cuMemsetD8_v2"));
    auto launch = reinterpret_cast<LaunchFn>(sym("cuLaunchKernel"));
    auto stream_create = reinterpret_cast<int (*)(void**, unsigned)>(sym("cuStreamCreate"));
    unsigned long long at[3] = {};
    const size_t sizes[3] = {2 << 20, 4 << 20, 2 << 20};
    int rc = 0;
    void* stream = nullptr;
    rc |= stream_create(&stream, 1);
    for (int i = 0; i < 3; ++i) {
      rc |= cuMemAlloc_v2(&at[i], sizes[i]);
      const std::string fill(sizes[i], static_cast<char>('a' + i));
      rc |= htod(at[i], fill.data(), sizes[i]);
    }
    std::printf("rc=%d\na0=%llu\na1=%llu\na2=%llu\nready\n", rc, at[0], at[1], at[2]);
    std::fflush(stdout);
    // (ptr, value): the pointer at parameter 0, the value at parameter 1.
    const FakeKernel plain{kFakeFunc, 2, {0, 8}, {8, 1}, 0, 0, 1, 0};
    const FakeKernel as_kernel{kFakeKernel, 2, {0, 8}, {8, 1}, 0, 0, 1, 0};
    // struct { int n; int pad; CUdeviceptr p[2]; } by value (24 bytes), then the value: p[1] is written.
    const FakeKernel in_struct{kFakeFunc, 2, {0, 24}, {24, 1}, 0, 16, 1, 0};
    const FakeKernel buffer{kFakeFunc, 2, {0, 8}, {8, 1}, 0, 0, 0, 8};  // extra: pointer at 0, value at 8
    const FakeKernel blind{0, 2, {0, 8}, {8, 1}, 0, 0, 1, 0};
    const FakeKernel number{kFakeFunc, 1, {0}, {4}, -1, 0, -1, 0};
    auto alloc_async = reinterpret_cast<int (*)(unsigned long long*, size_t, void*)>(sym("cuMemAllocAsync"));
    auto free_async = reinterpret_cast<int (*)(unsigned long long, void*)>(sym("cuMemFreeAsync"));
    unsigned long long slot[3] = {};
    // CUDA graphs ("gmake", "glaunch", "gset"): the driver's calls, the hooked ones through the layer.
    using KernelNodeParams = FakeKernelNodeParams;
    auto graph_create = reinterpret_cast<int (*)(void**, unsigned)>(sym("cuGraphCreate"));
    auto graph_add_kernel =
        reinterpret_cast<int (*)(void**, void*, const void*, size_t, const KernelNodeParams*)>(sym("cuGraphAddKernelNode_v2"));
    auto graph_instantiate = reinterpret_cast<int (*)(void**, void*, unsigned long long)>(sym("cuGraphInstantiateWithFlags"));
    auto graph_launch = reinterpret_cast<int (*)(void*, void*)>(sym("cuGraphLaunch"));
    auto graph_set = reinterpret_cast<int (*)(void*, void*, const KernelNodeParams*)>(sym("cuGraphExecKernelNodeSetParams_v2"));
    void* graph_exec[3] = {};
    void* graph_node[3] = {};
    unsigned char graph_value[3] = {};
    char line[64];
    while (std::fgets(line, sizeof(line), stdin) != nullptr) {
      char how[16] = {};
      int x = 0, v = 0;
      int r = 0;
      if (std::sscanf(line, "%15s %d %d", how, &x, &v) < 1 || x < 0 || x > 2) {
        r = -1;
      } else {
        const std::string h = how;
        unsigned long long ptr = at[x];
        unsigned char val = static_cast<unsigned char>(v);
        struct {
          int n, pad;
          unsigned long long p[2];
        } st{2, 0, {at[(x + 1) % 3] + (1 << 20), ptr}};  // p[0] a read-only neighbour's middle: also marked
        void* params[2] = {&ptr, &val};
        void* sparams[2] = {&st, &val};
        unsigned char buf[16] = {};
        std::memcpy(buf, &ptr, 8);
        buf[8] = val;
        size_t buf_size = sizeof(buf);
        void* extra[5] = {reinterpret_cast<void*>(1), buf, reinterpret_cast<void*>(2), &buf_size, nullptr};
        int n = 7;
        void* nparams[1] = {&n};
        const auto go = [&](const FakeKernel& k, void** p, void** e) {
          return launch(const_cast<FakeKernel*>(&k), 1, 1, 1, 1, 1, 1, 0, stream, p, e);
        };
        if (h == "launch") r = go(plain, params, nullptr);
        else if (h == "kernel") r = go(as_kernel, params, nullptr);
        else if (h == "struct") r = go(in_struct, sparams, nullptr);
        else if (h == "extra") r = go(buffer, nullptr, extra);
        else if (h == "memset") r = memset8(ptr, val, 4096);
        else if (h == "blind") r = go(blind, params, nullptr);
        else if (h == "nop") r = go(number, nparams, nullptr);
        else if (h == "busy")
          for (auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(v); r == 0 && std::chrono::steady_clock::now() < end;
               std::this_thread::sleep_for(std::chrono::microseconds(500)))
            r = go(number, nparams, nullptr);
        else if (h == "sync") r = reinterpret_cast<int (*)(void*)>(sym("cuStreamSynchronize"))(stream);
        else if (h == "busycapture") {  // "busy" without a pause before the capture begins
          for (auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(v);
               r == 0 && std::chrono::steady_clock::now() < end; std::this_thread::sleep_for(std::chrono::microseconds(500)))
            r = go(number, nparams, nullptr);
          if (r == 0) r = reinterpret_cast<int (*)(void*, int)>(sym("cuStreamBeginCapture_v2"))(stream, 0);
        }
        else if (h == "palloc") r = alloc_async(&slot[x], 1 << 20, stream) | memset8(slot[x], val, 1 << 20);
        else if (h == "pfree") r = free_async(slot[x], stream);
        else if (h == "capture")  // a CUDA graph capture begun on the probe's stream (hooked) ...
          r = reinterpret_cast<int (*)(void*, int)>(sym("cuStreamBeginCapture_v2"))(stream, 0);
        else if (h == "gmake") {  // a CUDA graph of one kernel node writing V into allocation X, instantiated
          void* g = nullptr;
          KernelNodeParams p{};
          p.func = const_cast<FakeKernel*>(&plain);
          p.kernel_params = params;
          graph_value[x] = val;
          r = graph_create(&g, 0) | graph_add_kernel(&graph_node[x], g, nullptr, 0, &p) |
              graph_instantiate(&graph_exec[x], g, 0);
        } else if (h == "glaunch") {  // graph X launched on the probe's stream
          r = graph_launch(graph_exec[x], stream);
        } else if (h == "gset") {  // graph X's executable node now writes allocation V (with its value)
          unsigned long long to = at[v % 3];
          unsigned char keep = graph_value[x];
          void* changed[2] = {&to, &keep};
          KernelNodeParams p{};
          p.func = const_cast<FakeKernel*>(&plain);
          p.kernel_params = changed;
          r = graph_set(graph_exec[x], graph_node[x], &p);
        }
        else if (h == "endcapture")  // ... and ended (passes through)
          r = reinterpret_cast<int (*)(void*, void**)>(sym("cuStreamEndCapture"))(stream, nullptr);
        else r = -1;
      }
      std::printf("done rc=%d\n", r);
      std::fflush(stdout);
    }
    return 0;
  }
  if (what == "memory-files" && argc > 2) {
    // "memory" for CRIU (no pipes to the test, which CRIU could not restore): stdio is /dev/null,
    // DIR/ready says it is ready, and each DIR/check-N the test makes is answered in DIR/result-N;
    // DIR/exit ends it.
    const std::string dir = argv[2];
    const auto exists = [](const std::string& p) { return access(p.c_str(), F_OK) == 0; };
    const auto put = [](const std::string& p, const std::string& text) {
      const std::string tmp = p + ".tmp";
      if (FILE* f = std::fopen(tmp.c_str(), "w")) {
        std::fputs(text.c_str(), f);
        std::fclose(f);
        std::rename(tmp.c_str(), p.c_str());
      }
    };
    // DRIVER_PROBE_WAIT_GO: a job still starting (a PyTorch job importing its modules): it asks
    // the driver about the device (which starts POS's layer and its control socket) but makes no
    // context or memory; DIR/waiting says so, and DIR/go lets it go on.
    if (const char* w = std::getenv("DRIVER_PROBE_WAIT_GO"); w != nullptr && *w == '1') {
      int v = 0;
      auto attr = reinterpret_cast<int (*)(int*, int, int)>(dlsym(RTLD_DEFAULT, "cuDeviceGetAttribute"));
      put(dir + "/waiting", "rc=" + std::to_string(attr != nullptr ? attr(&v, 16 /* SM count */, 0) : -1) + "\n");
      while (!exists(dir + "/go")) usleep(2000);
    }
    unsigned long long a = 0, b = 0;
    const size_t na = 3 << 20, nb = 5 << 20;
    int rc = cuMemAlloc_v2(&a, na) | cuMemAlloc_v2(&b, nb);
    auto htod = reinterpret_cast<int (*)(unsigned long long, const void*, size_t)>(dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2"));
    auto dtoh = reinterpret_cast<int (*)(void*, unsigned long long, size_t)>(dlsym(RTLD_DEFAULT, "cuMemcpyDtoH_v2"));
    std::string pa(na, '\0'), pb(nb, '\0');
    for (size_t i = 0; i < na; ++i) pa[i] = static_cast<char>(i * 7 + 1);
    for (size_t i = 0; i < nb; ++i) pb[i] = static_cast<char>(i * 13 + 5);
    rc |= htod(a, pa.data(), na) | htod(b, pb.data(), nb);
    put(dir + "/ready", "rc=" + std::to_string(rc) + "\n");
    for (int n = 1, w = 1; !exists(dir + "/exit");) {
      // DIR/write-W: the first 4 KiB of the second allocation overwritten with W (a hooked copy,
      // which marks it written), answered in DIR/written-W; the pattern checked from then on.
      if (exists(dir + "/write-" + std::to_string(w))) {
        std::fill(pb.begin(), pb.begin() + 4096, static_cast<char>(w));
        const int r = htod(b, pb.data(), 4096);
        put(dir + "/written-" + std::to_string(w), "rc=" + std::to_string(r) + "\n");
        ++w;
        continue;
      }
      if (!exists(dir + "/check-" + std::to_string(n))) {
        usleep(5000);
        continue;
      }
      std::string ra(na, '\0'), rb(nb, '\0');
      const int r = dtoh(ra.data(), a, na) | dtoh(rb.data(), b, nb);
      put(dir + "/result-" + std::to_string(n), "rc=" + std::to_string(r) + " same=" + (ra == pa && rb == pb ? "1" : "0") + "\n");
      ++n;
    }
    return 0;
  }
  if (what == "other") {
    // A program that looks up names that only look like the driver's, and never uses it.
    const bool found = dlsym(RTLD_DEFAULT, "curl_easy_init") != nullptr || dlsym(RTLD_DEFAULT, "cudaMalloc") != nullptr ||
                       dlsym(RTLD_DEFAULT, "cu") != nullptr;
    std::printf("found=%d\n", found ? 1 : 0);
    return 0;
  }
  if (what == "next") {
    // The next definition after this program in the search order: with the fake preloaded ahead
    // of libpos_driver, the fake's (2), whatever libpos_driver does to dlsym.
    auto f = reinterpret_cast<int (*)()>(dlsym(RTLD_NEXT, "probe_symbol"));
    std::printf("next=%d\n", f != nullptr ? f() : 0);
    return 0;
  }
  std::fprintf(stderr, "usage: driver_probe direct|dlsym|proc|features|features-wait|place|wait|memory|vmm|writes|memory-files DIR|other|next\n");
  return 2;
}
