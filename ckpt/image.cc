// image.cc — image writers (directory: staged, O_DIRECT, fsync + rename; memory: pinned segments)
// and the validating reader. Every byte read from an image is checked before it is trusted.
#include "ckpt/image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>

#include "ckpt/crc32c.h"
#include "pos/base/api_id.h"
#include "pos/base/resource_type.h"
#include "pos/base/text.h"

namespace fs = std::filesystem;

namespace pos::ckpt {
namespace {

constexpr uint32_t kNumTypes = kResourceTypeCount;
constexpr uint32_t kTypeMemory = static_cast<uint32_t>(ResourceType::kMemory);
constexpr uint32_t kTypeVar = static_cast<uint32_t>(ResourceType::kVar);

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

Status errno_status(const std::string& what) {
  return Status(Code::kUnavailable, 0, what + ": " + std::strerror(errno));
}

// RAII for a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }
  void reset(int f = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = f;
  }

 private:
  int fd_ = -1;
};

Status write_all(int fd, const void* p, uint64_t n, uint64_t off, const std::string& what) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, b, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_status("writing " + what);
    }
    b += w, off += static_cast<uint64_t>(w), n -= static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status read_all(int fd, void* p, uint64_t n, uint64_t off, const std::string& what) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, b, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status("reading " + what);
    }
    if (r == 0) return Status::Corrupt(what + " is truncated");
    b += r, off += static_cast<uint64_t>(r), n -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status write_file(const fs::path& p, const std::string& bytes) {
  Fd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno_status("creating " + p.string());
  POS_RETURN_IF_ERROR(write_all(fd.get(), bytes.data(), bytes.size(), 0, p.string()));
  if (::fsync(fd.get()) != 0) return errno_status("fsync " + p.string());
  return Status::Ok();
}

// What a file is, for messages.
const char* kind_of(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  return "of an unknown kind";
}
Status not_regular(const fs::path& p, mode_t m) {
  return Status::Corrupt(p.string() + " is " + kind_of(m) + ", not a regular file (an image holds regular files only)");
}

// Opens a file of an image for reading, only if it is a regular file (docs/image_format.md,
// "Regular files only"): a FIFO blocks open() and read() forever, a device may never end or act
// on open, a symbolic link may point anywhere. lstat first, so nothing else is ever opened; then
// O_NOFOLLOW | O_NONBLOCK, so a swap after the lstat cannot follow a link or block; then fstat,
// so what is read is what was checked. *st: the file's stat.
StatusOr<Fd> open_regular(const fs::path& p, struct stat* st) {
  if (::lstat(p.c_str(), st) != 0) {
    if (errno == ENOENT) return Status::Corrupt(p.string() + " is missing (not a complete POS image)");
    return errno_status("stat " + p.string());
  }
  if (!S_ISREG(st->st_mode)) return not_regular(p, st->st_mode);
  Fd fd(::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ELOOP) return not_regular(p, S_IFLNK);
    if (errno == ENOENT) return Status::Corrupt(p.string() + " is missing (not a complete POS image)");
    return errno_status("opening " + p.string());
  }
  if (::fstat(fd.get(), st) != 0) return errno_status("stat " + p.string());
  if (!S_ISREG(st->st_mode)) return not_regular(p, st->st_mode);
  // Regular files ignore O_NONBLOCK; cleared so the descriptor is an ordinary blocking one.
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) return errno_status("fcntl " + p.string());
  return fd;
}

StatusOr<std::string> read_file(const fs::path& p, uint64_t limit) {
  struct stat st {};
  auto opened = open_regular(p, &st);
  if (!opened.ok()) return opened.status();
  const Fd fd = std::move(*opened);
  if (static_cast<uint64_t>(st.st_size) > limit)
    return Status::Corrupt(p.string() + " is too large (" + std::to_string(st.st_size) + " bytes)");
  std::string s(static_cast<size_t>(st.st_size), '\0');
  POS_RETURN_IF_ERROR(read_all(fd.get(), s.data(), s.size(), 0, p.string()));
  return s;
}

Status fsync_dir(const fs::path& p) {
  Fd fd(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status("opening directory " + p.string());
  if (::fsync(fd.get()) != 0) return errno_status("fsync " + p.string());
  return Status::Ok();
}

uint32_t load_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void store_u32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }

// Checksums of a blob's chunks, filled by whoever checksums each chunk.
void set_chunk_crc(pb::BlobRef* ref, uint64_t off, uint32_t crc) {
  ref->set_chunk_crc(static_cast<int>(off / ref->chunk_size()), crc);
}
}  // namespace

std::string image_memory_file(uint32_t k) { return k == 0 ? "memory.bin" : "memory." + std::to_string(k) + ".bin"; }

Status sync_directory(const std::string& dir) { return fsync_dir(dir); }

BlobChunkAt blob_chunk_at(const pb::BlobRef& ref, uint64_t index) {
  if (ref.stripes() < 2) return BlobChunkAt{ref.file(), ref.offset() + index * ref.chunk_size()};
  return BlobChunkAt{ref.file() + static_cast<uint32_t>(index % ref.stripes()),
                     ref.offset() + (index / ref.stripes()) * ref.chunk_size()};
}

