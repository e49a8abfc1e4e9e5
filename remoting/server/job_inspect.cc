// job_inspect.cc — a job image's parts read, checked against its manifest and described; the GPU
// part through ckpt/inspect, the CPU part through ckpt/criu_image.
#include "remoting/server/job_inspect.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <ctime>
#include <filesystem>
#include <vector>
#include <sstream>

#include "ckpt/crc32c.h"
#include "ckpt/criu_image.h"
#include "ckpt/image.h"
#include "ckpt/inspect.h"
#include "pos/base/text.h"
#include "remoting/common/unique_fd.h"
#include "remoting/server/job_manifest.h"

namespace pos {
namespace {

std::string mib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

std::string indent(const std::string& text, const std::string& by) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t e = text.find('\n', i);
    const size_t end = e == std::string::npos ? text.size() : e + 1;
    out += by + text.substr(i, end - i);
    i = end;
  }
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

// The tree, children under their parents, from pstree.img's flat list.
void tree_lines(const ckpt::CriuImageSummary& s, uint32_t pid, int depth, std::string* out, int guard = 0) {
  if (guard > 64) return;
  for (const auto& p : s.processes) {
    if (p.pid != pid) continue;
    *out += std::string(4 + 2 * depth, ' ') + std::to_string(p.pid) + " '" + p.comm + "' (" + std::to_string(p.threads) +
            (p.threads == 1 ? " thread)\n" : " threads)\n");
  }
  for (const auto& c : s.processes)
    if (c.ppid == pid && c.pid != pid) tree_lines(s, c.pid, depth + 1, out, guard + 1);
}

// The driver memory image's allocations, as text lines or a JSON object.
std::string describe_regions(const ckpt::RegionTable& t, bool json, bool summary) {
  if (json) {
    std::string j = "{\"chunk\":" + std::to_string(t.chunk) + ",\"bytes\":" + std::to_string(t.bytes()) + ",\"regions\":[";
    const auto list = [](const std::vector<ckpt::SavedRegion>& rs) {
      std::string l;
      for (size_t i = 0; i < rs.size(); ++i)
        l += std::string(i ? "," : "") + "{\"device\":" + std::to_string(rs[i].dev) + ",\"address\":" +
             std::to_string(rs[i].addr) + ",\"bytes\":" + std::to_string(rs[i].size) + "}";
      return l;
    };
    return j + list(t.regions) + "],\"inherited\":[" + list(t.inherited) + "]}";
  }
  if (summary)
    return std::to_string(t.regions.size()) + " allocations, " + mib(t.bytes()) +
           (t.inherited.empty() ? "" : "; " + std::to_string(t.inherited.size()) + " inherited from previous images") + "\n";
  std::string out;
  char line[128];
  for (const ckpt::SavedRegion& r : t.allocations()) {
    const bool inherited = r.crcs.empty() && std::any_of(t.inherited.begin(), t.inherited.end(),
                                                         [&](const ckpt::SavedRegion& i) { return i.addr == r.addr; });
    std::snprintf(line, sizeof(line), "device %d at 0x%llx: %s%s\n", r.dev, static_cast<unsigned long long>(r.addr),
                  mib(r.size).c_str(), inherited ? " (in a previous image)" : "");
    out += line;
  }
  return out;
}

}  // namespace

StatusOr<ckpt::RegionTable> open_driver_gpu_part(const std::string& gpu_dir, const JobManifest& m) {
  auto t = ckpt::read_region_table(gpu_dir);
  if (!t.ok()) return t.status().with_context("the GPU part");
  if (t->bytes() != m.gpu_bytes || t->allocations().size() != m.handles)
    return Status::Corrupt("the GPU part " + gpu_dir + " holds " + std::to_string(t->allocations().size()) + " regions of " +
                           std::to_string(t->bytes()) + " bytes; the manifest says " + std::to_string(m.handles) + " of " +
                           std::to_string(m.gpu_bytes));
  const std::vector<uint64_t> sizes = ckpt::file_sizes(*t);
  for (uint32_t f = 0; f < t->files; ++f) {
    struct stat st {};
    const std::string path = gpu_dir + "/" + ckpt::memory_file_name(f);
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != sizes[f])
      return Status::Corrupt("the GPU part's " + ckpt::memory_file_name(f) + " is missing or not " +
                             std::to_string(sizes[f]) + " bytes");
  }
  return t;
}

