// checkpoint_policy.cc — the continuous-checkpointing loop: restore points written under a temporary
// name and renamed once complete, chains cut every K points, retention that keeps what a kept point needs.
#include "remoting/server/checkpoint_policy.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "ckpt/criu_delta.h"
#include "ckpt/image.h"
#include "ckpt/image_rebase.h"
#include "pos/base/text.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/job_manifest.h"

namespace pos {
namespace {

constexpr const char* kPrefix = "cp-";
constexpr uint64_t kStatusKeptSeconds = 7 * 24 * 3600;

uint64_t now_epoch() { return static_cast<uint64_t>(std::time(nullptr)); }
uint64_t micros(double s) { return s <= 0 ? 0 : static_cast<uint64_t>(std::llround(s * 1e6)); }

// cp-<digits>: its number, or 0 for any other name.
uint64_t point_seq(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= 3 || name.size() > 3 + 18) return 0;
  uint64_t n = 0;
  for (size_t i = 3; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    n = n * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  return n;
}

std::string point_name(uint64_t seq) {
  char b[32];
  std::snprintf(b, sizeof(b), "%s%06llu", kPrefix, static_cast<unsigned long long>(seq));
  return b;
}

Status sync_dir(const std::string& dir) {
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d || ::fsync(d.get()) != 0) return Status::Unavailable("cannot sync " + dir + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

StatusOr<double> parse_interval(const std::string& text) {
  if (text.empty() || text.size() > 32) return Status::InvalidArgument("an interval such as 30s, 500ms, 2m or 1h is expected");
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return Status::InvalidArgument("'" + printable(text, 32) + "' is no interval (30s, 500ms, 2m, 1h)");
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  if (scale < 0 || !std::isfinite(v)) return Status::InvalidArgument("'" + printable(text, 32) + "' is no interval (30s, 500ms, 2m, 1h)");
  const double s = v * scale;
  if (s < 0.01 || s > 86400) return Status::InvalidArgument("the interval must be between 10ms and 24h, not " + printable(text, 32));
  return s;
}

// ---- status file ----

std::string policy_status_dir(const std::string& jobs_dir) { return jobs_dir + "/checkpoints"; }
std::string policy_status_path(const std::string& jobs_dir, uint32_t pid) {
  return policy_status_dir(jobs_dir) + "/" + std::to_string(pid) + ".json";
}

std::string policy_status_json(const PolicyStatus& s) {
  auto u = [](uint64_t v) { return std::to_string(v); };
  return "{\"pid\":" + u(s.pid) + ",\"checkpointer\":" + u(s.checkpointer) + ",\"uid\":" + u(s.uid) +
         ",\"dir\":" + json_string(s.dir) + ",\"every_us\":" + u(s.every_us) + ",\"keep\":" + u(s.keep) +
         ",\"full_every\":" + u(s.full_every) + ",\"with_cpu\":" + (s.with_cpu ? "true" : "false") +
         ",\"state\":" + json_string(s.state) + ",\"started\":" + u(s.started) + ",\"updated\":" + u(s.updated) +
         ",\"taken\":" + u(s.taken) + ",\"failed\":" + u(s.failed) + ",\"coalesced\":" + u(s.coalesced) +
         ",\"bytes_total\":" + u(s.bytes_total) + ",\"retired\":" + u(s.retired) + ",\"rebased\":" + u(s.rebased) + ",\"last_time\":" + u(s.last_time) +
         ",\"last_duration_us\":" + u(s.last_duration_us) + ",\"last_pause_us\":" + u(s.last_pause_us) +
         ",\"last_gpu_us\":" + u(s.last_gpu_us) + ",\"last_criu_us\":" + u(s.last_criu_us) +
         ",\"last_bytes\":" + u(s.last_bytes) + ",\"last_bytes_referenced\":" + u(s.last_bytes_referenced) +
         ",\"newest\":" + json_string(s.newest) + ",\"newest_time\":" + u(s.newest_time) + ",\"points\":" + u(s.points) +
         ",\"last_error\":" + json_string(s.last_error) + ",\"last_error_time\":" + u(s.last_error_time) + "}\n";
}

StatusOr<PolicyStatus> parse_policy_status(const std::string& text) {
  if (text.size() > 64 * 1024) return Status::Corrupt("the checkpoint status is larger than 64 KiB");
  std::map<std::string, FlatJsonValue> v;
  POS_RETURN_IF_ERROR(parse_flat_json(text, "the checkpoint status", &v));
  PolicyStatus s;
  Status bad = Status::Ok();
  auto num = [&](const char* key, uint64_t* out) {
    auto it = v.find(key);
    if (it == v.end() || it->second.kind != FlatJsonValue::kNumber) {
      if (bad.ok()) bad = Status::Corrupt(std::string("the checkpoint status lacks the number \"") + key + "\"");
      return;
    }
    *out = it->second.n;
  };
  auto str = [&](const char* key, std::string* out) {
    auto it = v.find(key);
    if (it == v.end() || it->second.kind != FlatJsonValue::kString) {
      if (bad.ok()) bad = Status::Corrupt(std::string("the checkpoint status lacks the string \"") + key + "\"");
      return;
    }
    *out = it->second.s;
  };
  uint64_t pid = 0, cp = 0, uid = 0;
  num("pid", &pid), num("checkpointer", &cp), num("uid", &uid);
  for (auto [k, p] : {std::pair<const char*, uint64_t*>{"every_us", &s.every_us}, {"keep", &s.keep},
                      {"full_every", &s.full_every}, {"started", &s.started}, {"updated", &s.updated},
                      {"taken", &s.taken}, {"failed", &s.failed}, {"coalesced", &s.coalesced},
                      {"bytes_total", &s.bytes_total}, {"retired", &s.retired}, {"last_time", &s.last_time},
                      {"last_duration_us", &s.last_duration_us}, {"last_pause_us", &s.last_pause_us},
                      {"last_gpu_us", &s.last_gpu_us}, {"last_criu_us", &s.last_criu_us}, {"last_bytes", &s.last_bytes},
                      {"last_bytes_referenced", &s.last_bytes_referenced}, {"newest_time", &s.newest_time},
                      {"points", &s.points}, {"last_error_time", &s.last_error_time}})
    num(k, p);
  // Written since points are made whole; a status of an older checkpointer has none.
  if (auto rb = v.find("rebased"); rb != v.end()) {
    if (rb->second.kind != FlatJsonValue::kNumber) bad = Status::Corrupt("the checkpoint status's \"rebased\" is no number");
    else s.rebased = rb->second.n;
  }
  for (auto [k, p] : {std::pair<const char*, std::string*>{"dir", &s.dir}, {"state", &s.state}, {"newest", &s.newest},
                      {"last_error", &s.last_error}})
    str(k, p);
  auto wc = v.find("with_cpu");
  if (wc == v.end() || wc->second.kind != FlatJsonValue::kBool) {
    if (bad.ok()) bad = Status::Corrupt("the checkpoint status lacks the boolean \"with_cpu\"");
  } else {
    s.with_cpu = wc->second.b;
  }
  POS_RETURN_IF_ERROR(bad);
  if (pid == 0 || pid > 0x7fffffff || cp > 0x7fffffff || uid > 0xfffffffe)
    return Status::Corrupt("the checkpoint status names no valid pid");
  s.pid = static_cast<uint32_t>(pid), s.checkpointer = static_cast<uint32_t>(cp), s.uid = static_cast<uint32_t>(uid);
  return s;
}

StatusOr<PolicyStatus> read_policy_status(const std::string& path) {
  auto text = read_small_file(path, 64 * 1024);
  if (!text.ok()) return text.status();
  auto s = parse_policy_status(*text);
  if (!s.ok()) return s.status().with_context(path);
  return s;
}

std::vector<PolicyStatus> list_policy_statuses(const std::string& jobs_dir, std::vector<std::string>* skipped) {
  std::vector<PolicyStatus> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(policy_status_dir(jobs_dir), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 6 || name.compare(name.size() - 5, 5, ".json") != 0 || !e.is_regular_file(ec)) continue;
    auto s = read_policy_status(e.path().string());
    if (s.ok()) out.push_back(std::move(*s));
    else if (skipped != nullptr) skipped->push_back(s.status().message());
  }
  std::sort(out.begin(), out.end(), [](const PolicyStatus& a, const PolicyStatus& b) { return a.pid < b.pid; });
  return out;
}

bool checkpointer_alive(const PolicyStatus& s) { return process_running(s.checkpointer); }

std::function<bool()> same_process(uint32_t pid) {
  const uint64_t start = process_start_time(pid);
  return [pid, start] { return process_running(pid) && (start == 0 || process_start_time(pid) == start); };
}

// ---- restore points and retention ----

std::vector<RestorePoint> list_restore_points(const std::string& dir) {
  std::vector<RestorePoint> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const uint64_t seq = point_seq(name);
    if (seq == 0 || e.is_symlink(ec) || !e.is_directory(ec)) continue;
    auto m = read_manifest(e.path().string());
    if (!m.ok()) continue;  // not complete: never a parent, never counted as kept
    RestorePoint p;
    p.seq = seq, p.name = name, p.pid = m->pid;
    p.restorable = m->kind == "dump" || m->kind == "driver-dump";
    // A point's previous image is a sibling: "../cp-N".
    if (m->prev.rfind("../", 0) == 0 && m->prev.find('/', 3) == std::string::npos) p.parent = m->prev.substr(3);
    else if (!m->prev.empty()) p.parent = m->prev;  // outside this policy's points: kept by name, never found
    out.push_back(std::move(p));
  }
  std::sort(out.begin(), out.end(), [](const RestorePoint& a, const RestorePoint& b) { return a.seq < b.seq; });
  return out;
}

std::vector<std::string> points_to_retire(const std::vector<RestorePoint>& points, uint32_t keep) {
  std::map<std::string, const RestorePoint*> by_name;
  for (const RestorePoint& p : points) by_name[p.name] = &p;
  std::set<std::string> kept;
  const size_t first = points.size() > keep ? points.size() - keep : 0;
  for (size_t i = first; i < points.size(); ++i) {
    // The point and its chain: every parent it builds on, however old.
    const RestorePoint* p = &points[i];
    for (size_t depth = 0; p != nullptr && depth <= points.size() && kept.insert(p->name).second; ++depth) {
      auto it = by_name.find(p->parent);
      p = it == by_name.end() ? nullptr : it->second;
    }
  }
  std::vector<std::string> out;
  for (const RestorePoint& p : points)
    if (kept.count(p.name) == 0) out.push_back(p.name);
  return out;
}

// Described in the header; the pieces, the pause and the helpers are docs/continuous_checkpointing.md's
// "Freeing".
std::unique_ptr<FreeList> list_files_to_free(const std::vector<std::string>& paths) {
  auto list = std::make_unique<FreeList>();
  std::error_code ec;
  for (const std::string& path : paths)
    for (auto it = std::filesystem::recursive_directory_iterator(path, ec); !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec))
      if (!it->is_symlink(ec) && it->is_regular_file(ec)) list->files.push_back(it->path().string());
  return list;
}

