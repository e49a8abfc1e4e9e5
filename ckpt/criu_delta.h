// criu_delta.h — CRIU page images made incremental by comparing contents, for kernels without
// dirty-page tracking: continuous checkpoints' and migrations' CPU parts (docs/dump_restore.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "pos/base/status.h"

namespace pos::ckpt {

struct CriuDeltaReport {
  uint64_t pages = 0;            // pages the image stored
  uint64_t pages_to_parent = 0;  // of them, equal to the parent's at the same address: left to it
  uint32_t files = 0;            // pagemaps rewritten
  double seconds = 0;
};

// Makes the whole CRIU dump in `dir` incremental against the CRIU page image at `parent_dir` (a
// dump, or write_process_pages's image), in CRIU's own format: every page whose bytes equal what
// the parent's chain holds at the same address, in the pagemap of the same name, becomes a
// PE_PARENT run, and `dir/parent` links to `parent_dir` (relatively, so that the pair can be moved
// or sent together). Pages are compared byte for byte, never by a hash: `criu restore` reads back
// exactly what CRIU dumped. Nothing changes where no page is equal, or where `dir` has a parent or
// parent runs already (CRIU tracked the memory itself). Not atomic against a crash: for an image
// not yet published (a dump's directory before its manifest). `threads` 0: by the cores.
StatusOr<CriuDeltaReport> make_criu_image_incremental(const std::string& dir, const std::string& parent_dir,
                                                      unsigned threads = 0);

struct CriuWholeReport {
  uint64_t pages = 0;               // pages the whole image stores
  uint64_t pages_from_parents = 0;  // of them, copied from the images it built on
  uint32_t files = 0;               // pagemaps rewritten (the rest of the files are hard-linked)
};

// Writes into `out_dir` (made 0700; it must not exist) the CRIU image at `dir` without its
// `parent` link: each pagemap with PE_PARENT runs rewritten with the pages its parent chain holds
// there (copied into a new pages file of the same id, each page with the flags of the run that held
// it), every other file hard-linked (the same file system). A parent page that no image of the
// chain holds is kCorrupt; an entry that is neither a regular file nor the `parent` link is
// refused. Files fsynced, then `out_dir`; on failure `out_dir` is removed. `dir` is only read.
StatusOr<CriuWholeReport> write_whole_criu_image(const std::string& dir, const std::string& out_dir);

struct ProcessPagesReport {
  uint64_t pages = 0;          // pages written
  uint64_t pages_skipped = 0;  // present but unreadable (they are left out)
  uint32_t mappings = 0;       // mappings read
  double seconds = 0;
};

// The memory of the live process `pid` as a CRIU page image in `dir` (made, 0700; it must not
// exist): pagemap-PID.img and pages-1.img only, no process tree, so not restorable. The present
// anonymous pages of its private mappings are read with process_vm_readv while it runs; a page
// being written meanwhile may be read torn, which is harmless: it is a parent to compare with
// (make_criu_image_incremental), and a torn page is simply unequal. CPU pre-copy without the
// kernel's dirty tracking. Needs the right to read the process's memory (its owner, or root).
StatusOr<ProcessPagesReport> write_process_pages(pid_t pid, const std::string& dir);

}  // namespace pos::ckpt
