// client_checkpoint.cc — a client's side of checkpoint and restore: the parser records every live
// handle at the cut (metadata is parser-owned), and a restored client rebuilds them from an image.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "pos/client.h"
#include "pos/base/hex.h"
#include "pos/base/log.h"

namespace pos {
namespace {

constexpr int kKeyShift = 56;
uint64_t key_of(const Handle* h) { return (static_cast<uint64_t>(h->type) << kKeyShift) | h->id; }
ResourceType type_of_key(uint64_t key) { return static_cast<ResourceType>(key >> kKeyShift); }
uint64_t id_of_key(uint64_t key) { return key & ((uint64_t{1} << kKeyShift) - 1); }

// Buffers a parent image holds (key → address, size), and its cut.
using InParent = std::map<uint64_t, std::pair<uint64_t, uint64_t>>;
uint64_t parent_buffers(const ckpt::ImageReader* p, InParent* in_parent) {
  if (p == nullptr) return 0;
  for (const auto& h : p->client().handles())
    if (h.has_memory()) (*in_parent)[h.id()] = {h.addr(), h.size()};
  return p->inventory().cut_pc();
}

// Whether an incremental image leaves h's bytes to its parent: the parent holds the same buffer,
// written last before the parent's cut. Variables are always stored: kernels write them without
// naming them. The checkpoint and its estimate share this rule.
bool unchanged_in_parent(const Handle& h, bool is_var, const InParent& in_parent, uint64_t parent_cut) {
  if (is_var) return false;
  const auto it = in_parent.find(key_of(&h));
  return it != in_parent.end() && it->second == std::make_pair(h.client_addr, h.size) && h.version < parent_cut;
}

}  // namespace

// Parser thread: the bytes record_checkpoint would store against cmd->parent if the cut were now.
void POSClient::estimate_at_parser(Command* cmd) {
  InParent in_parent;
  const uint64_t parent_cut = parent_buffers(cmd->parent, &in_parent);
  const ResourceTable& types = table_->resources();
  for (size_t t = 0; t < static_cast<size_t>(ResourceType::kCount); ++t) {
    const ResourceOps& ops = types.get(static_cast<ResourceType>(t));
    ps_.managers[t]->for_each([&](Handle* h) {
      if (h->state != HandleState::kActive) return;
      ++cmd->handles;
      if (ops.bytes == DeviceBytes::kNone) return;
      const bool is_var = ops.bytes == DeviceBytes::kVariable;
      // A window (since_pc): every buffer written in it, whether or not the parent holds its bytes.
      const bool unchanged = cmd->since_pc > 0 ? !is_var && h->version < cmd->since_pc
                                               : unchanged_in_parent(*h, is_var, in_parent, parent_cut);
      if (unchanged) cmd->referenced += h->size;
      else cmd->bytes += h->size;
    });
  }
}

// Loader threads of a restore (eager, and a lazy one's background loaders: a job that never waits
// still gets its state at full speed). Each reads a chunk from the image's files into page-locked
// staging, checks it and copies it: from files (the page cache) one thread moves ~3 GB/s, so eight
// stopped near 20 GB/s where the copies alone reach 45 (restores from host memory, checked in
// place). One per core up to 16, at least 8.
size_t restore_loader_threads() {
  static const size_t n = std::clamp<size_t>(std::thread::hardware_concurrency(), 8, 16);
  return n;
}

// Parser thread, at the cut: it has parsed exactly the calls < cut, so the handles and their
// parser-owned fields are the state at the cut.
void POSClient::record_checkpoint(CheckpointJob& job, uint64_t cut) {
  ckpt::pb::ClientImage& img = job.image();
  ckpt::pb::ClientRecord* cr = img.mutable_client();
  cr->set_uuid(uuid_);
  cr->set_job_name(job_name_);
  cr->set_va_base(ps_.va_base);
  cr->set_va_size(config_.va_size);
  cr->set_next_pc(cut);
  cr->set_current_device(ps_.current_device);
  cr->set_device(device_);
  {
    // Where the state lies in the job's own numbering: a restore under another posd.devices list
    // (another GPU) maps it through that list.
    const auto& ds = ps_.devices;
    const auto at = std::find(ds.begin(), ds.end(), static_cast<int32_t>(device_));
    cr->set_device_index(ds.empty() ? static_cast<int32_t>(device_) : at != ds.end() ? static_cast<int32_t>(at - ds.begin()) : -1);
  }
  cr->set_default_stream(key_of(ps_.default_stream));
  for (size_t t = 0; t < static_cast<size_t>(ResourceType::kCount); ++t) {
    auto* m = cr->add_managers();
    m->set_type(static_cast<uint32_t>(t));
    m->set_next_id(ps_.managers[t]->next_id());
    m->set_next_slot(ps_.managers[t]->next_slot());
  }
  // Buffers the parent image holds unchanged: written last before the parent's cut.
  InParent in_parent;
  const uint64_t parent_cut = parent_buffers(job.parent(), &in_parent);
  // Types in enum order put parents first (device < context < stream, module < function, ...).
  const ResourceTable& types = table_->resources();
  for (size_t t = 0; t < static_cast<size_t>(ResourceType::kCount); ++t) {
    const ResourceOps& ops = types.get(static_cast<ResourceType>(t));
    std::vector<Handle*> hs;
    ps_.managers[t]->for_each([&](Handle* h) {
      if (h->state == HandleState::kActive) hs.push_back(h);
    });
    std::sort(hs.begin(), hs.end(), [](const Handle* a, const Handle* b) { return a->id < b->id; });
    for (Handle* h : hs) {
      ckpt::pb::HandleRecord* r = img.add_handles();
      r->set_id(key_of(h));
      r->set_type(static_cast<uint32_t>(h->type));
      r->set_addr(h->client_addr);
      r->set_size(h->size);
      for (Handle* p : h->parents) r->add_parents(key_of(p));
      r->set_created_pc(h->created_pc);
      r->set_version(h->version);
      if (ops.record != nullptr) ops.record(*h, r);  // the type's own fields
      if (ops.bytes == DeviceBytes::kNone) continue;
      r->set_charged(h->charged);
      const bool is_var = ops.bytes == DeviceBytes::kVariable;
      if (unchanged_in_parent(*h, is_var, in_parent, parent_cut)) {
        r->mutable_memory()->set_in_parent(true);
        *job.referenced_bytes() += h->size;
        continue;
      }
      // A peer switch's image: the bytes go to the target as device memory, not through the image.
      if (!is_var && job.request().peer) {
        r->mutable_memory()->set_in_peer(true);
        *job.referenced_bytes() += h->size;
        continue;
      }
      job.add_region(key_of(h), h->client_addr, h->size, is_var, img.handles_size() - 1);
    }
  }
  ckpt::pb::Inventory& inv = job.inventory();
  inv.set_pos_version(POS_VERSION_STRING);
  inv.set_backend(std::string(backend_->name()));
  inv.set_device_name(backend_->device_name(device_));  // the model that held the bytes
  inv.set_cut_pc(cut);
  inv.set_image_id(ckpt::random_image_id());
  inv.set_created_unix_ns(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count()));
  inv.set_mode(job.request().mode == CheckpointMode::kSync ? "sync" : "async");
  inv.add_features("handles");
  inv.add_features("device-memory");
  if (job.request().stop) inv.add_features("stopped");
  if (job.request().peer) inv.add_features("peer");
  if (const ckpt::ImageReader* p = job.parent()) {
    inv.add_features("incremental");
    auto* pp = inv.mutable_parent();
    namespace fs = std::filesystem;
    const fs::path child = fs::absolute(fs::path(job.request().dir)).lexically_normal();
    const fs::path parent = fs::absolute(fs::path(p->dir())).lexically_normal();
    // Resolved against the image's own dir.
    pp->set_path(!job.request().parent_path.empty() ? job.request().parent_path
                                                   : parent.lexically_relative(child).string());
    pp->set_image_id(p->inventory().image_id());
    pp->set_cut_pc(p->inventory().cut_pc());
  }
}

