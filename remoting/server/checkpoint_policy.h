// checkpoint_policy.h — continuous checkpointing (`pos-cli checkpoint`): a job checkpointed every
// interval into a directory of restore points, incremental between whole ones, the oldest retired
// without breaking a kept chain, and a status file that `pos-cli ps` and posd's metrics read
// (docs/continuous_checkpointing.md). The tick itself is job_dump's dump or pre-dump.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/status.h"
#include "remoting/common/process_info.h"
#include "remoting/common/unique_fd.h"

namespace pos {

struct CheckpointPolicy {
  uint32_t pid = 0;     // the job
  std::string dir;      // its restore points: DIR/cp-NNNNNN
  double every_s = 30;  // the interval; ticks that fall due while one runs are coalesced into one
  uint32_t keep = 3;    // the newest restore points kept (with the older ones their chains need)
  // Every K-th restore point is whole (no previous image); the others store only what changed
  // since the one before. 1: every one is whole.
  uint32_t full_every = 10;
  // Each restore point a whole process (CRIU with the GPU state: pos-cli dump --leave-running);
  // else GPU state only (pos-cli pre-dump: cheaper, but no restore point by itself).
  bool with_cpu = false;
  // With with_cpu, a posd job's GPU bytes drain copy-on-write while it runs on (else they are
  // written before it re-attaches). GPU-only checkpoints are always copy-on-write.
  bool async = true;
  // For the dumps: posd's socket, an in-process job's control socket (empty: a posd job), and the
  // pos-cli a dump's guardian runs if this process dies mid-dump.
  std::string socket, job_socket, resume_program;
};

// What one tick's checkpoint did.
struct TickOutcome {
  uint64_t bytes = 0;             // written: GPU bytes stored and CRIU's images
  uint64_t bytes_referenced = 0;  // GPU bytes left to the previous restore points
  double pause_s = 0;             // the job's calls held
  double gpu_s = 0, criu_s = 0;   // the two parts (they overlap)
  std::string note;               // what the dump said besides (CRIU's part whole, ...)
};
// A checkpoint of the job into `dir` (made by the tick; removed by the runner if the tick fails),
// storing only what changed since the restore point `prev_dir` unless that is empty.
using CheckpointTick = std::function<StatusOr<TickOutcome>(const std::string& dir, const std::string& prev_dir)>;

// The real tick: pos-cli dump --leave-running --mode async (with_cpu) or pos-cli pre-dump, of a
// posd job or an in-process one (policy.job_socket), with --prev.
CheckpointTick job_checkpoint_tick(const CheckpointPolicy& policy);

// The status of a policy, one flat JSON object in JOBS_DIR/checkpoints/<pid>.json (times in
// seconds since the epoch, durations in microseconds), rewritten whole after every tick.
struct PolicyStatus {
  uint32_t pid = 0, checkpointer = 0, uid = 0;
  std::string dir;
  uint64_t every_us = 0, keep = 0, full_every = 0;
  bool with_cpu = false;
  std::string state;  // "running", "stopped" (pos-cli checkpoint --stop), "ended" (the job is gone)
  uint64_t started = 0, updated = 0;
  uint64_t taken = 0, failed = 0, coalesced = 0, bytes_total = 0, retired = 0;
  uint64_t rebased = 0;  // points made whole so that retention could delete what they built on
  // The last tick that succeeded.
  uint64_t last_time = 0, last_duration_us = 0, last_pause_us = 0, last_gpu_us = 0, last_criu_us = 0, last_bytes = 0,
           last_bytes_referenced = 0;
  std::string newest;        // the newest restore point's name (empty: none yet)
  uint64_t newest_time = 0;  // when it became complete
  uint64_t points = 0;       // restore points in DIR now
  std::string last_error;    // the last tick that failed, and when
  uint64_t last_error_time = 0;
};
std::string policy_status_dir(const std::string& jobs_dir);
std::string policy_status_path(const std::string& jobs_dir, uint32_t pid);
std::string policy_status_json(const PolicyStatus& s);
StatusOr<PolicyStatus> parse_policy_status(const std::string& text);
StatusOr<PolicyStatus> read_policy_status(const std::string& path);
// Every status file under JOBS_DIR/checkpoints (unreadable ones named in *skipped), by pid.
std::vector<PolicyStatus> list_policy_statuses(const std::string& jobs_dir, std::vector<std::string>* skipped = nullptr);
// A check that process `pid`, as it is now, still runs: the same pid started later (reused, or the
// job restored from a dump by CRIU) is another process, whose policy starts anew.
std::function<bool()> same_process(uint32_t pid);
// Whether the status's checkpointer still runs (its process exists and is not a zombie).
bool checkpointer_alive(const PolicyStatus& s);

// A restore point in DIR as retention sees it.
struct RestorePoint {
  uint64_t seq = 0;       // cp-<seq>
  std::string name;
  std::string parent;     // the name of the point it builds on (empty: whole)
  uint32_t pid = 0;       // the job it is of
  bool restorable = false;
};
// The complete restore points under DIR (cp-N with a manifest), oldest first.
std::vector<RestorePoint> list_restore_points(const std::string& dir);
// Retention: the points to delete so that the newest `keep` stay, each with every point its chain
// builds on (a kept point never loses a parent).
std::vector<std::string> points_to_retire(const std::vector<RestorePoint>& points, uint32_t keep);
// Retired points' files, freed a piece at a time by whichever threads take part: each regular
// file that nothing else links is shrunk 64 MiB at a time with a 1 ms pause between (freeing
// gigabytes of a tmpfs in one call holds the kernel's allocator locks that long); a file another
// entry links (a point made whole) keeps its bytes. Threads take whole files: a tmpfs frees one
// file's pages under that file's lock.
struct FreeList {
  std::vector<std::string> files;
  std::atomic<size_t> next{0};
};
// The regular files under `paths`.
std::unique_ptr<FreeList> list_files_to_free(const std::vector<std::string>& paths);
// Frees files of the list until none is left unclaimed; any number of threads may call it at once.
void take_part_in_freeing(FreeList& list);
// How many threads retention frees with once a tick waits for it: a quarter of the cores, 2 to 4.
unsigned freeing_threads();

// What making a restore point whole did (make_point_whole).
struct WholePointReport {
  bool changed = false;              // false: it was whole already
  uint64_t gpu_bytes = 0;            // device bytes the point now stores
  uint64_t gpu_bytes_from_parents = 0;
  uint32_t gpu_files_linked = 0;     // the parents' memory files hard-linked in (nothing copied)
  uint64_t gpu_bytes_copied = 0;     // copied instead (too many files to link)
  uint64_t cpu_pages_from_parents = 0;  // CRIU's pages copied from its parents' CPU parts
  std::string gpu_dir;               // the point's GPU part (for punch_unreferenced once they are gone)
  double seconds = 0;
};
// Rebasing onto nothing: restore point DIR/name made whole, so that the points it builds on can be
// deleted. The new point is built beside it (DIR/.tmp-NAME.whole: its files hard-linked, its GPU
// part's records pointing at the bytes its chain stored, its CPU part's parent pages copied, its
// manifest without `prev`) and exchanged with it in one step (renameat2 RENAME_EXCHANGE), then DIR
// is fsynced and the old one deleted: the point is complete under its name at every moment, and a
// runner killed meanwhile leaves a .tmp- directory the next one removes. Points of a posd job only
// (an in-process job's GPU part is a driver memory image: kUnsupported, and its chain is kept).
StatusOr<WholePointReport> make_point_whole(const std::string& dir, const std::string& name);

// The policy's loop in this process: it owns DIR (a lock file: one policy per directory) and the
// status file (one policy per job).
class CheckpointRunner {
 public:
  // Makes DIR (0700) if missing, takes its lock, removes what an earlier runner left unfinished
  // (.tmp-* and .del-*), continues the newest point's chain if it is of this job, and writes the
  // status file ("running"). Refuses a directory or a job another live runner has.
  static StatusOr<std::unique_ptr<CheckpointRunner>> open(const CheckpointPolicy& policy, const std::string& status_path,
                                                          CheckpointTick tick);
  ~CheckpointRunner();
  CheckpointRunner(const CheckpointRunner&) = delete;
  CheckpointRunner& operator=(const CheckpointRunner&) = delete;