void take_part_in_freeing(FreeList& list) {
  constexpr off_t kPiece = 64 << 20;
  for (size_t i = list.next++; i < list.files.size(); i = list.next++) {
    UniqueFd fd(::open(list.files[i].c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0 || st.st_nlink != 1) continue;
    for (off_t size = st.st_size; size > kPiece;) {
      size -= kPiece;
      if (::ftruncate(fd.get(), size) != 0) break;
      ::usleep(1000);
    }
  }
}

unsigned freeing_threads() { return std::clamp(std::thread::hardware_concurrency() / 4, 2u, 4u); }

// ---- making a point whole ----

namespace {

Status link_file(const std::string& src, const std::string& dst) {
  if (::link(src.c_str(), dst.c_str()) != 0)
    return Status::Unavailable("cannot link " + src + " to " + dst + ": " + std::strerror(errno));
  return Status::Ok();
}

// Every file under `from` hard-linked into `to` (made 0700), directories made, links copied.
Status link_tree(const std::string& from, const std::string& to, int depth = 0) {
  if (depth > 8) return Status::Unsupported(from + ": directories nested too deep");
  if (::mkdir(to.c_str(), 0700) != 0) return Status::Unavailable("cannot make " + to + ": " + std::strerror(errno));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(from, ec)) {
    const std::string n = e.path().filename().string(), src = from + "/" + n, dst = to + "/" + n;
    if (e.is_symlink(ec)) {
      std::error_code lec;
      const auto target = std::filesystem::read_symlink(src, lec);
      if (lec || ::symlink(target.c_str(), dst.c_str()) != 0) return Status::Unavailable("cannot copy the link " + src);
    } else if (e.is_directory(ec)) {
      POS_RETURN_IF_ERROR(link_tree(src, dst, depth + 1));
    } else if (e.is_regular_file(ec)) {
      POS_RETURN_IF_ERROR(link_file(src, dst));
    } else {
      return Status::Unsupported(src + " is neither a file, a directory nor a link");
    }
  }
  if (ec) return Status::Unavailable("cannot list " + from + ": " + ec.message());
  return sync_dir(to);
}

}  // namespace

