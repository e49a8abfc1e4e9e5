// mlp_train.cu — an ordinary CUDA + cuBLAS program: trains an MLP with SGD on synthetic data.
// POS's test workload: runs natively, or under POS (host backend / checkpoint / migration); stdout must match mlp_reference.
//
// stdout carries only the per-step losses and the final parameter checksum (compared byte for byte
// with the CPU reference); diagnostics and timing go to stderr. Parameters are initialized on the
// device and read back in bounded chunks, so host memory stays small however large the model is.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "workloads/mlp_common.h"
#include "workloads/mlp_kernels.cuh"

namespace {

const char* kProg = "mlp_train";

[[noreturn]] void fail(const char* api, const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", api, what);
  std::exit(1);
}

void check(cudaError_t e, const char* api) {
  if (e != cudaSuccess) fail(api, cudaGetErrorName(e));
}

// Spelled out here rather than asking cuBLAS, so an error report does not depend on one more entry point.
const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

void check(cublasStatus_t s, const char* api) {
  if (s != CUBLAS_STATUS_SUCCESS) fail(api, cublas_status_name(s));
}

cudaStream_t g_stream = nullptr;
cublasHandle_t g_blas = nullptr;

// Every launch goes through here: same geometry as the reference's run_kernel_direct, then the
// launch error check.
template <auto Kernel, typename... Args>
void launch(const char* name, mlp::Launch l, Args... args) {
  Kernel<<<l.grid, l.block, 0, g_stream>>>(args...);
  check(cudaGetLastError(), name);
}

void sgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A, int lda,
           const float* B, int ldb, float* C, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasSgemm(g_blas, ta, tb, m, n, k, &one, A, lda, B, ldb, &zero, C, ldc), "cublasSgemm");
}

float* device_floats(long long count) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(count) * sizeof(float)), "cudaMalloc");
  return static_cast<float*>(p);
}

float* pinned_floats(long long count) {
  void* p = nullptr;
  check(cudaMallocHost(&p, static_cast<size_t>(count) * sizeof(float)), "cudaMallocHost");
  return static_cast<float*>(p);
}

// --prefetch N: each step's batch is made ahead, on N threads, into one of two pinned slots (step s
// into slot s % 2), while the step before runs; a step waits only for a batch not made yet. A slot
// is refilled once the step that used it has synchronized (its copies to the device are done).
class Prefetcher {
 public:
  Prefetcher(const mlp::DataGen& data, int threads, long long batch, int steps, float* const x[2], float* const t[2])
      : data_(data), threads_(threads), batch_(batch), steps_(steps), x_{x[0], x[1]}, t_{t[0], t[1]} {
    producer_ = std::thread([this] { produce(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    producer_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  int take(int step) {  // the slot holding step's batch, once made
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return made_[step & 1] == step; });
    return step & 1;
  }
  void release(int step) {  // step's copies are done: its slot may take the step after next
    {
      std::lock_guard<std::mutex> lk(mu_);
      made_[step & 1] = -1;
    }
    cv_.notify_all();
  }

 private:
  void produce() {
    for (int s = 0; s < steps_; ++s) {
      const int slot = s & 1;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || made_[slot] == -1; });
        if (stop_) return;
      }
      // Disjoint ranges of samples, one per thread (this one takes the first).
      std::vector<std::thread> helpers;
      const long long per = (batch_ + threads_ - 1) / threads_;
      for (int k = 1; k < threads_; ++k) {
        const long long first = std::min(batch_, k * per), end = std::min(batch_, (k + 1) * per);
        if (first < end) helpers.emplace_back([=, this] { data_.batch_range(s, x_[slot], t_[slot], first, end); });
      }
      data_.batch_range(s, x_[slot], t_[slot], 0, std::min(batch_, per));
      for (std::thread& h : helpers) h.join();
      {
        std::lock_guard<std::mutex> lk(mu_);
        made_[slot] = s;
      }
      cv_.notify_all();
    }
  }

  const mlp::DataGen& data_;
  const int threads_;
  const long long batch_;
  const int steps_;
  float* const x_[2];
  float* const t_[2];
  std::mutex mu_;
  std::condition_variable cv_;
  int made_[2] = {-1, -1};  // guarded by mu_: the step whose batch the slot holds (-1: free)
  bool stop_ = false;       // guarded by mu_
  std::thread producer_;
};

}  // namespace

