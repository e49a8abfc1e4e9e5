// client.cc — the per-client pipeline: submit → Rpc2Parser → parser → Parser2Worker → worker → back.
// Contexts are pooled and returned through the completion queues, so steady state allocates nothing.
#include "pos/client.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <unordered_map>

#include "pos/base/log.h"
#include "pos/base/thread.h"

namespace pos {

namespace {
// The lines an ordinary call uses: the submitter's header, parameter sizes and first 72 parameter
// bytes (a launch with up to 24 bytes of kernel parameters), and the parser block's first two
// (status, handles, result size; the edge count and first edge). Bigger calls miss on the rest.
constexpr size_t kSubmitterHotBytes = 3 * 64;
static_assert(offsetof(APIContext, skip_worker) < offsetof(APIContext, status) + 64 &&
                  offsetof(APIContext, edges) == offsetof(APIContext, status) + 64,
              "the fields every call writes must stay on the parser block's first line");
inline void prefetch_parser_block(const APIContext* c, bool for_write) {
  const auto* p = reinterpret_cast<const char*>(c);
  for (size_t off : {offsetof(APIContext, status), offsetof(APIContext, edges)}) {
    if (for_write) prefetch_write(p + off);
    else prefetch_read(p + off);
  }
}
// The worker, for the next queued call while the current one runs: its context was written on
// other cores, and asking for its lines at once lets the misses overlap. When the device keeps
// up, the worker is the pipeline's slowest stage and would otherwise stall once per call.
void prefetch_for_worker(const APIContext* c) {
  const auto* p = reinterpret_cast<const char*>(c);
  for (size_t off = 0; off < kSubmitterHotBytes; off += 64) prefetch_read(p + off);
  prefetch_parser_block(c, false);
}
// The parser, for a call it has just taken: the submitter's block was written on the caller's core
// and the parser's block last on the worker's. Asking for every line at once overlaps the
// transfers, which the parse would otherwise take one after another (measured: docs/BENCHMARKS.md).
void prefetch_for_parser(const APIContext* c, bool state_too) {
  const auto* p = reinterpret_cast<const char*>(c);
  for (size_t off = 0; off < kSubmitterHotBytes; off += 64) prefetch_read(p + off);
  prefetch_parser_block(c, true);
  // The verdict's line, when its caller does not poll it straight away (submit).
  if (state_too) prefetch_write(p + offsetof(APIContext, state));
}
}  // namespace

// ---------------- LatencyHistogram ----------------
uint64_t LatencyHistogram::bucket_upper_ns(size_t i) {
  if (i < kFine) return (i + 1) * kBucketNs;
  return kFine * kBucketNs + (i - kFine + 1) * kCoarseNs;
}
void LatencyHistogram::record(uint64_t ns) {
  const uint64_t fine_end = kFine * kBucketNs;
  const size_t b = ns < fine_end ? ns / kBucketNs : std::min<uint64_t>(kFine + (ns - fine_end) / kCoarseNs, kBuckets);
  ++buckets_[b];
  ++count_;
}
uint64_t LatencyHistogram::percentile_ns(double p) const {
  if (count_ == 0) return 0;
  const uint64_t target = static_cast<uint64_t>(p * static_cast<double>(count_ - 1)) + 1;
  uint64_t acc = 0;
  for (size_t i = 0; i <= kBuckets; ++i) {
    acc += buckets_[i];
    if (acc >= target) return bucket_upper_ns(i);  // upper edge: never under-reports
  }
  return bucket_upper_ns(kBuckets);
}
void LatencyHistogram::clear() {
  std::fill(buckets_.begin(), buckets_.end(), 0);
  count_ = 0;
}

std::string_view edge_kind_name(EdgeKind k) {
  switch (k) {
    case EdgeKind::kIn: return "in";
    case EdgeKind::kOut: return "out";
    case EdgeKind::kInOut: return "inout";
    case EdgeKind::kCreate: return "create";
    case EdgeKind::kDelete: return "delete";
  }
  return "?";
}

// ---------------- ParserScope ----------------
Handle* ParserScope::stream(uint64_t value) {
  if (value == 0 || value == cuda::kStreamLegacy || value == cuda::kStreamPerThread) return default_stream;
  return mgr(ResourceType::kStream).get(value);
}

Handle* ParserScope::device_range(uint64_t addr, uint64_t bytes, uint64_t* offset) {
  uint64_t off = 0;
  Handle* h = mgr(ResourceType::kMemory).find_containing(addr, &off);
  if (h == nullptr) {
    h = mgr(ResourceType::kVar).find_containing(addr, &off);
    if (h == nullptr) return nullptr;
  }
  if (bytes > h->size - off) return nullptr;
  if (offset != nullptr) *offset = off;
  return h;
}

// ---------------- POSClient ----------------
POSClient::POSClient(uint64_t uuid, uint32_t slot, std::string job_name, const Config& config,
                     DeviceBackend* backend, const ApiTable* table, int device)
    : uuid_(uuid),
      slot_(slot),
      job_name_(std::move(job_name)),
      log_name_(client_component(uuid, job_name_)),
      device_(device),
      config_(config),
      verdict_delay_on_(config.spin_ns > 0 && (config.delayed_verdict == VerdictLook::kDelayed ||
                                                (config.delayed_verdict == VerdictLook::kAuto && !cores_are_scarce()))),
      backend_(backend),
      table_(table),
      rpc2parser_wq_(config.queue_depth),
      rpc2parser_cq_(config.queue_depth * 2),
      parser2worker_wq_(config.queue_depth),
      parser2worker_cq_(config.queue_depth * 2),
      worker2rpc_cq_(config.queue_depth * 2) {
  if (CallProfile::enabled_by_env()) profile_ = std::make_unique<CallProfile>();
}

POSClient::~POSClient() { shutdown(); }

Status POSClient::start() {
  POS_RETURN_IF_ERROR(init_state());
  // The device, its context and the legacy default stream exist from the start (DAG roots).
  ps_.device = ps_.mgr(ResourceType::kDevice).allocate_mocked_resource(0, {}, 0).value();
  ps_.context = ps_.mgr(ResourceType::kContext).allocate_mocked_resource(0, {ps_.device}, 0).value();
  ps_.default_stream = ps_.mgr(ResourceType::kStream).allocate_mocked_resource(0, {ps_.context}, 0).value();
  ps_.default_stream->backend_obj = 0;
  return start_threads();
}

Status POSClient::start_restored(std::shared_ptr<const ckpt::ImageReader> image, const RestoreOptions& options) {
  POS_RETURN_IF_ERROR(init_state());
  Status s = restore_state(image, options);
  if (s.ok()) s = start_threads();  // fails only if the kernel refuses a thread
  if (!s.ok()) {
    // Nothing of the half-built client survives: its device state and reservations go.
    if (lazy_) lazy_->stop();
    lazy_.reset();
    backend_client_.reset();
    for (ResourceType t : {ResourceType::kMemory, ResourceType::kVar})
      ps_.mgr(t).for_each([&](Handle* h) { backend_->unreserve(h->charged); });
    return s;
  }
  s = replay_pending(image->client());
  if (!s.ok()) {
    shutdown();  // nobody has seen the client: its calls and device state go
    return s;
  }
  return Status::Ok();
}

Status POSClient::init_state() {
  const uint64_t base = config_.va_base + static_cast<uint64_t>(slot_) * config_.va_size;
  // The top eighth of the range holds opaque handle values (streams, events, ...); the rest is
  // device memory. Distinct per client, so one client's values never name another's resources.
  const uint64_t mem_size = config_.va_size / 8 * 7;
  const uint64_t gran = backend_->granularity();
  va_base_ = base, va_mem_size_ = mem_size;
  auto bc = backend_->open_client(base, mem_size, device_.load(), sms_option_);
  if (!bc.ok()) return bc.status().with_context("opening device state");
  backend_client_ = std::move(bc.value());
  sms_granted_.store(backend_client_->sms_granted(), std::memory_order_relaxed);

  ps_.client = this;
  ps_.resources = &table_->resources();
  ps_.device_backend = backend_;
  ps_.va_base = base;
  ps_.va_size = mem_size;
  if (ps_.devices.empty()) {  // every device, as it is
    for (int d = 0; d < backend_->device_count(); ++d) ps_.devices.push_back(d);
  }
  ps_.device_count = static_cast<int32_t>(ps_.devices.size());
  ps_.memory_quota = quota_option_ != ClientOptions::kConfigQuota ? quota_option_ : config_.memory_quota;
  ps_.window_base = config_.va_base;
  ps_.window_size = config_.va_size * config_.max_clients;
  const uint64_t opaque = base + mem_size;
  const uint64_t per_type =
      (config_.va_size - mem_size) / static_cast<uint64_t>(ResourceType::kCount) / 16 * 16;
  for (size_t t = 0; t < static_cast<size_t>(ResourceType::kCount); ++t) {
    const auto type = static_cast<ResourceType>(t);
    if (type == ResourceType::kMemory) {
      // Vars share the memory range (they are device memory too), from its top 1/16.
      ps_.managers[t] = std::make_unique<HandleManager>(type, base, mem_size / 16 * 15, gran);
    } else if (type == ResourceType::kVar) {
      ps_.managers[t] = std::make_unique<HandleManager>(type, base + mem_size / 16 * 15, mem_size / 16, gran);
    } else {
      ps_.managers[t] = std::make_unique<HandleManager>(type, opaque + t * per_type, per_type, 1);
    }
  }
  ws_.client = this;
  ws_.async_error_code = &async_error_code_;
  ps_.async_error = &async_error_code_;
  ws_.backend = backend_client_.get();
  ws_.device = backend_;
  return Status::Ok();
}

// A thread the kernel refuses (`ulimit -u`, memory) fails the client's creation, not the process:
// posd refuses that one session. The parser, if it started, is stopped again; the client was never
// published, and its destructor frees its device state.
Status POSClient::start_threads() {
  const uint64_t base = ps_.va_base, mem_size = ps_.va_size;
  intake_.reopen();
  // Named for `top -H`, `perf` and `ps -L` (slot = the client's uuid & 0xffff).
  Status s = start_thread(&parser_thread_, "the client's parser thread", [this] {
    name_this_thread(("pos-parse-" + std::to_string(slot_)).c_str());
    parser_main();
  });
  if (s.ok()) {
    s = start_thread(&worker_thread_, "the client's worker thread", [this] {
      name_this_thread(("pos-work-" + std::to_string(slot_)).c_str());
      worker_main();
    });
    if (!s.ok()) {
      stop_.store(true, std::memory_order_release);
      parser_bell_.ring();
      parser_thread_.join();
    }
  }
  if (!s.ok()) {
    intake_.close();
    return s;
  }
  started_ = true;
  POS_INFO(log_name_, "started on device %d, device range 0x%lx + 0x%lx", device_.load(), (unsigned long)base,
           (unsigned long)mem_size);
  return Status::Ok();
}

void POSClient::shutdown() {
  if (!started_) return;
  {
    // Under submit_mu_: a submitter that got past the gate has counted its call in submitted_.
    std::lock_guard<std::mutex> lk(submit_mu_);
    intake_.close();
  }
  worker_paused_.store(false);
  worker_bell_.ring();
  // Drain: no command is in flight and a stop checkpoint has its outcome (they hold the gate; a
  // seal needs the parser, which runs until stop_), and every submitted call is back on the rpc CQ.
  intake_.wait_drained(config_.spin_ns);
  spin_then_block(rpc_bell_, config_.spin_ns,
                  [&] { return completed() == submitted_.load(std::memory_order_acquire); });
  stop_.store(true, std::memory_order_release);
  parser_bell_.ring();
  worker_bell_.ring();
  parser_thread_.join();
  worker_thread_.join();
  // A checkpoint still draining reads this client's device memory (a dump whose job ended right
  // after its cut: CRIU ends it while the bytes drain): its image is finished before the memory goes.
  while (checkpointing_.load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (lazy_) lazy_->stop();  // its copiers belong to the backend client
  if (backend_client_) {
    Status s = backend_client_->synchronize_all();
    if (!s.ok()) POS_WARN(log_name_, "final synchronize: %s", s.to_string().c_str());
    backend_client_.reset();  // frees all device memory and objects of this client
  }
  // Give back the device-wide reservations of every buffer still held (threads are stopped).
  for (ResourceType t : {ResourceType::kMemory, ResourceType::kVar}) {
    if (!ps_.managers[static_cast<size_t>(t)]) continue;
    ps_.mgr(t).for_each([&](Handle* h) { backend_->unreserve(h->charged); });
  }
  started_ = false;
  if (profile_) {
    const std::string t = "client " + std::to_string(uuid_) + " (" + job_name_ + ")";
    std::fputs(profile_->report(t).c_str(), stderr);
  }
  POS_INFO(log_name_, "stopped after %lu calls", (unsigned long)executed_.load());
}

ClientStats POSClient::stats() const {
  ClientStats s;
  s.calls_submitted = submitted_.load();
  s.calls_executed = executed_.load();
  s.memory_in_use = memory_in_use_.load();
  s.live_handles = live_handles_.load();
  s.memory_quota = memory_quota();
  s.sms = sms_option_;
  s.sms_granted = sms_granted_.load(std::memory_order_relaxed);
  return s;
}

void POSClient::set_worker_paused(bool paused) {
  worker_paused_.store(paused, std::memory_order_release);
  worker_bell_.ring();
}

template <typename Q, typename T>
void POSClient::push_blocking(Q& q, T item, Doorbell& wake_consumer, Doorbell& wait_on) {
  // Back-pressure: a full queue means the consumer is behind; wait for it to make room.
  while (!q.push(item)) {
    wake_consumer.ring();
    spin_then_block(wait_on, config_.spin_ns, [&] { return q.write_available() > 0 || stop_.load(); });
  }
  wake_consumer.ring();
}

// client_checkpoint.cc uses both; an optimizing build may inline every use here and emit neither.
template void POSClient::push_blocking(Queue&, APIContext*, Doorbell&, Doorbell&);
template void POSClient::push_blocking(CmdQueue&, Command*, Doorbell&, Doorbell&);

void POSClient::reclaim_contexts() {
  // Contexts come back on the rpc CQ; one whose caller is still reading its result waits.
  for (auto it = unreleased_.begin(); it != unreleased_.end();) {
    if ((*it)->caller_released.load(std::memory_order_acquire)) {
      (*it)->recycle();
      pool_.push_back(*it);
      it = unreleased_.erase(it);
    } else {
      ++it;
    }
  }
  APIContext* c = nullptr;
  for (Queue* q : {&worker2rpc_cq_, &rpc2parser_cq_}) {
    while (q->pop(c)) {
      if (c->caller_released.load(std::memory_order_acquire)) {
        c->recycle();
        pool_.push_back(c);
      } else {
        unreleased_.push_back(c);
      }
    }
  }
}

APIContext* POSClient::acquire_context() {
  // Contexts rotate first-in first-out through a pool of at least kMinContexts: a context is
  // reused long after the parser and worker last touched it, and the pool is refilled in batches
  // (recycled together, so the next few calls find their contexts in this core's cache).
  constexpr size_t kMinContexts = 96, kRefillBelow = 32;
  const size_t limit = static_cast<size_t>(config_.queue_depth) * 2;
  for (;;) {
    if (pool_.size() < kRefillBelow) reclaim_contexts();
    if (all_contexts_.size() < std::min(kMinContexts, limit) || (pool_.empty() && all_contexts_.size() < limit)) {
      all_contexts_.push_back(std::make_unique<APIContext>());
      return all_contexts_.back().get();
    }
    if (!pool_.empty()) {
      APIContext* c = pool_.front();
      pool_.pop_front();
      return c;
    }
    // Everything is in flight: wait for the pipeline to hand one back.
    spin_then_block(rpc_bell_, config_.spin_ns,
                    [&] { return rpc2parser_cq_.read_available() > 0 || worker2rpc_cq_.read_available() > 0; });
  }
}

Status POSClient::submit(const ApiInfo& api, std::span<const Param> params, void* ret_data, uint64_t ret_data_len,
                         uint64_t* ret_written) {
  if (ret_written != nullptr) *ret_written = 0;
  const uint64_t t_profile = profile_ ? now_ns() : 0;
  APIContext* c = nullptr;
  uint32_t target = 0;
  {
    std::lock_guard<std::mutex> lk(submit_mu_);
    if (!intake_.is_open()) return Status::Unavailable("client " + std::to_string(uuid_) + " is not active");
    c = acquire_context();
    c->api_id = api.id;
    c->info = &api;
    c->client_uuid = uuid_;
    c->pc = next_pc_++;
    c->set_params(params);
    c->t_submit_ns = config_.record_latency ? now_ns() : 0;
    target = api.mode == ReturnMode::kParse ? kParsed : kDone;
    // Only submitters (under submit_mu_) write it: a plain store, no locked instruction.
    submitted_.store(submitted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    push_blocking(rpc2parser_wq_, c, parser_bell_, rpc_bell_);
  }
  uint32_t seen = 0;
  if (target == kParsed && verdict_delay_on_) {
    // A line the caller polls must be taken back by the parser's verdict store and then fetched
    // again: two transfers on the call's critical path. Not polling until the verdict is probably
    // there makes it one (the parser asks for the line as soon as it takes the call). The delay
    // adapts so that about four calls in five find their verdict at the first look.
    uint32_t k = verdict_delay_.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < k; ++i) cpu_relax();
    const bool there = c->state.at_least(c->state_base + target, &seen);
    verdict_delay_.store(there ? (k > 0 ? k - 1 : 0) : std::min<uint32_t>(k + 4, kMaxVerdictDelay),
                         std::memory_order_relaxed);
    if (!there) seen = c->state.wait_at_least(c->state_base + target, config_.spin_ns);
  } else {
    seen = c->state.wait_at_least(c->state_base + target, target == kDone ? config_.sync_spin_ns : config_.spin_ns);
  }
  // Read the status (a line the parser or worker wrote) only for a call that failed.
  Status s = c->failed(seen) ? c->status : Status();
  if (s.ok() && ret_data_len > 0 && c->ret_size > 0) {
    if (c->ret_size > ret_data_len) {
      s = Status::InvalidArgument("result needs " + std::to_string(c->ret_size) + " bytes, buffer has " +
                                  std::to_string(ret_data_len));
    } else {
      std::memcpy(ret_data, c->ret.data(), c->ret_size);
      if (ret_written != nullptr) *ret_written = c->ret_size;
    }
  }
  // The context may be reused once the caller is done with it and it is back from the pipeline
  // (a kParse call may still be executing on the worker now).
  c->caller_released.store(true, std::memory_order_release);
  if (profile_) profile_->add_submit(static_cast<uint32_t>(api.id), now_ns() - t_profile);
  return s;
}

Status POSClient::run_command(Command& cmd) {
  // In flight until it returns: shutdown waits for a command it let in (the parser runs it).
  Gate::Holder in_flight(intake_);
  if (!in_flight) return Status::Unavailable("client " + std::to_string(uuid_) + " is not active");
  if (command_busy_.exchange(true, std::memory_order_acq_rel))
    return Status::Busy("client " + std::to_string(uuid_) + " already has a command in flight");
  // A stopped client (or one being stopped) runs no call past its cut, so it takes no other cut.
  const uint8_t st = stop_state_.load(std::memory_order_acquire);
  if (st != kRunning) {
    command_busy_.store(false, std::memory_order_release);
    return st == kStopped ? Status::FailedPrecondition("client " + std::to_string(uuid_) +
                                                       " was stopped by a checkpoint: it runs nothing more (restore its image)")
                          : Status::Busy("client " + std::to_string(uuid_) + " is being stopped by a checkpoint");
  }
  const bool stop = cmd.type == CommandType::kCheckpoint && cmd.job && cmd.job->request().stop;
  if (stop) stop_state_.store(kStopping, std::memory_order_release);
  cmd.status = Status();
  cmd.dirty.clear();
  const uint32_t gen = ++command_generation_;
  cmd.generation = gen;
  // Single producer: command_busy_ admits one control thread at a time.
  push_blocking(cmd_parser_wq_, &cmd, parser_bell_, rpc_bell_);
  command_done_.wait_at_least(gen, config_.spin_ns);
  // A stop that failed at the cut never started: the parser has resumed already.
  if (stop && !cmd.status.ok()) stop_state_.store(kRunning, std::memory_order_release);
  command_busy_.store(false, std::memory_order_release);
  return cmd.status;
}

StatusOr<CheckpointResult> POSClient::checkpoint(CheckpointRequest request) {
  if (checkpointing_.exchange(true, std::memory_order_acq_rel))
    return Status::Busy("client " + std::to_string(uuid_) + " is already being checkpointed");
  struct Clear {
    std::atomic<bool>* f;
    ~Clear() { f->store(false, std::memory_order_release); }
  } clear{&checkpointing_};
  if (lazy_ && !request.lazy_ok) {
    Status loaded = lazy_->wait();
    if (!loaded.ok())
      return loaded.with_context("checkpoint of client " + std::to_string(uuid_) +
                                 " refused: its lazy restore did not load every buffer");
  }
  if (stop_state_.load(std::memory_order_acquire) == kStopped)
    return Status::FailedPrecondition("client " + std::to_string(uuid_) +
                                      " was stopped by a checkpoint: it runs nothing more (restore its image)");
  auto job = std::make_shared<CheckpointJob>(std::move(request), backend_);
  POS_RETURN_IF_ERROR(job->prepare(config_.shadow_pool_bytes, device()));
  // Async: a backend that keeps shadows grows their pool now, before the cut, rather than on the
  // worker while the job's calls wait (the first tick's). At most the shadow bound: the job's
  // memory, the asked bound, half the free memory. (A client with memory has device state, so
  // the worker does not replace its backend client meanwhile: move_device is for clients without.)
  if (job->request().mode == CheckpointMode::kAsync && !job->request().peer && !job->request().stop) {
    uint64_t want = memory_in_use_.load(std::memory_order_relaxed);
    if (job->shadow_limit() != 0) want = std::min(want, job->shadow_limit());
    MemInfo mi{};
    want = backend_->mem_info(device(), &mi).ok() ? std::min(want, mi.free / 2) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t grown = want > 0 ? backend_client_->reserve_shadows(want) : 0;
    if (grown > 0)
      POS_INFO(log_name_, "copy-on-write shadows reserved ahead of the first cut: %.1f MB in %.3f s", grown / 1e6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const bool stop = job->request().stop;
  // The drainer wakes the parser (seal) and the worker (outcome); it never blocks on them.
  if (stop) job->set_wake([this] {
    parser_bell_.ring();
    worker_bell_.ring();
  });
  Command cmd;
  cmd.type = CommandType::kCheckpoint;
  cmd.job = job;
  // A stop is in flight until its outcome below (shutdown waits for it: the seal needs the
  // parser). A closed gate refuses run_command too, with the same answer.
  Gate::Holder in_flight(intake_);
  Status s = run_command(cmd);
  if (!s.ok()) return s.with_context("checkpoint of client " + std::to_string(uuid_));
  if (!stop) in_flight.leave();  // an ordinary checkpoint's drain does not hold shutdown up
  StatusOr<CheckpointResult> r = job->wait();
  if (stop) {
    if (r.ok()) {
      POS_INFO(log_name_, "stopped at cut %lu; %lu pending calls are in the image", (unsigned long)r->cut_pc,
               (unsigned long)r->pending_calls);
    } else {
      POS_WARN(log_name_, "stop checkpoint failed (%s); the client runs on", r.status().to_string().c_str());
    }
    stop_state_.store(r.ok() ? kStopped : kRunning, std::memory_order_release);
  }
  return r;
}

StatusOr<CheckpointResult> POSClient::estimate_increment(const std::string& parent_dir, uint64_t since_call) {
  auto parent = ckpt::ImageReader::open_dir(parent_dir);
  if (!parent.ok()) return parent.status().with_context("parent image " + parent_dir);
  Command cmd;
  cmd.type = CommandType::kEstimate;
  cmd.parent = parent->get();
  cmd.since_pc = since_call;
  Status s = run_command(cmd);
  if (!s.ok()) return s.with_context("estimate of client " + std::to_string(uuid_));
  CheckpointResult r;
  r.cut_pc = cmd.cut_pc;
  r.bytes_stored = cmd.bytes, r.bytes_referenced = cmd.referenced, r.handles = cmd.handles;
  return r;
}

Status POSClient::wait_restored() { return lazy_ ? lazy_->wait() : Status::Ok(); }

LazyRestoreStats POSClient::restore_stats() const { return lazy_ ? lazy_->stats() : LazyRestoreStats{}; }

// ---------------- parser thread ----------------
// The idle parser's spin (see parser_main): the clock every 1024 polls, a yield where cores are
// scarce or every 8th time.
constexpr SpinShape kParserIdleSpin{0, 1024, 8};

void POSClient::parser_main() {
  for (;;) {
    bool progressed = false;
    APIContext* c = nullptr;
    if (stop_phase_ != StopPhase::kNone) progressed = update_stop_phase();  // may resume
    if (stop_phase_ == StopPhase::kNone) {
      // New calls first: their callers are waiting; completions only recycle contexts.
      for (int i = 0; i < 64 && rpc2parser_wq_.pop(c); ++i) {
        progressed = true;
        prefetch_for_parser(c, verdict_delay_on_);
        parse_popped(c);
      }
    } else {
      progressed |= intake_while_stopping();
    }
    while (parser2worker_cq_.pop(c)) {
      progressed = true;
      finish_call(c);
    }
    flush_completions();
    Command* cmd = nullptr;
    if (cmd_worker_cq_.pop(cmd)) {
      progressed = true;
      parser_cmd_ = nullptr;
      if (parser_stop_job_ != nullptr && cmd->job == parser_stop_job_ && !cmd->status.ok()) {
        // The stop failed at the cut (the drainer never started): the client runs on.
        stop_phase_ = StopPhase::kNone;
        parser_stop_job_.reset();
        pending_.clear();
      }
      command_done_.set(static_cast<uint32_t>(cmd->generation));  // cmd may be gone right after
    }
    if (parser_cmd_ == nullptr && cmd_parser_wq_.pop(cmd)) {
      progressed = true;
      parse_command(cmd);
    }
    if (progressed) continue;
    if (stop_.load(std::memory_order_acquire)) return;
    auto anything = [&] {
      return (rpc2parser_wq_.read_available() > 0 && !held_at_sync_call()) || parser2worker_cq_.read_available() > 0 ||
             cmd_worker_cq_.read_available() > 0 ||
             (parser_cmd_ == nullptr && cmd_parser_wq_.read_available() > 0) || stop_needs_parser() || stop_.load();
    };
    // Spin mostly on the queue a waiting caller fills: the completion queue's index is written by
    // the busy worker, and reading it on every poll would delay noticing a new call, so every
    // queue is looked at only every 16th poll. The spin budget is read at the first round's end,
    // not before the first poll: it reads counters the submitter and worker write (two transfers)
    // and the clock, and the next call usually arrives before then. A call in flight makes it
    // sync_spin_ns: the next call follows the current one's completion closely.
    uint32_t polls = 0;
    spin_wait<kParserIdleSpin>(
        [&] {
          return submitted_.load(std::memory_order_relaxed) != completed() ? config_.sync_spin_ns : config_.spin_ns;
        },
        [&] {
          if (stop_phase_ == StopPhase::kNone && rpc2parser_wq_.read_available() > 0) return true;
          return (++polls & 15) == 0 && anything();
        });
    spin_then_block(parser_bell_, 0, anything);  // exact check, then sleep if still nothing
  }
}

void POSClient::complete_to_rpc(APIContext* c, bool flush) {
  // rpc2parser_cq_ has room for every context that exists (2 x depth), so this never waits.
  while (!rpc2parser_cq_.push(c)) cpu_relax();
  ++unflushed_completions_;
  if (flush) flush_completions();
}

void POSClient::flush_completions() {
  // One counter update and one ring per batch: the submitter waits on rpc_bell_ only when every
  // context is in flight (and shutdown when draining), so a batch is soon enough.
  if (unflushed_completions_ == 0) return;
  completed_.fetch_add(unflushed_completions_, std::memory_order_release);
  unflushed_completions_ = 0;
  rpc_bell_.ring();
}

void POSClient::flush_worker_completions() {
  if (worker_unflushed_ == 0) return;
  // Only the worker writes it: a plain store, no locked instruction.
  worker_completed_.store(worker_completed_.load(std::memory_order_relaxed) + worker_unflushed_,
                          std::memory_order_release);
  worker_unflushed_ = 0;
  rpc_bell_.ring();
}

bool POSClient::parse_popped(APIContext* c) {
  // An allocation may reuse the range of a free the caller has already seen complete: apply
  // completions first. Other calls parse at once (the hot path stays short).
  if (c->api_id == ApiId::kMalloc || c->api_id == ApiId::kRegisterVar) {
    APIContext* done = nullptr;
    while (parser2worker_cq_.pop(done)) finish_call(done);
    flush_completions();
  }
  return parse_call(c);
}

bool POSClient::parse_call(APIContext* c) {
  last_parsed_pc_ = c->pc;
  c->begin_parse();
  const ApiFunctions& f = table_->get(c->api_id);
  const uint64_t t_profile = profile_ ? now_ns() : 0;
  Status s = f.parse != nullptr ? f.parse(ps_, *c)
                                : Status::Unsupported(std::string(c->info->name) + " has no parser function");
  if (profile_) profile_->add_parse(static_cast<uint32_t>(c->api_id), now_ns() - t_profile);
  if (!s.ok()) {
    POS_DEBUG(log_name_, "pc %lu %.*s: %s", (unsigned long)c->pc, (int)c->info->name.size(), c->info->name.data(),
              s.to_string().c_str());
    c->status = s.with_context(c->info->name);
    c->skip_worker = true;
    c->advance(kDone);
    complete_to_rpc(c);
    return false;
  }
  // The caller of a parse-returnable call may go on now; the bookkeeping below is ours alone.
  if (c->info->mode == ReturnMode::kParse && !c->skip_worker) c->advance(kParsed);
  // DAG bookkeeping: writers bump versions and enter the dirty set (incremental checkpoints and
  // migration pre-copy read it).
  bool created = false;
  for (size_t i = 0; i < c->edges.size(); ++i) {
    Edge& e = c->edges[i];
    created |= e.kind == EdgeKind::kCreate;
    if (e.kind == EdgeKind::kOut || e.kind == EdgeKind::kInOut || e.kind == EdgeKind::kCreate) {
      e.handle->version = c->pc;
      if (!e.handle->dirty) {
        e.handle->dirty = true;
        dirty_.insert(e.handle);
      }
    }
  }
  if (memory_in_use_.load(std::memory_order_relaxed) != ps_.memory_in_use)
    memory_in_use_.store(ps_.memory_in_use, std::memory_order_relaxed);
  if (created) update_live_handles();
  if (c->skip_worker) {  // nothing for the device to do (e.g. cudaMalloc(0))
    executed_.fetch_add(1, std::memory_order_relaxed);
    c->advance(kDone);
    complete_to_rpc(c);
    return false;
  }
  push_blocking(parser2worker_wq_, c, worker_bell_, parser_bell_);
  return true;
}

bool POSClient::undoes_create(const APIContext& c) {
  if (c.status.ok() || c.info->mode != ReturnMode::kSync) return false;
  for (size_t i = 0; i < c.edges.size(); ++i)
    if (c.edges[i].kind == EdgeKind::kCreate) return true;
  return false;
}

void POSClient::finish_call(APIContext* c) {
  // Deleted handles become reusable only now that the worker has really destroyed them.
  bool released = false;
  const bool undo = undoes_create(*c);
  for (size_t i = 0; i < c->edges.size(); ++i) {
    const Edge& e = c->edges[i];
    if (e.kind != EdgeKind::kDelete && !(undo && e.kind == EdgeKind::kCreate)) continue;
    released = true;
    dirty_.erase(e.handle);
    HandleManager& mgr = ps_.mgr(e.handle->type);
    if (e.kind == EdgeKind::kCreate) mgr.mark_deleted(e.handle);  // the failed call's own handle
    if (e.handle->type == ResourceType::kMemory || e.handle->type == ResourceType::kVar)
      backend_->unreserve(e.handle->charged);
    if (e.handle->type == ResourceType::kMemory && e.kind == EdgeKind::kCreate) {
      ps_.memory_in_use -= e.handle->charged;
      memory_in_use_.store(ps_.memory_in_use, std::memory_order_relaxed);
    }
    mgr.release(e.handle);
  }
  if (released) update_live_handles();
  if (undo) c->advance(kDone);  // the worker left the verdict to this point (execute_call)
  complete_to_rpc(c, false);
}

bool ParserScope::holds_device_state() {
  // Each type's pins hook decides (pos/cuda_impl/resource_hooks.cc): memory, events, cuBLAS
  // handles and streams besides the default one always pin; a variable once written, a function
  // with an attribute set.
  for (size_t t = 0; t < kResourceTypeCount; ++t) {
    const PinsFn pins = resources->get(static_cast<ResourceType>(t)).pins;
    if (managers[t]->any_active([&](const Handle& h) { return pins(*this, h); })) return true;
  }
  return false;
}

Status POSClient::move_device(int to) {
  const int from = device_.load(std::memory_order_relaxed);
  if (to == from || no_device_) return Status::Ok();
  if (cow_job_ != nullptr || lazy_worker_ != nullptr || worker_stop_job_ != nullptr)
    return Status(Code::kBusy, cuda::kErrorNotPermitted,
                  "cannot move to device " + std::to_string(to) + " while a checkpoint or lazy restore runs");
  POS_RETURN_IF_ERROR(backend_client_->synchronize_all());
  // A backend client reserves the client's address range, so the old one goes first. Types in
  // enum order move parents first (modules before their functions and variables); each handle the
  // worker has loaded is made again by its type's move hook (pos/cuda_impl/resource_hooks.cc).
  const ResourceTable& types = table_->resources();
  auto open_on = [&](int device, std::unique_ptr<BackendClient>* out) -> Status {
    auto bc = backend_->open_client(va_base_, va_mem_size_, device, sms_option_);
    if (!bc.ok()) return bc.status();
    MoveScope scope{**bc, device, {}};
    for (size_t t = 0; t < kResourceTypeCount; ++t) {
      const MoveFn move = types.get(static_cast<ResourceType>(t)).move;
      for (Handle* h : ws_.loaded)
        if (static_cast<size_t>(h->type) == t) POS_RETURN_IF_ERROR(move(scope, h));
    }
    for (Handle* h : ws_.loaded)
      if (auto it = scope.objs.find(h); it != scope.objs.end()) h->backend_obj = it->second;
    *out = std::move(bc.value());
    return Status::Ok();
  };
  ws_.backend = nullptr;
  backend_client_.reset();
  std::unique_ptr<BackendClient> moved;
  Status s = open_on(to, &moved);
  if (s.ok()) {
    backend_client_ = std::move(moved);
    ws_.backend = backend_client_.get();
    sms_granted_.store(backend_client_->sms_granted(), std::memory_order_relaxed);
    device_.store(to, std::memory_order_release);
    POS_INFO(log_name_, "moved to device %d (cudaSetDevice before any device state)", to);
    return Status::Ok();
  }
  moved.reset();
  Status back = open_on(from, &moved);
  if (!back.ok()) {
    no_device_ = true;
    return Status(Code::kUnavailable, cuda::kErrorDevicesUnavailable,
                  "moving to device " + std::to_string(to) + " failed (" + s.message() +
                      "), and so did going back to device " + std::to_string(from) + " (" + back.message() + ")");
  }
  backend_client_ = std::move(moved);
  ws_.backend = backend_client_.get();
  return s.with_context("the job stays on device " + std::to_string(from) + ": moving to device " + std::to_string(to));
}

Status POSClient::lost_device() const {
  return Status(Code::kUnavailable, cuda::kErrorDevicesUnavailable,
                "client " + std::to_string(uuid_) + " lost its device state in a failed device move");
}

StatusOr<std::vector<PeerMemory>> POSClient::export_peer_memory() {
  if (lazy_) POS_RETURN_IF_ERROR(lazy_->wait().with_context("its lazy restore did not load every buffer"));
  Command cmd;
  cmd.type = CommandType::kExportMemory;
  POS_RETURN_IF_ERROR(run_command(cmd).with_context("handing out the device memory of client " + std::to_string(uuid_)));
  return std::move(cmd.peer);
}

void POSClient::note_device_stays(int to) {
  if (told_device_stays_) return;
  told_device_stays_ = true;
  POS_INFO(log_name_,
           "cudaSetDevice to device %d after the job holds device state: its memory, streams "
           "and kernels stay on device %d (POS keeps a job on one device; select it before allocating)",
           to, device());
}

void POSClient::update_live_handles() {
  uint64_t live = 0;
  for (auto& m : ps_.managers) live += m->active_count();
  live_handles_.store(live, std::memory_order_relaxed);
}

void POSClient::parse_command(Command* cmd) {
  // A command after a stop checkpoint comes only once that checkpoint failed: resume first.
  if (parser_stop_job_ != nullptr) (void)update_stop_phase();
  cmd->cut_pc = last_parsed_pc_ + 1;
  if (cmd->type == CommandType::kEstimate) {
    // Parser-owned metadata only: answered here, nothing waits for the worker or the device.
    estimate_at_parser(cmd);
    command_done_.set(static_cast<uint32_t>(cmd->generation));  // cmd may be gone right after
    return;
  }
  if (cmd->type == CommandType::kCollectDirty) {
    cmd->dirty.reserve(dirty_.size());
    for (Handle* h : dirty_) {
      cmd->dirty.push_back(DirtyRecord{h->id, h->type, h->client_addr, h->size, h->version});
      h->dirty = false;
    }
    dirty_.clear();
    std::sort(cmd->dirty.begin(), cmd->dirty.end(),
              [](const DirtyRecord& a, const DirtyRecord& b) { return a.handle_id < b.handle_id; });
  }
  if (cmd->type == CommandType::kCheckpoint) {
    record_checkpoint(*cmd->job, cmd->cut_pc);
    if (cmd->job->request().stop) {
      // From here every call handed to the worker is past the cut: the worker holds it.
      parser_stop_job_ = cmd->job;
      stop_phase_ = StopPhase::kHolding;
      stop_cut_ = cmd->cut_pc;
      pending_.clear();
    }
  }
  parser_cmd_ = cmd;
  push_blocking(cmd_worker_wq_, cmd, worker_bell_, parser_bell_);
}

// ---------------- worker thread ----------------

void POSClient::worker_main() {
  for (;;) {
    if (worker_paused_.load(std::memory_order_acquire) && !stop_.load()) {
      spin_then_block(worker_bell_, 0, [&] { return !worker_paused_.load() || stop_.load(); });
      continue;
    }
    if (worker_stop_job_ != nullptr || worker_dead_) {
      // Past a stop checkpoint's cut: calls are held (or, once it succeeded, dropped), never run.
      if (worker_stopped_step()) continue;
      if (stop_.load(std::memory_order_acquire) && worker_stop_job_ == nullptr &&
          parser2worker_wq_.read_available() == 0)
        return;
      spin_then_block(worker_bell_, config_.spin_ns, [&] {
        return parser2worker_wq_.read_available() > 0 || (worker_dead_ && cmd_worker_wq_.read_available() > 0) ||
               (worker_stop_job_ != nullptr && worker_stop_job_->drained()) || worker_paused_.load() || stop_.load();
      });
      continue;
    }
    bool progressed = false;
    if (worker_cmd_ == nullptr) {
      Command* cmd = nullptr;
      if (cmd_worker_wq_.pop(cmd)) worker_cmd_ = cmd;
    }
    APIContext* c = nullptr;
    if (worker_cmd_ == nullptr) {
      // No command pending: every queued call was parsed before any later command's cut, so a
      // whole batch may be taken at once (one read of the parser's index instead of three a call).
      APIContext* batch[32];
      const size_t n = parser2worker_wq_.pop(batch, 32);
      for (size_t i = 0; i < n; ++i) {
        if (i + 1 < n) prefetch_for_worker(batch[i + 1]);
        execute_call(batch[i]);
      }
      progressed = n > 0;
    } else {
      for (int i = 0; i < 64; ++i) {
        // Calls at or past a pending command's cut wait until the command has run.
        APIContext* const* front = parser2worker_wq_.read_available() > 0 ? &parser2worker_wq_.front() : nullptr;
        if (front == nullptr) break;
        if ((*front)->pc >= worker_cmd_->cut_pc) break;
        parser2worker_wq_.pop(c);
        progressed = true;
        execute_call(c);
        if (worker_paused_.load(std::memory_order_acquire)) break;
      }
    }
    if (progressed) {
      flush_worker_completions();
      parser_bell_.ring();
    }
    if (worker_cmd_ != nullptr) {
      const bool cut_reached = parser2worker_wq_.read_available() == 0 ||
                               parser2worker_wq_.front()->pc >= worker_cmd_->cut_pc;
      if (cut_reached) {
        execute_command(worker_cmd_);
        Command* done = worker_cmd_;
        worker_cmd_ = nullptr;
        push_blocking(cmd_worker_cq_, done, parser_bell_, worker_bell_);
        progressed = true;
      }
    }
    if (progressed) continue;
    if (stop_.load(std::memory_order_acquire) && parser2worker_wq_.read_available() == 0) return;
    const uint64_t t_idle = profile_ ? now_ns() : 0;
    spin_then_block(worker_bell_, config_.spin_ns, [&] {
      return parser2worker_wq_.read_available() > 0 || cmd_worker_wq_.read_available() > 0 ||
             worker_cmd_ != nullptr || worker_paused_.load() || stop_.load();
    });
    if (profile_) profile_->add_worker_idle(now_ns() - t_idle);
  }
}

// On the worker thread, when its turn of the GPU is over and another job waits (TurnGate): the
// client's queued work finished, so that the next job's kernels do not queue behind it.
void POSClient::drain_for_turn(void* self) {
  auto* c = static_cast<POSClient*>(self);
  if (c->ws_.backend != nullptr) (void)c->ws_.backend->synchronize_all();
}

void POSClient::execute_call(APIContext* c) {
  if (cow_job_ != nullptr) {
    if (cow_job_->drained()) cow_job_.reset();
    else cow_job_->protect(*c);
  }
  Status s;
  if (no_device_) [[unlikely]] {
    s = lost_device();
  } else if (lazy_worker_ != nullptr) {
    // A lazily restored buffer this call names is loaded first; one that cannot be fails the call.
    if (lazy_worker_->worker_done()) lazy_worker_ = nullptr;
    else s = lazy_worker_->before_call(*c);
  }
  const ApiFunctions& f = table_->get(c->api_id);
  const uint64_t t_profile = profile_ ? now_ns() : 0;
  TurnGate* const gate = turn_gate_.load(std::memory_order_acquire);
  const int turn = gate != nullptr && s.ok() ? gate->enter(&POSClient::drain_for_turn, this) : 0;
  if (s.ok())
    s = f.work != nullptr ? f.work(ws_, *c) : Status::Unsupported(std::string(c->info->name) + " has no worker function");
  if (turn != 0) gate->done(turn);
  if (profile_) {
    const uint64_t t = now_ns();
    profile_->add_work(static_cast<uint32_t>(c->api_id), t - t_profile);
    profile_->worker_seen(t);
  }
  if (c->info->mode == ReturnMode::kSync) {
    c->status = s.ok() ? s : s.with_context(c->info->name);
  } else if (!s.ok()) {
    // The app already got success for this call: the error surfaces through cudaGetLastError.
    ws_.set_async_error(s.api_error(), s.message());
    POS_WARN(log_name_, "pc %lu %.*s failed asynchronously%s: %s", (unsigned long)c->pc,
             (int)c->info->name.size(), c->info->name.data(),
             c->replay_ret != nullptr ? " (replayed from the image)" : "", s.to_string().c_str());
  }
  executed_.fetch_add(1, std::memory_order_relaxed);
  if (c->t_submit_ns != 0) {
    c->t_done_ns = now_ns();
    latency_.record(c->t_done_ns - c->t_submit_ns);
  }
  bool deletes = false;
  for (size_t i = 0; i < c->edges.size(); ++i) deletes |= c->edges[i].kind == EdgeKind::kDelete;
  // A synchronous call that failed here created nothing (a variable the module does not hold): the
  // parser takes back the handle it made, and only then gives the caller its verdict, so that no
  // later call or checkpoint sees a handle the device never had.
  const bool undo = undoes_create(*c);
  if (!undo) c->advance(kDone);
  // Both CQs hold every context that exists, so this never waits; the parser and the submitter
  // are rung once per batch (worker_main). Deleted handles are released by the parser first.
  if (deletes || undo) {
    while (!parser2worker_cq_.push(c)) cpu_relax();
  } else {
    while (!worker2rpc_cq_.push(c)) cpu_relax();
    ++worker_unflushed_;
  }
}

void POSClient::execute_command(Command* cmd) {
  const double t = seconds_now();
  // Every call < cut has executed; wait for the device to finish them too.
  if (no_device_) [[unlikely]] {
    cmd->status = lost_device();
    return;
  }
  cmd->status = backend_client_->synchronize_all();
  if (cmd->type == CommandType::kExportMemory && cmd->status.ok()) {
    auto peer = backend_client_->export_memory();
    if (peer.ok()) cmd->peer = std::move(*peer);
    else cmd->status = peer.status();
    return;
  }
  if (cmd->type != CommandType::kCheckpoint || !cmd->status.ok()) return;
  CheckpointJob& job = *cmd->job;
  // The device of every call before the cut (a cudaSetDevice may have moved the client).
  job.image().mutable_client()->set_device(device_.load(std::memory_order_relaxed));
  job.image().mutable_client()->set_async_error(ws_.async_error());
  job.image().mutable_client()->set_async_error_message(ws_.async_error_message);
  // lazy_ok: what is not loaded yet is drained from the image it is loading from.
  if (job.request().lazy_ok && lazy_) {
    std::vector<LazyLoader::Unloaded> unloaded;
    auto owner = lazy_->unloaded(&unloaded);
    if (!owner.ok()) {
      cmd->status = owner.status().with_context("checkpoint refused: a buffer of the lazy restore could not be loaded");
      return;
    }
    for (const auto& u : unloaded) job.source_from_image(u.addr, u.img, u.ref, *owner);
  }
  cmd->status = job.start_at_cut(backend_client_.get(), t);
  // Async: later calls that write a buffer not yet drained are protected first (execute_call).
  if (cmd->status.ok() && job.request().mode == CheckpointMode::kAsync && !job.drained()) cow_job_ = cmd->job;
  // Stop: no call past the cut runs (worker_stopped_step), unless the checkpoint fails.
  if (cmd->status.ok() && job.request().stop) worker_stop_job_ = cmd->job;
}

}  // namespace pos
