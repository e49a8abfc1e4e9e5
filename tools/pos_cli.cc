// pos_cli.cc — `pos-cli`, the operator's tool: commands and options on CLI11, each command a thin
// call into a tested library (ckpt/inspect for images, posd's control socket for sessions).
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <map>
#include <string>
#include <thread>

#include "ckpt/image.h"
#include "ckpt/inspect.h"
#include "remoting/common/handshake.h"
#include "remoting/common/job_control.h"
#include "remoting/common/wire.h"
#include "remoting/server/checkpoint_policy.h"
#include "remoting/server/control_client.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/job_inspect.h"
#include "remoting/server/job_migrate.h"
#include "remoting/server/job_restore.h"
#include "pos/base/parse.h"
#include "remoting/common/usage_region.h"
#include "remoting/server/job_manifest.h"
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

std::string policies_text(const std::vector<pos::PolicyStatus>& ps, bool json);

// posd's sessions and the in-process jobs (`pos run`) in `jobs_dir`, and the checkpoint policies there. posd renders its part and each
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
  std::vector<std::string> unread;
  const std::vector<pos::PolicyStatus> policies = pos::list_policy_statuses(jobs_dir, &unread);
  // The jobs' shared accounting (docs/limits.md), when there is one: read, never made here.
  std::vector<pos::UsageRegion::Entry> usage;
  // POS_USAGE_REGION: the region posd keeps for several users, which the jobs join instead.
  const pos::UsageRegionChoice use = pos::choose_usage_region(jobs_dir, pos::kept_usage_region());
  const std::string& usage_path = use.path;
  if (::access(usage_path.c_str(), F_OK) == 0) {
    auto region = pos::UsageRegion::open(usage_path, use.access);
    if (region.ok()) usage = (*region)->list();
    else std::fprintf(stderr, "pos-cli ps: %s\n", region.status().message().c_str());
  }
  std::string usage_json = "[";
  uint64_t usage_bytes = 0;
  for (const pos::UsageRegion::Entry& e : usage) {
    usage_json += (usage_json.size() > 1 ? "," : "") + std::string("{\"pid\":") + std::to_string(e.pid) +
                  ",\"device\":" + std::to_string(e.device) + ",\"memory_used\":" + std::to_string(e.memory_used) +
                  ",\"memory_limit\":" + std::to_string(e.memory_limit) + ",\"gpu_share\":" + std::to_string(e.share) +
                  ",\"recent_gpu_share\":" + std::to_string(e.recent_share) + ",\"turn_ns\":" + std::to_string(e.gpu_ns) + "}";
    usage_bytes += e.memory_used;
  }
  usage_json += "]";
  for (const std::string& u : unread) std::fprintf(stderr, "pos-cli ps: not read: %s\n", u.c_str());
  if (json) {
    std::string arr = "[";
    for (const pos::JobAnswer& j : jobs) arr += (arr.size() > 1 ? "," : "") + j.text;
    arr += "],\"checkpoint_policies\":" + policies_text(policies, true) + ",\"usage\":" + usage_json;
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
    std::printf("\n%-8s %-8s %-24s %-8s %14s %14s %9s %5s %8s %12s  %s\n", "PID", "UID", "JOB (pos run)", "DEVICES", "MEMORY",
                "MEMORY LIMIT", "GPU SHARE", "SMS", "BUFFERS", "LAUNCHES", "NOT CHECKPOINTABLE");
    for (const pos::JobAnswer& j : jobs) std::printf("%s\n", j.text.c_str());
    std::printf("%zu in-process job(s) in %s\n", jobs.size(), jobs_dir.c_str());
  }
  if (!usage.empty()) {
    std::printf("%zu process(es) hold %llu bytes of device memory (%s)\n", usage.size(),
                static_cast<unsigned long long>(usage_bytes), usage_path.c_str());
    // Where GPU time is shared: each process's share against what it had of its GPU's recent turns.
    bool shares = false;
    for (const pos::UsageRegion::Entry& e : usage) shares |= e.share != 0 || e.recent_share >= 0;
    if (shares) {
      std::printf("%-8s %4s %9s %13s %12s\n", "PID", "GPU", "GPU SHARE", "RECENT SHARE", "TURNS (s)");
      for (const pos::UsageRegion::Entry& e : usage) {
        char share[16] = "-", recent[16] = "-";
        if (e.share != 0) std::snprintf(share, sizeof(share), "%u.%u%%", e.share / 10, e.share % 10);
        if (e.recent_share >= 0) std::snprintf(recent, sizeof(recent), "%d.%d%%", e.recent_share / 10, e.recent_share % 10);
        std::printf("%-8u %4d %9s %13s %12.1f\n", e.pid, e.device, share, recent, static_cast<double>(e.gpu_ns) / 1e9);
      }
    }
  }
  if (!policies.empty()) std::fputs(policies_text(policies, false).c_str(), stdout);
  return 0;
}

