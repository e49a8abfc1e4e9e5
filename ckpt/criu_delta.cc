// criu_delta.cc — a whole CRIU dump turned into CRIU's incremental format by comparing its pages
// with a parent image's, and a live process's memory written as such a parent (CPU pre-copy).
// Reads CRIU's pagemaps through criu_image.h; CRIU's pagemap.c is the reader this must satisfy.
#include "ckpt/criu_delta.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "ckpt/criu_image.h"
#include "ckpt/image.h"
#include "ckpt/region_table.h"

namespace pos::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxDepth = 64;  // parents followed, as for POS's own images

Status errno_status(const std::string& what) { return Status::Unavailable(what + ": " + std::strerror(errno)); }

// A whole file mapped read-only, of the size its pagemap says.
class Mapped {
 public:
  Mapped() = default;
  Mapped(Mapped&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  Mapped& operator=(Mapped&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  ~Mapped() {
    if (p_ != nullptr) ::munmap(p_, n_);
  }
  static StatusOr<Mapped> open(const std::string& path, uint64_t size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return errno_status("cannot open " + path);
    struct stat st {};
    Mapped m;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size) {
      ::close(fd);
      return Status::Corrupt("CRIU image " + path + " holds " + std::to_string(st.st_size) + " bytes, but its pagemap names " +
                             std::to_string(size));
    }
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return errno_status("cannot map " + path);
      }
      m.p_ = p, m.n_ = size;
    }
    ::close(fd);
    return m;
  }
  const std::byte* data() const { return static_cast<const std::byte*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

std::string pages_path(const std::string& dir, uint64_t id) { return dir + "/pages-" + std::to_string(id) + ".img"; }

// One image of a chain: its pagemap, where each present run starts in its pages file, the file.
struct Level {
  CriuPagemap pm;
  std::vector<uint64_t> offset;
  Mapped pages;
};

// A parent image and its ancestors, for one pagemap name: the bytes they hold at an address.
class ParentChain {
 public:
  Status open(const std::string& parent_dir, const std::string& name) {
    const uint64_t page = criu_page_size();
    std::string dir = parent_dir;
    for (int depth = 0; depth < kMaxDepth; ++depth) {
      struct stat st {};
      if (::stat((dir + "/" + name).c_str(), &st) != 0) break;  // this level has no such pagemap
      auto pm = read_criu_pagemap(dir + "/" + name);
      if (!pm.ok()) return pm.status();
      Level l;
      l.pm = std::move(*pm);
      uint64_t at = 0;
      for (const CriuPagemap::Run& r : l.pm.runs) {
        l.offset.push_back(at);
        if ((r.flags & kCriuPagePresent) != 0) at += r.pages * page;
      }
      auto mapped = Mapped::open(pages_path(dir, l.pm.pages_id), at);
      if (!mapped.ok()) return mapped.status();
      l.pages = std::move(*mapped);
      levels_.push_back(std::move(l));
      if (::lstat((dir + "/parent").c_str(), &st) != 0) break;
      dir += "/parent";
    }
    return Status::Ok();
  }
  bool empty() const { return levels_.empty(); }
  // The page at `vaddr`, or null where no level holds it; *flags: those of the run holding it.
  const std::byte* find(uint64_t vaddr, uint32_t* flags = nullptr) const {
    const uint64_t page = criu_page_size();
    for (const Level& l : levels_) {
      const auto& runs = l.pm.runs;
      auto it = std::upper_bound(runs.begin(), runs.end(), vaddr,
                                 [](uint64_t v, const CriuPagemap::Run& r) { return v < r.vaddr; });
      if (it == runs.begin()) return nullptr;
      --it;
      if (vaddr >= it->vaddr + it->pages * page) return nullptr;
      if ((it->flags & kCriuPagePresent) != 0) {
        if (flags != nullptr) *flags = it->flags;
        return l.pages.data() + l.offset[static_cast<size_t>(it - runs.begin())] + (vaddr - it->vaddr);
      }
      if ((it->flags & kCriuPageParent) == 0) return nullptr;  // lazy: not here
    }
    return nullptr;
  }

 private:
  std::vector<Level> levels_;
};

Status write_all(int fd, const std::byte* p, uint64_t n, const std::string& what) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<uint64_t>(n, 1u << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return errno_status("writing " + what);
    p += w, n -= static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

// A pages id no file of `dir` uses: the rewritten pagemap names a new pages file, so that switching
// to it is one rename (the pagemap's), and the old pair stays whole until then.
uint64_t unused_pages_id(const std::string& dir) {
  for (uint64_t id = 100000;; ++id) {
    struct stat st {};
    if (::lstat(pages_path(dir, id).c_str(), &st) != 0) return id;
  }
}

// One pagemap of `dir` against its namesake in the parent chain; adds to *rep.
Status delta_one(const std::string& dir, const std::string& name, const std::string& parent_dir, unsigned threads,
                 const std::string& link, bool* linked, CriuDeltaReport* rep) {
  const uint64_t page = criu_page_size();
  auto pm = read_criu_pagemap(dir + "/" + name);
  if (!pm.ok()) return pm.status();
  // A whole dump: every run present (CRIU also marks private anonymous ones PE_LAZY: they could be
  // restored lazily, and are kept so). Parent runs: CRIU made it incremental itself.
  for (const CriuPagemap::Run& r : pm->runs)
    if ((r.flags & kCriuPagePresent) == 0 || (r.flags & kCriuPageParent) != 0) return Status::Ok();
  const uint64_t total = pm->present_pages();
  rep->pages += total;
  if (total == 0) return Status::Ok();
  ParentChain chain;
  POS_RETURN_IF_ERROR(chain.open(parent_dir, name));
  if (chain.empty()) return Status::Ok();
  auto mine = Mapped::open(pages_path(dir, pm->pages_id), total * page);
  if (!mine.ok()) return mine.status();
  // Which pages equal the parent's: side by side over ranges of pages.
  std::vector<uint64_t> first(pm->runs.size());  // each run's first page index
  for (size_t i = 1; i < pm->runs.size(); ++i) first[i] = first[i - 1] + pm->runs[i - 1].pages;
  std::vector<uint8_t> same(total, 0);
  const unsigned n = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>((total + 255) / 256)));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n; ++t)
    pool.emplace_back([&, t] {
      const uint64_t a = total * t / n, b = total * (t + 1) / n;
      size_t run = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), a) - first.begin() - 1);
      for (uint64_t i = a; i < b; ++i) {
        while (run + 1 < first.size() && first[run + 1] <= i) ++run;
        const uint64_t vaddr = pm->runs[run].vaddr + (i - first[run]) * page;
        const std::byte* p = chain.find(vaddr);
        same[i] = p != nullptr && std::memcmp(p, mine->data() + i * page, page) == 0;
      }
    });
  for (std::thread& th : pool) th.join();
  const uint64_t equal = static_cast<uint64_t>(std::count(same.begin(), same.end(), 1));
  if (equal == 0) return Status::Ok();
  // The new pair: the unequal pages in a new pages file, runs split where equality changes.
  CriuPagemap out;
  out.pages_id = unused_pages_id(dir);
  const std::string new_pages = pages_path(dir, out.pages_id), new_map = dir + "/." + name + ".new";
  const int fd = ::open(new_pages.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno_status("cannot create " + new_pages);
  auto drop = [&](Status why) {
    ::close(fd);
    (void)::unlink(new_pages.c_str());
    (void)::unlink(new_map.c_str());
    return why;
  };
  for (size_t r = 0; r < pm->runs.size(); ++r) {
    const CriuPagemap::Run& run = pm->runs[r];
    for (uint64_t k = 0; k < run.pages;) {
      const bool eq = same[first[r] + k] != 0;
      uint64_t e = k + 1;
      while (e < run.pages && (same[first[r] + e] != 0) == eq) ++e;
      out.runs.push_back({run.vaddr + k * page, e - k, eq ? kCriuPageParent : run.flags});
      if (!eq) {
        Status w = write_all(fd, mine->data() + (first[r] + k) * page, (e - k) * page, new_pages);
        if (!w.ok()) return drop(w);
      }
      k = e;
    }
  }
  if (::fsync(fd) != 0) return drop(errno_status("cannot sync " + new_pages));
  if (Status w = write_criu_pagemap(new_map, out); !w.ok()) return drop(w);
  ::close(fd);
  if (!*linked) {
    if (::symlink(link.c_str(), (dir + "/parent").c_str()) != 0) {
      (void)::unlink(new_pages.c_str());
      (void)::unlink(new_map.c_str());
      return errno_status("cannot link " + dir + "/parent to " + link);
    }
    *linked = true;
  }
  // The switch: the pagemap (one rename), then the old pages file is not named by anything.
  if (::rename(new_map.c_str(), (dir + "/" + name).c_str()) != 0) {
    const Status st = errno_status("cannot rename " + new_map);
    (void)::unlink(new_pages.c_str());
    (void)::unlink(new_map.c_str());
    return st;
  }
  (void)::unlink(pages_path(dir, pm->pages_id).c_str());
  rep->pages_to_parent += equal;
  ++rep->files;
  return Status::Ok();
}

}  // namespace

