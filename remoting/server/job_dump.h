// job_dump.h — `pos-cli dump`: a job under posd saved whole at one cut — its GPU state (posd's
// checkpoint engine) and its CPU process tree (CRIU) — into one directory (docs/dump_restore.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pos/base/status.h"
#include "remoting/server/control_client.h"

namespace pos {
namespace driver {
class HeldMemory;
}

// This process's CUDA context of an in-process job's device, kept from one dump or pre-dump to
// the next (a checkpoint policy's ticks, a migration's rounds). Without it each one makes the
// context and lets it go: ~0.3 s of every tick on an H200, and the driver's making of a context on
// the job's GPU right before the cut slowed the job's step there (docs/driver_runtime.md). At most
// one device's: the job's current one (after a move, the old one's goes). One caller at a time.
class DeviceContexts {
 public:
  DeviceContexts() = default;
  ~DeviceContexts();
  DeviceContexts(const DeviceContexts&) = delete;
  DeviceContexts& operator=(const DeviceContexts&) = delete;
  // Keeps device `dev`'s primary context of the driver library `driver` (a dlopen handle that
  // stays loaded: DriverCheckpoint never unloads it), letting go of another device's.
  [[nodiscard]] Status keep(void* driver, int dev);
  int device() const { return dev_; }  // -1: none kept

