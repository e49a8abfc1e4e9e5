// torch_gpu_test.cc — stock PyTorch under `pos run` (gpu suite: PyTorch and a GPU exist only on the
// GPU machine): workloads/torch_train.py prints exactly what it prints natively, and the driver
// layer's census shows that its allocations, kernel launches and driver look-ups went through POS.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "unittest/run_program.h"


namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) ADD_FAILURE() << name << " is not set (meson sets it)";
  return v != nullptr ? v : "";
}

// python3 (PATH's: the GPU machine's has PyTorch) running torch_train.py with `args`, after
// `prefix`; its stdout, with its stderr appended when it fails.
std::string train(const std::string& prefix, const std::string& args, int* code) {
  return pos::test::run_shell(prefix + "python3 " + env("POS_TORCH_TRAIN") + " " + args, code);
}

uint64_t json_number(const std::string& j, const std::string& key) {
  const size_t at = j.find("\"" + key + "\":");
  if (at == std::string::npos) return 0;
  return std::strtoull(j.c_str() + at + key.size() + 3, nullptr, 10);
}

TEST(TorchUnderPos, TrainingUnderPosRunPrintsExactlyWhatItPrintsNativelyAndEveryLaunchIsSeen) {
  const std::string args = "--steps 12 --layers 2 --dim 256";
  int code = -1;
  const std::string native = train("", args, &code);
  ASSERT_EQ(code, 0) << native;
  ASSERT_NE(native.find("checksum "), std::string::npos) << native;
  const std::string census = ::testing::TempDir() + "torch_census.json";
  std::filesystem::remove(census);
  const std::string under = train(env("POS_RUN") + " run --census " + census + " -- ", args, &code);
  ASSERT_EQ(code, 0) << under;
  EXPECT_EQ(under, native);
  std::ifstream f(census);
  const std::string c((std::istreambuf_iterator<char>(f)), {});
  // PyTorch's own kernels (through cudart) and cuBLASLt's (cuLaunchKernelEx) both reach the hooks.
  EXPECT_GT(json_number(c, "cuLaunchKernel") + json_number(c, "cuLaunchKernel_ptsz"), 100u) << c;
  EXPECT_GT(json_number(c, "cuLaunchKernelEx") + json_number(c, "cuLaunchKernelEx_ptsz"), 0u) << c;
  EXPECT_GT(json_number(c, "peak_bytes"), 1u << 20) << c;
  EXPECT_NE(c.find("\"cuGetProcAddress\":{"), std::string::npos) << c;  // looked up, hooked
  // No error anywhere: the driver loaded, and placement (on under pos run) has none ("error":"").
  for (size_t at = c.find("\"error\":"); at != std::string::npos; at = c.find("\"error\":", at + 1))
    EXPECT_EQ(c.compare(at, 10, "\"error\":\"\""), 0) << c;
  // One GPU, no graphs, no IPC: nothing a dump would have to refuse.
  EXPECT_NE(c.find("\"devices\":[0],\"cuda_graphs\":{\"captures\":0,\"launches\":0},\"not_checkpointable\":[]"),
            std::string::npos)
      << c;
}

// With placement on, every cuMemAlloc of the job (PyTorch's caching allocator, cuBLAS's workspace,
// cudart's own) is mapped by POS in its fixed range, and the job cannot tell.
TEST(TorchUnderPos, WithPlacementOnDeviceMemoryAtPosAddressesTrainingPrintsExactlyWhatItPrintsNatively) {
  const std::string args = "--steps 12 --layers 2 --dim 256";
  int code = -1;
  const std::string native = train("", args, &code);
  ASSERT_EQ(code, 0) << native;
  const std::string census = ::testing::TempDir() + "torch_place_census.json";
  std::filesystem::remove(census);
  const std::string under =
      train("POS_DRIVER_PLACE=1 " + env("POS_RUN") + " run --census " + census + " -- ", args, &code);
  ASSERT_EQ(code, 0) << under;
  EXPECT_EQ(under, native);
  std::ifstream f(census);
  const std::string c((std::istreambuf_iterator<char>(f)), {});
  const size_t at = c.find("\"placement\":");
  ASSERT_NE(at, std::string::npos) << c;
  const std::string placement = c.substr(at);
  EXPECT_NE(placement.find("\"devices\":[0]"), std::string::npos) << c;
  EXPECT_NE(placement.find("\"error\":\"\""), std::string::npos) << c;
  EXPECT_EQ(json_number(placement, "placed"), json_number(c, "cuMemAlloc_v2")) << c;  // every one of them
  EXPECT_GT(json_number(placement, "placed"), 0u) << c;
}