StatusOr<WholePointReport> make_point_whole(const std::string& dir, const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string point = dir + "/" + name, tmp = dir + "/.tmp-" + name + ".whole";
  auto m = read_manifest(point);
  if (!m.ok()) return m.status();
  WholePointReport rep;
  if (m->prev.empty()) return rep;
  if (m->kind != "dump" && m->kind != "pre-dump")
    return Status::Unsupported(name + " is a " + m->kind + ": an in-process job's GPU part cannot be made whole yet");
  if (m->gpu.find('/') != std::string::npos || m->criu.find('/') != std::string::npos || m->gpu == m->criu)
    return Status::Unsupported(name + ": its parts are not two directories of their own");
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0700) != 0) return Status::Unavailable("cannot make " + tmp + ": " + std::strerror(errno));
  struct Scratch {
    std::string dir;
    bool keep = false;
    ~Scratch() {
      std::error_code e;
      if (!keep) std::filesystem::remove_all(dir, e);
    }
  } scratch{tmp};
  bool gpu_whole = false;
  for (const auto& e : std::filesystem::directory_iterator(point, ec)) {
    const std::string n = e.path().filename().string(), src = point + "/" + n, dst = tmp + "/" + n;
    struct stat st {};
    if (n == "manifest") continue;  // written last, below
    if (n == m->gpu) {
      if (e.is_symlink(ec) || !e.is_directory(ec) || ::stat((src + "/inventory.pb").c_str(), &st) != 0)
        return Status::Unsupported(name + "'s GPU part is no POS image");
      auto w = ckpt::write_whole_image(src, dst);
      if (!w.ok()) return w.status().with_context("making " + name + "'s GPU part whole");
      rep.gpu_bytes = w->blob_bytes, rep.gpu_bytes_from_parents = w->bytes_from_ancestors;
      rep.gpu_files_linked = w->files_linked, rep.gpu_bytes_copied = w->bytes_copied;
      rep.gpu_dir = point + "/" + n;
      gpu_whole = true;
    } else if (n == m->criu && !e.is_symlink(ec) && e.is_directory(ec) && ::lstat((src + "/parent").c_str(), &st) == 0) {
      auto w = ckpt::write_whole_criu_image(src, dst);
      if (!w.ok()) return w.status().with_context("making " + name + "'s CPU part whole");
      rep.cpu_pages_from_parents = w->pages_from_parents;
    } else if (e.is_symlink(ec)) {
      return Status::Unsupported(src + " is a link: a point's files are its own");
    } else if (e.is_directory(ec)) {
      POS_RETURN_IF_ERROR(link_tree(src, dst));
    } else if (e.is_regular_file(ec)) {
      POS_RETURN_IF_ERROR(link_file(src, dst));
    } else {
      return Status::Unsupported(src + " is neither a file nor a directory");
    }
  }
  if (ec) return Status::Unavailable("cannot list " + point + ": " + ec.message());
  JobManifest whole = *m;
  whole.prev.clear();
  whole.criu_parent = false;
  if (gpu_whole) whole.gpu_bytes = rep.gpu_bytes, whole.gpu_bytes_referenced = 0;
  POS_RETURN_IF_ERROR(write_small_file(tmp + "/manifest", manifest_json(whole), 0600));
  ckpt::fault_point("rebase-built");
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, point.c_str(), RENAME_EXCHANGE) != 0)
    return Status::Unavailable("cannot exchange " + tmp + " with " + point + ": " + std::strerror(errno));
  scratch.keep = true;  // it is the old point now: removed below, or by the next runner
  ckpt::fault_point("rebase-exchanged");
  Status synced = sync_dir(dir);
  std::filesystem::remove_all(tmp, ec);
  POS_RETURN_IF_ERROR(synced);
  rep.changed = true;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

