// job_dump.cc — the dump's phases in order (detach, GPU cut and drain, CRIU, manifest, resume), each
// timed, each failure undone so that the job runs on and no partial image is left behind.
#include "remoting/server/job_dump.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "ckpt/criu.h"
#include "ckpt/criu_delta.h"
#include "ckpt/driver_checkpoint.h"
#include "ckpt/image.h"
#include "ckpt/region_table.h"
#include "pos/base/parse.h"
#include "pos/base/text.h"
#include "pos/base/thread.h"
#include "remoting/common/job_control.h"
#include "remoting/common/socket_io.h"
#include "remoting/common/unique_fd.h"
#include "remoting/driver/gpu_identity.h"
#include "remoting/driver/held_memory.h"
#include "remoting/server/checkpoint_policy.h"
#include "remoting/server/job_inspect.h"
#include "remoting/server/job_manifest.h"
#include "remoting/server/job_restore.h"

namespace pos {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}


// Bytes of the files under `dir` (CRIU's images), for the report.
uint64_t bytes_under(const std::string& dir) {
  std::error_code ec;
  uint64_t n = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

// Whether this process has capability `cap` in its effective set (/proc/self/status, CapEff).
bool has_effective_capability(int cap) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("CapEff:", 0) == 0) return ((std::stoull(line.substr(7), nullptr, 16) >> cap) & 1) != 0;
  return false;
}

// What dump and pre-dump check before anything is asked of posd or CRIU.
struct Prepared {
  std::string criu;      // the program
  bool tracks_memory = false;
  std::string dir;       // resolved
  uid_t owner = 0;       // the job's user
  std::string prev_dir;  // resolved, or empty
  JobManifest prev;      // its manifest
};

// `criu`: the image has a CPU part (all but an in-process job's GPU-only pre-dump).
StatusOr<Prepared> prepare(const JobDumpOptions& o, bool criu_needed = true) {
  namespace fs = std::filesystem;
  if (o.pid == 0) return Status::InvalidArgument("no job pid given");
  if (o.dir.empty()) return Status::InvalidArgument("no image directory given");
  Prepared p;
  // CRIU first: a machine that cannot dump the CPU half must not have the job stopped for nothing.
  if (criu_needed) {
    auto criu = ckpt::find_criu();
    if (!criu.ok()) return criu.status();
    p.criu = *criu;
    p.tracks_memory = ckpt::criu_tracks_memory(p.criu);
  }
  struct stat owner {};
  if (::stat(("/proc/" + std::to_string(o.pid)).c_str(), &owner) != 0)
    return Status(Code::kNotFound, 0, "pid " + std::to_string(o.pid) + " does not exist");
  p.owner = owner.st_uid;
  // CRIU reads and sets a process's resource limits: for another user's process that takes
  // CAP_SYS_RESOURCE, which some containers drop even for root. Said now, not as CRIU's "Can't get
  // rlimit" after the job was stopped.
  if (criu_needed && p.owner != ::geteuid() && !has_effective_capability(24 /* CAP_SYS_RESOURCE */))
    return Status::FailedPrecondition("pid " + std::to_string(o.pid) + " runs as uid " + std::to_string(p.owner) +
                                      ", and CRIU needs CAP_SYS_RESOURCE to dump another user's process; this "
                                      "pos-cli does not have it (a container that drops it: add it)");
  char real[PATH_MAX];
  if (!o.prev.empty()) {
    if (::realpath(o.prev.c_str(), real) == nullptr)
      return Status::InvalidArgument("cannot resolve the previous image " + o.prev + ": " + std::strerror(errno));
    p.prev_dir = real;
    auto m = read_manifest(p.prev_dir);
    if (!m.ok()) return m.status().with_context("the previous image");
    if (m->pid != o.pid || m->uid != p.owner)
      return Status::InvalidArgument("the previous image " + p.prev_dir + " is of pid " + std::to_string(m->pid) +
                                     " (uid " + std::to_string(m->uid) + "), not of this job");
    p.prev = *m;
  }
  if (::mkdir(o.dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::InvalidArgument("cannot create " + o.dir + ": " + std::strerror(errno));
  if (::realpath(o.dir.c_str(), real) == nullptr)
    return Status::InvalidArgument("cannot resolve " + o.dir + ": " + std::strerror(errno));
  p.dir = real;
  if (p.dir == p.prev_dir) return Status::InvalidArgument("the image and the previous image are one directory");
  for (const char* part : {"gpu", "criu", "manifest", "token"})
    if (fs::exists(fs::symlink_status(p.dir + "/" + part)))
      return Status::InvalidArgument(p.dir + " already holds an image (" + part + "): name an empty or new directory");
  // The manifest keeps paths as printable text: one that is not would not read back the same.
  for (const std::string* s : std::initializer_list<const std::string*>{&p.dir, &o.socket, &p.prev_dir})
    if (printable(*s) != *s || s->size() >= 480)
      return Status::InvalidArgument("the path " + printable(*s) + " holds control characters or is too long for an image");
  return p;
}

// Lets the job run on if this process dies mid-dump (kill -9 included): a child that waits on a
// pipe from this process; at end-of-file without the word that the dump is over, it writes the
// permit the detached job waits for. The job then re-attaches at once instead of after the
// detach's timeout. The child touches no state of this process's other threads: async-signal-safe
// calls on strings made before the fork.
class JobGuardian {
 public:
  // `cont`: the job, sent SIGCONT too (CRIU may have left it stopped: dump_job's leave_stopped).
  JobGuardian(const std::string& permit, uid_t owner, pid_t cont = 0) : tmp_(permit + ".tmp"), permit_(permit) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[1]);
      char c = 0;
      ssize_t r;
      while ((r = ::read(p[0], &c, 1)) < 0 && errno == EINTR) {
      }
      if (r == 1) ::_exit(0);  // the dump is over, either way: nothing to do
      // The dumping process is gone: let the job come back to the posd it left ("\n": no other).
      const int f = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (f >= 0) {
        (void)::fchmod(f, 0644);
        (void)::fchown(f, owner, static_cast<gid_t>(-1));  // the job's: see grant_reattach
        (void)!::write(f, "\n", 1);
        (void)::fsync(f);
        ::close(f);
        (void)::rename(tmp_.c_str(), permit_.c_str());
      }
      if (cont > 0) (void)::kill(cont, SIGCONT);
      static const char kMsg[] = "pos-cli: the dump ended early (its process was killed); the job was let run on\n";
      (void)!::write(2, kMsg, sizeof(kMsg) - 1);
      // The job takes its permit (removes it) within milliseconds: until then (10 s at most) this
      // child holds pos-cli's output open, so that whoever waits for pos-cli does not remove the
      // image directory, permit included, before the job has seen it.
      struct stat st;
      for (int i = 0; i < 1000 && ::stat(permit_.c_str(), &st) == 0; ++i) ::usleep(10'000);
      ::_exit(1);
    }
    ::close(p[0]);
    if (pid < 0) {
      ::close(p[1]);
      return;
    }
    pid_ = pid, fd_ = p[1];
  }
  ~JobGuardian() { release(); }
  // The dump is over (done or undone by this process itself): the guardian leaves without a word.
  void release() {
    if (pid_ <= 0) return;
    (void)!::write(fd_, "x", 1);
    ::close(fd_);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  std::string tmp_, permit_;
  pid_t pid_ = -1;
  int fd_ = -1;
};

// `to` relative to the directory `from` ("../pre/criu").
std::string relative_to(const std::string& to, const std::string& from) {
  return std::filesystem::path(to).lexically_relative(std::filesystem::path(from)).string();
}

// Another clause of a report's note ("; " between clauses); an empty one adds nothing.
void add_note(std::string* to, const std::string& clause) {
  if (!clause.empty()) *to = to->empty() ? clause : *to + "; " + clause;
}

// A CPU part saved whole (CRIU could not track dirty memory): its pages equal to those of prev's CPU
// part at the same address are left to it, in CRIU's own incremental format, found by comparing
// contents. A failure leaves the part whole, which is complete either way, and says so.
void leave_equal_pages_to_prev(const Prepared& pp, JobDumpReport* r) {
  if (r->criu_incremental || r->criu_dir.empty() || pp.prev_dir.empty() || pp.prev.criu.empty()) return;
  std::string note;
  // Only pages of this job's own images: a link into another's would let the comparison tell
  // this job whether its pages equal that image's.
  if (Status c = check_criu_parents(pp.prev_dir, pp.prev); !c.ok()) {
    add_note(&r->criu_note, "the CPU part stays whole: the previous image's is not compared with (" + c.message() + ")");
    return;
  }
  auto d = ckpt::make_criu_image_incremental(r->criu_dir, pp.prev_dir + "/" + pp.prev.criu);
  if (!d.ok()) {
    note = "the CPU part stays whole: comparing it with the previous image's failed (" + d.status().message() + ")";
  } else if (d->pages_to_parent > 0) {
    r->criu_incremental = true;
    r->criu_pages_to_parent = d->pages_to_parent;
    char line[256];
    std::snprintf(line, sizeof(line), "%llu of its %llu pages equal the previous image's and were left to it (%.3f s)",
                  static_cast<unsigned long long>(d->pages_to_parent), static_cast<unsigned long long>(d->pages),
                  d->seconds);
    note = line;
  }
  add_note(&r->criu_note, note);
}

// JobDumpOptions::cpu_pages: the job's pages, read while it runs, into DIR/criu (a pre-dump's CPU
// part where CRIU cannot pre-dump), those equal to prev's left to it. Best effort: the pre-dump
// is whole without them (a later dump saves all of CRIU's pages then), so a failure (memory this
// process may not read, no room) only leaves no CPU part, and says why.
void write_cpu_pages(const JobDumpOptions& o, const Prepared& pp, JobDumpReport* r) {
  const std::string dir = pp.dir + "/criu";
  auto w = ckpt::write_process_pages(static_cast<pid_t>(o.pid), dir);
  if (!w.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    add_note(&r->criu_note, "no CPU part: the job's pages could not be read (" + w.status().message() + ")");
    return;
  }
  r->criu_dir = dir;
  leave_equal_pages_to_prev(pp, r);
  r->criu_bytes = bytes_under(r->criu_dir);
}

// The manifest's fields that dump and pre-dump fill alike, from the job and the parts' reports.
JobManifest manifest_base(const JobDumpOptions& o, const Prepared& pp, const JobDumpReport& r) {
  JobManifest m;
  m.pid = o.pid;
  m.uid = pp.owner;
  m.socket = o.socket;
  m.prev = pp.prev_dir.empty() ? "" : relative_to(pp.prev_dir, pp.dir);
  m.cut = r.gpu.cut_pc, m.gpu_bytes = r.gpu.bytes_stored, m.handles = r.gpu.handles;
  m.gpu_bytes_referenced = r.gpu.bytes_referenced;
  m.criu_track_mem = r.criu_track_mem;
  m.criu_parent = r.criu_incremental;
  return m;
}

// The manifest, last: the GPU part's identity read back from it (the job's name, its image id),
// then the file written whole or not at all.
Status write_manifest(const std::string& dir, JobManifest* m, JobDumpReport* r) {
  auto img = ckpt::ImageReader::open_dir(dir + "/" + m->gpu);
  if (!img.ok()) return img.status().with_context("reading back the GPU part");
  m->job = printable((*img)->client().client().job_name());
  m->gpu_image_id = (*img)->inventory().image_id();
  r->manifest = dir + "/manifest";
  return write_small_file(r->manifest, manifest_json(*m), 0600);
}

}  // namespace