// Before the threads start: this thread is the only one touching parser and worker state.
Status POSClient::restore_state(const std::shared_ptr<const ckpt::ImageReader>& image_ptr,
                                const RestoreOptions& options) {
  const ckpt::ImageReader& image = *image_ptr;
  const ckpt::pb::ClientImage& img = image.client();
  const auto& cr = img.client();
  const auto t0 = std::chrono::steady_clock::now();  // for the log: a restore's share of a downtime
  if (cr.va_base() != ps_.va_base || cr.va_size() != config_.va_size)
    return Status::FailedPrecondition("image client range " + hex(cr.va_base()) + " + " + hex(cr.va_size()) +
                                      " differs from the slot's " + hex(ps_.va_base) + " + " + hex(config_.va_size));
  std::unordered_map<uint64_t, Handle*> by_key;
  BackendClient& bc = *backend_client_;
  const ResourceTable& types = table_->resources();
  RestoreScope scope{ps_, ws_, cr};
  for (const auto& r : img.handles()) {
    const ResourceType t = type_of_key(r.id());
    if (static_cast<uint32_t>(t) != r.type() || t >= ResourceType::kCount)
      return Status::Corrupt("handle " + std::to_string(r.id()) + ": key and type disagree");
    const ResourceOps& ops = types.get(t);
    std::vector<Handle*> parents;
    for (uint64_t p : r.parents()) parents.push_back(by_key.at(p));  // validated: earlier records
    HandleManager& m = ps_.mgr(t);
    const bool bytes = ops.bytes != DeviceBytes::kNone;
    if (bytes && (r.size() == 0 || !m.contains_range(r.addr())))
      return Status::Corrupt("buffer " + hex(r.addr()) + " lies outside the client's range");
    auto h = m.adopt_at(r.addr(), r.size(), std::move(parents), r.created_pc(), id_of_key(r.id()));
    if (!h.ok()) return h.status().with_context("restoring " + std::string(resource_type_name(t)) + " " + hex(r.addr()));
    Handle* x = *h;
    by_key[r.id()] = x;
    x->version = r.version();
    const std::string what = std::string(resource_type_name(t)) + " " + hex(r.addr());
    if (bytes) {
      // Charged only once reserved: a failed restore gives back exactly what was reserved.
      if (r.charged() < r.size()) return Status::Corrupt(what + ": charged less than its size");
      if (!backend_->try_reserve(r.charged()))
        return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation, what + ": device memory exhausted");
      x->charged = r.charged();
    }
    // The type's own fields and its backend object (pos/cuda_impl/resource_hooks.cc).
    POS_RETURN_IF_ERROR(ops.restore(scope, r, x).with_context(what));
  }
  if (ps_.device == nullptr || ps_.context == nullptr || ps_.default_stream == nullptr)
    return Status::Corrupt("image lacks the client's device, context or default stream");
  // Links to handles that may come later in the record order (cuBLAS handles follow their streams).
  for (const auto& r : img.handles()) {
    Handle* x = by_key.at(r.id());
    const LinkFn link = types.get(x->type).link;
    if (link == nullptr) continue;
    POS_RETURN_IF_ERROR(link(scope, x).with_context(std::string(resource_type_name(x->type)) + " " + hex(r.addr())));
  }

  const double handles_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Device bytes: several threads each read (and verify) chunks and copy them on their own lane.
  struct Piece {
    const ckpt::ImageReader* img;
    const ckpt::pb::BlobRef* ref;
    uint64_t addr;
    bool is_var;
  };
  std::vector<Piece> pieces;
  std::vector<PeerBuffer> from_peer;  // a peer switch's buffers: copied from the source's memory
  for (const auto& r : img.handles()) {
    if (!r.has_memory()) continue;
    if (r.memory().in_peer()) {
      from_peer.push_back(PeerBuffer{r.addr(), r.size()});
      continue;
    }
    auto src = image.resolve(r);
    if (!src.ok()) return src.status();
    const bool is_var = types.get(type_of_key(r.id())).bytes == DeviceBytes::kVariable;
    if (!is_var && options.peer != nullptr && !options.peer_image_id.empty() &&
        src->first->inventory().image_id() == options.peer_image_id) {
      // Unchanged since the staged image: the staging session's memory holds these bytes already.
      from_peer.push_back(PeerBuffer{r.addr(), r.size()});
      continue;
    }
    pieces.push_back(Piece{src->first, src->second, r.addr(),
                           types.get(type_of_key(r.id())).bytes == DeviceBytes::kVariable});
  }
  double peer_s = 0, loaders_s = 0;
  size_t premade = 0;  // page-locked chunks kept for the loaders (a spare session makes them ahead)
  if (!from_peer.empty() || options.peer != nullptr) {
    if (options.peer == nullptr)
      return Status::FailedPrecondition("the image's buffers were handed over by a peer session (a migration's "
                                        "scratch image, docs/migration.md): it cannot be restored from files");
    if (options.lazy && options.peer_image_id.empty())
      return Status::InvalidArgument("a restore from a peer session's memory is not lazy");
    const auto tp = std::chrono::steady_clock::now();
    POS_RETURN_IF_ERROR(bc.copy_from_peer(*options.peer, from_peer).with_context("copying from the peer session's memory"));
    uint64_t bytes = 0;
    for (const PeerBuffer& b : from_peer) bytes += b.size;
    peer_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count();
    POS_INFO(log_name_, "copied %zu buffers (%lu bytes) from the %s session's memory in %.3f s", from_peer.size(),
             (unsigned long)bytes, options.peer_image_id.empty() ? "peer" : "staging", peer_s);
  }
  // Variables go through the worker's backend (their device address is the module's).
  std::vector<std::byte> buf;
  for (const Piece& p : pieces) {
    if (!p.is_var) continue;
    buf.resize(p.ref->length());
    for (uint64_t off = 0; off < p.ref->length(); off += p.ref->chunk_size()) {
      const uint64_t n = std::min<uint64_t>(p.ref->chunk_size(), p.ref->length() - off);
      POS_RETURN_IF_ERROR(p.img->read_chunk(*p.ref, off, n, buf.data() + off));
    }
    POS_RETURN_IF_ERROR(bc.memcpy_h2d(p.addr, buf.data(), buf.size()));
  }
  if (options.lazy) {
    // The buffers' bytes come later: on first use (the worker) and from background loaders.
    lazy_ = std::make_shared<LazyLoader>(image_ptr, backend_, log_name_);
    for (const Piece& p : pieces)
      if (!p.is_var) lazy_->add(p.addr, p.ref->length(), p.img, p.ref);
  } else {
    struct Task {
      const Piece* piece;
      uint64_t off, n;
    };
    std::vector<Task> tasks;
    for (const Piece& p : pieces) {
      if (p.is_var) continue;
      for (uint64_t off = 0; off < p.ref->length(); off += p.ref->chunk_size())
        tasks.push_back(Task{&p, off, std::min<uint64_t>(p.ref->chunk_size(), p.ref->length() - off)});
    }
    std::atomic<size_t> next{0};
    std::mutex err_mu;
    Status first;
    auto loader = [&] {
      auto copier = bc.make_copier();
      ChunkStaging staging(backend_);
      Status s = copier.ok() ? Status::Ok() : copier.status();
      while (s.ok()) {
        const size_t i = next.fetch_add(1);
        if (i >= tasks.size()) break;
        const Task& t = tasks[i];
        s = load_chunk(*t.piece->img, *t.piece->ref, t.off, t.n, t.piece->addr, **copier, staging);
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (first.ok()) first = s;
        next.store(tasks.size());
      }
    };
    const size_t nthreads = std::clamp<size_t>(tasks.size(), 1, restore_loader_threads());
    std::vector<std::thread> threads;
    for (size_t i = 1; i < nthreads; ++i) threads.emplace_back(loader);
    loader();
    for (auto& th : threads) th.join();
    POS_RETURN_IF_ERROR(first);
  }
  POS_RETURN_IF_ERROR(bc.synchronize_all());

  for (const auto& m : cr.managers())
    if (m.type() < static_cast<uint32_t>(ResourceType::kCount)) ps_.managers[m.type()]->set_cursors(m.next_id(), m.next_slot());
  ps_.current_device = cr.current_device();
  next_pc_ = cr.next_pc();
  last_parsed_pc_ = cr.next_pc() - 1;
  ws_.set_async_error(cr.async_error(), cr.async_error_message());
  memory_in_use_.store(ps_.memory_in_use);
  update_live_handles();  // (the restore hooks have filled ws_.loaded, for a later device move)
  if (lazy_) {
    // Last: from here on the loaders write device memory, so nothing above may fail after them.
    const auto tl = std::chrono::steady_clock::now();
    premade = backend_->staging_chunks_kept();
    POS_RETURN_IF_ERROR(lazy_->start(bc, restore_loader_threads(), options.hold_loader));
    loaders_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
    lazy_worker_ = lazy_.get();
  }
  POS_INFO(log_name_, "restored %d handles at cut %lu%s in %.3f s (handles and their memory %.3f s, peer copy %.3f s, "
           "loaders' start %.3f s with %zu staging chunks kept)", img.handles_size(), (unsigned long)cr.next_pc(),
           lazy_ ? " (buffers load lazily)" : "", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
           handles_s, peer_s, loaders_s, premade);
  return Status::Ok();
}