 private:
  int (*release_)(int) = nullptr;
  int dev_ = -1;
};

struct JobDumpOptions {
  std::string socket;  // posd's
  uint32_t pid = 0;    // the job: its client's pid, the root of the tree CRIU dumps
  std::string dir;     // made if missing; must hold no image yet
  bool leave_running = false;
  // Not with leave_running: CRIU leaves the job stopped (SIGSTOP) and detached instead of ending
  // it, and the report names its permit (migration ends it once the image is complete, or lets it
  // run on: grant_reattach + SIGCONT). An in-process job's (dump_driver_job) stays stopped with its
  // driver state checkpointed and its device memory freed: the caller ends it, or restores it from
  // the image; a failure before the image is complete resumes it (its guardian too).
  bool leave_stopped = false;
  // No CPU part (pos-cli migrate's live switch on one host: the process stays where it is): the job
  // is detached, its GPU state saved to DIR/gpu (+ DIR/token), and it stays detached, running but
  // with its CUDA calls held, until its permit names the posd to re-attach to (report.permit).
  // No manifest: the image is a migration's scratch, not a restore point. CRIU is not needed.
  bool gpu_only = false;
  // With gpu_only (pos-cli migrate's peer switch): buffers are marked in_peer, not stored; their
  // bytes go to the target as device memory (posd_peer_export). Variables are stored.
  bool peer = false;
  bool async = false;  // the GPU drain copy-on-write (the job is parked until CRIU is done either way)
  // A job still loading a lazy restore is dumped at once: what it has not loaded yet is copied from
  // the image it loads from. Else the dump waits until the load is done.
  bool lazy_ok = false;
  // An in-process job's pre-dump: the job keeps its device copy once this one is written, for its
  // next cut to copy into (a policy's ticks: no 12 GB made and let go of every tick, at the cost of
  // that memory held between them). POS_SNAP_KEEP=0|1 overrides it.
  bool keep_shadow = false;
  // An earlier dump or pre-dump of this job (dump --prev): the GPU part stores only buffers written
  // since its cut, CRIU's only pages changed since its (where the kernel tracks dirty memory).
  std::string prev;
  // Pre-dumps, where the kernel tracks no dirty memory (so CRIU cannot pre-dump): DIR/criu gets the
  // job's pages, read while it runs (ckpt::write_process_pages), as the parent that a later dump
  // --prev leaves its unchanged pages to. Off: a pre-dump has no CPU part there.
  bool cpu_pages = false;
  // An in-process job's control socket (pos run: JOBS_DIR/<pid>.sock), for dump_driver_job.
  std::string job_socket;
  // dump_driver_job: the pos-cli to run as `PROGRAM resume -t PID --job-socket SOCKET` if this
  // process dies mid-dump (a guardian child execs it), so that the job never stays held. Empty:
  // no guardian.
  std::string resume_program;
  // Phase names ("detach", "gpu", "criu", "resume") and, for "gpu", bytes stored of the total.
  std::function<void(const char* phase, uint64_t done, uint64_t total)> progress;
  // dump_job, dump_driver_job: called (maybe from another thread, once) as soon as DIR/gpu is
  // complete, which may be while NVIDIA's checkpoint or CRIU still run: pos-cli migrate sends it to
  // another host meanwhile, with what a restore of a posd job's GPU part needs before the manifest
  // exists (the detach's token, the session arena, the job's uid; an in-process job's: "", 0, uid).
  // Called only when the GPU part was saved; the dump may still fail after it.
  std::function<void(const std::string& token, uint64_t arena_bytes, uint32_t uid)> gpu_part_done;
  // A posd job: told of each range of the GPU part's memory files (in `dir`/gpu.partial, the image
  // being written) once posd has written it, from the thread that reads posd's answers: pos-cli
  // migrate sends them to another host while the drain goes on. Best effort (control_client.h).
  std::function<void(const std::string& file, uint64_t offset, uint64_t length)> gpu_written;
  // An in-process job's dumps and pre-dumps: the device context to keep between them (a policy's
  // ticks, a migration's rounds and stop). Null: this call makes its own and lets it go.
  std::shared_ptr<DeviceContexts> contexts;
};

struct JobDumpReport {
  CheckpointReport gpu;
  std::string criu_dir, manifest;
  std::string permit;  // where the job looks for its permit (leave_stopped: it has none yet)
  // gpu_only: what a restore of DIR/gpu into another posd needs (the detach's token, the job's
  // session arena, its uid and name).
  std::string token, job;
  uint64_t arena_bytes = 0;
  uint32_t owner = 0;
  double detach_s = 0;
  double cut_s = 0;  // from the GPU request to its cut (the image's content fixed)
  double gpu_s = 0;  // from the GPU request to its image durable (overlaps CRIU and the resume)
  double criu_s = 0, resume_s = 0, total_s = 0;
  double pause_s = 0;  // from the detach's start to the job's calls running again (leave-running)
  bool criu_track_mem = false;  // CRIU recorded dirty-memory tracking (a later --prev is incremental)
  bool criu_incremental = false;  // CRIU saved only pages changed since prev's part
  std::string criu_note;         // why the CPU part is whole although asked otherwise, or empty
  std::string note;              // an in-process job's: what went through NVIDIA's checkpoint, or empty
  uint64_t criu_bytes = 0;       // bytes of CRIU's images
  // CRIU saved all of the job's memory, and these pages of it, equal to the previous image's CPU
  // part at the same address, were then left to it (ckpt::make_criu_image_incremental).
  uint64_t criu_pages_to_parent = 0;
  // An in-process job's: NVIDIA's driver checkpoint (lock + checkpoint) and, with leave_running,
  // its restore + unlock (in resume_s with the reload of device memory); fsync of the GPU part.
  double driver_s = 0, driver_restore_s = 0, sync_s = 0;
  // Inside the job (its dump-save answer): the device copy and the unmap, of gpu_s; and its reload
  // (dump-resume, with leave_running), of resume_s.
  double job_save_s = 0, job_unmap_s = 0, job_load_s = 0;
  // An in-process job's: from the hold until both parts are written (page cache), the figure a
  // stop dump is judged by.
  double stopped_s = 0;
  bool handoff = false;
  bool gpu_snapshot = false;  // leave-running: the memory went back at once, its image written from a device copy
  // An in-process job's pre-dump: the allocations (and their bytes) written since its previous
  // GPU-only checkpoint (all of them at the first).
  uint64_t written_regions = 0, written_bytes = 0;
  std::vector<uint64_t> unwritten;  // the addresses of the others (unchanged since that checkpoint)
  // An in-process job's pre-dump: whether the cut's copies ran ahead of the job (its calls waited
  // on the device only for the copies of what they touched), and how many such waits there were.
  bool gpu_ahead = false;
  uint64_t gpu_ahead_waits = 0;
  bool gpu_shadow_reused = false;  // the job copied into the copy it kept from its previous cut
  // How the cut waited for the job's step boundary (POS_SNAP_ALIGN_MS): sync (a synchronizing call
  // of the job returned), idle, timeout, capture, off; and for how long.
  std::string gpu_align;
  double gpu_align_s = 0;
  uint64_t gpu_pool_free_bytes = 0;  // of stream-ordered memory, held by no live block at the cut: not copied
};

// Detaches the job (its calls wait), cuts its GPU state for DIR/gpu, dumps its process tree with
// CRIU into DIR/criu (ending it, unless leave_running), lets the job re-attach (leave_running) while
// the GPU bytes drain, then writes DIR/token (for a restore; the caller's alone) and DIR/manifest. Any failure after
// the detach lets the job re-attach and run on, and removes what this dump wrote. CRIU is checked
// before anything is asked of posd.
StatusOr<JobDumpReport> dump_job(const JobDumpOptions& options);

// `pos-cli pre-dump`: the job runs on throughout. Its GPU state is checkpointed (copy-on-write) to
// DIR/gpu and, where the kernel tracks dirty memory, CRIU pre-dumps its memory to DIR/criu with
// tracking on; DIR/manifest says which. Not restorable by itself: a later dump --prev DIR then
// saves only what changed. `leave_running` and `async` are ignored (always true).
StatusOr<JobDumpReport> pre_dump_job(const JobDumpOptions& options);

// `pos-cli dump` of an in-process job (pos run, docs/driver_runtime.md "Dump"): through the job's
// control socket, POS in the job holds its driver calls, saves its placed device memory to DIR/gpu
// and unmaps it; NVIDIA's driver checkpoint then takes the (now small) driver state; CRIU dumps
// the process into DIR/criu; with leave_running the driver state and the memory come back and the
// job runs on. DIR/manifest (kind "driver-dump") last. Any failure brings the job back running and
// removes what this dump wrote. --prev and --mode async are not built for these jobs (refused).
StatusOr<JobDumpReport> dump_driver_job(const JobDumpOptions& options);

// `pos-cli pre-dump` of an in-process job: a GPU-only checkpoint. The job's calls wait only while
// its cut is enqueued on the device (events after every stream's work, device-to-device copies of
// its placed memory into a shadow, every stream's later work after them: r.gpu.stall_s); this
// process imports the copy and writes DIR/gpu from it while the job runs on, then DIR/manifest
// (kind "driver-pre-dump"). No CPU part (NVIDIA's checkpoint would have to stop the job); not
// restorable, and not yet a --prev. Any failure leaves the job running and no image.
// A job that has not used the GPU yet (no context, no device memory) has nothing for it to save:
// its error then says so (job_not_started), so that a checkpoint policy waits for the job instead
// of counting failed ticks.
StatusOr<JobDumpReport> pre_dump_driver_job(const JobDumpOptions& options);
Status job_not_started_error(std::string why);
bool job_not_started(const Status& s);

// `dump-take` to the in-process job at `socket`: its device memory as `fds` (in its allocation
// order), `list`, its allocation list's checksum, and `cut`, the dump's cut (a process restored
// under the same pid refuses memory of another cut). The job's answer; kFailedPrecondition with
// the job's reason when it refused them (nothing taken).
StatusOr<std::string> hand_back_memory(const std::string& socket, const std::vector<int>& fds, uint32_t list,
                                       uint64_t cut);
// The same for memory held in this process (duplicates of its descriptors go). `lazy_flag` >= 0:
// the memory is still loading, and this is the flag the job's streams wait for (driver/lazy_load.h).
StatusOr<std::string> hand_back_memory(const std::string& socket, const driver::HeldMemory& held, uint32_t list,
                                       uint64_t cut, int lazy_flag = -1);

// `pos-cli resume`: an in-process job left held by a dump that did not finish (its pos-cli killed)
// brought back: the driver's state restored and unlocked if it is checkpointed or locked, then the
// job's memory given back (`shared_fds`, with `list` and `cut`) or mapped and loaded again from where
// the dump saved it. `start_time` (/proc/PID/stat's, 0: unchecked): the process the dump held; a
// process with that pid started at another time (the job restored from an image, or the pid reused)
// is left alone. Its answer, or why not. A job that no dump holds is left alone ("not held").
StatusOr<std::string> resume_driver_job(const std::string& job_socket, uint32_t pid,
                                        const std::vector<int>& shared_fds = {}, uint32_t list = 0, uint64_t cut = 0,
                                        uint64_t start_time = 0);

// `pos-cli migrate -t PID --device N` of an in-process job (pos run): the job moves to CUDA device
// N of this host while its process keeps running, without CRIU (docs/driver_runtime.md, "Moving a
// running job to another GPU"). Its device memory is handed to this process (dump-share), NVIDIA's
// driver checkpoints the emptied context, the memory is copied device to device onto GPU N while
// that runs, NVIDIA's restore puts the context on GPU N (gpuPairs), and the job takes the new
// memory at the same addresses. Any failure before the job took the new memory gives it its old
// memory back on its old GPU (or, past the driver's restore, on the new one); pos-cli killed
// midway: its guardian does the same (`pos-cli resume`).
struct JobMoveOptions {
  uint32_t pid = 0;
  std::string job_socket;
  int device = -1;             // this host's CUDA ordinal (CUDA_VISIBLE_DEVICES ignored)
  std::string resume_program;  // this pos-cli, for its guardian
  std::function<void(const char* phase)> progress;
};
struct JobMoveReport {
  uint32_t pid = 0;
  int from = -1, to = -1;  // this host's ordinals
  std::string from_uuid, to_uuid;
  uint64_t bytes = 0, handles = 0;
  // The job's calls were held from the hold to the take (paused_s): the hand-over of its memory
  // (hold_s), NVIDIA's checkpoint (checkpoint_s), the copy onto the new GPU (copy_s, alongside
  // the checkpoint), NVIDIA's restore with the remap (restore_s), the take (take_s).
  double hold_s = 0, checkpoint_s = 0, copy_s = 0, restore_s = 0, take_s = 0, paused_s = 0, total_s = 0;
  std::string note;
};
StatusOr<JobMoveReport> move_driver_job(const JobMoveOptions& o);

}  // namespace pos
