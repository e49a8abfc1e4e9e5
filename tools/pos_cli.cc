// pos_cli.cc — `pos-cli`, the operator's tool: commands and options on CLI11, each command a thin
// call into a tested library (ckpt/inspect for images, posd's control socket for sessions).
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "ckpt/image.h"
#include "ckpt/inspect.h"
#include "remoting/common/handshake.h"
#include "remoting/common/job_control.h"
#include "remoting/common/wire.h"
#include "remoting/server/control_client.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/job_inspect.h"
#include "remoting/server/job_restore.h"
#include "pos/base/text.h"

#ifndef POS_VERSION_STRING
#define POS_VERSION_STRING "unknown"
#endif

namespace {

// A line on stderr that redraws itself, at most every 100 ms, only on a terminal.
class Progress {
 public:
  explicit Progress(const char* what) : what_(what), tty_(::isatty(STDERR_FILENO) == 1) {}
  void update(uint64_t done, uint64_t total) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double gbps = s > 0 ? static_cast<double>(done) / s / 1e9 : 0;
    const double eta = gbps > 0 ? static_cast<double>(total - done) / (gbps * 1e9) : 0;
    std::fprintf(stderr, "\r%s: %.2f / %.2f GB, %.2f GB/s, %.0f s left   ", what_, static_cast<double>(done) / 1e9,
                 static_cast<double>(total) / 1e9, gbps, eta);
    shown_ = true;
  }
  ~Progress() {
    if (shown_) std::fputs("\r\033[K", stderr);
  }

 private:
  const char* what_;
  bool tty_, shown_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_{};
};

int inspect(const std::string& dir, bool json, bool summary, bool verify) {
  if (pos::is_job_image(dir)) {  // pos-cli dump's: both parts
    pos::StatusOr<std::string> r = [&] {
      Progress p("verifying");
      pos::JobInspectOptions o;
      o.json = json, o.summary = summary, o.verify = verify;
      o.progress = [&](uint64_t d, uint64_t t) { p.update(d, t); };
      return pos::describe_job_image(dir, o);
    }();
    if (!r.ok()) {
      std::fprintf(stderr, "pos-cli inspect: %s\n", r.status().to_string().c_str());
      return 1;
    }
    std::fputs(r->c_str(), stdout);
    return 0;
  }
  auto img = pos::ckpt::ImageReader::open_dir(dir);
  if (!img.ok()) {
    std::fprintf(stderr, "pos-cli inspect: %s: %s\n", dir.c_str(), img.status().to_string().c_str());
    return 1;
  }
  std::string verified;
  if (verify) {
    pos::StatusOr<pos::ckpt::VerifyReport> r = [&] {
      Progress p("verifying");
      return pos::ckpt::verify_image(**img, [&](uint64_t d, uint64_t t) { p.update(d, t); });
    }();
    if (!r.ok()) {
      std::fprintf(stderr, "pos-cli inspect: %s\n", r.status().to_string().c_str());
      return 1;
    }
    verified = "verified: " + std::to_string(r->bytes) + " bytes in " + std::to_string(r->chunks) + " chunks of " +
               std::to_string(r->blobs) + " blobs, " + std::to_string(r->images) + " image(s), every checksum right\n";
  }
  std::string out = pos::ckpt::describe_image(**img, pos::ckpt::DescribeOptions{json, summary});
  if (!json) out += verify ? verified : "not verified (--no-verify): blob checksums were not read\n";
  std::fputs(out.c_str(), stdout);
  return 0;
}