StatusOr<std::vector<std::string>> driver_image_parents(const std::string& dir, const JobManifest& m) {
  std::vector<std::string> out;
  std::vector<std::string> seen;
  char real[PATH_MAX];
  if (::realpath(dir.c_str(), real) != nullptr) seen.emplace_back(real);
  std::string at = dir;
  JobManifest cur = m;
  while (!cur.prev.empty()) {
    if (out.size() == 64) return Status::Corrupt(dir + " has more than 64 previous images");
    const std::string next = at + "/" + cur.prev;
    if (::realpath(next.c_str(), real) == nullptr)
      return Status::Corrupt("the previous image " + next + " is missing (" + std::strerror(errno) + "): " + dir +
                             " needs it");
    if (std::find(seen.begin(), seen.end(), real) != seen.end())
      return Status::Corrupt("the previous images of " + dir + " form a loop at " + real);
    seen.emplace_back(real);
    auto pm = read_manifest(real);
    if (!pm.ok()) return pm.status().with_context("the previous image");
    if ((pm->kind != "driver-dump" && pm->kind != "driver-pre-dump") || pm->pid != m.pid || pm->uid != m.uid)
      return Status::Corrupt("the previous image " + std::string(real) + " is not an image of this in-process job");
    at = real;
    out.push_back(at + "/" + pm->gpu);
    cur = *pm;
  }
  return out;
}

