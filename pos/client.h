// client.h — POSClient: one tenant's queues, parser thread, worker thread, handles and device state.
// Clients share nothing mutable with each other; a stalled client never blocks another.
#pragma once

#include <boost/lockfree/spsc_queue.hpp>

#include <array>
#include <deque>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "pos/api_context.h"
#include "pos/api_table.h"
#include "pos/backend.h"
#include "pos/call_profile.h"
#include "pos/checkpoint/checkpoint.h"
#include "pos/config.h"
#include "pos/handle.h"
#include "pos/checkpoint/lazy_restore.h"
#include "pos/base/gate.h"
#include "pos/base/status.h"
#include "pos/base/sync.h"

namespace pos {

// ---- checkpoint / migration commands (control → parser → worker → parser → control) ----
enum class CommandType : uint8_t {
  kQuiesce,       // cut at N: every call < N has executed on the device, none >= N has started
  kCollectDirty,  // cut at N and report (then clear) the handles written since the last collection
  kCheckpoint,    // cut at N and drain the client's state into job's image (sync or async)
  kExportMemory,  // cut at N and hand out descriptors of the client's device memory (peer switch)
  kEstimate,      // parser only, no cut: the device bytes an incremental checkpoint would store now
};

struct DirtyRecord {
  uint64_t handle_id;
  ResourceType type;
  uint64_t client_addr;
  uint64_t size;
  uint64_t version;
};

struct Command {
  CommandType type = CommandType::kQuiesce;
  uint64_t cut_pc = 0;  // N, chosen by the parser: all calls with pc < N are inside the cut
  Status status;
  std::vector<DirtyRecord> dirty;  // kCollectDirty, sorted by handle id
  uint64_t generation = 0;         // set by run_command; completion is signalled per client
  std::shared_ptr<CheckpointJob> job;  // kCheckpoint
  std::vector<PeerMemory> peer;        // kExportMemory: the answer
  const ckpt::ImageReader* parent = nullptr;  // kEstimate: against this image
  uint64_t since_pc = 0;                      // kEstimate: > 0, buffers written at or after this call
  uint64_t bytes = 0, referenced = 0, handles = 0;  // kEstimate: the answer
};

// pos_process → worker-completion latency: 50 ns buckets up to 2 ms, then 10 us buckets up to 2 s.
// Written by the worker only;
// read after the client is quiet (a sync call or shutdown orders the reads).
class LatencyHistogram {
 public:
  void record(uint64_t ns);
  uint64_t count() const { return count_; }
  uint64_t percentile_ns(double p) const;
  void clear();

