// training_e2e_test.cc — the CUDA training program (nvcc-built, linked against POS in-process) runs
// through the pipeline on the host backend and prints exactly what the direct CPU computation prints,
// also when POS_CHECKPOINT checkpoints it (and restores it) mid-run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/image.h"
#include "unittest/run_program.h"
#include "workloads/mlp_reference.h"

namespace {

std::string run_pos(const std::vector<std::string>& args, int* exit_code, const std::string& env = "",
                    std::string* err = nullptr) {
  return pos::test::run_program("POS_MLP_TRAIN_POS", env, args, exit_code, err);
}

std::string run_reference(const std::vector<std::string>& args) {
  std::string out = mlp_reference_output(args);
  EXPECT_FALSE(out.empty()) << "the reference refused its arguments";
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

// The last line of a run: "pos: the job ran through POS in-process: backend B (DEVICE), N CUDA calls,
// C checkpoint(s) written, R restore(s)". found = false when the line is missing.
struct Summary {
  bool found = false;
  std::string backend;
  unsigned long long calls = 0, checkpoints = 0, restores = 0;
};

Summary summary_of(const std::string& err) {
  Summary s;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("pos: the job ran through POS in-process: backend ", 0) != 0) continue;
    char backend[64] = {};
    const size_t open = line.find(" ("), close = line.find("), ");
    if (open == std::string::npos || close == std::string::npos) continue;
    const int n = std::sscanf(line.c_str(), "pos: the job ran through POS in-process: backend %63s", backend);
    const int m = std::sscanf(line.c_str() + close, "), %llu CUDA calls, %llu checkpoint", &s.calls, &s.checkpoints);
    const size_t comma = line.rfind(", ");
    const int r = std::sscanf(line.c_str() + comma, ", %llu restore", &s.restores);
    s.found = n == 1 && m == 2 && r == 1;
    s.backend = backend;
  }
  return s;
}

TEST(TrainingEndToEnd, TheJobSaysItRanThroughPosWithItsBackendAndCallCount) {
  int code = -1;
  std::string err;
  run_pos({}, &code, "", &err);
  ASSERT_EQ(code, 0) << err;
  const Summary s = summary_of(err);
  ASSERT_TRUE(s.found) << err;
  EXPECT_EQ(s.backend, "host");
  // 20 steps of a 2-layer MLP: hundreds of launches, copies and syncs, none of them checkpoints.
  EXPECT_GT(s.calls, 200u) << err;
  EXPECT_EQ(s.checkpoints, 0u);
  EXPECT_EQ(s.restores, 0u);
  // POS_SUMMARY=0 silences it.
  run_pos({}, &code, "POS_SUMMARY=0 ", &err);
  EXPECT_FALSE(summary_of(err).found) << err;
}

// Batches made ahead on other threads (--prefetch, the benches' job), samples split unevenly
// between threads (37 over 1, 3 and 8), are the batches made at each step's start: the run is the
// reference's, bit for bit.
TEST(TrainingEndToEnd, AJobThatMakesItsBatchesAheadOnSeveralThreadsMatchesToo) {
  for (const char* threads : {"1", "3", "8"})
    expect_same_training({"--input", "70", "--hidden", "64", "--layers", "3", "--output", "19", "--batch", "37",
                          "--steps", "15", "--frozen", "1", "--prefetch", threads},
                         15);
}

TEST(TrainingEndToEnd, BadArgumentsFailCleanly) {
  int code = 0;
  run_pos({"--hidden", "zero"}, &code);
  EXPECT_NE(code, 0);
  run_pos({"--prefetch", "65"}, &code);
  EXPECT_NE(code, 0);
}

// ---------------- POS_CHECKPOINT ----------------
// The default job makes one cudaStreamSynchronize per training step (sync calls 1..20), then one
// per parameter tensor while it computes the checksum (21..26): "at=N" is after step N.

// One "pos: checkpoint k at sync call N: ... X bytes stored, Y referenced, ... -> DIR" line.
struct CheckpointLine {
  int k = 0;
  unsigned long long sync_call = 0, cut = 0, stored = 0, referenced = 0;
  std::string dir;
};

std::vector<CheckpointLine> checkpoint_lines(const std::string& err) {
  std::vector<CheckpointLine> out;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("pos: checkpoint ", 0) != 0 || line.rfind("pos: checkpoint failed", 0) == 0) continue;
    CheckpointLine c;
    char dir[4096] = {};
    double stall = 0, total = 0;
    const int n = std::sscanf(line.c_str(),
                              "pos: checkpoint %d at sync call %llu: cut %llu, %llu bytes stored, %llu referenced, "
                              "stall %lf ms, total %lf ms -> %4095s",
                              &c.k, &c.sync_call, &c.cut, &c.stored, &c.referenced, &stall, &total, dir);
    EXPECT_EQ(n, 8) << "unexpected line: " << line;
    c.dir = dir;
    out.push_back(c);
  }
  return out;
}

