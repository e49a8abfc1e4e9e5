// training_gpu_test.cc — the `gpu` suite's proof for the workload: the nvcc-built training program run
// natively (cudart + cuBLAS) and through POS on the CUDA backend prints the same loss curve and checksum.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::string run(const char* env_var, const std::string& prefix, const std::vector<std::string>& args, int* code) {
  const char* exe = std::getenv(env_var);
  if (exe == nullptr) {
    ADD_FAILURE() << env_var << " is not set (meson sets it)";
    return {};
  }
  std::string cmd = prefix + std::string(exe);
  for (const auto& a : args) cmd += " " + a;
  const std::string err = ::testing::TempDir() + "training_gpu_stderr.txt";
  cmd += " 2>" + err;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run " << cmd;
    return {};
  }
  std::string out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (*code != 0) {  // say why: the program's own error lines
    if (FILE* f = std::fopen(err.c_str(), "r")) {
      while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
      std::fclose(f);
    }
  }
  return out;
}

void expect_same_as_native(const std::vector<std::string>& args, int steps) {
  int native_code = -1, pos_code = -1;
  const std::string native = run("POS_MLP_TRAIN_NATIVE", "", args, &native_code);
  const std::string pos = run("POS_MLP_TRAIN_POS", "POS_BACKEND=cuda ", args, &pos_code);
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