namespace {

// Bytes of a blob in memory file `k` of its stripes (the whole blob when it is not striped).
uint64_t stripe_bytes(const pb::BlobRef& ref, uint32_t k) {
  if (ref.stripes() < 2) return ref.length();
  const uint64_t cs = ref.chunk_size(), chunks = (ref.length() + cs - 1) / cs;
  if (k >= chunks) return 0;
  const uint64_t mine = (chunks - k + ref.stripes() - 1) / ref.stripes();  // chunks k, k+S, ...
  const uint64_t last = (chunks - 1) % ref.stripes() == k ? ref.length() - (chunks - 1) * cs : cs;
  return (mine - 1) * cs + last;
}

pb::BlobRef new_ref(uint64_t offset, uint64_t length) {
  pb::BlobRef r;
  r.set_offset(offset);
  r.set_length(length);
  r.set_chunk_size(kChunkSize);
  const uint64_t chunks = (length + kChunkSize - 1) / kChunkSize;
  for (uint64_t i = 0; i < chunks; ++i) r.add_chunk_crc(0);
  return r;
}

// A small pool that runs checksum jobs; wait() returns when all submitted jobs ran.
class CrcPool {
 public:
  explicit CrcPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~CrcPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.push_back(std::move(job));
      ++pending_;
    }
    cv_.notify_one();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  uint64_t pending_ = 0;                    // guarded by mu_
  bool stop_ = false;                       // guarded by mu_
  std::vector<std::thread> threads_;
};

int default_crc_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hc / 2, 1, 8));
}

// Whether messages of type `d` hold a `string` field anywhere (so the check below can skip the
// handle records, thousands of them, which hold none).
bool holds_text(const google::protobuf::Descriptor* d, int depth = 0) {
  using google::protobuf::FieldDescriptor;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->type() == FieldDescriptor::TYPE_STRING) return true;
    if (f->type() == FieldDescriptor::TYPE_MESSAGE && depth < 8 && holds_text(f->message_type(), depth + 1)) return true;
  }
  return false;
}

// Every `string` field of `m` (recursively) is UTF-8: protobuf writes one that is not (with a log
// line) but refuses to decode it, which would give an image that never reads back. Walks the
// descriptors, so a `string` field added to image.proto later is checked too.
Status check_text(const google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      for (int j = 0; j < n; ++j) {
        const std::string v = f->is_repeated() ? r->GetRepeatedString(m, f, j) : r->GetString(m, f);
        if (is_utf8(v)) continue;
        const std::string field = d->name() + "." + f->name() + (f->is_repeated() ? "[" + std::to_string(j) + "]" : "");
        return Status::InvalidArgument("cannot write the image: " + field + " is not UTF-8 text ('" + printable(v, 256) +
                                       "'), and an image with it could not be read back");
      }
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE && holds_text(f->message_type())) {
      for (int j = 0; j < n; ++j) {
        if (!f->is_repeated() && !r->HasField(m, f)) continue;
        POS_RETURN_IF_ERROR(check_text(f->is_repeated() ? r->GetRepeatedMessage(m, f, j) : r->GetMessage(m, f)));
      }
    }
  }
  return Status::Ok();
}

// The two files that carry records, written into `dir` (fsynced).
Status write_records(const fs::path& dir, pb::Inventory inv, const pb::ClientImage& client, uint64_t memory_size) {
  // Before anything of the records is written: a refused image leaves only its partial directory,
  // which the caller's abort removes.
  POS_RETURN_IF_ERROR(check_text(inv));
  POS_RETURN_IF_ERROR(check_text(client));
  std::string cbytes;
  if (!client.SerializeToString(&cbytes)) return Status::Internal("cannot encode the client records");
  inv.set_format_version(kFormatVersion);
  inv.set_client_size(cbytes.size());
  inv.set_client_crc(crc32c(cbytes.data(), cbytes.size()));
  inv.set_memory_size(memory_size);
  POS_RETURN_IF_ERROR(write_file(dir / "client.pb", cbytes));
  fault_point("dump-records");
  POS_RETURN_IF_ERROR(write_file(dir / "inventory.pb", encode_inventory(inv)));
  fault_point("dump-inventory");
  return Status::Ok();
}

// Moves a finished "<dir>.partial" into place: a plain rename, or an atomic exchange with the
// image being replaced (whose remains are then removed).
Status publish(const fs::path& partial, const fs::path& dir, bool replace) {
  POS_RETURN_IF_ERROR(fsync_dir(partial));
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  if (exists && !replace) return Status::FailedPrecondition(dir.string() + " already exists");
  if (exists) {
    if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0)
      return errno_status("exchanging " + partial.string() + " with " + dir.string());
    fault_point("dump-exchanged");
    POS_RETURN_IF_ERROR(fsync_dir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path()));
    fs::remove_all(partial, ec);  // the old image, now under the partial name
  } else {
    if (::rename(partial.c_str(), dir.c_str()) != 0)
      return errno_status("renaming " + partial.string() + " to " + dir.string());
    fault_point("dump-renamed");
    POS_RETURN_IF_ERROR(fsync_dir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path()));
  }
  return Status::Ok();
}

// ---------------- directory writer ----------------
class DirWriter final : public ImageWriter {
 public:
  DirWriter(fs::path dir, fs::path partial, DirWriterOptions opt) : dir_(std::move(dir)), partial_(std::move(partial)), opt_(std::move(opt)) {}
  ~DirWriter() override {
    stop_writers();
    for (std::byte* b : all_) opt_.alloc.free(b);
    if (!committed_) abort();
  }

