// client_runtime.cc — in-process runtime bootstrap, last-error bookkeeping, and the POS_CHECKPOINT
// hook. The workspace is torn down at exit, after nvcc's own atexit handlers unregistered the modules.
#include "remoting/client/client_runtime.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>

#include "ckpt/image.h"
#include "pos/workspace.h"
#include "remoting/client/shm_client.h"
#include "pos/runtime.h"
#include "remoting/inproc/inproc_transport.h"

namespace pos {
namespace {
thread_local int32_t t_last_error = 0;
ClientRuntime* g_runtime = nullptr;
std::once_flag g_once;

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

[[maybe_unused]] std::string program_name() {
  std::string comm = "client";
  if (FILE* f = std::fopen("/proc/self/comm", "r")) {
    char b[64] = {};
    if (std::fgets(b, sizeof(b), f) != nullptr) {
      comm = b;
      while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    }
    std::fclose(f);
  }
  return comm;
}

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

struct ClientRuntime::PendingCheckpoint {
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

ClientRuntime* ClientRuntime::get() {
  std::call_once(g_once, [] {
    g_runtime = new ClientRuntime();
    std::atexit(&ClientRuntime::shutdown_at_exit);
  });
  return g_runtime;
}

ClientRuntime::ClientRuntime() {
  // POS_CHECKPOINT is parsed first: a bad plan must stop the job before it computes anything.
  if (const char* spec = std::getenv("POS_CHECKPOINT"); spec != nullptr) {
    auto plan = parse_checkpoint_plan(spec);
    if (plan.ok()) plan_ = std::make_unique<CheckpointPlan>(std::move(plan.value()));
    else init_ = plan.status();
  }
#ifdef POS_REMOTE_CLIENT
  // libpos_client: calls go to posd through the session's shared memory.
  if (plan_) {
    init_ = Status::InvalidArgument(
        "POS_CHECKPOINT drives checkpoints of in-process jobs (libpos_inproc); under posd it is not available");
  }
  uint64_t arena = 0;
  if (const char* a = std::getenv("POS_ARENA_SIZE"); init_.ok() && a != nullptr && *a != '\0') {
    auto v = parse_size(a);
    if (v.ok()) arena = *v;
    else init_ = v.status().with_context("POS_ARENA_SIZE");
  }
  if (init_.ok()) {
    const char* job = std::getenv("POS_JOB_NAME");
    auto session = ShmSession::connect(default_socket_path(), job != nullptr ? job : program_name(), arena);
    if (session.ok()) {
      shm_ = session->get();
      uuid_ = (*session)->client_uuid();
      transport_ = std::move(session.value());
    } else {
      init_ = session.status();
    }
  }
#else
  auto cfg = config_from_environment();
  if (init_.ok() && !cfg.ok()) init_ = cfg.status();
  if (init_.ok()) {
    auto ws = create_workspace(*cfg);
    if (!ws.ok()) {
      init_ = ws.status();
    } else {
      ws_ = std::move(ws.value());
      const char* job = std::getenv("POS_JOB_NAME");
      auto uuid = ws_->create_client(job != nullptr ? job : "in-process");
      if (!uuid.ok()) {
        init_ = uuid.status();
      } else {
        uuid_ = *uuid;
        // A restored client keeps this uuid (POSWorkspace::restore returns the image's), so
        // the transport stays valid across a restore.
        transport_ = std::make_unique<InProcessTransport>(ws_.get(), uuid_);
        if (plan_) transport_ = std::make_unique<GatedTransport>(std::move(transport_), &gate_);
      }
    }
  }
#endif
  if (!init_.ok()) {
    std::fprintf(stderr, "pos: cannot start the POS runtime: %s\n", init_.to_string().c_str());
    // Calls fail with cudaErrorInitializationError instead of crashing the app.
    struct FailingTransport final : Transport {
      Status call(ApiId, std::span<const Param>, void*, uint64_t, uint64_t*) override {
        return Status(Code::kUnavailable, cuda::kErrorInitializationError, "POS runtime not initialized");
      }
    };
    transport_ = std::make_unique<FailingTransport>();
  }
  api_ = std::make_unique<ApiClient>(transport_.get());
}

void ClientRuntime::shutdown_at_exit() {
  if (g_runtime == nullptr || !g_runtime->ws_) return;
  if (g_runtime->plan_) {
    std::lock_guard<std::mutex> lk(g_runtime->ckpt_mu_);
    // An async checkpoint still draining must finish before its client goes.
    if (!g_runtime->reap(/*wait=*/true).ok() || !g_runtime->report_lazy_restore(/*wait=*/true).ok()) {
      // Its failure must not look like a successful run; exit() cannot be re-entered here.
      std::fflush(nullptr);
      std::_Exit(1);
    }
    const auto& at = g_runtime->plan_->at;
    if (g_runtime->taken_ < at.size())
      std::fprintf(stderr, "pos: POS_CHECKPOINT asked for a checkpoint at sync call %llu; the program made only %llu\n",
                   static_cast<unsigned long long>(at[g_runtime->taken_]),
                   static_cast<unsigned long long>(g_runtime->sync_calls_.load()));
  }
  // Drain the app's outstanding work, then free its device state.
  (void)g_runtime->ws_->remove_client(g_runtime->uuid_);
  g_runtime->ws_.reset();
}

int32_t ClientRuntime::record(const Status& s) {
  const int32_t e = s.ok() ? 0 : s.api_error();
  if (e != 0) t_last_error = e;
  return e;
}

int32_t ClientRuntime::take_last_error() {
  int32_t e = t_last_error;
  t_last_error = 0;
  // Under posd an earlier cudaGetLastError's frame may have taken the worker's error: it came
  // back with a later reply.
  if (shm_ != nullptr) {
    const int32_t a = shm_->take_async_error();
    if (e == 0) e = a;
  }
  // Errors of calls that had returned success are known to the worker only. In-process the
  // parser answers at once; under posd the frame is posted (no round trip per launch check) and
  // what it takes is reported by a later call's reply.
  Status s = api_->get_last_error();
  if (e == 0 && !s.ok()) e = s.api_error();
  return e;
}

int32_t ClientRuntime::peek_last_error() {
  if (t_last_error != 0) return t_last_error;
  if (shm_ != nullptr && shm_->peek_async_error() != 0) return shm_->peek_async_error();
  Status s = api_->peek_at_last_error();
  return s.ok() ? 0 : s.api_error();
}

Status ClientRuntime::host_alloc(uint64_t bytes, void** out) {
  if (shm_ != nullptr) return shm_->host_alloc(bytes, out);  // the session's arena, pinned by posd
  // Like every other call of a runtime that did not start: cudaErrorInitializationError.
  if (!ws_) return Status(init_.code(), cuda::kErrorInitializationError, init_.message());
  auto p = ws_->backend().host_alloc(bytes);
  if (!p.ok()) return p.status();
  *out = *p;
  return Status::Ok();
}

Status ClientRuntime::host_free(void* p) {
  if (shm_ != nullptr) return shm_->host_free(p);
  if (!ws_) return Status(init_.code(), cuda::kErrorInitializationError, init_.message());
  return ws_->backend().host_free(p);
}

void ClientRuntime::add_function(const void* host_fun, RegisteredFunction f) {
  std::lock_guard<std::mutex> lk(mu_);
  functions_[host_fun] = std::move(f);
}

const RegisteredFunction* ClientRuntime::function(const void* host_fun) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = functions_.find(host_fun);
  return it == functions_.end() ? nullptr : &it->second;  // node-based map: stable pointers
}

void ClientRuntime::add_var(const void* host_var, uint64_t device_addr) {
  std::lock_guard<std::mutex> lk(mu_);
  vars_[host_var] = device_addr;
}

uint64_t ClientRuntime::var(const void* host_var) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = vars_.find(host_var);
  return it == vars_.end() ? 0 : it->second;
}

// ---------------- POS_CHECKPOINT ----------------

Status ClientRuntime::after_sync() {
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

std::string ClientRuntime::image_dir(size_t k) const { return plan_->dir + "-" + std::to_string(k); }

Status ClientRuntime::checkpoint_failed(const Status& s) {
  std::fprintf(stderr, "pos: checkpoint failed: %s\n", s.to_string().c_str());
  // Some image-layer errors carry no API error; the app must still see the call fail.
  if (s.api_error() == 0) return Status(s.code(), cuda::kErrorUnknown, s.message());
  return s;
}

namespace {
void report(size_t k, uint64_t n, const CheckpointResult& r, const std::string& dir) {
  std::fprintf(stderr,
               "pos: checkpoint %zu at sync call %llu: cut %llu, %llu bytes stored, %llu referenced, stall %.3f ms, "
               "total %.3f ms -> %s\n",
               k, static_cast<unsigned long long>(n), static_cast<unsigned long long>(r.cut_pc),
               static_cast<unsigned long long>(r.bytes_stored), static_cast<unsigned long long>(r.bytes_referenced),
               ms(r.stall_s), ms(r.total_s), dir.c_str());
}
}  // namespace

Status ClientRuntime::take_checkpoint(size_t k, uint64_t n) {
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
  if (plan_->restore) return restore_from(image_dir(k));
  return Status::Ok();
}

Status ClientRuntime::reap(bool wait) {
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

Status ClientRuntime::restore_from(const std::string& dir) {
  // Opened (and validated) before the live client is dropped: a bad image leaves the app running
  // on its live state and failing this call, not stranded without a client.
  auto opened = ckpt::ImageReader::open_dir(dir);
  if (!opened.ok()) return checkpoint_failed(opened.status().with_context("opening " + dir + " to restore"));
  // Shared: a lazy restore keeps reading it after restore() returns.
  std::shared_ptr<const ckpt::ImageReader> img = std::move(opened.value());
  std::unique_lock<RestoreGate> gate(gate_);
  // As a crashed daemon would: every buffer and handle of the client is freed. The workspace
  // (with its backend, which owns the app's cudaMallocHost memory) stays.
  Status s = ws_->remove_client(uuid_);
  if (!s.ok()) return checkpoint_failed(s.with_context("dropping the client before restore"));
  RestoreOptions options;
  options.lazy = plan_->lazy;
  auto u = ws_->restore(img, options);
  if (!u.ok()) return checkpoint_failed(u.status().with_context("restoring from " + dir));
  if (*u != uuid_)
    return checkpoint_failed(Status::Internal("restored client has uuid " + std::to_string(*u) + ", expected " +
                                              std::to_string(uuid_)));
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

Status ClientRuntime::report_lazy_restore(bool wait) {
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

}  // namespace pos