// posd's sessions and the in-process jobs (`pos run`) in `jobs_dir`. posd renders its part and each
// job renders its own row or object: one source of truth for the fields. Fails only when neither
// posd nor any job answered.
int ps(const std::string& socket, const std::string& jobs_dir, bool json) {
  auto text = pos::posd_control(socket, json ? "ps" : "ps-table");
  std::vector<std::string> skipped;
  const std::vector<pos::JobAnswer> jobs = pos::ask_jobs(jobs_dir, json ? "ps" : "ps-row", &skipped);
  for (const std::string& s : skipped) std::fprintf(stderr, "pos-cli ps: not asked: %s\n", s.c_str());
  if (!text.ok() && jobs.empty()) {
    std::fprintf(stderr, "pos-cli ps: %s\n", text.status().message().c_str());
    return 1;
  }
  if (json) {
    std::string arr = "[";
    for (const pos::JobAnswer& j : jobs) arr += (arr.size() > 1 ? "," : "") + j.text;
    arr += "]";
    std::string out;
    if (text.ok()) {
      out = *text;
      while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
      if (out.empty() || out.back() != '}') {
        std::fprintf(stderr, "pos-cli ps: posd's answer is no JSON object\n");
        return 1;
      }
      out.insert(out.size() - 1, ",\"inproc_jobs\":" + arr);
    } else {
      out = "{\"posd_error\":" + pos::json_string(text.status().message()) + ",\"inproc_jobs\":" + arr + "}";
    }
    std::printf("%s\n", out.c_str());
    return 0;
  }
  if (text.ok()) std::fputs(text->c_str(), stdout);
  else std::fprintf(stderr, "pos-cli ps: posd: %s\n", text.status().message().c_str());
  if (!jobs.empty()) {
    std::printf("\n%-8s %-8s %-24s %-8s %14s %8s %12s  %s\n", "PID", "UID", "JOB (pos run)", "DEVICES", "MEMORY",
                "BUFFERS", "LAUNCHES", "NOT CHECKPOINTABLE");
    for (const pos::JobAnswer& j : jobs) std::printf("%s\n", j.text.c_str());
    std::printf("%zu in-process job(s) in %s\n", jobs.size(), jobs_dir.c_str());
  }
  return 0;
}

struct DumpArgs {
  int pid = 0;
  std::string dir, mode = "sync", socket, prev, jobs_dir;  // jobs_dir empty: the job's own
  bool leave_running = false, json = false, lazy_ok = false;
};