// ---------------- stop checkpoints (CheckpointRequest::stop) ----------------

// Parser. Holding: calls that return after parsing are parsed and handed to the worker, which
// holds them; a call that waits for the worker stops the intake (its caller has no answer yet, and
// the calls behind it keep their order). Frozen or stopped: every call is answered kUnavailable.
bool POSClient::intake_while_stopping() {
  bool progressed = false;
  APIContext* c = nullptr;
  for (int i = 0; i < 64 && rpc2parser_wq_.read_available() > 0; ++i) {
    if (stop_phase_ == StopPhase::kHolding) {
      if (rpc2parser_wq_.front()->info->mode == ReturnMode::kSync) break;
      (void)rpc2parser_wq_.pop(c);
      if (parse_popped(c)) pending_.push_back(c);
    } else {  // kFrozen, kStopped
      (void)rpc2parser_wq_.pop(c);
      refuse_stopped(c);
    }
    progressed = true;
  }
  return progressed;
}

bool POSClient::held_at_sync_call() {
  return stop_phase_ == StopPhase::kHolding && rpc2parser_wq_.read_available() > 0 &&
         rpc2parser_wq_.front()->info->mode == ReturnMode::kSync;
}

bool POSClient::stop_needs_parser() {
  return parser_stop_job_ != nullptr && ((stop_phase_ == StopPhase::kHolding && parser_stop_job_->seal_requested()) ||
                                         parser_stop_job_->drained());
}

