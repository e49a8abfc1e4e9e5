// backend.h — the device backend interface: what the worker asks a device to do.
// Two implementations: CUDA (driver API, the product) and host (CPU memory; CI's faithful double).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pos/base/api_types.h"
#include "pos/handle.h"
#include "pos/base/status.h"

namespace pos {

struct Config;

// A backend object (stream, event, module, function, cuBLAS handle). 0 as a stream means the
// client's legacy default stream.
using BackendObj = uint64_t;

// Device memory one client hands to another of this host (pos-cli migrate's peer switch,
// docs/migration.md): `fd` is a shareable descriptor (the CUDA backend: a POSIX-descriptor handle of
// a VMM allocation; the host backend: a memfd holding a copy) of the memory that backs
// [addr, addr + size) in the exporting client. Move-only; owns fd.
struct PeerMemory {
  uint64_t addr = 0, size = 0;
  int fd = -1;
  PeerMemory() = default;
  PeerMemory(uint64_t a, uint64_t n, int f) : addr(a), size(n), fd(f) {}
  PeerMemory(PeerMemory&& o) noexcept : addr(o.addr), size(o.size), fd(o.fd) { o.fd = -1; }
  PeerMemory& operator=(PeerMemory&& o) noexcept {
    if (this != &o) {
      close_fd();
      addr = o.addr, size = o.size, fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;
  ~PeerMemory() { close_fd(); }

 private:
  void close_fd();
};

// A buffer to fill from peer memory: [addr, addr + size) at the same addresses in both clients.
struct PeerBuffer {
  uint64_t addr = 0, size = 0;
};

// A stretch of one buffer that lies in one range (a buffer may span several adjoining ranges: the
// CUDA backend maps memory in granule-aligned chunks that neighbours share).
struct PeerPiece {
  size_t range = 0;
  uint64_t addr = 0, size = 0;
};

// Checks what a peer hands over before anything is mapped (both backends): ranges inside
// [base, base + span), `align`-aligned, not overlapping, each with a descriptor; every byte of every
// buffer inside some range. Returns the buffers cut at range boundaries, in buffer order.
StatusOr<std::vector<PeerPiece>> check_peer_memory(const std::vector<PeerMemory>& ranges,
                                                   const std::vector<PeerBuffer>& buffers, uint64_t base, uint64_t span,
                                                   uint64_t align);

struct FunctionInfo {
  BackendObj obj = 0;
  bool found = false;  // false: the device has no such kernel (launch fails, registration does not)
  std::vector<KernelParam> layout;
  uint32_t param_bytes = 0;
};

// Copies for the checkpoint engine that run beside the client's own streams: the drainer's
// device→host copies, copy-on-write shadows, restore's host→device loads. Device addresses are the
// client's buffers (not variables) or this copier's shadows. Host memory should come from
// DeviceBackend::host_alloc (page-locked) for full speed. Used by one thread at a time; thread-safe
// with respect to the client's worker (it touches no worker state).
// n bytes between host memory at `host` and device address `dev` (one part of a batched copy).
struct HostSpan {
  std::byte* host = nullptr;
  uint64_t dev = 0;
  uint64_t n = 0;
};

class DeviceCopier {
 public:
  static constexpr int kLanes = 2;  // independent copy queues (lane = stream on a GPU)
  virtual ~DeviceCopier() = default;
  virtual Status to_host_async(void* dst, uint64_t src, uint64_t n, int lane) = 0;
  // Several device ranges into host memory; returns once every byte is there. The drainer hands a
  // few chunks at a time so that a backend can keep several copies in flight (the CUDA backend's
  // lanes into pageable memory, pos/backends/staged_lanes.h); by default one after the other.
  virtual Status to_host_batch(std::span<const HostSpan> parts, int lane) {
    for (const HostSpan& p : parts) POS_RETURN_IF_ERROR(to_host_async(p.host, p.dev, p.n, lane));
    return wait(lane);
  }
  virtual Status to_device_async(uint64_t dst, const void* src, uint64_t n, int lane) = 0;
  virtual Status device_copy_async(uint64_t dst, uint64_t src, uint64_t n, int lane) = 0;
  virtual Status wait(int lane) = 0;  // everything issued on `lane` has finished
  // The client's work from now on runs only after everything issued on `lane` so far (a shadow's
  // copy before the call that writes the buffer). Where the backend can order that on the device
  // (the CUDA backend: the client's streams wait for an event) the caller goes on at once; by
  // default it waits here.
  virtual Status order_client_after(int lane) { return wait(lane); }
  // The checkpoint is over and its shadows freed (the drainer's last step): shadow memory reserved
  // ahead (BackendClient::reserve_shadows) that they did not use goes back to the device. Returns
  // the bytes kept for the next checkpoint (0 where shadows are not kept).
  virtual uint64_t settle_shadows() { return 0; }
  // Device memory outside every client range (copy-on-write shadows).
  virtual StatusOr<uint64_t> shadow_alloc(uint64_t n) = 0;
  virtual void shadow_free(uint64_t addr) = 0;
};

// One client's device state. Confined to that client's worker thread (not thread-safe), except
// that the destructor may run on the thread that shuts the client down, after the worker stopped.
// Work on streams runs asynchronously; *_sync calls and synchronize_all wait for it.
class BackendClient {
 public:
  virtual ~BackendClient() = default;

  // The SMs this client's kernels are confined to (0: all of its device's).
  virtual uint32_t sms_granted() const { return 0; }

  // Memory at addresses the parser chose, inside the client's range: `size` usable bytes (the
  // backend rounds up to its own page or granule; the parser's reservation always covers that).
  virtual Status alloc_at(uint64_t addr, uint64_t size) = 0;
  virtual Status free_at(uint64_t addr, uint64_t size) = 0;

  // Copies. Sync variants run on the legacy default stream and wait; async ones are ordered on
  // `stream`. Async host→device copies take ownership of the bytes (staging, as CUDA does for
  // pageable memory); async device→host copies write `dst` when the stream reaches them.
  virtual Status memcpy_h2d(uint64_t dst, const void* src, uint64_t n) = 0;
  virtual Status memcpy_h2d_async(uint64_t dst, std::vector<std::byte>&& buf, uint64_t offset, uint64_t n,
                                  BackendObj stream) = 0;
  virtual Status memcpy_d2h(void* dst, uint64_t src, uint64_t n) = 0;
  virtual Status memcpy_d2h_async(void* dst, uint64_t src, uint64_t n, BackendObj stream) = 0;
  virtual Status memcpy_d2d(uint64_t dst, uint64_t src, uint64_t n, BackendObj stream, bool sync) = 0;
  virtual Status memset(uint64_t dst, int value, uint64_t n, BackendObj stream, bool sync) = 0;

  virtual StatusOr<BackendObj> stream_create(uint32_t flags, int32_t priority) = 0;
  virtual Status stream_destroy(BackendObj stream) = 0;
  virtual Status stream_synchronize(BackendObj stream) = 0;
  virtual Status stream_query(BackendObj stream) = 0;  // ok, or cudaErrorNotReady
  virtual Status stream_wait_event(BackendObj stream, BackendObj event) = 0;

  virtual StatusOr<BackendObj> event_create(uint32_t flags) = 0;
  virtual Status event_destroy(BackendObj event) = 0;
  virtual Status event_record(BackendObj event, BackendObj stream) = 0;
  virtual Status event_synchronize(BackendObj event) = 0;
  virtual Status event_query(BackendObj event) = 0;
  virtual StatusOr<float> event_elapsed_ms(BackendObj start, BackendObj end) = 0;

  virtual Status synchronize_all() = 0;

  virtual StatusOr<BackendObj> module_load(std::span<const std::byte> fatbin) = 0;
  virtual Status module_unload(BackendObj module) = 0;
  virtual StatusOr<FunctionInfo> function_get(BackendObj module, const std::string& name) = 0;
  virtual Status var_bind(BackendObj module, const std::string& name, uint64_t addr, uint64_t size) = 0;
  virtual Status launch(BackendObj function, const LaunchDims& dims, std::span<const std::byte> params,
                        BackendObj stream) = 0;
  virtual StatusOr<FuncAttributes> function_attributes(BackendObj function) = 0;
  virtual Status function_set_attribute(BackendObj function, int32_t attr, int32_t value) = 0;
  virtual StatusOr<int32_t> occupancy(BackendObj function, int32_t block_size, uint64_t dyn_smem,
                                      uint32_t flags) = 0;

  virtual StatusOr<BackendObj> blas_create() = 0;
  virtual Status blas_destroy(BackendObj handle) = 0;
  virtual Status blas_set_stream(BackendObj handle, BackendObj stream) = 0;
  virtual Status blas_set_math_mode(BackendObj handle, int32_t mode) = 0;
  virtual Status blas_gemm(BackendObj handle, const GemmArgs& args) = 0;

  // A copier for the checkpoint engine (see DeviceCopier); may be handed to another thread.
  virtual StatusOr<std::unique_ptr<DeviceCopier>> make_copier() = 0;
  // Ahead of an async checkpoint's cut, on the thread that asked for it (thread-safe, unlike the
  // rest): a backend that keeps shadows between checkpoints (the CUDA backend with
  // checkpoint.keep_shadows) grows its pool to `bytes` the first time, so that the first tick's
  // copy-on-write does not wait for the driver to map device memory; that checkpoint's end gives
  // back what its shadows did not use (DeviceCopier::settle_shadows). Returns the bytes it grew
  // the pool by (by default nothing).
  virtual uint64_t reserve_shadows(uint64_t bytes) { (void)bytes; return 0; }

  // pos-cli migrate's peer switch (docs/migration.md). export_memory: descriptors of all the memory
  // that backs this client's allocations, once its work is done (the caller synchronized).
  // copy_from_peer: each buffer's bytes, from another client's exported memory at the same
  // addresses, into this client's (its allocations exist: a restore made them). Ranges are checked
  // (check_peer_memory) before anything is mapped; a failure leaves this client's memory as it was
  // or partly copied, never anything else touched.
  virtual StatusOr<std::vector<PeerMemory>> export_memory() {
    return Status::Unsupported("this backend cannot hand its device memory to another session");
  }
  virtual Status copy_from_peer(const std::vector<PeerMemory>& ranges, const std::vector<PeerBuffer>& buffers) {
    (void)ranges, (void)buffers;
    return Status::Unsupported("this backend cannot take device memory from another session");
  }
};

// A device backend. Thread-safe: clients are opened from the workspace's control thread and used
// from their own workers.
class DeviceBackend {
 public:
  // A backend that overrides host_free calls release_staging_chunks() in its own destructor: here
  // only the base class's host_free can be reached.
  virtual ~DeviceBackend() { release_staging_chunks(); }
  virtual std::string_view name() const = 0;
  // The device model (an image refuses to restore onto another).
  virtual std::string device_name(int device) const = 0;
  virtual int device_count() const = 0;
  // Address-space granularity of allocations (the parser rounds reservations to it).
  virtual uint64_t granularity() const = 0;
  virtual Status properties(int device, DeviceProps* out) const = 0;
  virtual Status attribute(int32_t attr, int device, int32_t* out) const = 0;
  virtual int32_t driver_version() const = 0;
  virtual Status mem_info(int device, MemInfo* out) const = 0;
  // `sms`: the SMs the client's kernels may run on (0: all); a backend that cannot confine them
  // opens the client on the whole device (BackendClient::sms_granted says which).
  virtual StatusOr<std::unique_ptr<BackendClient>> open_client(uint64_t va_base, uint64_t va_size, int device,
                                                               uint32_t sms) = 0;
  // Device-wide memory accounting, done by parsers when they accept an allocation so that the
  // worker's allocation cannot fail for lack of capacity afterwards. Thread-safe.
  bool try_reserve(uint64_t bytes);
  void unreserve(uint64_t bytes) { reserved_.fetch_sub(bytes); }
  uint64_t reserved_bytes() const { return reserved_.load(); }

  // Page-locked host memory the device can reach by DMA (cudaMallocHost in-process): copies from it
  // need no staging. The host backend hands out plain page-aligned memory. Thread-safe.
  virtual StatusOr<void*> host_alloc(uint64_t bytes);
  virtual Status host_free(void* p);
  // Page-locks memory the caller mapped (posd: a session's shared arena), so copies to and from
  // it run at DMA speed. The host backend needs nothing. Thread-safe.
  virtual Status host_register(void* p, uint64_t bytes) { (void)p, (void)bytes; return Status::Ok(); }
  virtual Status host_unregister(void* p) { (void)p; return Status::Ok(); }
  // The same, piece by piece as copies first name it (the CUDA backend page-locks a few MiB at a
  // time): memory nobody copies to or from is never page-locked, so never made resident either,
  // and a CPU checkpoint of the process that maps it (CRIU) does not save it. By default at once.
  virtual Status host_register_on_use(void* p, uint64_t bytes) { return host_register(p, bytes); }
  virtual Status host_unregister_on_use(void* p) { return host_unregister(p); }

  // Page-locked chunks of kStagingChunkBytes (ckpt's chunk), kept for reuse by the checkpoint
  // drainer's staging and a restore's loaders. One page-locked allocation of a chunk costs
  // milliseconds and waits behind the driver's other work: a checkpoint's 16 of them were ~60 ms
  // of every checkpoint's time to its cut on the H200 (a migration's stop included), and a
  // restore's 17 ~75 ms of a migration's restore ahead. Thread-safe.
  static constexpr uint64_t kStagingChunkBytes = 8u << 20;
  static constexpr size_t kKeptStagingChunks = 32;  // at most this many kept (256 MiB)
  // A kept chunk, else a new one (host_alloc).
  StatusOr<void*> take_staging_chunk();
  // Back to the kept ones (beyond kKeptStagingChunks: freed).
  void give_staging_chunk(void* p);
  // Makes chunks now until `n` are kept (a spare session process, before the restore it may be
  // handed); fewer if the backend refuses. Returns how many are kept.
  size_t keep_staging_chunks(size_t n);
  size_t staging_chunks_kept() const;
  // Frees the kept chunks (a session that will not checkpoint or restore; a backend's destructor).
  void release_staging_chunks();

  // Whether the copy-on-write shadows of clients opened from now on are kept between async
  // checkpoints (config checkpoint.keep_shadows; a spare session learns it when it is handed its
  // job). Only the CUDA backend allocates shadows.
  virtual void set_keep_shadows(bool keep) { (void)keep; }

 protected:
  // What parsers may reserve in all; set by the backend before it opens clients.
  void set_memory_capacity(uint64_t bytes) { capacity_ = bytes; }

 private:
  uint64_t capacity_ = 0;
  std::atomic<uint64_t> reserved_{0};
  mutable std::mutex chunks_mu_;
  std::vector<void*> chunks_;  // guarded by chunks_mu_: kept staging chunks
};


}  // namespace pos
