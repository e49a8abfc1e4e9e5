// job_restore.h — `pos-cli restore`: a job saved by `pos-cli dump` brought back whole — its GPU state
// rebuilt by posd at the same addresses, its process tree by CRIU, re-attached (docs/dump_restore.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/driver_checkpoint.h"
#include "pos/base/status.h"
#include "remoting/server/job_manifest.h"

namespace pos {

struct JobRestoreReport;

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
  // job here until its source commits (docs/migration.md). An in-process job is held after NVIDIA's
  // driver restore, before its unlock (its CUDA calls wait for that). `so_far` holds the phases
  // timed until then (check_s, rest_check_s, criu_s), which the target reports to its source.
  std::function<bool(uint32_t pid, const JobRestoreReport& so_far)> hold;
  // A migration target's, for a posd job from another host (docs/migration.md, "Across hosts"):
  // the GPU part is restored before the rest of the image has arrived (its device memory loads
  // while the source still dumps the process), from DIR/gpu and `gpu_first`, a file of lines
  // "pid P", "uid U", "arena A", "token T" (the job's, as its manifest will say). Then `rest` is
  // called: it returns once the rest of the image is there (false: the restore ends, and the GPU
  // session with it). Then everything is checked as usual, and the manifest must name the same job.
  std::string gpu_first;
  std::function<bool()> rest;
  // With gpu_first (docs/migration.md, "Staged at the target"): before anything else, an earlier
  // image of the job (a pre-copy round, complete here) is restored into a staging session whose
  // device memory this process then holds; `staged` is told how that went (a failure is no error:
  // the restore goes on without it) and returns once gpu_first and DIR/gpu exist (false: the
  // restore ends). The GPU part's restore then copies every buffer unchanged since that image from
  // the staging session's memory instead of reading it, and the staging session ends.
  std::string stage;
  std::function<bool(bool staged, const std::string& note)> staged;
  // Phase names: "check", "gpu", "criu", "reattach".
  std::function<void(const char* phase)> progress;
};

struct JobRestoreReport {
  uint32_t pid = 0;
  uint64_t gpu_bytes = 0, handles = 0;
  // An in-process job's: reattach_s is NVIDIA's driver restore + unlock, gpu_s the hand-over (or
  // reload) of its device memory after that; load_s pos-cli's load of it, alongside CRIU.
  double check_s = 0, gpu_s = 0, criu_s = 0, reattach_s = 0, total_s = 0, load_s = 0;
  // With gpu_first: the checks from the rest of the image's arrival on (check_s counts from the
  // start, so it holds the wait for the rest too).
  double rest_check_s = 0;
  // With gpu_first: the GPU part was restored before the rest came (else, that restore having
  // failed, from the image's files after CRIU's restore).
  bool gpu_ahead = false;
  std::string note;  // what the restore did otherwise than asked, or empty
  // JobRestoreOptions::stage: the GPU part's bytes copied from the staging session's memory.
  bool staged = false;
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

// Where an in-process job's device memory is made on a restore (or a move, pos-cli migrate
// --device), and the remap NVIDIA's restore needs to put the job there (docs/driver_runtime.md,
// "Restore onto another GPU").
struct DevicePlan {
  int ordinal = 0;   // this process's CUDA ordinal of that GPU
  std::string uuid;  // its UUID; empty: the image does not record its GPUs (nothing can be checked)
  std::vector<std::string> expect;  // the job's gpus' "gpu_uuids" once the driver restored it
  std::vector<ckpt::DriverCheckpoint::GpuPair> pairs;  // empty: the job stays on its GPUs
  std::string note;  // for the report: what was done otherwise than the image says
};
// The plan for `o.device` (-1: the job's own GPU), checked against this host's GPUs (`driver`:
// the loaded libcuda) before anything changes; `m` holds the job's GPUs as its `gpus` answer named
// them (gpu_uuids, gpus_visible, gpu_name). `image_dev`: the job's ordinal of its memory, all an
// image without UUIDs has to go on.
StatusOr<DevicePlan> plan_device(const JobRestoreOptions& o, const JobManifest& m, void* driver, int image_dev);
// After NVIDIA's restore (before the job has its memory): the GPUs the job uses now are those the
// plan put its memory on. The job's driver answers for its own ordinals, which after a remap name
// the new GPUs (CUDA 13's restore keeps the ordinals and moves what they refer to); that is
// checked rather than assumed. An answer that cannot be had is an error only when the job moved.
Status check_job_gpus(const std::string& socket, const DevicePlan& p, std::string* note);

}  // namespace pos
