// mlp_reference.cc — mlp_train.cu's computation, step for step, on host buffers.
// Same kernels (run_kernel_direct, same grid/block) and same GEMM calls (cpu_blas, same arguments, same order).
//
// Read it side by side with mlp_train.cu: each device buffer is a std::vector here, each launch a
// run_kernel_direct, each cublasSgemm a pos::host::sgemm; copies become plain reads/writes.
#include "workloads/mlp_reference.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "pos/backends/host/cpu_blas.h"
#include "pos/backends/host/host_kernels.h"
#include "workloads/mlp_kernels.cuh"

namespace {

using pos::host::BlasOp;

template <auto Kernel, typename... Args>
void launch(mlp::Launch l, Args... args) {
  pos::host::run_kernel_direct<Kernel>(pos::host::emu::Dim3{l.grid}, pos::host::emu::Dim3{l.block}, args...);
}

void sgemm(BlasOp ta, BlasOp tb, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C,
           int ldc) {
  pos::host::sgemm(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

std::vector<float> floats(long long count) { return std::vector<float>(static_cast<size_t>(count)); }

}  // namespace

int run_mlp_reference(const mlp::MlpConfig& cfg, std::FILE* out) {
  const std::vector<int> d = mlp::layer_dims(cfg);
  const int nl = cfg.layers + 1;
  const int batch = cfg.batch;

  std::vector<std::vector<float>> W(nl), B(nl);
  long long max_w = 0, max_b = 0, max_act = 0;
  for (int l = 0; l < nl; ++l) {
    const long long nw = mlp::weight_count(d, l);
    W[l] = floats(nw);
    B[l] = floats(d[l + 1]);
    max_w = std::max(max_w, nw);
    max_b = std::max<long long>(max_b, d[l + 1]);
    max_act = std::max(max_act, static_cast<long long>(d[l + 1]) * batch);
    const float scale = mlp::init_scale(d[l]);
    launch<&mlp_init_uniform>(mlp::launch_for(nw), W[l].data(), nw,
                              static_cast<unsigned long long>(mlp::tensor_seed(cfg, 2 * l)), scale);
    launch<&mlp_init_uniform>(mlp::launch_for(d[l + 1]), B[l].data(), static_cast<long long>(d[l + 1]),
                              static_cast<unsigned long long>(mlp::tensor_seed(cfg, 2 * l + 1)), scale);
  }
  std::vector<std::vector<float>> act(nl + 1);
  for (int l = 0; l <= nl; ++l) act[l] = floats(static_cast<long long>(d[l]) * batch);
  std::vector<float> target = floats(static_cast<long long>(cfg.output) * batch);
  std::vector<float> delta[2] = {floats(max_act), floats(max_act)};
  std::vector<float> grad_w = floats(max_w);
  std::vector<float> grad_b = floats(max_b);
  std::vector<float> sample_loss = floats(batch);
  float loss = 0.0f;
  const mlp::DataGen data(cfg);
  const float lr = mlp::learning_rate(cfg);

  for (int step = 0; step < cfg.steps; ++step) {
    // The GPU program stages through pinned buffers and copies; here the batch lands in place.
    data.batch(step, act[0].data(), target.data());

    for (int l = 0; l < nl; ++l) {
      const int rows = d[l + 1];
      sgemm(BlasOp::kN, BlasOp::kN, rows, batch, d[l], W[l].data(), rows, act[l].data(), d[l], act[l + 1].data(),
            rows);
      if (l + 1 < nl) {
        launch<&mlp_bias_relu_forward>(mlp::launch_for(static_cast<long long>(rows) * batch), act[l + 1].data(),
                                       static_cast<const float*>(B[l].data()), rows, batch);
      } else {
        launch<&mlp_bias_add_forward>(mlp::launch_for(static_cast<long long>(rows) * batch), act[l + 1].data(),
                                      static_cast<const float*>(B[l].data()), rows, batch);
      }
    }

    int cur = 0;
    launch<&mlp_mse_output_grad>(mlp::launch_for(batch), delta[cur].data(), sample_loss.data(),
                                 static_cast<const float*>(act[nl].data()), static_cast<const float*>(target.data()),
                                 cfg.output, batch, mlp::grad_scale(cfg));
    launch<&mlp_loss_sum>(mlp::kSingleThread, &loss, static_cast<const float*>(sample_loss.data()), batch,
                          mlp::loss_scale(cfg));

    for (int l = nl - 1; l >= 0; --l) {
      const int rows = d[l + 1], cols = d[l];
      const long long nw = mlp::weight_count(d, l);
      const bool trained = l >= cfg.frozen;
      if (trained) {
        sgemm(BlasOp::kN, BlasOp::kT, rows, cols, batch, delta[cur].data(), rows, act[l].data(), cols, grad_w.data(),
              rows);
        launch<&mlp_bias_grad>(mlp::launch_for(rows), grad_b.data(), static_cast<const float*>(delta[cur].data()), rows,
                               batch);
      }
      if (l > 0) {
        sgemm(BlasOp::kT, BlasOp::kN, cols, batch, rows, W[l].data(), rows, delta[cur].data(), rows,
              delta[1 - cur].data(), cols);
        const long long n = static_cast<long long>(cols) * batch;
        launch<&mlp_relu_backward>(mlp::launch_for(n), delta[1 - cur].data(), static_cast<const float*>(act[l].data()),
                                   n);
      }
      if (trained) {
        launch<&mlp_sgd_update>(mlp::launch_for(nw), W[l].data(), static_cast<const float*>(grad_w.data()), nw, lr);
        launch<&mlp_sgd_update>(mlp::launch_for(rows), B[l].data(), static_cast<const float*>(grad_b.data()),
                                static_cast<long long>(rows), lr);
      }
      cur = 1 - cur;
    }

    mlp::print_step(out, step, loss);
    std::fflush(out);
  }

  mlp::ParamChecksum sum;
  for (int l = 0; l < nl; ++l) {
    sum.add(W[l].data(), W[l].size());
    sum.add(B[l].data(), B[l].size());
  }
  mlp::print_checksum(out, sum);
  if (cfg.reserve_mib > 0) {
    const long long count = static_cast<long long>(cfg.reserve_mib) * (1 << 20) / sizeof(float);
    std::vector<float> reserve(static_cast<size_t>(count));
    launch<&mlp_init_uniform>(mlp::launch_for(count), reserve.data(), count,
                              static_cast<unsigned long long>(mlp::reserve_seed(cfg)), 1.0f);
    mlp::ParamChecksum rs;
    rs.add(reserve.data(), reserve.size());
    mlp::print_reserve_checksum(out, rs);
  }
  std::fflush(out);
  return 0;
}

std::string mlp_reference_output(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"mlp_reference"};
  for (const auto& a : args) argv.push_back(a.c_str());
  mlp::MlpConfig cfg;
  if (!mlp::parse_args(static_cast<int>(argv.size()), argv.data(), &cfg).ok) return {};
  char* data = nullptr;
  size_t size = 0;
  FILE* mem = open_memstream(&data, &size);
  const int rc = run_mlp_reference(cfg, mem);
  std::fclose(mem);
  std::string out = rc == 0 ? std::string(data, size) : std::string();
  std::free(data);
  return out;
}
