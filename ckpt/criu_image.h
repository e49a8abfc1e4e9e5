// criu_image.h — a read-only look at a CRIU image directory: its process tree and its page counts,
// for `pos-cli inspect` of a job image. Every file is bounded and every record checked (input).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos::ckpt {

struct CriuProcess {
  uint32_t pid = 0, ppid = 0, pgid = 0, sid = 0;
  uint32_t threads = 0;
  std::string comm;  // its name (core-PID.img), printable; empty if that file has none
};

struct CriuImageSummary {
  std::vector<CriuProcess> processes;  // pstree.img order: the root first
  uint64_t pagemaps = 0;               // pagemap files (one per process, one per shared memory object)
  uint64_t pages_stored = 0;           // pages whose contents this image holds
  uint64_t pages_in_parent = 0;        // pages an incremental image leaves to its parent
  uint64_t pages_lazy = 0;             // pages marked for lazy restore
  uint64_t bytes = 0;                  // all of the directory's files
  bool has_parent = false;             // a `parent` link (an incremental dump)
  bool pre_dump = false;               // a pre-dump: pages only, no pstree.img
};

// Reads DIR's pstree.img, core-PID.img and pagemap-*.img, and checks that every pages-N.img holds
// exactly the pages its pagemaps say it holds. A malformed or inconsistent file is kCorrupt, naming
// the file and what is wrong.
StatusOr<CriuImageSummary> read_criu_image(const std::string& dir);

}  // namespace pos::ckpt