// dump and pre-dump: the same options, reports and progress.
int dump(const DumpArgs& a, bool pre) {
  const char* cmd = pre ? "pre-dump" : "dump";
  pos::JobDumpOptions o;
  o.socket = a.socket;
  o.pid = static_cast<uint32_t>(a.pid);
  o.dir = a.dir;
  o.prev = a.prev;
  o.leave_running = pre || a.leave_running;
  o.async = pre || a.mode == "async";
  o.lazy_ok = a.lazy_ok;
  // If this process dies mid-dump, a guardian runs this same program's `resume` on the job.
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) o.resume_program.assign(self, static_cast<size_t>(n));
  // An in-process job (pos run) answers on its own control socket; a job under posd has none.
  std::string jobs_dir = a.jobs_dir;
  if (jobs_dir.empty()) jobs_dir = pos::jobs_dir_of_process(a.pid);
  if (jobs_dir.empty()) jobs_dir = pos::default_jobs_dir();
  const std::string job_socket = pos::job_socket_path(jobs_dir, a.pid);
  struct stat st {};
  const bool inproc = ::stat(job_socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  if (inproc) o.job_socket = job_socket;
  pos::StatusOr<pos::JobDumpReport> r = [&] {
    // The GPU drain reports from its own thread while CRIU runs (with --leave-running): one line,
    // whichever phase spoke last.
    Progress gpu("saving GPU state"), cpu("saving CPU state (CRIU)");
    std::mutex mu;
    const bool tty = ::isatty(STDERR_FILENO) == 1;
    o.progress = [&](const char* phase, uint64_t done, uint64_t total) {
      std::lock_guard<std::mutex> lk(mu);
      const std::string ph = phase;
      if (ph == "gpu" && total > 0) gpu.update(done, total);
      else if (ph == "criu" && total > 0) cpu.update(done, total);
      else if (tty) std::fprintf(stderr, "\r%-60s", (std::string(cmd) + ": " + phase + "...").c_str());
    };
    auto res = pre ? (inproc ? pos::pre_dump_driver_job(o) : pos::pre_dump_job(o))
                   : inproc ? pos::dump_driver_job(o) : pos::dump_job(o);
    if (tty) std::fputs("\r\033[K", stderr);
    return res;
  }();
  if (!r.ok()) {
    // Neither kind of job: say where an in-process one was looked for too.
    const std::string hint = inproc ? "" : " (and no in-process job's control socket at " + job_socket + ")";
    std::fprintf(stderr, "pos-cli %s: %s%s\n", cmd, r.status().message().c_str(),
                 r.status().message().find("posd") != std::string::npos ? hint.c_str() : "");
    return 1;
  }
  if (a.json) {
    std::string unwritten;
    for (uint64_t u : r->unwritten) unwritten += (unwritten.empty() ? "" : ",") + std::to_string(u);
    std::printf("{\"command\":\"%s\",\"pid\":%d,\"dir\":%s,\"prev\":%s,\"leave_running\":%s,\"mode\":\"%s\",\"cut\":%llu,"
                "\"handles\":%llu,\"gpu_bytes\":%llu,\"gpu_bytes_referenced\":%llu,\"gpu_bytes_from_image\":%llu,\"gpu_image\":%s,"
                "\"criu_images\":%s,\"criu_bytes\":%llu,\"criu_track_mem\":%s,\"criu_incremental\":%s,\"criu_note\":%s,"
                "\"manifest\":%s,"
                "\"phases\":{\"detach_s\":%.6f,\"cut_s\":%.6f,\"gpu_s\":%.6f,\"gpu_stall_s\":%.6f,\"criu_s\":%.6f,\"resume_s\":%.6f,"
                "\"driver_s\":%.6f,\"driver_restore_s\":%.6f,\"sync_s\":%.6f,\"job_save_s\":%.6f,\"job_unmap_s\":%.6f,"
                "\"job_load_s\":%.6f,\"total_s\":%.6f},\"pause_s\":%.6f,\"stopped_s\":%.6f,\"handoff\":%s,\"gpu_snapshot\":%s,"
                "\"inproc\":%s,\"gpu_written\":%llu,\"gpu_written_bytes\":%llu,\"gpu_unwritten\":[%s],\"note\":%s}\n",
                cmd, a.pid, pos::json_string(a.dir).c_str(), pos::json_string(a.prev).c_str(),
                o.leave_running ? "true" : "false", o.async ? "async" : "sync", (unsigned long long)r->gpu.cut_pc,
                (unsigned long long)r->gpu.handles, (unsigned long long)r->gpu.bytes_stored,
                (unsigned long long)r->gpu.bytes_referenced, (unsigned long long)r->gpu.bytes_from_image,
                pos::json_string(r->gpu.image).c_str(),
                pos::json_string(r->criu_dir).c_str(), (unsigned long long)r->criu_bytes,
                r->criu_track_mem ? "true" : "false", r->criu_incremental ? "true" : "false",
                pos::json_string(r->criu_note).c_str(), pos::json_string(r->manifest).c_str(), r->detach_s, r->cut_s,
                r->gpu_s, r->gpu.stall_s, r->criu_s, r->resume_s, r->driver_s, r->driver_restore_s, r->sync_s,
                r->job_save_s, r->job_unmap_s, r->job_load_s, r->total_s,
                r->pause_s, r->stopped_s, r->handoff ? "true" : "false", r->gpu_snapshot ? "true" : "false", inproc ? "true" : "false",
                (unsigned long long)r->written_regions, (unsigned long long)r->written_bytes, unwritten.c_str(),
                pos::json_string(r->note).c_str());
    return 0;
  }
  const std::string gpu = std::to_string(r->gpu.bytes_stored) + " bytes" +
                          (a.prev.empty() ? "" : ", " + std::to_string(r->gpu.bytes_referenced) + " unchanged in --prev") +
                          (r->gpu.bytes_from_image == 0 ? ""
                                                        : ", " + std::to_string(r->gpu.bytes_from_image) +
                                                              " not loaded yet, copied from the image being restored");
  const std::string cpu = r->criu_dir.empty() ? std::string("CPU state not pre-dumped")
                          : std::string("CPU state by CRIU (") + std::to_string(r->criu_bytes) + " bytes" +
                                (r->criu_incremental ? ", pages changed since --prev only" : "") + ")";
  if (pre && inproc) {
    std::printf("pre-dumped in-process job %d to %s: device memory at one cut, %llu bytes in %llu allocations (%llu "
                "bytes in %llu written since its previous checkpoint); the job waited %.3f ms, its copy took %.3f s on the "
                "device, written in %.3f s; the job runs on\n",
                a.pid, a.dir.c_str(), (unsigned long long)r->gpu.bytes_stored, (unsigned long long)r->gpu.handles,
                (unsigned long long)r->written_bytes, (unsigned long long)r->written_regions, r->gpu.stall_s * 1e3,
                r->job_save_s, r->gpu_s);
  } else if (pre) {
    std::printf("pre-dumped pid %d to %s: GPU state at call %llu (%llu handles, %s), %s; the job runs on; "
                "GPU %.3f s, CRIU %.3f s, total %.3f s\n",
                a.pid, a.dir.c_str(), (unsigned long long)r->gpu.cut_pc, (unsigned long long)r->gpu.handles, gpu.c_str(),
                cpu.c_str(), r->gpu_s, r->criu_s, r->total_s);
  } else if (inproc) {
    std::printf("dumped in-process job %d to %s: device memory %llu bytes in %llu allocations (%.3f s), driver state by "
                "NVIDIA's checkpoint (%.3f s), CPU state by CRIU (%llu bytes, %.3f s); %s; total %.3f s\n",
                a.pid, a.dir.c_str(), (unsigned long long)r->gpu.bytes_stored, (unsigned long long)r->gpu.handles, r->gpu_s,
                r->driver_s, (unsigned long long)r->criu_bytes, r->criu_s,
                a.leave_running ? ("the job runs on (paused " + std::to_string(r->pause_s) + " s)").c_str()
                                : "the job has ended",
                r->total_s);
  } else {
    std::printf("dumped pid %d to %s: GPU state cut at call %llu (%llu handles, %s), %s; "
                "%s; detach %.3f s, GPU %.3f s, CRIU %.3f s, total %.3f s\n",
                a.pid, a.dir.c_str(), (unsigned long long)r->gpu.cut_pc, (unsigned long long)r->gpu.handles, gpu.c_str(),
                cpu.c_str(),
                a.leave_running ? ("the job runs on (paused " + std::to_string(r->pause_s) + " s)").c_str()
                                : "the job has ended",
                r->detach_s, r->gpu_s, r->criu_s, r->total_s);
  }
  if (!r->criu_note.empty()) std::printf("note: %s\n", r->criu_note.c_str());
  if (!r->note.empty()) std::printf("note: %s\n", r->note.c_str());
  return 0;
}

