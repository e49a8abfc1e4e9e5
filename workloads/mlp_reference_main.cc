// mlp_reference_main.cc — command-line front end of the CPU reference; same arguments as mlp_train.
// Tests run it next to mlp_train under POS and compare the two stdouts byte for byte.
#include <chrono>
#include <cstdio>

#include "workloads/mlp_common.h"
#include "workloads/mlp_reference.h"

int main(int argc, char** argv) {
  mlp::MlpConfig cfg;
  if (int rc = mlp::parse_args_or_exit_code(argc, argv, &cfg); rc >= 0) return rc;
  mlp::describe(stderr, "mlp_reference", cfg);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run_mlp_reference(cfg, stdout);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "mlp_reference: %d steps, whole run %.3f ms (init, training, checksum)\n", cfg.steps, ms);
  return rc;
}
