// mlp_reference.h — the MLP training job computed directly on the CPU, with no CUDA runtime in between.
// Its stdout is the expected output of mlp_train.cu run through POS's host backend (bit for bit).
#pragma once

#include <string>
#include <vector>

#include <cstdio>

#include "workloads/mlp_common.h"

// Trains exactly as mlp_train.cu does and prints what it prints on stdout to `out`. Returns 0.
int run_mlp_reference(const mlp::MlpConfig& cfg, std::FILE* out);
// What `mlp_reference ARGS` prints on stdout (the tests' expected output); empty if ARGS are bad.
std::string mlp_reference_output(const std::vector<std::string>& args);
