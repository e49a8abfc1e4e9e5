// inproc_backend.cc — libpos_inproc's RuntimeBackend: a private workspace in this process (config from
// POS_CONFIG / POS_BACKEND) with one client, and the POS_CHECKPOINT hook that checkpoints and restores it.
#include "remoting/inproc/inproc_backend.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>

#include "ckpt/image.h"
#include "pos/base/cuda_errors.h"
#include "pos/checkpoint/restore_gate.h"
#include "pos/runtime.h"
#include "pos/workspace.h"
#include "remoting/client/client_runtime.h"
#include "remoting/inproc/inproc_transport.h"

namespace pos {
namespace {

constexpr char kPlanGrammar[] =
    "expected at=N[,N...];dir=PREFIX[;mode=sync|async][;incremental=0|1][;then=continue|restore][;lazy=0|1]";

Status plan_error(std::string_view spec, const std::string& why) {
  return Status::InvalidArgument("POS_CHECKPOINT=\"" + std::string(spec) + "\": " + why + " (" + kPlanGrammar +
                                 "; unset the variable to run without checkpoints)");
}

// Keeps empty pieces, so "a;;b" and "at=1," are caught as errors rather than skipped.
std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t i = s.find(sep);
    out.push_back(s.substr(0, i));
    if (i == std::string_view::npos) return out;
    s.remove_prefix(i + 1);
  }
}

// Decimal digits only (no sign, no spaces), no overflow.
bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

double ms(double s) { return s * 1e3; }

}  // namespace

