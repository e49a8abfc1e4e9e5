// training_e2e_test.cc — the CUDA training program (nvcc-built, linked against POS in-process) runs
// through the pipeline on the host backend and prints exactly what the direct CPU computation prints.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "unittest/run_program.h"
#include "workloads/mlp_reference.h"

namespace {

std::string run_pos(const std::vector<std::string>& args, int* exit_code) {
  return pos::test::run_program("POS_MLP_TRAIN_POS", "", args, exit_code);
}

std::string run_reference(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"mlp_reference"};
  for (const auto& a : args) argv.push_back(a.c_str());
  mlp::MlpConfig cfg;
  auto r = mlp::parse_args(static_cast<int>(argv.size()), argv.data(), &cfg);
  EXPECT_TRUE(r.ok) << r.error;
  char* data = nullptr;
  size_t size = 0;
  FILE* mem = open_memstream(&data, &size);
  EXPECT_EQ(run_mlp_reference(cfg, mem), 0);
  fclose(mem);
  std::string out(data, size);
  free(data);
  return out;
}

void expect_same_training(const std::vector<std::string>& args, int steps) {
  int code = -1;
  const std::string pos_out = run_pos(args, &code);
  ASSERT_EQ(code, 0) << pos_out;
  const std::string ref = run_reference(args);
  // The loss curve and the checksum, bit for bit.
  EXPECT_EQ(pos_out, ref);
  size_t lines = 0;
  for (char ch : pos_out) lines += ch == '\n';
  EXPECT_EQ(lines, static_cast<size_t>(steps) + 1);
  EXPECT_NE(pos_out.find("checksum "), std::string::npos);
}

TEST(TrainingEndToEnd, DefaultJobThroughThePipelineMatchesTheDirectComputation) {
  expect_same_training({}, 20);
}

TEST(TrainingEndToEnd, DeeperWiderJobMatchesToo) {
  expect_same_training({"--input", "96", "--hidden", "160", "--layers", "3", "--output", "24", "--batch", "48",
                        "--steps", "12", "--seed", "7"},
                       12);
}

TEST(TrainingEndToEnd, BadArgumentsFailCleanly) {
  int code = 0;
  run_pos({"--hidden", "zero"}, &code);
  EXPECT_NE(code, 0);
}

}  // namespace
