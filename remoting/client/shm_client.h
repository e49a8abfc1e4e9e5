// shm_client.h — the application side of a posd session: connects over the Unix socket, maps the
// session's shared memory and sends every call as a frame; the arena backs cudaMallocHost.
#pragma once

#include <cstdint>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "remoting/common/api_client.h"
#include "pos/base/parallel_copy.h"
#include "remoting/common/handshake.h"
#include "remoting/common/wire.h"

namespace pos {

// Thread-safe: app threads share one session (calls are serialized on its ring).
class ShmSession final : public Transport {
 public:
  // arena_bytes 0: posd's default. An absent posd, a refused handshake or a protocol mismatch is
  // an error that says what to do.
  static StatusOr<std::unique_ptr<ShmSession>> connect(const std::string& socket_path, const std::string& job,
                                                       uint64_t arena_bytes = 0);
  ~ShmSession() override;

  Status call(ApiId api, std::span<const Param> params, void* ret, uint64_t ret_len, uint64_t* ret_written) override;

  // cudaMallocHost / cudaFreeHost: blocks of the shared arena (posd has it page-locked).
  Status host_alloc(uint64_t bytes, void** out);
  Status host_free(void* p);
  bool in_arena(const void* p, uint64_t n) const;

  uint64_t client_uuid() const { return welcome_.client_uuid; }
  // The worker's asynchronous error that a posted cudaGetLastError took, as reported by a later
  // reply (0: none). take_ clears it (cudaGetLastError), peek_ keeps it (cudaPeekAtLastError).
  int32_t take_async_error() { return async_error_.exchange(0, std::memory_order_relaxed); }
  int32_t peek_async_error() const { return async_error_.load(std::memory_order_relaxed); }
  // Posted calls (launches, async copies and memsets, event records, GEMMs) return once on the
  // ring; their errors come with the next synchronous call, like CUDA's asynchronous errors. Off:
  // every call waits for posd's verdict. Default from POS_CLIENT_POST (1).
  void set_post_async(bool on) { post_async_ = on; }
  // Threads that copy a pageable chunk into or out of a staging slot, the calling app thread
  // included (default from POS_CLIENT_COPY_THREADS, else up to 4). Not while a call is running.
  void set_copy_threads(unsigned n);
  unsigned copy_threads() const { return copier_->threads(); }
  // Pageable copies are staged through this many slots of stage_bytes() each at the arena's start.
  static constexpr uint64_t kStageSlots = 4;
  uint64_t stage_bytes() const { return stage_bytes_; }
  const wire::Welcome& welcome() const { return welcome_; }
  // Test hooks: bytes straight onto the ring (malformed frames), and a call whose host pointers
  // go to posd untranslated (what a hostile client could send).
  Status send_raw_for_test(const void* bytes, uint64_t n);
  Status call_untranslated_for_test(ApiId api, std::span<const Param> params);

 private:
  ShmSession() = default;
  bool is_device(uint64_t p) const {
    return p >= welcome_.device_base && p - welcome_.device_base < welcome_.device_size;
  }
  // Another client's range (or this one's handle slots): posd must judge it, never this process.
  bool foreign(uint64_t p) const {
    return p >= welcome_.window_base && p - welcome_.window_base < welcome_.window_size && !is_device(p);
  }
  uint64_t to_daemon(const void* p) const {
    return welcome_.daemon_arena_addr + static_cast<uint64_t>(static_cast<const std::byte*>(p) - arena_);
  }
  // All under mu_.
  // With defer_reply, a call that asks for a reply returns once published; collect(seq) reads it
  // (before any other call that wants a reply is sent).
  Status send(ApiId api, std::span<const Param> params, bool reply, void* ret, uint64_t ret_len,
              uint64_t* ret_written, uint64_t* seq_out = nullptr, bool defer_reply = false);
  Status collect(uint64_t seq);
  Status publish(const std::byte* frame_or_null, uint64_t len, uint32_t api_id, uint16_t flags, uint64_t seq,
                 uint64_t ret_cap, std::span<const Param> params, std::span<const uint64_t> sizes);
  Status wait_done(uint64_t seq);
  Status read_reply(uint64_t seq, void* ret, uint64_t ret_len, uint64_t* ret_written);
  Status peer_alive();
  void reap_temp();
  StatusOr<uint64_t> arena_alloc(uint64_t bytes);  // offset
  void arena_free(uint64_t off);
  StatusOr<uint64_t> temp_block(const void* src, uint64_t n);  // a copy in the arena, freed by reap_temp
  Status copy_sync(uint64_t dst, uint64_t src, uint64_t n, int32_t kind);
  Status copy_async(std::span<const Param> params);
  Status symbol_copy(ApiId api, std::span<const Param> params);
  Status local_pointer_attributes(uint64_t ptr, void* ret, uint64_t ret_len, uint64_t* written, bool* handled);

  int sock_ = -1, efd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t map_bytes_ = 0;
  wire::Welcome welcome_{};
  wire::ShmHeader* hdr_ = nullptr;
  std::byte* ring_ = nullptr;
  wire::ReplySlot* reply_ = nullptr;
  std::byte* arena_ = nullptr;
  uint64_t stage_bytes_ = 0;  // kStageSlots staging slots at the arena's start, each this big
  std::unique_ptr<ParallelCopier> copier_;  // used under mu_
  uint64_t spin_ns_ = 0;
  bool post_async_ = true;

  std::atomic<int32_t> async_error_{0};
  std::mutex mu_;
  uint64_t next_seq_ = 0;       // guarded by mu_
  uint64_t tail_ = 0;           // guarded by mu_: mirror of hdr_->tail
  Status broken_;               // guarded by mu_: once posd is gone, every call fails with it
  std::deque<std::pair<uint64_t, uint64_t>> temp_;  // guarded by mu_: (seq, arena offset)

  std::mutex arena_mu_;
  std::map<uint64_t, uint64_t> free_;   // guarded by arena_mu_: offset → bytes
  std::map<uint64_t, uint64_t> used_;   // guarded by arena_mu_: offset → bytes

  // Detach and re-attach (docs/dump_restore.md). A watcher thread reads the session socket, where
  // posd writes only a detach request; it parks the app's calls (mu_), releases the session and
  // comes back once the permit file appears (or its timeout passes).
  void watch();
  void detach_and_return(const wire::DetachRequest& req);
  Status reattach(const std::string& socket_path, const std::string& token);
  std::string socket_path_, job_;
  std::thread watcher_;
  int watch_stop_ = -1;  // eventfd: the destructor ends the watcher
  std::atomic<uint64_t> detaches_{0};
  // The session memory this process maps, kept open: CRIU restores it with the mapping (one memfd),
  // and a re-attach hands it to posd, so a restored session takes over this very memory.
  int memfd_ = -1;

 public:
  // Times this session detached and came back (tests).
  uint64_t detaches() const { return detaches_.load(std::memory_order_acquire); }
};

}  // namespace pos