StatusOr<CheckpointPlan> parse_checkpoint_plan(std::string_view spec) {
  CheckpointPlan plan;
  if (spec.empty()) return plan_error(spec, "the variable is set but empty");
  std::set<std::string_view> seen;
  for (std::string_view item : split(spec, ';')) {
    if (item.empty()) return plan_error(spec, "empty item");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return plan_error(spec, "'" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    if (!seen.insert(key).second) return plan_error(spec, "'" + std::string(key) + "' given twice");
    if (key == "at") {
      for (std::string_view n : split(val, ',')) {
        uint64_t v = 0;
        if (!parse_u64(n, &v) || v == 0)
          return plan_error(spec, "at: '" + std::string(n) + "' is not a positive integer");
        if (!plan.at.empty() && v <= plan.at.back())
          return plan_error(spec, "at: the counts must be strictly increasing");
        plan.at.push_back(v);
      }
    } else if (key == "dir") {
      if (val.empty()) return plan_error(spec, "dir is empty");
      plan.dir = std::string(val);
    } else if (key == "mode") {
      auto m = parse_checkpoint_mode(std::string(val));
      if (!m.ok()) return plan_error(spec, "mode must be sync or async, not '" + std::string(val) + "'");
      plan.mode = *m;
    } else if (key == "incremental") {
      if (val != "0" && val != "1") return plan_error(spec, "incremental must be 0 or 1");
      plan.incremental = val == "1";
    } else if (key == "then") {
      if (val != "continue" && val != "restore") return plan_error(spec, "then must be continue or restore");
      plan.restore = val == "restore";
    } else if (key == "lazy") {
      if (val != "0" && val != "1") return plan_error(spec, "lazy must be 0 or 1");
      plan.lazy = val == "1";
    } else {
      return plan_error(spec, "unknown key '" + std::string(key) + "'");
    }
  }
  if (plan.at.empty()) return plan_error(spec, "at is required");
  if (plan.dir.empty()) return plan_error(spec, "dir is required");
  if (plan.lazy && !plan.restore) return plan_error(spec, "lazy=1 is a way to restore: it needs then=restore");
  return plan;
}

namespace {

class InProcessBackend final : public RuntimeBackend {
 public:
  // plan: null when POS_CHECKPOINT is unset.
  static StatusOr<std::unique_ptr<InProcessBackend>> create(std::unique_ptr<CheckpointPlan> plan);

  Transport* transport() override { return transport_.get(); }
  // Page-locked memory from the device backend.
  Status host_alloc(uint64_t bytes, void** out) override {
    auto p = ws_->backend().host_alloc(bytes);
    if (!p.ok()) return p.status();
    *out = *p;
    return Status::Ok();
  }
  Status host_free(void* p) override { return ws_->backend().host_free(p); }
  // Takes the checkpoints POS_CHECKPOINT asks for.
  Status after_sync() override;
  // Waits for a checkpoint still draining, then drains the app's outstanding work and frees its
  // device state.
  void shutdown() override;
  // The line at exit: backend, calls, checkpoints and restores (under ckpt_mu_ or at shutdown).
  void print_summary();

 private:
  // An async checkpoint with then=continue: the app runs on while its image drains.
  struct PendingCheckpoint {
    size_t k = 0;
    uint64_t n = 0;
    std::string dir;
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    bool cut = false;   // guarded by mu
    bool done = false;  // guarded by mu
    Status status;      // guarded by mu
    CheckpointResult result;
  };

  explicit InProcessBackend(std::unique_ptr<CheckpointPlan> plan) : plan_(std::move(plan)) {}
  // All three under ckpt_mu_. reap: reports a pending async checkpoint once it is durable (wait:
  // blocks until it is) and returns its error.
  Status take_checkpoint(size_t k, uint64_t n);
  Status restore_from(const std::string& dir);
  Status reap(bool wait);
  // A lazy restore still loading: once it has finished (wait: blocks until it has), prints its
  // line and returns its error.
  Status report_lazy_restore(bool wait);
  Status checkpoint_failed(const Status& s);  // prints it; the returned error is never cudaSuccess
  std::string image_dir(size_t k) const;

  // Declared before transport_, which calls into both.
  std::unique_ptr<POSWorkspace> ws_;
  uint64_t uuid_ = 0;
  // Calls take it shared (through the transport), a restore exclusively: while the client is
  // removed and rebuilt, the app's other threads wait instead of seeing an unknown client. Calls
  // a stop checkpoint refused are issued again after the restore (pos/checkpoint/restore_gate.h).
  RestoreGate gate_;
  std::unique_ptr<Transport> transport_;

  // POS_CHECKPOINT state; plan_ is null when the variable is unset (after_sync returns at once).
  std::unique_ptr<CheckpointPlan> plan_;
  std::atomic<uint64_t> sync_calls_{0};
  std::mutex ckpt_mu_;  // one checkpoint at a time
  std::unique_ptr<PendingCheckpoint> pending_;  // guarded by ckpt_mu_
  size_t taken_ = 0;                            // guarded by ckpt_mu_; checkpoints started
  size_t written_ = 0;                          // guarded by ckpt_mu_; images made durable
  size_t restored_ = 0;                         // guarded by ckpt_mu_; restores that succeeded
  uint64_t calls_before_restore_ = 0;           // guarded by ckpt_mu_; calls of clients a restore replaced
  std::string lazy_dir_;                        // guarded by ckpt_mu_; a lazy restore not yet reported
};

StatusOr<std::unique_ptr<InProcessBackend>> InProcessBackend::create(std::unique_ptr<CheckpointPlan> plan) {
  auto cfg = config_from_environment();
  if (!cfg.ok()) return cfg.status();
  std::unique_ptr<InProcessBackend> b(new InProcessBackend(std::move(plan)));
  auto ws = create_workspace(*cfg);
  if (!ws.ok()) return ws.status();
  b->ws_ = std::move(ws.value());
  const char* job = std::getenv("POS_JOB_NAME");
  auto uuid = b->ws_->create_client(job != nullptr ? job : "in-process");
  if (!uuid.ok()) return uuid.status();
  b->uuid_ = *uuid;
  // A restored client keeps this uuid (POSWorkspace::restore returns the image's), so the
  // transport stays valid across a restore.
  b->transport_ = std::make_unique<InProcessTransport>(b->ws_.get(), b->uuid_);
  if (b->plan_) b->transport_ = std::make_unique<GatedTransport>(std::move(b->transport_), &b->gate_);
  return b;
}

void InProcessBackend::shutdown() {
  if (plan_) {
    std::lock_guard<std::mutex> lk(ckpt_mu_);
    // An async checkpoint still draining must finish before its client goes.
    if (!reap(/*wait=*/true).ok() || !report_lazy_restore(/*wait=*/true).ok()) {
      // Its failure must not look like a successful run; exit() cannot be re-entered here.
      std::fflush(nullptr);
      std::_Exit(1);
    }
    const auto& at = plan_->at;
    if (taken_ < at.size())
      std::fprintf(stderr, "pos: POS_CHECKPOINT asked for a checkpoint at sync call %llu; the program made only %llu\n",
                   static_cast<unsigned long long>(at[taken_]), static_cast<unsigned long long>(sync_calls_.load()));
  }
  print_summary();
  // Drain the app's outstanding work, then free its device state.
  (void)ws_->remove_client(uuid_);
  ws_.reset();
}

void InProcessBackend::print_summary() {
  // One line that says the job ran through POS and what POS did for it (POS_SUMMARY=0: silent).
  if (const char* e = std::getenv("POS_SUMMARY"); e != nullptr && std::string_view(e) == "0") return;
  const auto client = ws_->find_client(uuid_);
  if (!client) return;
  (void)client->wait_restored();  // a lazy restore's loads count as the job's work
  const ClientStats st = client->stats();
  const uint64_t calls = calls_before_restore_ + st.calls_submitted;
  std::string device = ws_->backend().device_name(client->device());
  std::fprintf(stderr,
               "pos: the job ran through POS in-process: backend %.*s (%s), %llu CUDA calls, %zu checkpoint%s written, "
               "%zu restore%s\n",
               static_cast<int>(ws_->backend().name().size()), ws_->backend().name().data(), device.c_str(),
               static_cast<unsigned long long>(calls), written_, written_ == 1 ? "" : "s", restored_,
               restored_ == 1 ? "" : "s");
}

Status InProcessBackend::after_sync() {
  if (!plan_) return Status::Ok();
  const uint64_t n = sync_calls_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::lock_guard<std::mutex> lk(ckpt_mu_);
  // A finished async checkpoint is reported (and its failure surfaces) at the next sync call.
  POS_RETURN_IF_ERROR(reap(/*wait=*/false));
  POS_RETURN_IF_ERROR(report_lazy_restore(/*wait=*/false));
  const auto& at = plan_->at;
  const auto it = std::lower_bound(at.begin(), at.end(), n);
  if (it == at.end() || *it != n) return Status::Ok();
  // The engine would wait for a lazy restore to finish anyway; this reports it first.
  POS_RETURN_IF_ERROR(report_lazy_restore(/*wait=*/true));
  // The previous image must be durable first: it may be this one's parent, and the engine takes
  // one checkpoint of a client at a time.
  POS_RETURN_IF_ERROR(reap(/*wait=*/true));
  const size_t k = static_cast<size_t>(it - at.begin()) + 1;
  taken_ = k;
  return take_checkpoint(k, n);
}

std::string InProcessBackend::image_dir(size_t k) const { return plan_->dir + "-" + std::to_string(k); }

Status InProcessBackend::checkpoint_failed(const Status& s) {
  std::fprintf(stderr, "pos: checkpoint failed: %s\n", s.to_string().c_str());
  // Some image-layer errors carry no API error; the app must still see the call fail.
  if (s.api_error() == 0) return Status(s.code(), cuda::kErrorUnknown, s.message());
  return s;
}

void report(size_t k, uint64_t n, const CheckpointResult& r, const std::string& dir) {
  std::fprintf(stderr,
               "pos: checkpoint %zu at sync call %llu: cut %llu, %llu bytes stored, %llu referenced, stall %.3f ms, "
               "total %.3f ms -> %s\n",
               k, static_cast<unsigned long long>(n), static_cast<unsigned long long>(r.cut_pc),
               static_cast<unsigned long long>(r.bytes_stored), static_cast<unsigned long long>(r.bytes_referenced),
               ms(r.stall_s), ms(r.total_s), dir.c_str());
}

Status InProcessBackend::take_checkpoint(size_t k, uint64_t n) {
  CheckpointRequest req;
  req.mode = plan_->mode;
  req.dir = image_dir(k);
  if (plan_->incremental && k > 1) req.parent_dir = image_dir(k - 1);

  if (plan_->mode == CheckpointMode::kAsync && !plan_->restore) {
    // The app waits only for the cut (so the image is the state after sync call n exactly), then
    // runs on while a thread of ours waits for the image to be durable.
    auto p = std::make_unique<PendingCheckpoint>();
    PendingCheckpoint* pc = p.get();
    pc->k = k, pc->n = n, pc->dir = req.dir;
    req.on_cut = [pc](uint64_t) {
      std::lock_guard<std::mutex> g(pc->mu);
      pc->cut = true;
      pc->cv.notify_all();
    };
    pc->thread = std::thread([this, pc, req = std::move(req)]() mutable {
      auto r = ws_->checkpoint(uuid_, std::move(req));
      std::lock_guard<std::mutex> g(pc->mu);
      if (r.ok()) pc->result = *r;
      else pc->status = r.status();
      pc->done = true;
      pc->cv.notify_all();
    });
    pending_ = std::move(p);
    bool failed = false;
    {
      std::unique_lock<std::mutex> g(pc->mu);
      pc->cv.wait(g, [pc] { return pc->cut || pc->done; });
      failed = pc->done && !pc->status.ok();
    }
    return failed ? reap(/*wait=*/true) : Status::Ok();  // a failure before the cut: report it now
  }

  // then=restore drops the live client once the image is durable: a sync checkpoint stops it at
  // the cut, so that what the app's other threads issue meanwhile is carried into the restored
  // client (pending calls) or issued again there (calls the stop refused; RestoreGate), not run on
  // the client being dropped and lost.
  req.stop = plan_->restore && plan_->mode == CheckpointMode::kSync;
  if (req.stop) gate_.begin_stop();
  struct EndStop {
    RestoreGate* gate;
    ~EndStop() {
      if (gate != nullptr) gate->end_stop();
    }
  } end_stop{req.stop ? &gate_ : nullptr};
  auto r = ws_->checkpoint(uuid_, std::move(req));
  if (!r.ok()) return checkpoint_failed(r.status().with_context("checkpoint " + std::to_string(k) + " -> " + image_dir(k)));
  report(k, n, *r, image_dir(k));
  ++written_;
  if (plan_->restore) return restore_from(image_dir(k));
  return Status::Ok();
}

Status InProcessBackend::reap(bool wait) {
  if (!pending_) return Status::Ok();
  PendingCheckpoint* pc = pending_.get();
  {
    std::lock_guard<std::mutex> g(pc->mu);
    if (!wait && !pc->done) return Status::Ok();
  }
  pc->thread.join();
  std::unique_ptr<PendingCheckpoint> p = std::move(pending_);
  if (!p->status.ok())
    return checkpoint_failed(p->status.with_context("checkpoint " + std::to_string(p->k) + " -> " + p->dir));
  report(p->k, p->n, p->result, p->dir);
  ++written_;
  // The job ran on while this image drained: when, so its steps can be matched with the drain.
  std::fprintf(stderr,
               "pos: drain of checkpoint %zu ran from %.6f to %.6f s (monotonic clock), %.3f ms; shadows %llu bytes "
               "(pool %llu), %llu waits for a full pool\n",
               p->k, p->result.drain_start_s, p->result.drain_end_s, ms(p->result.drain_end_s - p->result.drain_start_s),
               static_cast<unsigned long long>(p->result.shadow_bytes),
               static_cast<unsigned long long>(p->result.shadow_limit),
               static_cast<unsigned long long>(p->result.shadow_waits));
  return Status::Ok();
}

Status InProcessBackend::restore_from(const std::string& dir) {
  // Opened (and validated) before the live client is dropped: a bad image leaves the app running
  // on its live state and failing this call, not stranded without a client.
  auto opened = ckpt::ImageReader::open_dir(dir);
  if (!opened.ok()) return checkpoint_failed(opened.status().with_context("opening " + dir + " to restore"));
  // Shared: a lazy restore keeps reading it after restore() returns.
  std::shared_ptr<const ckpt::ImageReader> img = std::move(opened.value());
  std::unique_lock<RestoreGate> gate(gate_);
  // As a crashed daemon would: every buffer and handle of the client is freed. The workspace
  // (with its backend, which owns the app's cudaMallocHost memory) stays.
  if (const auto live = ws_->find_client(uuid_)) calls_before_restore_ += live->stats().calls_submitted;
  Status s = ws_->remove_client(uuid_);
  if (!s.ok()) return checkpoint_failed(s.with_context("dropping the client before restore"));
  RestoreOptions options;
  options.lazy = plan_->lazy;
  auto u = ws_->restore(img, options);
  if (!u.ok()) return checkpoint_failed(u.status().with_context("restoring from " + dir));
  if (*u != uuid_)
    return checkpoint_failed(Status::Internal("restored client has uuid " + std::to_string(*u) + ", expected " +
                                              std::to_string(uuid_)));
  ++restored_;
  if (!plan_->lazy) {
    std::fprintf(stderr, "pos: restored from %s\n", dir.c_str());
    return Status::Ok();
  }
  const auto client = ws_->find_client(uuid_);
  const LazyRestoreStats st = client ? client->restore_stats() : LazyRestoreStats{};
  std::fprintf(stderr, "pos: restored from %s (lazily: %llu buffers, %llu bytes to load)\n", dir.c_str(),
               static_cast<unsigned long long>(st.buffers), static_cast<unsigned long long>(st.bytes));
  lazy_dir_ = dir;
  return Status::Ok();
}

Status InProcessBackend::report_lazy_restore(bool wait) {
  if (lazy_dir_.empty()) return Status::Ok();
  const auto client = ws_->find_client(uuid_);
  if (!client) return Status::Ok();  // the client is gone (a later restore failed): nothing to report
  if (!wait && !client->restore_stats().complete) return Status::Ok();
  const Status s = client->wait_restored();
  const std::string dir = std::move(lazy_dir_);
  lazy_dir_.clear();
  if (!s.ok()) return checkpoint_failed(s.with_context("lazy restore from " + dir));
  const LazyRestoreStats st = client->restore_stats();
  std::fprintf(stderr,
               "pos: lazy restore from %s complete: %llu buffers, %llu bytes, %llu loaded on first use, %llu freed "
               "unloaded, %.3f ms\n",
               dir.c_str(), static_cast<unsigned long long>(st.buffers), static_cast<unsigned long long>(st.bytes),
               static_cast<unsigned long long>(st.loaded_on_demand), static_cast<unsigned long long>(st.dropped),
               ms(st.seconds));
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<RuntimeBackend>> make_runtime_backend() {
  // POS_CHECKPOINT is parsed first: a bad plan must stop the job before it computes anything.
  std::unique_ptr<CheckpointPlan> plan;
  if (const char* spec = std::getenv("POS_CHECKPOINT"); spec != nullptr) {
    auto p = parse_checkpoint_plan(spec);
    if (!p.ok()) return p.status();
    plan = std::make_unique<CheckpointPlan>(std::move(p.value()));
  }
  auto b = InProcessBackend::create(std::move(plan));
  if (!b.ok()) return b.status();
  return std::unique_ptr<RuntimeBackend>(std::move(b.value()));
}

}  // namespace pos
