// training_gpu_test.cc — the `gpu` suite's proof for the workload: the nvcc-built training program run
// natively (cudart + cuBLAS) and through POS on the CUDA backend prints the same loss curve and checksum.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "unittest/run_program.h"

namespace {

void expect_same_as_native(const std::vector<std::string>& args, int steps) {
  int native_code = -1, pos_code = -1;
  const std::string native = pos::test::run_program("POS_MLP_TRAIN_NATIVE", "", args, &native_code);
  const std::string pos = pos::test::run_program("POS_MLP_TRAIN_POS", "POS_BACKEND=cuda ", args, &pos_code);
  ASSERT_EQ(native_code, 0) << native;
  ASSERT_EQ(pos_code, 0) << pos;
  size_t lines = 0;
  for (char ch : pos) lines += ch == '\n';
  EXPECT_EQ(lines, static_cast<size_t>(steps) + 1);
  ASSERT_NE(pos.find("checksum "), std::string::npos);
  // Same kernels, same cuBLAS entry points, same GPU: bit for bit.
  EXPECT_EQ(pos, native);
}

TEST(TrainingOnGpu, DefaultJobThroughPosMatchesTheNativeRun) { expect_same_as_native({}, 20); }

TEST(TrainingOnGpu, LargerJobThroughPosMatchesTheNativeRun) {
  expect_same_as_native({"--input", "512", "--hidden", "2048", "--layers", "4", "--output", "128", "--batch", "256",
                         "--steps", "30", "--seed", "11"},
                        30);
}

}  // namespace
