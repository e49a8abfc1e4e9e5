// checkpoint.h — the checkpoint engine: a request, the job that drains one client's device state
// into an image at a cut (sync, or async with copy-on-write shadows), and restore from an image.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckpt/image.h"
#include "pos/backend.h"
#include "pos/base/status.h"

namespace pos {

struct APIContext;

enum class CheckpointMode : uint8_t {
  kSync,   // the client stops at the cut until every byte is in the image
  kAsync,  // the client runs on; buffers it is about to write are first copied to device shadows
};
StatusOr<CheckpointMode> parse_checkpoint_mode(const std::string& s);
// The page-locked staging chunks (DeviceBackend::kStagingChunkBytes) a checkpoint into a directory
// takes when it starts: what a session keeps ahead so that its first checkpoint makes none.
size_t checkpoint_staging_chunks();

struct CheckpointRequest {
  CheckpointMode mode = CheckpointMode::kSync;
  // Exactly one target: a directory (written atomically) or a host-memory image.
  std::string dir;
  ckpt::MemoryImage* memory = nullptr;
  bool replace = false;  // an existing directory image is replaced atomically
  // Incremental: store only buffers written since this (directory) image; the rest is referenced.
  std::string parent_dir;
  // How the image records its parent, relative to its own directory; empty: derived from dir and
  // parent_dir. Set when those are paths only this process can resolve (a posd session writes
  // through descriptors, /proc/self/fd/N, that mean nothing to a later reader).
  std::string parent_path;
  uint64_t shadow_pool_bytes = 0;  // async: bound on shadow memory (0: the config's, whose 0 is auto)
  // Stop (a dump that ends the client, as `criu dump` ends a process): the worker runs no call
  // at or after the cut, ever. The parser goes on accepting calls that return after parsing until
  // the device bytes are drained, then seals the image with every such call (the app already has
  // their answers) as pending calls, replayed by restore. Calls whose callers still wait (a sync
  // call, and everything after it) are answered kUnavailable and are not in the image. From then
  // on the client executes nothing and refuses every call and command; remove_client drops it
  // without running the pending calls. If the checkpoint fails, the client runs on as if it had
  // never been stopped (its pending calls execute). Sync mode only (docs/checkpoint.md, "Stop").
  bool stop = false;
  // A client still loading a lazy restore is checkpointed at once instead of after its load: the
  // buffers not loaded at the cut are copied from the image they are loading from (their bytes
  // are the image's until a call names them), not from the device (`pos-cli dump --lazy-ok`).
  bool lazy_ok = false;
  // Peer (pos-cli migrate's peer switch, docs/migration.md): the buffers' bytes are not stored but
  // marked `in_peer`: they stay in this client's device memory, which export_peer_memory then hands
  // to the target session. Variables are stored as usual. The image is a migration's scratch.
  bool peer = false;
  // Called by the drainer after each chunk (bytes stored so far, bytes to store).
  std::function<void(uint64_t done, uint64_t total)> progress;
  // A directory image: called by the writer's threads once a range of a memory file is written
  // (ckpt::DirWriterOptions::on_written), so that a caller may send it on before the image is done.
  std::function<void(const std::string& file, uint64_t offset, uint64_t length)> on_written;
  // Test hooks: the drainer waits while *hold_drain is true before its first copy; on_cut runs on
  // the worker once the cut is taken (before the client resumes).
  std::atomic<bool>* hold_drain = nullptr;
  std::function<void(uint64_t cut)> on_cut;
  // Test hook: runs on the worker each time it finds the shadow pool full and starts to wait.
  std::function<void()> on_pool_full;
};

struct CheckpointResult {
  uint64_t cut_pc = 0;
  uint64_t handles = 0;
  uint64_t bytes_stored = 0;     // device bytes written into this image
  uint64_t bytes_referenced = 0; // device bytes left in the parent chain (incremental)
  uint64_t bytes_from_image = 0; // lazy_ok: bytes of bytes_stored copied from the lazy restore's image
  uint64_t shadow_bytes = 0;     // async: bytes copied to shadows because the job wrote them
  uint64_t shadow_limit = 0;     // async: the pool's bound for this checkpoint
  uint64_t shadow_kept = 0;      // async: shadow memory the session keeps for the next (keep_shadows)
  uint64_t shadow_waits = 0;     // async: times the worker found the pool full and waited
  double shadow_s = 0;           // async: how long the worker spent on shadows (the job's calls waited)
  double shadow_alloc_s = 0;     // async: of that, allocating them (the rest: copying, waiting for the pool)
  double stall_s = 0;            // how long the client's worker was stopped at the cut
  double total_s = 0;            // request to durable image
  // When the drainer started (at the cut) and when the image was durable, on the monotonic clock
  // (seconds_now()), so a caller can tell which of the job's work overlapped the drain.
  double drain_start_s = 0, drain_end_s = 0;
  double to_cut_s = 0;  // from the request to the cut (opening the writer and the parent chain, the client quiescing)
  std::string image_id;
  uint64_t pending_calls = 0;    // stop: calls at or after the cut, kept in the image for replay
};

// How POSWorkspace::restore rebuilds a client (docs/checkpoint.md, "Restore").
struct RestoreOptions {
  // Lazy: restore returns once the handles exist (and the variables, which kernels touch without
  // naming them, are loaded); each buffer's bytes are loaded by the worker before the first call
  // that names the buffer, while background threads load the rest. Needs the image's ownership
  // (the shared_ptr overload of restore): it is read until every buffer is loaded.
  bool lazy = false;
  // The device the client's state goes to: -1 keeps the image's own device; another index maps
  // the image onto that device, which must be of the same model (the device name must match).
  // The application keeps seeing the device numbers it saw before (its cudaGetDevice value).
  int device = -1;
  // As ClientOptions: the host memory the restored client's calls may name (size 0: its own
  // process's), and the devices it sees (empty: all). A posd session restored for a dumped job
  // names its session arena and posd.devices, as the session it was dumped from did.
  uint64_t host_base = 0, host_size = 0;
  std::vector<int32_t> devices;
  // As ClientOptions: the SMs the restored client's kernels may run on (0: all); posd gives the
  // restoring posd's limit for the job's name, not the image's.
  uint32_t sms = 0;
  // An image whose buffers are `in_peer`: the exporting session's memory, as descriptors
  // (DeviceBackend's PeerMemory); every such buffer is copied from it. Not with lazy.
  const std::vector<PeerMemory>* peer = nullptr;
  // With `peer`: the peer memory is a staging session's, which holds the image with this id
  // restored (a migration target's, docs/migration.md "Staged at the target"): every buffer whose
  // bytes this image takes from that one is copied from it, the rest are read (lazily, with lazy).
  std::string peer_image_id;
  // Test hook: the background loaders wait while *hold_loader is true before their first buffer.
  std::atomic<bool>* hold_loader = nullptr;
};

// Progress of a lazy restore (all zero, complete, for an eager one).
struct LazyRestoreStats {
  uint64_t buffers = 0, bytes = 0;      // buffers (and their bytes) restored lazily
  uint64_t loaded_on_demand = 0;        // loaded by the worker before a call that named them
  uint64_t loaded_in_background = 0;    // loaded by the background loaders
  uint64_t dropped = 0;                 // freed by the job before anyone loaded them
  uint64_t failed = 0;                  // could not be loaded (a checksum mismatch, ...)
  bool complete = true;                 // nothing is left to load
  double seconds = 0;                   // restore to complete (while incomplete: so far)
};

// One buffer or variable to store. Shared by the worker (copy-on-write) and the drainer under mu.
struct DrainRegion {
  uint64_t key = 0;  // image handle key
  uint64_t addr = 0, size = 0;
  bool is_var = false;
  int record = 0;  // index into the job's ClientImage handles
  std::vector<std::byte> host_copy;  // variables: captured at the cut
  size_t blob = 0;
  std::mutex mu;
  uint64_t drained = 0;      // bytes [0, drained) are in the image (guarded by mu)
  uint64_t shadow = 0;       // device copy of bytes [shadow_from, size) (guarded by mu)
  uint64_t shadow_from = 0;
  bool done = false;         // guarded by mu
  std::atomic<bool> urgent{false};
  // lazy_ok: not loaded at the cut, so its bytes are this blob of an image (set at the cut, before
  // the drainer starts; the job's later writes need no shadow).
  const ckpt::ImageReader* src_img = nullptr;
  const ckpt::pb::BlobRef* src_ref = nullptr;
};

// One checkpoint of one client. Built by the parser (records, regions), started by the worker at
// the cut, drained by its own thread, awaited by the control thread.
class CheckpointJob {
 public:
  CheckpointJob(CheckpointRequest request, DeviceBackend* device) : req_(std::move(request)), device_(device) {}
  ~CheckpointJob();

