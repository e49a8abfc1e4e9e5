// lazy_restore.cc — chunk loads from an image, and the lazy loader: background threads claim buffers
// in image order; the worker claims (or waits for) the ones a call names before it runs the call.
#include "pos/checkpoint/lazy_restore.h"

#include "pos/api_context.h"
#include "pos/base/hex.h"
#include "pos/base/log.h"

namespace pos {

static_assert(DeviceBackend::kStagingChunkBytes == ckpt::kChunkSize);

ChunkStaging::~ChunkStaging() { device_->give_staging_chunk(p_); }

StatusOr<std::byte*> ChunkStaging::get() {
  if (p_ == nullptr) {
    auto p = device_->take_staging_chunk();
    if (!p.ok()) return p.status();
    p_ = static_cast<std::byte*>(*p);
  }
  return p_;
}

Status load_chunk(const ckpt::ImageReader& img, const ckpt::pb::BlobRef& ref, uint64_t off, uint64_t n, uint64_t addr,
                  DeviceCopier& copier, ChunkStaging& staging) {
  const std::byte* src = img.direct(ref, off);
  if (src != nullptr) {
    POS_RETURN_IF_ERROR(img.verify_chunk(ref, off, n, src));
  } else {
    auto buf = staging.get();
    if (!buf.ok()) return buf.status();
    POS_RETURN_IF_ERROR(img.read_chunk(ref, off, n, *buf));
    src = *buf;
  }
  POS_RETURN_IF_ERROR(copier.to_device_async(addr + off, src, n, 0));
  return copier.wait(0);
}

namespace {
std::atomic<uint64_t> g_part_bytes_for_test{0};
}  // namespace

void set_lazy_part_bytes_for_test(uint64_t bytes) { g_part_bytes_for_test.store(bytes); }

LazyLoader::LazyLoader(std::shared_ptr<const ckpt::ImageReader> image, DeviceBackend* device, std::string who)
    : image_(std::move(image)), device_(device), who_(std::move(who)) {}

LazyLoader::~LazyLoader() { stop(); }

void LazyLoader::add(uint64_t addr, uint64_t size, const ckpt::ImageReader* img, const ckpt::pb::BlobRef* ref) {
  Region r;
  r.addr = addr, r.size = size, r.img = img, r.ref = ref;
  const uint64_t chunk = std::max<uint64_t>(ref->chunk_size(), 1);
  const uint64_t want = g_part_bytes_for_test.load() != 0 ? g_part_bytes_for_test.load() : kPartBytes;
  r.part_bytes = std::max<uint64_t>(chunk, want / chunk * chunk);
  r.parts = static_cast<uint32_t>(std::max<uint64_t>(1, (ref->length() + r.part_bytes - 1) / r.part_bytes));
  by_addr_[addr] = regions_.size();
  regions_.push_back(std::move(r));
  stats_.buffers++;
  stats_.bytes += size;
}

Status LazyLoader::start(BackendClient& backend, size_t threads, std::atomic<bool>* hold) {
  auto wc = backend.make_copier();
  if (!wc.ok()) return wc.status();
  worker_copier_ = std::move(*wc);
  worker_staging_ = std::make_unique<ChunkStaging>(device_);
  threads = std::min(threads, regions_.size());
  for (size_t i = 0; i < threads; ++i) {
    auto c = backend.make_copier();
    if (!c.ok()) return c.status();
    copiers_.push_back(std::move(*c));
    stagings_.push_back(std::make_unique<ChunkStaging>(device_));
  }
  // The page-locked staging is made now, by the restoring thread, not as each loader starts: a
  // page-locked allocation waits behind the driver's other work on the GPU (another process freeing
  // gigabytes, say, as a migration's staging session does right after this restore), and the
  // job's first call may already wait for a loader. A failure here is tried again at first use.
  (void)worker_staging_->get();
  for (auto& st : stagings_) (void)st->get();
  hold_ = hold;
  {
    std::lock_guard<std::mutex> lk(mu_);
    remaining_ = regions_.size();
    stats_.complete = remaining_ == 0;
    t0_ = seconds_now();
    update_done();
  }
  for (size_t i = 0; i < threads; ++i)
    threads_.emplace_back([this, i] {
      loader_main(i);
      stagings_[i].reset();  // its own element only: its page-locked chunk goes when it is done
    });
  return Status::Ok();
}

Status LazyLoader::load_part(const Region& r, uint32_t part, DeviceCopier& copier, ChunkStaging& staging) const {
  const uint64_t len = r.ref->length();
  const uint64_t end = std::min<uint64_t>(len, (static_cast<uint64_t>(part) + 1) * r.part_bytes);
  for (uint64_t off = static_cast<uint64_t>(part) * r.part_bytes; off < end; off += r.ref->chunk_size()) {
    const uint64_t n = std::min<uint64_t>(r.ref->chunk_size(), len - off);
    Status s = load_chunk(*r.img, *r.ref, off, n, r.addr, copier, staging);
    if (!s.ok())
      return s.with_context("lazy restore of buffer " + hex(r.addr) + " (" + std::to_string(r.size) +
                            " bytes)");
  }
  return Status::Ok();
}

void LazyLoader::load_next_part(Region& r, std::unique_lock<std::mutex>& lk, DeviceCopier& copier,
                                ChunkStaging& staging, bool on_demand) {
  const uint32_t part = r.parts_taken++;
  r.state = State::kLoading;
  lk.unlock();
  const Status s = load_part(r, part, copier, staging);
  lk.lock();
  if (!s.ok() && r.error.ok()) r.error = s;
  if (++r.parts_done == r.parts) {
    const Status e = r.error;
    settle(r, e, on_demand);
  }
}

void LazyLoader::loader_main(size_t i) {
  DeviceCopier& copier = *copiers_[i];
  ChunkStaging& staging = *stagings_[i];
  if (hold_ != nullptr)
    while (hold_->load(std::memory_order_acquire) && !stopping_.load(std::memory_order_acquire))
      std::this_thread::yield();
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    // The first region with a part nobody took (the worker may have taken a later one's).
    while (next_ < regions_.size() && !regions_[next_].open()) ++next_;
    if (stopped_ || next_ == regions_.size()) return;
    load_next_part(regions_[next_], lk, copier, staging, /*on_demand=*/false);
  }
}

