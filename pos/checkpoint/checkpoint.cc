// checkpoint.cc — the drainer and copy-on-write of a checkpoint job.
// The drainer copies chunk by chunk under each region's lock; the worker, before a call writes a
// region not yet drained, takes the same lock (so no copy of the old bytes is in flight) and
// moves the undrained rest to a device shadow, ordered before the call's own work. The pool of
// shadows is bounded.
#include "pos/checkpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "pos/api_context.h"
#include "pos/handle.h"
#include "pos/base/hex.h"
#include "pos/base/log.h"
#include "pos/base/sync.h"

namespace pos {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ckpt::HostAllocator pinned_allocator(DeviceBackend* device) {
  return ckpt::HostAllocator{[device](uint64_t n) -> void* {
                               auto p = device->host_alloc(n);
                               return p.ok() ? *p : nullptr;
                             },
                             [device](void* p) { (void)device->host_free(p); }};
}

// The directory writer's staging: chunks only, the backend's kept ones (given back, not freed, so
// that the next checkpoint does not page-lock them again).
static ckpt::HostAllocator staging_chunk_allocator(DeviceBackend* device) {
  return ckpt::HostAllocator{[device](uint64_t n) -> void* {
                               if (n != DeviceBackend::kStagingChunkBytes) return nullptr;
                               auto p = device->take_staging_chunk();
                               return p.ok() ? *p : nullptr;
                             },
                             [device](void* p) { device->give_staging_chunk(p); }};
}

size_t checkpoint_staging_chunks() { return ckpt::DirWriterOptions{}.staging_chunks(); }

StatusOr<CheckpointMode> parse_checkpoint_mode(const std::string& s) {
  if (s == "sync") return CheckpointMode::kSync;
  if (s == "async") return CheckpointMode::kAsync;
  return Status::InvalidArgument("checkpoint mode must be sync or async, not '" + s + "'");
}

CheckpointJob::~CheckpointJob() {
  if (drainer_.joinable()) drainer_.join();
  std::lock_guard<std::mutex> lk(pool_mu_);
  for (auto& r : regions_)
    if (r->shadow != 0 && shadow_copier_) shadow_copier_->shadow_free(r->shadow);
}

Status CheckpointJob::prepare(uint64_t default_shadow_pool, int device) {
  t0_ = seconds_now();
  shadow_limit_ = req_.shadow_pool_bytes != 0 ? req_.shadow_pool_bytes : default_shadow_pool;
  device_index_ = device;
  if (req_.dir.empty() == (req_.memory == nullptr))
    return Status::InvalidArgument("a checkpoint needs exactly one target: a directory or a memory image");
  if (req_.stop && req_.mode != CheckpointMode::kSync)
    return Status::InvalidArgument("a stop checkpoint is sync: the client never runs past its cut, so there is "
                                   "nothing for copy-on-write to protect");
  if (!req_.parent_dir.empty()) {
    if (req_.memory != nullptr) return Status::InvalidArgument("incremental checkpoints go to a directory");
    auto p = ckpt::ImageReader::open_dir(req_.parent_dir);
    if (!p.ok()) return p.status().with_context("parent image " + req_.parent_dir);
    parent_ = std::move(*p);
  }
  if (req_.memory != nullptr) {
    auto w = ckpt::open_memory_writer(req_.memory);
    if (!w.ok()) return w.status();
    writer_ = std::move(*w);
  } else {
    ckpt::DirWriterOptions o;
    o.replace = req_.replace;
    o.alloc = staging_chunk_allocator(device_);
    o.on_written = req_.on_written;
    // The job runs on while this one is written (copy-on-write, not a stop): its writers yield the
    // CPU to the session's worker. At nice 0, on the 8 cores posd was pinned to, they made the
    // MLP job's steps during a tick up to 1.5x; on 10 cores 1.15x (docs/BENCHMARKS.md, 2026-11-29).
    if (req_.mode == CheckpointMode::kAsync && !req_.stop) o.nice = 19;
    if (req_.peer) {
      // A peer switch's image holds handles and variables only, and is taken while the job waits:
      // no page-locked staging (allocating it costs tens of milliseconds), one memory file.
      o.alloc = ckpt::HostAllocator::plain();
      o.staging_buffers = 2;
      o.memory_files = 1;
    }
    auto w = ckpt::open_dir_writer(req_.dir, o);
    if (!w.ok()) return w.status();
    writer_ = std::move(*w);
  }
  return Status::Ok();
}

void CheckpointJob::add_region(uint64_t key, uint64_t addr, uint64_t size, bool is_var, int record) {
  auto r = std::make_unique<DrainRegion>();
  r->key = key, r->addr = addr, r->size = size, r->is_var = is_var, r->record = record;
  if (!is_var) by_addr_[addr] = r.get();
  total_bytes_ += size;
  regions_.push_back(std::move(r));
}

void CheckpointJob::source_from_image(uint64_t addr, const ckpt::ImageReader* img, const ckpt::pb::BlobRef* ref,
                                      std::shared_ptr<const ckpt::ImageReader> owner) {
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return;  // not stored in this image (an incremental one references it)
  it->second->src_img = img;
  it->second->src_ref = ref;
  source_image_ = std::move(owner);
}

Status CheckpointJob::start_at_cut(BackendClient* backend, double stall_start_s) {
  // Variables can be written by any kernel of their module (no edge names them): they are
  // captured now, while the client is stopped. They are small.
  for (auto& r : regions_) {
    if (!r->is_var) continue;
    r->host_copy.resize(r->size);
    POS_RETURN_IF_ERROR(backend->memcpy_d2h(r->host_copy.data(), r->addr, r->size));
  }
  auto dc = backend->make_copier();
  if (!dc.ok()) return dc.status();
  drain_copier_ = std::move(*dc);
  if (req_.mode == CheckpointMode::kAsync) {
    auto sc = backend->make_copier();
    if (!sc.ok()) return sc.status();
    shadow_copier_ = std::move(*sc);
    if (shadow_limit_ == 0) {
      // Auto: room to shadow every buffer once (then the job never waits for the drainer), but
      // never more than half of what is free, so the job's own allocations keep their headroom.
      uint64_t buffers = 0;
      for (auto& r : regions_)
        if (!r->is_var) buffers += r->size;
      MemInfo mi{};
      const uint64_t half_free = device_->mem_info(device_index_, &mi).ok() ? mi.free / 2 : 0;
      shadow_limit_ = std::min(buffers, half_free);
    }
  }
  stall_start_s_ = stall_start_s;
  result_.drain_start_s = seconds_now();
  result_.to_cut_s = result_.drain_start_s - t0_;
  drainer_ = std::thread([this] {
    name_this_thread("pos-ckpt-drain");
    drain_main();
  });
  if (req_.on_cut) req_.on_cut(inventory_.cut_pc());
  // A stop checkpoint's worker does not wait here: it goes back to holding (never running) the
  // calls after the cut, which the parser keeps handing it until the seal.
  if (req_.mode == CheckpointMode::kSync && !req_.stop) {
    std::unique_lock<std::mutex> lk(done_mu_);
    done_cv_.wait(lk, [&] { return done_; });
  }
  result_.stall_s = seconds_now() - stall_start_s;
  return Status::Ok();
}

void CheckpointJob::protect(const APIContext& c) {
  for (size_t i = 0; i < c.edges.size(); ++i) {
    const Edge& e = c.edges[i];
    if (e.kind == EdgeKind::kIn || e.kind == EdgeKind::kCreate) continue;
    if (e.handle->type != ResourceType::kMemory) continue;
    auto it = by_addr_.find(e.handle->client_addr);
    if (it != by_addr_.end()) protect_region(*it->second);
  }
}

void CheckpointJob::protect_region(DrainRegion& r) {
  if (r.src_img != nullptr) return;  // drained from the image: the device's bytes are not read
  // The worker's time here is time the job's calls wait: reported with the checkpoint.
  struct Timed {
    std::atomic<uint64_t>& total;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timed() {
      const auto d = std::chrono::steady_clock::now() - t0;
      total.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
                      std::memory_order_relaxed);
    }
  } timed{shadow_ns_};
  std::unique_lock<std::mutex> lk(r.mu);  // waits out a chunk the drainer has in flight
  while (!r.done && r.shadow == 0) {
    const uint64_t need = r.size - r.drained;
    {
      std::lock_guard<std::mutex> pl(pool_mu_);
      if (shadow_in_use_ + need <= shadow_limit_) {
        const double a0 = seconds_now();
        auto s = shadow_copier_->shadow_alloc(need);
        shadow_alloc_s_ += seconds_now() - a0;
        if (s.ok()) {
          shadow_in_use_ += need;
          shadow_total_ += need;
          // The call that writes the buffer runs after the copy; on a GPU the client's streams
          // wait for it on the device, so the worker goes on at once (DeviceCopier).
          Status c = shadow_copier_->device_copy_async(*s, r.addr + r.drained, need, 0);
          if (c.ok()) c = shadow_copier_->order_client_after(0);
          if (c.ok()) {
            r.shadow = *s;
            r.shadow_from = r.drained;
            return;
          }
          POS_ERROR("ckpt", "shadow copy of %s failed: %s", hex(r.addr).c_str(), c.to_string().c_str());
          shadow_copier_->shadow_free(*s);
          shadow_in_use_ -= need;
        }
      }
    }
    // No room (or no memory) for a shadow: the drainer takes this region next; wait for it.
    r.urgent.store(true, std::memory_order_release);
    lk.unlock();
    if (req_.on_pool_full) req_.on_pool_full();
    {
      std::unique_lock<std::mutex> pl(pool_mu_);
      ++shadow_waits_;
      pool_cv_.wait_for(pl, std::chrono::milliseconds(1));
    }
    lk.lock();
  }
}

