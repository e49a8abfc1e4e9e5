// image_rebase.h — an incremental POS image made whole without copying device bytes, so that the
// images it builds on can be deleted (continuous checkpointing's retention, docs/continuous_checkpointing.md).
#pragma once

#include <cstdint>
#include <string>

#include "pos/base/status.h"

namespace pos::ckpt {

struct WholeImageReport {
  uint64_t blob_bytes = 0;            // device bytes the whole image stores (its own and its ancestors')
  uint64_t blobs_from_ancestors = 0;  // records whose bytes were in the images it built on
  uint64_t bytes_from_ancestors = 0;
  uint32_t files_linked = 0;          // ancestors' memory files hard-linked in
  uint64_t bytes_copied = 0;          // copied instead (the memory files would have exceeded the format's 64)
};

// Writes into `out_dir` (made 0700; it must not exist) the image at `dir` with no parent: the same
// state, cut and image id, every record that referred to a parent now pointing at the bytes where
// the chain stored them. Those bytes are not copied: the ancestors' memory files that hold them are
// hard-linked in after the image's own (the same file system: images of one directory), and so is
// the image's own memory. Only where the files would exceed kMaxMemoryFiles are the ancestors'
// bytes copied into one new file, chunk by chunk, each chunk's checksum verified on the way. The
// records are fsynced, then `out_dir`; the result is opened and validated before this returns.
// On failure `out_dir` is removed. `dir` and its chain are only read.
StatusOr<WholeImageReport> write_whole_image(const std::string& dir, const std::string& out_dir);

// Frees the bytes of `dir`'s memory files that none of its records refers to (an ancestor's file
// linked in by write_whole_image holds blobs later images replaced): a hole is punched over each
// such 4096-aligned stretch, in files that no other directory entry links (one link: the
// ancestors are deleted), so no other image can lose bytes. A file system without hole punching
// frees nothing and is no error. Holes are punched `piece` bytes at a time (0: each at once) with
// `pause_us` between pieces. Returns the bytes freed (the file system's blocks: ranges that were
// holes already free nothing).
StatusOr<uint64_t> punch_unreferenced(const std::string& dir, uint64_t piece = 64ull << 20, uint32_t pause_us = 1000);

}  // namespace pos::ckpt