// `pos-cli resume -t PID`: an in-process job a dump left held brought back.
// With --shared-fds COUNT:LIST (from a dump's guardian): the job's device memory is in
// descriptors 3 .. 3+COUNT-1, handed back with LIST, the job's allocation-list checksum.
int resume(int pid, const std::string& jobs_dir, std::string job_socket, const std::string& shared) {
  if (job_socket.empty()) {
    std::string dir = jobs_dir.empty() ? pos::jobs_dir_of_process(pid) : jobs_dir;
    job_socket = pos::job_socket_path(dir.empty() ? pos::default_jobs_dir() : dir, pid);
  }
  std::vector<int> fds;
  unsigned long long count = 0;
  unsigned list = 0;
  if (!shared.empty()) {
    char extra = 0;
    if (std::sscanf(shared.c_str(), "%llu:%u%c", &count, &list, &extra) != 2 || count > pos::kMaxFds) {
      std::fprintf(stderr, "pos-cli resume: --shared-fds wants COUNT:LIST, not '%s'\n", pos::printable(shared, 64).c_str());
      return 2;
    }
    for (unsigned long long i = 0; i < count; ++i) {
      struct stat st {};
      if (::fstat(3 + static_cast<int>(i), &st) != 0) {
        std::fprintf(stderr, "pos-cli resume: descriptor %llu of --shared-fds is not open\n", 3 + i);
        return 2;
      }
      fds.push_back(3 + static_cast<int>(i));
    }
  }
  auto r = pos::resume_driver_job(job_socket, static_cast<uint32_t>(pid), fds, list);
  if (!r.ok()) {
    std::fprintf(stderr, "pos-cli resume: pid %d: %s\n", pid, r.status().message().c_str());
    return 1;
  }
  if (*r == "not held") std::printf("pid %d is not held by a dump: nothing to do\n", pid);
  else std::printf("pid %d runs on: %s\n", pid, r->c_str());
  return 0;
}