void CheckpointJob::drain_main() {
  Status s = drain_all();
  // Done with shadows (a failed drain's still held are freed with the job, and stay reserved).
  if (shadow_copier_) result_.shadow_kept = shadow_copier_->settle_shadows();
  if (s.ok()) s = writer_->finish_blobs();
  if (s.ok()) {
    for (auto& r : regions_) {
      ckpt::pb::HandleRecord* h = image_.mutable_handles(r->record);
      *h->mutable_memory() = writer_->ref(r->blob);
    }
    inventory_.set_blob_bytes(total_bytes_);
    if (req_.stop) s = wait_for_seal();
  }
  if (s.ok()) s = writer_->commit(inventory_, image_);
  if (!s.ok()) writer_->abort();
  finish(s);
}

// Drainer, stop checkpoints: the device state is in the image; the parser now stops accepting
// calls and hands over the ones after the cut. The parser runs until the client's shutdown, and
// shutdown waits for a stop checkpoint in flight, so the seal always comes.
Status CheckpointJob::wait_for_seal() {
  seal_requested_.store(true, std::memory_order_release);
  if (wake_) wake_();
  std::unique_lock<std::mutex> lk(seal_mu_);
  seal_cv_.wait(lk, [&] { return sealed_; });
  POS_RETURN_IF_ERROR(seal_status_);
  if (sealed_async_error_ == 0) {  // the app read it after the cut: it must not see it twice
    image_.mutable_client()->set_async_error(0);
    image_.mutable_client()->clear_async_error_message();
  }
  for (ckpt::pb::PendingCall& p : pending_) *image_.add_pending() = std::move(p);
  pending_.clear();
  result_.pending_calls = static_cast<uint64_t>(image_.pending_size());
  if (image_.pending_size() > 0) inventory_.add_features("pending-calls");
  return Status::Ok();
}