void POSClient::refuse_stopped(APIContext* c) {
  c->begin_parse();
  c->status = Status::Unavailable("client " + std::to_string(uuid_) + " stopped at checkpoint cut " +
                                  std::to_string(stop_cut_) + ": " + std::string(c->info->name) +
                                  " (pc " + std::to_string(c->pc) + ") was not run and is not in the image");
  POS_DEBUG(log_name_, "%s", c->status.message().c_str());
  c->skip_worker = true;
  c->advance(kDone);
  complete_to_rpc(c);
}

bool POSClient::update_stop_phase() {
  if (parser_stop_job_ == nullptr) return false;
  CheckpointJob& job = *parser_stop_job_;
  if (stop_phase_ == StopPhase::kHolding && job.seal_requested()) {
    // The device bytes are in the image. From now on nothing is accepted, so the calls handed to
    // the worker since the cut are exactly the pending calls. The worker has only held them: their
    // parameter bytes are as submitted, their answers as the parser gave them.
    std::vector<ckpt::pb::PendingCall> calls;
    calls.reserve(pending_.size());
    Status st;
    uint64_t min_pc = stop_cut_, total = 0;
    if (pending_.size() > ckpt::kMaxPendingCalls)
      st = Status::Internal(std::to_string(pending_.size()) + " calls after the cut, more than an image holds");
    for (size_t i = 0; st.ok() && i < pending_.size(); ++i) {
      const APIContext& c = *pending_[i];
      ckpt::pb::PendingCall p;
      p.set_pc(c.pc);
      p.set_api_id(static_cast<uint32_t>(c.api_id));
      for (size_t k = 0; k < c.param_count(); ++k) {
        const auto b = c.param_bytes(k);
        p.add_params(std::string(reinterpret_cast<const char*>(b.data()), b.size()));
        total += b.size();
      }
      if (c.ret_size > 0) p.set_ret(std::string(reinterpret_cast<const char*>(c.ret.data()), c.ret_size));
      // The writer stores only what a reader takes.
      st = ckpt::validate_pending_call(p, min_pc);
      if (st.ok() && total > ckpt::kMaxPendingBytes)
        st = Status::Internal("the calls after the cut carry more than " + std::to_string(ckpt::kMaxPendingBytes) +
                              " parameter bytes");
      min_pc = c.pc + 1;
      calls.push_back(std::move(p));
    }
    if (!st.ok()) {
      st = Status(Code::kOutOfRange, cuda::kErrorUnknown,
                  "client " + std::to_string(uuid_) + ": cannot keep the calls after the cut: " + st.message());
      calls.clear();
    }
    pending_.clear();
    stop_phase_ = StopPhase::kFrozen;
    job.seal(std::move(calls), std::move(st), ps_.async_error->load(std::memory_order_acquire));
    return true;
  }
  if (!job.drained()) return false;
  if (job.succeeded()) {
    stop_phase_ = StopPhase::kStopped;  // for good: the worker drops the held calls
  } else {
    stop_phase_ = StopPhase::kNone;  // the worker runs the held calls; parsing goes on
    pending_.clear();
  }
  parser_stop_job_.reset();
  return true;
}