Status verify_driver_gpu_part(const std::string& gpu_dir, const ckpt::RegionTable& t,
                              const std::function<void(uint64_t, uint64_t)>& progress) {
  std::vector<UniqueFd> fds;
  for (uint32_t f = 0; f < t.files; ++f) {
    fds.emplace_back(::open((gpu_dir + "/" + ckpt::memory_file_name(f)).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fds.back()) return Status::Unavailable("cannot open " + gpu_dir + "/" + ckpt::memory_file_name(f) + ": " + std::strerror(errno));
  }
  std::vector<char> buf(t.chunk);
  uint64_t done = 0;
  for (const ckpt::ChunkPlace& c : ckpt::chunk_places(t)) {
    if (t.regions[c.region].chunk_same(c.off / t.chunk)) continue;  // a hole: its bytes are in a previous image
    const std::string name = gpu_dir + "/" + ckpt::memory_file_name(c.file);
    uint64_t got = 0;
    while (got < c.n) {
      const ssize_t k = ::pread(fds[c.file].get(), buf.data() + got, c.n - got, static_cast<off_t>(c.file_off + got));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return Status::Corrupt(name + " cannot be read at " + std::to_string(c.file_off + got));
      got += static_cast<uint64_t>(k);
    }
    if (ckpt::crc32c(buf.data(), c.n) != t.regions[c.region].crcs[c.off / t.chunk])
      return Status::Corrupt(name + ": the chunk at " + std::to_string(c.file_off) + " fails its checksum");
    done += c.n;
    if (progress) progress(done, t.bytes() - t.same_bytes());
  }
  return Status::Ok();
}

bool is_job_image(const std::string& dir) {
  struct stat st {};
  return ::stat((dir + "/manifest").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

StatusOr<std::string> describe_job_image(const std::string& dir, const JobInspectOptions& o) {
  auto m = read_manifest(dir);
  if (!m.ok()) return m.status();
  const std::string gpu_dir = dir + "/" + m->gpu;
  std::string verified_text = "not verified (--no-verify): blob checksums were not read\n", verified_json = "null";
  std::string gpu;
  const bool driver = m->kind == "driver-dump" || m->kind == "driver-pre-dump";
  uint64_t same_bytes = 0;  // a driver image's chunks left to the previous image
  if (driver) {
    auto table = open_driver_gpu_part(gpu_dir, *m);
    if (!table.ok()) return table.status();
    auto parents = driver_image_parents(dir, *m);  // an incremental image's chain must be whole
    if (!parents.ok()) return parents.status();
    same_bytes = table->same_bytes();
    if (o.verify) {
      POS_RETURN_IF_ERROR(verify_driver_gpu_part(gpu_dir, *table, o.progress));
      const uint64_t chunks = (table->bytes() + table->chunk - 1) / table->chunk;
      verified_text = "verified: " + std::to_string(table->bytes() - table->same_bytes()) +
                      " bytes, every chunk's checksum right\n";
      verified_json = "{\"bytes\":" + std::to_string(table->bytes() - table->same_bytes()) + ",\"chunks\":" + std::to_string(chunks) + "}";
    }
    gpu = describe_regions(*table, o.json, o.summary);
  } else {
    auto img = ckpt::ImageReader::open_dir(gpu_dir);
    if (!img.ok()) return img.status().with_context("the GPU part " + gpu_dir);
    if ((*img)->inventory().image_id() != m->gpu_image_id || (*img)->inventory().cut_pc() != m->cut)
      return Status::Corrupt("the GPU part " + gpu_dir + " is not the one the manifest names (image " +
                             (*img)->inventory().image_id() + " at cut " + std::to_string((*img)->inventory().cut_pc()) +
                             "; the manifest: image " + m->gpu_image_id + " at cut " + std::to_string(m->cut) + ")");
    if (o.verify) {
      auto v = ckpt::verify_image(**img, o.progress);
      if (!v.ok()) return v.status();
      verified_text = "verified: " + std::to_string(v->bytes) + " bytes in " + std::to_string(v->chunks) + " chunks of " +
                      std::to_string(v->blobs) + " blobs, " + std::to_string(v->images) + " image(s), every checksum right\n";
      verified_json = "{\"bytes\":" + std::to_string(v->bytes) + ",\"chunks\":" + std::to_string(v->chunks) +
                      ",\"blobs\":" + std::to_string(v->blobs) + ",\"images\":" + std::to_string(v->images) + "}";
    }
    gpu = ckpt::describe_image(**img, ckpt::DescribeOptions{o.json, o.summary});
  }

  // The CPU part: a pre-dump's may be CRIU's pre-dump, or the job's pages read while it ran (no
  // process tree either way); some pre-dumps have none.
  StatusOr<ckpt::CriuImageSummary> criu = Status::NotFound("none");
  if (!m->criu.empty()) {
    criu = ckpt::read_criu_image(dir + "/" + m->criu);
    if (!criu.ok()) return criu.status().with_context("the CPU part " + dir + "/" + m->criu);
    const bool pre = m->kind == "pre-dump" || m->kind == "driver-pre-dump";
    if (pre ? !criu->processes.empty() : (criu->processes.empty() || criu->processes.front().pid != m->pid))
      return Status::Corrupt("the CPU part " + dir + "/" + m->criu + " is not CRIU's dump of pid " +
                             std::to_string(m->pid) + ", as the manifest says");
    if (m->criu_parent && !criu->has_parent)
      return Status::Corrupt("the CPU part " + dir + "/" + m->criu + " is incremental, but its parent link is gone");
  }

  if (o.json) {
    std::string j = "{\"image\":" + json_string(dir) + ",\"manifest\":" + manifest_json(*m);
    while (!j.empty() && j.back() == '\n') j.pop_back();
    j += ",\"gpu\":" + gpu;
    while (!j.empty() && j.back() == '\n') j.pop_back();
    j += ",\"gpu_verified\":" + verified_json + ",\"criu\":";
    if (!criu.ok()) {
      j += "null";
    } else {
      j += "{\"processes\":[";
      for (size_t i = 0; i < criu->processes.size(); ++i) {
        const auto& p = criu->processes[i];
        j += std::string(i ? "," : "") + "{\"pid\":" + std::to_string(p.pid) + ",\"ppid\":" + std::to_string(p.ppid) +
             ",\"pgid\":" + std::to_string(p.pgid) + ",\"sid\":" + std::to_string(p.sid) +
             ",\"threads\":" + std::to_string(p.threads) + ",\"comm\":" + json_string(p.comm) + "}";
      }
      j += "],\"pagemaps\":" + std::to_string(criu->pagemaps) + ",\"pages_stored\":" + std::to_string(criu->pages_stored) +
           ",\"pages_in_parent\":" + std::to_string(criu->pages_in_parent) +
           ",\"pages_lazy\":" + std::to_string(criu->pages_lazy) + ",\"bytes\":" + std::to_string(criu->bytes) +
           ",\"incremental\":" + (criu->has_parent ? "true" : "false") + "}";
    }
    return j + "}\n";
  }
  std::ostringstream t;
  t << "job image " << dir << ": "
    << (m->kind == "dump"              ? "a dump"
        : m->kind == "driver-dump"     ? "a dump of an in-process job (pos run)"
        : m->kind == "driver-pre-dump" ? "a GPU-only checkpoint of an in-process job (pos run; pre-dump: no restore point)"
                                       : "a pre-dump (no restore point: --prev of a later dump)")
    << " of pid " << m->pid << " (uid " << m->uid << "), job '" << m->job << "', "
    << (driver ? "control socket " : "from posd ") << m->socket << "\n";
  if (m->kind != "pre-dump" && m->kind != "driver-pre-dump") t << "  the job " << (m->leave_running ? "ran on after the dump" : "ended with the dump") << "\n";
  if (!m->prev.empty()) t << "  previous image: " << m->prev << " (this one holds only what changed since)\n";
  if (m->kind == "driver-pre-dump")
    t << "GPU part (" << m->gpu << "): device memory at one cut, " << m->handles << " allocations, " << mib(m->gpu_bytes)
      << " (no CPU part: the job ran on)\n";
  else if (driver)
    t << "GPU part (" << m->gpu << "): device memory, " << m->handles << " allocations, " << mib(m->gpu_bytes)
      << " (the driver's own state went through NVIDIA's checkpoint into the CPU part)\n";
  if (driver && !m->prev.empty())
    t << "  " << mib(m->gpu_bytes - same_bytes) << " stored here, " << mib(m->gpu_bytes_referenced)
      << " unchanged since the previous image and left in it\n";
  else
    t << "GPU part (" << m->gpu << "): cut at call " << m->cut << ", " << m->handles << " handles, " << mib(m->gpu_bytes)
      << " stored" << (m->prev.empty() ? std::string() : ", " + mib(m->gpu_bytes_referenced) + " in previous images")
      << "\n";
  t << indent(gpu, "  ") << "  " << verified_text;
  if (!criu.ok()) {
    t << "CPU part: none (this kernel tracks no dirty memory, so CRIU pre-dumped nothing; the dump --prev of this "
         "image saves all of the job's memory)\n";
    return t.str();
  }
  t << "CPU part (" << m->criu << "): CRIU images, " << mib(criu->bytes)
    << (criu->has_parent ? ", incremental (pages unchanged since the previous image are left there)" : "")
    << (m->criu_track_mem ? "; dirty memory tracked for a later --prev" : "") << "\n";
  if (criu->processes.empty()) {
    t << "  no process tree (a pre-dump holds memory pages only)\n";
  } else {
    t << "  process tree:\n";
    std::string lines;
    tree_lines(*criu, criu->processes.front().pid, 0, &lines);
    t << lines;
  }
  t << "  pages: " << criu->pages_stored << " stored (" << mib(criu->pages_stored * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE))) << "), "
    << criu->pages_in_parent << " in the previous image; " << criu->pagemaps << " pagemaps\n";
  t << "  checked: every pages file holds exactly the pages its pagemaps name\n";
  return t.str();
}

StatusOr<std::vector<ImageEntry>> list_images(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument(dir + " is no directory");
  if (is_job_image(dir))
    return Status::InvalidArgument(dir + " is one image (it has a manifest): name the directory that holds images");
  std::vector<ImageEntry> out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    ImageEntry i;
    i.name = printable(e.path().filename().string(), 128);
    const std::string path = e.path().string();
    struct stat st {};
    if (::lstat((path + "/manifest").c_str(), &st) != 0) {
      // A directory with parts but no manifest is a dump that did not finish (or is running).
      if (!fs::exists(path + "/gpu", ec) && !fs::exists(path + "/criu", ec)) continue;
      i.error = "incomplete (no manifest)";
      out.push_back(std::move(i));
      continue;
    }
    i.time = static_cast<int64_t>(st.st_mtime);
    auto m = read_manifest(path);
    if (!m.ok()) {
      i.error = "damaged: " + m.status().message();
      out.push_back(std::move(i));
      continue;
    }
    i.complete = true;
    i.kind = m->kind, i.job = m->job, i.prev = m->prev, i.pid = m->pid, i.cut = m->cut;
    i.gpu_bytes = m->gpu_bytes, i.gpu_bytes_referenced = m->gpu_bytes_referenced;
    Status whole = Status::Ok();
    if (m->kind == "driver-dump" || m->kind == "driver-pre-dump") {
      whole = driver_image_parents(path, *m).status();
    } else if (!m->prev.empty()) {
      whole = read_manifest(path + "/" + m->prev).status().with_context("its previous image");
    }
    if (!whole.ok()) i.error = "its chain is broken: " + whole.message();
    i.restorable = whole.ok() && (m->kind == "dump" || m->kind == "driver-dump");
    out.push_back(std::move(i));
  }
  std::sort(out.begin(), out.end(), [](const ImageEntry& a, const ImageEntry& b) {
    return a.time != b.time ? a.time > b.time : a.name > b.name;
  });
  return out;
}

