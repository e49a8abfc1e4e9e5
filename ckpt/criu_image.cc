// criu_image.cc — CRIU's image files read by hand: a magic header, then records of a 32-bit length
// and a protobuf message. Only the few fields inspect shows are decoded; CRIU's own docs
// (images/*.proto, criu/include/magic.h) give the numbers. Nothing here trusts a length.
#include "ckpt/criu_image.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string_view>

#include "ckpt/region_table.h"
#include "pos/base/text.h"

namespace pos::ckpt {
namespace {

constexpr uint32_t kCommonMagic = 0x54564319;   // every image but inventory starts with it
constexpr uint32_t kPstreeMagic = 0x50273030;
constexpr uint32_t kCoreMagic = 0x55053847;
constexpr uint32_t kPagemapMagic = 0x56084025;
constexpr uint32_t kPageParent = 1, kPageLazy = 2, kPagePresent = 4;  // pagemap_entry.flags
constexpr size_t kMaxFile = 64u << 20;              // a pagemap of a huge process is a few MiB
constexpr size_t kMaxRecord = 16u << 20;
const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));  // CRIU stores whole pages

Status corrupt(const std::string& file, const std::string& why) {
  return Status::Corrupt("CRIU image " + file + ": " + why);
}

StatusOr<std::string> read_bounded(const std::string& path) {
  auto text = read_bounded_file(path, kMaxFile);
  if (!text.ok() && text.status().code() == Code::kCorrupt)
    return corrupt(path, "larger than " + std::to_string(kMaxFile) + " bytes");
  if (!text.ok() && text.status().code() == Code::kNotFound)
    return Status::NotFound(path + ": " + text.status().message().substr(text.status().message().rfind(": ") + 2));
  return text;
}

// One protobuf field: its number, and its value (varint) or bytes (length-delimited).
struct Field {
  uint32_t number = 0;
  uint32_t wire = 0;
  uint64_t value = 0;
  std::string_view bytes;
};

