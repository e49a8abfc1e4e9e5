// shm_client.cc — frames onto the session ring, replies off the reply slot, host pointers into the
// arena (pinned by posd) or staged through it, and the waits in between (spin, then futex).
#include "remoting/client/shm_client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "pos/base/cuda_errors.h"
#include "remoting/common/handshake.h"
#include "remoting/common/socket_io.h"

namespace pos {
namespace {

// The welcome, with the session memfd and posd's eventfd when accepted (-1 where absent).
ssize_t receive_welcome(int sock, wire::Welcome* w, int* memfd, int* efd) {
  msghdr msg{};
  iovec iov{w, sizeof(*w)};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(2 * sizeof(int))];
  msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = cbuf, msg.msg_controllen = sizeof(cbuf);
  ssize_t r;
  do r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL); while (r < 0 && errno == EINTR);
  int fds[2] = {-1, -1};
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(2 * sizeof(int)))
      std::memcpy(fds, CMSG_DATA(c), sizeof(fds));
  }
  *memfd = fds[0], *efd = fds[1];
  return r;
}

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

bool posted_api(ApiId api) { return api_info(api).posted(); }

template <typename T>
bool read_param(std::span<const Param> p, size_t i, T* out) {
  if (i >= p.size() || p[i].size != sizeof(T)) return false;
  std::memcpy(out, p[i].data, sizeof(T));
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<ShmSession>> ShmSession::connect(const std::string& socket_path, const std::string& job,
                                                          uint64_t arena_bytes) {
  wire::Hello hello;
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.arena_bytes = arena_bytes;
  wire::put_cstr(hello.job, sizeof(hello.job), job);
  auto fd = open_posd_socket(socket_path, hello);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<ShmSession> s(new ShmSession());
  s->sock_ = *fd;

  int fds[2] = {-1, -1};
  const ssize_t r = receive_welcome(s->sock_, &s->welcome_, &fds[0], &fds[1]);
  s->efd_ = fds[1];
  if (r != static_cast<ssize_t>(sizeof(s->welcome_))) {
    if (fds[0] >= 0) ::close(fds[0]);
    return posd_unreachable(socket_path, r == 0 ? "posd closed the connection during the handshake"
                                           : std::string("no welcome from posd: ") + std::strerror(errno));
  }
  Status ws = check_welcome(s->welcome_);
  if (!ws.ok()) {
    if (fds[0] >= 0) ::close(fds[0]);
    return ws;
  }
  const wire::Welcome& w = s->welcome_;
  const wire::Layout l = wire::layout_for(w.arena_bytes);
  if (fds[0] < 0 || fds[1] < 0 || w.shm_bytes != l.total || w.ring_offset != l.ring_offset ||
      w.ring_bytes != l.ring_bytes || w.reply_offset != l.reply_offset || w.arena_offset != l.arena_offset) {
    if (fds[0] >= 0) ::close(fds[0]);
    return Status::Corrupt("posd's session layout does not match this libpos_client");
  }
  void* m = ::mmap(nullptr, w.shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  s->memfd_ = fds[0];
  if (m == MAP_FAILED) return Status::Unavailable(std::string("mapping the session memory: ") + std::strerror(errno));
  s->base_ = static_cast<std::byte*>(m);
  s->map_bytes_ = w.shm_bytes;
  s->hdr_ = reinterpret_cast<wire::ShmHeader*>(s->base_);
  s->ring_ = s->base_ + w.ring_offset;
  s->reply_ = reinterpret_cast<wire::ReplySlot*>(s->base_ + w.reply_offset);
  s->arena_ = s->base_ + w.arena_offset;
  if (s->hdr_->magic != wire::kShmMagic || s->hdr_->ring_bytes != w.ring_bytes)
    return Status::Corrupt("posd's session memory has a foreign header");
  // The staging slots take a quarter of the arena at most (8 MiB each from a 128 MiB arena up).
  s->stage_bytes_ =
      std::min<uint64_t>(8ull << 20, w.arena_bytes / (4 * kStageSlots) / wire::kArenaAlign * wire::kArenaAlign);
  if (s->stage_bytes_ < wire::kArenaAlign) return Status::Corrupt("posd's arena is too small");
  s->free_[kStageSlots * s->stage_bytes_] = w.arena_bytes - kStageSlots * s->stage_bytes_;
  uint64_t spin_us = 2000;
  if (const char* e = std::getenv("POS_CLIENT_SPIN_US"); e != nullptr) spin_us = std::strtoull(e, nullptr, 10);
  s->spin_ns_ = spin_us * 1000;
  unsigned copy_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  if (const char* e = std::getenv("POS_CLIENT_COPY_THREADS"); e != nullptr && *e != '\0')
    copy_threads = static_cast<unsigned>(std::clamp(std::strtoul(e, nullptr, 10), 1ul, 64ul));
  s->copier_ = std::make_unique<ParallelCopier>(copy_threads, s->spin_ns_);
  if (const char* e = std::getenv("POS_CLIENT_POST"); e != nullptr && std::string(e) == "0") s->post_async_ = false;
  s->socket_path_ = socket_path;
  s->job_ = job;
  s->watch_stop_ = ::eventfd(0, EFD_CLOEXEC);
  if (s->watch_stop_ >= 0) {
    try {
      ShmSession* raw = s.get();
      s->watcher_ = std::thread([raw] { raw->watch(); });
    } catch (const std::system_error&) {
      // No thread: the session works, it just cannot be detached (a dump says so).
    }
  }
  return s;
}

ShmSession::~ShmSession() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(watch_stop_, &one, sizeof(one));
    watcher_.join();
  }
  if (watch_stop_ >= 0) ::close(watch_stop_);
  if (memfd_ >= 0) ::close(memfd_);
  if (sock_ >= 0) ::close(sock_);  // posd ends the session and frees its memory
  if (efd_ >= 0) ::close(efd_);
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
}