 private:
  static constexpr uint64_t kBucketNs = 50;
  static constexpr size_t kFine = 40000;                  // [0, 2 ms)
  static constexpr uint64_t kCoarseNs = 10000;
  static constexpr size_t kBuckets = kFine + 200000;      // + [2 ms, 2 s)
  static uint64_t bucket_upper_ns(size_t i);
  std::vector<uint64_t> buckets_ = std::vector<uint64_t>(kBuckets + 1, 0);
  uint64_t count_ = 0;
};

struct ClientStats {
  uint64_t calls_submitted = 0;
  uint64_t calls_executed = 0;
  uint64_t memory_in_use = 0;  // bytes reserved for the client's buffers
  uint64_t live_handles = 0;
  uint64_t memory_quota = 0;  // bytes of device memory it may hold (0: no quota)
  uint32_t sms = 0;           // the SM limit asked for it (0: none)
  uint32_t sms_granted = 0;   // the SMs its kernels run on under that limit (0: all of its GPU's)
};

class POSClient;

// A gate the worker passes before each call it executes: posd's GPU-time shares (docs/limits.md)
// wait there for the client's turn of its GPU. `drain(ctx)` finishes the client's queued device
// work (before its turn is handed on). enter's token goes to done() after the call.
class TurnGate {
 public:
  virtual ~TurnGate() = default;
  virtual int enter(void (*drain)(void*), void* ctx) = 0;
  virtual void done(int token) = 0;
};

// How a client is set up at creation.
struct ClientOptions {
  // Host memory the client's calls may name (ParserScope::host_ok); size 0: its own process's.
  uint64_t host_base = 0, host_size = 0;
  // The backend devices the client sees, renumbered 0..k-1 as CUDA_VISIBLE_DEVICES does (its
  // device 1 is devices[1]); its state starts on devices[0] (and follows cudaSetDevice while it
  // holds none: ParserScope::holds_device_state). Empty: every device, as they are.
  std::vector<int32_t> devices;
  // The uuid's generation (uuid = generation << 16 | slot); 0: the workspace's next. A posd session
  // process names its one client after posd's session number, so uuids stay unique across posd.
  uint64_t generation = 0;
  // Its device-memory quota (0: none); kConfigQuota: the workspace's client.memory_quota. posd sets
  // it from posd.limits for the job's name (docs/limits.md).
  static constexpr uint64_t kConfigQuota = UINT64_MAX;
  uint64_t memory_quota = kConfigQuota;
  // The SMs its kernels may run on (0: all): a backend that can confine them (the CUDA backend,
  // with green contexts) does; one that cannot runs it on the whole device (docs/limits.md).
  uint32_t sms = 0;
};

// Parser-thread state handed to parser functions (confined to the parser thread).
struct ParserScope {
  POSClient* client = nullptr;
  const ResourceTable* resources = nullptr;  // the resource types' hooks (holds_device_state)
  std::array<std::unique_ptr<HandleManager>, static_cast<size_t>(ResourceType::kCount)> managers;
  Handle* device = nullptr;
  Handle* context = nullptr;
  Handle* default_stream = nullptr;
  DeviceBackend* device_backend = nullptr;  // for try_reserve / unreserve (thread-safe)
  int32_t current_device = 0;  // the app's number (cudaSetDevice), an index into `devices`
  int32_t device_count = 1;    // = devices.size()
  std::vector<int32_t> devices;  // the app's device i is backend device devices[i]
  // 0 = none. Atomic: `pos-cli limit` changes it from another thread while the parser runs.
  std::atomic<uint64_t> memory_quota{0};
  uint64_t memory_in_use = 0;
  uint64_t va_base = 0, va_size = 0;

  HandleManager& mgr(ResourceType t) { return *managers[static_cast<size_t>(t)]; }
  // The client holds state a move to another device would lose: a live handle its type's pins
  // hook (resource_ops.h) names, such as memory, streams besides the default one, events, cuBLAS
  // handles, a variable written since it was registered, or a function attribute set. Modules,
  // functions and untouched variables are reloaded by a move (their types' move hooks).
  bool holds_device_state();
  // A cudaStream_t from the app: 0 / legacy / per-thread map to the default stream.
  Handle* stream(uint64_t value);
  // A device pointer range [addr, addr+bytes) wholly inside one live buffer of this client.
  Handle* device_range(uint64_t addr, uint64_t bytes, uint64_t* offset);
  bool in_device_range(uint64_t addr) const { return addr >= va_base && addr < va_base + va_size; }
  // Inside the address window of any client of this workspace. Such a value that is not one of
  // this client's live buffers is refused wherever a pointer is expected: it can only be another
  // tenant's memory (or this client's freed memory).
  bool in_pos_window(uint64_t addr) const { return addr >= window_base && addr - window_base < window_size; }
  uint64_t window_base = 0, window_size = 0;
  // Host memory a call may name: with a host window (posd: the session's shared arena, the only
  // memory of the daemon a client may reach) [p, p+n) must lie inside it; without one (in-process:
  // the app's own address space) any non-null pointer outside the POS window.
  bool host_ok(uint64_t p, uint64_t n) const {
    if (host_size != 0) return p >= host_base && n <= host_size && p - host_base <= host_size - n;
    return p != 0 && !in_pos_window(p);
  }
  uint64_t host_base = 0, host_size = 0;
  // The worker's latest asynchronous error (see WorkerScope): cudaGetLastError exchanges it with 0.
  std::atomic<int32_t>* async_error = nullptr;
};

// Worker-thread state handed to worker functions (confined to the worker thread).
struct WorkerScope {
  POSClient* client = nullptr;
  BackendClient* backend = nullptr;
  DeviceBackend* device = nullptr;
  // Latest error of a call that had already returned success to the app. The worker sets it;
  // cudaGetLastError takes it in the parser (ParserScope::async_error), without waiting for the
  // worker, as CUDA reports what is known so far. The message is the worker's, for logs and syncs.
  std::atomic<int32_t>* async_error_code = nullptr;
  std::string async_error_message;
  // Modules, functions and variables the backend has loaded, in registration order (a device
  // move loads them again on the new device).
  std::vector<Handle*> loaded;
  // One pass for all of them (a module may take thousands of functions with it).
  template <typename Gone>
  void forget_loaded(Gone&& gone) {
    std::erase_if(loaded, gone);
  }
  int32_t async_error() const { return async_error_code->load(std::memory_order_acquire); }
  void set_async_error(int32_t code, std::string message) {
    async_error_message = std::move(message);
    async_error_code->store(code, std::memory_order_release);
  }
};

class POSClient {
 public:
  // `device`: the backend device that holds this client's memory, streams and kernels.
  POSClient(uint64_t uuid, uint32_t slot, std::string job_name, const Config& config, DeviceBackend* backend,
            const ApiTable* table, int device = 0);
  ~POSClient();
  POSClient(const POSClient&) = delete;
  POSClient& operator=(const POSClient&) = delete;

