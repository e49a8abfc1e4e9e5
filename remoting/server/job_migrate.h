// job_migrate.h — `pos-cli migrate`: a job under posd moved to another posd of this host with
// pre-copy rounds while it runs, then one short stop (docs/migration.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos {

struct JobMigrateOptions {
  std::string socket;     // the posd the job runs under now
  std::string to;         // the posd it moves to: another socket of this host, or HOST:PORT of a
                          // posd accepting migrations (posd.migration)
  std::string secret_file;  // with HOST:PORT: the shared secret (read_migration_secret)
  uint32_t pid = 0;       // the job
  // An in-process job's (pos run) control socket: the job goes to another host's posd (`to` is
  // HOST:PORT) through GPU-only pre-dumps while it runs, then a stop dump of its process (NVIDIA's
  // driver checkpoint, CRIU) restored there; `socket` is unused. Empty: a posd job.
  std::string job_socket;
  std::string work_dir;   // where the rounds' images go (a private directory is made in it); empty: auto
  uint32_t max_rounds = 5;         // pre-copy rounds at most (at least one: the whole state)
  double max_downtime_s = 0.3;     // the stop's budget the rounds aim at
  bool lazy = true;                // the target runs the job on while its device bytes load
  bool keep_images = false;        // leave the rounds' images behind (else removed once the job runs)
  // On one host the job's process stays where it is (the live switch): only its GPU state moves,
  // and its shim re-attaches to the target. true: CRIU dumps the process and restores it under the
  // target instead (the path another host takes), e.g. to test that path on one host.
  bool move_process = false;
  // The live switch's peer path (docs/migration.md, "The peer switch"): no pre-copy rounds; at the
  // stop the source session hands the job's device memory to pos-cli as descriptors, and the
  // target's session copies it device to device (the same GPU, or another one by peer access).
  // false: pre-copy rounds and the stop through image files (--no-peer).
  bool peer = true;
  // When the peer switch fails because the source cannot hand its memory over (the job is then
  // back at the source, after a pause of a few milliseconds), migrate again through rounds and
  // image files; false: stop there, exit 3 (--no-fallback).
  bool peer_fallback = true;
  // HOST:PORT, a posd job: the target stages round 1 while the rounds go on (false: --no-stage).
  bool stage = true;
  std::string self_program;        // this pos-cli, which a guardian runs to restore on the source if
                                   // this process dies between the stop and the target's confirmation
  // Events: "round" (a pre-copy round done), "switch" (the stop began), "restore" (on the target),
  // "fallback" (back to the source), with the round's figures where they apply.
  struct Round {
    uint32_t n = 0;
    uint64_t bytes = 0;             // GPU bytes sent (stored) in this round
    uint64_t bytes_referenced = 0;  // unchanged since the round before, not sent again
    uint64_t criu_bytes = 0;        // CPU memory pre-dumped (kernels with dirty tracking only)
    double seconds = 0, rate = 0;   // the round's GPU copy (and its transfer), and its bytes per second
    double transfer_s = 0;          // HOST:PORT: sending the round to the target
    uint64_t sent = 0;              // HOST:PORT: bytes of files sent (GPU and CPU parts)
    uint64_t streamed = 0;          // of them, a posd job's, sent as posd reported them written
    double pause_s = 0;             // the job's stall for the round's cut
    // A posd job: what the job had written since this round's cut by the time it ended (posd's
    // estimate, asked before another round): what a next round, or the stop, would copy.
    uint64_t next_estimate = 0;
    // Round 1 of a posd job, when a round 2 would not fit the budget: what the job wrote (rewrites
    // included) in the time a round 2 would take (window_s, from round 1's rate). At 90 % of
    // next_estimate, round 2 would leave the stop as much as it copies: the rounds end.
    double window_s = 0;
    uint64_t window_bytes = 0;
  };
  std::function<void(const char* event, const Round& last)> progress;
};