size_t count_lines_starting(const std::string& text, const std::string& prefix) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
  return n;
}

class CheckpointedTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = "/tmp/pos_training_ckpt_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    ASSERT_TRUE(std::filesystem::create_directories(root_));
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string prefix() const { return root_ + "/img"; }
  std::string image(int k) const { return prefix() + "-" + std::to_string(k); }

  // Runs the default job under POS_CHECKPOINT=`spec` (dir= is added) and checks it printed exactly
  // what the uninterrupted CPU reference prints, and one report line per checkpoint in `at`.
  std::vector<CheckpointLine> run_checkpointed(const std::string& spec, const std::vector<unsigned long long>& at,
                                               bool restores, bool lazy = false) {
    int code = -1;
    std::string err;
    const std::string out = run_pos({}, &code, "POS_CHECKPOINT='" + spec + ";dir=" + prefix() + "' ", &err);
    EXPECT_EQ(code, 0) << out;
    // The loss curve and the checksum, bit for bit.
    EXPECT_EQ(out, run_reference({})) << err;
    const auto lines = checkpoint_lines(err);
    EXPECT_EQ(lines.size(), at.size()) << err;
    EXPECT_EQ(count_lines_starting(err, "pos: checkpoint "), at.size()) << err;
    EXPECT_EQ(count_lines_starting(err, "pos: restored from "), restores ? at.size() : 0) << err;
    EXPECT_EQ(count_lines_starting(err, "pos: lazy restore from "), lazy ? at.size() : 0) << err;
    for (size_t i = 0; i < lines.size() && i < at.size(); ++i) {
      const int k = static_cast<int>(i) + 1;
      EXPECT_EQ(lines[i].k, k) << err;
      EXPECT_EQ(lines[i].sync_call, at[i]) << err;
      EXPECT_EQ(lines[i].dir, image(k)) << err;
      if (restores && !lazy) {
        EXPECT_NE(err.find("pos: restored from " + image(k) + "\n"), std::string::npos) << err;
      }
      if (restores && lazy) {
        EXPECT_NE(err.find("pos: restored from " + image(k) + " (lazily: "), std::string::npos) << err;
        // Every lazy restore finished loading (by the next checkpoint, or at exit) without an error.
        EXPECT_NE(err.find("pos: lazy restore from " + image(k) + " complete: "), std::string::npos) << err;
      }
    }
    // The summary counts what happened, and a restore does not change the calls the job made.
    const Summary s = summary_of(err);
    EXPECT_TRUE(s.found) << err;
    EXPECT_EQ(s.checkpoints, at.size()) << err;
    EXPECT_EQ(s.restores, restores ? at.size() : 0) << err;
    std::string plain_err;
    int plain_code = -1;
    run_pos({}, &plain_code, "", &plain_err);
    EXPECT_EQ(s.calls, summary_of(plain_err).calls) << err;
    return lines;
  }

  std::string root_;
};