void ShmSession::set_copy_threads(unsigned n) {
  std::lock_guard<std::mutex> lk(mu_);
  copier_ = std::make_unique<ParallelCopier>(n, spin_ns_);
}

bool ShmSession::in_arena(const void* p, uint64_t n) const {
  const auto* b = static_cast<const std::byte*>(p);
  return b >= arena_ && n <= welcome_.arena_bytes && static_cast<uint64_t>(b - arena_) <= welcome_.arena_bytes - n;
}

// ---------------- arena ----------------
StatusOr<uint64_t> ShmSession::arena_alloc(uint64_t bytes) {
  const uint64_t n = align_up(bytes == 0 ? 1 : bytes, kAlign);
  std::lock_guard<std::mutex> lk(arena_mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const uint64_t off = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_[off + n] = left;
    used_[off] = n;
    return off;
  }
  return Status(Code::kOutOfMemory, cuda::kErrorMemoryAllocation,
                std::to_string(bytes) + " bytes do not fit in the session's shared arena of " +
                    std::to_string(welcome_.arena_bytes) + " bytes (ask for more with POS_ARENA_SIZE, up to posd's arena_max)");
}

void ShmSession::arena_free(uint64_t off) {
  std::lock_guard<std::mutex> lk(arena_mu_);
  auto u = used_.find(off);
  if (u == used_.end()) return;
  uint64_t start = off, len = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + len) len += next->second, next = free_.erase(next);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) start = prev->first, len += prev->second, free_.erase(prev);
  }
  free_[start] = len;
}

Status ShmSession::host_alloc(uint64_t bytes, void** out) {
  auto off = arena_alloc(bytes);
  if (!off.ok()) return off.status();
  *out = arena_ + *off;
  return Status::Ok();
}

Status ShmSession::host_free(void* p) {
  if (p == nullptr) return Status::Ok();
  const auto* b = static_cast<const std::byte*>(p);
  {
    std::lock_guard<std::mutex> lk(arena_mu_);
    if (b < arena_ || !used_.count(static_cast<uint64_t>(b - arena_)))
      return Status::InvalidArgument("cudaFreeHost: pointer was not returned by cudaMallocHost");
  }
  arena_free(static_cast<uint64_t>(b - arena_));
  return Status::Ok();
}

void ShmSession::reap_temp() {
  // Every call passes here: without blocks in flight, leave posd's cache line alone.
  if (temp_.empty()) return;
  const uint64_t done = hdr_->done_seq.load(std::memory_order_acquire);
  while (!temp_.empty() && temp_.front().first <= done) {
    arena_free(temp_.front().second);
    temp_.pop_front();
  }
}

