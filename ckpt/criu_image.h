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

// One pagemap file (pagemap-ID.img): the pages file it names (pages-<pages_id>.img) and its runs of
// pages in address order. A run's flags: kCriuPagePresent (its pages lie in the pages file, in
// order), kCriuPageParent (in the parent image, through DIR/parent), kCriuPageLazy.
inline constexpr uint32_t kCriuPageParent = 1, kCriuPageLazy = 2, kCriuPagePresent = 4;
struct CriuPagemap {
  struct Run {
    uint64_t vaddr = 0;
    uint64_t pages = 0;
    uint32_t flags = 0;
  };
  uint64_t pages_id = 0;
  std::vector<Run> runs;
  uint64_t present_pages() const;
};
// Checked as input: the magic, every record, page-aligned runs in increasing address order that do
// not overlap (what CRIU's reader assumes).
StatusOr<CriuPagemap> read_criu_pagemap(const std::string& path);
// Written whole to `path` (created or truncated) and fsynced.
Status write_criu_pagemap(const std::string& path, const CriuPagemap& pagemap);
uint64_t criu_page_size();

// Reads DIR's pstree.img, core-PID.img and pagemap-*.img, and checks that every pages-N.img holds
// exactly the pages its pagemaps say it holds. A malformed or inconsistent file is kCorrupt, naming
// the file and what is wrong.
StatusOr<CriuImageSummary> read_criu_image(const std::string& dir);

}  // namespace pos::ckpt