// Where a job answers: an in-process job (pos run) on its own control socket in its jobs directory
// (the job's own, from its environment, unless given); a job under posd has none there.
struct JobTarget {
  std::string jobs_dir, job_socket;
  bool inproc = false;
};
JobTarget find_job(int pid, const std::string& jobs_dir_arg) {
  JobTarget t;
  t.jobs_dir = jobs_dir_arg;
  if (t.jobs_dir.empty()) t.jobs_dir = pos::jobs_dir_of_process(pid);
  if (t.jobs_dir.empty()) t.jobs_dir = pos::default_jobs_dir();
  t.job_socket = pos::job_socket_path(t.jobs_dir, pid);
  struct stat st {};
  t.inproc = ::stat(t.job_socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  return t;
}

// This program's own path, for a dump's guardian (it runs `resume` if this process dies mid-dump).
std::string self_program() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
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
  o.resume_program = self_program();
  const JobTarget target = find_job(a.pid, a.jobs_dir);
  const std::string& job_socket = target.job_socket;
  const bool inproc = target.inproc;
  if (inproc) o.job_socket = job_socket;
  // A posd job's pre-dump holds its memory as CRIU's would, where CRIU cannot pre-dump (an
  // in-process job's stays GPU-only: it is also what a policy tick of such a job takes).
  o.cpu_pages = pre && !inproc;
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
                "\"criu_pages_to_parent\":%llu,\"manifest\":%s,"
                "\"phases\":{\"detach_s\":%.6f,\"cut_s\":%.6f,\"gpu_s\":%.6f,\"gpu_stall_s\":%.6f,\"criu_s\":%.6f,\"resume_s\":%.6f,"
                "\"driver_s\":%.6f,\"driver_restore_s\":%.6f,\"sync_s\":%.6f,\"job_save_s\":%.6f,\"job_unmap_s\":%.6f,"
                "\"job_load_s\":%.6f,\"total_s\":%.6f},\"pause_s\":%.6f,\"stopped_s\":%.6f,\"handoff\":%s,\"gpu_snapshot\":%s,"
                "\"inproc\":%s,\"gpu_written\":%llu,\"gpu_written_bytes\":%llu,\"gpu_unwritten\":[%s],\"gpu_ahead\":%s,"
                "\"gpu_ahead_waits\":%llu,\"gpu_shadow_reused\":%s,\"gpu_align\":%s,\"gpu_align_s\":%.6f,\"gpu_pool_free_bytes\":%llu,\"note\":%s}\n",
                cmd, a.pid, pos::json_string(a.dir).c_str(), pos::json_string(a.prev).c_str(),
                o.leave_running ? "true" : "false", o.async ? "async" : "sync", (unsigned long long)r->gpu.cut_pc,
                (unsigned long long)r->gpu.handles, (unsigned long long)r->gpu.bytes_stored,
                (unsigned long long)r->gpu.bytes_referenced, (unsigned long long)r->gpu.bytes_from_image,
                pos::json_string(r->gpu.image).c_str(),
                pos::json_string(r->criu_dir).c_str(), (unsigned long long)r->criu_bytes,
                r->criu_track_mem ? "true" : "false", r->criu_incremental ? "true" : "false",
                pos::json_string(r->criu_note).c_str(), (unsigned long long)r->criu_pages_to_parent,
                pos::json_string(r->manifest).c_str(), r->detach_s, r->cut_s,
                r->gpu_s, r->gpu.stall_s, r->criu_s, r->resume_s, r->driver_s, r->driver_restore_s, r->sync_s,
                r->job_save_s, r->job_unmap_s, r->job_load_s, r->total_s,
                r->pause_s, r->stopped_s, r->handoff ? "true" : "false", r->gpu_snapshot ? "true" : "false", inproc ? "true" : "false",
                (unsigned long long)r->written_regions, (unsigned long long)r->written_bytes, unwritten.c_str(),
                r->gpu_ahead ? "true" : "false", (unsigned long long)r->gpu_ahead_waits,
                r->gpu_shadow_reused ? "true" : "false", pos::json_string(r->gpu_align).c_str(), r->gpu_align_s,
                (unsigned long long)r->gpu_pool_free_bytes,
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
    // Where the cut fell: at the job's step boundary (a synchronizing call of it returned), or why not.
    char at[96] = "";
    if (r->gpu_align == "sync") std::snprintf(at, sizeof(at), " at the job's step boundary (%.0f ms later)", r->gpu_align_s * 1e3);
    else if (r->gpu_align == "timeout") std::snprintf(at, sizeof(at), " (no step boundary within %.0f ms)", r->gpu_align_s * 1e3);
    else if (r->gpu_align == "idle") std::snprintf(at, sizeof(at), " (the job was idle)");
    const std::string freed = r->gpu_pool_free_bytes == 0 ? std::string()
                              : ", " + std::to_string(r->gpu_pool_free_bytes) + " bytes of freed stream-ordered memory left out";
    std::printf("pre-dumped in-process job %d to %s: device memory at one cut%s, %llu bytes in %llu allocations%s (%llu "
                "bytes in %llu written since its previous checkpoint); the job waited %.3f ms, its copy took %.3f s on the "
                "device%s, written in %.3f s; the job runs on\n",
                a.pid, a.dir.c_str(), at, (unsigned long long)r->gpu.bytes_stored, (unsigned long long)r->gpu.handles,
                freed.c_str(),
                (unsigned long long)r->written_bytes, (unsigned long long)r->written_regions, r->gpu.stall_s * 1e3,
                r->job_save_s,
                r->gpu_ahead ? (" ahead of the job (its work waited for it on the device " +
                                std::to_string(r->gpu_ahead_waits) + " time(s))").c_str()
                             : " before any of the job's later work",
                r->gpu_s);
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
// With --shared-fds COUNT:LIST:CUT (from a dump's guardian): the job's device memory is in
// descriptors 3 .. 3+COUNT-1, handed back with LIST, the job's allocation-list checksum, and CUT,
// the dump's. With --start-time: only the process the dump held (not one restored under its pid).
// `pos-cli limit -t PID [--memory SIZE] [--gpu-share PCT]`: a job's limits, shown, or changed first
// (docs/limits.md): an in-process job's through its control socket, a posd job's through posd.
// "0" removes the memory limit or the share.
// " memory=BYTES" after `cmd` for --memory SIZE ("0": none; empty: nothing); false, said on
// stderr, when SIZE does not parse.
bool append_memory(const std::string& memory, std::string* cmd) {
  if (memory.empty()) return true;
  uint64_t bytes = 0;
  if (memory != "0") {
    auto b = pos::parse_size(memory);
    if (!b.ok()) {
      std::fprintf(stderr, "pos-cli limit: --memory %s: %s\n", pos::printable(memory, 64).c_str(), b.status().message().c_str());
      return false;
    }
    bytes = *b;
  }
  *cmd += " memory=" + std::to_string(bytes);
  return true;
}

// A number of a flat JSON answer (0 when it is missing or not a number).
unsigned long long flat_number(const std::map<std::string, pos::FlatJsonValue>& v, const char* key) {
  auto it = v.find(key);
  return it != v.end() && it->second.kind == pos::FlatJsonValue::kNumber ? static_cast<unsigned long long>(it->second.n) : 0ull;
}

// --gpu-share PCT in per mille ("0" or "0%": none; empty: not asked); false (said) when it does not parse.
bool parse_gpu_share(const std::string& gpu_share, uint32_t* per_mille) {
  *per_mille = 0;
  if (gpu_share.empty() || gpu_share == "0" || gpu_share == "0%") return true;
  auto p = pos::parse_share(gpu_share);
  if (!p.ok()) {
    std::fprintf(stderr, "pos-cli limit: --gpu-share %s\n", p.status().message().c_str());
    return false;
  }
  *per_mille = *p;
  return true;
}

// A job under posd: its session's device-memory quota and GPU-time share, through posd
// (`limit PID [memory=BYTES] [share=PERMILLE]`).
int limit_posd(int pid, const std::string& socket, const std::string& jobs_dir, const std::string& memory,
               const std::string& gpu_share, bool json) {
  std::string cmd = "limit " + std::to_string(pid);
  if (!append_memory(memory, &cmd)) return 2;
  uint32_t pm = 0;
  if (!parse_gpu_share(gpu_share, &pm)) return 2;
  if (!gpu_share.empty()) cmd += " share=" + std::to_string(pm);
  auto a = pos::posd_control(socket, cmd);
  if (!a.ok()) {
    std::fprintf(stderr, "pos-cli limit: pid %d is no in-process job in %s, and posd (%s) says: %s\n", pid,
                 jobs_dir.c_str(), socket.c_str(), a.status().message().c_str());
    return 1;
  }
  if (json) {
    std::fputs(a->c_str(), stdout);
    return 0;
  }
  std::map<std::string, pos::FlatJsonValue> v;
  std::string body = *a;
  while (!body.empty() && (body.back() == '\n' || body.back() == ' ')) body.pop_back();
  if (const pos::Status read = pos::parse_flat_json(body, "posd's answer", &v); !read.ok()) {
    std::fprintf(stderr, "pos-cli limit: pid %d: %s\n", pid, read.message().c_str());
    return 1;
  }
  const auto number = [&](const char* key) { return flat_number(v, key); };
  const unsigned long long quota = number("memory_quota"), used = number("memory_bytes"), share = number("gpu_share");
  if (quota == 0) std::printf("pid %d (under posd): no device-memory quota; it holds %llu bytes", pid, used);
  else
    std::printf("pid %d (under posd): device-memory quota %llu bytes; it holds %llu (%.1f%%)", pid, quota, used,
                100.0 * static_cast<double>(used) / static_cast<double>(quota));
  if (share == 0) std::printf("; no GPU-time share");
  else std::printf("; GPU-time share %llu.%llu%%", share / 10, share % 10);
  // posd.limits' SM limit (fixed for the session's life): the SMs its kernels run on, 0: all.
  if (const unsigned long long sms = number("sms"); sms != 0) {
    if (const unsigned long long g = number("sms_granted"); g != 0) std::printf("; SM limit %llu: its kernels run on %llu SMs\n", sms, g);
    else std::printf("; SM limit %llu asked, not in force (this backend or GPU cannot: posd's log says why)\n", sms);
  } else {
    std::printf("\n");
  }
  return 0;
}

int limit(int pid, const std::string& jobs_dir, const std::string& socket, const std::string& memory,
          const std::string& gpu_share, bool json) {
  const JobTarget t = find_job(pid, jobs_dir);
  if (!t.inproc) return limit_posd(pid, socket, t.jobs_dir, memory, gpu_share, json);
  std::string cmd = "limit";
  if (!append_memory(memory, &cmd)) return 2;
  uint32_t pm = 0;
  if (!parse_gpu_share(gpu_share, &pm)) return 2;
  if (!gpu_share.empty()) {
    if (!memory.empty()) {
      // One change per question: the memory limit first, then the share.
      auto first = pos::ask_job(t.job_socket, cmd, 10000);
      if (!first.ok() || first->find("\"ok\":true") == std::string::npos) {
        std::fprintf(stderr, "pos-cli limit: pid %d: %s\n", pid,
                     first.ok() ? pos::printable(*first, 200).c_str() : first.status().message().c_str());
        return 1;
      }
    }
    cmd = "limit share=" + std::to_string(pm);
  }
  auto a = pos::ask_job(t.job_socket, cmd, 10000);
  if (!a.ok()) {
    std::fprintf(stderr, "pos-cli limit: pid %d: %s\n", pid, a.status().message().c_str());
    return 1;
  }
  if (a->find("\"ok\":true") == std::string::npos) {
    const size_t e = a->find("\"error\":\"");
    std::fprintf(stderr, "pos-cli limit: pid %d: %s\n", pid,
                 e == std::string::npos ? pos::printable(*a, 200).c_str()
                                        : a->substr(e + 9, a->find('"', e + 9) - e - 9).c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", a->c_str());
    return 0;
  }
  // The job's "limits" object is flat: read strictly, as manifests are.
  const size_t at = a->find("\"limits\":{");
  std::map<std::string, pos::FlatJsonValue> v;
  const pos::Status read = at == std::string::npos
                          ? pos::Status::Corrupt("the job's answer has no limits")
                          : pos::parse_flat_json(a->substr(at + 9, a->find('}', at) - at - 8), "the job's limits", &v);
  if (!read.ok()) {
    std::fprintf(stderr, "pos-cli limit: pid %d: %s\n", pid, read.message().c_str());
    return 1;
  }
  const auto number = [&](const char* key) { return flat_number(v, key); };
  const unsigned long long lim = number("memory"), used = number("memory_used"), refused = number("memory_refused");
  if (lim == 0) std::printf("pid %d: no memory limit; it holds %llu bytes of device memory\n", pid, used);
  else
    std::printf("pid %d: memory limit %llu bytes; it holds %llu (%.1f%%); %llu allocation(s) refused at the limit\n", pid,
                lim, used, 100.0 * static_cast<double>(used) / static_cast<double>(lim), refused);
  const unsigned long long share = number("gpu_share"), asked = number("gpu_share_asked");
  const auto err = v.find("gpu_share_error");
  if (share != 0)
    std::printf("pid %d: GPU-time share %llu.%llu%%; it waited for its turn %llu time(s), %.3f s in all\n", pid, share / 10,
                share % 10, number("turn_waits"), static_cast<double>(number("turn_wait_ns")) / 1e9);
  else if (asked != 0)
    std::printf("pid %d: GPU-time share %llu.%llu%% asked, not in force: %s\n", pid, asked / 10, asked % 10,
                err != v.end() ? err->second.s.c_str() : "it counts once the job uses a GPU");
  else std::printf("pid %d: no GPU-time share\n", pid);
  const auto sms_err = v.find("sms_error");
  if (const unsigned long long sms = number("sms"); sms != 0 && number("sms_granted") != 0)
    std::printf("pid %d: SM limit %llu: its kernels run on %llu of the GPU's %llu SMs\n", pid, sms, number("sms_granted"),
                number("sms_total"));
  else if (sms_err != v.end()) std::printf("pid %d: no SM limit: %s\n", pid, sms_err->second.s.c_str());
  else if (sms != 0) std::printf("pid %d: SM limit %llu asked: in force once the job makes its context\n", pid, sms);
  return 0;
}

int resume(int pid, const std::string& jobs_dir, std::string job_socket, const std::string& shared, uint64_t started) {
  if (job_socket.empty()) {
    std::string dir = jobs_dir.empty() ? pos::jobs_dir_of_process(pid) : jobs_dir;
    job_socket = pos::job_socket_path(dir.empty() ? pos::default_jobs_dir() : dir, pid);
  }
  std::vector<int> fds;
  unsigned long long count = 0, cut = 0;
  unsigned list = 0;
  if (!shared.empty()) {
    char extra = 0;
    if (std::sscanf(shared.c_str(), "%llu:%u:%llu%c", &count, &list, &cut, &extra) != 3 || count > pos::kMaxFds) {
      std::fprintf(stderr, "pos-cli resume: --shared-fds wants COUNT:LIST:CUT, not '%s'\n", pos::printable(shared, 64).c_str());
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
  auto r = pos::resume_driver_job(job_socket, static_cast<uint32_t>(pid), fds, list, cut, started);
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
  bool lazy = false, json = false, latest = false, hold = false;
  int device = -1;  // --device N (in-process jobs): restore onto CUDA device N of this host
  std::string gpu_first;  // hidden, with --hold: a migration target's GPU part ahead of the rest
  std::string stage;      // hidden, with --gpu-first: an earlier image staged before it (docs/migration.md)
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
  // This process works on another process's GPUs: it must see them all, whatever its own
  // environment hides (NVIDIA's restore onto other GPUs fails when the caller does not see every
  // GPU the job had), and --device N is an ordinal of the whole host. Cleared before the driver
  // is loaded, which reads it once.
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  pos::JobRestoreOptions o;
  o.dir = a.dir;
  o.socket = a.socket;
  o.lazy = a.lazy;
  o.device = a.device;
  if (a.hold) {
    // A migration target's: says the job is restored and held, then waits for "go" on stdin.
    o.hold = [](uint32_t pid, const pos::JobRestoreReport& so_far) {
      // The phases so far go back to the migration's source (its report's target_* fields).
      std::printf("{\"held\":%u,\"check_s\":%.6f,\"criu_s\":%.6f,\"gpu_ahead\":%s}\n", pid, so_far.rest_check_s,
                  so_far.criu_s, so_far.gpu_ahead ? "true" : "false");
      std::fflush(stdout);
      char line[16] = {0};
      return std::fgets(line, sizeof(line), stdin) != nullptr && std::strncmp(line, "go", 2) == 0;
    };
    if (!a.gpu_first.empty()) {
      // The migration target's posd restores the GPU part as soon as it arrived, then says "criu"
      // once the rest of the image is there too (its link closing says the migration ended).
      o.gpu_first = a.gpu_first;
      o.rest = [] {
        std::printf("{\"gpu_restored\":true}\n");
        std::fflush(stdout);
        char line[16] = {0};
        return std::fgets(line, sizeof(line), stdin) != nullptr && std::strncmp(line, "criu", 4) == 0;
      };
      if (!a.stage.empty()) {
        // Staged while the pre-copy goes on; the stop's GPU part comes with a line "prepare".
        o.stage = a.stage;
        o.staged = [](bool ok, const std::string& note) {
          std::printf("{\"staged\":%s,\"note\":%s}\n", ok ? "true" : "false", pos::json_string(note).c_str());
          std::fflush(stdout);
          char line[16] = {0};
          return std::fgets(line, sizeof(line), stdin) != nullptr && std::strncmp(line, "prepare", 7) == 0;
        };
      }
    } else if (!a.stage.empty()) {
      std::fprintf(stderr, "pos-cli restore: --stage is for a migration target's restore ahead (--gpu-first)\n");
      return 2;
    }
  } else if (!a.gpu_first.empty()) {
    std::fprintf(stderr, "pos-cli restore: --gpu-first is for a migration target's held restore (--hold)\n");
    return 2;
  }
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
                "\"phases\":{\"check_s\":%.6f,\"gpu_s\":%.6f,\"criu_s\":%.6f,\"reattach_s\":%.6f,\"load_s\":%.6f,\"resumed_s\":%.6f,"
                "\"total_s\":%.6f},\"handoff\":%s,\"loaded_while_running\":%s,"
                "\"device\":%d,\"device_uuid\":%s,\"moved\":%s,\"staged\":%s,\"note\":%s}\n",
                r->pid, pos::json_string(a.dir).c_str(), pos::json_string(a.socket).c_str(), a.lazy ? "true" : "false",
                (unsigned long long)r->gpu_bytes, (unsigned long long)r->handles, r->check_s, r->gpu_s, r->criu_s,
                r->reattach_s, r->load_s, r->resumed_s, r->total_s, r->handoff ? "true" : "false", r->lazy ? "true" : "false", r->device,
                pos::json_string(r->device_uuid).c_str(), r->moved ? "true" : "false", r->staged ? "true" : "false",
                pos::json_string(r->note).c_str());
  } else if (r->lazy) {
    std::printf("restored pid %u from %s: running again after %.3f s (CPU state by CRIU in %.3f s, re-attached in %.3f s); "
                "its device memory (%llu handles, %llu bytes) loaded while it ran, done after %.3f s\n",
                r->pid, a.dir.c_str(), r->resumed_s, r->criu_s, r->reattach_s, (unsigned long long)r->handles,
                (unsigned long long)r->gpu_bytes, r->total_s);
    if (r->moved) std::printf("moved onto CUDA device %d (%s)\n", r->device, r->device_uuid.c_str());
  } else {
    std::printf("restored pid %u from %s: GPU state %s(%llu handles, %llu bytes) in %.3f s, CPU state by CRIU in %.3f s, "
                "re-attached in %.3f s; total %.3f s\n",
                r->pid, a.dir.c_str(), a.lazy && r->note.empty() ? "loading lazily " : "", (unsigned long long)r->handles,
                (unsigned long long)r->gpu_bytes, r->gpu_s, r->criu_s, r->reattach_s, r->total_s);
    if (r->moved) std::printf("moved onto CUDA device %d (%s)\n", r->device, r->device_uuid.c_str());
  }
  if (!r->note.empty()) std::printf("note: %s\n", r->note.c_str());
  return 0;
}

// ---- pos-cli checkpoint: continuous checkpointing (docs/continuous_checkpointing.md) ----

struct CheckpointArgs {
  int pid = 0;
  std::string dir, every, socket, jobs_dir;
  uint32_t keep = 3, full_every = 10;
  std::string mode = "async";
  double wait_s = 0;  // --wait: how long to wait for the job to answer (pos run starts the policy before the job)
  bool with_cpu = false, stop = false, foreground = false, json = false;
};

std::atomic<bool> g_stop_checkpoints{false};
void on_stop_signal(int) { g_stop_checkpoints.store(true); }

// `--stop`: the policy's checkpointer asked to end (it finishes the checkpoint in progress) and
// waited for.
int stop_checkpoints(const CheckpointArgs& a, const JobTarget& target) {
  const std::string path = pos::policy_status_path(target.jobs_dir, static_cast<uint32_t>(a.pid));
  auto s = pos::read_policy_status(path);
  if (!s.ok()) {
    std::fprintf(stderr, "pos-cli checkpoint: no checkpoint policy for pid %d (%s)\n", a.pid, s.status().message().c_str());
    return 1;
  }
  if (s->state != "running" || !pos::checkpointer_alive(*s)) {
    std::printf("the checkpoint policy of pid %d is not running (%s); %llu restore points taken, newest %s\n", a.pid,
                s->state == "running" ? "its checkpointer is gone" : s->state.c_str(), (unsigned long long)s->taken,
                s->newest.empty() ? "none" : (s->dir + "/" + s->newest).c_str());
    return 0;
  }
  if (::kill(static_cast<pid_t>(s->checkpointer), SIGTERM) != 0) {
    std::fprintf(stderr, "pos-cli checkpoint: cannot stop checkpointer pid %u: %s\n", s->checkpointer, std::strerror(errno));
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  bool said = false;
  while (pos::checkpointer_alive(*s)) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > 1 && !said) {
      std::fprintf(stderr, "pos-cli checkpoint: waiting for the checkpoint in progress to finish...\n");
      said = true;
    }
    if (waited > 600) {
      std::fprintf(stderr, "pos-cli checkpoint: checkpointer pid %u did not end within 10 minutes\n", s->checkpointer);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto last = pos::read_policy_status(path);
  const pos::PolicyStatus& f = last.ok() ? *last : *s;
  std::printf("stopped the checkpoint policy of pid %d: %llu restore points taken (%llu failed), newest %s\n", a.pid,
              (unsigned long long)f.taken, (unsigned long long)f.failed,
              f.newest.empty() ? "none" : (f.dir + "/" + f.newest).c_str());
  return 0;
}

int checkpoint(const CheckpointArgs& a) {
  JobTarget target = find_job(a.pid, a.jobs_dir);
  // Started beside a job that is still coming up (pos run --checkpoint-every): wait until it
  // answers on its control socket, or is gone.
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.wait_s);
       !a.stop && !target.inproc && std::chrono::steady_clock::now() < until && pos::process_running(static_cast<uint32_t>(a.pid));) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    target = find_job(a.pid, a.jobs_dir);
  }
  if (a.stop) return stop_checkpoints(a, target);
  if (a.dir.empty() || a.every.empty()) {
    std::fprintf(stderr, "pos-cli checkpoint: -D DIR and --every INTERVAL are required (or --stop)\n");
    return 2;
  }
  auto every = pos::parse_interval(a.every);
  if (!every.ok()) {
    std::fprintf(stderr, "pos-cli checkpoint: --every: %s\n", every.status().message().c_str());
    return 2;
  }
  if (::kill(a.pid, 0) != 0 && errno == ESRCH) {
    std::fprintf(stderr, "pos-cli checkpoint: no process %d\n", a.pid);
    return 1;
  }
  pos::CheckpointPolicy p;
  p.pid = static_cast<uint32_t>(a.pid);
  p.dir = a.dir;
  p.every_s = *every;
  p.keep = a.keep;
  p.full_every = a.full_every;
  p.with_cpu = a.with_cpu;
  p.async = a.mode == "async";
  p.socket = a.socket;
  if (target.inproc) p.job_socket = target.job_socket;
  p.resume_program = self_program();
  const std::string status_path = pos::policy_status_path(target.jobs_dir, p.pid);
  const auto describe = [&](uint32_t checkpointer) {
    char b[1024];
    std::snprintf(b, sizeof(b),
                  "checkpointing pid %d into %s every %.3g s: %s, keeping %u (whole every %u); checkpointer pid %u; "
                  "pos-cli ps shows it, pos-cli checkpoint -t %d --stop ends it",
                  a.pid, a.dir.c_str(), *every, a.with_cpu ? "restore points of GPU and CPU state" : "GPU state only",
                  a.keep, a.full_every, checkpointer, a.pid);
    return std::string(b);
  };
  const std::function<bool()> alive = pos::same_process(p.pid);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  if (a.foreground) {
    auto r = pos::CheckpointRunner::open(p, status_path, pos::job_checkpoint_tick(p));
    if (!r.ok()) {
      std::fprintf(stderr, "pos-cli checkpoint: %s\n", r.status().message().c_str());
      return 1;
    }
    (*r)->set_log([](const std::string& l) { std::printf("%s\n", l.c_str()), std::fflush(stdout); });
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    std::printf("%s\n", describe(static_cast<uint32_t>(::getpid())).c_str());
    std::fflush(stdout);
    (*r)->run(g_stop_checkpoints, alive);
    return 0;
  }
  // In the background: the child becomes the checkpointer and says, through a pipe, whether its
  // policy started (or why not) before this process returns.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "pos-cli checkpoint: pipe: %s\n", std::strerror(errno));
    return 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child < 0) {
    std::fprintf(stderr, "pos-cli checkpoint: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    ::close(fds[0]);
    ::setsid();
    auto say = [&](const std::string& m) {
      (void)!::write(fds[1], m.data(), m.size());
      ::close(fds[1]);
    };
    auto r = pos::CheckpointRunner::open(p, status_path, pos::job_checkpoint_tick(p));
    if (!r.ok()) {
      say("E" + r.status().message());
      ::_exit(1);
    }
    const std::string log = (*r)->status().dir + "/checkpoint.log";
    const int lf = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    const int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (lf < 0 || nul < 0) {
      say("Ecannot open " + log + ": " + std::strerror(errno));
      ::_exit(1);
    }
    ::dup2(nul, 0), ::dup2(lf, 1), ::dup2(lf, 2);
    ::close(lf), ::close(nul);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    ::signal(SIGHUP, SIG_IGN);
    auto stamp = [](const std::string& l) {
      char t[32];
      const time_t now = std::time(nullptr);
      struct tm tmv {};
      gmtime_r(&now, &tmv);
      std::strftime(t, sizeof(t), "%Y-%m-%dT%H:%M:%SZ", &tmv);
      std::printf("%s %s\n", t, l.c_str());
      std::fflush(stdout);
    };
    (*r)->set_log(stamp);
    stamp(describe(static_cast<uint32_t>(::getpid())));
    say("O");
    (*r)->run(g_stop_checkpoints, alive);
    std::fflush(stdout);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string answer;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) answer.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (answer.empty() || answer[0] != 'O') {
    int st = 0;
    ::waitpid(child, &st, 0);
    std::fprintf(stderr, "pos-cli checkpoint: %s\n", answer.empty() ? "the checkpointer ended before it started" : answer.c_str() + 1);
    return 1;
  }
  if (a.json) {
    std::printf("{\"pid\":%d,\"dir\":%s,\"every_s\":%.6f,\"keep\":%u,\"full_every\":%u,\"with_cpu\":%s,\"checkpointer\":%d,"
                "\"status\":%s,\"inproc\":%s}\n",
                a.pid, pos::json_string(a.dir).c_str(), *every, a.keep, a.full_every, a.with_cpu ? "true" : "false",
                static_cast<int>(child), pos::json_string(status_path).c_str(), target.inproc ? "true" : "false");
  } else {
    std::printf("%s; log: %s/checkpoint.log\n", describe(static_cast<uint32_t>(child)).c_str(), a.dir.c_str());
  }
  return 0;
}