struct RestoreArgs {
  std::string dir, socket;
  bool lazy = false, json = false, latest = false;
};

int restore(RestoreArgs a) {
  if (a.latest) {  // DIR holds images: the newest restorable one
    auto latest = pos::latest_image(a.dir);
    if (!latest.ok()) {
      std::fprintf(stderr, "pos-cli restore: %s\n", latest.status().message().c_str());
      return 1;
    }
    if (!a.json) std::printf("restoring the newest restorable image: %s\n", latest->c_str());
    a.dir = *latest;
  }
  pos::JobRestoreOptions o;
  o.dir = a.dir;
  o.socket = a.socket;
  o.lazy = a.lazy;
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  o.progress = [&](const char* phase) {
    if (tty) std::fprintf(stderr, "\r%-60s", (std::string("restore: ") + phase + "...").c_str());
  };
  auto r = pos::restore_job(o);
  if (tty) std::fputs("\r\033[K", stderr);
  if (!r.ok()) {
    std::fprintf(stderr, "pos-cli restore: %s\n", r.status().message().c_str());
    return 1;
  }
  if (a.json) {
    std::printf("{\"pid\":%u,\"dir\":%s,\"socket\":%s,\"lazy\":%s,\"gpu_bytes\":%llu,\"handles\":%llu,"
                "\"phases\":{\"check_s\":%.6f,\"gpu_s\":%.6f,\"criu_s\":%.6f,\"reattach_s\":%.6f,\"load_s\":%.6f,\"total_s\":%.6f},\"handoff\":%s,"
                "\"note\":%s}\n",
                r->pid, pos::json_string(a.dir).c_str(), pos::json_string(a.socket).c_str(), a.lazy ? "true" : "false",
                (unsigned long long)r->gpu_bytes, (unsigned long long)r->handles, r->check_s, r->gpu_s, r->criu_s,
                r->reattach_s, r->load_s, r->total_s, r->handoff ? "true" : "false", pos::json_string(r->note).c_str());
  } else {
    std::printf("restored pid %u from %s: GPU state %s(%llu handles, %llu bytes) in %.3f s, CPU state by CRIU in %.3f s, "
                "re-attached in %.3f s; total %.3f s\n",
                r->pid, a.dir.c_str(), a.lazy && r->note.empty() ? "loading lazily " : "", (unsigned long long)r->handles,
                (unsigned long long)r->gpu_bytes, r->gpu_s, r->criu_s, r->reattach_s, r->total_s);
  }
  if (!r->note.empty()) std::printf("note: %s\n", r->note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pos-cli: the operator's tool for POS (docs/cli.md)", "pos-cli"};
  app.set_version_flag("--version",
                       std::string("pos-cli ") + POS_VERSION_STRING + " (image format " +
                           std::to_string(pos::ckpt::kFormatVersion) + ", posd protocol " +
                           std::to_string(pos::wire::kProtocolVersion) + ")");
  app.require_subcommand(1);
  app.fallthrough(false);

  std::string dir;
  bool json = false, summary = false, no_verify = false;
  CLI::App* ins = app.add_subcommand(
      "inspect", "validate an image and print it: a job image (pos-cli dump: GPU and CPU parts) or a GPU image");
  ins->add_option("IMAGE_DIR", dir, "the image directory (pos-cli dump's -D, or a GPU image such as DIR/gpu)")->required();
  ins->add_flag("--json", json, "one JSON object (handles with their types by name)");
  ins->add_flag("--summary", summary, "counts and bytes per resource type instead of every handle");
  ins->add_flag("--no-verify", no_verify, "skip reading every blob to check its checksums");

  std::string socket = pos::default_socket_path();
  bool ps_json = false;
  CLI::App* ps_cmd = app.add_subcommand("ps", "list posd's sessions and in-process jobs (pos run): pid, job, device memory, calls, state");
  ps_cmd->add_flag("--json", ps_json, "one JSON object");
  ps_cmd->add_option("--socket", socket, "posd's socket")->capture_default_str();
  std::string jobs_dir = pos::default_jobs_dir();
  ps_cmd->add_option("--jobs-dir", jobs_dir, "where in-process jobs (pos run) put their control sockets")
      ->capture_default_str();

  DumpArgs da;
  da.socket = pos::default_socket_path();
  CLI::App* dump_cmd = app.add_subcommand("dump", "save a job (under posd, or in-process under pos run): its GPU state and its process tree (CRIU)");
  dump_cmd->add_option("-t,--tree", da.pid, "the job's pid (its client of posd: pos-cli ps)")->required()->check(
      CLI::PositiveNumber);
  dump_cmd->add_option("-D,--images-dir", da.dir, "where the image goes (made if missing; must hold no image)")
      ->required();
  dump_cmd->add_flag("--leave-running", da.leave_running, "the job runs on after the dump (else it ends, as with CRIU)");
  dump_cmd->add_option("--mode", da.mode, "how the GPU bytes are drained: sync, or async (copy-on-write)")
      ->check(CLI::IsMember({"sync", "async"}))
      ->capture_default_str();
  dump_cmd->add_option("--prev", da.prev,
                       "an earlier dump or pre-dump of this job: save only what changed since (the image then needs it)");
  dump_cmd->add_flag("--lazy-ok", da.lazy_ok,
                     "a job still loading a lazy restore is dumped at once (what it has not loaded is copied from "
                     "the image it loads from); else the dump waits for the load");
  dump_cmd->add_flag("--json", da.json, "one JSON report");
  dump_cmd->add_option("--socket", da.socket, "posd's socket")->capture_default_str();
  dump_cmd->add_option("--jobs-dir", da.jobs_dir,
                       "where in-process jobs (pos run) put their control sockets: a job with one there is dumped "
                       "through it (default: the job's own, from its environment)");

  DumpArgs pa;
  pa.socket = pos::default_socket_path();
  CLI::App* pre_cmd = app.add_subcommand(
      "pre-dump", "save a running job's GPU state and memory without stopping it, as --prev of a later dump");
  pre_cmd->add_option("-t,--tree", pa.pid, "the job's pid (its client of posd: pos-cli ps)")->required()->check(
      CLI::PositiveNumber);
  pre_cmd->add_option("-D,--images-dir", pa.dir, "where the pre-dump goes (made if missing; must hold no image)")
      ->required();
  pre_cmd->add_option("--prev", pa.prev, "an earlier pre-dump or dump of this job: save only what changed since");
  pre_cmd->add_flag("--lazy-ok", pa.lazy_ok, "as for dump");
  pre_cmd->add_flag("--json", pa.json, "one JSON report");
  pre_cmd->add_option("--socket", pa.socket, "posd's socket")->capture_default_str();
  pre_cmd->add_option("--jobs-dir", pa.jobs_dir,
                      "where in-process jobs (pos run) put their control sockets (default: the job's own)");

  RestoreArgs ra;
  ra.socket = pos::default_socket_path();
  CLI::App* restore_cmd = app.add_subcommand("restore", "bring back a job saved by pos-cli dump: GPU state, process tree, session");
  restore_cmd->add_option("-D,--images-dir", ra.dir, "the image (pos-cli dump's -D)")->required();
  restore_cmd->add_option("--socket", ra.socket, "the posd to restore into (the one dumped from or another)")
      ->capture_default_str();
  restore_cmd->add_flag("--lazy", ra.lazy, "run on while device memory loads (each buffer before its first use)");
  restore_cmd->add_flag("--json", ra.json, "one JSON report");
  restore_cmd->add_flag("--latest", ra.latest,
                        "-D names a directory of images (pos-cli images): restore the newest restorable one");

  std::string images_dir;
  bool images_json = false;
  CLI::App* images_cmd = app.add_subcommand(
      "images", "list the job images in a directory (one per subdirectory): kind, time, bytes, previous image, state");
  images_cmd->add_option("DIR", images_dir, "the directory that holds the images")->required();
  images_cmd->add_flag("--json", images_json, "one JSON object");

  int resume_pid = 0;
  std::string resume_jobs_dir, resume_socket;
  CLI::App* resume_cmd = app.add_subcommand(
      "resume", "bring back an in-process job (pos run) that a dump left held (its pos-cli was killed mid-dump)");
  resume_cmd->add_option("-t,--tree", resume_pid, "the job's pid")->required()->check(CLI::PositiveNumber);
  resume_cmd->add_option("--jobs-dir", resume_jobs_dir,
                         "where in-process jobs put their control sockets (default: the job's own)");
  resume_cmd->add_option("--job-socket", resume_socket, "the job's control socket (instead of --jobs-dir)");
  std::string resume_shared;
  resume_cmd->add_option("--shared-fds", resume_shared,
                         "COUNT:LIST: the job's device memory in descriptors 3.. (a dump's guardian passes them)");

  std::string topic;
  CLI::App* help = app.add_subcommand("help", "help on a command: pos-cli help COMMAND");
  help->add_option("COMMAND", topic, "the command");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Name what was wrong, and where to look; exit 2 like every usage error.
    std::string msg = e.what();
    if (app.get_subcommands().empty()) {
      if (argc > 1 && argv[1][0] != '-') msg = std::string("unknown command '") + argv[1] + "' (commands: inspect, ps, dump, pre-dump, restore, resume, images, help)";
      else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) msg = "a command is required (inspect, ps, dump, pre-dump, restore, resume, help)";
    } else {
      msg = app.get_subcommands().front()->get_name() + ": " + msg;
    }
    std::fprintf(stderr, "pos-cli: %s\nRun 'pos-cli --help' for the commands, 'pos-cli help COMMAND' for one.\n",
                 msg.c_str());
    return 2;
  }
  if (help->parsed()) {
    if (topic.empty()) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    for (CLI::App* c : {ins, ps_cmd, dump_cmd, pre_cmd, restore_cmd, resume_cmd, help})
      if (c->get_name() == topic) {
        std::fputs(c->help("pos-cli").c_str(), stdout);
        return 0;
      }
    std::fprintf(stderr, "pos-cli help: unknown command '%s' (commands: inspect, ps, dump, pre-dump, restore, resume, images, help)\n", topic.c_str());
    return 2;
  }
  if (ins->parsed()) return inspect(dir, json, summary, !no_verify);
  if (ps_cmd->parsed()) return ps(socket, jobs_dir, ps_json);
  if (dump_cmd->parsed()) return dump(da, false);
  if (pre_cmd->parsed()) return dump(pa, true);
  if (restore_cmd->parsed()) return restore(ra);
  if (resume_cmd->parsed()) return resume(resume_pid, resume_jobs_dir, resume_socket, resume_shared);
  if (images_cmd->parsed()) {
    auto images = pos::list_images(images_dir);
    if (!images.ok()) {
      std::fprintf(stderr, "pos-cli images: %s\n", images.status().message().c_str());
      return 1;
    }
    std::fputs(pos::describe_images(images_dir, *images, images_json).c_str(), stdout);
    return 0;
  }
  return 2;
}