  // Before start(): options the parser enforces from the first call.
  void set_options(const ClientOptions& o) {
    ps_.host_base = o.host_base, ps_.host_size = o.host_size;
    ps_.devices = o.devices;
    quota_option_ = o.memory_quota;
    sms_option_ = o.sms;
  }
  // The device-memory quota, changed while the client runs (0: none): allocations past it fail
  // from the next one on; what it holds is kept.
  void set_memory_quota(uint64_t bytes) { ps_.memory_quota.store(bytes, std::memory_order_relaxed); }
  uint64_t memory_quota() const { return ps_.memory_quota.load(std::memory_order_relaxed); }
  // The gate the worker passes before each call (null: none). The gate must outlive the client's
  // worker: clear it only once the client is removed.
  void set_turn_gate(TurnGate* g) { turn_gate_.store(g, std::memory_order_release); }
  // Opens the device state and starts the parser and worker threads.
  Status start();
  // Same, with the state of an image (handles at their addresses, device bytes) instead of an
  // empty client. On error nothing of the client remains. Lazy (options.lazy): the buffers' bytes
  // are loaded after this returns (see RestoreOptions); the image is kept until they all are.
  // The image's pending calls (a stop checkpoint's) are replayed, with their pcs, before this
  // returns the client: each is parsed again and must give the answer the app got (else the
  // restore fails); their execution follows in pc order, before any new call, and an execution
  // error becomes the client's sticky error as for any asynchronous call.
  Status start_restored(std::shared_ptr<const ckpt::ImageReader> image, const RestoreOptions& options);
  // Refuses new calls, waits for in-flight calls and commands, stops threads, frees device state.
  void shutdown();

  // pos_process for this client. Thread-safe (app threads may call concurrently).
  Status submit(const ApiInfo& api, std::span<const Param> params, void* ret_data, uint64_t ret_data_len,
                uint64_t* ret_written);
  // Runs a command at a cut; one at a time per client (a second concurrent one gets kBusy).
  Status run_command(Command& cmd);
  // Takes a checkpoint (see CheckpointRequest); one at a time per client, a second gets kBusy.
  // A client still being restored lazily finishes loading first; if a buffer could not be
  // loaded, the checkpoint is refused with that error (the image would not be the job's state).
  StatusOr<CheckpointResult> checkpoint(CheckpointRequest request);
  // pos-cli migrate's peer switch: descriptors of all of the client's device memory, at a cut
  // (every call before it done on the device). Meant for a client whose job is detached, so that
  // nothing writes the memory while another session copies it. A lazily restored client finishes
  // loading first.
  StatusOr<std::vector<PeerMemory>> export_peer_memory();
  // What an incremental checkpoint against the image in `parent_dir` would store if it were taken
  // now (bytes_stored, bytes_referenced, handles; cut_pc is the next call's number), without a cut
  // and without waiting for the device: pos-cli migrate asks it to tell a pre-copy round that
  // cannot shrink the dirty set before running it. An estimate: the job writes on meanwhile.
  // since_call > 0: the bytes of every buffer written at or after that call instead (rewrites of
  // buffers the parent already left out count too): how much the job writes in a window.
  StatusOr<CheckpointResult> estimate_increment(const std::string& parent_dir, uint64_t since_call = 0);
  // A lazily restored client: waits until every buffer is loaded (the error of one that could
  // not be, if any). Ok at once for any other client. Thread-safe.
  Status wait_restored();
  LazyRestoreStats restore_stats() const;