StatusOr<uint64_t> ShmSession::temp_block(const void* src, uint64_t n) {
  auto off = arena_alloc(n);
  if (!off.ok() && !temp_.empty()) {  // blocks of frames still in flight: wait for them
    POS_RETURN_IF_ERROR(wait_done(temp_.back().first));
    reap_temp();
    off = arena_alloc(n);
  }
  if (!off.ok()) return off.status();
  if (src != nullptr) std::memcpy(arena_ + *off, src, n);
  return *off;
}

// ---------------- ring ----------------
Status ShmSession::peer_alive() {
  pollfd p{sock_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    broken_ = Status(Code::kUnavailable, cuda::kErrorUnknown, "posd ended this session (daemon stopped or session closed)");
    return broken_;
  }
  return Status::Ok();
}

Status ShmSession::publish(const std::byte* raw, uint64_t len, uint32_t api_id, uint16_t flags, uint64_t seq,
                           uint64_t ret_cap, std::span<const Param> params, std::span<const uint64_t> sizes) {
  const uint64_t ring = welcome_.ring_bytes;
  if (len > ring / 2) return Status::InvalidArgument("call of " + std::to_string(len) + " bytes is too large for the ring");
  const uint64_t pos = tail_ % ring, rem = ring - pos;
  const uint64_t need = rem < len ? rem + len : len;
  uint64_t spins = 0;
  while (ring - (tail_ - hdr_->head.load(std::memory_order_acquire)) < need) {
    if ((++spins & 0xfff) == 0) POS_RETURN_IF_ERROR(peer_alive());
    std::this_thread::yield();
  }
  uint64_t at = pos;
  if (rem < len) {  // the frame would straddle the end: pad to it, start over at 0
    if (rem >= sizeof(wire::FrameHeader)) {
      wire::FrameHeader pad{wire::kFrameMagic, static_cast<uint32_t>(rem), 0, 0, wire::kFlagPad, 0, 0};
      std::memcpy(ring_ + pos, &pad, sizeof(pad));
    }
    tail_ += rem;
    at = 0;
  }
  if (raw != nullptr) std::memcpy(ring_ + at, raw, len);
  else wire::encode_frame(ring_ + at, api_id, flags, seq, ret_cap, params, sizes);
  tail_ += len;
  // Store then load, both seq_cst: with posd's store-sleeping-then-load-tail, one side sees the other.
  hdr_->tail.store(tail_, std::memory_order_seq_cst);
  if (hdr_->server_sleeping.load(std::memory_order_seq_cst) != 0) {
    const uint64_t one = 1;
    (void)!::write(efd_, &one, sizeof(one));
  }
  return Status::Ok();
}

Status ShmSession::wait_done(uint64_t seq) {
  auto done = [&] { return hdr_->done_seq.load(std::memory_order_acquire) >= seq; };
  if (done()) return Status::Ok();
  (void)spin_wait<kPollSpin>(spin_ns_, done);  // as posd's session loop spins; then block below
  while (!done()) {
    hdr_->client_sleeping.store(1, std::memory_order_seq_cst);  // pairs with posd's done32 store
    const uint32_t v = hdr_->done32.load(std::memory_order_seq_cst);
    if (done()) break;
    wire::futex_wait(&hdr_->done32, v, 200);
    if (!done()) {
      Status s = peer_alive();
      if (!s.ok()) {
        hdr_->client_sleeping.store(0, std::memory_order_relaxed);
        return s;
      }
    }
  }
  hdr_->client_sleeping.store(0, std::memory_order_relaxed);
  return Status::Ok();
}

Status ShmSession::read_reply(uint64_t seq, void* ret, uint64_t ret_len, uint64_t* ret_written) {
  const wire::ReplySlot& r = *reply_;
  if (r.seq != seq) {
    broken_ = Status::Internal("posd's reply is for call " + std::to_string(r.seq) + ", expected " + std::to_string(seq));
    return broken_;
  }
  auto status_of = [](int32_t code, int32_t api_error, const char* msg, uint32_t len) {
    if (code == 0) return Status::Ok();
    if (code < 0 || code > static_cast<int32_t>(Code::kInternal)) code = static_cast<int32_t>(Code::kInternal);
    return Status(static_cast<Code>(code), api_error,
                  std::string(msg, std::min<uint64_t>(len, wire::kMaxMessage)));
  };
  const uint64_t n = std::min({r.ret_written, ret_len, wire::kMaxRet});
  if (n > 0 && ret != nullptr) std::memcpy(ret, r.ret, n);
  if (ret_written != nullptr) *ret_written = n;
  if (r.async_error != 0) async_error_.store(r.async_error, std::memory_order_relaxed);
  Status own = status_of(r.code, r.api_error, r.message, r.message_len);
  if (!own.ok()) return own;
  // An earlier posted call failed: like CUDA's asynchronous errors, the next call reports it.
  return status_of(r.deferred_code, r.deferred_api_error, r.deferred_message, r.deferred_message_len);
}