TEST(TorchUnderPos, ATorchCompileRunWorksUnderPosRunAndItsTritonKernelsAreSeen) {
  int code = -1;
  const std::string census = ::testing::TempDir() + "torch_compile_census.json";
  std::filesystem::remove(census);
  const std::string out =
      train(env("POS_RUN") + " run --census " + census + " -- ", "--steps 6 --layers 2 --dim 128 --compile", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("step 5 loss "), std::string::npos) << out;
  EXPECT_NE(out.find("checksum "), std::string::npos) << out;
  std::ifstream f(census);
  const std::string c((std::istreambuf_iterator<char>(f)), {});
  // Inductor's kernels are loaded as modules (from memory or from the cubin files it writes) and
  // launched through the driver by Triton's and PyTorch's own launchers: the hooks see both.
  EXPECT_GT(json_number(c, "cuModuleLoad") + json_number(c, "cuModuleLoadData") + json_number(c, "cuModuleLoadDataEx") +
                json_number(c, "cuLibraryLoadFromFile"),
            0u)
      << c;
  EXPECT_GT(json_number(c, "cuLaunchKernel") + json_number(c, "cuLaunchKernelEx"), 0u) << c;
}

// While it trains, pos-cli ps lists the job through its control socket with what the driver
// layer has seen so far; the job finishes as it would have.
TEST(TorchUnderPos, PosCliPsShowsATrainingJobWhileItRuns) {
  const std::string dir = ::testing::TempDir() + "torch-jobs-" + std::to_string(::getpid());
  const std::string out_file = dir + ".out";
  std::filesystem::remove_all(dir);
  const std::string args = "--steps 400 --layers 2 --dim 256";
  const std::string cmd = "POS_JOBS_DIR=" + dir + " POS_JOB_NAME=torch-train " + env("POS_RUN") + " run -- python3 " +
                          env("POS_TORCH_TRAIN") + " " + args + " >" + out_file + " 2>&1 & echo $!";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char pid_text[32] = {};
  ASSERT_NE(std::fgets(pid_text, sizeof(pid_text), p), nullptr);
  pclose(p);
  const int pid = std::atoi(pid_text);
  ASSERT_GT(pid, 0);
  // Until the job has trained a few steps (bounded).
  std::string seen;
  for (int i = 0; i < 1200 && seen.find("step 5 loss") == std::string::npos; ++i) {
    std::ifstream f(out_file);
    seen.assign(std::istreambuf_iterator<char>(f), {});
    usleep(50000);
  }
  ASSERT_NE(seen.find("step 5 loss"), std::string::npos) << seen;
  int code = -1;
  const std::string ps =
      pos::test::run_shell(env("POS_CLI") + " ps --json --socket " + dir + "/none.sock --jobs-dir " + dir, &code);
  EXPECT_EQ(code, 0) << ps;
  EXPECT_NE(ps.find("\"inproc_jobs\":[{\"pid\":" + std::to_string(pid) + ","), std::string::npos) << ps;
  EXPECT_NE(ps.find("\"job\":\"torch-train\""), std::string::npos) << ps;
  EXPECT_GT(json_number(ps, "cuLaunchKernel"), 0u) << ps;
  EXPECT_GT(json_number(ps, "live_bytes"), 1u << 20) << ps;
  // The job runs to its end; its socket goes with it.
  for (int i = 0; i < 2400 && ::kill(pid, 0) == 0; ++i) usleep(50000);
  std::ifstream f(out_file);
  const std::string out((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(out.find("checksum "), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + std::to_string(pid) + ".sock"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out_file);
}

// #24: under `pos run --memory 1GiB` PyTorch sees the limit as the card's total
// (torch.cuda.mem_get_info), an allocation past it raises torch.OutOfMemoryError (its caching
// allocator frees and retries first), and after emptying its cache the job allocates again. A
// second job beside it, with no limit, trains to the checksum it prints natively.
TEST(TorchUnderPos, UnderAMemoryLimitPyTorchRaisesOutOfMemoryErrorAtItWhileAJobBesideItFinishes) {
  const std::string args = "--steps 40 --layers 2 --dim 256";
  int code = -1;
  const std::string native = train("", args, &code);
  ASSERT_EQ(code, 0) << native;
  const std::string script = ::testing::TempDir() + "torch_oom_" + std::to_string(::getpid()) + ".py";
  const std::string out_file = script + ".out";
  {
    std::ofstream py(script);
    py << "import torch\n"
          "free, total = torch.cuda.mem_get_info()\n"
          "print('total', total, 'free_le_total', free <= total, flush=True)\n"
          "xs = []\n"
          "try:\n"
          "    for i in range(4096):\n"
          "        xs.append(torch.ones((16 << 20,), dtype=torch.float32, device='cuda'))\n"
          "    print('no oom', flush=True)\n"
          "except torch.OutOfMemoryError as e:\n"
          "    print('oom after', len(xs), 'chunks', flush=True)\n"
          "del xs[-1]\n"  // cached by PyTorch, not freed: the sums' small blocks make it free and retry
          "held = sum(int(x.sum().item()) for x in xs)\n"
          "print('held', held, flush=True)\n"
          "del xs\n"
          "torch.cuda.empty_cache()\n"
          "y = torch.ones((64 << 20) // 4, device='cuda')\n"
          "print('after', int(y.sum().item()), flush=True)\n";
  }
  const std::string under = train(env("POS_RUN") + " run --memory 1GiB -- python3 " + script + " >" + out_file +
                                      " 2>&1 & " + env("POS_RUN") + " run -- ",
                                  args + "; wait", &code);
  ASSERT_EQ(code, 0) << under;
  EXPECT_EQ(under, native);
  std::ifstream f(out_file);
  const std::string o((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(o.find("total 1073741824 free_le_total True"), std::string::npos) << o;
  const size_t at = o.find("oom after ");
  ASSERT_NE(at, std::string::npos) << o;
  const int chunks = std::atoi(o.c_str() + at + 10);
  // 16 chunks of 64 MiB are the whole GiB; what cudart and PyTorch keep for themselves may take some.
  EXPECT_GE(chunks, 10) << o;
  EXPECT_LE(chunks, 16) << o;
  // Each chunk: 2^24 ones (float32 sums them exactly), summed in place (no cast: no 512 MiB copy).
  EXPECT_NE(o.find("held " + std::to_string(uint64_t(chunks - 1) << 24) + "\n"), std::string::npos) << o;
  EXPECT_NE(o.find("after 16777216"), std::string::npos) << o;
  std::filesystem::remove(script);
  std::filesystem::remove(out_file);
}

// #24's SM limit: under `pos run --sms 16` PyTorch's kernels (cuBLAS's, Triton's) run on 16 SMs
// of the GPU only: a Triton kernel's blocks record the SMs they ran on, the card's count is what
// torch sees, and bf16 matmuls run at a fraction of the whole GPU's rate. Training under the limit
// prints exactly what it prints natively.
TEST(TorchUnderPos, UnderAnSmLimitPyTorchKernelsRunOnThoseSmsOnlyAndTrainingPrintsWhatItPrintsNatively) {
  const std::string probe = std::filesystem::path(env("POS_TORCH_TRAIN")).parent_path() / "torch_sms.py";
  int code = -1;
  const std::string whole = pos::test::run_shell("python3 " + probe + " --seconds 2", &code);
  ASSERT_EQ(code, 0) << whole;
  const std::string part = pos::test::run_shell(env("POS_RUN") + " run --sms 16 -- python3 " + probe + " --seconds 2", &code);
  ASSERT_EQ(code, 0) << part;
  const auto number = [](const std::string& o, const char* key) {
    const size_t at = o.find(std::string(key) + " ");
    return at == std::string::npos ? -1.0 : std::atof(o.c_str() + at + std::strlen(key) + 1);
  };
  const double sms_total = number(whole, "mp_count");
  ASSERT_GT(sms_total, 16) << whole;
  EXPECT_EQ(number(part, "mp_count"), 16) << part;
  EXPECT_EQ(number(whole, "smids"), sms_total) << whole;
  EXPECT_EQ(number(part, "smids"), 16) << part;
  // 16 of 132 SMs: about an eighth of the rate; at least 3x slower whatever the card.
  EXPECT_LT(number(part, "matmul_tflops") * 3, number(whole, "matmul_tflops")) << whole << part;
  const std::string args = "--steps 30 --layers 2 --dim 256";
  const std::string native = train("", args, &code);
  ASSERT_EQ(code, 0) << native;
  const std::string under = train(env("POS_RUN") + " run --sms 16 -- ", args, &code);
  ASSERT_EQ(code, 0) << under;
  EXPECT_EQ(under, native);
}

}  // namespace