  Status open() {
    std::error_code ec;
    fs::remove_all(partial_, ec);  // the remains of a dump that crashed
    if (!fs::create_directory(partial_, ec))
      return Status(Code::kUnavailable, 0, "cannot create " + partial_.string() + ": " + ec.message());
    fault_point("dump-begin");
    nfiles_ = opt_.files();
    POS_RETURN_IF_ERROR(open_file(0));  // memory.bin always; the others once a blob goes there
    for (uint32_t i = 0; i < opt_.staging_chunks(); ++i) {
      auto* b = static_cast<std::byte*>(opt_.alloc.alloc(kChunkSize));
      if (b == nullptr) return Status(Code::kOutOfMemory, 0, "cannot allocate checkpoint staging memory");
      all_.push_back(b);
      free_.push_back(b);
    }
    // A writer per file: each takes any chunk, but two never write one file at once (its inode
    // lock would make the second wait anyway).
    for (unsigned i = 0; i < nfiles_; ++i)
      writers_.emplace_back([this] {
        if (opt_.nice != 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), opt_.nice);
        write_loop();
      });
    return Status::Ok();
  }

  Status begin_blob(uint64_t length, size_t* blob) override {
    // Under mu_: a caller may add blobs while the writers still write earlier ones (save_to_dir).
    std::lock_guard<std::mutex> lk(mu_);
    // memory.bin first; past kSpreadAfter, a large blob striped over every file (its chunks go to
    // the writers in turn), a small one into the least filled file.
    const bool spread = ends_[0] >= kSpreadAfter && nfiles_ > 1;
    if (spread)
      for (uint32_t i = static_cast<uint32_t>(files_.size()); i < nfiles_; ++i) {
        Status st = open_file(i);
        if (!st.ok()) return st;
      }
    *blob = refs_.size();
    if (spread && length > kStripeAfter) {
      // One offset for all: where the fullest file ends (the others get a hole, which costs nothing).
      const uint64_t at = *std::max_element(ends_.begin(), ends_.end());
      pb::BlobRef r = new_ref(at, length);
      r.set_stripes(nfiles_);
      for (uint32_t k = 0; k < nfiles_; ++k) ends_[k] = std::max(ends_[k], align_up(at + stripe_bytes(r, k), kBlobAlign));
      refs_.push_back(std::move(r));
      return Status::Ok();
    }
    uint32_t f = 0;
    if (spread)
      for (uint32_t i = 1; i < nfiles_; ++i)
        if (ends_[i] < ends_[f]) f = i;
    pb::BlobRef r = new_ref(ends_[f], length);
    if (f > 0) r.set_file(f);
    refs_.push_back(std::move(r));
    ends_[f] = align_up(ends_[f] + length, kBlobAlign);
    return Status::Ok();
  }
  StatusOr<std::byte*> chunk(size_t, uint64_t, uint64_t) override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !free_.empty() || !error_.ok(); });
    if (!error_.ok()) return error_;
    std::byte* b = free_.back();
    free_.pop_back();
    lent_.push_back(b);
    return b;
  }
  Status chunk_filled(size_t blob, uint64_t off, uint64_t n) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.ok()) return error_;
    // chunk() calls are matched by chunk_filled() in order.
    std::byte* b = lent_.front();
    lent_.pop_front();
    jobs_.push_back(Job{b, blob, off, n});
    cv_.notify_all();
    return Status::Ok();
  }
  Status finish_blobs() override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return (jobs_.empty() && busy_.empty()) || !error_.ok(); });
    if (!error_.ok()) return error_;
    lk.unlock();
    // Each file ends where its last blob's aligned slot ends (the inventory's sizes).
    for (size_t i = 0; i < files_.size(); ++i) {
      const std::string name = image_memory_file(static_cast<uint32_t>(i));
      if (::ftruncate(files_[i].fd.get(), static_cast<off_t>(ends_[i])) != 0) return errno_status("sizing " + name);
      if (::fsync(files_[i].fd.get()) != 0) return errno_status("fsync " + name);
    }
    return Status::Ok();
  }
  const pb::BlobRef& ref(size_t blob) const override { return refs_[blob]; }
  Status commit(pb::Inventory inv, const pb::ClientImage& client) override {
    stop_writers();
    inv.clear_memory_file_sizes();
    for (size_t i = 1; i < files_.size(); ++i) inv.add_memory_file_sizes(ends_[i]);
    POS_RETURN_IF_ERROR(write_records(partial_, std::move(inv), client, ends_[0]));
    POS_RETURN_IF_ERROR(publish(partial_, dir_, opt_.replace));
    committed_ = true;
    return Status::Ok();
  }
  void abort() override {
    stop_writers();
    std::error_code ec;
    fs::remove_all(partial_, ec);
  }

 private:
  struct Job {
    std::byte* buf;
    size_t blob;
    uint64_t off, n;
  };
  struct File {
    Fd fd;
    bool direct = false;
  };
  // Under mu_ (or before the writers start).
  Status open_file(uint32_t i) {
    const fs::path mem = partial_ / image_memory_file(i);
    const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = opt_.direct_io ? ::open(mem.c_str(), flags | O_DIRECT, 0644) : -1;
    const bool direct = fd >= 0;
    if (fd < 0) fd = ::open(mem.c_str(), flags, 0644);
    if (fd < 0) return errno_status("creating " + mem.string());
    File f;
    f.fd.reset(fd);
    f.direct = direct;
    files_.push_back(std::move(f));
    ends_.push_back(0);
    return Status::Ok();
  }
  void write_loop() {
    for (;;) {
      Job j{};
      uint64_t at = 0;
      uint32_t file = 0;
      int fd = -1;
      bool direct = false;
      {
        std::unique_lock<std::mutex> lk(mu_);
        // The first job whose file no other writer is writing.
        auto pick = jobs_.end();
        cv_.wait(lk, [&] {
          pick = std::find_if(jobs_.begin(), jobs_.end(), [&](const Job& x) {
            return busy_.count(blob_chunk_at(refs_[x.blob], x.off / refs_[x.blob].chunk_size()).file) == 0;
          });
          return stop_ || pick != jobs_.end();
        });
        if (pick == jobs_.end()) return;  // stopping, nothing it may take
        j = *pick;
        jobs_.erase(pick);
        const BlobChunkAt place = blob_chunk_at(refs_[j.blob], j.off / refs_[j.blob].chunk_size());
        file = place.file;
        busy_.insert(file);
        at = place.offset;
        fd = files_[file].fd.get(), direct = files_[file].direct;
      }
      const uint32_t crc = crc32c(j.buf, j.n);
      // O_DIRECT wants whole sectors: the tail of a blob is padded with zeros up to the alignment
      // (the next blob starts there anyway).
      uint64_t len = j.n;
      if (direct && len % kBlobAlign != 0) {
        const uint64_t padded = align_up(len, kBlobAlign);
        std::memset(j.buf + len, 0, padded - len);
        len = padded;
      }
      // A chunk of zeros is not written: the file, new and sized at finish_blobs, keeps a hole
      // there, which reads as zeros. Memory the job allocated but never wrote, or wrote only a
      // part of (the H200 migration bench's 256 MiB gradient buffer of which one layer's 8 MiB is
      // used), is then neither written here nor read again by the migration stream (it sends what
      // the file system says is data).
      const bool zeros = len > 0 && j.buf[0] == std::byte{0} && std::memcmp(j.buf, j.buf + 1, len - 1) == 0;
      Status s = zeros ? Status::Ok() : write_all(fd, j.buf, len, at, image_memory_file(file));
      if (s.ok() && !zeros && opt_.on_written) opt_.on_written(image_memory_file(file), at, len);
      fault_point("dump-blob");
      std::lock_guard<std::mutex> lk(mu_);
      set_chunk_crc(&refs_[j.blob], j.off, crc);  // refs_ grows under mu_ too
      if (!s.ok() && error_.ok()) error_ = s;
      free_.push_back(j.buf);
      busy_.erase(file);
      cv_.notify_all();
    }
  }
  void stop_writers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : writers_)
      if (w.joinable()) w.join();
    writers_.clear();
  }

  fs::path dir_, partial_;
  DirWriterOptions opt_;
  uint32_t nfiles_ = 1;
  bool committed_ = false;
  std::vector<File> files_;      // memory.bin, memory.1.bin, ... as opened; grown under mu_
  std::vector<uint64_t> ends_;   // each file's end so far, guarded by mu_
  std::vector<pb::BlobRef> refs_;  // grown by the caller and chunk crcs set by the writers, both under mu_
  std::vector<std::byte*> all_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::byte*> free_;  // guarded by mu_
  std::deque<std::byte*> lent_;   // guarded by mu_
  std::deque<Job> jobs_;          // guarded by mu_
  std::set<uint32_t> busy_;       // files a writer is writing, guarded by mu_
  bool stop_ = false;             // guarded by mu_
  Status error_;                  // guarded by mu_
  std::vector<std::thread> writers_;
};

