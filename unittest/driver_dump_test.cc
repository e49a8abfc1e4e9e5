// driver_dump_test.cc — `pos-cli dump` / `restore` of an in-process job (pos run's driver layer) in
// CRIU's ZDTM shape, without a GPU: a probe job puts a pattern in POS-placed "device memory" (the
// fake driver backs it with host memory at the same addresses), pos-cli dumps it through its
// control socket and CRIU, restores it, and the job checks that its memory holds the pattern.
// NVIDIA's process checkpoint is the fake's no-op here; the gpu suite's torch_dump_gpu runs the real one.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "unittest/netns_peer.h"
#include "unittest/run_program.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

std::string env(const char* name) { return pos::test::env_or_fail(name); }
std::string read_file(const fs::path& p) { return pos::test::read_text_file(p.string()); }

class DriverDump : public ::testing::Test {
 protected:
  void SetUp() override {
    // Restored jobs are reparented to this process (not to init), so the test can reap them.
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    // Short: the control socket's path must fit a sockaddr_un (108 bytes).
    static int n = 0;
    root_ = fs::temp_directory_path() / ("pos-dd-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
    fs::remove_all(root_);
    fs::create_directories(root_ / "work");
    jobs_ = (root_ / "jobs").string();
  }
  void TearDown() override {
    for (pid_t p : {pid_, restored_})
      if (p > 0) ::kill(p, SIGKILL);
    for (int i = 0; i < 100 && ::waitpid(-1, nullptr, WNOHANG) >= 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    fs::remove_all(root_);
  }
  // The probe job under the driver layer, placement on, stdio on /dev/null; started by `pos run
  // RUN_ARGS --` when they are given (else preloaded directly).
  void start(const std::vector<std::string>& run_args = {}) {
    const std::string probe = env("POS_DRIVER_PROBE"), work = (root_ / "work").string();
    fs::remove_all(work);  // a fresh probe counts its checks from 1
    fs::create_directories(work);
    checks_ = 0, writes_ = 0;
    std::vector<std::string> e;
    for (char** p = environ; *p != nullptr; ++p) e.emplace_back(*p);
    if (run_args.empty()) e.push_back("LD_PRELOAD=" + env("POS_DRIVER_LIB"));
    e.push_back("POS_REAL_LIBCUDA=" + env("POS_FAKE_CUDA"));
    e.push_back("POS_JOBS_DIR=" + jobs_);
    e.push_back("POS_DRIVER_PLACE=1");
    if (copy_) e.push_back("FAKE_CUDA_NO_EXPORT=1");
    if (wait_go_) e.push_back("DRIVER_PROBE_WAIT_GO=1");
    e.insert(e.end(), fake_env_.begin(), fake_env_.end());
    std::vector<char*> envp;
    for (std::string& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (int fd : {0, 1, 2}) posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
    std::vector<std::string> a;
    if (!run_args.empty()) {
      a = {env("POS_RUN"), "run"};
      a.insert(a.end(), run_args.begin(), run_args.end());
      a.push_back("--");
    }
    for (const std::string& x : {probe, std::string("memory-files"), work}) a.push_back(x);
    std::vector<char*> argv;
    for (std::string& x : a) argv.push_back(x.data());
    argv.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    const char* until = wait_go_ ? "waiting" : "ready";  // (go() then waits for ready)
    while (!fs::exists(root_ / "work" / until)) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the probe did not get " << until;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(read_file(root_ / "work" / until), "rc=0\n");
  }
  // The probe under `pos run` with a policy every 100 ms into root_/points<with_cpu> (GPU-only, or
  // --with-cpu); that directory.
  std::string start_with_policy(const std::string& with_cpu) {
    const std::string points = (root_ / ("points" + with_cpu)).string();
    std::vector<std::string> run = {"--checkpoint-every", "100ms", "-D", points};
    if (!with_cpu.empty()) run.push_back(with_cpu);
    start(run);
    return points;
  }
  // The job and its policy ended (SIGKILL, reaped), for another start().
  void out_of_the_way() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    const std::string st = jobs_ + "/checkpoints/" + std::to_string(pid_) + ".json";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (read_file(st).find("\"state\":\"ended\"") == std::string::npos && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    pid_ = -1;
  }
  // A probe started with wait_go_ let go on to use the GPU; waits until it is ready.
  void go() {
    { std::ofstream(root_ / "work" / "go"); }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(root_ / "work" / "ready")) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the probe did not get ready";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(read_file(root_ / "work" / "ready"), "rc=0\n");
  }
  // Asks the job (whichever process it is now) to read its memory back; its answer.
  std::string check() {
    ++checks_;
    const fs::path result = root_ / "work" / ("result-" + std::to_string(checks_));
    { std::ofstream(root_ / "work" / ("check-" + std::to_string(checks_))); }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(result) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return read_file(result);
  }
  // Asks the job to overwrite part of its second allocation; its answer.
  std::string write() {
    ++writes_;
    const fs::path result = root_ / "work" / ("written-" + std::to_string(writes_));
    { std::ofstream(root_ / "work" / ("write-" + std::to_string(writes_))); }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(result) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return read_file(result);
  }
  std::string cli(const std::string& args, int* code, const std::string& envs = "") {
    std::string fake = envs.empty() ? "" : envs + " ";
    for (const std::string& v : fake_env_) fake += v.substr(0, v.find('=') + 1) + "'" + v.substr(v.find('=') + 1) + "' ";
    return pos::test::run_shell(std::string(copy_ ? "FAKE_CUDA_NO_EXPORT=1 " : "") + fake + "POS_REAL_LIBCUDA=" +
                                    env("POS_FAKE_CUDA") + " " + env("POS_CLI") + " " + args,
                                code);
  }
  // The fake driver's GPUs (fake_cuda.cc): `n` of them, named `names`, its restores and memory
  // creations logged in root_/state, for the job and pos-cli alike.
  void fake_gpus(int n, const std::string& names = "") {
    fs::create_directories(root_ / "state");
    fake_env_ = {"FAKE_CUDA_GPUS=" + std::to_string(n), "FAKE_CUDA_STATE=" + (root_ / "state").string()};
    if (!names.empty()) fake_env_.push_back("FAKE_CUDA_GPU_NAMES=" + names);
  }
  std::string fake_log() { return read_file(root_ / "state" / "log"); }
  // pos-cli ARGS in the background, stopped at its fault point POINT; its pid.
  pid_t background(const std::string& point, const std::string& args, const std::string& log) {
    int c = -1;
    std::string fake;  // the fake driver's GPUs, as cli() passes them
    for (const std::string& v : fake_env_) fake += v.substr(0, v.find('=') + 1) + "'" + v.substr(v.find('=') + 1) + "' ";
    const std::string pid = pos::test::run_shell(fake + "POS_FAULT_POINT=" + point + ":stop POS_REAL_LIBCUDA=" + env("POS_FAKE_CUDA") +
                                                     " " + env("POS_CLI") + " " + args + " >" + log + " 2>&1 & echo $!",
                                                 &c);
    EXPECT_EQ(c, 0) << pid;
    return static_cast<pid_t>(std::atoi(pid.c_str()));
  }
  // Whether `log` says `text` within 30 s.
  static bool wait_for(const std::string& log, const std::string& text) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (read_file(log).find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
  // A stop dump of a fresh probe job into root_/img; the dumped (ended) job's pid.
  pid_t stop_dump() {
    start();
    int code = -1;
    const std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + (root_ / "img").string() + " --jobs-dir " + jobs_, &code);
    EXPECT_EQ(code, 0) << out;
    ::waitpid(pid_, nullptr, 0);  // CRIU ended it
    return std::exchange(pid_, -1);
  }
  // Asks the job for check N without waiting; where its answer will be.
  std::string ask_check(int n) {
    { std::ofstream(root_ / "work" / ("check-" + std::to_string(n))); }
    return (root_ / "work" / ("result-" + std::to_string(n))).string();
  }

  // The job's memory cannot be exported (FAKE_CUDA_NO_EXPORT): the dump falls back to the job's
  // own copy to files, and the restore to the job's own load.
  bool copy_ = false;
  bool wait_go_ = false;  // the probe waits for go() before it touches the GPU
  std::vector<std::string> fake_env_;  // for the job and pos-cli (fake_gpus)
  const char* handoff() const { return copy_ ? "\"handoff\":false" : "\"handoff\":true"; }

  void leave_running_dump();
  void stop_dump_and_restore();

  fs::path root_;
  std::string jobs_;
  pid_t pid_ = -1, restored_ = -1;
  int checks_ = 0, writes_ = 0;
};

TEST_F(DriverDump, ALeaveRunningDumpSavesTheJobsPlacedMemoryAndTheJobRunsOnWithItsBytes) {
  for (bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "the job copies" : "hand-off");
    copy_ = copy;
    leave_running_dump();
    ::kill(std::exchange(pid_, -1), SIGKILL);
    fs::remove_all(root_ / "img");
  }
}

TEST_F(DriverDump, AStopDumpEndsTheJobAndItsRestoreBringsItBackWithTheSameMemoryAtTheSameAddresses) {
  for (bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "the job copies" : "hand-off");
    copy_ = copy;
    stop_dump_and_restore();
    fs::remove_all(root_ / "img");
  }
}