StatusOr<JobDumpReport> dump_job(const JobDumpOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const char* phase, uint64_t done = 0, uint64_t total = 0) {
    if (o.progress) o.progress(phase, done, total);
  };
  if (o.gpu_only && (o.leave_running || o.leave_stopped))
    return Status::InvalidArgument("a GPU-only dump leaves the job detached: not with leave_running or leave_stopped");
  if (o.peer && (!o.gpu_only || o.async || !o.prev.empty()))
    return Status::InvalidArgument("a peer dump is a GPU-only, synchronous, whole one (pos-cli migrate's peer switch)");
  auto prepared = prepare(o, !o.gpu_only);
  if (!prepared.ok()) return prepared.status();
  const Prepared& pp = *prepared;
  const std::string& dir = pp.dir;
  auto permit_path = new_permit_path();
  if (!permit_path.ok()) return permit_path.status();
  const std::string permit = *permit_path;

  JobDumpReport r;
  // A dump that ends the job ends it only once its image is whole: CRIU leaves the job stopped, and
  // its tree is ended once the manifest is durable. This process killed in between leaves a job
  // that runs on (the guardian's SIGCONT and permit) rather than an ended job with no image.
  const bool end_at_manifest = !o.leave_running && !o.leave_stopped && !o.gpu_only;
  const bool stopped = o.leave_stopped || end_at_manifest;
  JobGuardian guardian(permit, pp.owner, stopped ? static_cast<pid_t>(o.pid) : 0);
  say("detach");
  auto t = std::chrono::steady_clock::now();
  const auto t_detach = t;
  // The job comes back by itself after 10 minutes if this process dies before it says so.
  uint64_t arena_bytes = 0;
  auto token = posd_detach(o.socket, o.pid, permit, 600'000, &arena_bytes);
  if (!token.ok()) return token.status().with_context("detaching the job");
  r.detach_s = seconds_since(t);
  ckpt::fault_point("job-dump-detached");
  // From here every failure lets the job run on and removes this dump's parts.
  // What this dump may have written, removed whole: a failed dump leaves no partial image.
  auto remove_parts = [&] {
    for (const char* part : {"gpu", "gpu.partial", "criu", "manifest", "manifest.tmp", "token", "token.tmp"})
      fs::remove_all(dir + "/" + part);
  };
  auto undo = [&](const Status& why) -> Status {
    remove_parts();
    Status resumed = grant_reattach(permit, "", pp.owner);
    // Back once the job has taken its permit (it polls every 2 ms), so that whatever comes next (a
    // checkpoint policy's next tick, say) finds it attached, not "detached already".
    if (resumed.ok()) wait_until_taken(permit, o.pid);
    return resumed.ok() ? why : why.with_context("the job could not be told to run on (" + resumed.message() + ")");
  };

  say("gpu");
  t = std::chrono::steady_clock::now();
  // The GPU checkpoint runs on in its own thread: once its cut is taken, the job's image is fixed
  // and only its bytes are still being drained (copy-on-write in async mode), so CRIU can dump the
  // process and the job can run on meanwhile.
  std::mutex mu;
  std::condition_variable cv;
  bool cut = false, finished = false;
  StatusOr<CheckpointReport> gpu = Status::Internal("no GPU result");
  std::thread drain([&] {
    auto res = posd_checkpoint(
        o.socket, o.pid, dir, o.async, [&](uint64_t d, uint64_t n) { say("gpu", d, n); },
        [&](uint64_t) {
          std::lock_guard<std::mutex> lk(mu);
          cut = true;
          cv.notify_all();
        },
        pp.prev_dir, o.lazy_ok, o.peer, o.gpu_written);
    if (res.ok() && o.gpu_part_done) o.gpu_part_done(*token, arena_bytes, pp.owner);
    std::lock_guard<std::mutex> lk(mu);
    gpu = std::move(res);
    finished = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return cut || finished; });
  }
  r.cut_s = seconds_since(t);
  ckpt::fault_point("job-dump-cut");
  auto gpu_failed = [&]() -> bool {
    std::lock_guard<std::mutex> lk(mu);
    return finished && !gpu.ok();
  };
  if (gpu_failed()) {
    drain.join();
    return undo(gpu.status().with_context("saving the GPU state"));
  }

  if (o.gpu_only) {
    // The process stays as it is, detached: its GPU state is all this image holds.
    drain.join();
    r.gpu_s = seconds_since(t0) - r.detach_s;
    if (!gpu.ok()) return undo(gpu.status().with_context("saving the GPU state"));
    r.gpu = *gpu;
    if (Status s = write_small_file(dir + "/token", *token + "\n", 0600); !s.ok()) return undo(s);
    auto img = ckpt::ImageReader::open_dir(dir + "/gpu");
    if (!img.ok()) return undo(img.status().with_context("reading back the GPU part"));
    r.job = printable((*img)->client().client().job_name());
    r.token = *token, r.arena_bytes = arena_bytes, r.owner = pp.owner;
    r.permit = permit;
    r.total_s = seconds_since(t0);
    return r;
  }

  say("criu");
  t = std::chrono::steady_clock::now();
  r.criu_dir = dir + "/criu";
  ckpt::CriuDumpOptions co;
  co.progress = [&](uint64_t d, uint64_t n) { say("criu", d, n); };
  co.leave_running = o.leave_running;
  if (stopped) co.extra.push_back("--leave-stopped");
  // A job started from a shell shares its session: CRIU must be told so.
  co.shell_job = ::getsid(static_cast<pid_t>(o.pid)) != static_cast<pid_t>(o.pid);
  // A job left running may be dumped again with this image as --prev: tracking makes that one
  // incremental. The previous CPU part is the parent only if it was tracked too.
  co.track_mem = pp.tracks_memory && o.leave_running;
  if (!pp.prev_dir.empty()) {
    if (pp.tracks_memory && pp.prev.criu_track_mem && !pp.prev.criu.empty()) {
      co.prev_images_dir = relative_to(pp.prev_dir + "/" + pp.prev.criu, r.criu_dir);
      co.track_mem = true;
      r.criu_incremental = true;
    } else {
      r.criu_note = !pp.tracks_memory ? "this kernel tracks no dirty memory (criu check --feature mem_dirty_track), "
                                        "so CRIU saved all of the job's memory"
                                      : "the previous image's CPU part was not tracked, so CRIU saved all of the "
                                        "job's memory";
    }
  }
  r.criu_track_mem = co.track_mem;
  Status c = ::mkdir(r.criu_dir.c_str(), 0700) == 0 ? ckpt::criu_dump(pp.criu, static_cast<pid_t>(o.pid), r.criu_dir, co)
                                                     : Status::Unavailable("cannot create " + r.criu_dir);
  r.criu_s = seconds_since(t);
  if (!c.ok()) {
    drain.join();
    return undo(c.with_context("saving the CPU state"));
  }
  ckpt::fault_point("job-dump-criu-done");
  if (o.leave_running) {
    // Both parts are cut: the job runs on while the GPU bytes drain.
    say("resume");
    t = std::chrono::steady_clock::now();
    if (Status s = grant_reattach(permit, "", pp.owner); !s.ok()) {
      drain.join();
      return s.with_context("the job was not told to run on");
    }
    r.resume_s = seconds_since(t);
    // The job's calls were held from the detach to the permit (it re-attaches within milliseconds
    // of it); the checks before the detach did not hold it.
    r.pause_s = seconds_since(t_detach);
  }
  drain.join();
  r.gpu_s = seconds_since(t0) - r.detach_s;
  // A job left stopped is let run on if its image cannot be completed.
  auto undo_stopped = [&](const Status& why) -> Status {
    (void)::kill(static_cast<pid_t>(o.pid), SIGCONT);  // first: a stopped job cannot take its permit
    return undo(why);
  };
  if (!gpu.ok()) {
    if (stopped) return undo_stopped(gpu.status().with_context("saving the GPU state"));
    // The job runs on; the image is not complete.
    remove_parts();
    return gpu.status().with_context("saving the GPU state");
  }
  r.gpu = *gpu;

  // The token lets the restored job re-attach: the caller's alone.
  auto drop = [&](const Status& why) {
    if (stopped) return undo_stopped(why);
    remove_parts();
    return why;
  };
  ckpt::fault_point("job-dump-before-manifest");
  if (Status s = write_small_file(dir + "/token", *token + "\n", 0600); !s.ok()) return drop(s);
  leave_equal_pages_to_prev(pp, &r);
  r.criu_bytes = bytes_under(r.criu_dir);
  JobManifest m = manifest_base(o, pp, r);
  m.permit = permit;
  m.arena_bytes = arena_bytes;
  m.leave_running = o.leave_running;
  m.shell_job = co.shell_job;
  if (Status s = write_manifest(dir, &m, &r); !s.ok()) return drop(s);
  if (end_at_manifest) ckpt::kill_tree(static_cast<pid_t>(o.pid));  // the image is whole: as CRIU would have
  r.permit = permit;
  r.total_s = seconds_since(t0);
  return r;
}

