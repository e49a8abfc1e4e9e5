// image.h — the POS checkpoint image: writing one (to a directory or to host memory), opening and
// validating one, reading its device bytes back. Knows nothing of clients; pos/checkpoint fills it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/image.pb.h"
#include "pos/base/status.h"

namespace pos::ckpt {

// Layout of a directory image (docs/image_format.md):
//   inventory.pb  kMagic, u32 format version, u32 length, Inventory, u32 crc32c of all before it
//   client.pb     ClientImage (size and crc32c in the inventory)
//   memory.bin    device bytes, one blob per buffer at kBlobAlign-aligned offsets
//   memory.K.bin  (format 3, K = 1..) more of them: a large image spreads its blobs over files
inline constexpr char kMagic[8] = {'P', 'O', 'S', 'I', 'M', 'G', '\r', '\n'};
// Writers of new images write kFormatVersion; readers take kMinFormatVersion..kNewestFormatVersion.
// Version 2 added ClientImage.pending (calls to replay after restore); a version 1 image has none.
// Version 3 added memory files beyond memory.bin (BlobRef.file, Inventory.memory_file_sizes).
// Version 4: a striped blob may start at any memory file (BlobRef.file), which only an image made
// whole from an incremental one writes (image_rebase.h: its ancestors' files are linked in after its
// own), and only when it needs it.
inline constexpr uint32_t kFormatVersion = 3;
inline constexpr uint32_t kNewestFormatVersion = 4;
inline constexpr uint32_t kMaxMemoryFiles = 64;  // memory.bin and memory.1.bin .. memory.63.bin
inline constexpr uint32_t kMinFormatVersion = 1;
inline constexpr uint64_t kBlobAlign = 4096;
inline constexpr uint32_t kChunkSize = 8u << 20;  // copy unit and checksum unit
// A writer spreads blobs over its files once memory.bin holds this much: small images stay one file.
// Then a blob of more than kStripeAfter bytes is striped chunk by chunk over all of them.
inline constexpr uint64_t kSpreadAfter = 64ull << 20;
inline constexpr uint64_t kStripeAfter = 2ull * kChunkSize;
// Where chunk `index` of a blob lies: its memory file and the offset in it.
struct BlobChunkAt {
  uint32_t file;
  uint64_t offset;
};
BlobChunkAt blob_chunk_at(const pb::BlobRef& ref, uint64_t index);
// Memory file `k` of an image: memory.bin, memory.1.bin, ...
std::string image_memory_file(uint32_t k);
// fsync of a directory (after entries in it were made, renamed or linked).
Status sync_directory(const std::string& dir);
inline constexpr int kMaxParentDepth = 64;
inline constexpr uint64_t kMaxRecordBytes = 1ull << 30;  // client.pb: fatbins included
// Bounds on pending calls (ClientImage.pending). A client never has more than 2 x queues.depth
// (at most 2^21) calls in flight; a call has at most a handful of parameters; the answers the
// parser gives are small. The byte bounds keep client.pb under kMaxRecordBytes with its fatbins:
// a stop checkpoint whose pending calls exceed them fails, and the client runs on.
inline constexpr uint64_t kMaxPendingCalls = 1ull << 21;
inline constexpr uint64_t kMaxPendingParams = 16;          // parameters of one call
inline constexpr uint64_t kMaxPendingCallBytes = 256ull << 20;  // parameter bytes of one call
inline constexpr uint64_t kMaxPendingBytes = 512ull << 20;      // parameter bytes of all of them
inline constexpr uint64_t kMaxPendingRetBytes = 4096;           // one call's recorded answer

// Host memory for blobs and staging: page-locked where the device backend can give it, so that
// device→host copies are single DMA transfers. Thread-safe functions.
struct HostAllocator {
  std::function<void*(uint64_t bytes)> alloc;
  std::function<void(void* p)> free;
  static HostAllocator plain();  // page-aligned ordinary memory
  // Ordinary memory in 2 MiB-aligned blocks the kernel is asked to back with huge pages: a first
  // dump into it faults in 2 MiB at a time, so the copy threads that fill it are not held up by
  // half a million 4 KiB faults per GiB. Nothing is page-locked: the device backend copies into
  // it through bounded staging (pos/backends/staged_copy.h) at near DMA speed.
  static HostAllocator pageable();
};

// An image kept in host memory (the fastest target; also what a directory image is loaded into).
// Its blob segments survive from one dump to the next, so continuous checkpointing pins memory
// once. Not thread-safe; one dump or restore at a time.
class MemoryImage {
 public:
  explicit MemoryImage(HostAllocator alloc) : alloc_(std::move(alloc)) {}
  ~MemoryImage();
  MemoryImage(const MemoryImage&) = delete;
  MemoryImage& operator=(const MemoryImage&) = delete;

