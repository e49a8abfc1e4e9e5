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

// `pos-cli images DIR`: the job images directly under DIR (one per subdirectory, such as a series
// of dumps), each with what its manifest says and whether it is complete (a manifest: a dump writes
// it last), restorable (a dump, not a pre-dump) and whole (its previous images there), newest first.
struct ImageEntry {
  std::string name;      // the subdirectory
  bool complete = false;  // it has a valid manifest
  std::string error;     // why it is not complete or not whole, or empty
  bool restorable = false;  // complete, a dump (not a pre-dump), and its chain whole
  int64_t time = 0;      // the manifest's modification time (seconds since the epoch)
  std::string kind, job, prev;
  uint32_t pid = 0;
  uint64_t cut = 0, gpu_bytes = 0, gpu_bytes_referenced = 0;
};
StatusOr<std::vector<ImageEntry>> list_images(const std::string& dir);
// The listing as text (a table) or one JSON object.
std::string describe_images(const std::string& dir, const std::vector<ImageEntry>& images, bool json);
// The newest restorable image under DIR (its path), for `pos-cli restore -D DIR --latest`.
StatusOr<std::string> latest_image(const std::string& dir);

// True if DIR holds a job image's manifest (else it may be a bare GPU image).
bool is_job_image(const std::string& dir);

// The report, text or one JSON object. Each part is checked against the manifest (the GPU part's
// image id and cut, CRIU's root pid): a mismatch, a bad checksum or a malformed CRIU file is an
// error naming it.
StatusOr<std::string> describe_job_image(const std::string& dir, const JobInspectOptions& options);

}  // namespace pos