// Worker, past a stop checkpoint's cut.
bool POSClient::worker_stopped_step() {
  bool progressed = false;
  APIContext* c = nullptr;
  while (parser2worker_wq_.pop(c)) {
    progressed = true;
    if (worker_dead_) return_unexecuted(c);
    else held_.push_back(c);
  }
  if (worker_stop_job_ != nullptr && worker_stop_job_->drained()) {
    // Succeeded: the held calls are in the image, and this client never runs them. Failed: the
    // client runs on, and they run now, in pc order, before anything the parser hands on later.
    const bool stopped = worker_stop_job_->succeeded();
    for (APIContext* h : held_) {
      if (stopped) return_unexecuted(h);
      else execute_call(h);
    }
    held_.clear();
    worker_dead_ = stopped;
    worker_stop_job_.reset();
    progressed = true;
  }
  Command* cmd = nullptr;
  if (worker_dead_ && cmd_worker_wq_.pop(cmd)) {  // refused by run_command; never expected here
    cmd->status = Status::FailedPrecondition("client " + std::to_string(uuid_) + " was stopped by a checkpoint");
    push_blocking(cmd_worker_cq_, cmd, parser_bell_, worker_bell_);
    progressed = true;
  }
  if (progressed) {
    flush_worker_completions();  // held calls run after a failure come back through the worker's CQ
    parser_bell_.ring();
  }
  return progressed;
}