// ---------------- memory writer ----------------
class MemoryWriterImpl final : public ImageWriter {
 public:
  MemoryWriterImpl(MemoryImage* img, int threads) : img_(img), pool_(threads > 0 ? threads : default_crc_threads()) {}
  Status begin_blob(uint64_t length, size_t* blob) override;
  StatusOr<std::byte*> chunk(size_t blob, uint64_t off, uint64_t) override { return img_->at(refs_[blob].offset() + off); }
  // 64 MiB: enough for every staging lane of the drainer's copier to hold a piece, and short
  // enough that the job, wanting to write a buffer being drained, waits at most a few ms.
  unsigned chunks_at_once() const override { return 8; }
  Status chunk_filled(size_t blob, uint64_t off, uint64_t n) override {
    pb::BlobRef* ref = &refs_[blob];
    const std::byte* p = img_->at(ref->offset() + off);
    // Each job writes its own element of chunk_crc (sized at begin_blob): no sharing.
    uint32_t* slot = ref->mutable_chunk_crc()->mutable_data() + off / ref->chunk_size();
    pool_.submit([p, n, slot] { *slot = crc32c(p, n); });
    return Status::Ok();
  }
  Status finish_blobs() override {
    pool_.wait();
    return Status::Ok();
  }
  const pb::BlobRef& ref(size_t blob) const override { return refs_[blob]; }
  Status commit(pb::Inventory inv, const pb::ClientImage& client) override;
  void abort() override {
    pool_.wait();
    img_->invalidate();
  }

 private:
  MemoryImage* img_;
  CrcPool pool_;
  std::deque<pb::BlobRef> refs_;  // deque: stable addresses while crc jobs write into them
};

Status MemoryWriterImpl::begin_blob(uint64_t length, size_t* blob) {
  auto off = img_->add_blob(length);
  if (!off.ok()) return off.status();
  *blob = refs_.size();
  refs_.push_back(new_ref(*off, length));
  return Status::Ok();
}

Status MemoryWriterImpl::commit(pb::Inventory inv, const pb::ClientImage& client) {
  pool_.wait();
  POS_RETURN_IF_ERROR(check_text(inv));  // it would fail where it is saved to a directory
  POS_RETURN_IF_ERROR(check_text(client));
  inv.set_format_version(kFormatVersion);
  inv.set_memory_size(img_->memory_size());
  inv.clear_memory_file_sizes();  // one segment space: "memory.bin" alone
  std::string cbytes;
  if (!client.SerializeToString(&cbytes)) return Status::Internal("cannot encode the client records");
  inv.set_client_size(cbytes.size());
  inv.set_client_crc(crc32c(cbytes.data(), cbytes.size()));
  img_->finish_dump(std::move(inv), client);
  return Status::Ok();
}

}  // namespace

uint32_t DirWriterOptions::files() const {
  const uint32_t n = memory_files != 0 ? memory_files : static_cast<uint32_t>(std::clamp(default_crc_threads(), 2, 8));
  return std::min<uint32_t>(n, kMaxMemoryFiles);
}

uint32_t DirWriterOptions::staging_chunks() const { return std::max({2u, staging_buffers, 2 * files()}); }

// ---------------- public helpers ----------------
HostAllocator HostAllocator::plain() {
  return HostAllocator{[](uint64_t n) -> void* { return std::aligned_alloc(4096, align_up(std::max<uint64_t>(n, 1), 4096)); },
                       [](void* p) { std::free(p); }};
}

HostAllocator HostAllocator::pageable() {
  constexpr uint64_t kHuge = 2ull << 20;
  return HostAllocator{[](uint64_t n) -> void* {
                         const uint64_t bytes = align_up(std::max<uint64_t>(n, 1), kHuge);
                         void* p = std::aligned_alloc(kHuge, bytes);
                         if (p != nullptr) (void)::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: no THP, no harm
                         return p;
                       },
                       [](void* p) { std::free(p); }};
}