  bool valid() const { return valid_; }
  const pb::Inventory& inventory() const { return inventory_; }
  const pb::ClientImage& client() const { return client_; }
  uint64_t memory_size() const { return used_; }
  // Bytes at image offset `off` (inside one blob).
  std::byte* at(uint64_t off);
  const std::byte* at(uint64_t off) const;
  uint64_t pinned_bytes() const;

  // Writes it as a directory image (same atomic rules as a dump to a directory).
  Status save_to_dir(const std::string& dir) const;

  // The memory writer's side (open_memory_writer): start over, place blobs, publish the records.
  void begin_dump();
  StatusOr<uint64_t> add_blob(uint64_t length);  // a segment for it; returns its image offset
  void finish_dump(pb::Inventory inventory, pb::ClientImage client);
  void invalidate() { valid_ = false; }

 private:
  struct Segment {
    std::byte* p = nullptr;
    uint64_t capacity = 0;
    uint64_t offset = 0;  // image offset it serves (valid while in use)
    uint64_t length = 0;
    bool used = false;
  };
  HostAllocator alloc_;
  std::vector<Segment> segments_;
  uint64_t used_ = 0;
  bool valid_ = false;
  pb::Inventory inventory_;
  pb::ClientImage client_;
};

// Writes one image. The engine's drainer thread calls begin_blob / chunk / chunk_filled for each
// buffer in turn; finish() then commit() (or abort()). Not thread-safe beyond that one caller.
class ImageWriter {
 public:
  virtual ~ImageWriter() = default;
  // A new blob of `length` bytes; its BlobRef comes back from finish_blobs().
  virtual Status begin_blob(uint64_t length, size_t* blob) = 0;
  // Host memory for bytes [off, off+n) of `blob` (off a multiple of kChunkSize, n ≤ kChunkSize).
  // Blocks while every staging buffer is in flight.
  virtual StatusOr<std::byte*> chunk(size_t blob, uint64_t off, uint64_t n) = 0;
  // The buffer chunk() gave now holds the bytes: checksum (and write) them.
  virtual Status chunk_filled(size_t blob, uint64_t off, uint64_t n) = 0;
  // How many chunks the caller may hold from chunk() before it calls chunk_filled() for them (a
  // memory image lends its own memory, so several; a file writer's staging buffers are few).
  virtual unsigned chunks_at_once() const { return 1; }
  // Waits for every checksum and write. After it, ref(i) is final.
  virtual Status finish_blobs() = 0;
  virtual const pb::BlobRef& ref(size_t blob) const = 0;
  // Records the metadata and makes the image durable and visible (atomically). The inventory's
  // format version, sizes and checksums are filled in here.
  virtual Status commit(pb::Inventory inventory, const pb::ClientImage& client) = 0;
  // Leaves nothing behind (a directory dump removes its partial directory).
  virtual void abort() = 0;
};

struct DirWriterOptions {
  bool replace = false;      // an existing image at `dir` is replaced atomically (else: refused)
  uint32_t staging_buffers = 8;
  bool direct_io = true;     // O_DIRECT for the memory files where the file system allows it
  // Memory files, each with a writer thread of its own (one file's writes are serialized by its
  // inode lock: ~2-4 GB/s; side by side they reach the page cache's 30-50 GB/s). 0: by the cores.
  uint32_t memory_files = 0;
  HostAllocator alloc = HostAllocator::plain();
  // The writer threads' nice (each thread's own, set as it starts; 0: left as it is). A checkpoint
  // whose job runs on beside it writes at 19: its checksums and writes then take only the cores
  // that posd's worker, serving the job meanwhile, leaves (docs/checkpoint.md).
  int nice = 0;
  // Called by a writer thread once bytes [offset, offset+length) of memory file `name` (memory.bin,
  // memory.K.bin, inside "<dir>.partial") are written; chunks of zeros, left as holes, are not
  // reported. pos-cli migrate sends the stop's GPU part as posd drains it from these.
  std::function<void(const std::string& name, uint64_t offset, uint64_t length)> on_written;
  // The memory files a writer with these options opens, and the staging chunks (kChunkSize) it
  // takes from `alloc` when it opens (a session that page-locks them ahead makes this many).
  uint32_t files() const;
  uint32_t staging_chunks() const;
};
// To a directory: everything goes to "<dir>.partial" first, is fsynced, then renamed into place
// (or exchanged with the old image when replacing), so a crash never damages the last image.
StatusOr<std::unique_ptr<ImageWriter>> open_dir_writer(const std::string& dir, const DirWriterOptions& options);
// To host memory: blobs land in `image`'s segments; checksums by a small thread pool.
StatusOr<std::unique_ptr<ImageWriter>> open_memory_writer(MemoryImage* image, int crc_threads = 0);

// An opened, validated image (and its parents, for an incremental one). Everything structural
// is checked at open: magic, version, record checksums, record consistency, blob bounds, file
// sizes, the parent chain. Blob bytes are checked chunk by chunk as they are read.
// Thread-compatible: concurrent read_chunk calls are fine.
class ImageReader {
 public:
  static StatusOr<std::unique_ptr<ImageReader>> open_dir(const std::string& dir);
  static StatusOr<std::unique_ptr<ImageReader>> open_memory(const MemoryImage* image);
  ~ImageReader();