struct JobMigrateReport {
  std::vector<JobMigrateOptions::Round> rounds;
  // Why the rounds ended: "budget", "converged" (no longer shrinking), "no-shrink" (the job had
  // rewritten what the last round copied before it ended: another would not shrink it),
  // "max-rounds"; "peer" for the peer switch.
  std::string stop_reason;
  std::string work_dir;
  std::string where;        // "target", or "source" (the target failed: the job runs where it was)
  std::string target_error; // why the target failed, when where == "source"
  uint64_t final_bytes = 0; // GPU bytes copied during the stop
  uint64_t final_sent = 0;  // HOST:PORT: bytes of the stop's image sent
  uint64_t final_sent_early = 0;  // of them, a posd job's GPU part, sent while CRIU dumped the process
  uint64_t final_sent_draining = 0;  // of those, a posd job's, sent while posd still drained that part
  // HOST:PORT, a posd job: the target had round 1 staged before the stop (its restore ahead copied
  // the buffers unchanged since from there; docs/migration.md, "Staged at the target").
  bool target_staged = false;
  // HOST:PORT, a posd job: whether the target said its staging of round 1 was ready before the
  // stop, and how long the source waited for it to be (the job ran on meanwhile).
  bool stage_ready = false;
  double stage_wait_s = 0;
  // Where the rest of total_s went: from the start to round 1 (the target's checks, the work
  // directory, the guardian), and the rounds with what came between them (posd's estimates).
  double setup_s = 0, rounds_s = 0;
  bool remote = false, same_host = false;  // HOST:PORT, and whether that posd runs on this machine
  uint64_t final_criu_bytes = 0;  // the stop's CPU part as sent (what changed since the last round's pages)
  uint64_t final_criu_pages_to_parent = 0;  // pages of it left to the last round's (equal there)
  double dump_s = 0;        // the stop: detach, last GPU bytes, CRIU, until the job is ended
  // Through CRIU (another host, --move-process): the parts of dump_s and restore_s. stop_cut_s:
  // from the stop's start to its GPU cut (the detach with it); stop_criu_s: CRIU's dump;
  // stop_image_s as below; final_send_s: sending the stop's image and the target's sync (another
  // host); pid_free_s: from the kill of the source's copy until its pid is free; target_restore_s:
  // the restore until the job is held (another host) or runs; commit_s: the commit until the target
  // says the job re-attached (another host).
  double stop_cut_s = 0, stop_criu_s = 0, final_send_s = 0, pid_free_s = 0, target_restore_s = 0, commit_s = 0;
  // HOST:PORT: from the stop's start until its GPU part was saved (posd's drain, or an in-process
  // job's write), and how long sending that part ahead took (the prepare with it); 0 otherwise.
  double stop_gpu_part_s = 0, stop_early_send_s = 0;
  // HOST:PORT, a posd job: of target_restore_s, the target's checks once the whole image was
  // there, and CRIU's restore of the process (as the target timed them).
  double target_check_s = 0, target_criu_s = 0;
  double restore_s = 0;     // the restore, until the job re-attached
  double downtime_s = 0;    // from the detach to the re-attach: the job's calls held
  double total_s = 0;
  uint32_t pid = 0;
  bool commit_answer_lost = false;  // HOST:PORT: the commit's answer was lost; the target said it committed
  bool live = false;        // the live switch: the process stayed, its GPU state moved (no CRIU)
  bool peer = false;        // live, the peer path: device memory handed over, no rounds
  uint64_t peer_bytes = 0;  // peer: device memory handed over (the source's allocations, whole)
  double peer_export_s = 0; // peer: the source's export, until pos-cli held the descriptors
  double target_copy_s = 0; // peer: the target's restore of the handles and its copy
  double target_welcome_s = 0;  // live: from the connect to the target's restoring session's Welcome
  double peer_send_s = 0;   // peer: sending the table of descriptors to the target
  double detach_s = 0;      // live: of dump_s, the detach (the job's calls in flight finishing)
  double stop_image_s = 0;  // of dump_s, the stop's image complete (live: handles, and buffers unless peer)
  double reattach_s = 0;    // live: from the permit to the target's "re-attached"
  std::string release_error;  // live: the source's session could not be released (it ends with the job)
  std::string peer_export_error;  // the peer switch: why the source could not hand its memory over
  std::string peer_fallback;  // why this migration went through image files after a peer switch failed
};

// Pre-copy rounds (pre-dumps, each holding only what changed since the one before) while the job
// runs, until the last round's copy fits half the downtime budget, stops shrinking, or the round
// limit; then the stop: the job is detached, dumped on top of the last round and left stopped;
// once that image is complete the job is ended on the source and restored on the target. A failure
// before the job is ended lets it run on at the source, untouched; a failure of the target restores
// it on the source from the same image. Exactly one copy runs afterwards (CRIU restores the job
// under its own pid, which one host gives to one process at a time).
StatusOr<JobMigrateReport> migrate_job(const JobMigrateOptions& options);

// A migration to another host whose pos-cli died after it sent the commit (its guardian runs
// `pos-cli migrate --resolve ID --resolve-dir DIR`): asks the target how migration `id` ended;
// "committed": the scratch DIR goes, "target"; "ended": the job is restored on the source from
// DIR/final, "source"; the target unreachable or not knowing: an error, the image kept.
struct JobResolveOptions {
  uint32_t pid = 0;
  std::string id, dir, to, secret_file, socket;
};
StatusOr<std::string> resolve_migration(const JobResolveOptions& options);

// A live switch whose pos-cli died after the job was told it may re-attach to the target (its
// guardian runs `pos-cli migrate --settle --resolve-dir DIR`): waits until the job runs at the
// target (then the source's detached session is released: "target") or the target gave it up
// (then it is let back to the source: "source"), and removes DIR. DIR/final/token and
// DIR/permit-path say which session and which permit.
struct JobSettleOptions {
  uint32_t pid = 0;
  std::string dir, to, socket;
};
StatusOr<std::string> settle_migration(const JobSettleOptions& options);

}  // namespace pos