  // One tick now: a checkpoint into DIR/.tmp-cp-N, renamed to DIR/cp-N once complete (the rename
  // and DIR fsynced), then retention; the status file rewritten either way. A failed tick leaves
  // every earlier restore point as it was. Retention retires points at once (renamed .del-cp-N)
  // but frees their bytes on a thread that goes on after tick() returns, so that freeing
  // gigabytes never delays the next tick (whose point would then be older); the next retention,
  // finish_retention, run()'s end and the destructor wait for it.
  Status tick();
  // Waits until the bytes of the points retention retired are freed, adding helper threads
  // (freeing_threads() in all) if it is still freeing: one thread frees gently, more only while
  // something waits.
  void finish_retention();
  // Ticks every interval until `stop` is set or `alive()` says the job is gone (checked between
  // ticks and while waiting); a tick that runs past the interval is followed by one tick at the
  // next slot, the slots it skipped counted as coalesced. Writes the final state.
  void run(const std::atomic<bool>& stop, const std::function<bool()>& alive);

  const PolicyStatus& status() const { return status_; }
  // One line per tick on stdout when set (the checkpointer's log). Called from one thread at a
  // time (retention's freeing logs from its own).
  void set_log(std::function<void(const std::string&)> log) {
    log_ = [f = std::move(log), mu = std::make_shared<std::mutex>()](const std::string& l) {
      std::lock_guard<std::mutex> g(*mu);
      f(l);
    };
  }

 private:
  CheckpointRunner() = default;
  void write_status();
  Status retire();

  CheckpointPolicy policy_;
  std::string status_path_;
  CheckpointTick tick_;
  UniqueFd lock_;
  PolicyStatus status_;
  uint64_t next_seq_ = 1;
  std::string prev_;         // the newest point's name (the next one builds on it), or empty
  uint32_t since_full_ = 0;  // points since the last whole one
  uint32_t whole_ahead_ = 0; // points to take whole because the last incremental one saved little
  std::function<void(const std::string&)> log_;
  bool said_unsupported_ = false;  // that a point cannot be made whole (logged once)
  bool said_not_yet_ = false;      // that the job has no state to checkpoint yet (logged once)
  std::function<bool()> alive_;  // run()'s: a tick that fails because the job ended is no failure
  std::thread freeing_;          // the last retention's: frees the retired points' bytes
  std::shared_ptr<FreeList> freeing_list_;  // what it frees (helpers join in when a tick waits)
};

// "30s", "500ms", "2m", "1h", "1.5" (seconds): the interval in seconds, or why not (0.01 s to 1 day).
StatusOr<double> parse_interval(const std::string& text);

}  // namespace pos
