// job_manifest.h — DIR/manifest of a `pos-cli dump` image: what ties its GPU part, its CRIU part and
// the cut together (docs/wire_format.md "Job image manifest"); written by dump, checked by restore.
#pragma once

#include <cstdint>
#include <string>

#include "pos/base/status.h"

namespace pos {

struct JobManifest {
  static constexpr uint32_t kFormat = 2;
  uint32_t format = kFormat;
  uint32_t pid = 0, uid = 0;  // the job's root process and its user
  std::string job;            // its session's name (printable)
  std::string socket;         // the posd it was dumped from
  std::string permit;         // where its shim looks for the permit to re-attach (absolute)
  uint64_t arena_bytes = 0;   // its session arena
  bool leave_running = false, shell_job = false;
  uint64_t cut = 0, gpu_bytes = 0, handles = 0;  // the GPU part's cut and size
  std::string gpu_image_id;                      // the GPU part's inventory image_id
  std::string gpu = "gpu", criu = "criu";        // the parts' directories, relative to DIR
};

// One JSON object, one line. Strings must be printable() already (paths with control characters
// are refused by the dump before it starts).
std::string manifest_json(const JobManifest& m);

// The manifest's text, checked: a JSON object of known keys with values of their types, the
// format this build reads, a pid, an arena and relative part names without "..". Anything else is
// kCorrupt, naming what is wrong.
StatusOr<JobManifest> parse_manifest(const std::string& text);

}  // namespace pos
