// inproc_backend.h — what libpos_inproc's RuntimeBackend (inproc_backend.cc) reads from POS_CHECKPOINT:
// checkpoints, and restores, of this process's client after chosen synchronizing calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pos/base/status.h"
#include "pos/checkpoint/checkpoint.h"

namespace pos {

// What POS_CHECKPOINT asks for (docs/inprocess_checkpoint.md): checkpoints of this process's client
// after chosen synchronizing calls, each optionally followed by a restore from the image just written.
struct CheckpointPlan {
  std::vector<uint64_t> at;  // 1-based counts of successful stream/device synchronizations, increasing
  CheckpointMode mode = CheckpointMode::kSync;
  std::string dir;           // image k goes to "<dir>-<k>"
  bool incremental = false;  // image k > 1 names image k-1 as its parent
  bool restore = false;      // then=restore: drop the client's device state, restore it from the image
  bool lazy = false;         // lazy=1 (then=restore only): buffers load on first use and in the background
};
// Strict: unknown or repeated keys, empty items, missing `at` / `dir` and bad values are errors
// whose message names POS_CHECKPOINT.
StatusOr<CheckpointPlan> parse_checkpoint_plan(std::string_view spec);

}  // namespace pos