  uint64_t uuid() const { return uuid_; }
  uint32_t slot() const { return slot_; }
  // The backend device that holds the client's state (it follows cudaSetDevice while the client
  // holds no device state: ParserScope::holds_device_state). Thread-safe.
  int device() const { return device_.load(std::memory_order_acquire); }
  // Worker thread only (cudaSetDevice's worker function): moves the client's device state to
  // backend device `to`: a new device context there, its modules, functions and variables loaded
  // again. If that fails the client stays where it was, and the error says why.
  Status move_device(int to);
  // Worker thread only: cudaSetDevice(to) came after the client held device state (logged once).
  void note_device_stays(int to);
  const std::string& job_name() const { return job_name_; }
  bool active() const { return intake_.is_open(); }
  // A stop checkpoint of this client succeeded: it executes nothing more (restore its image).
  bool stopped() const { return stop_state_.load(std::memory_order_acquire) == kStopped; }
  bool command_in_flight() const { return command_busy_.load(std::memory_order_acquire); }
  ClientStats stats() const;
  const LatencyHistogram& latency() const { return latency_; }
  void clear_latency() { latency_.clear(); }

  // The worker's latest asynchronous error, taken (what cudaGetLastError's parser function does;
  // posd answers a posted cudaGetLastError frame with it directly, without a parser round trip).
  int32_t take_async_error() { return async_error_code_.exchange(0, std::memory_order_acq_rel); }

  // Test hook: hold the worker before its next call (to make "busy" and ordering observable).
  void set_worker_paused(bool paused);

 private:
  // Boost's spsc_queue keeps its two indices 64 bytes apart but is not aligned itself, and the
  // ring's size and buffer pointer follow the consumer's index. Queues declared side by side then
  // share lines: one queue's consumer index with the next one's producer index, so, say, the
  // parser polling the worker's completion queue pulled in a line the worker wrote on every call.
  // Aligned and padded, each queue owns its lines: the producer's index, and the consumer's
  // index with the read-only size and buffer pointer.
  template <typename Base>
  struct alignas(64) LineQueue : Base {
    using Base::Base;
  };
  using Queue = LineQueue<boost::lockfree::spsc_queue<APIContext*>>;
  using CmdQueue = LineQueue<boost::lockfree::spsc_queue<Command*, boost::lockfree::capacity<4>>>;
  static_assert(alignof(Queue) == 64 && sizeof(Queue) % 64 == 0 && alignof(CmdQueue) == 64 &&
                sizeof(CmdQueue) % 64 == 0);