void DriverDump::leave_running_dump() {
  start();
  ASSERT_EQ(check(), "rc=0 same=1\n");
  const std::string img = (root_ / "img").string();
  int code = -1;
  // No --jobs-dir: pos-cli finds the job's control socket from the job's own environment.
  const std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + img + " --leave-running --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"inproc\":true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"gpu_bytes\":10485760"), std::string::npos) << out;  // 4 + 6 MiB placed
  EXPECT_NE(out.find("\"handles\":2"), std::string::npos) << out;
  EXPECT_NE(out.find("\"job_save_s\":"), std::string::npos) << out;  // the job's own breakdown is reported
  EXPECT_NE(out.find(handoff()), std::string::npos) << out;
  // With the hand-off the memory went back at once and the image was written from a device copy.
  EXPECT_NE(out.find(copy_ ? "\"gpu_snapshot\":false" : "\"gpu_snapshot\":true"), std::string::npos) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");  // running on, with its memory mapped and loaded again
  EXPECT_EQ(::kill(pid_, 0), 0);
  const std::string manifest = read_file(img + "/manifest");
  EXPECT_NE(manifest.find("\"kind\":\"driver-dump\""), std::string::npos) << manifest;
  const std::string shown = cli("inspect " + img, &code);
  EXPECT_EQ(code, 0) << shown;
  EXPECT_NE(shown.find("a dump of an in-process job (pos run) of pid " + std::to_string(pid_)), std::string::npos) << shown;
  EXPECT_NE(shown.find("verified: 10485760 bytes"), std::string::npos) << shown;
  // A second dump into the same directory is refused, and the job is not touched.
  (void)cli("dump -t " + std::to_string(pid_) + " -D " + img + " --jobs-dir " + jobs_, &code);
  EXPECT_NE(code, 0);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // The image holds the bytes of its cut (written from the device copy with the hand-off): the
  // job ended and restored from it reads its pattern back.
  const pid_t dumped = std::exchange(pid_, -1);
  ::kill(dumped, SIGKILL);
  ASSERT_EQ(::waitpid(dumped, nullptr, 0), dumped);
  const std::string restored = cli("restore -D " + img + " --json", &code);
  ASSERT_EQ(code, 0) << restored;
  restored_ = dumped;
  EXPECT_EQ(check(), "rc=0 same=1\n");
  pid_ = std::exchange(restored_, -1);  // the caller ends it
}

void DriverDump::stop_dump_and_restore() {
  start();
  const std::string img = (root_ / "img").string();
  int code = -1;
  std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + img + " --jobs-dir " + jobs_, &code);
  ASSERT_EQ(code, 0) << out;
  int st = 0;
  ASSERT_EQ(::waitpid(pid_, &st, 0), pid_);  // CRIU ended it
  const pid_t dumped = std::exchange(pid_, -1);
  // A damaged region table: the restore refuses before anything runs.
  const std::string table = img + "/gpu/regions";
  const std::string good = read_file(table);
  {
    std::string bad = good;
    bad[bad.find("region") + 7] = '9';  // the device number
    std::ofstream(table, std::ios::trunc) << bad;
  }
  out = cli("restore -D " + img, &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("region table"), std::string::npos) << out;
  EXPECT_NE(::kill(dumped, 0), 0);  // nothing restored
  std::ofstream(table, std::ios::trunc) << good;
  // The jobs' usage region the job mapped is gone too (a reboot, say): the restore makes it again.
  ASSERT_TRUE(fs::remove(fs::path(jobs_) / "usage"));
  out = cli("restore -D " + img + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"pid\":" + std::to_string(dumped)), std::string::npos) << out;
  EXPECT_NE(out.find(handoff()), std::string::npos) << out;
  restored_ = dumped;
  EXPECT_EQ(check(), "rc=0 same=1\n");  // the restored process reads its pattern back
  { std::ofstream(root_ / "work" / "exit"); }
  ASSERT_EQ(::waitpid(restored_, &st, 0), restored_);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  restored_ = -1;
}

// The fake driver's GPU i, as nvidia-smi would spell its UUID.
std::string fake_uuid(int i) {
  char s[48];
  std::snprintf(s, sizeof(s), "GPU-face0000-0000-0000-0000-0000000000%02x", i);
  return s;
}

// Restore onto another GPU of the host (--device): the dump records the job's GPUs by UUID, the
// restore hands NVIDIA's restore the pairs that move the job there (every GPU it saw, GPU 0 and 1
// swapped), makes the job's memory on the new GPU, checks that the job now runs there, and the
// job reads its bytes back. Both with the hand-off and with the job loading its memory itself.
TEST_F(DriverDump, ARestoreWithDeviceMovesAJobDumpedOnGpu0OntoGpu1WithItsMemory) {
  for (bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "the job copies" : "hand-off");
    copy_ = copy;
    fake_gpus(2);
    fs::remove(root_ / "state" / "log");
    start();
    const std::string img = (root_ / "img").string();
    int code = -1;
    std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + img, &code);
    ASSERT_EQ(code, 0) << out;
    ASSERT_EQ(::waitpid(pid_, nullptr, 0), pid_);  // CRIU ended it
    const pid_t dumped = std::exchange(pid_, -1);
    const std::string manifest = read_file(img + "/manifest");
    EXPECT_NE(manifest.find("\"gpu_uuids\":\"" + fake_uuid(0) + "\",\"gpus_visible\":\"" + fake_uuid(0) + "," +
                            fake_uuid(1) + "\",\"gpu_name\":\"Fake GPU\""),
              std::string::npos)
        << manifest;
    out = cli("restore -D " + img + " --device 1 --json", &code);
    ASSERT_EQ(code, 0) << out << fake_log();
    restored_ = dumped;
    EXPECT_NE(out.find("\"device\":1,\"device_uuid\":\"" + fake_uuid(1) + "\",\"moved\":true"), std::string::npos) << out;
    EXPECT_NE(out.find(handoff()), std::string::npos) << out;
    const std::string log = fake_log();
    EXPECT_NE(log.find("restore " + std::to_string(dumped) + " 0->1 1->0\n"), std::string::npos) << log;
    // The memory was made on GPU 1: by pos-cli (in its ordinals) with the hand-off, else by the job,
    // whose ordinal 0 now names GPU 1 (the fake moved it as the driver does; pos-cli checked).
    if (!copy) {
      bool on_gpu1 = false;
      std::istringstream lines(log);
      for (std::string l; std::getline(lines, l);) on_gpu1 = on_gpu1 || (l.rfind("create ", 0) == 0 && l.back() == '1');
      EXPECT_TRUE(on_gpu1) << log;
    }
    EXPECT_EQ(check(), "rc=0 same=1\n");  // its pattern, at its addresses
    ::kill(std::exchange(restored_, -1), SIGKILL);
    ::waitpid(dumped, nullptr, 0);
    fs::remove_all(img);
  }
}

