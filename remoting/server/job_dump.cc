// job_dump.cc — the dump's phases in order (detach, GPU cut and drain, CRIU, manifest, resume), each
// timed, each failure undone so that the job runs on and no partial image is left behind.
#include "remoting/server/job_dump.h"

#include <fcntl.h>
#include <sys/stat.h>
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

#include "ckpt/criu.h"
#include "ckpt/image.h"
#include "pos/base/text.h"
#include "remoting/common/unique_fd.h"
#include "remoting/server/job_manifest.h"

namespace pos {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A small file, whole or not at all: written to a temporary name, fsynced, renamed.
Status write_file(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!f) return Status::Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(f.get()) != 0)
    return Status::Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  f.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::Unavailable("cannot write " + path + ": " + std::strerror(errno));
  // The rename itself durable: a crash after the dump's report never loses the file.
  const std::string parent = path.substr(0, path.rfind('/') + 1);
  UniqueFd d(::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d || ::fsync(d.get()) != 0) return Status::Unavailable("cannot sync " + parent + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

StatusOr<JobDumpReport> dump_job(const JobDumpOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const char* phase, uint64_t done = 0, uint64_t total = 0) {
    if (o.progress) o.progress(phase, done, total);
  };
  if (o.pid == 0) return Status::InvalidArgument("no job pid given");
  if (o.dir.empty()) return Status::InvalidArgument("no image directory given");
  // CRIU first: a machine that cannot dump the CPU half must not have the job stopped for nothing.
  auto criu = ckpt::find_criu();
  if (!criu.ok()) return criu.status();
  if (::mkdir(o.dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::InvalidArgument("cannot create " + o.dir + ": " + std::strerror(errno));
  char real[PATH_MAX];
  if (::realpath(o.dir.c_str(), real) == nullptr)
    return Status::InvalidArgument("cannot resolve " + o.dir + ": " + std::strerror(errno));
  const std::string dir = real;
  for (const char* part : {"gpu", "criu", "manifest", "token"})
    if (fs::exists(fs::symlink_status(dir + "/" + part)))
      return Status::InvalidArgument(dir + " already holds an image (" + part + "): name an empty or new directory");
  const std::string permit = dir + "/.reattach";
  // The manifest keeps paths as printable text: one that is not would not read back the same.
  for (const std::string* p : {&permit, &o.socket})
    if (printable(*p) != *p || p->size() >= 500)
      return Status::InvalidArgument("the path " + printable(*p) + " holds control characters or is too long for an image");
  struct stat owner {};
  if (::stat(("/proc/" + std::to_string(o.pid)).c_str(), &owner) != 0)
    return Status(Code::kNotFound, 0, "pid " + std::to_string(o.pid) + " does not exist");
  (void)::unlink(permit.c_str());

  JobDumpReport r;
  say("detach");
  auto t = std::chrono::steady_clock::now();
  // The job comes back by itself after 10 minutes if this process dies before it says so.
  uint64_t arena_bytes = 0;
  auto token = posd_detach(o.socket, o.pid, permit, 600'000, &arena_bytes);
  if (!token.ok()) return token.status().with_context("detaching the job");
  r.detach_s = seconds_since(t);
  // From here every failure lets the job run on and removes this dump's parts.
  // What this dump may have written, removed whole: a failed dump leaves no partial image.
  auto remove_parts = [&] {
    for (const char* part : {"gpu", "gpu.partial", "criu", "manifest", "manifest.tmp", "token", "token.tmp"})
      fs::remove_all(dir + "/" + part);
  };
  auto undo = [&](const Status& why) -> Status {
    remove_parts();
    Status resumed = grant_reattach(permit);
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
        });
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
  auto gpu_failed = [&]() -> bool {
    std::lock_guard<std::mutex> lk(mu);
    return finished && !gpu.ok();
  };
  if (gpu_failed()) {
    drain.join();
    return undo(gpu.status().with_context("saving the GPU state"));
  }

  say("criu");
  t = std::chrono::steady_clock::now();
  r.criu_dir = dir + "/criu";
  ckpt::CriuDumpOptions co;
  co.leave_running = o.leave_running;
  // A job started from a shell shares its session: CRIU must be told so.
  co.shell_job = ::getsid(static_cast<pid_t>(o.pid)) != static_cast<pid_t>(o.pid);
  Status c = ::mkdir(r.criu_dir.c_str(), 0700) == 0 ? ckpt::criu_dump(*criu, static_cast<pid_t>(o.pid), r.criu_dir, co)
                                                     : Status::Unavailable("cannot create " + r.criu_dir);
  r.criu_s = seconds_since(t);
  if (!c.ok()) {
    drain.join();
    return undo(c.with_context("saving the CPU state"));
  }
  if (o.leave_running) {
    // Both parts are cut: the job runs on while the GPU bytes drain.
    say("resume");
    t = std::chrono::steady_clock::now();
    if (Status s = grant_reattach(permit); !s.ok()) {
      drain.join();
      return s.with_context("the job was not told to run on");
    }
    r.resume_s = seconds_since(t);
    r.pause_s = seconds_since(t0);  // the job re-attaches within milliseconds of the permit
  } else {
    (void)::unlink(permit.c_str());  // the job is gone: CRIU ended it
  }
  drain.join();
  r.gpu_s = seconds_since(t0) - r.detach_s;
  if (!gpu.ok()) {
    // The job runs on (or has ended, without --leave-running); the image is not complete.
    remove_parts();
    return gpu.status().with_context("saving the GPU state");
  }
  r.gpu = *gpu;

  // The token lets the restored job re-attach: the caller's alone.
  auto drop = [&](const Status& why) {
    remove_parts();
    return why;
  };
  if (Status s = write_file(dir + "/token", *token + "\n", 0600); !s.ok()) return drop(s);
  JobManifest m;
  m.pid = o.pid;
  m.uid = owner.st_uid;
  m.socket = o.socket;
  m.permit = permit;
  m.arena_bytes = arena_bytes;
  m.leave_running = o.leave_running;
  m.shell_job = co.shell_job;
  m.cut = r.gpu.cut_pc, m.gpu_bytes = r.gpu.bytes_stored, m.handles = r.gpu.handles;
  {
    auto img = ckpt::ImageReader::open_dir(dir + "/gpu");
    if (!img.ok()) return drop(img.status().with_context("reading back the GPU part"));
    m.job = printable((*img)->client().client().job_name());
    m.gpu_image_id = (*img)->inventory().image_id();
  }
  r.manifest = dir + "/manifest";
  if (Status s = write_file(r.manifest, manifest_json(m), 0600); !s.ok()) return drop(s);
  r.total_s = seconds_since(t0);
  return r;
}

}  // namespace pos
