// client_checkpoint.cc — a client's side of checkpoint and restore: the parser records every live
// handle at the cut (metadata is parser-owned), and a restored client rebuilds them from an image.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "pos/client.h"
#include "pos/cuda_impl/api_functions.h"
#include "pos/log.h"

namespace pos {
namespace {

constexpr int kKeyShift = 56;
uint64_t key_of(const Handle* h) { return (static_cast<uint64_t>(h->type) << kKeyShift) | h->id; }
ResourceType type_of_key(uint64_t key) { return static_cast<ResourceType>(key >> kKeyShift); }
uint64_t id_of_key(uint64_t key) { return key & ((uint64_t{1} << kKeyShift) - 1); }
// Background loaders of a lazy restore: as many as eager restore uses, so a job that never waits
// still gets its state at full speed.
constexpr size_t kLazyLoaders = 8;

}  // namespace

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
  cr->set_default_stream(key_of(ps_.default_stream));
  for (size_t t = 0; t < static_cast<size_t>(ResourceType::kCount); ++t) {
    auto* m = cr->add_managers();
    m->set_type(static_cast<uint32_t>(t));
    m->set_next_id(ps_.managers[t]->next_id());
    m->set_next_slot(ps_.managers[t]->next_slot());
  }
  // Buffers the parent image holds unchanged: written last before the parent's cut.
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> in_parent;  // key → (addr, size)
  uint64_t parent_cut = 0;
  if (const ckpt::ImageReader* p = job.parent()) {
    parent_cut = p->inventory().cut_pc();
    for (const auto& h : p->client().handles())
      if (h.has_memory()) in_parent[h.id()] = {h.addr(), h.size()};
  }
  // Types in enum order put parents first (device < context < stream, module < function, ...).
  for (size_t t = 0; t < static_cast<size_t>(ResourceType::kCount); ++t) {
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
      r->set_charged(h->charged);
      r->set_flags(h->flags);
      r->set_priority(h->priority);
      r->set_math_mode(h->math_mode);
      r->set_bound_stream(h->bound_stream);
      r->set_name(h->name);
      if (!h->blob.empty()) r->set_fatbin(h->blob.data(), h->blob.size());
      r->set_recorded(h->recorded);
      for (auto [a, v] : h->func_attrs) {
        auto* fa = r->add_func_attrs();
        fa->set_attr(a);
        fa->set_value(v);
      }
      const bool is_var = h->type == ResourceType::kVar;
      if (h->type != ResourceType::kMemory && !is_var) continue;
      auto it = in_parent.find(key_of(h));
      // Variables are always stored: kernels write them without naming them.
      if (!is_var && it != in_parent.end() && it->second == std::make_pair(h->client_addr, h->size) &&
          h->version < parent_cut) {
        r->mutable_memory()->set_in_parent(true);
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
  if (const ckpt::ImageReader* p = job.parent()) {
    inv.add_features("incremental");
    auto* pp = inv.mutable_parent();
    namespace fs = std::filesystem;
    const fs::path child = fs::absolute(fs::path(job.request().dir)).lexically_normal();
    const fs::path parent = fs::absolute(fs::path(p->dir())).lexically_normal();
    pp->set_path(parent.lexically_relative(child).string());  // resolved against the image's own dir
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
  if (cr.va_base() != ps_.va_base || cr.va_size() != config_.va_size)
    return Status::FailedPrecondition("image client range " + cuda_impl::hex(cr.va_base()) + " + " + cuda_impl::hex(cr.va_size()) +
                                      " differs from the slot's " + cuda_impl::hex(ps_.va_base) + " + " + cuda_impl::hex(config_.va_size));
  std::unordered_map<uint64_t, Handle*> by_key;
  BackendClient& bc = *backend_client_;
  for (const auto& r : img.handles()) {
    const ResourceType t = type_of_key(r.id());
    if (static_cast<uint32_t>(t) != r.type() || t >= ResourceType::kCount)
      return Status::Corrupt("handle " + std::to_string(r.id()) + ": key and type disagree");
    std::vector<Handle*> parents;
    for (uint64_t p : r.parents()) parents.push_back(by_key.at(p));  // validated: earlier records
    HandleManager& m = ps_.mgr(t);
    const bool bytes = t == ResourceType::kMemory || t == ResourceType::kVar;
    if (bytes && (r.size() == 0 || !m.contains_range(r.addr())))
      return Status::Corrupt("buffer " + cuda_impl::hex(r.addr()) + " lies outside the client's range");
    auto h = m.adopt_at(r.addr(), r.size(), std::move(parents), r.created_pc(), id_of_key(r.id()));
    if (!h.ok()) return h.status().with_context("restoring " + std::string(resource_type_name(t)) + " " + cuda_impl::hex(r.addr()));
    Handle* x = *h;
    by_key[r.id()] = x;
    x->version = r.version();
    x->flags = r.flags();
    x->priority = r.priority();
    x->math_mode = r.math_mode();
    x->bound_stream = r.bound_stream();
    x->name = r.name();
    x->blob.assign(reinterpret_cast<const std::byte*>(r.fatbin().data()),
                   reinterpret_cast<const std::byte*>(r.fatbin().data()) + r.fatbin().size());
    x->recorded = r.recorded();
    for (const auto& fa : r.func_attrs()) x->func_attrs.emplace_back(fa.attr(), fa.value());
    const std::string what = std::string(resource_type_name(t)) + " " + cuda_impl::hex(r.addr());
    switch (t) {
      case ResourceType::kDevice: ps_.device = x; break;
      case ResourceType::kContext: ps_.context = x; break;
      case ResourceType::kStream:
        if (r.id() == cr.default_stream()) {
          ps_.default_stream = x;
          x->backend_obj = 0;
        } else {
          auto s = bc.stream_create(r.flags(), r.priority());
          if (!s.ok()) return s.status().with_context(what);
          x->backend_obj = *s;
        }
        break;
      case ResourceType::kEvent: {
        auto e = bc.event_create(r.flags());
        if (!e.ok()) return e.status().with_context(what);
        x->backend_obj = *e;
        // A recorded event had completed by the cut (the cut synchronizes): record it again so
        // that queries and waits see it complete.
        if (r.recorded()) POS_RETURN_IF_ERROR(bc.event_record(*e, 0).with_context(what));
        break;
      }
      case ResourceType::kMemory:
      case ResourceType::kVar: {
        x->charged = r.charged();
        if (x->charged < r.size()) return Status::Corrupt(what + ": charged less than its size");
        if (!backend_->try_reserve(x->charged))
          return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation, what + ": device memory exhausted");
        if (t == ResourceType::kMemory) {
          ps_.memory_in_use += x->charged;
          POS_RETURN_IF_ERROR(bc.alloc_at(r.addr(), r.size()).with_context(what));
        } else {
          POS_RETURN_IF_ERROR(bc.var_bind(x->parents.at(0)->backend_obj, x->name, r.addr(), r.size()).with_context(what));
        }
        break;
      }
      case ResourceType::kModule: {
        auto mod = bc.module_load(x->blob);
        if (!mod.ok()) return mod.status().with_context(what);
        x->backend_obj = *mod;
        break;
      }
      case ResourceType::kFunction: {
        if (x->parents.empty() || x->parents[0]->type != ResourceType::kModule)
          return Status::Corrupt(what + ": a function needs its module");
        auto info = bc.function_get(x->parents[0]->backend_obj, x->name);
        if (!info.ok()) return info.status().with_context(what);
        x->backend_obj = info->obj;
        x->resolved = info->found;
        x->layout = info->layout;
        x->param_bytes = info->param_bytes;
        for (auto [a, v] : x->func_attrs) POS_RETURN_IF_ERROR(bc.function_set_attribute(x->backend_obj, a, v).with_context(what));
        break;
      }
      case ResourceType::kCublas: {
        auto b = bc.blas_create();
        if (!b.ok()) return b.status().with_context(what);
        x->backend_obj = *b;
        POS_RETURN_IF_ERROR(bc.blas_set_math_mode(*b, r.math_mode()).with_context(what));
        break;
      }
      case ResourceType::kCount: break;
    }
  }
  if (ps_.device == nullptr || ps_.context == nullptr || ps_.default_stream == nullptr)
    return Status::Corrupt("image lacks the client's device, context or default stream");
  // cuBLAS handles follow their streams (created above).
  for (const auto& [key, x] : by_key) {
    if (x->type != ResourceType::kCublas) continue;
    x->bound_stream_handle = ps_.stream(x->bound_stream);
    if (x->bound_stream_handle == nullptr) x->bound_stream_handle = ps_.default_stream, x->bound_stream = 0;
    POS_RETURN_IF_ERROR(bc.blas_set_stream(x->backend_obj, x->bound_stream_handle->backend_obj));
  }

  // Device bytes: several threads each read (and verify) chunks and copy them on their own lane.
  struct Piece {
    const ckpt::ImageReader* img;
    const ckpt::pb::BlobRef* ref;
    uint64_t addr;
    bool is_var;
  };
  std::vector<Piece> pieces;
  for (const auto& r : img.handles()) {
    if (!r.has_memory()) continue;
    auto src = image.resolve(r);
    if (!src.ok()) return src.status();
    pieces.push_back(Piece{src->first, src->second, r.addr(), type_of_key(r.id()) == ResourceType::kVar});
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
    lazy_ = std::make_shared<LazyLoader>(image_ptr, backend_,
                                         "client " + std::to_string(uuid_) + " (" + job_name_ + ")");
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
    // Each loader verifies its chunk's checksum on the CPU before the copy: eight keep the link busy.
    const size_t nthreads = std::clamp<size_t>(tasks.size(), 1, 8);
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
  update_live_handles();
  if (lazy_) {
    // Last: from here on the loaders write device memory, so nothing above may fail after them.
    POS_RETURN_IF_ERROR(lazy_->start(bc, kLazyLoaders, options.hold_loader));
    lazy_worker_ = lazy_.get();
  }
  POS_INFO("client %lu (%s): restored %d handles at cut %lu%s", (unsigned long)uuid_, job_name_.c_str(),
           img.handles_size(), (unsigned long)cr.next_pc(), lazy_ ? " (buffers load lazily)" : "");
  return Status::Ok();
}

}  // namespace pos