// --device is refused, before anything is restored, for a GPU that does not exist, a GPU of
// another model, an image that does not record its GPUs (an older pos-cli's), and a posd job's
// image; and a driver that takes the pairs but leaves the job where it was is caught after its
// restore (the job is ended; the image is unchanged and restores as it was dumped).
TEST_F(DriverDump, ARestoreWithDeviceIsRefusedWhereTheJobCannotMoveThereAndChangesNothing) {
  fake_gpus(3, "Fake GPU,Fake GPU,Other GPU");
  start();
  const std::string img = (root_ / "img").string();
  int code = -1;
  std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + img, &code);
  ASSERT_EQ(code, 0) << out;
  ASSERT_EQ(::waitpid(pid_, nullptr, 0), pid_);
  const pid_t dumped = std::exchange(pid_, -1);
  const auto refused = [&](const std::string& args, const std::string& why) {
    SCOPED_TRACE(args);
    const std::string o = cli("restore -D " + img + " " + args, &code);
    EXPECT_NE(code, 0) << o;
    EXPECT_NE(o.find(why), std::string::npos) << o;
    EXPECT_NE(::kill(dumped, 0), 0);  // nothing restored
  };
  refused("--device 3", "there is no CUDA device 3 on this host (it has 3: 0: Fake GPU " + fake_uuid(0));
  refused("--device 2", "CUDA device 2 is a Other GPU; the job ran on a Fake GPU");
  refused("--device -1", "--device");  // not a device number (pos-cli's own check)
  const std::string manifest = read_file(img + "/manifest");
  // An older pos-cli's image: no GPU keys.
  std::string old = manifest.substr(0, manifest.find(",\"gpu_uuids\":")) + "}\n";
  std::ofstream(img + "/manifest", std::ios::trunc) << old;
  refused("--device 1", "the image does not record which GPU the job used");
  // A posd job's image (its kind, arena and permit; nothing else is read before --device is refused).
  std::string posd = old;
  posd.replace(posd.find("\"driver-dump\""), 13, "\"dump\"");
  posd.replace(posd.find("\"arena_bytes\":0"), 15, "\"arena_bytes\":4096");
  posd.replace(posd.find("\"permit\":\"\""), 11, "\"permit\":\"/dev/shm/pos-permit-x\"");
  std::ofstream(img + "/manifest", std::ios::trunc) << posd;
  refused("--device 1", "posd.devices");
  std::ofstream(img + "/manifest", std::ios::trunc) << manifest;
  // A driver that ignores the pairs: the job's GPU is not the one its memory was put on.
  fake_env_.push_back("FAKE_CUDA_REMAP_IGNORED=1");
  out = cli("restore -D " + img + " --device 1", &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("after NVIDIA's restore the job's GPU is " + fake_uuid(0) + ", not " + fake_uuid(1)),
            std::string::npos) << out;
  for (int i = 0; i < 400 && ::waitpid(dumped, nullptr, WNOHANG) != dumped; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // ended, reaped: its pid is free again
  fake_env_.pop_back();
  // The image is unchanged: restored where it was dumped, the job reads its bytes.
  out = cli("restore -D " + img + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  restored_ = dumped;
  EXPECT_NE(out.find("\"device\":0,\"device_uuid\":\"" + fake_uuid(0) + "\",\"moved\":false"), std::string::npos) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// pos-cli killed mid-dump (kill -9 at a fault point: after the job saved and unmapped its memory,
// after the driver's checkpoint, or after CRIU's dump, which leaves a job to be ended stopped until
// the manifest): its guardian runs `pos-cli resume`, and the job runs on with its memory. No image
// is left.
TEST_F(DriverDump, APosCliKilledMidDumpLeavesTheJobRunningWithItsMemory) {
  start();
  int code = -1;
  for (const char* point : {"driver-dump-saved", "driver-dump-checkpointed", "driver-dump-criu-done"}) {
    SCOPED_TRACE(point);
    const std::string img = (root_ / (std::string("img-") + point)).string();
    // run_shell's code for a killed pos-cli; the prefix sets the fault point for pos-cli alone.
    const std::string out = pos::test::run_shell("POS_FAULT_POINT=" + std::string(point) + " POS_REAL_LIBCUDA=" +
                                                     env("POS_FAKE_CUDA") + " " + env("POS_CLI") + " dump -t " +
                                                     std::to_string(pid_) + " -D " + img + " --jobs-dir " + jobs_,
                                                 &code);
    EXPECT_NE(code, 0) << out;
    EXPECT_EQ(check(), "rc=0 same=1\n");  // the guardian's resume let the held call run, on its bytes
    EXPECT_FALSE(fs::exists(img + "/manifest"));
  }
  // Nothing holds it now: resume says so and changes nothing.
  const std::string out = cli("resume -t " + std::to_string(pid_) + " --jobs-dir " + jobs_, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("not held by a dump"), std::string::npos) << out;
}

// A job killed while a dump holds it, and restored from an earlier image at once, has the same pid
// and control socket as before. The interrupted dump (here its pos-cli killed, so that its guardian
// runs `pos-cli resume`) must leave that new process alone: it is held by its own image's cut and
// gets its own image's memory, and runs on with the state it had then.
TEST_F(DriverDump, ADumpInterruptedByTheJobsEndLeavesTheJobRestoredUnderItsPidAlone) {
  start();
  const std::string a = (root_ / "a").string(), b = (root_ / "b").string();
  int code = -1;
  std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + a + " --leave-running --jobs-dir " + jobs_, &code);
  ASSERT_EQ(code, 0) << out;
  ASSERT_EQ(write(), "rc=0\n");  // after a: the memory b holds differs from a's
  const std::string dump_log = (root_ / "dump.log").string(), restore_log = (root_ / "restore.log").string();
  pid_t dumper = -1, restorer = -1;
  struct Reap {  // a failed assertion leaves no stopped pos-cli behind
    pid_t* p[2];
    ~Reap() {
      for (pid_t* q : p)
        if (*q > 0) ::kill(*q, SIGKILL), ::kill(*q, SIGCONT), ::waitpid(*q, nullptr, 0);
    }
  } reap{{&dumper, &restorer}};
  dumper = background("driver-dump-saved", "dump -t " + std::to_string(pid_) + " -D " + b + " --jobs-dir " + jobs_, dump_log);
  ASSERT_TRUE(wait_for(dump_log, "stopping the process")) << read_file(dump_log);
  ::kill(pid_, SIGKILL);  // held by b's dump
  ::waitpid(pid_, nullptr, 0);
  restorer = background("driver-restore-gpu", "restore -D " + a + " --json", restore_log);
  ASSERT_TRUE(wait_for(restore_log, "stopping the process")) << read_file(restore_log);
  // The new process holds the pid and waits for a's memory. b's pos-cli dies: its guardian resumes.
  ::kill(dumper, SIGKILL);
  ::waitpid(std::exchange(dumper, -1), nullptr, 0);
  ASSERT_TRUE(wait_for(dump_log, "pos-cli resume: pid")) << read_file(dump_log);
  EXPECT_NE(read_file(dump_log).find("is not the process the dump held"), std::string::npos) << read_file(dump_log);
  ::kill(restorer, SIGCONT);
  int st = 0;
  ASSERT_EQ(::waitpid(restorer, &st, 0), restorer);
  restorer = -1;
  out = read_file(restore_log);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  ASSERT_NE(out.find("\"pid\":"), std::string::npos) << out;
  restored_ = pid_ = static_cast<pid_t>(std::stoi(out.substr(out.find("\"pid\":") + 6)));
  EXPECT_NE(out.find("\"handoff\":true"), std::string::npos) << out;  // a's memory, handed over
  EXPECT_EQ(check(), "rc=0 same=1\n");  // the state of a, CPU and GPU alike
  EXPECT_FALSE(fs::exists(b + "/manifest"));
}

// pos run --memory: the job runs under its device-memory limit; pos-cli limit shows what it holds
// against it and changes it; bad values are refused with the limit unchanged, and a pid that is no
// in-process job is said to be none.
TEST_F(DriverDump, PosRunWithAMemoryLimitRunsTheJobUnderItAndPosCliLimitShowsAndChangesIt) {
  start({"--memory", "12MiB"});
  ASSERT_EQ(check(), "rc=0 same=1\n");
  const std::string t = "limit -t " + std::to_string(pid_) + " --jobs-dir " + jobs_;
  int code = -1;
  std::string out = cli(t, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("memory limit 12582912 bytes; it holds 8388608 (66.7%)"), std::string::npos) << out;
  out = cli(t + " --memory 1GiB --json", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"memory\":1073741824,\"memory_used\":8388608"), std::string::npos) << out;
  for (const auto& [arg, want, says] : std::vector<std::tuple<std::string, int, std::string>>{
           {" --memory 200GiB", 1, "more than the job's GPUs have"}, {" --memory zz", 2, "--memory zz"}}) {
    out = cli(t + arg, &code);
    EXPECT_EQ(code, want) << arg << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << arg << ": " << out;
  }
  out = cli(t + " --json", &code);
  EXPECT_NE(out.find("\"memory\":1073741824,"), std::string::npos) << out;  // unchanged
  // The jobs' shared accounting lists it with what it holds and its limit, and forgets it once it
  // is killed.
  const std::string in_region = "{\"pid\":" + std::to_string(pid_) + ",\"device\":";
  out = cli("ps --json --jobs-dir " + jobs_ + " --socket " + (root_ / "no-posd.sock").string(), &code);
  ASSERT_NE(out.find(in_region), std::string::npos) << out;
  EXPECT_NE(out.find("\"memory_used\":8388608,\"memory_limit\":1073741824,", out.find(in_region)), std::string::npos) << out;
  out = cli("limit -t 1 --jobs-dir " + jobs_, &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("is no in-process job"), std::string::npos) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");
  const pid_t job = std::exchange(pid_, -1);
  ::kill(job, SIGKILL);
  ::waitpid(job, nullptr, 0);
  out = cli("ps --json --jobs-dir " + jobs_ + " --socket " + (root_ / "no-posd.sock").string(), &code);
  EXPECT_EQ(out.find(in_region), std::string::npos) << out;
  for (const char* bad : {"0", "abc"}) {
    out = pos::test::run_shell(env("POS_RUN") + " run --memory " + bad + " -- /bin/true", &code);
    EXPECT_EQ(code, 2) << bad;
    EXPECT_NE(out.find("pos run: --memory"), std::string::npos) << out;
  }
}