int main(int argc, char** argv) {
  mlp::MlpConfig cfg;
  if (int rc = mlp::parse_args_or_exit_code(argc, argv, &cfg); rc >= 0) return rc;
  mlp::describe(stderr, kProg, cfg);

  const std::vector<int> d = mlp::layer_dims(cfg);
  const int nl = cfg.layers + 1;  // weight layers
  const int batch = cfg.batch;

  check(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cublasCreate(&g_blas), "cublasCreate");
  check(cublasSetStream(g_blas, g_stream), "cublasSetStream");
  check(cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  cudaEvent_t t_start = nullptr, t_stop = nullptr;
  check(cudaEventCreate(&t_start), "cudaEventCreate");
  check(cudaEventCreate(&t_stop), "cudaEventCreate");
  check(cudaEventRecord(t_start, g_stream), "cudaEventRecord");

  // Parameters: one allocation per tensor, in layer order W0, b0, W1, b1, ...
  std::vector<float*> W(nl), B(nl);
  long long max_w = 0, max_b = 0, max_act = 0;
  for (int l = 0; l < nl; ++l) {
    const long long nw = mlp::weight_count(d, l);
    W[l] = device_floats(nw);
    B[l] = device_floats(d[l + 1]);
    max_w = std::max(max_w, nw);
    max_b = std::max<long long>(max_b, d[l + 1]);
    max_act = std::max(max_act, static_cast<long long>(d[l + 1]) * batch);
    const float scale = mlp::init_scale(d[l]);
    launch<&mlp_init_uniform>("mlp_init_uniform", mlp::launch_for(nw), W[l], nw,
                              static_cast<unsigned long long>(mlp::tensor_seed(cfg, 2 * l)), scale);
    launch<&mlp_init_uniform>("mlp_init_uniform", mlp::launch_for(d[l + 1]), B[l], static_cast<long long>(d[l + 1]),
                              static_cast<unsigned long long>(mlp::tensor_seed(cfg, 2 * l + 1)), scale);
  }
  // act[0] is the input batch; act[l+1] is layer l's output (post-ReLU for hidden layers).
  std::vector<float*> act(nl + 1);
  for (int l = 0; l <= nl; ++l) act[l] = device_floats(static_cast<long long>(d[l]) * batch);
  float* d_target = device_floats(static_cast<long long>(cfg.output) * batch);
  // Backward ping-pongs between two delta buffers, and each layer is updated as soon as its gradient
  // is known (after its input gradient used the old weights), so one gradient buffer serves all layers.
  float* delta[2] = {device_floats(max_act), device_floats(max_act)};
  float* grad_w = device_floats(max_w);
  float* grad_b = device_floats(max_b);
  float* d_sample_loss = device_floats(batch);
  float* d_loss = device_floats(1);

  float* reserve = nullptr;
  const long long reserve_count = static_cast<long long>(cfg.reserve_mib) * (1 << 20) / sizeof(float);
  if (reserve_count > 0) {
    reserve = device_floats(reserve_count);
    launch<&mlp_init_uniform>("mlp_init_uniform", mlp::launch_for(reserve_count), reserve, reserve_count,
                              static_cast<unsigned long long>(mlp::reserve_seed(cfg)), 1.0f);
  }

  // Two slots of batch buffers with --prefetch (one made while the other is used), else one.
  float* h_x[2] = {pinned_floats(static_cast<long long>(cfg.input) * batch), nullptr};
  float* h_t[2] = {pinned_floats(static_cast<long long>(cfg.output) * batch), nullptr};
  if (cfg.prefetch > 0) {
    h_x[1] = pinned_floats(static_cast<long long>(cfg.input) * batch);
    h_t[1] = pinned_floats(static_cast<long long>(cfg.output) * batch);
  }
  float* h_loss = pinned_floats(1);
  const mlp::DataGen data(cfg);
  std::unique_ptr<Prefetcher> prefetch;
  if (cfg.prefetch > 0) prefetch = std::make_unique<Prefetcher>(data, cfg.prefetch, batch, cfg.steps, h_x, h_t);
  const float lr = mlp::learning_rate(cfg);

  // Step time on the host clock, from the second step on (the first includes lazy module loading);
  // every step ends with a stream sync, so this is the time the job sees.
  auto t_steps = std::chrono::steady_clock::now();
  for (int step = 0; step < cfg.steps; ++step) {
    const auto t_step = std::chrono::steady_clock::now();
    const auto w_step = std::chrono::system_clock::now();
    if (step == 1) t_steps = t_step;
    // The previous step ended with a stream sync, so the pinned batch buffers are free to refill.
    int slot = 0;
    if (prefetch) slot = prefetch->take(step);
    else data.batch(step, h_x[0], h_t[0]);
    const auto t_gen = std::chrono::steady_clock::now();
    check(cudaMemcpyAsync(act[0], h_x[slot], sizeof(float) * cfg.input * batch, cudaMemcpyHostToDevice, g_stream),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(d_target, h_t[slot], sizeof(float) * cfg.output * batch, cudaMemcpyHostToDevice, g_stream),
          "cudaMemcpyAsync");

    for (int l = 0; l < nl; ++l) {
      const int rows = d[l + 1];
      sgemm(CUBLAS_OP_N, CUBLAS_OP_N, rows, batch, d[l], W[l], rows, act[l], d[l], act[l + 1], rows);
      if (l + 1 < nl) {
        launch<&mlp_bias_relu_forward>("mlp_bias_relu_forward", mlp::launch_for(static_cast<long long>(rows) * batch),
                                       act[l + 1], static_cast<const float*>(B[l]), rows, batch);
      } else {
        launch<&mlp_bias_add_forward>("mlp_bias_add_forward", mlp::launch_for(static_cast<long long>(rows) * batch),
                                      act[l + 1], static_cast<const float*>(B[l]), rows, batch);
      }
    }

    int cur = 0;
    launch<&mlp_mse_output_grad>("mlp_mse_output_grad", mlp::launch_for(batch), delta[cur], d_sample_loss,
                                 static_cast<const float*>(act[nl]), static_cast<const float*>(d_target), cfg.output,
                                 batch, mlp::grad_scale(cfg));
    launch<&mlp_loss_sum>("mlp_loss_sum", mlp::kSingleThread, d_loss, static_cast<const float*>(d_sample_loss), batch,
                          mlp::loss_scale(cfg));

    for (int l = nl - 1; l >= 0; --l) {
      const int rows = d[l + 1], cols = d[l];
      const long long nw = mlp::weight_count(d, l);
      const bool trained = l >= cfg.frozen;
      if (trained) {
        sgemm(CUBLAS_OP_N, CUBLAS_OP_T, rows, cols, batch, delta[cur], rows, act[l], cols, grad_w, rows);
        launch<&mlp_bias_grad>("mlp_bias_grad", mlp::launch_for(rows), grad_b, static_cast<const float*>(delta[cur]),
                               rows, batch);
      }
      if (l > 0) {
        sgemm(CUBLAS_OP_T, CUBLAS_OP_N, cols, batch, rows, W[l], rows, delta[cur], rows, delta[1 - cur], cols);
        const long long n = static_cast<long long>(cols) * batch;
        launch<&mlp_relu_backward>("mlp_relu_backward", mlp::launch_for(n), delta[1 - cur],
                                   static_cast<const float*>(act[l]), n);
      }
      if (trained) {
        launch<&mlp_sgd_update>("mlp_sgd_update", mlp::launch_for(nw), W[l], static_cast<const float*>(grad_w), nw,
                                lr);
        launch<&mlp_sgd_update>("mlp_sgd_update", mlp::launch_for(rows), B[l], static_cast<const float*>(grad_b),
                                static_cast<long long>(rows), lr);
      }
      cur = 1 - cur;
    }

    check(cudaMemcpyAsync(h_loss, d_loss, sizeof(float), cudaMemcpyDeviceToHost, g_stream), "cudaMemcpyAsync");
    const auto t_issued = std::chrono::steady_clock::now();
    check(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
    if (prefetch) prefetch->release(step);
    if (cfg.step_times) {
      // Start and end on the monotonic clock (seconds) as well, so a step can be matched with what
      // else happened meanwhile (POS_CHECKPOINT's drain line uses the same clock); and the start on
      // the wall clock (wall_s), which is what measures a pause across a CRIU restore: CRIU
      // restores a process with its monotonic clock moved back by the time it was frozen (a time
      // namespace), so the monotonic times hide that part of the pause.
      const auto t_end = std::chrono::steady_clock::now();
      auto secs = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(t.time_since_epoch()).count();
      };
      const double wall_start = std::chrono::duration<double>(w_step.time_since_epoch()).count();
      // Then the step's three phases (ms), to tell where a slow step lost its time: the host-side
      // batch generation (the GPU idles meanwhile), issuing the step's GPU work, and waiting for it.
      auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
      std::fprintf(stderr, "step %d time_ms %.4f start_s %.6f end_s %.6f wall_s %.6f gen_ms %.4f issue_ms %.4f wait_ms %.4f\n",
                   step, ms(t_step, t_end), secs(t_step), secs(t_end), wall_start, ms(t_step, t_gen),
                   ms(t_gen, t_issued), ms(t_issued, t_end));
    }
    mlp::print_step(stdout, step, *h_loss);
    std::fflush(stdout);
  }
  if (cfg.steps > 1) {
    const double step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_steps).count() / (cfg.steps - 1);
    std::fprintf(stderr, "%s: mean step time %.4f ms (steps 2..%d)\n", kProg, step_ms, cfg.steps);
  }

  // Checksum in layer order through a bounded pinned staging buffer (at most 256 MiB).
  const long long stage_count = std::min<long long>(std::max(max_w, max_b), (256ll << 20) / sizeof(float));
  float* stage = pinned_floats(stage_count);
  mlp::ParamChecksum sum;
  for (int l = 0; l < nl; ++l) {
    const float* tensors[2] = {W[l], B[l]};
    const long long counts[2] = {mlp::weight_count(d, l), d[l + 1]};
    for (int t = 0; t < 2; ++t) {
      for (long long off = 0; off < counts[t]; off += stage_count) {
        const long long n = std::min(stage_count, counts[t] - off);
        check(cudaMemcpyAsync(stage, tensors[t] + off, sizeof(float) * n, cudaMemcpyDeviceToHost, g_stream),
              "cudaMemcpyAsync");
        check(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
        sum.add(stage, static_cast<size_t>(n));
      }
    }
  }
  mlp::print_checksum(stdout, sum);
  if (reserve != nullptr) {
    mlp::ParamChecksum rs;
    for (long long off = 0; off < reserve_count; off += stage_count) {
      const long long n = std::min(stage_count, reserve_count - off);
      check(cudaMemcpyAsync(stage, reserve + off, sizeof(float) * n, cudaMemcpyDeviceToHost, g_stream), "cudaMemcpyAsync");
      check(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
      rs.add(stage, static_cast<size_t>(n));
    }
    mlp::print_reserve_checksum(stdout, rs);
  }
  std::fflush(stdout);

  check(cudaEventRecord(t_stop, g_stream), "cudaEventRecord");
  check(cudaEventSynchronize(t_stop), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, t_start, t_stop), "cudaEventElapsedTime");
  std::fprintf(stderr, "%s: %d steps, whole run %.3f ms (init, training, checksum)\n", kProg, cfg.steps, ms);

  check(cudaFreeHost(stage), "cudaFreeHost");
  check(cudaFreeHost(h_loss), "cudaFreeHost");
  prefetch.reset();  // its threads write the slots
  for (float* p : {h_t[1], h_x[1], h_t[0], h_x[0]})
    if (p != nullptr) check(cudaFreeHost(p), "cudaFreeHost");
  if (reserve != nullptr) check(cudaFree(reserve), "cudaFree");
  for (float* p : {d_loss, d_sample_loss, grad_b, grad_w, delta[1], delta[0], d_target}) check(cudaFree(p), "cudaFree");
  for (float* p : act) check(cudaFree(p), "cudaFree");
  for (int l = 0; l < nl; ++l) {
    check(cudaFree(B[l]), "cudaFree");
    check(cudaFree(W[l]), "cudaFree");
  }
  check(cublasDestroy(g_blas), "cublasDestroy");
  check(cudaEventDestroy(t_stop), "cudaEventDestroy");
  check(cudaEventDestroy(t_start), "cudaEventDestroy");
  check(cudaStreamDestroy(g_stream), "cudaStreamDestroy");
  return 0;
}