  const pb::Inventory& inventory() const { return inventory_; }
  const pb::ClientImage& client() const { return client_; }
  const ImageReader* parent() const { return parent_.get(); }
  const std::string& dir() const { return dir_; }  // empty for a memory image

  // Where handle `h`'s bytes live: this image or the ancestor that stored them.
  StatusOr<std::pair<const ImageReader*, const pb::BlobRef*>> resolve(const pb::HandleRecord& h) const;
  // Bytes [off, off+n) of a blob of THIS image: off a multiple of the blob's chunk size, n the
  // whole chunk (or the blob's tail). The chunk's checksum is verified.
  Status read_chunk(const pb::BlobRef& ref, uint64_t off, uint64_t n, std::byte* dst) const;
  // For memory images: the bytes in place (no copy; verify_chunk checks them). nullptr for files.
  const std::byte* direct(const pb::BlobRef& ref, uint64_t off) const;
  Status verify_chunk(const pb::BlobRef& ref, uint64_t off, uint64_t n, const std::byte* data) const;

 private:
  ImageReader() = default;
  static StatusOr<std::unique_ptr<ImageReader>> open_dir_at(const std::string& dir, int depth);
  Status validate(int depth);

  std::string dir_;
  const MemoryImage* mem_ = nullptr;
  std::vector<int> memory_fds_;  // memory.bin, memory.1.bin, ...
  pb::Inventory inventory_;
  pb::ClientImage client_;
  std::unique_ptr<ImageReader> parent_;
};

// Decodes inventory.pb bytes (exposed for the fuzzer and `pos-cli inspect`).
StatusOr<pb::Inventory> decode_inventory(const std::string& bytes);
std::string encode_inventory(const pb::Inventory& inv);
// Structural checks of a ClientImage on its own (record types, parents, blob refs vs sizes,
// pending calls: known API that returns after parsing, pcs strictly increasing from the cut,
// parameter counts and sizes within the bounds above).
// `memory_sizes`: the bytes of memory.bin, memory.1.bin, ...; a blob must lie inside its file.
Status validate_client(const pb::ClientImage& c, const std::vector<uint64_t>& memory_sizes, bool has_parent);
inline Status validate_client(const pb::ClientImage& c, uint64_t memory_size, bool has_parent) {
  return validate_client(c, std::vector<uint64_t>{memory_size}, has_parent);
}
// One pending call's checks (validate_client runs them on every record, with its running totals).
Status validate_pending_call(const pb::PendingCall& p, uint64_t min_pc);

// A fault point (docs/image_format.md): when POS_FAULT_POINT names `stage`, the process is
// killed there (SIGKILL) — how the tests prove a crash mid-dump leaves the last image intact.
// "STAGE:stop" stops it there instead (SIGSTOP), for a test to break something else meanwhile.
void fault_point(const char* stage);

std::string random_image_id();

}  // namespace pos::ckpt