Status ShmSession::send(ApiId api, std::span<const Param> params, bool reply, void* ret, uint64_t ret_len,
                        uint64_t* ret_written, uint64_t* seq_out, bool defer_reply) {
  if (params.size() > wire::kMaxParams) return Status::InvalidArgument("too many parameters");
  ret_len = std::min(ret_len, wire::kMaxRet);  // the caller's capacity; no result is larger
  reap_temp();
  uint64_t sizes[wire::kMaxParams];
  uint64_t offsets[wire::kMaxParams];
  Param out[wire::kMaxParams];
  std::vector<uint64_t> temps;
  for (size_t i = 0; i < params.size(); ++i) {
    out[i] = params[i];
    sizes[i] = params[i].size;
    if (params[i].size <= wire::kMaxInlineParam) continue;
    if (in_arena(params[i].data, params[i].size)) {
      offsets[i] = static_cast<uint64_t>(static_cast<const std::byte*>(params[i].data) - arena_);
    } else {
      auto off = temp_block(params[i].data, params[i].size);
      if (!off.ok()) {
        for (uint64_t t : temps) arena_free(t);
        return off.status();
      }
      offsets[i] = *off;
      temps.push_back(*off);
    }
    sizes[i] = params[i].size | wire::kIndirect;
    out[i] = Param{&offsets[i], 8};
  }
  const std::span<const uint64_t> sz(sizes, params.size());
  const bool asked = reply;
  if (!post_async_) reply = true;
  const uint64_t seq = ++next_seq_;
  Status s = publish(nullptr, wire::frame_bytes(sz), static_cast<uint32_t>(api), reply ? wire::kFlagReply : 0, seq,
                     reply ? ret_len : 0, std::span<const Param>(out, params.size()), sz);
  for (uint64_t t : temps) {
    if (s.ok()) temp_.emplace_back(seq, t);
    else arena_free(t);
  }
  if (!s.ok()) return s;
  if (seq_out != nullptr) *seq_out = seq;
  // A reply forced by POS_CLIENT_POST=0 is read now: a later reply would overwrite it.
  if (!reply || (defer_reply && asked)) return Status::Ok();
  POS_RETURN_IF_ERROR(wait_done(seq));
  return read_reply(seq, ret, ret_len, ret_written);
}

Status ShmSession::collect(uint64_t seq) {
  POS_RETURN_IF_ERROR(wait_done(seq));
  return read_reply(seq, nullptr, 0, nullptr);
}

Status ShmSession::send_raw_for_test(const void* bytes, uint64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  return publish(static_cast<const std::byte*>(bytes), wire::pad8(n), 0, 0, 0, 0, {}, {});
}

Status ShmSession::call_untranslated_for_test(ApiId api, std::span<const Param> params) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!broken_.ok()) return broken_;
  return send(api, params, true, nullptr, 0, nullptr);
}