void fault_point(const char* stage) {
  const char* want = std::getenv("POS_FAULT_POINT");  // read each time: tests set it in a child
  if (want == nullptr) return;
  const size_t n = std::strlen(stage);
  if (std::strcmp(want, stage) == 0) {
    std::fprintf(stderr, "pos: fault point %s: killing the process\n", stage);
    std::raise(SIGKILL);
  }
  // "STAGE:stop": stopped there instead (SIGSTOP), so that a test can break something else at
  // exactly that moment (kill posd mid-dump) and then let the process go on (SIGCONT).
  if (std::strncmp(want, stage, n) == 0 && std::strcmp(want + n, ":stop") == 0) {
    std::fprintf(stderr, "pos: fault point %s: stopping the process\n", stage);
    std::raise(SIGSTOP);
  }
}

std::string random_image_id() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                    static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(g()),
                static_cast<unsigned long long>(g()));
  return buf;
}

std::string encode_inventory(const pb::Inventory& inv) {
  std::string payload;
  (void)inv.SerializeToString(&payload);
  std::string out(kMagic, sizeof(kMagic));
  store_u32(&out, inv.format_version());
  store_u32(&out, static_cast<uint32_t>(payload.size()));
  out += payload;
  store_u32(&out, crc32c(out.data(), out.size()));
  return out;
}

StatusOr<pb::Inventory> decode_inventory(const std::string& b) {
  if (b.size() < sizeof(kMagic) + 12 || std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0)
    return Status::Corrupt("not a POS image (bad magic in inventory.pb)");
  const uint32_t version = load_u32(b.data() + 8);
  if (version < kMinFormatVersion || version > kNewestFormatVersion)
    return Status(Code::kUnsupported, 0,
                  "image format version " + std::to_string(version) + " is not supported (this POS reads versions " +
                      std::to_string(kMinFormatVersion) + " to " + std::to_string(kNewestFormatVersion) + ")");
  const uint32_t len = load_u32(b.data() + 12);
  if (b.size() != 16ull + len + 4) return Status::Corrupt("inventory.pb is truncated or has trailing bytes");
  if (crc32c(b.data(), 16 + len) != load_u32(b.data() + 16 + len)) return Status::Corrupt("inventory.pb checksum mismatch");
  pb::Inventory inv;
  if (!inv.ParseFromArray(b.data() + 16, static_cast<int>(len))) return Status::Corrupt("inventory.pb does not decode");
  if (inv.format_version() != version) return Status::Corrupt("inventory.pb versions disagree");
  return inv;
}

Status validate_client(const pb::ClientImage& c, const std::vector<uint64_t>& memory_sizes, bool has_parent) {
  if (!c.has_client()) return Status::Corrupt("client record missing");
  std::unordered_map<uint64_t, const pb::HandleRecord*> seen;
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> blobs;  // file, offset, length
  for (const pb::HandleRecord& h : c.handles()) {
    const std::string who = "handle " + std::to_string(h.id());
    if (h.id() == 0 || seen.count(h.id())) return Status::Corrupt(who + ": missing or duplicate id");
    if (h.type() >= kNumTypes) return Status::Corrupt(who + ": unknown type " + std::to_string(h.type()));
    for (uint64_t p : h.parents())
      if (!seen.count(p)) return Status::Corrupt(who + ": parent " + std::to_string(p) + " is not an earlier record");
    if (h.version() >= c.client().next_pc() || h.created_pc() >= c.client().next_pc())
      return Status::Corrupt(who + ": version past the cut");
    const bool has_bytes = h.type() == kTypeMemory || h.type() == kTypeVar;
    if (has_bytes != h.has_memory()) return Status::Corrupt(who + ": device bytes missing or unexpected");
    if (has_bytes) {
      const pb::BlobRef& r = h.memory();
      if (r.in_peer()) {
        // Held by the source session of a migration: a buffer's, and nothing else said of it.
        if (h.type() != kTypeMemory || r.in_parent() || r.offset() != 0 || r.length() != 0 || r.chunk_size() != 0 ||
            r.chunk_crc_size() != 0 || r.file() != 0 || r.stripes() != 0)
          return Status::Corrupt(who + ": bytes in a peer session, but the record says more (or is a variable)");
      } else if (r.in_parent()) {
        if (!has_parent) return Status::Corrupt(who + ": refers to a parent image, but the image has none");
      } else {
        if (r.length() != h.size()) return Status::Corrupt(who + ": blob length differs from the buffer size");
        if (r.chunk_size() < 4096 || r.chunk_size() > (1u << 30) || (r.chunk_size() & (r.chunk_size() - 1)) != 0)
          return Status::Corrupt(who + ": bad chunk size");
        if (static_cast<uint64_t>(r.chunk_crc_size()) != (r.length() + r.chunk_size() - 1) / r.chunk_size())
          return Status::Corrupt(who + ": checksum count does not match the blob length");
        if (r.stripes() >= 2 && static_cast<uint64_t>(r.file()) + r.stripes() > memory_sizes.size())
          return Status::Corrupt(who + ": striped over " + std::to_string(r.stripes()) + " memory files from file " +
                                 std::to_string(r.file()) + ", which the image does not have");
        if (r.stripes() < 2 && r.file() >= memory_sizes.size())
          return Status::Corrupt(who + ": blob in memory file " + std::to_string(r.file()) + ", which the image does not have");
        if (r.offset() % kBlobAlign != 0) return Status::Corrupt(who + ": blob offset not aligned");
        // Each file's share: one stretch from the blob's offset.
        const uint32_t parts = r.stripes() >= 2 ? r.stripes() : 1;
        for (uint32_t k = 0; k < parts; ++k) {
          const uint32_t file = r.stripes() >= 2 ? r.file() + k : r.file();
          const uint64_t n = stripe_bytes(r, k), memory_size = memory_sizes[file];
          if (r.offset() > memory_size || n > memory_size - r.offset())
            return Status::Corrupt(who + ": blob outside " + image_memory_file(file));
          if (n > 0) blobs.emplace_back(file, r.offset(), n);
        }
      }
    }
    seen[h.id()] = &h;
  }
  std::sort(blobs.begin(), blobs.end());
  for (size_t i = 1; i < blobs.size(); ++i)
    if (std::get<0>(blobs[i]) == std::get<0>(blobs[i - 1]) &&
        std::get<1>(blobs[i]) < std::get<1>(blobs[i - 1]) + std::get<2>(blobs[i - 1]))
      return Status::Corrupt("blobs overlap in a memory file");
  if (static_cast<uint64_t>(c.pending_size()) > kMaxPendingCalls)
    return Status::Corrupt(std::to_string(c.pending_size()) + " pending calls, more than a client can have in flight (" +
                           std::to_string(kMaxPendingCalls) + ")");
  uint64_t min_pc = c.client().next_pc(), total = 0;
  for (const pb::PendingCall& p : c.pending()) {
    POS_RETURN_IF_ERROR(validate_pending_call(p, min_pc));
    for (const std::string& b : p.params()) total += b.size();
    if (total > kMaxPendingBytes)
      return Status::Corrupt("pending calls carry more than " + std::to_string(kMaxPendingBytes) + " parameter bytes");
    min_pc = p.pc() + 1;
  }
  return Status::Ok();
}