StatusOr<JobDumpReport> pre_dump_job(const JobDumpOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const char* phase, uint64_t done = 0, uint64_t total = 0) {
    if (o.progress) o.progress(phase, done, total);
  };
  auto prepared = prepare(o);
  if (!prepared.ok()) return prepared.status();
  const Prepared& pp = *prepared;
  const std::string& dir = pp.dir;
  auto remove_parts = [&] {
    for (const char* part : {"gpu", "gpu.partial", "criu", "manifest", "manifest.tmp"}) fs::remove_all(dir + "/" + part);
  };
  JobDumpReport r;
  // Without CRIU's pre-dump, the job's pages are read on a thread of their own while posd drains
  // the GPU part (they need not be one cut, below): a round of pos-cli migrate took the sum of
  // both before.
  JobDumpReport pages;
  std::thread pages_thread;
  auto t = std::chrono::steady_clock::now();
  double pages_s = 0;
  const bool pages_aside = !pp.tracks_memory && o.cpu_pages &&
                           start_thread(&pages_thread, "the pre-dump's page reader", [&, t] {
                             write_cpu_pages(o, pp, &pages);
                             pages_s = seconds_since(t);
                           }).ok();
  const JoinOnExit join_pages(&pages_thread);
  // The GPU state first, copy-on-write: the job's worker stops only for the cut. No detach: a
  // pre-dump is no restore point, so its GPU and CPU parts need not be one cut.
  say("gpu");
  auto gpu = posd_checkpoint(
      o.socket, o.pid, dir, /*async=*/true, [&](uint64_t d, uint64_t n) { say("gpu", d, n); },
      [&](uint64_t) { r.cut_s = seconds_since(t); }, pp.prev_dir, o.lazy_ok, /*peer=*/false, o.gpu_written);
  r.gpu_s = seconds_since(t);
  if (pages_thread.joinable()) pages_thread.join();
  if (!gpu.ok()) {
    remove_parts();
    return gpu.status().with_context("saving the GPU state");
  }
  r.gpu = *gpu;
  // CRIU's pre-dump freezes the tree only while it collects the pages, and turns tracking on.
  say("criu");
  t = std::chrono::steady_clock::now();
  const bool shell_job = ::getsid(static_cast<pid_t>(o.pid)) != static_cast<pid_t>(o.pid);
  if (pp.tracks_memory) {
    r.criu_dir = dir + "/criu";
    ckpt::CriuDumpOptions co;
    co.progress = [&](uint64_t d, uint64_t n) { say("criu", d, n); };
    co.pre_dump = true;
    co.track_mem = true;
    co.shell_job = shell_job;
    if (!pp.prev_dir.empty() && pp.prev.criu_track_mem && !pp.prev.criu.empty()) {
      co.prev_images_dir = relative_to(pp.prev_dir + "/" + pp.prev.criu, r.criu_dir);
      r.criu_incremental = true;
    }
    Status c = ::mkdir(r.criu_dir.c_str(), 0700) == 0 ? ckpt::criu_dump(pp.criu, static_cast<pid_t>(o.pid), r.criu_dir, co)
                                                       : Status::Unavailable("cannot create " + r.criu_dir);
    if (!c.ok()) {
      remove_parts();
      return c.with_context("pre-dumping the CPU state");
    }
    r.criu_track_mem = true;
    r.criu_bytes = bytes_under(r.criu_dir);
  } else if (o.cpu_pages) {
    // What CRIU's pre-dump would hold, without freezing the job: its pages as they are read
    // (beside the GPU part's drain, above, unless no thread could start).
    if (pages_aside) {
      r.criu_dir = pages.criu_dir, r.criu_bytes = pages.criu_bytes, r.criu_note = pages.criu_note;
      r.criu_incremental = pages.criu_incremental, r.criu_pages_to_parent = pages.criu_pages_to_parent;
    } else {
      write_cpu_pages(o, pp, &r);
    }
    const std::string why = "this kernel tracks no dirty memory (criu check --feature mem_dirty_track): ";
    r.criu_note = why + (r.criu_dir.empty() ? r.criu_note
                                            : "the CPU part is the job's pages, read while it runs, for a dump --prev "
                                              "of this image to compare with" +
                                                  (r.criu_note.empty() ? std::string() : "; " + r.criu_note));
  } else {
    r.criu_note = "this kernel tracks no dirty memory (criu check --feature mem_dirty_track): the CPU part is not "
                  "pre-dumped, and a dump --prev of this image saves all of the job's memory";
  }
  r.criu_s = pages_aside ? pages_s : seconds_since(t);
  JobManifest m = manifest_base(o, pp, r);
  m.kind = "pre-dump";
  m.permit.clear();
  m.arena_bytes = 0;
  m.leave_running = true;
  m.shell_job = shell_job;
  m.criu = r.criu_dir.empty() ? "" : "criu";
  if (Status s = write_manifest(dir, &m, &r); !s.ok()) {
    remove_parts();
    return s;
  }
  r.total_s = seconds_since(t0);
  return r;
}