class Message {
 public:
  explicit Message(std::string_view b) : b_(b) {}
  // False at the end; a malformed field sets *bad.
  bool next(Field* f, bool* bad) {
    if (i_ >= b_.size()) return false;
    uint64_t key = 0;
    if (!varint(&key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return *bad = true, false;
    f->number = static_cast<uint32_t>(key >> 3);
    f->wire = static_cast<uint32_t>(key & 7);
    switch (f->wire) {
      case 0:
        if (!varint(&f->value)) return *bad = true, false;
        return true;
      case 1:
      case 5: {
        const size_t n = f->wire == 1 ? 8 : 4;
        if (b_.size() - i_ < n) return *bad = true, false;
        f->value = 0;
        std::memcpy(&f->value, b_.data() + i_, n);
        i_ += n;
        return true;
      }
      case 2: {
        uint64_t n = 0;
        if (!varint(&n) || n > b_.size() - i_) return *bad = true, false;
        f->bytes = b_.substr(i_, n);
        i_ += n;
        return true;
      }
      default:
        return *bad = true, false;
    }
  }

 private:
  bool varint(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i_ >= b_.size()) return false;
      const uint8_t c = static_cast<uint8_t>(b_[i_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if ((c & 0x80) == 0) {
        *out = v;
        return true;
      }
    }
    return false;
  }
  std::string_view b_;
  size_t i_ = 0;
};

// The records of an image file with the common magic and `magic`.
StatusOr<std::vector<std::string_view>> records(const std::string& name, const std::string& text, uint32_t magic) {
  if (text.size() < 8) return corrupt(name, "shorter than its header");
  uint32_t m[2];
  std::memcpy(m, text.data(), 8);
  if (m[0] != kCommonMagic || m[1] != magic) return corrupt(name, "not the image its name says (wrong magic)");
  std::vector<std::string_view> out;
  for (size_t i = 8; i < text.size();) {
    if (text.size() - i < 4) return corrupt(name, "a record's length is cut off");
    uint32_t n = 0;
    std::memcpy(&n, text.data() + i, 4);
    i += 4;
    if (n > kMaxRecord || n > text.size() - i) return corrupt(name, "a record runs past the end of the file");
    out.emplace_back(text.data() + i, n);
    i += n;
  }
  return out;
}

}  // namespace

StatusOr<CriuImageSummary> read_criu_image(const std::string& dir) {
  CriuImageSummary s;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return Status::NotFound(dir + " is not a directory");
  s.has_parent = ::lstat((dir + "/parent").c_str(), &st) == 0;
  std::vector<std::string> pagemaps;
  std::map<uint64_t, uint64_t> pages_file_bytes;  // pages-N.img → size
  {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Status::Unavailable("cannot list " + dir + ": " + std::strerror(errno));
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      if (::lstat((dir + "/" + n).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      s.bytes += static_cast<uint64_t>(st.st_size);
      if (n.rfind("pagemap-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 4, 4, ".img") == 0) pagemaps.push_back(n);
      if (n.rfind("pages-", 0) == 0 && n.size() > 10 && n.compare(n.size() - 4, 4, ".img") == 0) {
        const std::string id = n.substr(6, n.size() - 10);
        if (id.find_first_not_of("0123456789") == std::string::npos && id.size() < 10)
          pages_file_bytes[std::stoull(id)] = static_cast<uint64_t>(st.st_size);
      }
    }
    ::closedir(d);
  }
  // The process tree (absent in a pre-dump).
  auto pstree = read_bounded(dir + "/pstree.img");
  if (!pstree.ok() && pstree.status().code() != Code::kNotFound) return pstree.status();
  s.pre_dump = !pstree.ok();
  if (pstree.ok()) {
    auto recs = records("pstree.img", *pstree, kPstreeMagic);
    if (!recs.ok()) return recs.status();
    if (recs->empty()) return corrupt("pstree.img", "holds no process");
    for (std::string_view r : *recs) {
      CriuProcess p;
      Message m(r);
      Field f;
      bool bad = false;
      while (m.next(&f, &bad)) {
        if (f.wire == 0 && f.number >= 1 && f.number <= 4) {
          const uint32_t v = static_cast<uint32_t>(f.value);
          (f.number == 1 ? p.pid : f.number == 2 ? p.ppid : f.number == 3 ? p.pgid : p.sid) = v;
        } else if (f.number == 5 && f.wire == 0) {
          ++p.threads;
        } else if (f.number == 5 && f.wire == 2) {  // packed: a run of varints, counted by their last bytes
          for (size_t i = 0; i < f.bytes.size(); ++i)
            if ((static_cast<uint8_t>(f.bytes[i]) & 0x80) == 0) ++p.threads;
        }
      }
      if (bad || p.pid == 0) return corrupt("pstree.img", "a process record is malformed");
      // Its name, from its core image (the first thread's).
      auto core = read_bounded(dir + "/core-" + std::to_string(p.pid) + ".img");
      if (core.ok()) {
        auto cr = records("core-" + std::to_string(p.pid) + ".img", *core, kCoreMagic);
        if (!cr.ok()) return cr.status();
        for (std::string_view c : *cr) {
          Message cm(c);
          Field cf;
          bool cbad = false;
          while (cm.next(&cf, &cbad)) {
            if (cf.number != 3 || cf.wire != 2) continue;  // core_entry.tc
            Message tc(cf.bytes);
            Field tf;
            while (tc.next(&tf, &cbad))
              if (tf.number == 6 && tf.wire == 2) p.comm = printable(tf.bytes, 64);  // task_core_entry.comm
          }
          if (cbad) return corrupt("core-" + std::to_string(p.pid) + ".img", "a record is malformed");
        }
      }
      s.processes.push_back(std::move(p));
    }
  }
  // Pages: each pagemap names its pages file (its head), then runs of pages.
  std::map<uint64_t, uint64_t> pages_in_file;
  for (const std::string& n : pagemaps) {
    auto text = read_bounded(dir + "/" + n);
    if (!text.ok()) return text.status();
    auto recs = records(n, *text, kPagemapMagic);
    if (!recs.ok()) return recs.status();
    if (recs->empty()) return corrupt(n, "has no head");
    ++s.pagemaps;
    uint64_t pages_id = 0;
    bool bad = false;
    {
      Message h((*recs)[0]);
      Field f;
      while (h.next(&f, &bad))
        if (f.number == 1 && f.wire == 0) pages_id = f.value;
    }
    if (bad) return corrupt(n, "its head is malformed");
    for (size_t i = 1; i < recs->size(); ++i) {
      Message m((*recs)[i]);
      Field f;
      uint64_t nr = 0, flags = 0;
      bool in_parent = false;
      while (m.next(&f, &bad)) {
        if (f.wire != 0) continue;
        if (f.number == 2) nr = f.value;
        if (f.number == 3) in_parent = f.value != 0;
        if (f.number == 4) flags = f.value;
      }
      if (bad || nr == 0 || nr > (1ull << 36)) return corrupt(n, "entry " + std::to_string(i) + " is malformed");
      // Older images say in_parent; newer ones flags (PE_PARENT, PE_LAZY, PE_PRESENT: in pages-N.img).
      const bool parent = flags != 0 ? (flags & kPageParent) != 0 : in_parent;
      const bool present = flags != 0 ? (flags & kPagePresent) != 0 : !in_parent;
      if (parent) s.pages_in_parent += nr;
      if ((flags & kPageLazy) != 0) s.pages_lazy += nr;
      if (present) {
        s.pages_stored += nr;
        pages_in_file[pages_id] += nr;
      }
    }
  }
  // Every pages file holds exactly what its pagemaps say: a truncated or padded one is caught here.
  for (const auto& [id, pages] : pages_in_file) {
    auto it = pages_file_bytes.find(id);
    const uint64_t have = it == pages_file_bytes.end() ? 0 : it->second;
    if (have != pages * kPage)
      return corrupt("pages-" + std::to_string(id) + ".img",
                     "holds " + std::to_string(have) + " bytes, but its pagemaps name " + std::to_string(pages) +
                         " pages (" + std::to_string(pages * kPage) + " bytes)");
  }
  return s;
}

uint64_t criu_page_size() { return kPage; }

uint64_t CriuPagemap::present_pages() const {
  uint64_t n = 0;
  for (const Run& r : runs)
    if ((r.flags & kCriuPagePresent) != 0) n += r.pages;
  return n;
}

StatusOr<CriuPagemap> read_criu_pagemap(const std::string& path) {
  const std::string name = path.substr(path.rfind('/') + 1);
  auto text = read_bounded(path);
  if (!text.ok()) return text.status();
  auto recs = records(name, *text, kPagemapMagic);
  if (!recs.ok()) return recs.status();
  if (recs->empty()) return corrupt(name, "has no head");
  CriuPagemap pm;
  bool bad = false;
  {
    Message h((*recs)[0]);
    Field f;
    while (h.next(&f, &bad))
      if (f.number == 1 && f.wire == 0) pm.pages_id = f.value;
  }
  if (bad || pm.pages_id > 0xffffffffull) return corrupt(name, "its head is malformed");
  pm.runs.reserve(recs->size() - 1);
  uint64_t end = 0;
  for (size_t i = 1; i < recs->size(); ++i) {
    Message m((*recs)[i]);
    Field f;
    CriuPagemap::Run r;
    bool in_parent = false, has_flags = false;
    while (m.next(&f, &bad)) {
      if (f.wire != 0) continue;
      if (f.number == 1) r.vaddr = f.value;
      if (f.number == 2) r.pages = f.value;
      if (f.number == 3) in_parent = f.value != 0;
      if (f.number == 4) r.flags = static_cast<uint32_t>(f.value), has_flags = true;
    }
    if (bad || r.pages == 0 || r.pages > (1ull << 36) || r.vaddr % kPage != 0 || r.vaddr > (1ull << 57) ||
        r.flags > (kCriuPageParent | kCriuPageLazy | kCriuPagePresent))
      return corrupt(name, "entry " + std::to_string(i) + " is malformed");
    // Older images say in_parent; newer ones flags (as CRIU's reader takes them).
    if (in_parent) r.flags |= kCriuPageParent;
    else if (!has_flags) r.flags = kCriuPagePresent;
    if (r.vaddr < end) return corrupt(name, "entry " + std::to_string(i) + " is out of address order or overlaps the one before");
    end = r.vaddr + r.pages * kPage;
    pm.runs.push_back(r);
  }
  return pm;
}

Status write_criu_pagemap(const std::string& path, const CriuPagemap& pm) {
  std::string out;
  auto u32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto varint = [](std::string* s, uint64_t v) {
    do {
      const uint8_t c = static_cast<uint8_t>((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      s->push_back(static_cast<char>(c));
      v >>= 7;
    } while (v != 0);
  };
  auto field = [&](std::string* s, uint32_t number, uint64_t v) {
    varint(s, static_cast<uint64_t>(number) << 3);  // wire type 0: a varint
    varint(s, v);
  };
  auto record = [&](const std::string& body) {
    u32(static_cast<uint32_t>(body.size()));
    out += body;
  };
  u32(kCommonMagic);
  u32(kPagemapMagic);
  std::string b;
  field(&b, 1, pm.pages_id);  // pagemap_head.pages_id
  record(b);
  for (const CriuPagemap::Run& r : pm.runs) {
    b.clear();
    field(&b, 1, r.vaddr);  // pagemap_entry.vaddr, nr_pages, flags
    field(&b, 2, r.pages);
    field(&b, 4, r.flags);
    record(b);
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::Unavailable("cannot create " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  const bool ok = done == out.size() && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Status::Unavailable("cannot write " + path + ": " + std::strerror(err));
  return Status::Ok();
}

}  // namespace pos::ckpt