// ---------------- copies ----------------
Status ShmSession::copy_sync(uint64_t dst, uint64_t src, uint64_t n, int32_t kind) {
  auto forward = [&](uint64_t d, uint64_t s) {
    const std::array<Param, 4> p{Param{&d, 8}, Param{&s, 8}, Param{&n, 8}, Param{&kind, 4}};
    return send(ApiId::kMemcpy, p, true, nullptr, 0, nullptr);
  };
  // Null, foreign, zero-length and bad-kind copies: posd gives the verdict CUDA would.
  if (n == 0 || kind < cuda::kMemcpyHostToHost || kind > cuda::kMemcpyDefault || foreign(dst) || foreign(src) ||
      dst == 0 || src == 0)
    return forward(dst, src);
  const bool dd = kind == cuda::kMemcpyDefault ? is_device(dst) : (kind == 1 || kind == 3);
  const bool sd = kind == cuda::kMemcpyDefault ? is_device(src) : (kind == 2 || kind == 3);
  if (!dd && !sd) {  // host to host: this process's memory, no daemon involved
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return Status::Ok();
  }
  if (dd && sd) return forward(dst, src);
  const void* host = reinterpret_cast<const void*>(dd ? src : dst);
  if (in_arena(host, n)) return dd ? forward(dst, to_daemon(host)) : forward(to_daemon(host), src);
  // Pageable memory: through the staging slots. Host to device, the app copies chunk i into a
  // slot while posd's DMA moves the chunks before it from the others; device to host, posd runs
  // up to kStageSlots chunks ahead of the app copying them out. The app's side of each chunk is
  // split among copier_'s threads: one core's memcpy is slower than the DMA.
  const uint64_t chunks = (n + stage_bytes_ - 1) / stage_bytes_;
  auto slot = [&](uint64_t i) { return arena_ + (i % kStageSlots) * stage_bytes_; };
  auto chunk_len = [&](uint64_t i) { return std::min(stage_bytes_, n - i * stage_bytes_); };
  int32_t k = dd ? cuda::kMemcpyHostToDevice : cuda::kMemcpyDeviceToHost;
  uint64_t seqs[kStageSlots] = {};  // the last frame that used each slot
  auto issue = [&](uint64_t i) {
    uint64_t d = dd ? dst + i * stage_bytes_ : to_daemon(slot(i));
    uint64_t s = dd ? to_daemon(slot(i)) : src + i * stage_bytes_;
    uint64_t c = chunk_len(i);
    const std::array<Param, 4> p{Param{&d, 8}, Param{&s, 8}, Param{&c, 8}, Param{&k, 4}};
    // The last chunk wants a reply, which also reports a failure of the posted ones; it is
    // collected after the loop, so the app keeps copying out while posd finishes.
    return send(ApiId::kMemcpy, p, /*reply=*/i + 1 == chunks, nullptr, 0, nullptr, &seqs[i % kStageSlots],
                /*defer_reply=*/true);
  };
  if (dd) {
    for (uint64_t i = 0; i < chunks; ++i) {
      POS_RETURN_IF_ERROR(wait_done(seqs[i % kStageSlots]));  // the slot's previous chunk is on the device
      copier_->copy(slot(i), reinterpret_cast<const std::byte*>(src) + i * stage_bytes_, chunk_len(i));
      POS_RETURN_IF_ERROR(issue(i));
    }
  } else {
    for (uint64_t i = 0; i < std::min(chunks, kStageSlots); ++i) POS_RETURN_IF_ERROR(issue(i));
    for (uint64_t i = 0; i < chunks; ++i) {
      POS_RETURN_IF_ERROR(wait_done(seqs[i % kStageSlots]));
      copier_->copy(reinterpret_cast<std::byte*>(dst) + i * stage_bytes_, slot(i), chunk_len(i));
      if (i + kStageSlots < chunks) POS_RETURN_IF_ERROR(issue(i + kStageSlots));
    }
  }
  return collect(seqs[(chunks - 1) % kStageSlots]);
}