std::string describe_images(const std::string& dir, const std::vector<ImageEntry>& images, bool json) {
  const auto utc = [](int64_t t) {
    if (t == 0) return std::string("-");
    char buf[32];
    const time_t tt = static_cast<time_t>(t);
    struct tm tmv {};
    gmtime_r(&tt, &tmv);
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tmv);
    return std::string(buf);
  };
  if (json) {
    std::string j = "{\"dir\":" + json_string(dir) + ",\"images\":[";
    for (size_t k = 0; k < images.size(); ++k) {
      const ImageEntry& i = images[k];
      j += std::string(k ? "," : "") + "{\"name\":" + json_string(i.name) + ",\"complete\":" +
           (i.complete ? "true" : "false") + ",\"restorable\":" + (i.restorable ? "true" : "false") +
           ",\"time\":" + json_string(utc(i.time)) + ",\"kind\":" + json_string(i.kind) + ",\"pid\":" +
           std::to_string(i.pid) + ",\"job\":" + json_string(i.job) + ",\"cut\":" + std::to_string(i.cut) +
           ",\"gpu_bytes\":" + std::to_string(i.gpu_bytes) + ",\"gpu_bytes_referenced\":" +
           std::to_string(i.gpu_bytes_referenced) + ",\"prev\":" + json_string(i.prev) + ",\"error\":" +
           json_string(i.error) + "}";
    }
    return j + "]}\n";
  }
  std::string t = "images in " + dir + ", newest first:\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-24s %-16s %-20s %-8s %12s %12s  %-16s %s\n", "NAME", "KIND", "TIME (UTC)", "PID",
                "GPU BYTES", "IN PREVIOUS", "PREVIOUS", "STATE");
  t += line;
  for (const ImageEntry& i : images) {
    const std::string state = !i.complete ? i.error : !i.error.empty() ? i.error : i.restorable ? "restorable"
                                                                                                : "complete (no restore point)";
    std::snprintf(line, sizeof(line), "%-24s %-16s %-20s %-8s %12s %12s  %-16s %s\n", fit_columns(i.name, 24).c_str(),
                  i.complete ? i.kind.c_str() : "-", utc(i.time).c_str(), i.complete ? std::to_string(i.pid).c_str() : "-",
                  i.complete ? mib(i.gpu_bytes).c_str() : "-",
                  i.complete ? mib(i.gpu_bytes_referenced).c_str() : "-",
                  i.prev.empty() ? "-" : fit_columns(i.prev, 16).c_str(), state.c_str());
    t += line;
  }
  if (images.empty()) t += "(none)\n";
  return t;
}

StatusOr<std::string> latest_image(const std::string& dir) {
  auto images = list_images(dir);
  if (!images.ok()) return images.status();
  for (const ImageEntry& i : *images)
    if (i.restorable) return dir + "/" + i.name;
  return Status(Code::kNotFound, 0, "no complete, restorable image in " + dir + " (pos-cli images " + dir + " lists them)");
}

}  // namespace pos
