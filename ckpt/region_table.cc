// region_table.cc — the region table's text: written in one pass, parsed with every field,
// bound, order and checksum checked (it is input like any file).
#include "ckpt/region_table.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "ckpt/crc32c.h"

namespace pos::ckpt {

namespace {
constexpr char kHeader[] = "pos-driver-memory";
constexpr uint64_t kMaxRegions = 1u << 20;
constexpr uint64_t kMaxTableBytes = 64u << 20;
uint64_t chunks_of(uint64_t size, uint64_t chunk) { return (size + chunk - 1) / chunk; }
}  // namespace

std::vector<ChunkPlace> chunk_places(const RegionTable& t) {
  std::vector<ChunkPlace> out;
  std::vector<uint64_t> at(t.files, 0);
  for (size_t r = 0; r < t.regions.size(); ++r)
    for (uint64_t off = 0; off < t.regions[r].size; off += t.chunk) {
      const uint64_t n = std::min(t.chunk, t.regions[r].size - off);
      const uint32_t f = static_cast<uint32_t>(out.size() % t.files);
      out.push_back(ChunkPlace{r, off, n, f, at[f]});
      at[f] += n;
    }
  return out;
}

std::vector<uint64_t> file_sizes(const RegionTable& t) {
  std::vector<uint64_t> sizes(t.files, 0);
  for (const ChunkPlace& c : chunk_places(t)) sizes[c.file] += c.n;
  return sizes;
}

std::string memory_file_name(uint32_t i) { return "memory." + std::to_string(i) + ".bin"; }

uint64_t RegionTable::bytes() const {
  uint64_t n = 0;
  for (const SavedRegion& r : regions) n += r.size;
  return n;
}

uint64_t RegionTable::same_bytes() const {
  uint64_t n = 0;
  for (const SavedRegion& r : regions)
    for (size_t i = 0; i < r.same.size(); ++i)
      if (r.same[i]) n += std::min(chunk, r.size - i * chunk);
  return n;
}

bool RegionTable::incremental() const {
  if (!inherited.empty()) return true;
  for (const SavedRegion& r : regions)
    if (std::find(r.same.begin(), r.same.end(), true) != r.same.end()) return true;
  return false;
}

std::vector<SavedRegion> RegionTable::allocations() const {
  std::vector<SavedRegion> out = regions;
  out.insert(out.end(), inherited.begin(), inherited.end());
  std::sort(out.begin(), out.end(), [](const SavedRegion& a, const SavedRegion& b) { return a.addr < b.addr; });
  return out;
}

std::string region_table_text(const RegionTable& t) {
  const uint32_t format = t.incremental() ? RegionTable::kFormatIncremental : RegionTable::kFormat;
  std::string s = std::string(kHeader) + " " + std::to_string(format) + "\nchunk " + std::to_string(t.chunk) +
                  "\nfiles " + std::to_string(t.files) + "\n";
  char buf[96];
  for (const SavedRegion& r : t.inherited) {
    std::snprintf(buf, sizeof(buf), "inherit %d 0x%" PRIx64 " %" PRIu64 "\n", r.dev, r.addr, r.size);
    s += buf;
  }
  for (const SavedRegion& r : t.regions) {
    std::snprintf(buf, sizeof(buf), "region %d 0x%" PRIx64 " %" PRIu64 " %" PRIu64 " ", r.dev, r.addr, r.size, r.offset);
    s += buf;
    for (size_t i = 0; i < r.crcs.size(); ++i) {
      std::snprintf(buf, sizeof(buf), "%s%08x", i == 0 ? "" : ",", r.crcs[i]);
      s += buf;
    }
    std::string ranges;
    for (size_t i = 0; i < r.same.size();) {
      if (!r.same[i]) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j + 1 < r.same.size() && r.same[j + 1]) ++j;
      ranges += (ranges.empty() ? " same " : ",") + std::to_string(i) + "-" + std::to_string(j);
      i = j + 1;
    }
    s += ranges + "\n";
  }
  std::snprintf(buf, sizeof(buf), "end %zu %" PRIu64 " %08x\n", t.regions.size(), t.bytes(), crc32c(s.data(), s.size()));
  return s + buf;
}