Status ShmSession::copy_async(std::span<const Param> params) {
  uint64_t dst = 0, src = 0, n = 0, stream = 0;
  int32_t kind = 0;
  if (!read_param(params, 0, &dst) || !read_param(params, 1, &src) || !read_param(params, 2, &n) ||
      !read_param(params, 3, &kind) || !read_param(params, 4, &stream) || kind < cuda::kMemcpyHostToHost ||
      kind > cuda::kMemcpyDefault || n == 0 || foreign(dst) || foreign(src) || dst == 0 || src == 0)
    return send(ApiId::kMemcpyAsync, params, true, nullptr, 0, nullptr);  // posd gives the verdict
  const bool dd = kind == cuda::kMemcpyDefault ? is_device(dst) : (kind == 1 || kind == 3);
  const bool sd = kind == cuda::kMemcpyDefault ? is_device(src) : (kind == 2 || kind == 3);
  auto sync_stream = [&] {
    const std::array<Param, 1> p{Param{&stream, 8}};
    return send(ApiId::kStreamSynchronize, p, true, nullptr, 0, nullptr);
  };
  if (!dd && !sd) return send(ApiId::kMemcpyAsync, params, true, nullptr, 0, nullptr);
  if (dd && sd) return send(ApiId::kMemcpyAsync, params, false, nullptr, 0, nullptr);
  if (dd) {
    // Host to device carries its bytes (parameter 5): inline, or by reference into the arena.
    if (params.size() == 6 && params[5].size == n &&
        (n <= wire::kMaxInlineParam || in_arena(params[5].data, n) || n <= welcome_.arena_bytes / 4)) {
      std::array<Param, 6> p{params[0], params[1], params[2], params[3], params[4], params[5]};
      Status s = send(ApiId::kMemcpyAsync, p, false, nullptr, 0, nullptr);
      if (s.code() != Code::kOutOfMemory) return s;
    }
    // Too big to stage as one block: order after the stream's work, then copy synchronously.
    POS_RETURN_IF_ERROR(sync_stream());
    return copy_sync(dst, src, n, cuda::kMemcpyHostToDevice);
  }
  if (in_arena(reinterpret_cast<const void*>(dst), n)) {
    uint64_t d = to_daemon(reinterpret_cast<const void*>(dst));
    std::array<Param, 5> p{Param{&d, 8}, params[1], params[2], params[3], params[4]};
    return send(ApiId::kMemcpyAsync, p, false, nullptr, 0, nullptr);
  }
  // Device to pageable memory: CUDA returns only once the bytes are there; so do we.
  POS_RETURN_IF_ERROR(sync_stream());
  return copy_sync(dst, src, n, cuda::kMemcpyDeviceToHost);
}

Status ShmSession::symbol_copy(ApiId api, std::span<const Param> params) {
  const bool to = api == ApiId::kMemcpyToSymbol;
  uint64_t ptr = 0, n = 0;
  int32_t kind = 0;
  const size_t pi = to ? 1 : 0;  // to: (symbol, src, n, offset, kind); from: (dst, symbol, n, offset, kind)
  if (params.size() != 5 || !read_param(params, pi, &ptr) || !read_param(params, 2, &n) ||
      !read_param(params, 4, &kind) || n == 0 || foreign(ptr) || ptr == 0)
    return send(api, params, true, nullptr, 0, nullptr);
  const bool host = to ? (kind == cuda::kMemcpyHostToDevice || (kind == cuda::kMemcpyDefault && !is_device(ptr)))
                       : (kind == cuda::kMemcpyDeviceToHost || (kind == cuda::kMemcpyDefault && !is_device(ptr)));
  if (!host) return send(api, params, true, nullptr, 0, nullptr);
  std::array<Param, 5> p{params[0], params[1], params[2], params[3], params[4]};
  uint64_t daemon_ptr = 0;
  p[pi] = Param{&daemon_ptr, 8};
  const void* hp = reinterpret_cast<const void*>(ptr);
  if (in_arena(hp, n)) {
    daemon_ptr = to_daemon(hp);
    return send(api, p, true, nullptr, 0, nullptr);
  }
  auto off = temp_block(to ? hp : nullptr, n);
  if (!off.ok()) return off.status();
  daemon_ptr = welcome_.daemon_arena_addr + *off;
  Status s = send(api, p, true, nullptr, 0, nullptr);
  if (s.ok() && !to) std::memcpy(reinterpret_cast<void*>(ptr), arena_ + *off, n);
  arena_free(*off);  // replied: posd is done with it
  return s;
}

Status ShmSession::local_pointer_attributes(uint64_t ptr, void* ret, uint64_t ret_len, uint64_t* written,
                                            bool* handled) {
  *handled = in_arena(reinterpret_cast<const void*>(ptr), 1);
  if (!*handled) return Status::Ok();
  // cudaMallocHost memory: page-locked host memory, the same address on both sides (UVA).
  PointerAttributes a{cuda::kMemoryTypeHost, 0, ptr, ptr};
  if (ret_len < sizeof(a)) return Status::InvalidArgument("result buffer too small");
  std::memcpy(ret, &a, sizeof(a));
  if (written != nullptr) *written = sizeof(a);
  return Status::Ok();
}

