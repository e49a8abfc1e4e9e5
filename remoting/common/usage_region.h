// usage_region.h — the shared region where the jobs of one user on this machine say what they hold
// of the GPUs and under which limits (issue #24): one accounting that every job, pos-cli and later
// the GPU-time scheduler read, and that forgets a process the moment it is gone (kill -9 included).
//
// A small file (JOBS_DIR/usage, 0600, the user's own) mapped shared by every process: a header,
// 256 fixed slots, and per GPU the turn of the GPU-time scheduler (whose job may launch now, until
// when) with a ring of its last turns; a robust process-shared mutex for joins, leaves and hand-offs
// of a turn, lock-free stores for the rest.
// Format: docs/limits.md ("The usage region"). Base layer only, so the preloaded driver layer can
// carry it. Every field read from the file is checked: a foreign or malformed file is an error the
// caller reports, never a crash, and the job runs on without it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos {

// The GPU-time scheduler's clock settings (UsageRegion::pass).
struct ShareTiming {
  uint64_t period_ns = 50'000'000;  // a round: each contending job's turn is its share of it
  uint64_t idle_ns = 2'000'000;     // a holder that launched nothing this long (and waits on no
                                    // call) gives its turn to a waiting job: work-conserving
  uint64_t min_turn_ns = 2'000'000;
};

class UsageRegion {
 public:
  static constexpr uint64_t kMagic = 0x4547415355534f50ull;  // "POSUSAGE" little-endian
  static constexpr uint32_t kVersion = 2;
  static constexpr uint32_t kSlots = 256;
  static constexpr uint32_t kDevices = 16;   // GPUs 0..15 of a machine have a turn (others: no shares)
  static constexpr uint32_t kTurnRing = 32;  // last turns kept per GPU, for the recent shares in ps
  static constexpr uint32_t kMaxShare = 1000;  // shares are in per mille of a GPU's time

  // What one process holds, as it says it.
  struct Entry {
    uint32_t pid = 0;
    int32_t device = -1;          // the CUDA device it uses (-1: none yet)
    uint64_t start_time = 0;      // /proc/PID/stat's: tells it from a later process under its pid
    uint64_t memory_limit = 0;    // 0: none
    uint64_t memory_used = 0;
    uint32_t share = 0;           // its GPU-time share, per mille (0: none)
    uint64_t gpu_ns = 0;          // time it held its GPU's turn while jobs contended for it
    int32_t recent_share = -1;    // per mille of its GPU's turns in the last few seconds (-1: no contention)
  };

  // The GPU-time scheduler's answer to a job about to launch work (ShareGate drives it).
  enum class Pass {
    kGo,     // its turn (or nobody contends): launch
    kWait,   // another job's turn: ask again shortly
    kYield,  // its turn is over and others wait: finish its queued work, then yield()
  };
  using Timing = ShareTiming;

  // kOwn: a user's own region (JOBS_DIR/usage), made (0600) when there is none; a file of another
  // user is refused. kKept: a region posd keeps for several users (posd.usage_region, a job's
  // POS_USAGE_REGION): never made by the caller; it may belong to another user only if it is
  // shared with a group of the caller's (group read and write) and with nobody else (no access for
  // others). Either way refused: a symbolic link, another size, a header not this format's (each
  // named in the error); the file is left as it is.
  enum class Access { kOwn, kKept };
  static StatusOr<std::unique_ptr<UsageRegion>> open(const std::string& path, Access access = Access::kOwn);
  // posd, the keeper: its own region at `path` (made when missing) shared with group `gid`
  // (0660), or with nobody but its user when gid is -1 (0600).
  static Status keep(const std::string& path, long gid);
  ~UsageRegion();
  UsageRegion(const UsageRegion&) = delete;
  UsageRegion& operator=(const UsageRegion&) = delete;

  // A slot for `e` (its pid and start time must be set), claimed under the lock after the slots of
  // processes that are gone are freed. kBusy when all slots hold live processes.
  StatusOr<int> join(const Entry& e);
  // Whether `slot` still names `pid` started at `start_time` (another process may have freed it,
  // seeing that pid gone: a job restored by CRIU comes back with a new start time).
  bool holds(int slot, uint32_t pid, uint64_t start_time) const;
  // Lock-free updates of the caller's own slot.
  void set_used(int slot, uint64_t bytes);
  void set_limit(int slot, uint64_t bytes);
  void set_device(int slot, int32_t device);
  // The slot's GPU-time share (per mille; 0: none). Refused, with nothing changed, when it is over
  // kMaxShare or the shares of the live jobs on the slot's GPU would add up past it.
  Status set_share(int slot, uint32_t per_mille);
  // The slot freed (the process ends); a turn it held goes to the next waiting job.
  void leave(int slot);

  // The GPU-time scheduler (docs/limits.md, "GPU-time shares"). Turns are only taken on a GPU that
  // is contended: two or more live jobs on it, one of them with a share. A job in its turn launches
  // freely until the turn's end; then, if others wait, it yields (after its queued work is done);
  // the next turn goes to the waiting job that has had the least time for its share (stride
  // scheduling on time actually held). `now` is CLOCK_MONOTONIC in ns (steady_now_ns).
  bool contended(int device) const;
  Pass pass(int slot, int device, uint64_t now, const Timing& t = Timing());
  void yield(int slot, int device, uint64_t now, const Timing& t = Timing());
  // The holder's queued work is being finished (no one takes its turn as idle meanwhile).
  void begin_drain(int slot, int device);
  // A call of the slot's job that keeps its GPU busy began (+1) or ended (-1): launches and waits
  // on its own work; a holder inside one is not idle.
  void busy(int slot, int delta, uint64_t now);
  // The slot stops waiting for a turn (its job no longer launches on that GPU, say).
  void stop_waiting(int slot);
  // Who holds the turn of `device` (-1: nobody).
  int holder(int device) const;

  // Every live process's entry, by slot; the slots of processes that are gone are freed first.
  std::vector<Entry> list();
  // Frees the slots of processes that are gone; how many.
  size_t reap();

  const std::string& path() const { return path_; }

 private:
  struct Mapped;
  UsageRegion(std::string path, Mapped* m) : path_(std::move(path)), m_(m) {}
  bool lock();  // false when the mutex cannot be taken (then nothing is written)
  void unlock();
  size_t reap_locked();
  void hand_off_locked(int device, uint64_t now, const Timing& t);
  void account_locked(int slot, int device, uint64_t until);
  uint64_t turn_locked(int slot, int device, const Timing& t) const;
  uint32_t effective_share_locked(int slot, int device) const;

  std::string path_;
  Mapped* m_;
};

// JOBS_DIR/usage: where the jobs of `jobs_dir` keep their region.
std::string usage_region_path(const std::string& jobs_dir);
// The region posd keeps for several users, as a job's environment names it (POS_USAGE_REGION, an
// absolute path; docs/limits.md), or "" for none: the job then uses its user's own.
std::string kept_usage_region();
// Which region a process uses: `kept` (posd's, opened kKept) when set, else its user's own in
// `jobs_dir` (kOwn).
struct UsageRegionChoice {
  std::string path;
  UsageRegion::Access access;
};
UsageRegionChoice choose_usage_region(const std::string& jobs_dir, const std::string& kept);

// CLOCK_MONOTONIC in ns: one clock for every process of the machine (turn ends are compared across them).
uint64_t steady_now_ns();

}  // namespace pos