  APIContext* acquire_context();
  void reclaim_contexts();
  void parser_main();
  void worker_main();
  bool parse_popped(APIContext* c);  // parser: a call just taken from the rpc WQ
  bool parse_call(APIContext* c);    // true: handed to the worker
  // ---- stop checkpoints (CheckpointRequest::stop; docs/checkpoint.md, "Stop") ----
  bool intake_while_stopping();        // parser: hold at sync calls; after the seal, refuse all
  bool held_at_sync_call();            // parser: holding, and the next call waits for the worker
  bool stop_needs_parser();            // parser: seal requested, or the job finished
  bool update_stop_phase();            // parser: seal, stop for good, or resume
  void refuse_stopped(APIContext* c);  // parser: answer a call the stopped client will not run
  bool worker_stopped_step();          // worker: hold calls; at the end drop or run them
  void return_unexecuted(APIContext* c);
  Status replay_pending(const ckpt::pb::ClientImage& img);
  void finish_call(APIContext* c);  // parser: after the worker completed c
  // A synchronous call that failed in the worker after its parser created a handle: the parser
  // takes the handle back before the caller gets the verdict (finish_call).
  static bool undoes_create(const APIContext& c);
  void execute_call(APIContext* c);
  void parse_command(Command* cmd);
  void execute_command(Command* cmd);
  Status init_state();
  Status start_threads();
  void record_checkpoint(CheckpointJob& job, uint64_t cut);
  void estimate_at_parser(Command* cmd);  // kEstimate
  Status restore_state(const std::shared_ptr<const ckpt::ImageReader>& image, const RestoreOptions& options);
  void complete_to_rpc(APIContext* c, bool flush = true);
  void flush_completions();
  void flush_worker_completions();
  uint64_t completed() const {
    return completed_.load(std::memory_order_acquire) + worker_completed_.load(std::memory_order_acquire);
  }
  void update_live_handles();
  template <typename Q, typename T>
  void push_blocking(Q& q, T item, Doorbell& wake_consumer, Doorbell& wait_on);

  const uint64_t uuid_;
  const uint32_t slot_;
  const std::string job_name_;
  const std::string log_name_;  // "client 3 (job mlp_train)": the component of its log lines
  std::atomic<int> device_;  // written by the worker (move_device) only
  const Config config_;
  // Delayed first look at a parse verdict (submit): only where every pipeline thread has a core
  // of its own; where cores are scarce the delay would hold the core the parser needs.
  const bool verdict_delay_on_;
  static constexpr uint32_t kMaxVerdictDelay = 64;  // pauses
  DeviceBackend* const backend_;
  const ApiTable* const table_;

  // Queues, one producer and one consumer each; indices live on separate cache lines inside
  // boost's spsc_queue, so producer and consumer do not false-share.
  Queue rpc2parser_wq_, rpc2parser_cq_, parser2worker_wq_, parser2worker_cq_;
  // Worker → submitter: contexts of calls that deleted nothing go back to the pool directly, so
  // the parser's loop is spent on new calls (only deletions need the parser's handle managers).
  Queue worker2rpc_cq_;
  CmdQueue cmd_parser_wq_, cmd_worker_wq_, cmd_worker_cq_;
  Doorbell parser_bell_;  // rpc WQ, worker CQ, command queues
  Doorbell worker_bell_;  // parser → worker WQ, command queue, pause changes
  Doorbell rpc_bell_;     // rpc CQ (contexts coming back), command completions

  // Producer side of rpc2parser_wq_ (guarded by submit_mu_).
  std::mutex submit_mu_;
  uint64_t next_pc_ = 1;                 // guarded by submit_mu_
  // How many `pause`s a submitter lets pass before it first reads a parse verdict (see submit):
  // adapted per call; submitters only (relaxed: several app threads may race, any value is safe).
  std::atomic<uint32_t> verdict_delay_{0};
  std::deque<APIContext*> pool_;         // guarded by submit_mu_ (FIFO: see acquire_context)
  std::vector<APIContext*> unreleased_;  // guarded by submit_mu_: back from CQ, caller still reading
  std::vector<std::unique_ptr<APIContext>> all_contexts_;  // guarded by submit_mu_
  // Open from start_threads until shutdown closes it (under submit_mu_). submit only looks at it:
  // a call's flight is counted by submitted_ / completed_ below, written by three threads on
  // three lines without a locked instruction; holding the gate per call would add two RMWs on a
  // line all of them share. Commands hold it (run_command; a stop checkpoint until its outcome),
  // and shutdown waits them out.
  Gate intake_{false};
  // Counters written by different threads sit on their own cache lines (no false sharing).
  alignas(64) std::atomic<uint64_t> submitted_{0};  // submitter
  alignas(64) std::atomic<uint64_t> completed_{0};  // parser: contexts handed back on rpc2parser_cq_
  alignas(64) std::atomic<uint64_t> worker_completed_{0};  // worker: contexts handed back on worker2rpc_cq_