void CheckpointJob::seal(std::vector<ckpt::pb::PendingCall> calls, Status status, int32_t async_error) {
  std::lock_guard<std::mutex> lk(seal_mu_);
  pending_ = std::move(calls);
  seal_status_ = std::move(status);
  sealed_async_error_ = async_error;
  sealed_ = true;
  seal_cv_.notify_all();
}

bool CheckpointJob::succeeded() const {
  std::lock_guard<std::mutex> lk(done_mu_);
  return done_ && status_.ok();
}

Status CheckpointJob::drain_all() {
  if (req_.hold_drain != nullptr)
    while (req_.hold_drain->load(std::memory_order_acquire)) std::this_thread::yield();
  for (auto& r : regions_) POS_RETURN_IF_ERROR(writer_->begin_blob(r->size, &r->blob));
  // Regions the worker waits for come first; the rest in order. A writer that spreads blobs over
  // several files (ckpt format 3) writes them side by side only if chunks of several files are
  // queued at once: so one region per file is drained at a time, a round of each in turn.
  struct Active {
    DrainRegion* r;
    uint64_t base;
    uint32_t file;
  };
  std::vector<Active> active;
  std::vector<bool> taken(regions_.size(), false);
  size_t next = 0, left = regions_.size();
  // A striped blob feeds every file's writer in turn on its own: it counts as a file of its own.
  auto file_of = [&](const DrainRegion& r) {
    const ckpt::pb::BlobRef& ref = writer_->ref(r.blob);
    return ref.stripes() >= 2 ? UINT32_MAX : ref.file();
  };
  auto busy = [&](uint32_t f) {
    return std::any_of(active.begin(), active.end(), [&](const Active& a) { return a.file == f; });
  };
  for (;;) {
    for (size_t i = 0; i < regions_.size(); ++i)  // urgent ones at once, whatever their file
      if (!taken[i] && regions_[i]->urgent.load(std::memory_order_acquire)) {
        taken[i] = true, --left;
        active.insert(active.begin(), Active{regions_[i].get(), 0, file_of(*regions_[i])});
      }
    for (size_t i = next; i < regions_.size() && left > 0; ++i) {  // then one per idle file
      if (taken[i]) continue;
      const uint32_t f = file_of(*regions_[i]);
      if (busy(f) && !active.empty()) continue;
      taken[i] = true, --left;
      active.push_back(Active{regions_[i].get(), 0, f});
    }
    while (next < regions_.size() && taken[next]) ++next;
    if (active.empty()) break;
    for (size_t k = 0; k < active.size();) {
      Active& a = active[k];
      POS_RETURN_IF_ERROR(drain_round(*a.r, a.base, &a.base));
      if (a.base >= a.r->size) {
        finish_region(*a.r);
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(k));
        break;  // a file came free: fill it (and look for urgent regions) before the next turn
      }
      ++k;
    }
  }
  return Status::Ok();
}