// ---- the runner ----

StatusOr<std::unique_ptr<CheckpointRunner>> CheckpointRunner::open(const CheckpointPolicy& policy,
                                                                   const std::string& status_path, CheckpointTick tick) {
  if (policy.pid == 0) return Status::InvalidArgument("no job pid");
  if (policy.dir.empty()) return Status::InvalidArgument("no directory for the restore points");
  if (!(policy.every_s >= 0.01)) return Status::InvalidArgument("the interval must be at least 10 ms");
  if (policy.keep == 0) return Status::InvalidArgument("--keep must be at least 1");
  if (policy.full_every == 0) return Status::InvalidArgument("--full-every must be at least 1");
  std::unique_ptr<CheckpointRunner> r(new CheckpointRunner());
  r->policy_ = policy;
  r->status_path_ = status_path;
  r->tick_ = std::move(tick);
  std::error_code ec;
  std::filesystem::create_directories(policy.dir, ec);
  if (ec) return Status::InvalidArgument("cannot make " + policy.dir + ": " + ec.message());
  char real[PATH_MAX];
  if (::realpath(policy.dir.c_str(), real) == nullptr)
    return Status::InvalidArgument("cannot resolve " + policy.dir + ": " + std::strerror(errno));
  r->policy_.dir = real;
  const std::string& dir = r->policy_.dir;
  if (const std::string p = printable(dir); p != dir)
    return Status::InvalidArgument("the directory's path has unprintable characters: " + p);
  // One policy per directory: a lock held for this runner's life (released by the kernel if it dies).
  r->lock_ = UniqueFd(::open((dir + "/.policy.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!r->lock_) return Status::Unavailable("cannot open " + dir + "/.policy.lock: " + std::strerror(errno));
  if (::flock(r->lock_.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::Busy(dir + " is in use by another checkpoint policy (pos-cli ps lists them)");
  // One policy per job.
  if (!status_path.empty()) {
    auto old = read_policy_status(status_path);
    if (old.ok() && old->state == "running" && old->checkpointer != static_cast<uint32_t>(::getpid()) &&
        checkpointer_alive(*old))
      return Status::Busy("pid " + std::to_string(policy.pid) + " is already checkpointed into " + old->dir +
                          " by checkpointer pid " + std::to_string(old->checkpointer) + " (pos-cli checkpoint -t " +
                          std::to_string(policy.pid) + " --stop ends it)");
    const std::string status_dir = status_path.substr(0, status_path.rfind('/'));
    std::filesystem::create_directories(status_dir, ec);
    if (ec) return Status::InvalidArgument("cannot make the status directory of " + status_path + ": " + ec.message());
    // Policies that ended or stopped stay listed (their newest point is what a restore wants) for a
    // week after their last word; then the next policy started here clears them away.
    const uint64_t now = now_epoch();
    for (const auto& e : std::filesystem::directory_iterator(status_dir, ec)) {
      if (e.path().string() == status_path || e.path().extension() != ".json") continue;
      auto old_status = read_policy_status(e.path().string());
      if (old_status.ok() && (old_status->state != "running" || !checkpointer_alive(*old_status)) &&
          old_status->updated + kStatusKeptSeconds < now)
        std::filesystem::remove(e.path(), ec);
    }
  }
  // What an earlier runner left when it was killed: unfinished points (never complete, so never
  // restored) and retired ones it had not finished deleting.
  uint64_t max_seq = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-cp-", 0) == 0 || name.rfind(".del-cp-", 0) == 0) {
      std::filesystem::remove_all(e.path(), ec);
      max_seq = std::max(max_seq, point_seq(name.substr(5)));
    } else {
      max_seq = std::max(max_seq, point_seq(name));
    }
  }
  r->next_seq_ = max_seq + 1;
  PolicyStatus& s = r->status_;
  s.pid = policy.pid, s.checkpointer = static_cast<uint32_t>(::getpid()), s.uid = static_cast<uint32_t>(::geteuid());
  s.dir = dir, s.every_us = micros(policy.every_s), s.keep = policy.keep, s.full_every = policy.full_every;
  s.with_cpu = policy.with_cpu, s.state = "running", s.started = now_epoch();
  const std::vector<RestorePoint> points = list_restore_points(dir);
  s.points = points.size();
  if (!points.empty()) s.newest = points.back().name;
  r->write_status();
  return r;
}

CheckpointRunner::~CheckpointRunner() { finish_retention(); }

void CheckpointRunner::finish_retention() {
  if (!freeing_.joinable()) return;
  // Still freeing: what waits for it (the next retention, so the next tick) gets helpers, at nice
  // 19 too. Alone, one thread freed 30 GB of /dev/shm in 4.8 s and a 2 s policy's next tick started
  // about 2 s late; freeing on four threads always is more load beside the job than it needs when
  // nothing waits (docs/BENCHMARKS.md, 2026-11-29). So it is gentle until something waits.
  std::vector<std::thread> helpers;
  const auto t0 = std::chrono::steady_clock::now();
  // (Only for files not yet taken: a retention past them is punching, or done.)
  if (freeing_list_ && freeing_list_->next.load() < freeing_list_->files.size()) {
    for (unsigned t = 1; t < freeing_threads(); ++t)
      helpers.emplace_back([list = freeing_list_] {
        (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
        take_part_in_freeing(*list);
      });
  }
  for (std::thread& h : helpers) h.join();
  freeing_.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!helpers.empty() && log_) {
    char line[160];
    std::snprintf(line, sizeof(line), "retention: waited %.3f s for the last retention's freeing, with %zu more thread(s)",
                  waited, helpers.size());
    log_(line);
  }
  freeing_list_.reset();
}

void CheckpointRunner::write_status() {
  status_.updated = now_epoch();
  if (status_path_.empty()) return;
  // The status is for ps and metrics: a failure to write it must not stop the checkpoints.
  if (Status st = write_small_file(status_path_, policy_status_json(status_), 0600); !st.ok() && log_)
    log_("cannot write the status file: " + st.message());
}

Status CheckpointRunner::retire() {
  // The last retention's freeing first: it may still punch the point made whole then, which this
  // one may link from.
  finish_retention();
  std::vector<RestorePoint> points = list_restore_points(policy_.dir);
  Status first = Status::Ok();
  // Rebasing: the oldest point kept, where it builds on points that go, is made whole first, so
  // that they can go (nothing of the device bytes is copied). Where that fails, its chain is kept.
  std::string punch_dir;
  if (points.size() > policy_.keep && !points[points.size() - policy_.keep].parent.empty()) {
    const std::string oldest = points[points.size() - policy_.keep].name;
    auto w = make_point_whole(policy_.dir, oldest);
    if (w.ok() && w->changed) {
      ++status_.rebased;
      punch_dir = w->gpu_dir;
      if (log_) {
        char line[384];
        std::snprintf(line, sizeof(line),
                      "%s: made whole in %.3f s (GPU: %.1f MB from earlier points, %u files linked, %.1f MB copied; "
                      "CPU: %llu pages copied)",
                      oldest.c_str(), w->seconds, static_cast<double>(w->gpu_bytes_from_parents) / 1e6, w->gpu_files_linked,
                      static_cast<double>(w->gpu_bytes_copied) / 1e6, static_cast<unsigned long long>(w->cpu_pages_from_parents));
        log_(line);
      }
      points = list_restore_points(policy_.dir);
    } else if (!w.ok() && w.status().code() == Code::kUnsupported) {
      // A kind of point this cannot rebase (said once): retention keeps its chain, as it may.
      if (log_ && !said_unsupported_) log_("retention keeps chains whole: " + w.status().message());
      said_unsupported_ = true;
    } else if (!w.ok()) {
      first = Status(w.status().code(), 0, "cannot make " + oldest + " whole, so its chain is kept: " + w.status().message());
    }
  }
  const std::vector<std::string> gone = points_to_retire(points, policy_.keep);
  for (const std::string& name : gone) {
    // Renamed first (one atomic step: no half-deleted point ever carries a manifest under its own
    // name), then deleted; a runner killed in between leaves .del-cp-N for the next one.
    const std::string from = policy_.dir + "/" + name, to = policy_.dir + "/.del-" + name;
    if (::rename(from.c_str(), to.c_str()) != 0) {
      if (first.ok()) first = Status::Unavailable("cannot retire " + from + ": " + std::strerror(errno));
      continue;
    }
    ++status_.retired;
  }
  if (!gone.empty()) {
    if (Status st = sync_dir(policy_.dir); !st.ok() && first.ok()) first = st;
    // Freeing gigabytes (of tmpfs, say) takes CPU and time: on a thread of its own at nice 19, so
    // that the job keeps the CPU meanwhile (a thread's nice cannot be raised back without
    // privilege), and left running, so that the next tick starts on time. Nothing reads the
    // retired points; the point made whole is punched only where nothing references its bytes.
    std::vector<std::string> paths;
    for (const std::string& name : gone) paths.push_back(policy_.dir + "/.del-" + name);
    freeing_list_ = list_files_to_free(paths);
    freeing_ = std::thread([this, paths, punch_dir, list = freeing_list_] {
      (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
      const auto t0 = std::chrono::steady_clock::now();
      take_part_in_freeing(*list);
      // A helper may still be on its last file: unlinked here, it is freed as the helper goes on.
      std::error_code ec;
      for (const std::string& path : paths) std::filesystem::remove_all(path, ec);
      const auto t1 = std::chrono::steady_clock::now();
      // The bytes of the earlier points' files that the point made whole does not use (buffers
      // rewritten since): their files are its own now.
      uint64_t freed = 0;
      if (!punch_dir.empty()) {
        auto punched = ckpt::punch_unreferenced(punch_dir);
        if (punched.ok()) freed = *punched;
        else if (log_) log_("freeing unused bytes of " + punch_dir + ": " + punched.status().message());
      }
      const auto t2 = std::chrono::steady_clock::now();
      if (log_) {
        char line[256];
        std::snprintf(line, sizeof(line), "retention: %zu point(s) deleted in %.3f s; %.1f MB of unused bytes freed in %.3f s",
                      paths.size(), std::chrono::duration<double>(t1 - t0).count(), static_cast<double>(freed) / 1e6,
                      std::chrono::duration<double>(t2 - t1).count());
        log_(line);
      }
    });
  }
  status_.points = points.size() - gone.size();
  return first;
}

Status CheckpointRunner::tick() {
  const uint64_t seq = next_seq_++;
  const std::string name = point_name(seq);
  const std::string tmp = policy_.dir + "/.tmp-" + name, final_dir = policy_.dir + "/" + name;
  const bool whole = prev_.empty() || since_full_ + 1 >= policy_.full_every || whole_ahead_ > 0;
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<TickOutcome> r = tick_(tmp, whole ? std::string() : policy_.dir + "/" + prev_);
  Status st = r.ok() ? Status::Ok() : r.status();
  if (st.ok() && ::rename(tmp.c_str(), final_dir.c_str()) != 0)
    st = Status::Unavailable("cannot rename " + tmp + " to " + final_dir + ": " + std::strerror(errno));
  if (st.ok()) st = sync_dir(policy_.dir);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    if (job_not_started(st)) {
      // The job has no state to checkpoint yet (it has not used the GPU): nothing failed, and no
      // point is missing. The next tick tries again under the same name.
      --next_seq_;
      if (log_ && !said_not_yet_) log_("waiting for the job: " + printable(st.message(), 256));
      said_not_yet_ = true;
      return st;
    }
    // The job ended during the checkpoint, or is ending (a job whose driver has shut down at its
    // exit refuses the tick a moment before its process is gone: it gets a second to go): that is
    // the policy's end, not a failure to report.
    const auto ending = [&] {
      for (int i = 0; i < 50; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(20)))
        if (!alive_()) return true;
      return false;
    };
    if (alive_ && ending()) {
      if (log_) log_(name + ": the job ended during this checkpoint (" + printable(st.message(), 256) + ")");
      return st;
    }
    // If the rename happened but its fsync failed, the point may or may not survive a crash:
    // it is complete either way, and the next point starts a new chain.
    ++status_.failed;
    status_.last_error = printable(st.message(), 1024);
    status_.last_error_time = now_epoch();
    prev_.clear();  // the next point is whole: it needs nothing of a chain this tick may have left odd
    since_full_ = 0;
    if (log_) log_(name + ": failed after " + std::to_string(took) + " s: " + status_.last_error);
    write_status();
    return st;
  }
  ++status_.taken;
  status_.bytes_total += r->bytes;
  status_.last_time = now_epoch();
  status_.last_duration_us = micros(took), status_.last_pause_us = micros(r->pause_s);
  status_.last_gpu_us = micros(r->gpu_s), status_.last_criu_us = micros(r->criu_s);
  status_.last_bytes = r->bytes, status_.last_bytes_referenced = r->bytes_referenced;
  status_.newest = name, status_.newest_time = status_.last_time;
  if (log_) {
    char line[512];
    std::snprintf(line, sizeof(line), "%s: %s, %.1f MB written%s, the job paused %.3f ms, %.3f s in all (GPU part %.3f s, CPU part %.3f s)%s%s",
                  name.c_str(), whole ? "whole" : ("on " + prev_).c_str(), static_cast<double>(r->bytes) / 1e6,
                  r->bytes_referenced ? (", " + std::to_string(r->bytes_referenced / 1000000) + " MB left to earlier points").c_str() : "",
                  r->pause_s * 1e3, took, r->gpu_s, r->criu_s, r->note.empty() ? "" : "; ", r->note.c_str());
    log_(line);
  }
  prev_ = name;
  since_full_ = whole ? 0 : since_full_ + 1;
  if (whole && whole_ahead_ > 0) --whole_ahead_;
  // An incremental GPU-only point that left under a tenth of its bytes to earlier points: the job
  // rewrites nearly all of its memory between ticks (a PyTorch job whose optimizer steps every
  // parameter). A chain would then hold up to K points on disk, freed together, to save that tenth.
  // The next K points are whole; then one incremental point looks again. (CRIU's part is left
  // out: its incremental dumps save on their own, whatever the GPU part does.)
  if (!whole && !policy_.with_cpu && r->bytes_referenced * 9 < r->bytes) {
    whole_ahead_ = policy_.full_every;
    if (log_) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "%s left %.1f %% of its bytes to earlier points: the next %u points are whole (a chain would "
                    "keep them all on disk for that)",
                    name.c_str(), 100.0 * static_cast<double>(r->bytes_referenced) /
                                      static_cast<double>(r->bytes + r->bytes_referenced),
                    policy_.full_every);
      log_(line);
    }
  }
  // The point is complete now: ps and the status file say so before retention runs (freeing an old
  // point goes gently, for most of a second with large jobs), so the age of the newest point they
  // show is the job's real recovery point.
  write_status();
  Status ret = retire();
  if (!ret.ok()) {
    status_.last_error = printable(ret.message(), 1024);
    status_.last_error_time = now_epoch();
    if (log_) log_("retention: " + status_.last_error);
  }
  write_status();
  return Status::Ok();
}