  std::atomic<bool> command_busy_{false};
  // Command completion lives in the client, not in the Command: the control thread may destroy
  // its Command the moment it sees completion, while the parser is still ringing the bell.
  StateWord command_done_{0};
  uint32_t command_generation_ = 0;  // guarded by command_busy_
  std::atomic<bool> stop_{false};
  std::atomic<bool> worker_paused_{false};
  // Stop checkpoints, as the control side sees them: written under command_busy_ (kStopping, when
  // the stop command is admitted) and by that checkpoint's control thread (its outcome). Commands
  // and checkpoints are refused while it is not kRunning; shutdown waits out kStopping (the stop
  // checkpoint holds intake_ until its outcome).
  enum StopState : uint8_t { kRunning, kStopping, kStopped };
  std::atomic<uint8_t> stop_state_{kRunning};

  // Parser thread state.
  ParserScope ps_;
  uint64_t quota_option_ = ClientOptions::kConfigQuota;  // set_options' memory_quota
  uint32_t sms_option_ = 0;                              // set_options' sms
  std::atomic<uint32_t> sms_granted_{0};                 // the backend client's, after each open
  std::atomic<TurnGate*> turn_gate_{nullptr};
  static void drain_for_turn(void* self);
  uint64_t last_parsed_pc_ = 0;
  std::unordered_set<Handle*> dirty_;  // parser thread
  Command* parser_cmd_ = nullptr;      // parser thread: command waiting for the worker
  uint64_t unflushed_completions_ = 0;  // parser thread: pushed to rpc CQ, not yet counted
  // Parser thread, stop checkpoints: kHolding from the cut (calls that return after parsing are
  // parsed and handed to the worker, which holds them; the first call that waits for the worker
  // stops the intake), kFrozen from the seal (every call is refused), kStopped once the image is
  // durable; back to kNone if the checkpoint fails.
  enum class StopPhase : uint8_t { kNone, kHolding, kFrozen, kStopped };
  StopPhase stop_phase_ = StopPhase::kNone;
  std::shared_ptr<CheckpointJob> parser_stop_job_;
  std::vector<APIContext*> pending_;  // handed to the worker since the cut, in pc order
  uint64_t stop_cut_ = 0;

  // Worker thread state.
  WorkerScope ws_;
  std::unique_ptr<BackendClient> backend_client_;
  Command* worker_cmd_ = nullptr;  // worker thread
  uint64_t worker_unflushed_ = 0;  // worker thread: pushed to worker2rpc_cq_, not yet counted
  std::shared_ptr<CheckpointJob> cow_job_;  // worker thread: an async checkpoint still draining
  std::shared_ptr<CheckpointJob> worker_stop_job_;  // worker thread: a stop checkpoint past its cut
  std::vector<APIContext*> held_;  // worker thread: calls after a stop cut, not run (pc order)
  bool worker_dead_ = false;       // worker thread: a stop checkpoint succeeded; nothing runs again
  bool no_device_ = false;         // worker thread: a failed device move could not even go back
  Status lost_device() const;      // what every call and command of such a client gets
  bool told_device_stays_ = false;  // worker thread: logged that cudaSetDevice did not move state
  uint64_t va_base_ = 0, va_mem_size_ = 0;  // the range the backend client reserves (init_state)
  std::atomic<bool> checkpointing_{false};  // a checkpoint is between request and durable image
  // A lazy restore: set before the threads start, stopped (not freed) at shutdown, so any thread
  // may use it while the client exists. The worker's own pointer goes once nothing is left to do.
  std::shared_ptr<LazyLoader> lazy_;
  LazyLoader* lazy_worker_ = nullptr;  // worker thread
  alignas(64) std::atomic<int32_t> async_error_code_{0};  // ParserScope / WorkerScope async_error
  alignas(64) std::atomic<uint64_t> executed_{0};
  LatencyHistogram latency_;
  std::unique_ptr<CallProfile> profile_;  // POS_PROFILE=1 only; printed at shutdown

  alignas(64) std::atomic<uint64_t> memory_in_use_{0};  // parser: mirror of ps_.memory_in_use for stats
  std::atomic<uint64_t> live_handles_{0};

  std::thread parser_thread_, worker_thread_;
  bool started_ = false;
};

}  // namespace pos