TEST_F(CheckpointedTraining, SyncCheckpointsAtSeveralStepsLeaveTheRunUnchangedAndAreValidImages) {
  const auto lines = run_checkpointed("at=3,7,12;mode=sync", {3, 7, 12}, /*restores=*/false);
  for (int k = 1; k <= 3; ++k) {
    ASSERT_TRUE(std::filesystem::is_directory(image(k))) << image(k);
    auto img = pos::ckpt::ImageReader::open_dir(image(k));
    EXPECT_TRUE(img.ok()) << img.status().to_string();
  }
  // Not incremental: each image stores the whole device state and references nothing.
  for (const auto& l : lines) {
    EXPECT_GT(l.stored, 0u);
    EXPECT_EQ(l.referenced, 0u);
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_LT(lines[0].cut, lines[1].cut);
  EXPECT_LT(lines[1].cut, lines[2].cut);
}

TEST_F(CheckpointedTraining, SyncCheckpointsEachFollowedByARestoreLeaveTheRunUnchanged) {
  run_checkpointed("at=5,10,15;then=restore", {5, 10, 15}, /*restores=*/true);
}

TEST_F(CheckpointedTraining, LazyRestoresAfterEachCheckpointLeaveTheRunUnchanged) {
  // Each restore returns before a byte of the buffers is loaded; the next step's calls load what
  // they name first, background loaders the rest.
  run_checkpointed("at=5,10,15;then=restore;lazy=1", {5, 10, 15}, /*restores=*/true, /*lazy=*/true);
}

TEST_F(CheckpointedTraining, LazyRestoresThroughAnIncrementalChainOfAsyncImagesLeaveTheRunUnchanged) {
  // The last two links store nothing: their buffers load lazily from the ancestors.
  run_checkpointed("at=4,20,21,22;mode=async;incremental=1;then=restore;lazy=1", {4, 20, 21, 22},
                   /*restores=*/true, /*lazy=*/true);
}

TEST_F(CheckpointedTraining, AsyncCheckpointsEachFollowedByARestoreLeaveTheRunUnchanged) {
  run_checkpointed("at=4,9;mode=async;then=restore", {4, 9}, /*restores=*/true);
}

TEST_F(CheckpointedTraining, AsyncCheckpointsDrainedWhileTheJobRunsOnLeaveTheRunUnchanged) {
  run_checkpointed("at=2,5,8;mode=async;then=continue", {2, 5, 8}, /*restores=*/false);
  for (int k = 1; k <= 3; ++k) EXPECT_TRUE(pos::ckpt::ImageReader::open_dir(image(k)).ok()) << image(k);
}

TEST_F(CheckpointedTraining, AnIncrementalChainRestoredAtEveryLinkLeavesTheRunUnchanged) {
  // Five links during training (the last after the final step), two during the checksum. A training
  // step rewrites every device buffer of this job (input batch, targets, weights, activations,
  // gradients, loss), so a link with a step since its parent stores as much as the first; the
  // checksum only reads, so the last two links store nothing and reference the whole state in the
  // chain. Each restore reads the image just written, i.e. through its chain.
  const auto lines = run_checkpointed("at=3,6,9,12,20,21,22;incremental=1;then=restore", {3, 6, 9, 12, 20, 21, 22},
                                      /*restores=*/true);
  ASSERT_EQ(lines.size(), 7u);
  const unsigned long long full = lines[0].stored;
  EXPECT_GT(full, 0u);
  EXPECT_EQ(lines[0].referenced, 0u);
  for (const auto& l : lines) {
    EXPECT_EQ(l.stored + l.referenced, full) << "image " << l.k << " must describe the whole state";
    EXPECT_LE(l.stored, full) << "image " << l.k;
  }
  for (size_t i : {5u, 6u}) {
    EXPECT_LT(lines[i].stored, full) << "image " << lines[i].k;
    EXPECT_GT(lines[i].referenced, 0u) << "image " << lines[i].k;
  }
  auto last = pos::ckpt::ImageReader::open_dir(image(7));
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  ASSERT_NE(last.value()->parent(), nullptr);
  EXPECT_NE(last.value()->parent()->parent(), nullptr);  // 7 -> 6 -> 5
}

TEST_F(CheckpointedTraining, AMalformedCheckpointVariableStopsTheJobWithAMessageNamingIt) {
  for (const std::string spec : {"at=0;dir=", "at=3", "dir=/tmp/x", "at=3,2;dir=/tmp/x", "at=3;dir=/tmp/x;mode=fast",
                                 "at=3;dir=/tmp/x;then=stop", "at=3;dir=/tmp/x;bogus=1", "at=3;;dir=/tmp/x",
                                 "at=3;dir=/tmp/x;lazy=1", "at=3;dir=/tmp/x;then=restore;lazy=yes"}) {
    int code = 0;
    std::string err;
    const std::string out = run_pos({}, &code, "POS_CHECKPOINT='" + spec + "' ", &err);
    EXPECT_NE(code, 0) << spec;
    // Said once, by the runtime; the job then fails at its first CUDA call and computes nothing.
    EXPECT_EQ(count_lines_starting(err, "pos: cannot start the POS runtime: "), 1u) << spec << "\n" << err;
    EXPECT_NE(err.find("POS_CHECKPOINT"), std::string::npos) << spec << "\n" << err;
    EXPECT_NE(err.find("cudaErrorInitializationError"), std::string::npos) << spec << "\n" << err;
    EXPECT_EQ(out.find(" loss "), std::string::npos) << spec << "\n" << out;
  }
}

TEST_F(CheckpointedTraining, ACheckpointThatCannotBeWrittenFailsTheJobLoudly) {
  // An image is never overwritten: the first target is taken, so checkpoint 1 fails.
  ASSERT_TRUE(std::filesystem::create_directories(image(1)));
  for (const std::string mode : {"sync", "async"}) {
    int code = 0;
    std::string err;
    run_pos({}, &code, "POS_CHECKPOINT='at=3;mode=" + mode + ";dir=" + prefix() + "' ", &err);
    EXPECT_NE(code, 0) << mode << "\n" << err;
    EXPECT_EQ(count_lines_starting(err, "pos: checkpoint failed: "), 1u) << mode << "\n" << err;
    EXPECT_NE(err.find("error: cudaStreamSynchronize"), std::string::npos) << mode << "\n" << err;
  }
}

}  // namespace
