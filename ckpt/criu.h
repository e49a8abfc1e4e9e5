// criu.h — the CRIU driver: finds a CRIU >= 4 that passes `criu check`, dumps a process tree into a
// directory and restores it, with errors that name the cause. pos-cli dump/restore build on it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>

#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos::ckpt {

// The criu program to run: $POS_CRIU (a binary), else the one tools/install_criu.sh chose (the first
// line of $(dirname $POS_CRIU_PREFIX)/criu.path, default /opt/pos/criu.path), else `criu` on PATH.
// Not found, too old (< 4) or failing `criu check`: an error naming the fix (tools/setup.sh). A
// check that passed is kept per binary and boot, for root in /run/pos-criu-check ($POS_CRIU_CACHE;
// empty: nowhere), so later processes skip it (it can take tens of seconds on a loaded machine).
StatusOr<std::string> find_criu();

// Whether this kernel lets CRIU track dirty memory (`criu check --feature mem_dirty_track`: the
// soft-dirty bits), which pre-dump and incremental dumps need. Some kernels (VM kernels built
// without CONFIG_MEM_SOFT_DIRTY) have none; then every dump saves all of the tree's memory.
bool criu_tracks_memory(const std::string& criu);  // kept like find_criu's check

struct CriuDumpOptions {
  bool leave_running = false;  // the tree runs on after the dump (else CRIU ends it)
  bool shell_job = false;      // the tree shares the caller's session or terminal
  bool track_mem = false;      // record dirty-page tracking for a later incremental dump
  std::string prev_images_dir;  // incremental: relative to the dump's dir, as CRIU takes it
  bool pre_dump = false;        // `criu pre-dump` (the tree keeps running; memory only)
  std::vector<std::string> extra;  // more CRIU options, verbatim
  int verbosity = -1;              // CRIU's -v level for the log; -1: criu_verbosity()
  // About ten times a second while CRIU runs: bytes of images written so far, and what the tree's
  // memory suggests they will come to (tree_memory_bytes; never below `done`). Once more at the end
  // of a dump that succeeded.
  std::function<void(uint64_t done, uint64_t expected)> progress;
};

// The memory CRIU will save of the tree rooted at `pid`: each process's anonymous and shared-memory
// pages (from /proc/P/smaps_rollup; its resident set where that file is missing). An estimate, for
// progress; 0 if the process is gone.
uint64_t tree_memory_bytes(pid_t pid);
// Ends the process tree rooted at `pid` (SIGKILL to each process found under it) and returns once
// each is dead: what CRIU's dump does as its last step, for a tree it left stopped
// (--leave-stopped) until the image was whole.
void kill_tree(pid_t pid);
// The bytes of the regular files directly in `dir` (CRIU's images as they are written).
uint64_t dir_file_bytes(const std::string& dir);

// `criu dump -t PID -D DIR` (or pre-dump), logging to DIR/dump.log (pre-dump.log). DIR must exist.
// A failure returns CRIU's own error lines from the log.
Status criu_dump(const std::string& criu, pid_t pid, const std::string& dir, const CriuDumpOptions& options);

struct CriuRestoreOptions {
  bool shell_job = false;
  std::vector<std::string> extra;
  int verbosity = -1;  // as CriuDumpOptions::verbosity
};

// CRIU's log level for dumps and restores: $POS_CRIU_VERBOSITY (0-4), else 2 (errors and
// warnings). At 4 CRIU logs every mapping and page run: ~3000 lines for a small process, which cost
// a migration's stop 30-40 ms a dump on a 2-core machine. A failure's message carries CRIU's error
// lines at any level; set 4 to keep the whole story in DIR/dump.log and DIR/restore.log.
int criu_verbosity();

// `criu restore -D DIR --restore-detached`, logging to DIR/restore.log; returns the restored tree's
// root pid (the dumped one's). The tree's parent becomes this process if it is a child subreaper
// (prctl PR_SET_CHILD_SUBREAPER), else init. A pid still taken is named in the error.
StatusOr<pid_t> criu_restore(const std::string& criu, const std::string& dir, const CriuRestoreOptions& options);

// CRIU's error lines ("Error (...): ...") from a log, at most `max`, for messages.
std::string criu_errors(const std::string& log_path, size_t max = 4);

}  // namespace pos::ckpt