namespace {

// A number or a string of the one-line JSON objects the job's runtime answers with.
double json_number(const std::string& j, const std::string& key) {
  const size_t at = j.find("\"" + key + "\":");
  return at == std::string::npos ? 0 : std::strtod(j.c_str() + at + key.size() + 3, nullptr);
}
uint64_t json_u64(const std::string& j, const std::string& key) {  // exact above 2^53 (cut ids)
  const size_t at = j.find("\"" + key + "\":");
  return at == std::string::npos ? 0 : std::strtoull(j.c_str() + at + key.size() + 3, nullptr, 10);
}
std::string json_text(const std::string& j, const std::string& key) {
  const size_t at = j.find("\"" + key + "\":\"");
  if (at == std::string::npos) return "";
  std::string out;
  for (size_t i = at + key.size() + 4; i < j.size() && j[i] != '"'; ++i) {
    if (j[i] == '\\' && i + 1 < j.size()) ++i;
    out += j[i];
  }
  return out;
}

Status sync_files(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    UniqueFd f(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (!f || ::fsync(f.get()) != 0) return Status::Unavailable("cannot sync " + p + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

// A job's answer that refused: why, as the job said it; a job that has not used the GPU yet says
// so apart (job_not_started).
Status job_refusal(const std::string& answer) {
  const std::string why = json_text(answer, "error");
  if (answer.find("\"not_yet\":true") != std::string::npos) return job_not_started_error(why);
  return Status::FailedPrecondition(why.empty() ? "the job answered: " + printable(answer, 200) : why);
}

// One dump command to the job; its answer when it says ok, else its error.
StatusOr<std::string> ask_dump(const std::string& socket, const std::string& command) {
  // Saving or loading many GiB takes seconds: the bound is for a job that stopped answering.
  auto a = ask_job(socket, command, 600'000);
  if (!a.ok()) return a.status();
  if (a->find("\"ok\":true") == std::string::npos) return job_refusal(*a);
  return *a;
}

// Brings an in-process job back if this process dies mid-dump: a child waiting on a socket from
// this process that, at end-of-file without the word that the dump is over, becomes `pos-cli
// resume` (exec, with every string made before the fork: nothing else runs in the child). Once the
// job's device memory has been handed off, the child holds descriptors of it too (hold()), and
// passes them on as descriptors 3.. with `--shared-fds COUNT:LIST`, so the memory outlives this
// process and goes back to the job.
class DriverJobGuardian {
 public:
  DriverJobGuardian(const std::string& program, uint32_t pid, const std::string& job_socket) {
    if (program.empty()) return;
    // The job's start time: a process restored (or started) later under this pid is not resumed.
    args_ = {program, "resume", "-t", std::to_string(pid), "--job-socket", job_socket, "--start-time",
             std::to_string(process_start_time(pid)), "--shared-fds", std::string(48, '\0')};
    for (std::string& a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    held_.assign(kMaxFds, -1);
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(sv[0]);
      serve(sv[1]);
    }
    ::close(sv[1]);
    if (child < 0) {
      ::close(sv[0]);
      return;
    }
    pid_ = child, fd_ = sv[0];
  }
  ~DriverJobGuardian() {
    if (pid_ <= 0) return;
    (void)!::write(fd_, "x", 1);
    ::close(fd_);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  DriverJobGuardian(const DriverJobGuardian&) = delete;
  DriverJobGuardian& operator=(const DriverJobGuardian&) = delete;

  // The guardian holds `fds` (duplicates) before the job lets go of its memory; `list` is the
  // job's allocation-list checksum, `cut` the dump's cut. kUnavailable without a guardian or when it
  // did not confirm.
  Status hold(const std::vector<int>& fds, uint32_t list, uint64_t cut) {
    if (pid_ <= 0) return Status::Unavailable("no guardian");
    char head[40];
    std::snprintf(head, sizeof(head), "L%010u%020llu", list, static_cast<unsigned long long>(cut));
    POS_RETURN_IF_ERROR(send_all(fd_, head, 31));
    for (size_t i = 0; i < fds.size(); i += kFdsPerByte) {
      const std::vector<int> part(fds.begin() + static_cast<long>(i),
                                  fds.begin() + static_cast<long>(std::min(fds.size(), i + kFdsPerByte)));
      POS_RETURN_IF_ERROR(send_line_with_fds(fd_, "f", part));  // "f" then a newline: two bytes
    }
    POS_RETURN_IF_ERROR(send_all(fd_, "k", 1));
    char ack = 0;
    POS_RETURN_IF_ERROR(recv_all(fd_, &ack, 1));
    if (ack != 'k') return Status::Unavailable("the guardian did not confirm the descriptors");
    return Status::Ok();
  }

 private:
  // The child: only system calls and memory made before the fork.
  [[noreturn]] void serve(int sock) {
    size_t n = 0;
    char list[30];  // the list's checksum (10 digits) and the cut (20)
    for (char& d : list) d = '0';
    alignas(cmsghdr) char ctl[CMSG_SPACE(kFdsPerByte * sizeof(int))];
    for (;;) {
      char c = 0;
      iovec iov{&c, 1};
      msghdr m{};
      m.msg_iov = &iov, m.msg_iovlen = 1, m.msg_control = ctl, m.msg_controllen = sizeof(ctl);
      const ssize_t r = ::recvmsg(sock, &m, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r == 1 && c == 'x') ::_exit(0);
      if (r == 1) {
        for_each_received_fd(&m, [&](int got) {
          if (n < held_.size()) held_[n++] = got;
          else ::close(got);
        });
        if (c == 'L')
          for (char& d : list)
            while (::read(sock, &d, 1) < 0 && errno == EINTR) {
            }
        if (c == 'k') (void)!::write(sock, "k", 1);
        continue;
      }
      break;  // end-of-file (or an error): this process is gone without saying the dump is over
    }
    static const char kMsg[] = "pos-cli: the dump or move ended early (its process was killed); bringing the job back\n";
    (void)!::write(2, kMsg, sizeof(kMsg) - 1);
    // The descriptors as 3, 4, ...: first all above that range, then into it.
    const int top = 3 + static_cast<int>(n);
    for (size_t i = 0; i < n; ++i) {
      const int moved = ::fcntl(held_[i], F_DUPFD, top);
      ::close(held_[i]);
      held_[i] = moved;
    }
    for (size_t i = 0; i < n; ++i) {
      if (held_[i] >= 0) (void)::dup2(held_[i], 3 + static_cast<int>(i));
      ::close(held_[i]);
    }
    // "--shared-fds COUNT:LIST:CUT" in the argument made before the fork.
    char* out = argv_[9];
    char digits[24];
    int k = 0;
    size_t v = n;
    do digits[k++] = static_cast<char>('0' + v % 10), v /= 10;
    while (v > 0);
    while (k > 0) *out++ = digits[--k];
    *out++ = ':';
    for (int i = 0; i < 10; ++i) *out++ = list[i];
    *out++ = ':';
    for (int i = 10; i < 30; ++i) *out++ = list[i];
    *out = '\0';
    if (n == 0) argv_[8] = nullptr;  // nothing was handed off: a plain resume
    ::execv(argv_[0], argv_.data());
    ::_exit(127);
  }

  std::vector<std::string> args_;
  std::vector<char*> argv_;
  std::vector<int> held_;
  pid_t pid_ = -1;
  int fd_ = -1;
};

// The job's device (the census's first), from its `ps` answer.
int job_device(const std::string& ps) {
  const size_t at = ps.find("\"devices\":[");
  if (at == std::string::npos) return 0;
  const char* p = ps.c_str() + at + 11;
  return (*p >= '0' && *p <= '9') ? std::atoi(p) : 0;
}

// The allocation list of a dump-share answer ("regions":[[addr,size],...]) or a snap-cut answer
// ("regions":[[addr,size,written],...]: `written` gets the flags) on device `dev`.
StatusOr<std::vector<ckpt::SavedRegion>> shared_regions(const std::string& answer, int dev,
                                                        std::vector<bool>* written = nullptr) {
  const size_t at = answer.find("\"regions\":[");
  if (at == std::string::npos) return Status::Corrupt("the job's answer lists no allocations");
  std::vector<ckpt::SavedRegion> out;
  const char* p = answer.c_str() + at + 11;
  while (*p == '[' || *p == ',') {
    if (*p == ',') ++p;
    unsigned long long a = 0, n = 0;
    int used = 0, w = 0;
    if (written == nullptr ? std::sscanf(p, "[%llu,%llu]%n", &a, &n, &used) != 2
                           : std::sscanf(p, "[%llu,%llu,%d]%n", &a, &n, &w, &used) != 3 || (w != 0 && w != 1))
      return Status::Corrupt("the job's allocation list is malformed");
    if (used == 0) return Status::Corrupt("the job's allocation list is malformed");
    if (n == 0 || (!out.empty() && a < out.back().addr + out.back().size))
      return Status::Corrupt("the job's allocation list is not in address order");
    ckpt::SavedRegion r;
    r.dev = dev, r.addr = a, r.size = n;
    out.push_back(r);
    if (written != nullptr) written->push_back(w == 1);
    p += used;
  }
  if (*p != ']') return Status::Corrupt("the job's allocation list is malformed");
  return out;
}

// Gives `owner` the files this (root) process wrote in `dir`, so that the job's own user can
// read its image back (dump-resume DIR).
void give_files(const std::string& dir, uid_t owner) {
  if (owner == ::geteuid()) return;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    (void)::lchown(e.path().c_str(), owner, static_cast<gid_t>(-1));
}

}  // namespace

namespace {
StatusOr<std::string> take_command(const std::string& socket, const std::vector<int>& fds, uint32_t list, uint64_t cut,
                                   int lazy_flag) {
  std::string cmd = "dump-take " + std::to_string(fds.size()) + " " + std::to_string(list) + " " + std::to_string(cut);
  std::vector<int> give = fds;
  if (lazy_flag >= 0) {
    cmd += " lazy " + std::to_string(::getpid());
    give.push_back(lazy_flag);
  }
  auto a = ask_job_fds(socket, cmd, give, 600'000);
  if (!a.ok()) return a.status();
  if (a->text.find("\"ok\":true") == std::string::npos)
    return Status::FailedPrecondition(json_text(a->text, "error").empty() ? printable(a->text, 200) : json_text(a->text, "error"));
  return std::move(a->text);
}
}  // namespace

StatusOr<std::string> hand_back_memory(const std::string& socket, const std::vector<int>& fds, uint32_t list,
                                       uint64_t cut) {
  return take_command(socket, fds, list, cut, -1);
}

StatusOr<std::string> hand_back_memory(const std::string& socket, const driver::HeldMemory& held, uint32_t list,
                                       uint64_t cut, int lazy_flag) {
  auto fds = held.descriptors();
  if (!fds.ok()) return Status::FailedPrecondition(fds.status().message() + ": nothing handed back");
  std::vector<int> give;
  for (const UniqueFd& f : *fds) give.push_back(f.get());
  return take_command(socket, give, list, cut, lazy_flag);
}

StatusOr<std::string> resume_driver_job(const std::string& job_socket, uint32_t pid, const std::vector<int>& shared_fds,
                                        uint32_t list, uint64_t cut, uint64_t start_time) {
  if (start_time != 0 && process_start_time(pid) != start_time)
    return Status::FailedPrecondition("pid " + std::to_string(pid) +
                                      " is not the process the dump held (it ended; the pid now names a process started "
                                      "later, a restore of the job, say): nothing resumed");
  auto driver = ckpt::DriverCheckpoint::open();
  if (!driver.ok()) return driver.status();
  // A migration's stop dump leaves the job stopped (CRIU's --leave-stopped): it must run to be restored.
  (void)::kill(static_cast<pid_t>(pid), SIGCONT);
  POS_RETURN_IF_ERROR((*driver)->release(static_cast<pid_t>(pid)).with_context("the driver's restore"));
  // The memory was handed off: these descriptors are all that hold it.
  if (!shared_fds.empty()) return hand_back_memory(job_socket, shared_fds, list, cut);
  auto a = ask_job(job_socket, cut != 0 ? "dump-resume @" + std::to_string(cut) : std::string("dump-resume"), 600'000);
  if (!a.ok()) return a.status();
  if (a->find("nothing to resume") != std::string::npos) return std::string("not held");
  if (a->find("\"ok\":true") == std::string::npos)
    return Status::FailedPrecondition(json_text(*a, "error").empty() ? printable(*a, 200) : json_text(*a, "error"));
  return *a;
}

// An in-process job's --prev: its GPU part's table (its chain checked whole), or why it cannot be
// one. A dump keeps only what was written since it when it is the job's last cut.
StatusOr<ckpt::RegionTable> driver_prev(const Prepared& pp) {
  if (pp.prev_dir.empty()) return ckpt::RegionTable{};
  if (pp.prev.kind != "driver-dump" && pp.prev.kind != "driver-pre-dump")
    return Status::InvalidArgument("the previous image " + pp.prev_dir + " is not an in-process job's image");
  auto t = open_driver_gpu_part(pp.prev_dir + "/" + pp.prev.gpu, pp.prev);
  if (!t.ok()) return t.status().with_context("the previous image");
  auto chain = driver_image_parents(pp.prev_dir, pp.prev);
  if (!chain.ok()) return chain.status();
  return t;
}

// The copy threads of an in-process job's device memory written while the job runs on: they
// yield the CPU to it (nice 19), and the environment may tune them (docs/configuration.md):
// POS_IMAGE_THREADS (1..64 copy threads, each with a memory file), POS_IMAGE_SCHED (`nice`, or
// `idle`: SCHED_IDLE), POS_IMAGE_PIECE (a size checksummed and written at a time, a multiple of
// 4 KiB dividing the 8 MiB chunk; 0: whole chunks).
Status running_writer_options(driver::CopyOptions* co) {
  co->nice = 19;
  const auto set = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = set("POS_IMAGE_THREADS")) {
    auto n = parse_uint(v);
    if (!n.ok() || *n < 1 || *n > 64)
      return Status::InvalidArgument("POS_IMAGE_THREADS must be a number from 1 to 64, not '" + printable(v, 40) + "'");
    co->threads = static_cast<int>(*n);
  }
  if (const char* v = set("POS_IMAGE_PIECE")) {
    auto n = parse_size(v);
    if (!n.ok() || *n % 4096 != 0 || *n > co->chunk || (*n != 0 && co->chunk % *n != 0))
      return Status::InvalidArgument("POS_IMAGE_PIECE must be 0 or a multiple of 4 KiB that divides " +
                                     std::to_string(co->chunk) + " bytes (256KiB, say), not '" + printable(v, 40) + "'");
    co->piece = *n;
  }
  if (const char* v = set("POS_IMAGE_SCHED")) {
    if (std::strcmp(v, "idle") == 0) co->idle = true;
    else if (std::strcmp(v, "nice") != 0)
      return Status::InvalidArgument("POS_IMAGE_SCHED must be 'nice' or 'idle', not '" + printable(v, 40) + "'");
  }
  return Status::Ok();
}

// CopyOptions::unchanged for an incremental image: the previous image's chain as PreviousChunks,
// so that the image leaves to it the chunks it holds byte for byte (any earlier image of the job
// will do: the bytes are compared). Empty without --prev, or when it cannot be read (the image is
// then stored whole, which is correct).
std::function<bool(uint64_t, uint64_t, size_t, uint32_t, const void*, uint64_t)> unchanged_in_prev(const Prepared& pp) {
  if (pp.prev_dir.empty()) return {};
  std::vector<std::string> dirs = {pp.prev_dir + "/" + pp.prev.gpu};
  auto parents = driver_image_parents(pp.prev_dir, pp.prev);
  if (!parents.ok()) return {};
  dirs.insert(dirs.end(), parents->begin(), parents->end());
  auto p = driver::PreviousChunks::open(dirs);
  if (!p.ok()) return {};
  auto previous = std::make_shared<const driver::PreviousChunks>(std::move(*p));
  return [previous](uint64_t a, uint64_t size, size_t i, uint32_t crc, const void* b, uint64_t n) {
    return previous->unchanged(a, size, i, crc, b, n);
  };
}

// DIR/gpu made durable (its table, memory files and directory, then DIR): the bytes are in the
// page cache already.
Status sync_gpu_part(const std::string& gpu_dir, const std::string& dir) {
  std::vector<std::string> parts = {gpu_dir + "/regions", gpu_dir, dir};
  if (auto table = ckpt::read_region_table(gpu_dir); table.ok())
    for (uint32_t f = 0; f < table->files; ++f) parts.push_back(gpu_dir + "/" + ckpt::memory_file_name(f));
  return sync_files(parts);
}

// The job's GPUs as its `gpus` answer names them (asked before anything stops it: the driver's
// lock would hold the queries), into the manifest. A job whose library predates the question, or
// whose driver cannot say, leaves them unknown: the image then restores only onto its own GPU.
void record_gpus(const std::string& gpus, JobManifest* m) {
  std::map<std::string, FlatJsonValue> v;
  if (!parse_flat_json(gpus, "the job's GPU list", &v).ok()) return;
  const auto text = [&](const char* key) {
    auto it = v.find(key);
    return it != v.end() && it->second.kind == FlatJsonValue::kString ? it->second.s : std::string();
  };
  auto ok = v.find("ok");
  if (ok == v.end() || ok->second.kind != FlatJsonValue::kBool || !ok->second.b) return;
  const std::string used = text("gpu_uuids"), seen = text("gpus_visible");
  if (!driver::split_gpu_uuids(used).ok() || !driver::split_gpu_uuids(seen).ok()) return;
  m->gpu_uuids = used;
  m->gpus_visible = seen;
  m->gpu_name = printable(text("gpu_name"), 128);
}

// This process's ordinal of the GPU the job uses, found by the UUID its `gpus` answer names: the
// job's own ordinal (`job_dev`) counts in its view, which its CUDA_VISIBLE_DEVICES may narrow.
// `job_dev` when the job cannot say or this process cannot see that GPU.
int local_device(void* driver, const std::string& gpus, int job_dev) {
  JobManifest m;
  record_gpus(gpus, &m);
  auto used = driver::split_gpu_uuids(m.gpu_uuids);
  if (!used.ok() || used->empty()) return job_dev;
  auto host = driver::list_gpus(driver::gpu_id_calls([driver](const char* name) { return ::dlsym(driver, name); }));
  if (!host.ok()) return job_dev;
  for (size_t i = 0; i < host->size(); ++i)
    if ((*host)[i].uuid == used->front()) return static_cast<int>(i);
  return job_dev;
}

DeviceContexts::~DeviceContexts() {
  if (dev_ >= 0) (void)release_(dev_);
}

Status DeviceContexts::keep(void* driver, int dev) {
  if (dev == dev_) return Status::Ok();
  const driver::CopyCalls c = driver::peer_calls(driver).copy;  // the calls HeldMemory makes it with
  if (c.primary_ctx_retain == nullptr || c.primary_ctx_release == nullptr)
    return Status::Unsupported("the driver has no primary contexts");
  driver::CUcontext ctx = nullptr;
  if (const driver::CUresult rc = c.primary_ctx_retain(&ctx, dev); rc != 0)
    return Status::Unavailable("cuDevicePrimaryCtxRetain failed: CUDA driver error " + std::to_string(rc));
  if (dev_ >= 0) (void)release_(dev_);
  release_ = c.primary_ctx_release, dev_ = dev;
  return Status::Ok();
}

// The caller's kept context of the job's device, if it keeps one (a policy, a migration). Best
// effort: without it, HeldMemory makes its own (and says why it could not), as for a lone dump.
void keep_context(const JobDumpOptions& o, void* driver, int dev) {
  if (o.contexts != nullptr) (void)o.contexts->keep(driver, dev);
}

// The manifest of an in-process job's image (kind "driver-dump" or "driver-pre-dump"), and the
// report's bytes: chunks left to the previous image (`same_bytes`) count as its bytes, not this
// one's, though the table's stored regions still name them (the manifest's gpu_bytes is theirs).
// `prev` is named when the image inherits anything. `gpus`: the job's answer to `gpus`.
JobManifest driver_manifest(const char* kind, const JobDumpOptions& o, const Prepared& pp, const std::string& ps,
                            const std::string& gpus, uint64_t cut, bool inherits, uint64_t same_bytes,
                            JobDumpReport* r) {
  JobManifest m;
  record_gpus(gpus, &m);
  m.kind = kind;
  m.pid = o.pid;
  m.uid = pp.owner;
  m.job = printable(json_text(ps, "job"), 64);
  m.socket = o.job_socket;
  m.cut = cut;
  m.handles = r->gpu.handles;
  m.gpu_bytes = r->gpu.bytes_stored;
  r->gpu.bytes_stored -= same_bytes;
  r->gpu.bytes_referenced += same_bytes;
  if (inherits || same_bytes > 0) {
    m.prev = relative_to(pp.prev_dir, pp.dir);
    m.gpu_bytes_referenced = r->gpu.bytes_referenced;
  }
  return m;
}

// The allocations an incremental image inherits: not written since the job's last cut (`since`),
// which must be the previous image's, and held by that image. Empty when the image must be whole
// (*why then says so, if there was a previous image).
std::vector<ckpt::SavedRegion> inheritable(const Prepared& pp, const ckpt::RegionTable& prev, uint64_t since,
                                           const std::vector<ckpt::SavedRegion>& regions,
                                           const std::vector<bool>& written, std::string* why) {
  std::vector<ckpt::SavedRegion> out;
  if (pp.prev_dir.empty()) return out;
  if (since == 0 || since != pp.prev.cut) {
    *why = "the previous image is not of this job's last checkpoint or dump (a later one was taken, or it was "
           "restored from another image): every allocation is stored, but for chunks found byte for byte in it";
    return out;
  }
  const std::vector<ckpt::SavedRegion> held = prev.allocations();
  for (size_t i = 0; i < regions.size(); ++i) {
    if (written[i]) continue;
    const ckpt::SavedRegion& r = regions[i];
    if (std::any_of(held.begin(), held.end(), [&](const ckpt::SavedRegion& h) {
          return h.addr == r.addr && h.size == r.size && h.dev == r.dev;
        }))
      out.push_back(ckpt::SavedRegion{r.dev, r.addr, r.size, 0, {}});
  }
  return out;
}

StatusOr<JobDumpReport> dump_driver_job(const JobDumpOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  // Called from this thread and, with the hand-off, from the thread writing device memory.
  std::mutex say_mu;
  auto say = [&](const char* phase, uint64_t done = 0, uint64_t total = 0) {
    std::lock_guard<std::mutex> lk(say_mu);
    if (o.progress) o.progress(phase, done, total);
  };
  if (o.async) return Status::Unsupported("--mode async is not built for in-process jobs yet: use --mode sync");
  driver::CopyOptions running_co;  // the writers' settings for a copy written while the job runs on
  POS_RETURN_IF_ERROR(running_writer_options(&running_co));  // a bad one refused before anything is touched
  auto prepared = prepare(o);
  if (!prepared.ok()) return prepared.status();
  const Prepared& pp = *prepared;
  const std::string& dir = pp.dir;
  auto prev_table = driver_prev(pp);
  if (!prev_table.ok()) return prev_table.status();
  std::vector<ckpt::SavedRegion> inherited;  // with --prev: what the image leaves to the previous one
  const auto unchanged = unchanged_in_prev(pp);
  uint64_t cut = 0, same_bytes = 0;
  // The driver's checkpoint calls, and the job's answer, before anything is stopped.
  auto driver = ckpt::DriverCheckpoint::open();
  if (!driver.ok()) return driver.status();
  auto ps = ask_job(o.job_socket, "ps");
  if (!ps.ok()) return ps.status().with_context("asking the job");
  auto asked_gpus = ask_job(o.job_socket, "gpus");
  const std::string gpus = asked_gpus.ok() ? *asked_gpus : std::string();
  const std::string gpu_dir = dir + "/gpu";
  auto remove_parts = [&] {
    for (const char* part : {"gpu", "criu", "manifest", "manifest.tmp"}) fs::remove_all(dir + "/" + part);
  };
  // The job writes its device memory itself, as its own user.
  if (::mkdir(gpu_dir.c_str(), 0700) != 0) return Status::Unavailable("cannot create " + gpu_dir + ": " + std::strerror(errno));
  if (pp.owner != ::geteuid() && ::chown(gpu_dir.c_str(), pp.owner, static_cast<gid_t>(-1)) != 0) {
    remove_parts();
    return Status::Unavailable("cannot give " + gpu_dir + " to the job's user: " + std::strerror(errno));
  }
  JobDumpReport r;
  const pid_t pid = static_cast<pid_t>(o.pid);
  // What gives the job back checks first that the pid still names it: killed mid-dump and restored
  // from an image, a new process has the pid and the socket, and is not this dump's to touch.
  const uint64_t started = process_start_time(o.pid);
  // (Unknown start time: /proc unreadable here. Then the pid is taken to be the job, as before.)
  const auto same_job = [&] { return started == 0 || process_start_time(o.pid) == started; };
  DriverJobGuardian guardian(o.resume_program, o.pid, o.job_socket);
  // A dump that ends the job ends it only once its image is whole (dump_job's reason).
  const bool end_at_manifest = !o.leave_running && !o.leave_stopped;
  const bool stopped = o.leave_stopped || end_at_manifest;
  // The hand-off's side here (docs/driver_runtime.md, "Dump and restore"): this process's own
  // context on the job's device, made before the job stops. Without it the job copies.
  const int dev = job_device(*ps);
  const int here = local_device((*driver)->library(), gpus, dev);
  keep_context(o, (*driver)->library(), here);
  std::unique_ptr<driver::HeldMemory> held;
  std::string no_handoff;
  if (auto h = driver::HeldMemory::open(driver::peer_calls((*driver)->library()), here); h.ok()) held = std::move(*h);
  else no_handoff = h.status().message();
  // With --leave-running the job need not wait for its image: a device-side copy of its memory
  // (made ahead, the size from its census) is written after the memory went back.
  bool shadow = false;
  if (held && o.leave_running) {
    const size_t at = ps->find("\"placement\":{");
    const double bytes = at == std::string::npos ? 0 : json_number(ps->substr(at), "live_bytes");
    shadow = bytes > 0 && held->reserve_shadow(static_cast<uint64_t>(bytes)).ok();
  }
  say("gpu");
  auto t = std::chrono::steady_clock::now();
  const auto t_stop = t;
  std::thread writer;
  Status written = Status::Ok();
  std::chrono::steady_clock::time_point written_at;
  uint32_t list = 0;
  bool handed = false;
  const auto start_writer = [&] {
    writer = std::thread([&] {
      // Written from the device copy while the job runs on: the writers yield to it.
      driver::CopyOptions co = o.leave_running && shadow ? running_co : driver::CopyOptions{};
      co.progress = [&](uint64_t dn, uint64_t n) { say("gpu", dn, n); };
      co.inherited = inherited;
      co.unchanged = unchanged;
      auto saved = held->save(gpu_dir, co);
      written = saved.ok() ? Status::Ok() : saved.status();
      if (saved.ok()) same_bytes = saved->same_bytes;
      written_at = std::chrono::steady_clock::now();
      // (Not for the copy written after the job ran on: that image is the caller's at the end.)
      if (saved.ok() && !shadow && o.gpu_part_done) o.gpu_part_done("", 0, pp.owner);
    });
  };
  if (held) {
    auto shared = ask_job_fds(o.job_socket, "dump-share", {}, 600'000);
    if (!shared.ok()) {
      remove_parts();
      return shared.status().with_context("asking the job for its device memory");
    }
    if (shared->text.find("\"ok\":true") != std::string::npos) {
      handed = r.handoff = true;
      const std::string& a = shared->text;
      list = static_cast<uint32_t>(json_number(a, "list"));
      r.detach_s = json_number(a, "quiesce_s");
      r.job_save_s = json_number(a, "export_s");
      r.note = json_text(a, "note");
      cut = json_u64(a, "cut");
      // From here until dump-release the job holds its memory too: giving up is dump-resume.
      auto back_out = [&](const Status& why) -> Status {
        if (same_job()) (void)ask_dump(o.job_socket, "dump-resume @" + std::to_string(cut));
        remove_parts();
        return why;
      };
      std::vector<bool> marked;
      auto regions = shared_regions(a, dev, &marked);
      if (!regions.ok()) return back_out(regions.status());
      std::string whole;
      inherited = inheritable(pp, *prev_table, json_u64(a, "since"), *regions, marked, &whole);
      add_note(&r.note, whole);
      std::vector<int> raw;
      for (const UniqueFd& f : shared->fds) raw.push_back(f.get());
      if (Status g = guardian.hold(raw, list, cut); !g.ok() && !o.resume_program.empty())
        return back_out(g.with_context("the guardian could not hold the job's device memory"));
      if (Status im = held->import(*regions, std::move(shared->fds)); !im.ok())
        return back_out(im.with_context("importing the job's device memory"));
      auto rel = ask_dump(o.job_socket, "dump-release");
      if (!rel.ok()) {
        // Whatever was unmapped comes back from the descriptors held here.
        if (same_job()) (void)hand_back_memory(o.job_socket, *held, list, cut);
        remove_parts();
        return rel.status().with_context("the job could not let go of its device memory");
      }
      r.job_unmap_s = json_number(*rel, "unmap_s");
      r.cut_s = seconds_since(t_stop);
      r.gpu.bytes_referenced = 0;
      for (const ckpt::SavedRegion& i : inherited) r.gpu.bytes_referenced += i.size;
      r.gpu.bytes_stored = held->bytes() - r.gpu.bytes_referenced;
      r.gpu.handles = held->regions().size();
      r.gpu.image = gpu_dir;
      // The copy is taken now (milliseconds) and written once the job runs again; without it the
      // image's device part is written from here while the driver and CRIU do theirs.
      if (shadow) shadow = held->snapshot().ok();
      r.gpu_snapshot = shadow;
      if (!shadow) start_writer();
    } else if (shared->text.find("\"share\":false") != std::string::npos) {
      no_handoff = json_text(shared->text, "error");
      held.reset();
    } else {
      remove_parts();
      return job_refusal(shared->text).with_context("saving the GPU state");
    }
  }
  if (!handed) {
    auto saved = ask_dump(o.job_socket, "dump-save " + gpu_dir);
    if (!saved.ok()) {
      remove_parts();  // the job runs on: a save that fails lets its calls through again
      return saved.status().with_context("saving the GPU state");
    }
    r.detach_s = json_number(*saved, "quiesce_s");
    r.cut_s = r.detach_s;
    r.gpu_s = seconds_since(t);
    r.gpu.bytes_stored = static_cast<uint64_t>(json_number(*saved, "bytes"));
    r.gpu.handles = static_cast<uint64_t>(json_number(*saved, "regions"));
    r.gpu.image = gpu_dir;
    r.note = json_text(*saved, "note");
    r.job_save_s = json_number(*saved, "save_s");
    r.job_unmap_s = json_number(*saved, "unmap_s");
    cut = json_u64(*saved, "cut");
    if (!pp.prev_dir.empty()) r.note += std::string(r.note.empty() ? "" : "; ") + "the job copied its memory itself: saved whole";
    written_at = std::chrono::steady_clock::now();
    if (o.gpu_part_done) o.gpu_part_done("", 0, pp.owner);
  }
  if (!no_handoff.empty()) r.note += (r.note.empty() ? "" : "; ") + std::string("device memory copied by the job (") + no_handoff + ")";
  ckpt::fault_point("driver-dump-saved");
  const auto join_writer = [&] {
    if (!writer.joinable()) return;
    writer.join();
    r.gpu_s = std::chrono::duration<double>(written_at - t_stop).count();
  };
  // The job's memory back: from the descriptors held here (hand-off), else from its image.
  const auto give_back = [&]() -> StatusOr<std::string> {
    if (!handed) return ask_dump(o.job_socket, "dump-resume @" + std::to_string(cut) + " " + gpu_dir);
    return hand_back_memory(o.job_socket, *held, list, cut);
  };
  // From here a failure brings the job back: its driver state restored, its memory given back.
  auto undo = [&](const Status& why) -> Status {
    join_writer();
    if (!same_job()) {  // gone (killed mid-dump): nothing to bring back, and its pid is not ours
      remove_parts();
      return Status::Unavailable("the job ended during the dump (" + why.message() + "); nothing under its pid was touched");
    }
    if (stopped) (void)::kill(pid, SIGCONT);  // CRIU may have left it stopped
    Status back = (*driver)->release(pid);
    if (back.ok()) back = give_back().status();
    remove_parts();
    return back.ok() ? why : why.with_context("the job could not be brought back (" + back.message() + ")");
  };
  say("driver");
  t = std::chrono::steady_clock::now();
  if (!same_job()) return undo(Status::Unavailable("its process is gone"));
  Status d = (*driver)->lock(pid, 10'000);
  if (d.ok()) d = (*driver)->checkpoint(pid);
  r.driver_s = seconds_since(t);
  if (!d.ok()) return undo(d.with_context("the driver's checkpoint"));
  ckpt::fault_point("driver-dump-checkpointed");

  say("criu");
  t = std::chrono::steady_clock::now();
  r.criu_dir = dir + "/criu";
  ckpt::CriuDumpOptions co;
  co.progress = [&](uint64_t dn, uint64_t n) { say("criu", dn, n); };
  co.leave_running = o.leave_running;
  // Left stopped by CRIU: a migration's stop (the caller ends the job once the image is complete)
  // and a dump that ends the job (ended here once the manifest is durable), so that a failure, or
  // this process's death (the guardian resumes it), before then brings it back.
  if (stopped) co.extra.push_back("--leave-stopped");
  if (!same_job()) return undo(Status::Unavailable("its process is gone"));
  co.shell_job = ::getsid(pid) != pid;
  Status c = ::mkdir(r.criu_dir.c_str(), 0700) == 0 ? ckpt::criu_dump(pp.criu, pid, r.criu_dir, co)
                                                     : Status::Unavailable("cannot create " + r.criu_dir);
  r.criu_s = seconds_since(t);
  if (!c.ok()) return undo(c.with_context("saving the CPU state"));
  // The memory must be in the image before the job may write it again.
  join_writer();
  if (!written.ok()) return undo(written.with_context("writing the device memory"));
  ckpt::fault_point("driver-dump-criu-done");
  r.stopped_s = seconds_since(t_stop);
  if (o.leave_running) {
    say("resume");
    t = std::chrono::steady_clock::now();
    Status b = (*driver)->restore(pid);
    if (b.ok()) b = (*driver)->unlock(pid);
    r.driver_restore_s = seconds_since(t);
    if (!b.ok()) return undo(b.with_context("the driver's restore"));
    auto resumed = give_back();
    if (!resumed.ok()) {
      remove_parts();
      return resumed.status().with_context("the job's device memory was not given back (it stays stopped; "
                                           "pos-cli restore of an earlier image, or end it)");
    }
    r.resume_s = seconds_since(t);
    r.pause_s = seconds_since(t_stop);
    r.job_load_s = handed ? json_number(*resumed, "take_s") : json_number(*resumed, "load_s");
    if (r.gpu_snapshot) {  // the job runs on; its image is written from the copy
      start_writer();
      join_writer();
      if (!written.ok()) {
        remove_parts();
        return written.with_context("writing the device memory (the job runs on; no image was made)");
      }
    }
  }
  // A stopped job's memory is freed here (a running one's is its own again); a job to be ended
  // keeps it until then, so that a failure before the manifest can still give it back.
  if (!end_at_manifest) held.reset();
  if (handed) give_files(gpu_dir, pp.owner);
  // Durable once the job runs again.
  t = std::chrono::steady_clock::now();
  if (Status s = sync_gpu_part(gpu_dir, dir); !s.ok()) {
    if (end_at_manifest) return undo(s);
    remove_parts();
    return s;
  }
  r.sync_s = seconds_since(t);
  leave_equal_pages_to_prev(pp, &r);
  r.criu_bytes = bytes_under(r.criu_dir);
  JobManifest m = driver_manifest("driver-dump", o, pp, *ps, gpus, cut, !inherited.empty(), same_bytes, &r);
  if (r.criu_pages_to_parent > 0) {
    // The CPU part needs prev's even where the GPU part inherits nothing: retention keeps it.
    m.criu_parent = true;
    if (m.prev.empty()) m.prev = relative_to(pp.prev_dir, pp.dir);
  }
  m.leave_running = o.leave_running;
  m.shell_job = co.shell_job;
  r.manifest = dir + "/manifest";
  if (Status s = write_small_file(r.manifest, manifest_json(m), 0600); !s.ok()) {
    if (end_at_manifest) return undo(s);
    remove_parts();
    return s;
  }
  if (end_at_manifest) {
    ckpt::kill_tree(pid);  // the image is whole: ended as CRIU would have, then its memory freed
    held.reset();
  }
  r.total_s = seconds_since(t0);
  return r;
}

// Not-ready with CUDA's "initialization error": no other status of a dump is made so (a timeout is
// not-ready with no API error), so a policy cannot mistake a real failure for a job still starting.
Status job_not_started_error(std::string why) {
  return Status(Code::kNotReady, cuda::kErrorInitializationError, std::move(why));
}

bool job_not_started(const Status& s) {
  return s.code() == Code::kNotReady && s.api_error() == cuda::kErrorInitializationError;
}

StatusOr<JobDumpReport> pre_dump_driver_job(const JobDumpOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const char* phase, uint64_t done = 0, uint64_t total = 0) {
    if (o.progress) o.progress(phase, done, total);
  };
  // The job runs on while its copy is written: the writers yield the CPU to it.
  driver::CopyOptions co;
  POS_RETURN_IF_ERROR(running_writer_options(&co));  // a bad one refused before anything is touched
  // The cut's copies run ahead of the job (docs/driver_runtime.md, "GPU-only checkpoints");
  // POS_SNAP_AHEAD=0 orders them before all of its later work instead, as before copy-ahead.
  std::string cut_cmd = "snap-cut";
  if (const char* v = std::getenv("POS_SNAP_AHEAD"); v != nullptr && *v != '\0') {
    if (std::strcmp(v, "0") == 0) cut_cmd = "snap-cut order=all";
    else if (std::strcmp(v, "1") != 0)
      return Status::InvalidArgument("POS_SNAP_AHEAD must be 0 or 1, not '" + printable(v, 40) + "'");
  }
  // The cut waits up to POS_SNAP_ALIGN_MS (default 1000; 0: not at all) for the job's step boundary
  // (a synchronizing call's return), where its copies cost the job's next step least.
  int align_ms = 1000;
  if (const char* v = std::getenv("POS_SNAP_ALIGN_MS"); v != nullptr && *v != '\0') {
    auto ms = parse_uint(v);
    if (!ms.ok() || *ms > 60000)
      return Status::InvalidArgument("POS_SNAP_ALIGN_MS must be a number of milliseconds from 0 to 60000, not '" +
                                     printable(v, 40) + "'");
    align_ms = static_cast<int>(*ms);
  }
  cut_cmd += " align=" + std::to_string(align_ms);
  // The job keeps its device copy for the next cut (o.keep_shadow: a policy's ticks), unless
  // POS_SNAP_KEEP says otherwise (0 or 1).
  bool keep_shadow = o.keep_shadow;
  if (const char* v = std::getenv("POS_SNAP_KEEP"); v != nullptr && *v != '\0') {
    if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0)
      return Status::InvalidArgument("POS_SNAP_KEEP must be 0 or 1, not '" + printable(v, 40) + "'");
    keep_shadow = *v == '1';
  }
  auto prepared = prepare(o, /*criu_needed=*/false);
  if (!prepared.ok()) return prepared.status();
  const Prepared& pp = *prepared;
  const std::string& dir = pp.dir;
  auto prev_table = driver_prev(pp);
  if (!prev_table.ok()) return prev_table.status();
  auto driver = ckpt::DriverCheckpoint::open();  // for the driver library this process maps the copy with
  if (!driver.ok()) return driver.status();
  auto ps = ask_job(o.job_socket, "ps");
  if (!ps.ok()) return ps.status().with_context("asking the job");
  auto asked_gpus = ask_job(o.job_socket, "gpus");
  const std::string gpus = asked_gpus.ok() ? *asked_gpus : std::string();
  const int dev = job_device(*ps);
  const int here = local_device((*driver)->library(), gpus, dev);
  keep_context(o, (*driver)->library(), here);
  auto held = driver::HeldMemory::open(driver::peer_calls((*driver)->library()), here);
  if (!held.ok()) return held.status().with_context("opening the job's device here");
  const std::string gpu_dir = dir + "/gpu";
  auto remove_parts = [&] {
    for (const char* part : {"gpu", "criu", "manifest", "manifest.tmp"}) fs::remove_all(dir + "/" + part);
  };
  if (::mkdir(gpu_dir.c_str(), 0700) != 0) return Status::Unavailable("cannot create " + gpu_dir + ": " + std::strerror(errno));
  JobDumpReport r;
  say("gpu");
  auto t = std::chrono::steady_clock::now();
  auto cut = ask_job_fds(o.job_socket, cut_cmd, {}, 600'000);
  if (!cut.ok()) {
    remove_parts();
    return cut.status().with_context("asking the job for a GPU-only checkpoint");
  }
  const std::string& a = cut->text;
  if (a.find("\"ok\":true") == std::string::npos) {
    remove_parts();
    return job_refusal(a).with_context("saving the GPU state");
  }
  // From here the job holds the copy for this process until snap-release (or its next cut or dump,
  // if this process dies first: the job never waits for this one).
  ckpt::fault_point("driver-pre-dump-cut");
  std::vector<bool> written;
  auto regions = shared_regions(a, dev, &written);
  Status got = regions.ok() ? Status::Ok() : regions.status();
  if (got.ok() && cut->fds.size() != 1)
    got = Status::Corrupt("the job sent " + std::to_string(cut->fds.size()) + " descriptors for its copy, not one");
  if (got.ok())
    got = (*held)->import_copy(*regions, std::move(cut->fds[0]), static_cast<uint64_t>(json_number(a, "shadow_bytes")));
  // Without keep_shadow the job lets go of its copy now (this process holds its own reference);
  // with it, once the copy is written, so that the job's next cut copies into the same memory.
  if (!keep_shadow || !got.ok()) {
    auto released = ask_dump(o.job_socket, "snap-release");
    if (!released.ok())
      r.note = "the job did not let go of its copy (" + released.status().message() + "): it does at its next checkpoint or dump";
  }
  if (!got.ok()) {
    remove_parts();
    return got.with_context("taking the job's checkpoint copy");
  }
  r.gpu_shadow_reused = a.find("\"shadow_reused\":true") != std::string::npos;
  r.cut_s = seconds_since(t);
  r.gpu.stall_s = json_number(a, "stall_s");
  r.detach_s = r.gpu.stall_s;
  r.job_save_s = json_number(a, "copy_s");
  r.gpu_ahead = a.find("\"ahead\":true") != std::string::npos;
  r.gpu_ahead_waits = json_u64(a, "ahead_waits");
  r.gpu_align = json_text(a, "align");
  r.gpu_align_s = json_number(a, "align_s");
  r.gpu_pool_free_bytes = json_u64(a, "pool_free_bytes");
  r.gpu.handles = regions->size();
  std::string whole;
  const std::vector<ckpt::SavedRegion> inherited =
      inheritable(pp, *prev_table, json_u64(a, "since"), *regions, written, &whole);
  add_note(&r.note, whole);
  for (const ckpt::SavedRegion& x : inherited) r.gpu.bytes_referenced += x.size;
  for (size_t i = 0; i < regions->size(); ++i) {
    if (!written[i]) {
      r.unwritten.push_back((*regions)[i].addr);
      continue;
    }
    ++r.written_regions;
    r.written_bytes += (*regions)[i].size;
  }
  co.progress = [&](uint64_t dn, uint64_t n) { say("gpu", dn, n); };
  co.inherited = inherited;
  co.unchanged = unchanged_in_prev(pp);
  auto saved = (*held)->save(gpu_dir, co);
  held->reset();  // the copy's device memory goes as soon as it is written (or back to the job, kept)
  if (keep_shadow) {
    auto kept = ask_dump(o.job_socket, "snap-release keep");
    if (!kept.ok()) add_note(&r.note, "the job did not keep its copy for the next checkpoint (" + kept.status().message() + ")");
  }
  if (!saved.ok()) {
    remove_parts();
    return saved.status().with_context("writing the device memory");
  }
  r.gpu.bytes_stored = saved->bytes;
  r.gpu.image = gpu_dir;
  ckpt::fault_point("driver-pre-dump-written");
  give_files(gpu_dir, pp.owner);
  t = std::chrono::steady_clock::now();
  if (Status s = sync_gpu_part(gpu_dir, dir); !s.ok()) {
    remove_parts();
    return s;
  }
  r.sync_s = seconds_since(t);
  r.gpu_s = seconds_since(t0);
  if (o.cpu_pages) {
    // Not restorable (NVIDIA's checkpoint would have to stop the job), but a parent for the CPU
    // part of a later dump --prev: the job's pages, read while it runs.
    t = std::chrono::steady_clock::now();
    write_cpu_pages(o, pp, &r);
    r.criu_s = seconds_since(t);
    if (!r.criu_dir.empty())
      r.criu_note = "the job's pages, read while it runs: a parent for a later dump's CPU part" +
                    (r.criu_note.empty() ? std::string() : "; " + r.criu_note);
  } else {
    r.criu_note = "the CPU part of an in-process job is taken only by a dump (NVIDIA's checkpoint must empty the "
                  "driver's state first): this pre-dump is GPU-only";
  }
  JobManifest m = driver_manifest("driver-pre-dump", o, pp, *ps, gpus, json_u64(a, "cut"), !inherited.empty(),
                                  saved->same_bytes, &r);
  m.leave_running = true;
  m.criu = r.criu_dir.empty() ? "" : "criu";
  if (r.criu_pages_to_parent > 0 && m.prev.empty()) m.prev = relative_to(pp.prev_dir, pp.dir);
  r.manifest = dir + "/manifest";
  if (Status s = write_small_file(r.manifest, manifest_json(m), 0600); !s.ok()) {
    remove_parts();
    return s;
  }
  r.total_s = seconds_since(t0);
  return r;
}

StatusOr<JobMoveReport> move_driver_job(const JobMoveOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const char* phase) {
    if (o.progress) o.progress(phase);
  };
  if (o.device < 0) return Status::InvalidArgument("no target device given");
  auto driver = ckpt::DriverCheckpoint::open();
  if (!driver.ok()) return driver.status();
  auto ps = ask_job(o.job_socket, "ps");
  if (!ps.ok()) return ps.status().with_context("asking the job");
  auto gpus = ask_job(o.job_socket, "gpus");
  if (!gpus.ok()) return gpus.status().with_context("asking the job which GPUs it uses");
  JobManifest m;  // the job's GPUs, as a dump would record them
  record_gpus(*gpus, &m);
  // No GPU among those it used, nor any memory on one: a job still starting.
  if (m.gpu_uuids.empty()) return job_not_started_error("the job has not used the GPU yet: there is nothing to move");
  // A job under an SM limit runs in a green context of its GPU's SMs; whether NVIDIA's restore can
  // carry one to another GPU is not known (docs/limits.md): such a job is not moved.
  if (const size_t at = ps->find("\"sms\":"); at != std::string::npos && std::strtoull(ps->c_str() + at + 6, nullptr, 10) != 0)
    return Status::FailedPrecondition("the job runs under an SM limit (pos run --sms), in a green context of its GPU: "
                                      "moving it to another GPU is not supported; nothing changed");
  const int dev = job_device(*ps);
  JobRestoreOptions ro;
  ro.device = o.device;
  auto plan = plan_device(ro, m, (*driver)->library(), dev);
  if (!plan.ok()) return plan.status();
  const int here = local_device((*driver)->library(), *gpus, dev);
  JobMoveReport r;
  r.pid = o.pid, r.from = here, r.to = plan->ordinal, r.to_uuid = plan->uuid;
  r.from_uuid = driver::split_gpu_uuids(m.gpu_uuids).ok() ? driver::split_gpu_uuids(m.gpu_uuids)->front() : std::string();
  if (plan->pairs.empty()) return Status::InvalidArgument("the job runs on CUDA device " + std::to_string(o.device) + " already");
  // Both contexts here before the job is touched (the costly part: 0.3-0.4 s each on a GPU).
  const driver::PeerCalls calls = driver::peer_calls((*driver)->library());
  auto src = driver::HeldMemory::open(calls, here);
  if (!src.ok()) return src.status().with_context("a context on the job's GPU");
  auto dst = driver::HeldMemory::open(calls, plan->ordinal);
  if (!dst.ok()) return dst.status().with_context("a context on CUDA device " + std::to_string(plan->ordinal));
  const pid_t pid = static_cast<pid_t>(o.pid);
  const uint64_t started = process_start_time(o.pid);
  const auto same_job = [&] { return started == 0 || process_start_time(o.pid) == started; };
  DriverJobGuardian guardian(o.resume_program, o.pid, o.job_socket);

  say("hold");
  const auto t_stop = std::chrono::steady_clock::now();
  auto shared = ask_job_fds(o.job_socket, "dump-share", {}, 600'000);
  if (!shared.ok()) return shared.status().with_context("asking the job for its device memory");
  if (shared->text.find("\"ok\":true") == std::string::npos)
    return job_refusal(shared->text).with_context("handing the job's device memory over");
  const std::string& a = shared->text;
  const uint32_t list = static_cast<uint32_t>(json_number(a, "list"));
  const uint64_t cut = json_u64(a, "cut");
  r.note = json_text(a, "note");
  auto back_out = [&](const Status& why) -> Status {  // before dump-release: the job still has its memory
    if (same_job()) (void)ask_dump(o.job_socket, "dump-resume @" + std::to_string(cut));
    return why;
  };
  std::vector<bool> written;  // (the answer's marks: a move copies everything)
  auto regions = shared_regions(a, dev, &written);
  if (!regions.ok()) return back_out(regions.status());
  std::vector<int> raw;
  for (const UniqueFd& f : shared->fds) raw.push_back(f.get());
  if (Status g = guardian.hold(raw, list, cut); !g.ok() && !o.resume_program.empty())
    return back_out(g.with_context("the guardian could not hold the job's device memory"));
  if (Status im = (*src)->import(*regions, std::move(shared->fds)); !im.ok())
    return back_out(im.with_context("importing the job's device memory"));
  auto rel = ask_dump(o.job_socket, "dump-release");
  if (!rel.ok()) {
    if (same_job()) (void)hand_back_memory(o.job_socket, **src, list, cut);
    return rel.status().with_context("the job could not let go of its device memory");
  }
  r.hold_s = seconds_since(t_stop);
  r.bytes = (*src)->bytes(), r.handles = regions->size();
  ckpt::fault_point("driver-move-held");
  // The new GPU's memory is made and filled while NVIDIA's driver checkpoints the job.
  Status copied = Status::Unavailable("not tried");
  std::thread copier([&] {
    const auto t = std::chrono::steady_clock::now();
    copied = (*dst)->create(*regions);
    if (copied.ok()) copied = (*dst)->copy_from(**src);
    r.copy_s = seconds_since(t);
  });
  // From here a failure gives the job its old memory back, after its driver state (on whichever
  // GPU the driver's restore left it).
  bool restored = false;
  auto undo = [&](const Status& why) -> Status {
    if (copier.joinable()) copier.join();
    if (!same_job()) return Status::Unavailable("the job ended during the move (" + why.message() + ")");
    Status back = restored ? Status::Ok() : (*driver)->release(pid);
    if (back.ok()) back = hand_back_memory(o.job_socket, **src, list, cut).status();
    return back.ok() ? why.with_context("the job runs on with its memory, on " +
                                        std::string(restored ? "the new GPU (its memory still on the old one)" : "its old GPU"))
                     : why.with_context("the job could not be brought back (" + back.message() + ")");
  };
  say("checkpoint");
  auto t = std::chrono::steady_clock::now();
  Status d = (*driver)->lock(pid, 10'000);
  if (d.ok()) d = (*driver)->checkpoint(pid);
  r.checkpoint_s = seconds_since(t);
  if (!d.ok()) return undo(d.with_context("the driver's checkpoint"));
  say("copy");
  copier.join();
  if (!copied.ok()) return undo(copied.with_context("copying the device memory onto CUDA device " + std::to_string(plan->ordinal)));
  ckpt::fault_point("driver-move-copied");
  say("restore");
  t = std::chrono::steady_clock::now();
  Status b = (*driver)->restore(pid, plan->pairs);
  if (b.ok()) b = (*driver)->unlock(pid);
  r.restore_s = seconds_since(t);
  if (!b.ok()) return undo(b.with_context("the driver's restore onto " + plan->uuid));
  restored = true;
  if (Status g = check_job_gpus(o.job_socket, *plan, &r.note); !g.ok()) return undo(g);
  say("take");
  t = std::chrono::steady_clock::now();
  auto taken = hand_back_memory(o.job_socket, **dst, list, cut);
  r.take_s = seconds_since(t);
  if (!taken.ok()) return undo(taken.status().with_context("handing the job its memory on the new GPU"));
  r.paused_s = seconds_since(t_stop);
  r.total_s = seconds_since(t0);
  return r;
}

}  // namespace pos
