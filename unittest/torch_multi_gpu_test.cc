// torch_multi_gpu_test.cc — stock PyTorch restored onto another GPU (multigpu suite: a machine with
// two GPUs of one model, PyTorch and CRIU): workloads/torch_train.py trains under `pos run` on GPU 0,
// `pos-cli dump` stops it mid-run, `pos-cli restore --device 1` brings it back on GPU 1, where it
// runs to the end and prints exactly what an uninterrupted run prints (docs/driver_runtime.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "unittest/run_program.h"

namespace {

namespace fs = std::filesystem;

std::string env(const char* name) { return pos::test::env_or_fail(name); }
std::string read_file(const fs::path& p) { return pos::test::read_text_file(p.string()); }

std::string json_text(const std::string& j, const std::string& key) {
  const size_t at = j.find("\"" + key + "\":\"");
  if (at == std::string::npos) return "";
  return j.substr(at + key.size() + 4, j.find('"', at + key.size() + 4) - (at + key.size() + 4));
}

// nvidia-smi's GPUs: index → UUID, in its (PCI bus) order.
std::vector<std::string> gpu_uuids() {
  int code = -1;
  std::istringstream in(pos::test::run_shell("nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader", &code));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(", "), b = line.find(", ", a + 2);
    if (a != std::string::npos && b != std::string::npos) out.push_back(line.substr(a + 2, b - a - 2));
  }
  return out;
}

std::vector<std::string> gpu_names() {
  int code = -1;
  std::istringstream in(pos::test::run_shell("nvidia-smi --query-gpu=name --format=csv,noheader", &code));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The UUIDs of the GPUs on which nvidia-smi sees process `pid` hold memory.
std::vector<std::string> gpus_of(pid_t pid) {
  int code = -1;
  std::istringstream in(
      pos::test::run_shell("nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader", &code));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const size_t comma = line.find(", ");
    if (comma != std::string::npos && std::atoi(line.c_str()) == pid) out.push_back(line.substr(comma + 2));
  }
  return out;
}