TEST_F(DriverDump, ADumpOfAJobThatCannotBeDumpedIsRefusedByNameAndLeavesNoImage) {
  start();
  const std::string img = (root_ / "img").string();
  int code = -1;
  // A --prev that is no image of an in-process job: said before anything is asked of the job.
  fs::create_directories(root_ / "notimg");
  std::string out = cli("dump -t " + std::to_string(pid_) + " -D " + img + " --prev " + (root_ / "notimg").string() +
                            " --jobs-dir " + jobs_, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("manifest"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(img + "/manifest"));
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// The region lines of a driver memory image's table (addresses, sizes and per-chunk checksums).
std::string region_lines(const std::string& gpu_dir) {
  std::istringstream in(read_file(gpu_dir + "/regions"));
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("region ", 0) == 0) out += line + "\n";
  return out;
}

TEST_F(DriverDump, APreDumpIsAGpuOnlyCheckpointTheJobRunsOnAndARestoreRefusesIt) {
  start();
  ASSERT_EQ(check(), "rc=0 same=1\n");
  const std::string pre = (root_ / "pre").string(), pre2 = (root_ / "pre2").string(), img = (root_ / "img").string();
  int code = -1;
  std::string out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + pre + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"command\":\"pre-dump\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"gpu_bytes\":10485760"), std::string::npos) << out;
  EXPECT_NE(out.find("\"inproc\":true,\"gpu_written\":2,\"gpu_written_bytes\":10485760"), std::string::npos) << out;
  EXPECT_NE(out.find("\"criu_images\":\"\""), std::string::npos) << out;  // GPU-only
  EXPECT_NE(out.find("\"gpu_ahead\":true,\"gpu_ahead_waits\":0,"), std::string::npos) << out;  // the copies ran ahead
  EXPECT_NE(out.find("\"gpu_align\":\"none\","), std::string::npos) << out;  // no stream-ordered memory: no wait
  EXPECT_EQ(check(), "rc=0 same=1\n");  // it never stopped
  EXPECT_NE(read_file(pre + "/manifest").find("\"kind\":\"driver-pre-dump\""), std::string::npos);
  std::string shown = cli("inspect " + pre, &code);
  EXPECT_EQ(code, 0) << shown;
  EXPECT_NE(shown.find("a GPU-only checkpoint of an in-process job"), std::string::npos) << shown;
  EXPECT_NE(shown.find("verified: 10485760 bytes"), std::string::npos) << shown;
  // Nothing was written since: the next one says so and holds the same bytes.
  out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + pre2 + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"gpu_written\":0,\"gpu_written_bytes\":0,\"gpu_unwritten\":[35184372088832,35184376283136]"),
            std::string::npos) << out;
  EXPECT_EQ(region_lines(pre + "/gpu"), region_lines(pre2 + "/gpu"));
  // Not a restore point; and a dump afterwards takes the same memory (the checkpoint's copy is gone).
  out = cli("restore -D " + pre, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("GPU-only checkpoint of an in-process job"), std::string::npos) << out;
  out = cli("dump -t " + std::to_string(pid_) + " -D " + img + " --leave-running --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_FALSE(region_lines(img + "/gpu").empty());
  EXPECT_EQ(region_lines(pre + "/gpu"), region_lines(img + "/gpu"));
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // A directory that holds an image already is refused before the job is asked anything.
  out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + pre, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("already holds an image"), std::string::npos) << out;
  // Without --json, one line for a person: what was taken, and that the job runs on.
  out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + (root_ / "said").string(), &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("pre-dumped in-process job " + std::to_string(pid_) + " to " + (root_ / "said").string() +
                     ": device memory at one cut, 10485760 bytes in 2 allocations (0 bytes in 0 written since"),
            std::string::npos) << out;
  EXPECT_NE(out.find("the job runs on"), std::string::npos) << out;
  // The writer's tuning from the environment: a bad value fails with its name and leaves no image;
  // good ones write the same image.
  const std::string tuned = (root_ / "tuned").string();
  for (const char* bad : {"POS_IMAGE_THREADS=0", "POS_IMAGE_PIECE=12288", "POS_IMAGE_SCHED=fifo", "POS_SNAP_AHEAD=yes", "POS_SNAP_KEEP=2",
                          "POS_SNAP_ALIGN_MS=-1", "POS_SNAP_ALIGN_MS=60001", "POS_SNAP_ALIGN_MS=1s"}) {
    out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + tuned, &code, bad);
    EXPECT_NE(code, 0) << bad;
    EXPECT_NE(out.find(std::string(bad).substr(0, std::string(bad).find('='))), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(tuned)) << bad;  // refused before anything was made
  }
  out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + tuned + " --json", &code,
            "POS_IMAGE_THREADS=3 POS_IMAGE_SCHED=idle POS_IMAGE_PIECE=65536 POS_SNAP_AHEAD=0 POS_SNAP_ALIGN_MS=0");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"gpu_ahead\":false,"), std::string::npos) << out;  // ordered before the job's later work
  EXPECT_NE(out.find("\"gpu_align\":\"off\",\"gpu_align_s\":0.000000"), std::string::npos) << out;
  EXPECT_EQ(region_lines(img + "/gpu"), region_lines(tuned + "/gpu"));
  std::string tuned_shown = cli("inspect " + tuned, &code);
  EXPECT_EQ(code, 0) << tuned_shown;
  EXPECT_NE(tuned_shown.find("verified: 10485760 bytes"), std::string::npos) << tuned_shown;
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // POS_SNAP_KEEP=1: the job keeps its copy once written, and the next pre-dump copies into it.
  for (const char* k : {"k1", "k2"}) {
    out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + (root_ / k).string() + " --json", &code, "POS_SNAP_KEEP=1");
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find(std::string("\"gpu_shadow_reused\":") + (k[1] == '1' ? "false" : "true")), std::string::npos) << out;
    EXPECT_EQ(region_lines(img + "/gpu"), region_lines((root_ / k).string() + "/gpu")) << k;
  }
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// Incremental images of an in-process job: a GPU-only checkpoint, then dumps with --prev that keep
// only what the job wrote since, a restore through the chain, and a stale --prev saved whole.
TEST_F(DriverDump, DumpsWithPrevKeepOnlyWhatTheJobWroteAndARestoreReadsThroughTheChain) {
  start();
  ASSERT_EQ(check(), "rc=0 same=1\n");
  const std::string pre = (root_ / "pre").string(), d1 = (root_ / "d1").string(), d2 = (root_ / "d2").string(),
                    d3 = (root_ / "d3").string();
  const std::string t = "-t " + std::to_string(pid_) + " ";
  int code = -1;
  std::string out = cli("pre-dump " + t + "-D " + pre + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  ASSERT_EQ(write(), "rc=0\n");  // the second allocation (6 MiB) changes
  out = cli("dump " + t + "-D " + d1 + " --prev " + pre + " --leave-running --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"gpu_bytes\":6291456,\"gpu_bytes_referenced\":4194304"), std::string::npos) << out;
  EXPECT_NE(read_file(d1 + "/manifest").find("\"prev\":\"../pre\""), std::string::npos);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  std::string shown = cli("inspect " + d1, &code);
  EXPECT_EQ(code, 0) << shown;
  EXPECT_NE(shown.find("6.0 MiB stored here, 4.0 MiB unchanged since the previous image"), std::string::npos) << shown;
  EXPECT_NE(shown.find("at 0x200000000000: 4.0 MiB (in a previous image)"), std::string::npos) << shown;
  shown = cli("inspect " + d1 + " --json", &code);
  EXPECT_NE(shown.find("\"inherited\":[{\"device\":0,\"address\":35184372088832,\"bytes\":4194304}]"),
            std::string::npos) << shown;
  // Nothing written since d1: d2 stores nothing and inherits both, one from d1 and one from pre.
  out = cli("dump " + t + "-D " + d2 + " --prev " + d1 + " --json", &code);  // stops the job
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"gpu_bytes\":0,\"gpu_bytes_referenced\":10485760"), std::string::npos) << out;
  ::waitpid(std::exchange(pid_, -1), nullptr, 0);
  // A chain with a link missing is refused before anything runs, and whole again once it is back.
  fs::rename(pre, pre + ".away");
  out = cli("restore -D " + d2, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("previous image"), std::string::npos) << out;
  fs::rename(pre + ".away", pre);
  out = cli("restore -D " + d2 + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  restored_ = pid_ = static_cast<pid_t>(std::stoi(out.substr(out.find("\"pid\":") + 6)));
  EXPECT_EQ(check(), "rc=0 same=1\n");  // the first allocation from pre, the second as written, from d1
  // The restored job goes on from d2's cut: d2 is a good --prev, pre is not. Against pre every
  // allocation is stored but for chunks pre holds byte for byte: the first allocation (unchanged)
  // is left to it, the second (written) is stored.
  out = cli("dump " + t + "-D " + d3 + " --prev " + pre + " --leave-running --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"gpu_bytes\":6291456,\"gpu_bytes_referenced\":4194304"), std::string::npos) << out;
  EXPECT_NE(out.find("not of this job's last checkpoint"), std::string::npos) << out;
  EXPECT_NE(read_file(d3 + "/manifest").find("\"prev\":\"../pre\""), std::string::npos);
  EXPECT_NE(read_file(d3 + "/gpu/regions").find(" same 0-0\n"), std::string::npos) << read_file(d3 + "/gpu/regions");
  shown = cli("inspect " + d3, &code);
  EXPECT_EQ(code, 0) << shown;
  EXPECT_NE(shown.find("verified: 6291456 bytes"), std::string::npos) << shown;  // the hole is not read
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // And back from d3: the chunk it left to pre comes from pre.
  ::kill(pid_, SIGKILL);
  ::waitpid(std::exchange(pid_, -1), nullptr, 0);
  restored_ = -1;
  out = cli("restore -D " + d3 + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  restored_ = pid_ = static_cast<pid_t>(std::stoi(out.substr(out.find("\"pid\":") + 6)));
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// pos-cli killed mid pre-dump (after the cut, with the job holding the copy for it; after the
// write, before the manifest): the job never waits, no image is left, and the next pre-dump and
// dump work (the first one's copy is let go by the next cut).
TEST_F(DriverDump, APosCliKilledMidPreDumpLeavesTheJobRunningAndNoImage) {
  start();
  int code = -1;
  for (const char* point : {"driver-pre-dump-cut", "driver-pre-dump-written"}) {
    SCOPED_TRACE(point);
    const std::string img = (root_ / (std::string("pre-") + point)).string();
    const std::string out = pos::test::run_shell("POS_FAULT_POINT=" + std::string(point) + " POS_REAL_LIBCUDA=" +
                                                     env("POS_FAKE_CUDA") + " " + env("POS_CLI") + " pre-dump -t " +
                                                     std::to_string(pid_) + " -D " + img + " --jobs-dir " + jobs_,
                                                 &code);
    EXPECT_NE(code, 0) << out;
    EXPECT_EQ(check(), "rc=0 same=1\n");
    EXPECT_FALSE(fs::exists(img + "/manifest"));
  }
  const std::string pre = (root_ / "pre").string(), img = (root_ / "img").string();
  std::string out = cli("pre-dump -t " + std::to_string(pid_) + " -D " + pre + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  out = cli("dump -t " + std::to_string(pid_) + " -D " + img + " --leave-running --prev " + pre + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(region_lines(pre + "/gpu").empty(), false);
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// A directory of images (a series of dumps): pos-cli images lists them newest first with their
// state, and restore --latest takes the newest restorable one, skipping an unfinished dump, a
// pre-dump and one whose chain is broken.
TEST_F(DriverDump, ImagesListsADirectoryOfDumpsAndRestoreLatestTakesTheNewestRestorableOne) {
  start();
  const fs::path series = root_ / "series";
  const std::string t = "-t " + std::to_string(pid_) + " ";
  int code = -1;
  std::string out = cli("images " + series.string(), &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("is no directory"), std::string::npos) << out;
  fs::create_directories(series);
  ASSERT_EQ(cli("dump " + t + "-D " + (series / "a").string() + " --leave-running", &code).empty(), false);
  ASSERT_EQ(code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // manifest times a second apart
  ASSERT_EQ(write(), "rc=0\n");
  out = cli("dump " + t + "-D " + (series / "b").string() + " --leave-running --prev " + (series / "a").string(), &code);
  ASSERT_EQ(code, 0) << out;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  out = cli("pre-dump " + t + "-D " + (series / "c").string(), &code);
  ASSERT_EQ(code, 0) << out;
  fs::create_directories(series / "d" / "gpu");  // a dump that never finished
  fs::create_directories(series / "notes");      // not an image: not listed
  out = cli("images " + series.string(), &code);
  ASSERT_EQ(code, 0) << out;
  const size_t c = out.find("\nc "), b = out.find("\nb "), a = out.find("\na "), d = out.find("\nd ");
  ASSERT_TRUE(c != std::string::npos && b != std::string::npos && a != std::string::npos && d != std::string::npos) << out;
  EXPECT_TRUE(c < b && b < a) << out;  // newest first
  EXPECT_EQ(out.find("notes"), std::string::npos) << out;
  EXPECT_NE(out.find("complete (no restore point)"), std::string::npos) << out;  // the pre-dump
  EXPECT_NE(out.find("incomplete (no manifest)"), std::string::npos) << out;
  out = cli("images " + series.string() + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("{\"name\":\"b\",\"complete\":true,\"restorable\":true,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"prev\":\"../a\""), std::string::npos) << out;
  // One image is no directory of images.
  out = cli("images " + (series / "a").string(), &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("is one image"), std::string::npos) << out;
  // b inherits from a: with a gone, b's chain is broken and --latest skips it... to nothing restorable.
  ::kill(pid_, SIGKILL);
  ::waitpid(std::exchange(pid_, -1), nullptr, 0);
  fs::rename(series / "a", root_ / "a.away");
  out = cli("images " + series.string(), &code);
  EXPECT_NE(out.find("its chain is broken"), std::string::npos) << out;
  out = cli("restore -D " + series.string() + " --latest", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("no complete, restorable image"), std::string::npos) << out;
  fs::rename(root_ / "a.away", series / "a");
  out = cli("restore -D " + series.string() + " --latest --json", &code);
  ASSERT_EQ(code, 0) << out;
  restored_ = pid_ = static_cast<pid_t>(std::stoi(out.substr(out.find("\"pid\":") + 6)));
  EXPECT_NE(out.find("\"dir\":\"" + (series / "b").string() + "\""), std::string::npos) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");  // b's bytes: the write it saw
}

// pos run --checkpoint-every: the job is checkpointed from its start into a directory of restore
// points (each a whole process: --with-cpu) by a checkpointer outside its process tree; ps shows the
// policy; the job killed, the newest point restores with the job's memory; --stop after the end.
TEST_F(DriverDump, PosRunWithACheckpointPolicyLeavesRestorePointsTheNewestOfWhichRestores) {
  const std::string points = (root_ / "points").string();
  start({"--checkpoint-every", "150ms", "-D", points, "--with-cpu", "--keep", "2", "--full-every", "2"});
  ASSERT_EQ(check(), "rc=0 same=1\n");
  int code = -1;
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t restorable = 0;
  while ((restorable = 0, out = cli("images " + points + " --json", &code), true)) {
    for (size_t at = 0; (at = out.find("\"restorable\":true", at)) != std::string::npos; ++at) ++restorable;
    if (restorable >= 2) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << out << read_file(points + "/checkpoint.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(write(), "rc=0\n");  // a change after some points: a later one must hold it
  const std::string ps = cli("ps --jobs-dir " + jobs_, &code);
  EXPECT_NE(ps.find("running"), std::string::npos) << ps;
  EXPECT_NE(ps.find("gpu+cpu"), std::string::npos) << ps;
  EXPECT_NE(ps.find(points), std::string::npos) << ps;
  // Wait for a point cut after the write (the status names each new one), then lose the job.
  auto newest = [&] {
    const std::string st = read_file(jobs_ + "/checkpoints/" + std::to_string(pid_) + ".json");
    const size_t at = st.find("\"newest\":\"");
    return at == std::string::npos ? std::string() : st.substr(at + 10, st.find('"', at + 10) - at - 10);
  };
  const std::string before = newest();
  std::string after;
  for (int i = 0; i < 2; ++i) {  // two new points: the second surely began after the write
    while ((after = newest()) == before || after.empty()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << read_file(points + "/checkpoint.log");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (i == 0) {
      const std::string first = after;
      while ((after = newest()) == first) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  out = cli("restore -D " + points + " --latest --json", &code);
  ASSERT_EQ(code, 0) << out << read_file(points + "/checkpoint.log");
  restored_ = pid_ = static_cast<pid_t>(std::stoi(out.substr(out.find("\"pid\":") + 6)));
  EXPECT_EQ(check(), "rc=0 same=1\n");  // the memory as the job had it, its write included
  // The job's first incarnation ended its policy; a stop now says so and changes nothing.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (read_file(jobs_ + "/checkpoints/" + std::to_string(pid_) + ".json").find("\"state\":\"ended\"") == std::string::npos)
    ASSERT_LT(std::chrono::steady_clock::now(), until);
  out = cli("checkpoint -t " + std::to_string(pid_) + " --jobs-dir " + jobs_ + " --stop", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("is not running (ended)"), std::string::npos) << out;
  // Bad policies are refused before the program starts.
  out = pos::test::run_shell(env("POS_RUN") + " run --checkpoint-every 5x -D " + points + " -- /bin/true", &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("is no interval"), std::string::npos) << out;
  out = pos::test::run_shell(env("POS_RUN") + " run --checkpoint-every 1s -- /bin/true", &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--checkpoint-every and -D go together"), std::string::npos) << out;
}

// A job still starting (it has not touched the GPU) has nothing for POS to save: pre-dumps, dumps
// and moves say so and leave no image, the job running on; a policy started with it, GPU-only or
// with CPU state, waits, counts no failure, and takes its first point once the job used the GPU.
TEST_F(DriverDump, AJobThatHasNotUsedTheGpuYetIsRefusedPlainlyAndAPolicyWaitsForIt) {
  fake_gpus(2);
  wait_go_ = true;
  for (const std::string with_cpu : {"", "--with-cpu"}) {
    SCOPED_TRACE("policy " + (with_cpu.empty() ? std::string("GPU-only") : with_cpu));
    const std::string points = start_with_policy(with_cpu);
    int code = -1;
    const std::string img = (root_ / "img").string();
    for (const std::string cmd : {"pre-dump", "dump --leave-running", "dump", "migrate --device 1"}) {
      fs::remove_all(img);
      const bool moves = cmd.rfind("migrate", 0) == 0;
      const std::string out = cli(cmd + " -t " + std::to_string(pid_) + (moves ? "" : " -D " + img) + " --jobs-dir " + jobs_, &code);
      EXPECT_NE(code, 0) << cmd << ": " << out;
      EXPECT_NE(out.find("the job has not used the GPU yet"), std::string::npos) << cmd << ": " << out;
      EXPECT_FALSE(fs::exists(img + "/manifest")) << cmd;
      EXPECT_EQ(::kill(pid_, 0), 0) << cmd << ": the job must run on";
    }
    // Several ticks' worth of waiting, then the job goes on and the policy takes its points.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    const std::string log = points + "/checkpoint.log";
    EXPECT_NE(read_file(log).find("waiting for the job: "), std::string::npos) << read_file(log);
    go();
    ASSERT_TRUE(wait_for(log, "cp-000002: ")) << read_file(log);
    const std::string text = read_file(log);
    EXPECT_EQ(text.find("failed after"), std::string::npos) << text;
    EXPECT_NE(text.find("cp-000001: whole"), std::string::npos) << text;
    const size_t first = text.find("waiting for the job: ");
    EXPECT_EQ(text.find("waiting for the job: ", first + 1), std::string::npos) << "said once: " << text;
    const std::string st = read_file(jobs_ + "/checkpoints/" + std::to_string(pid_) + ".json");
    EXPECT_NE(st.find("\"failed\":0"), std::string::npos) << st;
    ASSERT_EQ(check(), "rc=0 same=1\n");  // and the job's memory is as it made it
    out_of_the_way();
  }
}

// A policy's checkpointer makes its CUDA context of the job's device at its first tick and keeps it
// between ticks, instead of making one and letting it go at every tick (on a GPU ~0.1 s of each,
// and the driver's work of making a context beside the running job); GPU-only and --with-cpu.
TEST_F(DriverDump, APolicysCheckpointerMakesItsDeviceContextOnceAndKeepsItBetweenTicks) {
  fake_gpus(1);
  for (const std::string with_cpu : {"", "--with-cpu"}) {
    SCOPED_TRACE("policy " + (with_cpu.empty() ? std::string("GPU-only") : with_cpu));
    const std::string points = start_with_policy(with_cpu);
    const std::string log = points + "/checkpoint.log";
    ASSERT_TRUE(wait_for(log, "cp-000004: ")) << read_file(log);
    const std::string text = read_file(log);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex("checkpointer pid ([0-9]+)"))) << text;
    const std::string who = m[1].str();
    const std::string contexts = fake_log();
    const auto count = [&](const std::string& what) {
      size_t n = 0;
      for (size_t at = 0; (at = contexts.find("\n" + what + " " + who + " ", at)) != std::string::npos; ++at) ++n;
      if (contexts.rfind(what + " " + who + " ", 0) == 0) ++n;
      return n;
    };
    EXPECT_EQ(count("context"), 1u) << "made once, for four ticks: " << contexts << text;
    EXPECT_EQ(count("context-gone"), 0u) << "kept between ticks: " << contexts;
    EXPECT_EQ(text.find("failed after"), std::string::npos) << text;
    ASSERT_EQ(check(), "rc=0 same=1\n");
    out_of_the_way();
  }
}

}  // namespace

namespace {
// Waits up to 10 s for `pid` to end (it may be this process's child, reparented here, or not).
bool ends_within_10s(pid_t pid, int* status) {
  for (int i = 0; i < 1000; ++i) {
    const pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && ::kill(pid, 0) != 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}
}  // namespace

// restore --lazy: the job runs again before its memory is loaded; its GPU work (here a copy that
// reads its memory back) waits on the device until pos-cli's load has ended, then sees the bytes of
// its image. While the load runs the job cannot be dumped. With pos-cli stopped mid-load the job
// runs but its copy does not complete; with pos-cli killed there the job ends itself (its memory
// will never be whole) and the image restores again.
TEST_F(DriverDump, ALazyRestoreRunsTheJobBeforeItsMemoryIsLoadedAndItsGpuWorkWaitsForTheLoad) {
  pid_t dumped = stop_dump();
  const std::string img = (root_ / "img").string(), log = (root_ / "restore.log").string();
  pid_t restorer = background("driver-lazy-load", "restore -D " + img + " --lazy --json", log);
  struct Reap {  // a failed assertion leaves no stopped pos-cli behind
    pid_t* p;
    ~Reap() {
      if (*p > 0) ::kill(*p, SIGKILL), ::kill(*p, SIGCONT), ::waitpid(*p, nullptr, 0);
    }
  } reap{&restorer};
  ASSERT_TRUE(wait_for(log, "stopping the process")) << read_file(log);
  restored_ = dumped;
  ASSERT_EQ(::kill(dumped, 0), 0);  // running, its memory handed over but not loaded
  const std::string result = ask_check(++checks_);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(fs::exists(result)) << "the job's copy ran before the load ended";
  int code = -1;
  std::string out = cli("dump -t " + std::to_string(dumped) + " -D " + (root_ / "img2").string() + " --jobs-dir " + jobs_, &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("still loading its device memory after a lazy restore"), std::string::npos) << out;
  EXPECT_EQ(::kill(dumped, 0), 0);
  // ps says so, in both forms.
  out = cli("ps --json --jobs-dir " + jobs_ + " --socket " + (root_ / "no-posd.sock").string(), &code);
  EXPECT_NE(out.find("\"lazy_load\":{\"loader\":" + std::to_string(restorer) + ","), std::string::npos) << out;
  out = cli("ps --jobs-dir " + jobs_ + " --socket " + (root_ / "no-posd.sock").string(), &code);
  EXPECT_NE(out.find("loading its memory (restore --lazy)"), std::string::npos) << out;
  ::kill(restorer, SIGCONT);
  int st = 0;
  ASSERT_EQ(::waitpid(restorer, &st, 0), restorer);
  restorer = -1;
  out = read_file(log);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  EXPECT_NE(out.find("\"loaded_while_running\":true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"handoff\":true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"resumed_s\":"), std::string::npos) << out;
  EXPECT_NE(out.find("\"note\":\"\""), std::string::npos) << out;  // the job confirmed the load's end
  for (int i = 0; i < 2000 && !fs::exists(result); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(read_file(result), "rc=0 same=1\n");  // the copy waited for the load, then read the image's bytes
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // Done loading: it can be dumped again (a stop dump), and that image restores eagerly.
  fs::remove_all(img);
  out = cli("dump -t " + std::to_string(dumped) + " -D " + img + " --jobs-dir " + jobs_, &code);
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(ends_within_10s(dumped, &st));
  restored_ = -1;

  // pos-cli killed mid-load: the job ends itself; the image is unchanged and restores again.
  restorer = background("driver-lazy-load", "restore -D " + img + " --lazy --json", log);
  ASSERT_TRUE(wait_for(log, "stopping the process")) << read_file(log);
  restored_ = dumped;
  ::kill(restorer, SIGKILL);
  ::kill(restorer, SIGCONT);
  ::waitpid(std::exchange(restorer, -1), nullptr, 0);
  ASSERT_TRUE(ends_within_10s(dumped, &st)) << "the job ran on without its loader";
  out = cli("restore -D " + img + " --json", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// A job whose driver cannot wait on memory (no stream memory operations) is held at POS's gate
// until the load ends instead; one whose driver cannot register the flag is loaded before it runs.
// Either way the restore says so, and the job reads its image's bytes.
TEST_F(DriverDump, ALazyRestoreOnADriverWithoutStreamWaitsHoldsTheJobOrLoadsItFirstAndSaysSo) {
  for (const auto& [knob, says] : std::vector<std::pair<std::string, std::string>>{
           {"FAKE_CUDA_NO_STREAM_WAIT=1", "its driver calls waited instead"},
           {"FAKE_CUDA_NO_HOST_REGISTER=1", "loaded before the job ran (not lazily)"}}) {
    SCOPED_TRACE(knob);
    fake_env_ = {knob};
    const pid_t dumped = stop_dump();
    int code = -1;
    const std::string out = cli("restore -D " + (root_ / "img").string() + " --lazy --json", &code);
    ASSERT_EQ(code, 0) << out;
    restored_ = dumped;
    EXPECT_NE(out.find(says), std::string::npos) << out;
    EXPECT_EQ(check(), "rc=0 same=1\n");
    ::kill(std::exchange(restored_, -1), SIGKILL);
    int st = 0;
    ASSERT_TRUE(ends_within_10s(dumped, &st));
    fs::remove_all(root_ / "img");
  }
}

// pos-cli migrate --device N of an in-process job: its process stays, its driver state moves with
// NVIDIA's restore (the pairs for every GPU it sees), its memory is copied onto GPU N by pos-cli and
// taken at the same addresses; the job reads its pattern back. Refused before anything changes:
// a device that does not exist, the GPU it runs on. pos-cli killed after the copy: its guardian
// gives the job its driver state and its old memory back, and it runs on.
TEST_F(DriverDump, MigrateWithDeviceMovesARunningJobToAnotherGpuAndKeepsItsProcess) {
  fake_gpus(2);
  start();
  ASSERT_EQ(check(), "rc=0 same=1\n");
  const std::string pid = std::to_string(pid_);
  int code = -1;
  std::string out = cli("migrate -t " + pid + " --device 1 --json", &code);
  ASSERT_EQ(code, 0) << out << fake_log();
  EXPECT_NE(out.find("\"inproc\":true,\"from\":0,\"from_uuid\":\"" + fake_uuid(0) + "\",\"to\":1,\"to_uuid\":\"" +
                     fake_uuid(1) + "\",\"gpu_bytes\":10485760,\"handles\":2"),
            std::string::npos)
      << out;
  std::string log = fake_log();
  EXPECT_NE(log.find("restore " + pid + " 0->1 1->0\n"), std::string::npos) << log;
  bool on_gpu1 = false;
  std::istringstream lines(log);
  for (std::string l; std::getline(lines, l);) on_gpu1 = on_gpu1 || (l.rfind("create ", 0) == 0 && l.back() == '1');
  EXPECT_TRUE(on_gpu1) << log;
  EXPECT_EQ(::kill(pid_, 0), 0);        // the same process
  EXPECT_EQ(check(), "rc=0 same=1\n");  // its pattern, at its addresses, on GPU 1
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {" --device 1", "runs on CUDA device 1 already"}, {" --device 5", "there is no CUDA device 5"}}) {
    out = cli("migrate -t " + pid + args, &code);
    EXPECT_EQ(code, 1) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // Back to GPU 0, pos-cli killed once the memory is copied: the guardian brings the job back.
  const std::string log_file = (root_ / "move.log").string();
  pid_t mover = background("driver-move-copied", "migrate -t " + pid + " --device 0", log_file);
  ASSERT_TRUE(wait_for(log_file, "stopping the process")) << read_file(log_file);
  ::kill(mover, SIGKILL);
  ::kill(mover, SIGCONT);
  ::waitpid(mover, nullptr, 0);
  EXPECT_TRUE(wait_for(log_file, "pid " + pid + " runs on:")) << read_file(log_file);  // the guardian resumed it
  EXPECT_EQ(check(), "rc=0 same=1\n");  // running, with its memory
  // And the move done after all.
  out = cli("migrate -t " + pid + " --device 0 --json", &code);
  ASSERT_EQ(code, 0) << out << fake_log();
  EXPECT_NE(out.find("\"to\":0,"), std::string::npos) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // A posd job's flag is refused for in-process jobs and the other way round.
  out = cli("migrate -t " + pid + " --to /nonexistent.sock", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--device N moves it to another GPU"), std::string::npos) << out;
}

// A job under an SM limit (pos run --sms) is not moved to another GPU: refused before anything
// changes, and it runs on with its memory.
TEST_F(DriverDump, AJobUnderAnSmLimitIsNotMovedToAnotherGpu) {
  fake_gpus(2);
  fake_env_.push_back("POS_SM_LIMIT=16");
  start();
  ASSERT_EQ(check(), "rc=0 same=1\n");
  int code = -1;
  const std::string out = cli("migrate -t " + std::to_string(pid_) + " --device 1", &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("the job runs under an SM limit (pos run --sms)"), std::string::npos) << out;
  EXPECT_EQ(fake_log().find("restore "), std::string::npos) << fake_log();  // NVIDIA's restore never asked
  EXPECT_EQ(check(), "rc=0 same=1\n");
}

// A move that fails after the job let go of its memory gives it back, and the job runs on where it
// was: the copy onto the new GPU failing (before NVIDIA's restore: the job's driver state is
// restored in place), and NVIDIA's restore not moving the job (after it: pos-cli's check catches it).
TEST_F(DriverDump, AMoveThatFailsMidwayLeavesTheJobRunningOnItsGpuWithItsMemory) {
  for (const auto& [knob, says] : std::vector<std::pair<std::string, std::string>>{
           {"FAKE_CUDA_FAIL_DTOD=1", "copying the device memory onto CUDA device 1"},
           {"FAKE_CUDA_REMAP_IGNORED=1", "after NVIDIA's restore the job's GPU is " + fake_uuid(0)}}) {
    SCOPED_TRACE(knob);
    fake_gpus(2);
    fake_env_.push_back(knob);
    start();
    int code = -1;
    const std::string out = cli("migrate -t " + std::to_string(pid_) + " --device 1", &code);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find(says), std::string::npos) << out;
    EXPECT_NE(out.find("the job runs on with its memory"), std::string::npos) << out;
    EXPECT_EQ(::kill(pid_, 0), 0);
    EXPECT_EQ(check(), "rc=0 same=1\n");  // its pattern, at its addresses
    const std::string gpus = cli("ps --json --jobs-dir " + jobs_ + " --socket " + (root_ / "no-posd.sock").string(), &code);
    EXPECT_NE(gpus.find("\"pid\":" + std::to_string(pid_)), std::string::npos) << gpus;
    ::kill(std::exchange(pid_, -1), SIGKILL);
    ::waitpid(-1, nullptr, 0);
  }
}

// ZDTM shape across "hosts" (CI's stand-in: a network namespace joined by a veth pair, a posd in it
// accepting migrations): the running in-process job is migrated there with `pos-cli migrate --to
// HOST:PORT` (GPU-only rounds, then the stop dump of its process, restored and held there until
// the commit) and reads its memory back there; then a move whose stop image cannot be sent brings
// it back on the source from the same image, alone under its pid; then pos-cli is killed at each
// phase (after a round, with the source's copy ended, with the job held there, with the commit
// sent) and the job runs exactly once, where that phase says.
TEST_F(DriverDump, MigrateToAnotherHostsPosdMovesTheRunningJobAndEachFailureLeavesItRunningExactlyOnce) {
  const pos::test::NetnsPeer net("pos-ddm", "pda", "pdb", 232);
  ASSERT_TRUE(net.ok) << "cannot make a network namespace and a veth pair (iproute2, root): " << net.error;
  const std::string &ns = net.ns, &ip_there = net.ip_there;
  int code = -1;
  // The target posd, in the namespace. Its pos-cli restores the job in this test's namespaces (as
  // posd_e2e_test does), so that the test can talk to the restored job.
  const fs::path b = root_ / "b";
  fs::create_directories(b);
  const std::string secret = (root_ / "secret").string(), wrapper = (root_ / "cli-here").string(),
                    drop = (root_ / "drop-at").string(), log = (root_ / "b.log").string();
  std::ofstream(secret) << "the secret of this test run " << ::getpid() << "\n";
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  std::ofstream(wrapper) << "#!/bin/sh\nexec nsenter --net=/proc/" << ::getpid() << "/ns/net --mount=/proc/" << ::getpid()
                         << "/ns/mnt " << env("POS_CLI") << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  std::ofstream(b / "posd.yaml") << "backend: host\nlog_level: info\nposd:\n  socket: " << (b / "posd.sock").string()
                                 << "\n  arena: 32MiB\n  migration:\n    listen: " << ip_there << ":0\n    secret_file: "
                                 << secret << "\n    dir: " << (b / "in").string() << "\n    cli: " << wrapper << "\n";
  const std::string posd = pos::test::run_shell(
      "POS_REAL_LIBCUDA=" + env("POS_FAKE_CUDA") + " POS_MIGRATION_DROP_AT_FILE=" + drop + " ip netns exec " + ns + " " +
          env("POS_POSD") + " --config " + (b / "posd.yaml").string() + " </dev/null >/dev/null 2>" + log + " & echo $!",
      &code);
  ASSERT_EQ(code, 0) << posd;
  const pid_t posd_pid = static_cast<pid_t>(std::atoi(posd.c_str()));
  struct Stop {
    pid_t p;
    ~Stop() {
      ::kill(p, SIGTERM);
      for (int i = 0; i < 500 && ::kill(p, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } stop{posd_pid};
  std::string port;
  for (int i = 0; i < 1000 && port.empty(); ++i) {
    const std::string l = read_file(log);
    const std::string key = "accepting migrations on " + ip_there + ":";
    if (const size_t at = l.find(key); at != std::string::npos) port = l.substr(at + key.size(), l.find_first_not_of("0123456789", at + key.size()) - at - key.size());
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(port.empty()) << read_file(log);
  const std::string to = ip_there + ":" + port, work = (root_ / "scratch").string();
  fs::create_directories(work);

  start();
  ASSERT_EQ(write(), "rc=0\n");  // the second allocation changes: the rounds and the stop carry it
  ASSERT_EQ(check(), "rc=0 same=1\n");
  const pid_t job = pid_;
  const std::string migrate = "migrate -t " + std::to_string(job) + " --to " + to + " --secret-file " + secret +
                              " --jobs-dir " + jobs_ + " --work-dir " + work + " --max-rounds 2 --json";
  // Not with --device, nor to a local socket: refused before anything is asked of the job.
  std::string out = cli("migrate -t " + std::to_string(job) + " --to " + to + " --device 0 --jobs-dir " + jobs_, &code);
  EXPECT_EQ(code, 2) << out;
  out = cli("migrate -t " + std::to_string(job) + " --to /tmp/some/posd.sock --jobs-dir " + jobs_, &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--to HOST:PORT"), std::string::npos) << out;
  EXPECT_EQ(check(), "rc=0 same=1\n");

  // pos-cli ends the source's copy and waits for its pid to come free: this test, its parent,
  // reaps it meanwhile.
  int reaped = 0;
  const auto migrate_reaping = [&](const std::string& fault = "") {
    std::atomic<bool> done{false};
    std::string o;
    std::thread t([&] {
      o = fault.empty() ? cli(migrate, &code)
                        : pos::test::run_shell("POS_FAULT_POINT=" + fault + " POS_REAL_LIBCUDA=" + env("POS_FAKE_CUDA") +
                                                   " " + env("POS_CLI") + " " + migrate + " 2>&1",
                                               &code);
      done = true;
    });
    // Every process under the job's pid ends up this test's child (the subreaper): the source's
    // copy, and a copy the target restored and ended.
    pid_ = -1, restored_ = job;
    while (!done) {
      if (::waitpid(job, nullptr, WNOHANG) == job) ++reaped;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    t.join();
    return o;
  };
  out = migrate_reaping();
  ASSERT_EQ(code, 0) << out << read_file(log);
  EXPECT_EQ(reaped, 1) << "the source's copy was not ended";
  EXPECT_NE(out.find("\"inproc\":true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"where\":\"target\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"remote\":true,\"same_host\":true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"round\":1,\"bytes\":10485760"), std::string::npos) << out;  // round 1: all 10 MiB
  // Its CPU memory went in the rounds too (read while it ran); the stop's CRIU part left the pages
  // still equal to the last round's to them, and the target's CRIU read them there.
  EXPECT_NE(out.find("\"final_criu_pages_to_parent\":"), std::string::npos) << out;
  EXPECT_EQ(out.find("\"final_criu_pages_to_parent\":0,"), std::string::npos) << out;
  // The stop's GPU part went while the driver's checkpoint and CRIU still ran.
  std::smatch early;
  ASSERT_TRUE(std::regex_search(out, early, std::regex("\"final_sent_early\":([0-9]+)"))) << out;
  EXPECT_GT(std::stoull(early[1].str()), 0u) << out;
  ASSERT_TRUE(std::regex_search(out, early, std::regex("\"stop_early_send_s\":([0-9.]+)"))) << out;
  EXPECT_GT(std::stod(early[1].str()), 0) << out;
  int st = 0;
  restored_ = job;  // the same pid, now the target's restore (this test reaps it)
  EXPECT_EQ(::kill(job, 0), 0);
  EXPECT_NE(read_file(log).find("committed; pid " + std::to_string(job) + " runs here"), std::string::npos) << read_file(log);
  EXPECT_EQ(check(), "rc=0 same=1\n");  // its memory, written before the move, is there
  EXPECT_TRUE(pos::test::empties_within(work, 30)) << "pos-cli left its scratch";

  // The target drops the link as the stop's image arrives: the job comes back here, from that
  // image, still the one job under its pid.
  std::ofstream(drop) << "final\n";
  out = migrate_reaping();
  ASSERT_EQ(code, 3) << out << read_file(log);  // 3: the job runs on at the source
  EXPECT_EQ(reaped, 2) << "the target's copy was not ended";
  restored_ = job;  // restored here, from the stop's image
  EXPECT_NE(out.find("\"where\":\"source\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"target_error\":\"sending the stop's image"), std::string::npos) << out;
  EXPECT_EQ(::kill(job, 0), 0);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  {  // the target committed the first move only
    const std::string l = read_file(log), c = "committed; pid " + std::to_string(job) + " runs here";
    const size_t first = l.find(c);
    EXPECT_TRUE(first != std::string::npos && l.find(c, first + 1) == std::string::npos) << l;
  }

  // pos-cli killed with the job restored and held at the target, before the commit: the target
  // ends its copy as the link closes, and pos-cli's guardian restores the job here.
  out = migrate_reaping("migrate-before-commit");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("restoring the job on the source"), std::string::npos) << out;
  EXPECT_EQ(reaped, 4) << "the source's copy and the target's held one were not both ended";
  EXPECT_NE(read_file(log).find("ended before it was committed: ending restored pid " + std::to_string(job)),
            std::string::npos) << read_file(log);
  restored_ = job;
  EXPECT_EQ(::kill(job, 0), 0);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  {
    const std::string l = read_file(log), c = "committed; pid " + std::to_string(job) + " runs here";
    EXPECT_EQ(l.find(c, l.find(c) + 1), std::string::npos) << l;
  }
  // pos-cli killed after a round: the job never stopped, and runs on here, untouched.
  out = migrate_reaping("migrate-round");
  EXPECT_NE(code, 0) << out;
  EXPECT_EQ(reaped, 4);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // Killed once the source's copy ended, before the stop's image went: the guardian restores the
  // job here from that image.
  out = migrate_reaping("migrate-stopped");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("restoring the job on the source"), std::string::npos) << out;
  EXPECT_EQ(reaped, 5);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  // Killed right after it sent the commit: the guardian asks the target, which runs the job.
  out = migrate_reaping("migrate-commit-sent");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("asking the target where it runs"), std::string::npos) << out;
  EXPECT_EQ(reaped, 6);
  EXPECT_EQ(check(), "rc=0 same=1\n");
  {
    const std::string l = read_file(log), c = "committed; pid " + std::to_string(job) + " runs here";
    const size_t second = l.find(c, l.find(c) + 1);
    EXPECT_NE(second, std::string::npos) << l;
    EXPECT_EQ(l.find(c, second + 1), std::string::npos) << l;
  }
  EXPECT_TRUE(fs::is_empty(work)) << "a guardian left its scratch";
  { std::ofstream(root_ / "work" / "exit"); }
  for (int i = 0; i < 1000 && ::waitpid(job, &st, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(::kill(job, 0), 0) << "the job did not end when told";
  restored_ = -1;
}