Status validate_pending_call(const pb::PendingCall& p, uint64_t min_pc) {
  const std::string who = "pending call pc " + std::to_string(p.pc());
  if (p.pc() < min_pc || p.pc() == UINT64_MAX)
    return Status::Corrupt(who + ": before the cut or out of order (expected pc >= " + std::to_string(min_pc) + ")");
  const ApiInfo* api = find_api(p.api_id());
  if (api == nullptr) return Status::Corrupt(who + ": unknown api id " + std::to_string(p.api_id()));
  // Only a call whose answer the parser produced can be pending: its caller has that answer. A
  // call that waits for the worker is never in an image (its caller is answered at the seal).
  if (api->mode != ReturnMode::kParse)
    return Status::Corrupt(who + ": " + std::string(api->name) + " returns only after it executes; it cannot be pending");
  if (static_cast<uint64_t>(p.params_size()) > kMaxPendingParams)
    return Status::Corrupt(who + " (" + std::string(api->name) + "): " + std::to_string(p.params_size()) +
                           " parameters, more than " + std::to_string(kMaxPendingParams));
  uint64_t bytes = 0;
  for (const std::string& b : p.params()) bytes += b.size();
  if (bytes > kMaxPendingCallBytes)
    return Status::Corrupt(who + " (" + std::string(api->name) + "): " + std::to_string(bytes) +
                           " parameter bytes, more than " + std::to_string(kMaxPendingCallBytes));
  if (p.ret().size() > kMaxPendingRetBytes)
    return Status::Corrupt(who + " (" + std::string(api->name) + "): a " + std::to_string(p.ret().size()) +
                           "-byte answer, more than " + std::to_string(kMaxPendingRetBytes));
  return Status::Ok();
}

// ---------------- MemoryImage ----------------
MemoryImage::~MemoryImage() {
  for (Segment& s : segments_) alloc_.free(s.p);
}

uint64_t MemoryImage::pinned_bytes() const {
  uint64_t n = 0;
  for (const Segment& s : segments_) n += s.capacity;
  return n;
}

void MemoryImage::begin_dump() {
  valid_ = false;
  used_ = 0;
  for (Segment& s : segments_) s.used = false;
}

void MemoryImage::finish_dump(pb::Inventory inventory, pb::ClientImage client) {
  inventory_ = std::move(inventory);
  client_ = std::move(client);
  valid_ = true;
}

StatusOr<uint64_t> MemoryImage::add_blob(uint64_t length) {
  // Best fit among the free segments a previous dump left, else a new one.
  Segment* best = nullptr;
  for (Segment& s : segments_)
    if (!s.used && s.capacity >= length && (best == nullptr || s.capacity < best->capacity)) best = &s;
  if (best == nullptr) {
    const uint64_t cap = align_up(std::max<uint64_t>(length, 1), kBlobAlign);
    void* p = alloc_.alloc(cap);
    if (p == nullptr)
      return Status(Code::kOutOfMemory, 0, "cannot allocate " + std::to_string(cap) + " bytes of host memory for the image");
    segments_.push_back(Segment{static_cast<std::byte*>(p), cap, 0, 0, false});
    best = &segments_.back();
  }
  best->used = true;
  best->offset = used_;
  best->length = length;
  used_ = align_up(used_ + length, kBlobAlign);
  return best->offset;
}

std::byte* MemoryImage::at(uint64_t off) {
  return const_cast<std::byte*>(static_cast<const MemoryImage*>(this)->at(off));
}
const std::byte* MemoryImage::at(uint64_t off) const {
  for (const Segment& s : segments_)
    if (s.used && off >= s.offset && off - s.offset < std::max<uint64_t>(s.length, 1)) return s.p + (off - s.offset);
  return nullptr;
}