void LazyLoader::complete() {
  t_done_ = seconds_now();
  stats_.complete = true;
  // How long the job's memory took to come back, for operators (and what a restore ahead of a
  // migration's switch must hide).
  POS_INFO(who_, "lazy restore complete: %lu buffers, %.2f GB in %.3f s (%lu loaded before a call, %lu in the "
           "background, %lu dropped, %lu failed)", (unsigned long)stats_.buffers, stats_.bytes / 1e9, t_done_ - t0_,
           (unsigned long)stats_.loaded_on_demand, (unsigned long)stats_.loaded_in_background,
           (unsigned long)stats_.dropped, (unsigned long)stats_.failed);
  image_.reset();  // nobody reads it any more: every region is settled
}

void LazyLoader::settle(Region& r, const Status& s, bool on_demand) {
  if (s.ok()) {
    r.state = State::kLoaded;
    (on_demand ? stats_.loaded_on_demand : stats_.loaded_in_background)++;
  } else {
    r.state = State::kFailed;
    r.error = s;
    stats_.failed++;
    failed_live_++;
    POS_ERROR(who_, "%s", s.to_string().c_str());
  }
  if (--remaining_ == 0) complete();
  update_done();
  cv_.notify_all();
}

void LazyLoader::update_done() {
  worker_done_.store(remaining_ == 0 && failed_live_ == 0, std::memory_order_release);
}

Status LazyLoader::before_call(const APIContext& c) {
  for (size_t i = 0; i < c.edges.size(); ++i) {
    const Edge& e = c.edges[i];
    if (e.handle->type != ResourceType::kMemory) continue;
    auto it = by_addr_.find(e.handle->client_addr);
    if (it == by_addr_.end()) continue;
    Region& r = regions_[it->second];
    std::unique_lock<std::mutex> lk(mu_);
    if (e.kind == EdgeKind::kDelete) {
      cv_.wait(lk, [&] { return r.state != State::kLoading; });  // loaders have parts of it in flight
      if (r.state == State::kPending) {
        stats_.dropped++;
        if (--remaining_ == 0) complete();
      }
      if (r.state == State::kFailed) failed_live_--;
      r.state = State::kDropped;
      update_done();
      cv_.notify_all();
      lk.unlock();
      by_addr_.erase(it);
      continue;
    }
    // The parts nobody took yet, loaded here; then the ones in flight, waited for.
    while (r.open()) load_next_part(r, lk, *worker_copier_, *worker_staging_, /*on_demand=*/true);
    cv_.wait(lk, [&] { return r.state != State::kLoading; });
    if (r.state == State::kFailed) {
      POS_ERROR(who_, "pc %lu %.*s: buffer %s was not restored, the call fails: %s", (unsigned long)c.pc,
                (int)c.info->name.size(), c.info->name.data(), hex(r.addr).c_str(), r.error.message().c_str());
      return Status(r.error.code(), c.info->is_cublas ? cuda::kCublasExecutionFailed : cuda::kErrorEccUncorrectable,
                    r.error.message());
    }
  }
  return Status::Ok();
}

Status LazyLoader::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return remaining_ == 0 || stopped_; });
  if (remaining_ != 0) return Status::Unavailable(who_ + " shut down before its lazy restore completed");
  for (const Region& r : regions_)
    if (r.state == State::kFailed) return r.error;
  return Status::Ok();
}

StatusOr<std::shared_ptr<const ckpt::ImageReader>> LazyLoader::unloaded(std::vector<Unloaded>* out) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (image_ == nullptr) {
    for (const Region& r : regions_)
      if (r.state == State::kFailed) return r.error;
    return std::shared_ptr<const ckpt::ImageReader>();
  }
  for (const Region& r : regions_)
    if (r.state == State::kPending || r.state == State::kLoading || r.state == State::kFailed)
      out->push_back(Unloaded{r.addr, r.img, r.ref});
  return image_;
}

LazyRestoreStats LazyLoader::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  LazyRestoreStats s = stats_;
  s.seconds = (stats_.complete ? t_done_ : seconds_now()) - t0_;
  return s;
}

void LazyLoader::stop() {
  stopping_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return;
    stopped_ = true;
    cv_.notify_all();
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  stagings_.clear();
  copiers_.clear();
  worker_copier_.reset();
  worker_staging_.reset();
  std::lock_guard<std::mutex> lk(mu_);
  image_.reset();
}

}  // namespace pos