Status CheckpointJob::drain_round(DrainRegion& r, uint64_t base, uint64_t* next) {
  // A few chunks per round (the writer says how many it can lend at once), copied as one batch so
  // that the copier can keep them all in flight; the region's lock is held for the round, so the
  // worker's copy-on-write sees `drained` move only past bytes that are in the image.
  const uint64_t round = static_cast<uint64_t>(std::max(1u, writer_->chunks_at_once())) * ckpt::kChunkSize;
  std::vector<HostSpan> parts;
  const uint64_t end = std::min(r.size, base + round);
  for (uint64_t off = base; off < end || (r.size == 0 && off == 0); off += ckpt::kChunkSize) {
    const uint64_t n = std::min<uint64_t>(ckpt::kChunkSize, r.size - off);
    auto buf = writer_->chunk(r.blob, off, n);
    if (!buf.ok()) return buf.status();
    parts.push_back(HostSpan{*buf, 0, n});
    if (r.size == 0) break;
  }
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.is_var) {
      for (size_t i = 0; i < parts.size(); ++i) std::memcpy(parts[i].host, r.host_copy.data() + base + i * ckpt::kChunkSize, parts[i].n);
    } else if (r.src_img != nullptr) {
      POS_RETURN_IF_ERROR(copy_from_image(r, base, parts));
    } else if (end > base) {
      // A shadow's copy may still be in flight (the worker did not wait for it).
      if (r.shadow != 0 && end > r.shadow_from) POS_RETURN_IF_ERROR(shadow_copier_->wait(0));
      for (size_t i = 0; i < parts.size(); ++i) {
        const uint64_t off = base + i * ckpt::kChunkSize;
        parts[i].dev = (r.shadow != 0 && off >= r.shadow_from) ? r.shadow + (off - r.shadow_from) : r.addr + off;
      }
      POS_RETURN_IF_ERROR(drain_copier_->to_host_batch(parts, 0));
    }
    r.drained = end;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint64_t off = base + i * ckpt::kChunkSize;
    POS_RETURN_IF_ERROR(writer_->chunk_filled(r.blob, off, parts[i].n));
    result_.bytes_stored += parts[i].n;
    if (req_.progress) req_.progress(result_.bytes_stored, total_bytes_);
  }
  *next = r.size == 0 ? 1 : end;  // an empty region is one (empty) round
  return Status::Ok();
}