Status MemoryImage::save_to_dir(const std::string& dir) const {
  if (!valid_) return Status::FailedPrecondition("the memory image holds no complete checkpoint");
  DirWriterOptions o;
  o.direct_io = false;
  o.memory_files = 1;  // blobs keep their offsets, below
  auto w = open_dir_writer(dir, o);
  if (!w.ok()) return w.status();
  pb::ClientImage client = client_;
  // Blobs keep their offsets: memory.bin has the same layout as the memory image.
  std::vector<const Segment*> order;
  for (const Segment& s : segments_)
    if (s.used) order.push_back(&s);
  std::sort(order.begin(), order.end(), [](const Segment* a, const Segment* b) { return a->offset < b->offset; });
  for (const Segment* s : order) {
    size_t blob = 0;
    POS_RETURN_IF_ERROR((*w)->begin_blob(s->length, &blob));
    if ((*w)->ref(blob).offset() != s->offset) return Status::Internal("memory image layout is not contiguous");
    for (uint64_t off = 0; off < s->length; off += kChunkSize) {
      const uint64_t n = std::min<uint64_t>(kChunkSize, s->length - off);
      auto buf = (*w)->chunk(blob, off, n);
      if (!buf.ok()) return buf.status();
      std::memcpy(*buf, s->p + off, n);
      POS_RETURN_IF_ERROR((*w)->chunk_filled(blob, off, n));
    }
  }
  POS_RETURN_IF_ERROR((*w)->finish_blobs());
  return (*w)->commit(inventory_, client);
}

// ---------------- writers ----------------
StatusOr<std::unique_ptr<ImageWriter>> open_dir_writer(const std::string& dir, const DirWriterOptions& options) {
  if (dir.empty()) return Status::InvalidArgument("no image directory given");
  fs::path d = fs::path(dir).lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  std::error_code ec;
  if (fs::exists(d, ec) && !options.replace)
    return Status::FailedPrecondition(d.string() + " already exists (choose a new directory, or replace it)");
  fs::path partial = d;
  partial += ".partial";
  auto w = std::make_unique<DirWriter>(d, partial, options);
  POS_RETURN_IF_ERROR(w->open());
  return std::unique_ptr<ImageWriter>(std::move(w));
}

StatusOr<std::unique_ptr<ImageWriter>> open_memory_writer(MemoryImage* image, int crc_threads) {
  if (image == nullptr) return Status::InvalidArgument("no memory image");
  image->begin_dump();
  return std::unique_ptr<ImageWriter>(std::make_unique<MemoryWriterImpl>(image, crc_threads));
}

// ---------------- reader ----------------
ImageReader::~ImageReader() {
  for (int fd : memory_fds_) ::close(fd);
}

StatusOr<std::unique_ptr<ImageReader>> ImageReader::open_dir(const std::string& dir) { return open_dir_at(dir, 0); }

StatusOr<std::unique_ptr<ImageReader>> ImageReader::open_dir_at(const std::string& dir, int depth) {
  if (depth > kMaxParentDepth) return Status::Corrupt("parent chain longer than " + std::to_string(kMaxParentDepth));
  const fs::path d(dir);
  // The directory itself may be a symbolic link (an operator's `latest`); the files in it may not.
  struct stat dst {};
  if (::stat(d.c_str(), &dst) != 0) return Status::NotFound(dir + ": " + std::strerror(errno));
  if (!S_ISDIR(dst.st_mode)) return Status::NotFound(dir + " is " + kind_of(dst.st_mode) + ", not an image directory");
  std::unique_ptr<ImageReader> r(new ImageReader());
  r->dir_ = dir;
  auto inv_bytes = read_file(d / "inventory.pb", 1 << 20);
  if (!inv_bytes.ok()) return inv_bytes.status();
  auto inv = decode_inventory(*inv_bytes);
  if (!inv.ok()) return inv.status().with_context(dir);
  r->inventory_ = std::move(*inv);
  if (r->inventory_.client_size() > kMaxRecordBytes) return Status::Corrupt(dir + ": client.pb size out of range");
  auto cbytes = read_file(d / "client.pb", kMaxRecordBytes);
  if (!cbytes.ok()) return cbytes.status();
  if (cbytes->size() != r->inventory_.client_size()) return Status::Corrupt(dir + ": client.pb is truncated or was replaced");
  if (crc32c(cbytes->data(), cbytes->size()) != r->inventory_.client_crc())
    return Status::Corrupt(dir + ": client.pb checksum mismatch");
  if (!r->client_.ParseFromString(*cbytes)) return Status::Corrupt(dir + ": client.pb does not decode");
  const auto& extra = r->inventory_.memory_file_sizes();
  if (!extra.empty() && r->inventory_.format_version() < 3)
    return Status::Corrupt(dir + ": a format version " + std::to_string(r->inventory_.format_version()) +
                           " image has memory.bin alone");
  if (static_cast<uint64_t>(extra.size()) >= kMaxMemoryFiles)
    return Status::Corrupt(dir + ": " + std::to_string(extra.size() + 1) + " memory files, more than " +
                           std::to_string(kMaxMemoryFiles));
  for (int i = 0; i <= extra.size(); ++i) {
    const std::string name = image_memory_file(static_cast<uint32_t>(i));
    const uint64_t want = i == 0 ? r->inventory_.memory_size() : extra[i - 1];
    struct stat st {};
    auto mfd = open_regular(d / name, &st);
    if (!mfd.ok()) return mfd.status();
    r->memory_fds_.push_back(mfd->release());
    if (static_cast<uint64_t>(st.st_size) < want)
      return Status::Corrupt(dir + ": " + name + " is truncated (" + std::to_string(st.st_size) + " of " +
                             std::to_string(want) + " bytes)");
  }
  POS_RETURN_IF_ERROR(r->validate(depth));
  return r;
}

StatusOr<std::unique_ptr<ImageReader>> ImageReader::open_memory(const MemoryImage* image) {
  if (image == nullptr || !image->valid()) return Status::FailedPrecondition("the memory image holds no complete checkpoint");
  std::unique_ptr<ImageReader> r(new ImageReader());
  r->mem_ = image;
  r->inventory_ = image->inventory();
  r->client_ = image->client();
  if (r->inventory_.has_parent()) return Status::Unsupported("incremental memory images are not supported");
  POS_RETURN_IF_ERROR(r->validate(0));
  return r;
}