Status ShmSession::call(ApiId api, std::span<const Param> params, void* ret, uint64_t ret_len, uint64_t* ret_written) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!broken_.ok()) return broken_;
  switch (api) {
    case ApiId::kMemcpy: {
      uint64_t dst = 0, src = 0, n = 0;
      int32_t kind = 0;
      if (params.size() == 4 && read_param(params, 0, &dst) && read_param(params, 1, &src) &&
          read_param(params, 2, &n) && read_param(params, 3, &kind))
        return copy_sync(dst, src, n, kind);
      break;
    }
    case ApiId::kMemcpyAsync: return copy_async(params);
    case ApiId::kMemcpyToSymbol:
    case ApiId::kMemcpyFromSymbol: return symbol_copy(api, params);
    case ApiId::kPointerGetAttributes: {
      uint64_t ptr = 0;
      bool handled = false;
      if (read_param(params, 0, &ptr)) {
        Status s = local_pointer_attributes(ptr, ret, ret_len, ret_written, &handled);
        if (handled) return s;
      }
      break;
    }
    default: break;
  }
  const bool posted = posted_api(api) && ret_len == 0;
  return send(api, params, !posted, ret, ret_len, ret_written);
}

// ---------------- detach and re-attach ----------------
void ShmSession::watch() {
  for (;;) {
    int sock = -1;
    {
      std::lock_guard<std::mutex> lk(mu_);
      sock = sock_;
    }
    if (sock < 0) return;
    pollfd p[2] = {{sock, POLLIN, 0}, {watch_stop_, POLLIN, 0}};
    const int n = ::poll(p, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) return;  // hang-up or error: the calls find out themselves
    wire::DetachRequest req;
    ssize_t r;
    do r = ::recv(sock, &req, sizeof(req), MSG_WAITALL); while (r < 0 && errno == EINTR);
    // posd writes nothing else after the welcome: end of file or garbage ends the watching.
    if (r != static_cast<ssize_t>(sizeof(req)) || req.magic != wire::kDetachMagic) return;
    req.token[sizeof(req.token) - 1] = '\0', req.permit[sizeof(req.permit) - 1] = '\0';
    detach_and_return(req);
  }
}

void ShmSession::detach_and_return(const wire::DetachRequest& req) {
  std::lock_guard<std::mutex> lk(mu_);  // the app's threads wait at their next call from here on
  if (!broken_.ok()) return;
  // Every published frame handled, so the cut loses nothing and no staging block is in flight.
  if (next_seq_ > 0 && !wait_done(next_seq_).ok()) return;
  reap_temp();
  wire::DetachAck ready;
  ready.phase = 1;
  ready.last_seq = next_seq_;
  if (::send(sock_, &ready, sizeof(ready), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(ready))) return;
  // The session finishes every call on the device first: an asynchronous copy into a pinned block
  // must land before the arena is copied.
  wire::DetachAck quiet;
  ssize_t got;
  do got = ::recv(sock_, &quiet, sizeof(quiet), MSG_WAITALL); while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof(quiet)) || quiet.magic != wire::kDetachMagic || quiet.phase != 1) {
    broken_ = Status(Code::kUnavailable, cuda::kErrorUnknown, "posd went away while this job detached");
    return;
  }
  // The session memory stays mapped (the arena holds the app's pinned memory, which its threads
  // may touch at any time): only the eventfd and the socket go, and CRIU dumps the mapping.
  ::close(efd_), efd_ = -1;
  wire::DetachAck ack;
  ack.phase = 2;
  ack.last_seq = next_seq_;
  const bool acked = ::send(sock_, &ack, sizeof(ack), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(ack));
  ::close(sock_), sock_ = -1;  // posd waits for this hang-up before it says the job is detached
  if (!acked) {
    broken_ = Status(Code::kUnavailable, cuda::kErrorUnknown, "posd went away while this job detached");
    return;
  }
  // Parked until the permit file appears (it may name another posd's socket), or the timeout:
  // then back to the same posd, whatever happened to the dump.
  // A restored job runs this loop again from where CRIU froze it, possibly past its deadline (the
  // clock went on): the permit is looked for first, so it still names the posd to come back to.
  std::string socket = socket_path_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(req.timeout_ms);
  for (;;) {
    // Only a permit of root or of this job's own user counts (it sits in a directory everyone
    // may write, and names the socket to go to): anything else is not looked at.
    const int pf = ::open(req.permit, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat pst {};
    if (pf >= 0 && ::fstat(pf, &pst) == 0 && S_ISREG(pst.st_mode) && (pst.st_uid == 0 || pst.st_uid == ::getuid())) {
      char line[256] = {};
      const ssize_t n = ::read(pf, line, sizeof(line) - 1);
      ::close(pf);
      std::string l(line, n > 0 ? static_cast<size_t>(n) : 0);
      l = l.substr(0, l.find('\n'));
      while (!l.empty() && l.back() == ' ') l.pop_back();
      if (!l.empty()) socket = l;
      (void)::unlink(req.permit);  // one use: a later restore of this image gets a fresh one
      break;
    }
    if (pf >= 0) ::close(pf);
    if (std::chrono::steady_clock::now() >= deadline) break;
    pollfd stop{watch_stop_, POLLIN, 0};
    if (::poll(&stop, 1, 2) > 0) {  // the session is being destroyed
      broken_ = Status(Code::kUnavailable, cuda::kErrorUnknown, "the session ended while detached");
      return;
    }
  }
  Status s = reattach(socket, req.token);
  if (!s.ok() && socket != socket_path_) {
    // The posd the permit named would not take it (a migration target whose restore was abandoned
    // or timed out): the posd it left may still hold its session, detached under the same token
    // (a live switch releases it only once the job runs at the target). Back there, then.
    Status back = reattach(socket_path_, req.token);
    if (back.ok()) {
      detaches_.fetch_add(1, std::memory_order_release);
      return;
    }
    s = Status(s.code(), s.api_error(), s.message() + "; and the posd it left would not take it back (" + back.message() + ")");
  }
  if (!s.ok()) {
    broken_ = Status(Code::kUnavailable, cuda::kErrorUnknown, "could not re-attach to posd after a detach: " + s.message());
    return;
  }
  // The posd the job now runs under (a restore or a migration may have moved it): a later detach
  // whose permit names no other comes back here, not to the posd it first started under.
  socket_path_ = socket;
  detaches_.fetch_add(1, std::memory_order_release);
}