StatusOr<CriuDeltaReport> make_criu_image_incremental(const std::string& dir, const std::string& parent_dir,
                                                      unsigned threads) {
  const auto t0 = std::chrono::steady_clock::now();
  CriuDeltaReport rep;
  struct stat st {};
  if (::lstat((dir + "/parent").c_str(), &st) == 0) return rep;  // CRIU made it incremental itself
  if (::stat(parent_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::NotFound("the parent CPU image " + parent_dir + " is not a directory");
  // The link is relative to `dir`, resolved the way the kernel will (from the real paths).
  std::error_code ec;
  const fs::path real_dir = fs::canonical(dir, ec), real_parent = fs::canonical(parent_dir, ec);
  if (ec) return Status::Unavailable("cannot resolve " + dir + " or " + parent_dir + ": " + ec.message());
  const std::string link = real_parent.lexically_relative(real_dir).string();
  if (link.empty() || link == ".") return Status::InvalidArgument("an image cannot be its own parent: " + dir);
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("pagemap-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 4, 4, ".img") == 0 && e.is_regular_file(ec))
      names.push_back(n);
  }
  if (ec) return Status::Unavailable("cannot list " + dir + ": " + ec.message());
  std::sort(names.begin(), names.end());
  bool linked = false;
  for (const std::string& n : names) POS_RETURN_IF_ERROR(delta_one(dir, n, parent_dir, threads, link, &linked, &rep));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

StatusOr<CriuWholeReport> write_whole_criu_image(const std::string& dir, const std::string& out_dir) {
  const uint64_t page = criu_page_size();
  std::error_code ec;
  struct Entry {
    std::string name;
    bool rewrite = false;
  };
  std::vector<Entry> entries;
  std::vector<std::pair<std::string, CriuPagemap>> maps;  // the pagemaps with parent runs
  std::vector<std::string> dropped;                        // their pages files: rewritten, not linked
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "parent" && e.is_symlink(ec)) continue;
    if (e.is_symlink(ec) || !e.is_regular_file(ec))
      return Status::Unsupported(dir + "/" + n + " is not a regular file: a CRIU image this cannot make whole");
    entries.push_back({n});
    if (n.rfind("pagemap-", 0) != 0 || n.size() <= 12 || n.compare(n.size() - 4, 4, ".img") != 0) continue;
    auto pm = read_criu_pagemap(dir + "/" + n);
    if (!pm.ok()) return pm.status();
    if (std::none_of(pm->runs.begin(), pm->runs.end(), [](const CriuPagemap::Run& r) { return (r.flags & kCriuPageParent) != 0; }))
      continue;
    entries.back().rewrite = true;
    dropped.push_back("pages-" + std::to_string(pm->pages_id) + ".img");
    maps.emplace_back(n, std::move(*pm));
  }
  if (ec) return Status::Unavailable("cannot list " + dir + ": " + ec.message());
  if (::mkdir(out_dir.c_str(), 0700) != 0) return errno_status("cannot make " + out_dir);
  struct Scratch {
    std::string dir;
    bool keep = false;
    ~Scratch() {
      std::error_code e;
      if (!keep) fs::remove_all(dir, e);
    }
  } scratch{out_dir};
  for (const Entry& e : entries) {
    if (e.rewrite || std::find(dropped.begin(), dropped.end(), e.name) != dropped.end()) continue;
    const std::string from = dir + "/" + e.name, to = out_dir + "/" + e.name;
    if (::link(from.c_str(), to.c_str()) != 0) return errno_status("cannot link " + from + " to " + to);
  }
  CriuWholeReport rep;
  for (const auto& [name, pm] : maps) {
    ParentChain chain;
    POS_RETURN_IF_ERROR(chain.open(dir + "/parent", name));
    auto mine = Mapped::open(pages_path(dir, pm.pages_id), pm.present_pages() * page);
    if (!mine.ok()) return mine.status();
    const std::string pages_file = pages_path(out_dir, pm.pages_id);
    const int fd = ::open(pages_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return errno_status("cannot create " + pages_file);
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    CriuPagemap out;
    out.pages_id = pm.pages_id;
    auto add = [&](uint64_t vaddr, uint64_t n, uint32_t flags) {
      if (!out.runs.empty() && out.runs.back().flags == flags && out.runs.back().vaddr + out.runs.back().pages * page == vaddr)
        out.runs.back().pages += n;
      else out.runs.push_back({vaddr, n, flags});
    };
    uint64_t own = 0;  // the next of this image's own pages
    for (const CriuPagemap::Run& run : pm.runs) {
      if ((run.flags & kCriuPagePresent) != 0) {
        POS_RETURN_IF_ERROR(write_all(fd, mine->data() + own * page, run.pages * page, pages_file));
        own += run.pages;
        add(run.vaddr, run.pages, run.flags);
        rep.pages += run.pages;
      } else if ((run.flags & kCriuPageParent) != 0) {
        for (uint64_t k = 0; k < run.pages; ++k) {
          const uint64_t vaddr = run.vaddr + k * page;
          uint32_t flags = 0;
          const std::byte* p = chain.find(vaddr, &flags);
          if (p == nullptr)
            return Status::Corrupt(dir + "/" + name + ": the page at 0x" + [&] {
              char b[32];
              std::snprintf(b, sizeof(b), "%llx", static_cast<unsigned long long>(vaddr));
              return std::string(b);
            }() + " is left to a parent, and no image of its chain holds it");
          POS_RETURN_IF_ERROR(write_all(fd, p, page, pages_file));
          add(vaddr, 1, flags & ~kCriuPageParent);
          ++rep.pages, ++rep.pages_from_parents;
        }
      } else {
        add(run.vaddr, run.pages, run.flags);  // neither here nor in a parent (lazy): as it was
      }
    }
    if (::fsync(fd) != 0) return errno_status("cannot sync " + pages_file);
    POS_RETURN_IF_ERROR(write_criu_pagemap(out_dir + "/" + name, out));
    ++rep.files;
  }
  POS_RETURN_IF_ERROR(sync_directory(out_dir));
  scratch.keep = true;
  return rep;
}

StatusOr<ProcessPagesReport> write_process_pages(pid_t pid, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t page = criu_page_size();
  const std::string proc = "/proc/" + std::to_string(pid);
  auto maps = read_bounded_file(proc + "/maps", 64u << 20);
  if (!maps.ok()) return maps.status().with_context("reading the memory map of pid " + std::to_string(pid));
  const int pmfd = ::open((proc + "/pagemap").c_str(), O_RDONLY | O_CLOEXEC);
  if (pmfd < 0) return errno_status("cannot open " + proc + "/pagemap");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } pm_closer{pmfd};
  if (::mkdir(dir.c_str(), 0700) != 0) return errno_status("cannot make " + dir);
  const std::string pages_file = pages_path(dir, 1);
  const int out = ::open(pages_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (out < 0) return errno_status("cannot create " + pages_file);
  Closer out_closer{out};
  ProcessPagesReport rep;
  CriuPagemap pm;
  pm.pages_id = 1;
  constexpr uint64_t kBatch = 2048;  // pages per pagemap read and per copy (8 MiB)
  std::vector<uint64_t> pme(kBatch);
  std::vector<std::byte> buf(kBatch * page);
  auto add_run = [&](uint64_t vaddr, uint64_t n) {
    if (!pm.runs.empty() && pm.runs.back().vaddr + pm.runs.back().pages * page == vaddr) pm.runs.back().pages += n;
    else pm.runs.push_back({vaddr, n, kCriuPagePresent});
  };
  // Copies pages [vaddr, vaddr + n pages) of the process into buf at `at` pages; where a read
  // comes back short, page by page, leaving out what cannot be read. Appends what it read.
  auto copy = [&](uint64_t vaddr, uint64_t n) -> Status {
    iovec local{buf.data(), n * page}, remote{reinterpret_cast<void*>(vaddr), n * page};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got == static_cast<ssize_t>(n * page)) {
      POS_RETURN_IF_ERROR(write_all(out, buf.data(), n * page, pages_file));
      add_run(vaddr, n);
      rep.pages += n;
      return Status::Ok();
    }
    if (got < 0 && errno == ESRCH) return Status::NotFound("pid " + std::to_string(pid) + " is gone");
    if (got < 0 && errno == EPERM) return Status::FailedPrecondition("reading the memory of pid " + std::to_string(pid) + ": " + std::strerror(errno));
    for (uint64_t k = 0; k < n; ++k) {
      iovec l1{buf.data(), page}, r1{reinterpret_cast<void*>(vaddr + k * page), page};
      if (::process_vm_readv(pid, &l1, 1, &r1, 1, 0) != static_cast<ssize_t>(page)) {
        ++rep.pages_skipped;
        continue;
      }
      POS_RETURN_IF_ERROR(write_all(out, buf.data(), page, pages_file));
      add_run(vaddr + k * page, 1);
      ++rep.pages;
    }
    return Status::Ok();
  };
  size_t at = 0;
  const std::string& text = *maps;
  while (at < text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(at, eol - at);
    at = eol + 1;
    // "start-end perms offset dev inode   path"
    unsigned long long start = 0, end = 0;
    char perms[8] = {};
    int name_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %*s %*s %*s %n", &start, &end, perms, &name_at) < 3) continue;
    const std::string path = name_at > 0 && static_cast<size_t>(name_at) <= line.size() ? line.substr(static_cast<size_t>(name_at)) : "";
    // What CRIU stores of a process: the anonymous pages of its private mappings. Readable ones
    // only; never device mappings or the kernel's own pages.
    if (perms[0] != 'r' || perms[3] != 'p' || (perms[1] != 'w' && !path.empty())) continue;
    if (path.rfind("/dev/", 0) == 0 || (path.size() > 2 && path.front() == '[' && path != "[heap]" && path.rfind("[stack", 0) != 0 &&
                                        path.rfind("[anon", 0) != 0))
      continue;
    if (start % page != 0 || end % page != 0 || end <= start) continue;
    ++rep.mappings;
    for (uint64_t v = start; v < end;) {
      const uint64_t n = std::min<uint64_t>(kBatch, (end - v) / page);
      const ssize_t got = ::pread(pmfd, pme.data(), n * 8, static_cast<off_t>(v / page * 8));
      if (got != static_cast<ssize_t>(n * 8)) {
        if (got < 0 && errno == ESRCH) return Status::NotFound("pid " + std::to_string(pid) + " is gone");
        break;  // the mapping went away meanwhile
      }
      // Runs of pages that are present (or swapped) and anonymous (bit 61: a file page, or shared).
      for (uint64_t k = 0; k < n;) {
        auto wanted = [&](uint64_t i) { return ((pme[i] >> 63) & 1 || (pme[i] >> 62) & 1) && !((pme[i] >> 61) & 1); };
        if (!wanted(k)) {
          ++k;
          continue;
        }
        uint64_t e = k + 1;
        while (e < n && wanted(e)) ++e;
        POS_RETURN_IF_ERROR(copy(v + k * page, e - k));
        k = e;
      }
      v += n * page;
    }
  }
  if (::fsync(out) != 0) return errno_status("cannot sync " + pages_file);
  POS_RETURN_IF_ERROR(write_criu_pagemap(dir + "/pagemap-" + std::to_string(pid) + ".img", pm));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace pos::ckpt
