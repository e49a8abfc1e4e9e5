// job_restore.h — `pos-cli restore`: a job saved by `pos-cli dump` brought back whole — its GPU state
// rebuilt by posd at the same addresses, its process tree by CRIU, re-attached (docs/dump_restore.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "pos/base/status.h"

namespace pos {

struct JobRestoreOptions {
  std::string dir;     // the image (pos-cli dump's -D)
  std::string socket;  // the posd to restore into (any posd of this host: the one dumped from or another)
  bool lazy = false;   // the job runs on while its device bytes load (each buffer before first use)
  // An in-process job's image (kind "driver-dump"): restore it onto CUDA device `device` of this
  // host (this process's ordinal; pos-cli clears CUDA_VISIBLE_DEVICES, so every GPU counts), a GPU
  // of the model the job ran on, instead of the GPU it was dumped from. -1: that GPU. Refused for a
  // posd job's image (its GPU is the target posd's) and for an image that does not record its GPUs.
  int device = -1;
  // Called once CRIU restored the tree and before the job may re-attach (it waits for its permit,
  // running no CUDA call): false ends the tree and fails the restore. A migration target holds the
  // job here until its source commits (docs/migration.md).
  std::function<bool(uint32_t pid)> hold;
  // Phase names: "check", "gpu", "criu", "reattach".
  std::function<void(const char* phase)> progress;
};

struct JobRestoreReport {
  uint32_t pid = 0;
  uint64_t gpu_bytes = 0, handles = 0;
  // An in-process job's: reattach_s is NVIDIA's driver restore + unlock, gpu_s the hand-over (or
  // reload) of its device memory after that; load_s pos-cli's load of it, alongside CRIU.
  double check_s = 0, gpu_s = 0, criu_s = 0, reattach_s = 0, total_s = 0, load_s = 0;
  std::string note;  // what the restore did otherwise than asked, or empty
  bool handoff = false;  // an in-process job's memory was loaded by pos-cli and handed over (else it loaded it)
  // An in-process job's --lazy: the memory went to the job before it was loaded (its GPU work
  // waited on the device for the load), and when the job ran again (resumed_s; total_s is when
  // the load ended). Without --lazy, or when the load could not be lazy, resumed_s = total_s.
  bool lazy = false;
  double resumed_s = 0;
  // An in-process job's GPU: this process's ordinal and the UUID of the GPU its memory was put on
  // (-1 and empty when the image does not record it), and whether NVIDIA's restore moved the job
  // there from the GPU it was dumped on.
  int device = -1;
  std::string device_uuid;
  bool moved = false;
};

// Checks the whole image first (manifest, token, the GPU part's structure and its tie to the
// manifest, CRIU's images, the job's pid free, CRIU usable) and changes nothing if any check fails.
// Then posd rebuilds the GPU state in a new session, CRIU restores the process tree, and the job
// re-attaches to that session with the image's token and runs on from its cut. A failure after
// CRIU restored the tree ends the restored tree (the image stays as it was: restore it again).
StatusOr<JobRestoreReport> restore_job(const JobRestoreOptions& options);

}  // namespace pos