  const CheckpointRequest& request() const { return req_; }
  ckpt::pb::Inventory& inventory() { return inventory_; }
  ckpt::pb::ClientImage& image() { return image_; }
  const ckpt::ImageReader* parent() const { return parent_.get(); }
  // Worker, at the cut, before start_at_cut (lazy_ok): the buffer at `addr` is drained from blob
  // `ref` of `img`, which `owner` keeps alive (the lazy restore's image and its ancestors).
  void source_from_image(uint64_t addr, const ckpt::ImageReader* img, const ckpt::pb::BlobRef* ref,
                         std::shared_ptr<const ckpt::ImageReader> owner);
  // Control thread, before the command: opens the target and the parent.
  // `device` is the client's device, whose free memory bounds an auto-sized shadow pool.
  Status prepare(uint64_t default_shadow_pool, int device);
  // After prepare: the shadow pool's bound as asked (0: auto, sized at the cut).
  uint64_t shadow_limit() const { return shadow_limit_; }
  // Parser: one region per buffer whose bytes go into this image.
  void add_region(uint64_t key, uint64_t addr, uint64_t size, bool is_var, int record);
  uint64_t* referenced_bytes() { return &result_.bytes_referenced; }

  // Worker, at the cut (every call < N has run on the device): captures variables, starts the
  // drainer. Sync mode returns when the image is complete.
  Status start_at_cut(BackendClient* backend, double stall_start_s);
  // Worker, before it executes a call ≥ N: buffers the call writes are shadowed or drained first.
  void protect(const APIContext& c);
  // The job is finished (durable image, or failed). Any thread.
  bool drained() const { return drained_flag_.load(std::memory_order_acquire); }
  // After drained(): whether the image is durable. Any thread.
  bool succeeded() const;