Status ImageReader::validate(int depth) {
  const std::string where = dir_.empty() ? std::string("memory image") : dir_;
  if (inventory_.cut_pc() == 0 || inventory_.cut_pc() != client_.client().next_pc())
    return Status::Corrupt(where + ": the inventory's cut and the client record disagree");
  if (inventory_.format_version() < 2 && client_.pending_size() > 0)
    return Status::Corrupt(where + ": a format version " + std::to_string(inventory_.format_version()) +
                           " image cannot hold pending calls");
  std::vector<uint64_t> sizes{inventory_.memory_size()};
  for (uint64_t n : inventory_.memory_file_sizes()) sizes.push_back(n);
  Status s = validate_client(client_, sizes, inventory_.has_parent());
  if (!s.ok()) return s.with_context(where);
  if (inventory_.format_version() < 4)
    for (const pb::HandleRecord& h : client_.handles())
      if (h.has_memory() && h.memory().stripes() >= 2 && h.memory().file() != 0)
        return Status::Corrupt(where + ": handle " + std::to_string(h.id()) + ": a format version " +
                               std::to_string(inventory_.format_version()) + " image stripes blobs from memory.bin only");
  if (inventory_.has_parent()) {
    if (dir_.empty()) return Status::Unsupported("incremental memory images are not supported");
    // Resolved by the kernel, not lexically: ".." after a symbolic link (an operator's `latest`,
    // or /proc/self/fd/N, the directory a posd session was handed) is the link target's parent.
    const fs::path pp = fs::path(dir_) / inventory_.parent().path();
    auto p = open_dir_at(pp.string(), depth + 1);
    if (!p.ok()) return p.status().with_context(where + ": parent image");
    if ((*p)->inventory().image_id() != inventory_.parent().image_id())
      return Status::Corrupt(where + ": parent " + pp.string() + " is image " + (*p)->inventory().image_id() +
                             ", not the expected " + inventory_.parent().image_id());
    if ((*p)->inventory().cut_pc() != inventory_.parent().cut_pc() || (*p)->inventory().cut_pc() > inventory_.cut_pc())
      return Status::Corrupt(where + ": parent cut does not precede this image");
    parent_ = std::move(*p);
    // Every reference into the chain must resolve to a buffer of the same address and size.
    for (const pb::HandleRecord& h : client_.handles()) {
      if (!h.has_memory() || !h.memory().in_parent()) continue;
      auto res = resolve(h);
      if (!res.ok()) return res.status().with_context(where);
    }
  }
  return Status::Ok();
}

StatusOr<std::pair<const ImageReader*, const pb::BlobRef*>> ImageReader::resolve(const pb::HandleRecord& h) const {
  const ImageReader* img = this;
  const pb::HandleRecord* rec = &h;
  for (int depth = 0; depth <= kMaxParentDepth; ++depth) {
    if (rec->memory().in_peer())
      return Status::FailedPrecondition("handle " + std::to_string(h.id()) +
                                        ": its bytes were handed over by a peer session (a migration's scratch image), "
                                        "not stored in the image");
    if (!rec->memory().in_parent()) return std::make_pair(img, &rec->memory());
    img = img->parent_.get();
    if (img == nullptr) return Status::Corrupt("handle " + std::to_string(h.id()) + ": no parent image holds its bytes");
    const pb::HandleRecord* next = nullptr;
    for (const pb::HandleRecord& c : img->client_.handles())
      if (c.id() == h.id()) next = &c;
    if (next == nullptr || next->addr() != h.addr() || next->size() != h.size() || !next->has_memory())
      return Status::Corrupt("handle " + std::to_string(h.id()) + ": the parent image has no matching buffer");
    rec = next;
  }
  return Status::Corrupt("parent chain too long");
}

Status ImageReader::verify_chunk(const pb::BlobRef& ref, uint64_t off, uint64_t n, const std::byte* data) const {
  const uint64_t idx = off / ref.chunk_size();
  if (off % ref.chunk_size() != 0 || idx >= static_cast<uint64_t>(ref.chunk_crc_size()) ||
      n != std::min<uint64_t>(ref.chunk_size(), ref.length() - off))
    return Status::InvalidArgument("chunk request outside the blob");
  if (crc32c(data, n) != ref.chunk_crc(static_cast<int>(idx))) {
    const BlobChunkAt at = blob_chunk_at(ref, idx);
    return Status::Corrupt((dir_.empty() ? std::string("memory image") : dir_) + ": checksum mismatch in " +
                           image_memory_file(at.file) +
                           " at offset " + std::to_string(at.offset));
  }
  return Status::Ok();
}

const std::byte* ImageReader::direct(const pb::BlobRef& ref, uint64_t off) const {
  return mem_ != nullptr ? mem_->at(ref.offset() + off) : nullptr;
}

Status ImageReader::read_chunk(const pb::BlobRef& ref, uint64_t off, uint64_t n, std::byte* dst) const {
  if (mem_ != nullptr) {
    const std::byte* p = mem_->at(ref.offset() + off);
    if (p == nullptr) return Status::Corrupt("memory image: blob missing");
    std::memcpy(dst, p, n);
  } else {
    if (off > ref.length() || n > ref.length() - off) return Status::InvalidArgument("read past the blob");
    if (off % ref.chunk_size() != 0 || n > ref.chunk_size()) return Status::InvalidArgument("chunk request outside the blob");
    const BlobChunkAt at = blob_chunk_at(ref, off / ref.chunk_size());
    if (at.file >= memory_fds_.size()) return Status::Corrupt(dir_ + ": blob in a memory file the image does not have");
    POS_RETURN_IF_ERROR(read_all(memory_fds_[at.file], dst, n, at.offset,
                                 dir_ + "/" + image_memory_file(at.file)));
  }
  return verify_chunk(ref, off, n, dst);
}

}  // namespace pos::ckpt