Status ShmSession::reattach(const std::string& socket_path, const std::string& token) {
  wire::Hello hello;
  hello.kind = static_cast<uint32_t>(wire::HelloKind::kReattach);
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.arena_bytes = welcome_.arena_bytes;
  wire::put_cstr(hello.job, sizeof(hello.job), job_);
  wire::put_cstr(hello.command, sizeof(hello.command), token);
  auto fd = open_posd_socket(socket_path, hello, memfd_);
  if (!fd.ok()) return fd.status();
  wire::Welcome w;
  int memfd = -1, efd = -1;
  const ssize_t r = receive_welcome(*fd, &w, &memfd, &efd);
  auto fail = [&](const Status& why) {
    if (memfd >= 0) ::close(memfd);
    if (efd >= 0) ::close(efd);
    ::close(*fd);
    return why;
  };
  if (r != static_cast<ssize_t>(sizeof(w))) return fail(Status::Unavailable("no welcome from posd"));
  if (Status ws = check_welcome(w); !ws.ok()) return fail(ws);
  if (memfd < 0 || efd < 0 || w.client_uuid != welcome_.client_uuid || w.shm_bytes != map_bytes_ ||
      w.arena_offset != welcome_.arena_offset || w.arena_bytes != welcome_.arena_bytes ||
      w.ring_offset != welcome_.ring_offset || w.reply_offset != welcome_.reply_offset)
    return fail(Status::Corrupt("posd re-attached this job to a session of another shape"));
  // The session serves this very memory (the one left running, or a restored session that took
  // over the memfd this job handed it): nothing is copied or moved, so the app's threads may keep
  // touching their pinned memory throughout.
  struct stat now {}, mine {};
  if (::fstat(memfd, &now) != 0 || memfd_ < 0 || ::fstat(memfd_, &mine) != 0 || now.st_dev != mine.st_dev ||
      now.st_ino != mine.st_ino)
    return fail(Status::Corrupt("posd re-attached this job to other session memory (its pinned memory cannot move)"));
  ::close(memfd);
  memfd = -1;
  if (hdr_->magic != wire::kShmMagic || hdr_->ring_bytes != w.ring_bytes) return fail(Status::Corrupt("foreign session header"));
  // Only what may differ in another session: where its process maps the arena (read under mu_).
  // The rest is the same by the checks above, and app threads read it without the lock.
  if (welcome_.daemon_arena_addr != w.daemon_arena_addr) welcome_.daemon_arena_addr = w.daemon_arena_addr;
  sock_ = *fd;
  efd_ = efd;
  tail_ = 0;
  next_seq_ = 0;
  return Status::Ok();
}

}  // namespace pos
