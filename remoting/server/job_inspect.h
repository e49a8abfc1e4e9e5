// job_inspect.h — `pos-cli inspect DIR` of a job image (pos-cli dump / pre-dump): the manifest, the
// GPU part (handles, bytes, checksums verified) and the CPU part (CRIU's process tree, page counts).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/region_table.h"
#include "pos/base/status.h"

namespace pos {

struct JobInspectOptions {
  bool json = false;
  bool summary = false;  // the GPU part's handles as counts per type
  bool verify = true;    // read every GPU blob and check its checksums
  std::function<void(uint64_t done, uint64_t total)> progress;  // verification, in bytes
};

struct JobManifest;
// An in-process job's GPU part (a driver memory image): its region table, checked, and tied to the
// manifest (allocations and bytes) and to memory.bin's size. Restore and inspect check it first.
StatusOr<ckpt::RegionTable> open_driver_gpu_part(const std::string& gpu_dir, const JobManifest& m);
// The GPU parts an incremental driver image inherits from: its previous image's, that one's
// previous image's, ... (nearest first), each manifest checked to be of the same job (pid, uid) and
// of an in-process kind, at most 64 deep and without a loop. Empty for an image without `prev`.
StatusOr<std::vector<std::string>> driver_image_parents(const std::string& dir, const JobManifest& m);
// Every chunk of its memory.bin read and checked against its checksum.
Status verify_driver_gpu_part(const std::string& gpu_dir, const ckpt::RegionTable& t,
                              const std::function<void(uint64_t, uint64_t)>& progress);

// True if DIR holds a job image's manifest (else it may be a bare GPU image).
bool is_job_image(const std::string& dir);

// The report, text or one JSON object. Each part is checked against the manifest (the GPU part's
// image id and cut, CRIU's root pid): a mismatch, a bad checksum or a malformed CRIU file is an
// error naming it.
StatusOr<std::string> describe_job_image(const std::string& dir, const JobInspectOptions& options);

}  // namespace pos