  // ---- stop checkpoints: sealing the pending calls (request().stop) ----
  // Called (from the drainer) when the client's threads have something to look at: the seal is
  // requested, or the job finished. Set by the client before the command; must not block.
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }
  // The device bytes are drained: the parser must stop accepting calls and hand over the pending
  // ones (seal). Parser thread.
  bool seal_requested() const { return seal_requested_.load(std::memory_order_acquire); }
  // Parser: the pending calls, in pc order (or why they cannot be stored: the checkpoint fails),
  // and the client's sticky error now. Nothing runs past the cut, so it can only have been read
  // (cleared) by a cudaGetLastError the parser answered since: 0 clears the image's.
  void seal(std::vector<ckpt::pb::PendingCall> calls, Status status, int32_t async_error);

  // Control thread: waits for the image to be durable.
  StatusOr<CheckpointResult> wait();

 private:
  void drain_main();
  Status drain_all();
  // One round (a few chunks) of r from byte `base`; *next: where the next round starts (r.size: done).
  Status drain_round(DrainRegion& r, uint64_t base, uint64_t* next);
  void finish_region(DrainRegion& r);
  Status copy_from_image(const DrainRegion& r, uint64_t base, std::span<const HostSpan> parts);
  void finish(Status s);
  void protect_region(DrainRegion& r);
  Status wait_for_seal();

  CheckpointRequest req_;
  DeviceBackend* device_;
  std::unique_ptr<ckpt::ImageWriter> writer_;
  std::unique_ptr<ckpt::ImageReader> parent_;
  std::shared_ptr<const ckpt::ImageReader> source_image_;  // lazy_ok: what src_img points into
  ckpt::pb::Inventory inventory_;
  ckpt::pb::ClientImage image_;
  std::vector<std::unique_ptr<DrainRegion>> regions_;
  std::unordered_map<uint64_t, DrainRegion*> by_addr_;  // buffers (not variables), by address
  uint64_t total_bytes_ = 0;
  uint64_t shadow_limit_ = 0;    // 0 until the cut when auto-sized
  int device_index_ = 0;

  std::unique_ptr<DeviceCopier> drain_copier_;   // drainer thread
  std::unique_ptr<DeviceCopier> shadow_copier_;  // worker; shadow_alloc/free under pool_mu_
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  uint64_t shadow_in_use_ = 0;  // guarded by pool_mu_
  uint64_t shadow_total_ = 0;   // guarded by pool_mu_
  uint64_t shadow_waits_ = 0;   // guarded by pool_mu_
  std::atomic<uint64_t> shadow_ns_{0};  // the worker's time in protect_region (no lock on its fast path)
  double shadow_alloc_s_ = 0;   // guarded by pool_mu_

  std::thread drainer_;
  std::atomic<bool> drained_flag_{false};
  mutable std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool done_ = false;      // guarded by done_mu_
  Status status_;          // guarded by done_mu_
  CheckpointResult result_;
  double t0_ = 0;
  double stall_start_s_ = 0;

  std::function<void()> wake_;  // set before the command; called by the drainer
  std::atomic<bool> seal_requested_{false};
  std::mutex seal_mu_;
  std::condition_variable seal_cv_;
  bool sealed_ = false;                          // guarded by seal_mu_
  Status seal_status_;                           // guarded by seal_mu_
  std::vector<ckpt::pb::PendingCall> pending_;   // guarded by seal_mu_ (then the drainer's)
  int32_t sealed_async_error_ = 0;               // guarded by seal_mu_
};

double seconds_now();
// Host memory for images and staging from the backend's page-locked allocator.
ckpt::HostAllocator pinned_allocator(DeviceBackend* device);

}  // namespace pos
