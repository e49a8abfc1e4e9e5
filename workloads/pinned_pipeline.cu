// pinned_pipeline.cu — a CUDA program the dump/restore tests never shaped: two streams ordered by
// events, cuBLAS on one of them, cudaMallocHost buffers a second host thread fills while the GPU works.
// Deterministic: it prints a running checksum every 50 steps and the final state's, so a run that
// was dumped and restored mid-way must print exactly what an uninterrupted run prints.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CHECK_BLAS(x)                                                          \
  do {                                                                         \
    cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      std::fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// W <- 0.999 W + 0.001 tanh(Y): the state every step changes.
__global__ void update(float* w, const float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] = 0.999f * w[i] + 0.001f * tanhf(y[i]);
}

// The producer's input for step s: a deterministic function of (s, i).
float input_value(int s, int i) { return static_cast<float>(((s * 131 + i * 7) % 1000) - 500) / 500.0f; }

// Two pinned input slots: the producer fills slot s % 2 for step s while the GPU consumes the other.
struct Slots {
  std::mutex mu;
  std::condition_variable cv;
  int filled = -1;    // the newest step whose input is ready
  int consumed = -1;  // the newest step whose input the GPU has read
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 400, n = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--n") == 0) n = std::atoi(argv[i + 1]);
  }
  if (steps <= 0 || n <= 0 || n > 4096) {
    std::fprintf(stderr, "usage: pinned_pipeline [--steps N] [--n DIM <= 4096]\n");
    return 2;
  }
  const size_t elems = static_cast<size_t>(n) * n, bytes = elems * sizeof(float);
  float* in[2] = {nullptr, nullptr};
  float* out = nullptr;
  for (auto& p : in) CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), bytes));
  CHECK(cudaMallocHost(reinterpret_cast<void**>(&out), bytes));
  float *w = nullptr, *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(&w, bytes));
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  std::vector<float> w0(elems);
  for (size_t i = 0; i < elems; ++i) w0[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 1000.0f;
  CHECK(cudaMemcpy(w, w0.data(), bytes, cudaMemcpyHostToDevice));
  cudaStream_t copy_stream, compute_stream;
  CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreate(&compute_stream));
  cudaEvent_t input_in, step_done;
  CHECK(cudaEventCreateWithFlags(&input_in, cudaEventDisableTiming));
  CHECK(cudaEventCreate(&step_done));
  cublasHandle_t blas;
  CHECK_BLAS(cublasCreate(&blas));
  CHECK_BLAS(cublasSetStream(blas, compute_stream));

  Slots slots;
  std::thread producer([&] {
    for (int s = 0; s < steps; ++s) {
      {
        std::unique_lock<std::mutex> lk(slots.mu);
        slots.cv.wait(lk, [&] { return slots.consumed >= s - 2; });  // slot s % 2 is free again
      }
      float* p = in[s % 2];
      for (size_t i = 0; i < elems; ++i) p[i] = input_value(s, static_cast<int>(i));
      std::lock_guard<std::mutex> lk(slots.mu);
      slots.filled = s;
      slots.cv.notify_all();
    }
  });

  double running = 0;
  const float alpha = 1.0f / static_cast<float>(n), beta = 0.0f;
  for (int s = 0; s < steps; ++s) {
    {
      std::unique_lock<std::mutex> lk(slots.mu);
      slots.cv.wait(lk, [&] { return slots.filled >= s; });
    }
    CHECK(cudaMemcpyAsync(x, in[s % 2], bytes, cudaMemcpyHostToDevice, copy_stream));
    CHECK(cudaEventRecord(input_in, copy_stream));
    CHECK(cudaEventSynchronize(input_in));
    {
      std::lock_guard<std::mutex> lk(slots.mu);
      slots.consumed = s;
      slots.cv.notify_all();
    }
    CHECK(cudaStreamWaitEvent(compute_stream, input_in, 0));
    CHECK_BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, w, n, x, n, &beta, y, n));
    update<<<static_cast<unsigned>((elems + 255) / 256), 256, 0, compute_stream>>>(w, y, static_cast<int>(elems));
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(step_done, compute_stream));
    CHECK(cudaStreamWaitEvent(copy_stream, step_done, 0));
    CHECK(cudaMemcpyAsync(out, y, bytes, cudaMemcpyDeviceToHost, copy_stream));
    CHECK(cudaStreamSynchronize(copy_stream));
    double sum = 0;
    for (size_t i = 0; i < elems; ++i) sum += out[i];
    running += sum;
    if ((s + 1) % 50 == 0) std::printf("step %d checksum %.9e\n", s + 1, running);
    std::fflush(stdout);
  }
  producer.join();
  CHECK(cudaMemcpy(w0.data(), w, bytes, cudaMemcpyDeviceToHost));
  double final_sum = 0;
  for (float v : w0) final_sum += v;
  std::printf("final %.9e\n", final_sum);
  CHECK_BLAS(cublasDestroy(blas));
  CHECK(cudaEventDestroy(input_in));
  CHECK(cudaEventDestroy(step_done));
  CHECK(cudaStreamDestroy(copy_stream));
  CHECK(cudaStreamDestroy(compute_stream));
  CHECK(cudaFree(w));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  for (auto& p : in) CHECK(cudaFreeHost(p));
  CHECK(cudaFreeHost(out));
  return 0;
}