void CheckpointJob::finish_region(DrainRegion& r) {
  std::lock_guard<std::mutex> lk(r.mu);
  r.done = true;
  if (r.shadow != 0) {
    std::lock_guard<std::mutex> pl(pool_mu_);
    shadow_copier_->shadow_free(r.shadow);
    shadow_in_use_ -= r.size - r.shadow_from;
    r.shadow = 0;
  }
  pool_cv_.notify_all();
}

// The bytes of a buffer not loaded at the cut, from the image it was loading from: verified
// against that image's checksums, so a damaged source fails the checkpoint rather than copying on.
Status CheckpointJob::copy_from_image(const DrainRegion& r, uint64_t base, std::span<const HostSpan> parts) {
  const ckpt::pb::BlobRef& ref = *r.src_ref;
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint64_t off = base + i * ckpt::kChunkSize;
    if (off + parts[i].n > ref.length())
      return Status::Corrupt("buffer " + hex(r.addr) + " is longer than its blob in the image it was loading from");
    if (const std::byte* p = r.src_img->direct(ref, off)) {
      POS_RETURN_IF_ERROR(r.src_img->verify_chunk(ref, off, parts[i].n, p));
      std::memcpy(parts[i].host, p, parts[i].n);
    } else {
      POS_RETURN_IF_ERROR(r.src_img->read_chunk(ref, off, parts[i].n, parts[i].host));
    }
    result_.bytes_from_image += parts[i].n;
  }
  return Status::Ok();
}

void CheckpointJob::finish(Status s) {
  result_.drain_end_s = seconds_now();
  {
    std::lock_guard<std::mutex> lk(done_mu_);
    status_ = std::move(s);
    done_ = true;
    // Under the lock, so that whoever sees drained() also sees the outcome (succeeded()).
    drained_flag_.store(true, std::memory_order_release);
    done_cv_.notify_all();
  }
  // wait() joins this thread before it returns, so the client the hook rings is still there.
  if (wake_) wake_();
}

StatusOr<CheckpointResult> CheckpointJob::wait() {
  {
    std::unique_lock<std::mutex> lk(done_mu_);
    done_cv_.wait(lk, [&] { return done_; });
  }
  if (drainer_.joinable()) drainer_.join();
  if (!status_.ok()) return status_;
  result_.cut_pc = inventory_.cut_pc();
  result_.handles = static_cast<uint64_t>(image_.handles_size());
  // A stop checkpoint's client never resumes: it was stopped from the cut to the durable image.
  if (req_.stop) result_.stall_s = result_.drain_end_s - stall_start_s_;
  result_.image_id = inventory_.image_id();
  {
    std::lock_guard<std::mutex> pl(pool_mu_);
    result_.shadow_bytes = shadow_total_;
    result_.shadow_waits = shadow_waits_;
    result_.shadow_s = static_cast<double>(shadow_ns_.load(std::memory_order_relaxed)) / 1e9;
    result_.shadow_alloc_s = shadow_alloc_s_;
    result_.shadow_limit = shadow_limit_;
  }
  result_.total_s = seconds_now() - t0_;
  return result_;
}

}  // namespace pos