// ps's part for continuous checkpoints: one row (or object) per policy in the jobs directory.
std::string policies_text(const std::vector<pos::PolicyStatus>& ps, bool json) {
  const uint64_t now = static_cast<uint64_t>(std::time(nullptr));
  if (json) {
    std::string arr = "[";
    for (const pos::PolicyStatus& s : ps) {
      std::string o = pos::policy_status_json(s);
      while (!o.empty() && o.back() == '\n') o.pop_back();
      o.insert(o.size() - 1, std::string(",\"alive\":") + (pos::checkpointer_alive(s) ? "true" : "false") +
                                 ",\"newest_age_s\":" + (s.newest_time ? std::to_string(now - std::min(now, s.newest_time)) : "null"));
      arr += (arr.size() > 1 ? "," : "") + o;
    }
    return arr + "]";
  }
  std::string t;
  char line[1024];
  std::snprintf(line, sizeof(line), "\n%-8s %-8s %-8s %-5s %-8s %-7s %-10s %9s %9s %10s %12s %6s  %s\n", "PID", "POLICY",
                "EVERY", "KEEP", "PARTS", "POINTS", "NEWEST", "AGE (s)", "TOOK (s)", "PAUSED(ms)", "BYTES", "FAILED",
                "DIR / LAST ERROR");
  t += line;
  for (const pos::PolicyStatus& s : ps) {
    const bool alive = pos::checkpointer_alive(s);
    const std::string state = s.state == "running" && !alive ? "gone" : s.state;
    char every[32];
    std::snprintf(every, sizeof(every), "%.3gs", static_cast<double>(s.every_us) / 1e6);
    const std::string age = s.newest_time ? std::to_string(now - std::min(now, s.newest_time)) : "-";
    std::snprintf(line, sizeof(line), "%-8u %-8s %-8s %-5llu %-8s %-7llu %-10s %9s %9.3f %10.3f %12llu %6llu  %s%s\n", s.pid,
                  state.c_str(), every, (unsigned long long)s.keep, s.with_cpu ? "gpu+cpu" : "gpu", (unsigned long long)s.points,
                  s.newest.empty() ? "-" : s.newest.c_str(), age.c_str(), static_cast<double>(s.last_duration_us) / 1e6,
                  static_cast<double>(s.last_pause_us) / 1e3, (unsigned long long)s.last_bytes, (unsigned long long)s.failed,
                  pos::fit_columns(s.dir, 60).c_str(),
                  s.last_error.empty() ? "" : ("\n         last error: " + pos::fit_columns(s.last_error, 200)).c_str());
    t += line;
  }
  t += std::to_string(ps.size()) + " checkpoint polic" + (ps.size() == 1 ? "y" : "ies") + "\n";
  return t;
}

