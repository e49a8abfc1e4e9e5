// mlp_host_kernels.cc — puts the MLP kernels (mlp_kernels.cuh compiled by g++) into the host kernel library.
// When mlp_train.cu runs on the host backend, its launches are looked up here by the name nvcc registered.
//
// The names are the Itanium mangling of each global-scope __global__ function, exactly as they appear
// in the fatbinary and in __cudaRegisterFunction (checked with nvcc -c + nm / -ptx). A kernel whose
// signature changes gets a new name, and the registry test catches the stale string.
#include "workloads/mlp_host_kernels.h"

#include "pos/backends/host/host_kernels.h"
#include "workloads/mlp_kernels.cuh"

namespace {

constexpr const char* kInitUniform = "_Z16mlp_init_uniformPfxyf";
constexpr const char* kBiasReluForward = "_Z21mlp_bias_relu_forwardPfPKfii";
constexpr const char* kBiasAddForward = "_Z20mlp_bias_add_forwardPfPKfii";
constexpr const char* kReluBackward = "_Z17mlp_relu_backwardPfPKfx";
constexpr const char* kBiasGrad = "_Z13mlp_bias_gradPfPKfii";
constexpr const char* kMseOutputGrad = "_Z19mlp_mse_output_gradPfS_PKfS1_iif";
constexpr const char* kLossSum = "_Z12mlp_loss_sumPfPKfif";
constexpr const char* kSgdUpdate = "_Z14mlp_sgd_updatePfPKfxf";

POS_HOST_KERNEL(r_init_uniform, &mlp_init_uniform, kInitUniform);
POS_HOST_KERNEL(r_bias_relu_forward, &mlp_bias_relu_forward, kBiasReluForward);
POS_HOST_KERNEL(r_bias_add_forward, &mlp_bias_add_forward, kBiasAddForward);
POS_HOST_KERNEL(r_relu_backward, &mlp_relu_backward, kReluBackward);
POS_HOST_KERNEL(r_bias_grad, &mlp_bias_grad, kBiasGrad);
POS_HOST_KERNEL(r_mse_output_grad, &mlp_mse_output_grad, kMseOutputGrad);
POS_HOST_KERNEL(r_loss_sum, &mlp_loss_sum, kLossSum);
POS_HOST_KERNEL(r_sgd_update, &mlp_sgd_update, kSgdUpdate);

}  // namespace

std::vector<std::string> mlp_kernel_names() {
  return {kInitUniform, kBiasReluForward, kBiasAddForward, kReluBackward,
          kBiasGrad,    kMseOutputGrad,   kLossSum,        kSgdUpdate};
}