void POSClient::return_unexecuted(APIContext* c) {
  // Its caller returned long ago (it returns after parsing); the context just goes home.
  c->advance(kDone);
  while (!parser2worker_cq_.push(c)) cpu_relax();
}

// Restore, once the threads run and before anyone can see the client: the image's pending calls
// go through the parser and worker again with their own pcs. Each must parse to the answer the app
// got; a window of them is in flight at a time (the context pool is bounded).
Status POSClient::replay_pending(const ckpt::pb::ClientImage& img) {
  const auto& pending = img.pending();
  if (pending.empty()) return Status::Ok();
  struct InFlight {
    APIContext* c;
    const ckpt::pb::PendingCall* p;
  };
  std::deque<InFlight> window;
  Status first;
  auto settle = [&](const InFlight& f) {
    f.c->state.wait_at_least(f.c->state_base + kParsed, config_.spin_ns);
    const std::string name(f.c->info->name);
    if (first.ok() && !f.c->status.ok()) {
      first = Status::Corrupt("replaying pending call pc " + std::to_string(f.p->pc()) + " (" + name +
                              "): " + f.c->status.to_string());
    } else if (first.ok() &&
               std::string_view(reinterpret_cast<const char*>(f.c->ret.data()), f.c->ret_size) != f.p->ret()) {
      first = Status::Corrupt("replaying pending call pc " + std::to_string(f.p->pc()) + " (" + name +
                              ") gave another answer than the application got");
    }
    f.c->caller_released.store(true, std::memory_order_release);
  };
  const size_t max_window = std::max<size_t>(1, config_.queue_depth);
  {
    std::lock_guard<std::mutex> lk(submit_mu_);
    for (const ckpt::pb::PendingCall& p : pending) {
      const ApiInfo* api = find_api(p.api_id());  // validated when the image was opened
      if (api == nullptr) {
        first = Status::Corrupt("pending call pc " + std::to_string(p.pc()) + ": unknown api id");
        break;
      }
      if (window.size() >= max_window) {
        settle(window.front());
        window.pop_front();
      }
      if (!first.ok()) break;
      APIContext* c = acquire_context();
      c->api_id = api->id;
      c->info = api;
      c->client_uuid = uuid_;
      c->pc = p.pc();
      c->replay_ret = &p.ret();
      c->set_params(
          static_cast<size_t>(p.params_size()), [&](size_t i) { return uint64_t{p.params(static_cast<int>(i)).size()}; },
          [&](size_t i) { return p.params(static_cast<int>(i)).data(); });
      c->t_submit_ns = 0;
      submitted_.store(submitted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      push_blocking(rpc2parser_wq_, c, parser_bell_, rpc_bell_);
      window.push_back(InFlight{c, &p});
      next_pc_ = p.pc() + 1;  // the client's own calls continue after the last pending one
    }
  }
  for (const InFlight& f : window) settle(f);
  if (!first.ok()) return first.with_context("restore of client " + std::to_string(uuid_));
  POS_INFO(log_name_, "replayed %d pending calls, pcs %lu to %lu", static_cast<int>(pending.size()),
           (unsigned long)pending.begin()->pc(), (unsigned long)pending.rbegin()->pc());
  return Status::Ok();
}

}  // namespace pos