void CheckpointRunner::run(const std::atomic<bool>& stop, const std::function<bool()>& alive) {
  using clock = std::chrono::steady_clock;
  const auto every = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(policy_.every_s));
  auto next = clock::now();
  bool ended = false;
  alive_ = alive;
  while (!stop.load()) {
    // Wait for the slot in short steps: a stop or the job's end is seen within 50 ms.
    while (!stop.load() && clock::now() < next) {
      if (!alive()) break;
      std::this_thread::sleep_for(std::min<clock::duration>(next - clock::now(), std::chrono::milliseconds(50)));
    }
    if (stop.load()) break;
    if (!alive()) {
      ended = true;
      break;
    }
    (void)tick();  // its outcome is in the status and the log; the policy goes on
    if (!alive()) {
      ended = true;
      break;
    }
    next += every;
    const auto now = clock::now();
    if (next < now) {
      // Writing took longer than the interval: the missed slots become one tick, now.
      const uint64_t missed = static_cast<uint64_t>((now - next) / every) + 1;
      status_.coalesced += missed - 1;
      next += every * static_cast<int64_t>(missed - 1);
      if (next < now) next = now;
    }
  }
  finish_retention();  // (the checkpointer's process ends right after run())
  status_.state = ended ? "ended" : "stopped";
  if (log_) log_(ended ? "the job is gone: the policy ends" : "stopped");
  write_status();
}

