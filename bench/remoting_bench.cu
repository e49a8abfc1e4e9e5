// remoting_bench.cu — what an app feels through posd: sync round trip, launch cost in the app
// thread, copies from cudaMallocHost and pageable memory. One binary, run natively and under posd.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {
__global__ void empty_kernel(int) {}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "remoting_bench: %s: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

// Best of `reps` copies of n bytes, in GB/s.
double copy_gbps(void* dst, const void* src, size_t n, cudaMemcpyKind kind, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    check(cudaMemcpy(dst, src, n, kind), "cudaMemcpy");
    best = std::max(best, static_cast<double>(n) / (now_s() - t0) / 1e9);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  const size_t max_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  check(cudaDeviceSynchronize(), "warm-up");
  // Synchronous round trip: an idle stream's query needs the device side's answer.
  std::vector<double> rt;
  for (int i = 0; i < 20000; ++i) {
    const double t0 = now_s();
    check(cudaStreamQuery(s), "cudaStreamQuery");
    rt.push_back((now_s() - t0) * 1e6);
  }
  std::sort(rt.begin(), rt.end());
  std::printf("sync_roundtrip_p50_us %.2f\n", rt[rt.size() / 2]);
  std::printf("sync_roundtrip_p99_us %.2f\n", rt[rt.size() * 99 / 100]);
  // Launch cost as the app thread sees it (the GPU drains the queue behind it).
  for (int round = 0; round < 2; ++round) {
    const int n = 100000;
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) empty_kernel<<<1, 32, 0, s>>>(i);
    const double t1 = now_s();
    check(cudaStreamSynchronize(s), "launches");
    if (round == 1) std::printf("launch_us %.3f\n", (t1 - t0) / n * 1e6);
  }
  // The same with room in every queue: bursts of 256 launches, the stream drained between bursts
  // (untimed). The flood above measures how fast the GPU drains empty kernels once the queues are
  // full (natively and under posd alike); this measures what a launch costs the app thread.
  {
    const int bursts = 400, per = 256;
    std::vector<double> us;
    for (int b = 0; b < bursts; ++b) {
      const double t0 = now_s();
      for (int i = 0; i < per; ++i) empty_kernel<<<1, 32, 0, s>>>(i);
      us.push_back((now_s() - t0) / per * 1e6);
      check(cudaStreamSynchronize(s), "launch bursts");
    }
    std::sort(us.begin(), us.end());
    std::printf("launch_burst256_us_p50 %.3f\n", us[us.size() / 2]);
  }
  void* dev = nullptr;
  check(cudaMalloc(&dev, max_mib << 20), "cudaMalloc");
  void* pinned = nullptr;
  check(cudaMallocHost(&pinned, max_mib << 20), "cudaMallocHost");
  std::vector<char> pageable(max_mib << 20);
  std::memset(pinned, 1, max_mib << 20);
  std::memset(pageable.data(), 1, pageable.size());
  for (size_t mib : {size_t{64}, max_mib}) {
    const size_t n = mib << 20;
    std::printf("h2d_pinned_%zuMiB_GBps %.2f\n", mib, copy_gbps(dev, pinned, n, cudaMemcpyHostToDevice, 5));
    std::printf("d2h_pinned_%zuMiB_GBps %.2f\n", mib, copy_gbps(pinned, dev, n, cudaMemcpyDeviceToHost, 5));
    std::printf("h2d_pageable_%zuMiB_GBps %.2f\n", mib, copy_gbps(dev, pageable.data(), n, cudaMemcpyHostToDevice, 3));
    std::printf("d2h_pageable_%zuMiB_GBps %.2f\n", mib, copy_gbps(pageable.data(), dev, n, cudaMemcpyDeviceToHost, 3));
  }
  check(cudaFreeHost(pinned), "cudaFreeHost");
  check(cudaFree(dev), "cudaFree");
  return 0;
}