// ---- pos-cli migrate (docs/migration.md) ----

std::string gb(uint64_t b) {
  char t[32];
  std::snprintf(t, sizeof(t), "%.2f GB", static_cast<double>(b) / 1e9);
  return t;
}

struct MigrateArgs {
  int pid = 0;
  std::string to, socket, work_dir, jobs_dir, secret_file;
  std::string resolve, resolve_dir;  // a guardian's question to the target (docs/migration.md)
  uint32_t max_rounds = 5;
  double max_downtime_ms = 300;
  bool eager = false, keep_images = false, json = false, move_process = false, settle = false;
  bool no_peer = false;
  bool no_fallback = false;
  bool no_stage = false;
  int device = -1;  // --device N: an in-process job moved to this host's CUDA device N
};

// pos-cli migrate -t PID --device N of an in-process job: its GPU moves, its process stays.
int move_inproc(const MigrateArgs& a, const std::string& job_socket) {
  // As for restore: N counts every GPU of this host, and NVIDIA's restore must see them all.
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  pos::JobMoveOptions o;
  o.pid = static_cast<uint32_t>(a.pid), o.job_socket = job_socket, o.device = a.device;
  o.resume_program = self_program();
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  o.progress = [&](const char* phase) {
    if (tty && !a.json) std::fprintf(stderr, "\r\033[Kmigrate: %s...", phase);
  };
  auto r = pos::move_driver_job(o);
  if (tty && !a.json) std::fputs("\r\033[K", stderr);
  if (!r.ok()) {
    std::fprintf(stderr, "pos-cli migrate: %s\n", r.status().message().c_str());
    return 1;
  }
  if (a.json) {
    std::printf("{\"pid\":%u,\"inproc\":true,\"from\":%d,\"from_uuid\":%s,\"to\":%d,\"to_uuid\":%s,\"gpu_bytes\":%llu,"
                "\"handles\":%llu,\"paused_s\":%.6f,\"phases\":{\"hold_s\":%.6f,\"checkpoint_s\":%.6f,\"copy_s\":%.6f,"
                "\"restore_s\":%.6f,\"take_s\":%.6f,\"total_s\":%.6f},\"note\":%s}\n",
                r->pid, r->from, pos::json_string(r->from_uuid).c_str(), r->to, pos::json_string(r->to_uuid).c_str(),
                (unsigned long long)r->bytes, (unsigned long long)r->handles, r->paused_s, r->hold_s, r->checkpoint_s,
                r->copy_s, r->restore_s, r->take_s, r->total_s, pos::json_string(r->note).c_str());
  } else {
    std::printf("moved pid %u from CUDA device %d to %d (%s): %s of GPU memory copied device to device in %.3f s; the "
                "job was held %.3f s (NVIDIA's checkpoint %.3f s, restore %.3f s)\n",
                r->pid, r->from, r->to, r->to_uuid.c_str(), gb(r->bytes).c_str(), r->copy_s, r->paused_s,
                r->checkpoint_s, r->restore_s);
    if (!r->note.empty()) std::printf("note: %s\n", r->note.c_str());
  }
  return 0;
}