// ---- the real tick ----

CheckpointTick job_checkpoint_tick(const CheckpointPolicy& policy) {
  // An in-process job's ticks share one context of its device, made at the first (job_dump.h).
  auto contexts = std::make_shared<DeviceContexts>();
  return [policy, contexts](const std::string& dir, const std::string& prev) -> StatusOr<TickOutcome> {
    JobDumpOptions o;
    o.socket = policy.socket;
    o.pid = policy.pid;
    o.dir = dir;
    o.prev = prev;
    o.leave_running = true;
    const bool inproc = !policy.job_socket.empty();
    // An in-process job's dump hands its memory over instead (no async mode); pre-dumps are
    // copy-on-write either way.
    o.async = !inproc && (policy.async || !policy.with_cpu);
    o.job_socket = policy.job_socket;
    o.resume_program = policy.resume_program;
    // An in-process job keeps its device copy between ticks, as posd's sessions of policy jobs
    // keep their shadows (POS_SNAP_KEEP=0 in the checkpointer's environment: not).
    o.keep_shadow = inproc;
    o.contexts = contexts;
    StatusOr<JobDumpReport> r = policy.with_cpu ? (inproc ? dump_driver_job(o) : dump_job(o))
                                                : (inproc ? pre_dump_driver_job(o) : pre_dump_job(o));
    if (!r.ok()) return r.status();
    TickOutcome t;
    t.bytes = r->gpu.bytes_stored + r->criu_bytes;
    t.bytes_referenced = r->gpu.bytes_referenced;
    t.pause_s = policy.with_cpu ? r->pause_s : r->gpu.stall_s;
    t.gpu_s = r->gpu_s, t.criu_s = r->criu_s;
    t.note = !r->note.empty() ? r->note : "";
    return t;
  };
}

}  // namespace pos
