// copy_bench.cu — cudaMemcpy bandwidth H2D / D2H / D2D at 4 MiB .. 8 GiB, from pinned and pageable host
// memory. Built twice (bench/meson.build): natively and against POS in-process; tools/gpu_run.sh joins them.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "copy_bench: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GB/s of `reps` copies of n bytes after one warm-up copy.
double measure(void* dst, const void* src, size_t n, cudaMemcpyKind kind, int reps) {
  if (!ok(cudaMemcpy(dst, src, n, kind), "warm-up copy")) return -1;
  if (!ok(cudaDeviceSynchronize(), "sync")) return -1;
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i)
    if (!ok(cudaMemcpy(dst, src, n, kind), "copy")) return -1;
  if (!ok(cudaDeviceSynchronize(), "sync")) return -1;
  return static_cast<double>(n) * reps / (now_s() - t0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  // Sizes in MiB; the largest decides the buffers.
  std::vector<size_t> mib = {4, 64, 1024, 8192};
  if (argc > 1) {
    mib.clear();
    for (int i = 1; i < argc; ++i) mib.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  size_t max_n = 0;
  for (size_t m : mib) max_n = std::max(max_n, m << 20);
  void *d0 = nullptr, *d1 = nullptr, *pinned = nullptr;
  if (!ok(cudaMalloc(&d0, max_n), "cudaMalloc") || !ok(cudaMalloc(&d1, max_n), "cudaMalloc") ||
      !ok(cudaMallocHost(&pinned, max_n), "cudaMallocHost"))
    return 1;
  auto* pageable = static_cast<unsigned char*>(std::malloc(max_n));
  if (pageable == nullptr) return 1;
  std::memset(pageable, 1, max_n);  // fault the pages in: measure copies, not page faults
  std::memset(pinned, 2, max_n);
  if (!ok(cudaMemset(d0, 3, max_n), "cudaMemset") || !ok(cudaMemset(d1, 4, max_n), "cudaMemset")) return 1;
  std::printf("# direction host_memory MiB GB/s\n");
  for (size_t m : mib) {
    const size_t n = m << 20;
    const int reps = static_cast<int>(std::max<size_t>(3, std::min<size_t>(50, (4ull << 30) / n)));
    std::printf("H2D pinned %zu %.2f\n", m, measure(d0, pinned, n, cudaMemcpyHostToDevice, reps));
    std::printf("D2H pinned %zu %.2f\n", m, measure(pinned, d0, n, cudaMemcpyDeviceToHost, reps));
    std::printf("H2D pageable %zu %.2f\n", m, measure(d0, pageable, n, cudaMemcpyHostToDevice, reps));
    std::printf("D2H pageable %zu %.2f\n", m, measure(pageable, d0, n, cudaMemcpyDeviceToHost, reps));
    std::printf("D2D device %zu %.2f\n", m, measure(d1, d0, n, cudaMemcpyDeviceToDevice, reps));
    std::fflush(stdout);
  }
  std::free(pageable);
  return ok(cudaFreeHost(pinned), "cudaFreeHost") && ok(cudaFree(d0), "cudaFree") && ok(cudaFree(d1), "cudaFree") ? 0 : 1;
}