int migrate(const MigrateArgs& a) {
  if (!a.resolve.empty()) {
    // Run by a migration's guardian when pos-cli died after it sent the commit.
    pos::JobResolveOptions ro;
    ro.pid = static_cast<uint32_t>(a.pid), ro.id = a.resolve, ro.dir = a.resolve_dir, ro.to = a.to;
    ro.secret_file = a.secret_file, ro.socket = a.socket;
    auto where = pos::resolve_migration(ro);
    if (!where.ok()) {
      std::fprintf(stderr, "pos-cli migrate --resolve: %s\n", where.status().message().c_str());
      return 1;
    }
    std::fprintf(stderr, "pos-cli migrate --resolve: pid %d runs %s\n", a.pid,
                 *where == "target" ? ("at " + a.to + " (the target committed)").c_str() : "on the source again (the target ended its copy)");
    return *where == "target" ? 0 : 3;
  }
  if (a.settle) {
    // Run by a live switch's guardian when pos-cli died after it let the job re-attach to the target.
    pos::JobSettleOptions so;
    so.pid = static_cast<uint32_t>(a.pid), so.dir = a.resolve_dir, so.to = a.to, so.socket = a.socket;
    auto where = pos::settle_migration(so);
    if (!where.ok()) {
      std::fprintf(stderr, "pos-cli migrate --settle: %s\n", where.status().message().c_str());
      return 1;
    }
    std::fprintf(stderr, "pos-cli migrate --settle: pid %d runs %s\n", a.pid,
                 *where == "target" ? ("under " + a.to).c_str() : "on the source again (the target gave it up)");
    return *where == "target" ? 0 : 3;
  }
  const JobTarget target = find_job(a.pid, a.jobs_dir);
  const bool to_host = a.to.find('/') == std::string::npos && a.to.find(':') != std::string::npos;  // as migrate_job
  if (target.inproc) {
    if (a.device >= 0 && !a.to.empty()) {
      std::fprintf(stderr, "pos-cli migrate: --device N (another GPU of this host) or --to HOST:PORT (another host), "
                   "not both\n");
      return 2;
    }
    if (a.device >= 0) return move_inproc(a, target.job_socket);
    if (!to_host) {
      std::fprintf(stderr, "pos-cli migrate: pid %d is an in-process job (pos run): --device N moves it to another GPU "
                   "of this host, --to HOST:PORT to a posd accepting migrations on another host\n", a.pid);
      return 2;
    }
    if (a.move_process || a.no_peer) {
      std::fprintf(stderr, "pos-cli migrate: --move-process and --no-peer are for posd jobs: an in-process job always "
                   "moves with its process, through image files\n");
      return 2;
    }
  }
  if (a.device >= 0) {
    std::fprintf(stderr, "pos-cli migrate: --device is for in-process jobs (pos run); pid %d runs under posd: --to the "
                 "posd that serves the other GPU\n", a.pid);
    return 2;
  }
  if (a.to.empty()) {
    std::fprintf(stderr, "pos-cli migrate: --to is required (the target posd)\n");
    return 2;
  }
  pos::JobMigrateOptions o;
  o.socket = a.socket, o.to = a.to, o.pid = static_cast<uint32_t>(a.pid), o.work_dir = a.work_dir;
  o.secret_file = a.secret_file;
  o.max_rounds = a.max_rounds;
  o.max_downtime_s = a.max_downtime_ms / 1e3;
  o.lazy = !a.eager;
  o.keep_images = a.keep_images;
  o.move_process = a.move_process;
  o.peer = !a.no_peer;
  o.peer_fallback = !a.no_fallback;
  o.stage = !a.no_stage;
  o.self_program = self_program();
  if (target.inproc) o.job_socket = target.job_socket;
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  // One host, the process kept: the peer switch needs no rounds.
  const bool remote = to_host;
  const bool peer = o.peer && !a.move_process && !remote;
  if (tty && !a.json)
    std::fprintf(stderr, peer ? "migrate: detaching the job..." : "migrate: round 1 (the whole GPU state)...");
  o.progress = [&](const char* ev, const pos::JobMigrateOptions::Round& r) {
    if (!tty || a.json) return;
    const std::string e = ev;
    // A stop now would copy about what this round did (what the job wrote meanwhile), at its rate.
    if (e == "round")
      std::fprintf(stderr,
                   "\r\033[Kmigrate: round %u: %s sent (%s unchanged) in %.3f s, %.2f GB/s; about %s dirty, a stop "
                   "now would take about %.3f s + %s...",
                   r.n, gb(r.bytes).c_str(), gb(r.bytes_referenced).c_str(), r.seconds, r.rate / 1e9, gb(r.bytes).c_str(),
                   r.seconds, a.move_process || a.to.find('/') == std::string::npos ? "CRIU" : "the restore");
    else if (e == "switch" && peer)
      std::fprintf(stderr, "\r\033[Kmigrate: stopping the job (its device memory goes device to device)...");
    else if (e == "switch")
      std::fprintf(stderr, "\r\033[Kmigrate: stopping the job (about %s left to copy)...", gb(r.bytes).c_str());
    else if (e == "restore")
      std::fprintf(stderr, "\r\033[Kmigrate: restoring on %s...", a.to.c_str());

    else if (e == "fallback")
      std::fprintf(stderr, "\r\033[Kmigrate: the target failed; restoring on the source...");
    else if (e == "peer-fallback")
      std::fprintf(stderr, "\r\033[Kmigrate: the source could not hand its memory over; round 1 through files...");
  };
  auto r = pos::migrate_job(o);
  if (tty && !a.json) std::fputs("\r\033[K", stderr);
  if (!r.ok()) {
    std::fprintf(stderr, "pos-cli migrate: %s\n", r.status().message().c_str());
    return 1;
  }
  if (a.json) {
    std::string rounds;
    for (const auto& x : r->rounds) {
      char t[480];
      std::snprintf(t, sizeof(t),
                    "%s{\"round\":%u,\"bytes\":%llu,\"bytes_unchanged\":%llu,\"criu_bytes\":%llu,\"seconds\":%.6f,"
                    "\"rate\":%.0f,\"pause_s\":%.6f,\"sent\":%llu,\"streamed\":%llu,\"transfer_s\":%.6f,"
                    "\"next_estimate\":%llu,\"window_s\":%.6f,\"window_bytes\":%llu}",
                    rounds.empty() ? "" : ",", x.n, (unsigned long long)x.bytes, (unsigned long long)x.bytes_referenced,
                    (unsigned long long)x.criu_bytes, x.seconds, x.rate, x.pause_s, (unsigned long long)x.sent,
                    (unsigned long long)x.streamed, x.transfer_s, (unsigned long long)x.next_estimate, x.window_s,
                    (unsigned long long)x.window_bytes);
      rounds += t;
    }
    std::printf("{\"pid\":%u,\"inproc\":%s,\"from\":%s,\"to\":%s,\"where\":\"%s\",\"target_error\":%s,\"rounds\":[%s],\"stop_reason\":\"%s\","
                "\"final_bytes\":%llu,\"final_criu_bytes\":%llu,\"final_criu_pages_to_parent\":%llu,\"dump_s\":%.6f,\"restore_s\":%.6f,\"downtime_s\":%.6f,"
                "\"total_s\":%.6f,\"work_dir\":%s,\"kept\":%s,\"remote\":%s,\"same_host\":%s,\"final_sent\":%llu,"
                "\"commit_answer_lost\":%s,\"live\":%s,\"release_error\":%s,\"peer\":%s,\"peer_bytes\":%llu,"
                "\"peer_export_s\":%.6f,\"target_copy_s\":%.6f,\"detach_s\":%.6f,\"stop_image_s\":%.6f,"
                "\"reattach_s\":%.6f,\"target_welcome_s\":%.6f,\"peer_send_s\":%.6f,\"peer_fallback\":%s,"
                "\"stop_cut_s\":%.6f,\"stop_criu_s\":%.6f,\"final_send_s\":%.6f,\"pid_free_s\":%.6f,"
                "\"target_restore_s\":%.6f,\"commit_s\":%.6f,\"stop_gpu_part_s\":%.6f,\"stop_early_send_s\":%.6f,"
                "\"final_sent_early\":%llu,\"final_sent_draining\":%llu,\"target_staged\":%s,\"target_check_s\":%.6f,"
                "\"target_criu_s\":%.6f,\"stage_ready\":%s,\"stage_wait_s\":%.6f,\"setup_s\":%.6f,"
                "\"rounds_s\":%.6f}\n",
                r->pid, target.inproc ? "true" : "false", pos::json_string(a.socket).c_str(), pos::json_string(a.to).c_str(), r->where.c_str(),
                pos::json_string(r->target_error).c_str(), rounds.c_str(), r->stop_reason.c_str(),
                (unsigned long long)r->final_bytes, (unsigned long long)r->final_criu_bytes,
                (unsigned long long)r->final_criu_pages_to_parent, r->dump_s, r->restore_s,
                r->downtime_s, r->total_s, pos::json_string(r->work_dir).c_str(), a.keep_images ? "true" : "false",
                r->remote ? "true" : "false", r->same_host ? "true" : "false", (unsigned long long)r->final_sent,
                r->commit_answer_lost ? "true" : "false", r->live ? "true" : "false",
                pos::json_string(r->release_error).c_str(), r->peer ? "true" : "false",
                (unsigned long long)r->peer_bytes, r->peer_export_s, r->target_copy_s, r->detach_s, r->stop_image_s,
                r->reattach_s, r->target_welcome_s, r->peer_send_s, pos::json_string(r->peer_fallback).c_str(),
                r->stop_cut_s, r->stop_criu_s, r->final_send_s, r->pid_free_s, r->target_restore_s, r->commit_s,
                r->stop_gpu_part_s, r->stop_early_send_s, (unsigned long long)r->final_sent_early,
                (unsigned long long)r->final_sent_draining, r->target_staged ? "true" : "false", r->target_check_s,
                r->target_criu_s, r->stage_ready ? "true" : "false", r->stage_wait_s, r->setup_s, r->rounds_s);
  } else {
    for (const auto& x : r->rounds)
      std::printf("round %u: %s sent, %s unchanged, %.3f s (%.2f GB/s), job paused %.3f ms\n", x.n, gb(x.bytes).c_str(),
                  gb(x.bytes_referenced).c_str(), x.seconds, x.rate / 1e9, x.pause_s * 1e3);
    const char* why = r->stop_reason == "budget"      ? "the last round fits the downtime budget"
                      : r->stop_reason == "converged" ? "the rounds stopped shrinking"
                      : r->stop_reason == "no-shrink" ? "another round would not shrink what the stop copies"
                                                      : "the round limit";
    if (r->where == "target" && r->peer)
      std::printf("migrated pid %u to %s device to device: %s of GPU memory handed over (export %.3f s, the "
                  "target's copy and handles %.3f s); downtime %.3f s, total %.3f s\n",
                  r->pid, a.to.c_str(), gb(r->peer_bytes).c_str(), r->peer_export_s, r->target_copy_s, r->downtime_s,
                  r->total_s);
    else if (r->where == "target")
      std::printf("migrated pid %u to %s after %zu round(s) (%s): stop %.3f s (%s of GPU state), restore %.3f s; "
                  "downtime %.3f s, total %.3f s\n",
                  r->pid, a.to.c_str(), r->rounds.size(), why, r->dump_s, gb(r->final_bytes).c_str(), r->restore_s,
                  r->downtime_s, r->total_s);
    else
      std::printf("pid %u could not start on %s (%s); it runs on at the source %s after a stop of %.3f s\n", r->pid,
                  a.to.c_str(), r->target_error.c_str(), a.socket.c_str(), r->downtime_s);
    if (!r->release_error.empty())
      std::printf("note: the job's session at the source could not be released (%s); it ends with the job\n",
                  r->release_error.c_str());
    if (!r->peer_fallback.empty())
      std::printf("note: the source could not hand the job's device memory over (%s); it moved through image files "
                  "instead, after a first pause at the source\n",
                  r->peer_fallback.c_str());
    if (a.keep_images) std::printf("images kept in %s\n", r->work_dir.c_str());
  }
  return r->where == "target" ? 0 : 3;
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
  restore_cmd->add_flag("--lazy", ra.lazy, "run on while device memory loads (posd jobs: each buffer before its first use; in-process jobs: their GPU work waits on the device until the load ends)");
  restore_cmd->add_option("--device", ra.device,
                          "an in-process job's image (pos run): restore it onto CUDA device N of this host (its ordinal "
                          "with CUDA_VISIBLE_DEVICES ignored), a GPU of the model it ran on")
      ->check(CLI::NonNegativeNumber);
  restore_cmd->add_flag("--json", ra.json, "one JSON report");
  restore_cmd->add_flag("--hold", ra.hold,
                        "once CRIU restored the job, print {\"held\":PID,...} and let it re-attach only after a line "
                        "\"go\" on stdin (anything else ends it): a migration target's commit");
  restore_cmd->add_option("--gpu-first", ra.gpu_first,
                          "(a migration target's posd runs it) restore the GPU part from DIR/gpu and this file of the "
                          "job's pid, uid, arena and token before the rest of the image exists; then wait for a line "
                          "\"criu\" on stdin")
      ->group("");  // hidden
  restore_cmd->add_option("--stage", ra.stage,
                          "(with --gpu-first) first restore this earlier image of the job (a pre-copy round) into a "
                          "staging session, print {\"staged\":...}, wait for a line \"prepare\" on stdin; the GPU "
                          "part then copies what that image holds unchanged from the staging session's memory")
      ->group("");  // hidden
  restore_cmd->add_flag("--latest", ra.latest,
                        "-D names a directory of images (pos-cli images): restore the newest restorable one");

  std::string images_dir;
  bool images_json = false;
  CLI::App* images_cmd = app.add_subcommand(
      "images", "list the job images in a directory (one per subdirectory): kind, time, bytes, previous image, state");
  images_cmd->add_option("DIR", images_dir, "the directory that holds the images")->required();
  images_cmd->add_flag("--json", images_json, "one JSON object");

  int limit_pid = 0;
  std::string limit_jobs_dir, limit_memory, limit_share;
  bool limit_json = false;
  CLI::App* limit_cmd = app.add_subcommand("limit", "show or change a job's limits (pos run --memory / --gpu-share, posd.limits)");
  limit_cmd->add_option("-t,--tree", limit_pid, "the job's pid")->required()->check(CLI::PositiveNumber);
  limit_cmd->add_option("--memory", limit_memory, "its device-memory limit (8GiB, 512MiB; 0: none)");
  limit_cmd->add_option("--gpu-share", limit_share,
                        "its share of its GPU's time while other jobs want it too (30%, 12.5%; 0: none)");
  std::string limit_sms;
  limit_cmd->add_option("--sms", limit_sms, "refused: an SM limit is set when the job starts (pos run --sms N)");
  limit_cmd->add_option("--jobs-dir", limit_jobs_dir, "where in-process jobs put their control sockets (default: the job's own)");
  limit_cmd->add_flag("--json", limit_json, "the job's answer as JSON");
  std::string limit_socket = pos::default_socket_path();
  limit_cmd->add_option("--socket", limit_socket, "posd's socket, for a job under posd")->capture_default_str();

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
                         "COUNT:LIST:CUT: the job's device memory in descriptors 3.. (a dump's guardian passes them)");
  uint64_t resume_started = 0;
  resume_cmd->add_option("--start-time", resume_started,
                         "resume only the process started at this time (/proc/PID/stat's; a dump's guardian passes it)");

  CheckpointArgs ca;
  ca.socket = pos::default_socket_path();
  CLI::App* ckpt_cmd = app.add_subcommand(
      "checkpoint", "checkpoint a running job every interval into a directory of restore points (or --stop)");
  ckpt_cmd->add_option("-t,--tree", ca.pid, "the job's pid")->required()->check(CLI::PositiveNumber);
  ckpt_cmd->add_option("-D,--images-dir", ca.dir, "the directory of its restore points (cp-NNNNNN; made if missing)");
  ckpt_cmd->add_option("--every", ca.every, "the interval: 30s, 500ms, 2m, 1h");
  ckpt_cmd->add_option("--keep", ca.keep, "the newest restore points kept (the oldest of them made whole, so that older ones can go)")
      ->check(CLI::Range(1u, 100000u))
      ->capture_default_str();
  ckpt_cmd->add_option("--full-every", ca.full_every,
                       "every K-th restore point is whole; the others hold only what changed since the one before")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  ckpt_cmd->add_flag("--with-cpu", ca.with_cpu,
                     "each restore point a whole process (CRIU with the GPU state: restorable); else GPU state only");
  ckpt_cmd->add_option("--mode", ca.mode, "how a posd job's GPU bytes are drained with --with-cpu: sync, or async (copy-on-write)")
      ->check(CLI::IsMember({"sync", "async"}))
      ->capture_default_str();
  ckpt_cmd->add_option("--wait", ca.wait_s,
                       "wait up to this many seconds for an in-process job to answer on its control socket (pos run "
                       "starts its policy as the job starts)")
      ->check(CLI::Range(0.0, 3600.0));
  ckpt_cmd->add_flag("--stop", ca.stop, "end the job's policy (the checkpoint in progress finishes first)");
  ckpt_cmd->add_flag("--foreground", ca.foreground, "run the policy in this process (its log on stdout) until stopped");
  ckpt_cmd->add_flag("--json", ca.json, "one JSON report of the started policy");
  ckpt_cmd->add_option("--socket", ca.socket, "posd's socket")->capture_default_str();
  ckpt_cmd->add_option("--jobs-dir", ca.jobs_dir,
                       "where in-process jobs put their control sockets and policies their status (default: the job's own)");

  MigrateArgs ma;
  ma.socket = pos::default_socket_path();
  CLI::App* migrate_cmd = app.add_subcommand(
      "migrate", "move a running job to another posd (this host or another), or an in-process job to another GPU or "
                 "host: pre-copy rounds while it runs, then a short stop");
  migrate_cmd->add_option("-t,--tree", ma.pid, "the job's pid (its client of posd: pos-cli ps)")->required()->check(
      CLI::PositiveNumber);
  migrate_cmd->add_option("--to", ma.to, "the target posd: its socket on this host, or HOST:PORT where a posd accepts "
                          "migrations (the only target of an in-process job, besides --device)");
  migrate_cmd->add_option("--device", ma.device,
                          "an in-process job (pos run): move it to CUDA device N of this host, its process kept "
                          "(N counts every GPU, CUDA_VISIBLE_DEVICES ignored)")
      ->check(CLI::NonNegativeNumber);
  migrate_cmd->add_option("--secret-file", ma.secret_file,
                          "with --to HOST:PORT: the file holding the secret that posd shares (0600, at least 16 bytes)");
  migrate_cmd->add_option("--max-rounds", ma.max_rounds, "pre-copy rounds at most (the first copies everything)")
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  migrate_cmd->add_option("--max-downtime", ma.max_downtime_ms,
                          "the stop's budget in milliseconds: rounds go on until the last one would fit")
      ->check(CLI::Range(1.0, 3600e3))
      ->capture_default_str();
  migrate_cmd->add_option("--work-dir", ma.work_dir,
                          "where the rounds' images go (default: /dev/shm with 8 GB free, else $TMPDIR or /var/tmp)");
  migrate_cmd->add_flag("--eager", ma.eager, "the target loads all device memory before the job runs on (default: lazily)");
  migrate_cmd->add_flag("--keep-images", ma.keep_images, "keep the rounds' images (removed by default)");
  migrate_cmd->add_flag("--move-process", ma.move_process,
                        "on one host, move the job's process too (CRIU dump and restore under the target) instead of "
                        "keeping it and moving only its GPU state (the default)");
  migrate_cmd->add_flag("--no-peer", ma.no_peer,
                        "on one host with the process kept: copy the GPU state in pre-copy rounds through image files "
                        "instead of handing the job's device memory to the target device to device (the default)");
  migrate_cmd->add_flag("--no-stage", ma.no_stage,
                        "to another host's posd: do not have the target restore round 1 into a staging session while "
                        "the rounds go on (its restore at the stop then reads every byte from the received files)");
  migrate_cmd->add_flag("--no-fallback", ma.no_fallback,
                        "if the source cannot hand the job's device memory over (the peer switch), stop there (exit 3) "
                        "instead of migrating through image files");
  migrate_cmd->add_flag("--json", ma.json, "one JSON report");
  migrate_cmd->add_option("--socket", ma.socket, "the posd the job runs under")->capture_default_str();
  migrate_cmd->add_option("--jobs-dir", ma.jobs_dir, "where in-process jobs put their control sockets (default: the job's own)");
  // A guardian's (pos-cli's own) question to a target after pos-cli died past the commit: hidden.
  migrate_cmd->add_option("--resolve", ma.resolve, "")->group("");
  migrate_cmd->add_option("--resolve-dir", ma.resolve_dir, "")->group("");
  migrate_cmd->add_flag("--settle", ma.settle, "")->group("");

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
      if (argc > 1 && argv[1][0] != '-') msg = std::string("unknown command '") + argv[1] + "' (commands: inspect, ps, dump, pre-dump, restore, migrate, resume, images, checkpoint, help)";
      else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) msg = "a command is required (inspect, ps, dump, pre-dump, restore, migrate, resume, images, checkpoint, help)";
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
    for (CLI::App* c : {ins, ps_cmd, dump_cmd, pre_cmd, restore_cmd, migrate_cmd, resume_cmd, images_cmd, ckpt_cmd, limit_cmd, help})
      if (c->get_name() == topic) {
        std::fputs(c->help("pos-cli").c_str(), stdout);
        return 0;
      }
    std::fprintf(stderr, "pos-cli help: unknown command '%s' (commands: inspect, ps, dump, pre-dump, restore, migrate, resume, images, checkpoint, limit, help)\n", topic.c_str());
    return 2;
  }
  if (ins->parsed()) return inspect(dir, json, summary, !no_verify);
  if (ps_cmd->parsed()) return ps(socket, jobs_dir, ps_json);
  if (dump_cmd->parsed()) return dump(da, false);
  if (pre_cmd->parsed()) return dump(pa, true);
  if (restore_cmd->parsed()) return restore(ra);
  if (limit_cmd->parsed() && !limit_sms.empty()) {
    std::fprintf(stderr,
                 "pos-cli limit: --sms: an SM limit is fixed when the job starts (pos run --sms N): its streams and "
                 "kernels belong to the context it was given then, which cannot change SMs; nothing changed\n");
    return 2;
  }
  if (limit_cmd->parsed()) return limit(limit_pid, limit_jobs_dir, limit_socket, limit_memory, limit_share, limit_json);
  if (resume_cmd->parsed()) return resume(resume_pid, resume_jobs_dir, resume_socket, resume_shared, resume_started);
  if (ckpt_cmd->parsed()) return checkpoint(ca);
  if (migrate_cmd->parsed()) return migrate(ma);
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
