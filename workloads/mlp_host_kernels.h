// mlp_host_kernels.h — the MLP workload's kernels as registered in the host backend's kernel library.
// mlp_host_kernels.cc registers them at static-initialization time; tests use this list to check the registry.
#pragma once

#include <string>
#include <vector>

// Mangled names (as nvcc registers them) of every kernel in workloads/mlp_kernels.cuh.
std::vector<std::string> mlp_kernel_names();
