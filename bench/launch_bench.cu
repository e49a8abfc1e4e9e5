// launch_bench.cu — kernel launch rate: N empty-kernel launches on one stream, the app thread's cost per
// launch and launches/s until the stream drains. Built natively and against POS in-process.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void bench_empty_kernel(int) {}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 200000;
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
  for (int i = 0; i < 1000; ++i) bench_empty_kernel<<<1, 32, 0, s>>>(i);  // warm-up (module load, JIT)
  if (cudaStreamSynchronize(s) != cudaSuccess) return 1;
  const double t0 = now_s();
  for (long i = 0; i < n; ++i) bench_empty_kernel<<<1, 32, 0, s>>>(static_cast<int>(i));
  const double t1 = now_s();
  const cudaError_t e = cudaStreamSynchronize(s);
  const double t2 = now_s();
  if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) {
    std::fprintf(stderr, "launch_bench: %s\n", cudaGetErrorString(e));
    return 1;
  }
  // One launch then a sync, repeated: the latency an app sees for a dependent launch.
  const long m = n / 20 > 0 ? n / 20 : 1;
  const double t3 = now_s();
  for (long i = 0; i < m; ++i) {
    bench_empty_kernel<<<1, 32, 0, s>>>(static_cast<int>(i));
    if (cudaStreamSynchronize(s) != cudaSuccess) return 1;
  }
  const double t4 = now_s();
  std::printf("launches %ld\napp_us_per_launch %.3f\nlaunches_per_s %.0f\nlaunch_sync_us %.2f\n", n,
              (t1 - t0) * 1e6 / n, n / (t2 - t0), (t4 - t3) * 1e6 / m);
  return 0;
}
