// image_rebase.cc — an incremental image made whole by pointing its records at the bytes its
// chain stored, the ancestors' memory files hard-linked in (docs/image_format.md, version 4).
#include "ckpt/image_rebase.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "ckpt/crc32c.h"
#include "ckpt/image.h"

namespace pos::ckpt {
namespace {

namespace fs = std::filesystem;

Status errno_status(const std::string& what) { return Status::Unavailable(what + ": " + std::strerror(errno)); }

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

Status write_all_at(int fd, const void* p, uint64_t n, uint64_t off, const std::string& what) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, c, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return errno_status("writing " + what);
    c += w, n -= static_cast<uint64_t>(w), off += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status write_new_file(const std::string& path, const std::string& bytes) {
  FdCloser fd{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (fd.fd < 0) return errno_status("cannot create " + path);
  POS_RETURN_IF_ERROR(write_all_at(fd.fd, bytes.data(), bytes.size(), 0, path));
  if (::fsync(fd.fd) != 0) return errno_status("cannot sync " + path);
  return Status::Ok();
}

// The memory files a blob lies in, by index (a striped one: S consecutive files from `file`).
std::vector<uint32_t> files_of(const pb::BlobRef& ref) {
  if (ref.stripes() < 2) return {ref.file()};
  std::vector<uint32_t> out;
  for (uint32_t k = 0; k < ref.stripes(); ++k) out.push_back(ref.file() + k);
  return out;
}

uint64_t declared_size(const pb::Inventory& inv, uint32_t k) {
  return k == 0 ? inv.memory_size() : inv.memory_file_sizes(static_cast<int>(k - 1));
}

// Removes a directory being built unless told it is done.
struct Scratch {
  std::string dir;
  bool keep = false;
  ~Scratch() {
    if (keep) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

StatusOr<WholeImageReport> write_whole_image(const std::string& dir, const std::string& out_dir) {
  auto opened = ImageReader::open_dir(dir);
  if (!opened.ok()) return opened.status();
  const ImageReader& img = **opened;
  const pb::Inventory& inv = img.inventory();
  const uint32_t own_files = 1 + static_cast<uint32_t>(inv.memory_file_sizes_size());

  // The chain, nearest first: an ancestor is known by its depth (a stable order for the files).
  std::vector<const ImageReader*> chain;
  for (const ImageReader* p = img.parent(); p != nullptr; p = p->parent()) chain.push_back(p);
  auto depth_of = [&](const ImageReader* p) {
    return static_cast<size_t>(std::find(chain.begin(), chain.end(), p) - chain.begin());
  };
  // Every record whose bytes an ancestor stored, and the ancestors' files they lie in.
  struct Far {
    int handle;
    size_t depth;
    const pb::BlobRef* ref;
  };
  std::vector<Far> far;
  std::map<std::pair<size_t, uint32_t>, uint32_t> new_index;  // (depth, its file) -> file here
  for (int i = 0; i < img.client().handles_size(); ++i) {
    const pb::HandleRecord& h = img.client().handles(i);
    if (!h.has_memory() || !h.memory().in_parent()) continue;
    auto res = img.resolve(h);
    if (!res.ok()) return res.status().with_context(dir);
    const size_t depth = depth_of(res->first);
    if (depth >= chain.size()) return Status::Internal(dir + ": a parent's bytes resolved outside its chain");
    far.push_back({i, depth, res->second});
    for (uint32_t f : files_of(*res->second)) new_index[{depth, f}] = 0;
  }
  // In (depth, file) order, so a striped blob's consecutive files stay consecutive here.
  uint32_t next = own_files;
  for (auto& [key, index] : new_index) index = next++;
  const bool link_ancestors = next <= kMaxMemoryFiles;
  if (!link_ancestors && own_files + 1 > kMaxMemoryFiles)
    return Status::Unsupported(dir + ": the image already has " + std::to_string(own_files) +
                               " memory files, and its parents' bytes need one more");

  if (::mkdir(out_dir.c_str(), 0700) != 0) return errno_status("cannot make " + out_dir);
  Scratch scratch{out_dir};
  for (uint32_t k = 0; k < own_files; ++k) {
    const std::string from = dir + "/" + image_memory_file(k), to = out_dir + "/" + image_memory_file(k);
    if (::link(from.c_str(), to.c_str()) != 0) return errno_status("cannot link " + from + " to " + to);
  }
  std::vector<uint64_t> sizes{inv.memory_size()};
  for (uint64_t n : inv.memory_file_sizes()) sizes.push_back(n);
  pb::ClientImage client = img.client();
  WholeImageReport rep;
  bool striped_elsewhere = false;  // a striped blob from a file other than memory.bin: version 4
  if (link_ancestors) {
    for (const auto& [key, index] : new_index) {
      const ImageReader* a = chain[key.first];
      const std::string from = a->dir() + "/" + image_memory_file(key.second), to = out_dir + "/" + image_memory_file(index);
      if (::link(from.c_str(), to.c_str()) != 0) return errno_status("cannot link " + from + " to " + to);
      sizes.push_back(declared_size(a->inventory(), key.second));
      ++rep.files_linked;
    }
    for (const Far& f : far) {
      pb::BlobRef ref = *f.ref;
      ref.set_file(new_index.at({f.depth, f.ref->file()}));
      striped_elsewhere |= ref.stripes() >= 2;
      *client.mutable_handles(f.handle)->mutable_memory() = ref;
    }
  } else {
    // Too many files to link: the ancestors' bytes copied into one, each chunk verified as read.
    const std::string path = out_dir + "/" + image_memory_file(own_files);
    FdCloser fd{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)};
    if (fd.fd < 0) return errno_status("cannot create " + path);
    std::vector<std::byte> buf;
    uint64_t at = 0;
    for (const Far& f : far) {
      const pb::BlobRef& src = *f.ref;
      const uint64_t cs = src.chunk_size();
      if (buf.size() < cs) buf.resize(cs);
      for (uint64_t off = 0; off < src.length(); off += cs) {
        const uint64_t n = std::min<uint64_t>(cs, src.length() - off);
        POS_RETURN_IF_ERROR(chain[f.depth]->read_chunk(src, off, n, buf.data()));
        // Zeros stay a hole, as the writers leave them.
        if (std::all_of(buf.data(), buf.data() + n, [](std::byte b) { return b == std::byte{0}; })) continue;
        POS_RETURN_IF_ERROR(write_all_at(fd.fd, buf.data(), n, at + off, path));
      }
      pb::BlobRef ref = src;
      ref.set_file(own_files);
      ref.set_stripes(0);
      ref.set_offset(at);
      *client.mutable_handles(f.handle)->mutable_memory() = ref;
      rep.bytes_copied += src.length();
      at = align_up(at + src.length(), 4096);
    }
    if (::ftruncate(fd.fd, static_cast<off_t>(at)) != 0 || ::fsync(fd.fd) != 0) return errno_status("cannot finish " + path);
    sizes.push_back(at);
  }
  for (const Far& f : far) {
    ++rep.blobs_from_ancestors;
    rep.bytes_from_ancestors += f.ref->length();
  }
  for (const pb::HandleRecord& h : client.handles())
    if (h.has_memory() && !h.memory().in_peer()) rep.blob_bytes += h.memory().length();

  std::string cbytes;
  if (!client.SerializeToString(&cbytes)) return Status::Internal("cannot encode the client records");
  pb::Inventory whole = inv;
  whole.clear_parent();
  whole.clear_features();
  for (const std::string& f : inv.features())
    if (f != "incremental") whole.add_features(f);
  whole.clear_memory_file_sizes();
  for (size_t k = 1; k < sizes.size(); ++k) whole.add_memory_file_sizes(sizes[k]);
  whole.set_blob_bytes(rep.blob_bytes);
  whole.set_client_size(cbytes.size());
  whole.set_client_crc(crc32c(cbytes.data(), cbytes.size()));
  uint32_t version = std::max<uint32_t>(inv.format_version(), sizes.size() > 1 ? 3 : 1);
  if (striped_elsewhere) version = 4;
  whole.set_format_version(version);
  POS_RETURN_IF_ERROR(write_new_file(out_dir + "/client.pb", cbytes));
  POS_RETURN_IF_ERROR(write_new_file(out_dir + "/inventory.pb", encode_inventory(whole)));
  POS_RETURN_IF_ERROR(sync_directory(out_dir));
  // What a restore will check, checked now: a bug here must cost the rebase, not a restore point.
  auto check = ImageReader::open_dir(out_dir);
  if (!check.ok()) return Status::Internal("the whole image of " + dir + " does not read back: " + check.status().message());
  if ((*check)->inventory().image_id() != inv.image_id() || (*check)->parent() != nullptr)
    return Status::Internal("the whole image of " + dir + " is not the same image");
  scratch.keep = true;
  return rep;
}

StatusOr<uint64_t> punch_unreferenced(const std::string& dir, uint64_t piece, uint32_t pause_us) {
  if (piece == 0) piece = UINT64_MAX;
  auto opened = ImageReader::open_dir(dir);
  if (!opened.ok()) return opened.status();
  const ImageReader& img = **opened;
  const uint32_t files = 1 + static_cast<uint32_t>(img.inventory().memory_file_sizes_size());
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> used(files);  // per file: (offset, length)
  for (const pb::HandleRecord& h : img.client().handles()) {
    if (!h.has_memory() || h.memory().in_parent() || h.memory().in_peer()) continue;
    const pb::BlobRef& ref = h.memory();
    const uint64_t cs = ref.chunk_size();
    for (uint64_t idx = 0; idx * cs < ref.length(); ++idx) {
      const BlobChunkAt at = blob_chunk_at(ref, idx);
      if (at.file < files) used[at.file].emplace_back(at.offset, std::min<uint64_t>(cs, ref.length() - idx * cs));
    }
  }
  uint64_t punched = 0;
  for (uint32_t k = 0; k < files; ++k) {
    const std::string path = dir + "/" + image_memory_file(k);
    FdCloser fd{::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW)};
    if (fd.fd < 0) return errno_status("cannot open " + path);
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) return errno_status("cannot stat " + path);
    if (st.st_nlink != 1) continue;  // another entry links it: its bytes may be someone's
    auto& ranges = used[k];
    std::sort(ranges.begin(), ranges.end());
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    uint64_t pos = 0;
    auto punch = [&](uint64_t from, uint64_t to) -> Status {
      from = align_up(from, 4096);
      if (to <= from) return Status::Ok();
      // In pieces, a pause between them: freeing gigabytes in one call holds the file system's
      // and the allocator's locks for that long (docs/continuous_checkpointing.md).
      for (uint64_t at = from; at < to;) {
        const uint64_t n = std::min<uint64_t>(piece, to - at);
        if (::fallocate(fd.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(at), static_cast<off_t>(n)) != 0) {
          if (errno == EOPNOTSUPP) return Status::Unsupported("no hole punching");
          return errno_status("cannot free unused bytes of " + path);
        }
        at += n;
        if (at < to && pause_us > 0) ::usleep(static_cast<useconds_t>(pause_us));
      }
      return Status::Ok();
    };
    Status st_punch = Status::Ok();
    for (const auto& [off, len] : ranges) {
      if (off > pos) st_punch = punch(pos, off);
      if (!st_punch.ok()) break;
      pos = std::max(pos, off + len);
    }
    if (st_punch.ok() && pos < size) st_punch = punch(pos, size);
    // What the holes freed (ranges punched before, in an earlier rebase, free nothing again).
    struct stat after {};
    if (::fstat(fd.fd, &after) == 0 && after.st_blocks < st.st_blocks)
      punched += static_cast<uint64_t>(st.st_blocks - after.st_blocks) * 512;
    if (st_punch.code() == Code::kUnsupported) return punched;  // this file system keeps them
    POS_RETURN_IF_ERROR(st_punch);
  }
  return punched;
}

}  // namespace pos::ckpt