// Until `file` holds `text` (at most `seconds`).
bool wait_for(const fs::path& file, const std::string& text, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (read_file(file).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

class TorchOnAnotherGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    // The dumped job, and the one CRIU restores detached, are reparented to this process: it
    // reaps the first (its pid must be free for the restore) and waits for the second's exit.
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    dir_ = fs::temp_directory_path() / ("pos-tmg-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (job_ > 0) ::kill(job_, SIGKILL);
    for (int i = 0; i < 100 && ::waitpid(-1, nullptr, WNOHANG) >= 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    fs::remove_all(dir_);
  }
  // torch_train.py ARGS under pos run with every GPU visible, its output to OUT; its pid in job_.
  void start_job(const std::string& args, const fs::path& out) {
    FILE* p = ::popen((kUnset + jobs_env() + env("POS_RUN") + " run -- python3 " + env("POS_TORCH_TRAIN") + " " + args +
                       " >" + out.string() + " 2>" + out.string() + ".err </dev/null & echo $!")
                          .c_str(),
                      "r");
    ASSERT_NE(p, nullptr);
    char pid_text[32] = {};
    ASSERT_NE(std::fgets(pid_text, sizeof(pid_text), p), nullptr);
    ::pclose(p);
    job_ = std::atoi(pid_text);
    ASSERT_GT(job_, 0);
  }
  std::string jobs_env() const { return "POS_JOBS_DIR=" + (dir_ / "jobs").string() + " "; }
  std::string cli() const { return kUnset + jobs_env() + env("POS_CLI"); }
  // Every GPU visible (the job sees both: NVIDIA's restore then swaps the two), the job on device 0.
  static inline const std::string kUnset = "env -u CUDA_VISIBLE_DEVICES ";
  fs::path dir_;
  pid_t job_ = -1;
};

TEST_F(TorchOnAnotherGpu, AJobDumpedOnGpu0AndRestoredWithDevice1RunsOnGpu1AndPrintsWhatAnUninterruptedRunPrints) {
  const std::vector<std::string> uuids = gpu_uuids(), names = gpu_names();
  ASSERT_GE(uuids.size(), 2u) << "needs two GPUs; nvidia-smi lists " << uuids.size();
  ASSERT_EQ(names.size(), uuids.size());
  ASSERT_EQ(names[0], names[1]) << "GPU 0 and 1 are of different models";
  // Long enough that the job still trains for seconds after its restore (nvidia-smi looks then).
  const std::string args = "--steps 5000 --layers 2 --dim 256";
  int code = -1;
  const std::string native = pos::test::run_shell(kUnset + "python3 " + env("POS_TORCH_TRAIN") + " " + args, &code);
  ASSERT_EQ(code, 0) << native;
  ASSERT_NE(native.find("checksum "), std::string::npos) << native;

  const fs::path out = dir_ / "train.out", img = dir_ / "img";
  start_job(args, out);
  ASSERT_TRUE(wait_for(out, "step 15 loss", 600)) << read_file(out) << read_file(out.string() + ".err");
  EXPECT_EQ(gpus_of(job_), std::vector<std::string>{uuids[0]});  // where it started

  std::string r = pos::test::run_shell(cli() + " dump -t " + std::to_string(job_) + " -D " + img.string() + " --json", &code);
  ASSERT_EQ(code, 0) << r;
  int st = 0;
  ASSERT_EQ(::waitpid(job_, &st, 0), job_);  // CRIU ended it: its pid is free for the restore
  const pid_t dumped = std::exchange(job_, -1);
  const std::string manifest = read_file(img / "manifest");
  EXPECT_NE(manifest.find("\"gpu_uuids\":\"" + uuids[0] + "\""), std::string::npos) << manifest;
  ASSERT_EQ(read_file(out).find("checksum "), std::string::npos) << "the dump landed after the job's last step";

  r = pos::test::run_shell(cli() + " restore -D " + img.string() + " --device 1 --json", &code);
  ASSERT_EQ(code, 0) << r;
  job_ = dumped;
  EXPECT_NE(r.find("\"device\":1,"), std::string::npos) << r;
  EXPECT_NE(r.find("\"moved\":true"), std::string::npos) << r;
  // pos-cli's device 1 (CUDA's order) is nvidia-smi's GPU 1 on a machine of identical GPUs.
  EXPECT_EQ(json_text(r, "device_uuid"), uuids[1]) << r;
  // While it trains on, its memory is on GPU 1 and none is left on GPU 0.
  std::vector<std::string> seen;
  for (int i = 0; i < 50 && read_file(out).find("checksum ") == std::string::npos; ++i) {
    seen = gpus_of(dumped);
    if (!seen.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(read_file(out).find("checksum "), std::string::npos) << "the job ended before nvidia-smi saw it";
  EXPECT_EQ(seen, std::vector<std::string>{uuids[1]}) << "nvidia-smi: the restored job's GPUs";

  ASSERT_EQ(::waitpid(dumped, &st, 0), dumped);
  job_ = -1;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << read_file(out.string() + ".err");
  EXPECT_EQ(read_file(out), native);
}

// pos-cli migrate --device: the same job moved while it trains, its process kept, from GPU 0 to GPU
// 1 and back; it prints exactly what an uninterrupted run prints, and between the moves nvidia-smi
// sees it on GPU 1 only. The reports (pause, copy) go to the test's log.
TEST_F(TorchOnAnotherGpu, AJobMovedWithMigrateDeviceToGpu1AndBackKeepsItsProcessAndPrintsWhatAnUninterruptedRunPrints) {
  const std::vector<std::string> uuids = gpu_uuids();
  ASSERT_GE(uuids.size(), 2u) << "needs two GPUs; nvidia-smi lists " << uuids.size();
  const std::string args = "--steps 5000 --layers 2 --dim 256";
  int code = -1;
  const std::string native = pos::test::run_shell(kUnset + "python3 " + env("POS_TORCH_TRAIN") + " " + args, &code);
  ASSERT_EQ(code, 0) << native;
  const fs::path out = dir_ / "train.out";
  start_job(args, out);
  ASSERT_TRUE(wait_for(out, "step 15 loss", 600)) << read_file(out) << read_file(out.string() + ".err");
  const pid_t job = job_;
  std::string r = pos::test::run_shell(cli() + " migrate -t " + std::to_string(job) + " --device 1 --json", &code);
  ASSERT_EQ(code, 0) << r;
  std::printf("move 0 -> 1: %s\n", r.c_str());
  EXPECT_EQ(json_text(r, "to_uuid"), uuids[1]) << r;
  std::vector<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    seen = gpus_of(job);
    if (seen.size() == 1 && seen[0] == uuids[1]) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(read_file(out).find("checksum "), std::string::npos) << "the job ended before nvidia-smi saw it";
  EXPECT_EQ(seen, std::vector<std::string>{uuids[1]}) << "nvidia-smi: the moved job's GPUs";
  r = pos::test::run_shell(cli() + " migrate -t " + std::to_string(job) + " --device 0 --json", &code);
  ASSERT_EQ(code, 0) << r;
  std::printf("move 1 -> 0: %s\n", r.c_str());
  EXPECT_EQ(json_text(r, "to_uuid"), uuids[0]) << r;
  int st = 0;
  ASSERT_EQ(::waitpid(job, &st, 0), job);
  job_ = -1;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << read_file(out.string() + ".err");
  EXPECT_EQ(read_file(out), native);
}

}  // namespace