StatusOr<RegionTable> parse_region_table(const std::string& text) {
  const auto bad = [](const std::string& why) { return Status::Corrupt("the region table " + why); };
  const size_t end_at = text.rfind("\nend ");
  if (end_at == std::string::npos || text.empty() || text.back() != '\n') return bad("has no end line");
  const std::string body = text.substr(0, end_at + 1);
  std::istringstream lines(body);
  std::string line;
  const std::string v1 = std::string(kHeader) + " " + std::to_string(RegionTable::kFormat);
  const std::string v2 = std::string(kHeader) + " " + std::to_string(RegionTable::kFormatIncremental);
  if (!std::getline(lines, line) || (line != v1 && line != v2))
    return bad("does not start with \"" + v1 + "\" or \"" + v2 + "\"");
  const bool incremental = line == v2;
  RegionTable t;
  unsigned long long chunk = 0;
  char tail = 0;
  if (!std::getline(lines, line) || std::sscanf(line.c_str(), "chunk %llu%c", &chunk, &tail) != 1 || chunk == 0 ||
      chunk % 4096 != 0 || chunk > (1ull << 30))
    return bad("names no chunk size (a multiple of 4096 up to 1 GiB)");
  t.chunk = chunk;
  unsigned files = 0;
  if (!std::getline(lines, line) || std::sscanf(line.c_str(), "files %u%c", &files, &tail) != 1 || files == 0 ||
      files > RegionTable::kMaxFiles)
    return bad("names no file count (1 to " + std::to_string(RegionTable::kMaxFiles) + ")");
  t.files = files;
  uint64_t offset = 0, prev_end = 0;
  while (std::getline(lines, line)) {
    if (t.regions.size() + t.inherited.size() >= kMaxRegions)
      return bad("has more than " + std::to_string(kMaxRegions) + " regions");
    int dev = -1, used = 0;
    if (line.rfind("inherit ", 0) == 0) {
      unsigned long long addr = 0, size = 0;
      if (!incremental || !t.regions.empty() ||
          std::sscanf(line.c_str(), "inherit %d 0x%llx %llu%n", &dev, &addr, &size, &used) != 3 ||
          static_cast<size_t>(used) != line.size())
        return bad("has a bad inherit line (only in format 2, before the regions): " + line.substr(0, 80));
      if (dev < 0 || dev >= 64 || size == 0 || size % 4096 != 0 || addr % 4096 != 0 || addr + size < addr)
        return bad("inherits a region with a bad device, address or size: " + line.substr(0, 80));
      if (addr < prev_end) return bad("has inherited regions out of order or overlapping");
      t.inherited.push_back(SavedRegion{dev, addr, size, 0, {}});
      prev_end = addr + size;
      continue;
    }
    // Stored regions are ordered among themselves (after the inherited lines); their overlap with
    // inherited ones is checked at the end.
    if (t.regions.empty()) prev_end = 0;
    unsigned long long addr = 0, size = 0, off = 0;
    if (std::sscanf(line.c_str(), "region %d 0x%llx %llu %llu %n", &dev, &addr, &size, &off, &used) != 4 || used == 0)
      return bad("has a line that is no region: " + line.substr(0, 80));
    if (dev < 0 || dev >= 64 || size == 0 || size % 4096 != 0 || addr % 4096 != 0 || addr + size < addr)
      return bad("has a region with a bad device, address or size: " + line.substr(0, 80));
    if (addr < prev_end) return bad("has regions out of order or overlapping");
    if (off != offset) return bad("has a region whose bytes are not where the one before ends");
    SavedRegion r{dev, addr, size, off, {}, {}};
    std::string crcs = line.substr(static_cast<size_t>(used));
    const uint64_t want = chunks_of(size, chunk);
    if (const size_t at = crcs.find(" same "); at != std::string::npos) {
      if (!incremental) return bad("leaves chunks to a previous image in format 1: " + line.substr(0, 80));
      r.same.assign(want, false);
      const std::string ranges = crcs.substr(at + 6);
      crcs.resize(at);
      size_t p = 0;
      uint64_t last_end = 0;
      bool first = true;
      while (p < ranges.size()) {
        unsigned long long a = 0, b = 0;
        int n = 0;
        if (std::sscanf(ranges.c_str() + p, "%llu-%llu%n", &a, &b, &n) != 2 || n <= 0 || a > b || b >= want ||
            (!first && a <= last_end) || !std::isdigit(static_cast<unsigned char>(ranges[p])))
          return bad("has a bad list of chunks left to the previous image: " + line.substr(0, 80));
        for (uint64_t c = a; c <= b; ++c) r.same[c] = true;
        last_end = b;
        first = false;
        p += static_cast<size_t>(n);
        if (p < ranges.size() && ranges[p++] != ',') return bad("has a bad list of chunks left to the previous image");
        if (p == ranges.size() && ranges.back() == ',') return bad("has a bad list of chunks left to the previous image");
      }
      if (first) return bad("has an empty list of chunks left to the previous image");
    }
    if (crcs.size() != want * 9 - 1) return bad("has a region without one checksum per chunk");
    for (uint64_t i = 0; i < want; ++i) {
      unsigned v = 0;
      if (std::sscanf(crcs.c_str() + i * 9, "%8x", &v) != 1 || (i + 1 < want && crcs[i * 9 + 8] != ',')) return bad("has a bad checksum list");
      r.crcs.push_back(v);
    }
    t.regions.push_back(std::move(r));
    prev_end = addr + size;
    offset += size;
  }
  unsigned long long n = 0, total = 0;
  unsigned crc = 0;
  if (std::sscanf(text.c_str() + end_at + 1, "end %llu %llu %8x%c", &n, &total, &crc, &tail) != 4 || tail != '\n')
    return bad("has a bad end line");
  if (n != t.regions.size() || total != offset) return bad("counts other regions or bytes than it lists");
  if (crc != crc32c(body.data(), body.size())) return bad("fails its checksum");
  if (incremental && !t.incremental()) return bad("is incremental (format 2) but inherits nothing");
  const std::vector<SavedRegion> all = t.allocations();
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i].addr < all[i - 1].addr + all[i - 1].size) return bad("has a stored region overlapping an inherited one");
  return t;
}

StatusOr<std::string> read_bounded_file(const std::string& path, uint64_t max) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status(Code::kNotFound, 0, "cannot open " + path + ": " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      ::close(fd);
      return Status::Unavailable("cannot read " + path + ": " + std::strerror(e));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > max) {
      ::close(fd);
      return Status::Corrupt(path + " is larger than " + std::to_string(max) + " bytes");
    }
  }
  ::close(fd);
  return out;
}

StatusOr<RegionTable> read_region_table(const std::string& dir) {
  auto text = read_bounded_file(dir + "/regions", kMaxTableBytes);
  if (!text.ok()) return text.status();
  auto t = parse_region_table(*text);
  if (!t.ok()) return t.status().with_context(dir);
  return t;
}

}  // namespace pos::ckpt
