// job_manifest.h — DIR/manifest of a `pos-cli dump` image: what ties its GPU part, its CRIU part and
// the cut together (docs/wire_format.md "Job image manifest"); written by dump, checked by restore.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "pos/base/status.h"

namespace pos {

struct JobManifest {
  static constexpr uint32_t kFormat = 3;
  uint32_t format = kFormat;
  // "dump" (restorable) or "pre-dump" (pos-cli pre-dump: only a parent for a later dump --prev; it
  // has no permit, arena or token, and its CRIU part is absent where the kernel tracks no dirty
  // memory), or "driver-dump" (an in-process job's, pos run: its GPU part is a driver memory image,
  // `socket` its control socket; no permit, arena, token or previous image).
  std::string kind = "dump";
  std::string prev;  // the previous image (dump --prev), relative to DIR; empty: none
  uint32_t pid = 0, uid = 0;  // the job's root process and its user
  std::string job;            // its session's name (printable)
  std::string socket;         // the posd it was dumped from
  std::string permit;         // where its shim looks for the permit to re-attach (absolute)
  uint64_t arena_bytes = 0;   // its session arena
  bool leave_running = false, shell_job = false;
  uint64_t cut = 0, gpu_bytes = 0, handles = 0;  // the GPU part's cut and size
  uint64_t gpu_bytes_referenced = 0;             // device bytes left in the previous images
  std::string gpu_image_id;                      // the GPU part's inventory image_id
  bool criu_track_mem = false;  // CRIU tracked dirty memory: a later dump --prev saves only what changed
  bool criu_parent = false;     // the CRIU part holds only pages changed since prev's
  std::string gpu = "gpu", criu = "criu";        // the parts' directories, relative to DIR
  // An in-process job's GPUs, by UUID as nvidia-smi spells them, comma-separated: those it used
  // (gpu_uuids), every one its driver saw, in its CUDA ordinal order (gpus_visible: what NVIDIA's
  // restore onto other GPUs must name), and the model of the one it used (gpu_name). Optional keys:
  // empty means unknown (an image of an older pos-cli, or a posd job's), and then a restore onto
  // another GPU is refused.
  std::string gpu_uuids, gpus_visible, gpu_name;
};

// One JSON object, one line. Strings must be printable() already (paths with control characters
// are refused by the dump before it starts).
std::string manifest_json(const JobManifest& m);

// The manifest's text, checked: a JSON object of known keys with values of their types, the
// format this build reads, a pid, an arena (a dump's) and relative part names without "..". Anything else is
// kCorrupt, naming what is wrong.
StatusOr<JobManifest> parse_manifest(const std::string& text);

// One value of a flat JSON object as the manifest's strict reader takes it: a string (UTF-8, no
// escaped characters but quote, backslash and slash), an unsigned number below 10^19, or a boolean.
struct FlatJsonValue {
  enum Kind { kString, kNumber, kBool } kind = kString;
  std::string s;
  uint64_t n = 0;
  bool b = false;
};
// `text` as one flat JSON object into `out`; anything else (nesting, negative or fractional
// numbers, a key twice, bytes after it) is kCorrupt, naming `what` and the byte.
[[nodiscard]] Status parse_flat_json(const std::string& text, const char* what, std::map<std::string, FlatJsonValue>* out);

// A small file of an image, at most `max` bytes (more is kCorrupt): images are input like any other.
StatusOr<std::string> read_small_file(const std::string& path, size_t max);
// A small file written whole or not at all: a temporary name beside it, fsync, rename, fsync of
// the directory (a crash never leaves half of it, nor loses it once this returned). Manifests,
// tokens, the status of a checkpoint policy.
[[nodiscard]] Status write_small_file(const std::string& path, const std::string& text, mode_t mode);
// DIR/manifest, read and parsed; errors name DIR.
StatusOr<JobManifest> read_manifest(const std::string& dir);

// The CPU parts that image `dir` (manifest `m`) reads through CRIU's `parent` links: CRIU's restore
// reads pages from them into the job, and a dump compares the job's pages with them, so each must
// be the CPU part of an image of this same job. Checked: DIR/<m.criu> is a directory inside DIR
// (not a link elsewhere), and every `parent` link from it leads (by its real path) to the CPU part
// named by a manifest with the job's pid and uid, at most 64 deep. A link into another user's
// image is refused (it would hand that image's memory to this job), naming it.
[[nodiscard]] Status check_criu_parents(const std::string& dir, const JobManifest& m);

}  // namespace pos
