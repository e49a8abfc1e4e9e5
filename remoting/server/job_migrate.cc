// job_migrate.cc — `pos-cli migrate` on one host: pre-copy rounds of pre-dumps, the stop (a dump on
// top of the last round, the job left stopped), then the restore on the target posd. docs/migration.md.
#include "remoting/server/job_migrate.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <map>
#include <deque>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "ckpt/image.h"  // fault_point
#include "pos/base/thread.h"
#include "remoting/server/checkpoint_policy.h"
#include "remoting/server/control_client.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/job_manifest.h"
#include "remoting/server/job_restore.h"
#include "remoting/server/migration_peer.h"
#include "remoting/server/peer_transfer.h"

namespace pos {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// No process has the pid (not even a zombie): CRIU can give it back.
bool pid_free(pid_t pid) {
  struct stat st {};
  return ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0 && errno == ENOENT;
}

bool wait_pid_free(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pid_free(pid)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// What a restore of the job's process tree needs on another host, as a check frame's lines
// (MigrationLink::check): every pid of the tree, and the absolute paths its processes run from,
// map and hold open (CRIU opens them by path there). Deleted files and memfds (CRIU carries those),
// sockets, pipes, /proc and what a restore makes itself (the files in an in-process job's jobs
// directory: its usage region) are left out; at most 4096 paths.
std::string restore_needs(uint32_t root, const std::string& jobs_dir) {
  namespace fs = std::filesystem;
  std::vector<uint32_t> pids = {root};
  for (size_t i = 0; i < pids.size() && pids.size() < 4096; ++i) {
    std::error_code ec;
    for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pids[i]) + "/task", ec)) {
      std::ifstream in(t.path() / "children");
      for (uint32_t c; in >> c;) pids.push_back(c);
    }
  }
  std::set<std::string> paths;
  auto keep = [&](const std::string& p) {
    if (p.empty() || p.front() != '/' || p.find(" (deleted)") != std::string::npos || p.rfind("/proc/", 0) == 0 ||
        p.find('\n') != std::string::npos || p.size() > 4096 || paths.size() >= 4096 ||
        (!jobs_dir.empty() && p.rfind(jobs_dir + "/", 0) == 0))
      return;
    paths.insert(p);
  };
  std::string out;
  for (uint32_t p : pids) {
    out += "pid " + std::to_string(p) + "\n";
    const std::string proc = "/proc/" + std::to_string(p);
    std::error_code ec;
    keep(fs::read_symlink(proc + "/exe", ec).string());
    keep(fs::read_symlink(proc + "/cwd", ec).string());
    for (const auto& f : fs::directory_iterator(proc + "/fd", ec)) keep(fs::read_symlink(f.path(), ec).string());
    std::ifstream maps(proc + "/maps");
    for (std::string line; std::getline(maps, line);) {
      const size_t slash = line.find('/');
      if (slash != std::string::npos) keep(line.substr(slash));
    }
  }
  if (!jobs_dir.empty()) keep(jobs_dir);
  for (const std::string& p : paths) out += "path " + p + "\n";
  return out;
}

// Whether `dir` has room for the CPU pre-copy besides the stop's dump: the job's anonymous memory
// three times over (the rounds' pages, CRIU's whole dump before the comparison, slack), or the
// rounds go without it (the stop then sends all of CRIU's pages, as before).
bool room_for_cpu_pages(uint32_t pid, const std::string& dir) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  uint64_t anon_kb = 0;
  for (std::string line; std::getline(f, line);)
    if (line.rfind("RssAnon:", 0) == 0) anon_kb = std::strtoull(line.c_str() + 8, nullptr, 10);
  struct statvfs v {};
  if (anon_kb == 0 || ::statvfs(dir.c_str(), &v) != 0) return false;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize > 3 * anon_kb * 1024 + (256ull << 20);
}

// The rounds go to tmpfs when it has room for them (they are scratch: read back once, by the
// target), else to $TMPDIR or /var/tmp.
std::string default_work_base() {
  struct statvfs v {};
  if (::statvfs("/dev/shm", &v) == 0 && static_cast<uint64_t>(v.f_bavail) * v.f_frsize > (8ull << 30)) return "/dev/shm";
  const char* t = std::getenv("TMPDIR");
  return t != nullptr && *t != '\0' ? t : "/var/tmp";
}

// Watches this process from its first round. If it dies before it says the job runs somewhere,
// the guardian finishes its work: during the rounds it removes the scratch; a job stopped and
// detached gets its permit and SIGCONT (and the scratch goes); a job already ended is restored on
// the source from the complete image once its pid is free (and the scratch goes if that worked).
// Everything it needs is prepared before the fork; the child makes only async-signal-safe calls
// (fork, execv of pos-cli restore and of rm). It leaves pos-cli's session (setsid) so that a
// Ctrl-C meant for pos-cli does not end it too.
class MigrateGuardian {
 public:
  // `resolve`: with a remote target, the pos-cli command that asks it how the migration ended and
  // restores the job on the source only if it does not run there (state 'c': commit in flight);
  // with a live switch, the one that settles where the job runs (state 'm': permit to the target).
  MigrateGuardian(pid_t job, const std::string& program, const std::string& work, const std::string& source,
                  const std::vector<std::string>& resolve = {}) {
    if (program.empty()) return;
    args_ = {program, "restore", "-D", work + "/final", "--socket", source};
    for (auto& a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    resolve_args_ = resolve;
    for (auto& a : resolve_args_) resolve_argv_.push_back(a.data());
    resolve_argv_.push_back(nullptr);
    rm_args_ = {"/bin/rm", "-rf", "--", work};
    for (auto& a : rm_args_) rm_argv_.push_back(a.data());
    rm_argv_.push_back(nullptr);
    const std::string proc = "/proc/" + std::to_string(job);
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[1]);
      // Nothing else of pos-cli's stays open here: a migration link held by the guardian would
      // keep the target from seeing pos-cli gone (and from ending its uncommitted copy).
      if (p[0] > 3) ::close_range(3, static_cast<unsigned>(p[0]) - 1, 0);
      ::close_range(static_cast<unsigned>(p[0]) + 1, ~0u, 0);
      (void)::setsid();
      char state = 0;
      char permit[512] = {0};
      size_t permit_len = 0;
      for (;;) {
        char buf[600];
        const ssize_t n = ::read(p[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; ++i) {
          const char c = buf[i];
          if (state == 'a') {  // the permit's path, up to a newline
            if (c == '\n') state = 'A';
            else if (permit_len + 1 < sizeof(permit)) permit[permit_len++] = c;
          } else {
            state = c;
          }
        }
      }
      if (state == 'X') ::_exit(0);  // done
      if (state == 'D') {
        // Done, the job runs where it was sent: the scratch goes from here, so that pos-cli need not
        // wait for it (removing a large job's rounds from tmpfs took seconds). A grandchild does it
        // and this process ends at once: pos-cli reaps it and nothing waits for the removal.
        if (::fork() == 0) {
          // Not on pos-cli's output: a caller reading it to its end ($(pos-cli migrate ...)) would
          // wait for the removal.
          const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
          if (null >= 0)
            for (int fd = 0; fd <= 2; ++fd) (void)::dup2(null, fd);
          ::execv(rm_argv_[0], rm_argv_.data());
          ::_exit(127);
        }
        ::_exit(0);
      }
      if ((state == 'c' || state == 'm') && resolve_argv_.size() > 1) {
        // The commit was sent (or was being sent) to the target ('c'), or the job was let re-attach
        // to the target of a live switch ('m'): only the target knows whether the job runs there.
        // The resolver asks it, and brings the job back to the source only if it does not.
        static const char kMsg[] = "pos-cli migrate: ended early (its process was killed) after the job was handed to the target; asking the target where it runs\n";
        (void)!::write(2, kMsg, sizeof(kMsg) - 1);
        ::execv(resolve_argv_[0], resolve_argv_.data());
        ::_exit(127);
      }
      if (state == 0) {  // killed during the rounds: the job never stopped; the scratch goes
        ::execv(rm_argv_[0], rm_argv_.data());
        ::_exit(127);
      }
      struct stat st;
      if (state == 'A' && permit_len > 0) {
        // Still stopped and detached on the source: let it run on there.
        char tmp[520];
        std::memcpy(tmp, permit, permit_len);
        std::memcpy(tmp + permit_len, ".tmp", 5);
        const int f = ::open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (f >= 0) {
          if (::stat(proc.c_str(), &st) == 0) (void)::fchown(f, st.st_uid, static_cast<gid_t>(-1));
          (void)!::write(f, "\n", 1);
          ::close(f);
          (void)::rename(tmp, permit);
        }
        (void)::kill(job, SIGCONT);
        static const char kMsg[] = "pos-cli migrate: ended early (its process was killed); the job runs on at the source\n";
        (void)!::write(2, kMsg, sizeof(kMsg) - 1);
        ::execv(rm_argv_[0], rm_argv_.data());
        ::_exit(1);
      }
      // Ended on the source ('K'), or being restored by a posd of this host ('R') or of another
      // ('r'). A local target's restore whose CRIU got through has the job running: nothing to do.
      // A remote target ends its copy when this link closes uncommitted, so the job comes back
      // here; on this same machine that copy may hold the pid a while: the restore is retried.
      ::usleep(200'000);
      if (state == 'R' && ::stat(proc.c_str(), &st) == 0) ::_exit(0);
      static const char kMsg[] = "pos-cli migrate: ended early (its process was killed); restoring the job on the source\n";
      (void)!::write(2, kMsg, sizeof(kMsg) - 1);
      for (int attempt = 0; attempt < (state == 'r' ? 30 : 1); ++attempt) {
        if (attempt > 0) ::sleep(2);
        // Once the pid is free (its parent may take a moment to reap it).
        for (int i = 0; i < 60'000 && ::stat(proc.c_str(), &st) == 0; ++i) ::usleep(10'000);
        const pid_t r = ::fork();
        if (r == 0) {
          ::execv(argv_[0], argv_.data());
          ::_exit(127);
        }
        int rs = 0;
        while (r > 0 && ::waitpid(r, &rs, 0) < 0 && errno == EINTR) {
        }
        // Restored (eagerly: its files are read): the scratch goes; else it is kept.
        if (r > 0 && WIFEXITED(rs) && WEXITSTATUS(rs) == 0) ::execv(rm_argv_[0], rm_argv_.data());
      }
      ::_exit(1);
    }
    ::close(p[0]);
    if (pid < 0) {
      ::close(p[1]);
      return;
    }
    pid_ = pid, fd_ = p[1];
  }
  ~MigrateGuardian() { done(); }
  void say(const std::string& what) {
    if (fd_ >= 0) (void)!::write(fd_, what.data(), what.size());
  }
  // The job runs somewhere (or this process reports that it could not be brought back).
  void done(char how = 'X') {
    if (pid_ <= 0) return;
    say(std::string(1, how));
    ::close(fd_);
    fd_ = -1;
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  // The job runs somewhere: the guardian removes the scratch in the background and ends. Without a
  // guardian (none could start) the scratch is removed here.
  void done_removing(const std::string& work) {
    if (pid_ <= 0) {
      std::error_code ec;
      std::filesystem::remove_all(work, ec);
      return;
    }
    done('D');
  }
  // Leaves the guardian to finish alone (the job is ended and its pid still taken).
  void leave() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1, pid_ = -1;
  }

 private:
  std::vector<std::string> args_, rm_args_, resolve_args_;
  std::vector<char*> argv_, rm_argv_, resolve_argv_;
  pid_t pid_ = -1;
  int fd_ = -1;
};

// The state posd's `ps` gives the session of `pid` ("" when it lists none). A posd may list two
// for one pid for a moment: the one a job left (a move away and back) still ending while its new
// one starts; the new one's state is the answer then.
std::string session_state(const std::string& ps, uint32_t pid) {
  const std::string key = "\"pid\":" + std::to_string(pid) + ",";
  std::string found;
  for (size_t at = ps.find(key); at != std::string::npos; at = ps.find(key, at + 1)) {
    const size_t st = ps.find("\"state\":\"", at);
    const size_t end = ps.find('}', at);
    if (st == std::string::npos || (end != std::string::npos && st > end)) continue;
    const size_t b = st + 9, e = ps.find('"', b);
    if (e == std::string::npos) continue;
    found = ps.substr(b, e - b);
    if (found != "ending") return found;
  }
  return found;
}

int64_t owner_of(uint32_t pid) {
  struct stat st {};
  return ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0 ? static_cast<int64_t>(st.st_uid) : -1;
}

// After a live switch's permit named the target: where does the job run? The target either has
// it attached (then the source's detached session goes: "target") or gave it up (its session
// ended: it did not come within a minute, or its re-attach was refused); then the job is, or goes,
// back to its session at the source, which still waits detached under the same token ("source").
StatusOr<std::string> settle_live(uint32_t pid, const std::string& to, const std::string& socket, const std::string& token,
                                  const std::string& permit, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const auto listed_by = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int parked_polls = 0;  // polls (20 ms apart) with both sides detached and no permit
  for (;;) {
    auto tps = posd_control(to, "ps");
    const std::string ts = tps.ok() ? session_state(*tps, pid) : "";
    struct stat pst {};
    if (ts == "detached" && ::stat(permit.c_str(), &pst) != 0) {
      // The target waits, and no permit is there: either the job took it a moment ago and is
      // re-attaching, or pos-cli died before it wrote it. Still so after a second (a re-attach
      // takes milliseconds), the job is parked without one: it is let go on to the target.
      auto sps = posd_control(socket, "ps");
      if (sps.ok() && session_state(*sps, pid) == "detached") {
        if (++parked_polls > 50) (void)grant_reattach(permit, to, owner_of(pid)), parked_polls = 0;
      } else {
        parked_polls = 0;
      }
    } else {
      parked_polls = 0;
    }
    if (!ts.empty() && ts != "detached" && ts != "starting" && ts != "ending") {
      Status rel = posd_release(socket, pid, token);
      for (int i = 0; !rel.ok() && rel.code() != Code::kFailedPrecondition && i < 20; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        rel = posd_release(socket, pid, token);
      }
      if (!rel.ok())
        return Status(rel.code(), 0, "the job runs at the target " + to + ", but its session at the source " + socket +
                                         " could not be released (" + rel.message() + "); it ends with the job");
      return std::string("target");
    }
    // Not listed yet: the target's session process can report the restore to pos-cli a moment
    // before posd lists its session. Only a session that stays unlisted for 2 s is gone.
    if (ts.empty() && tps.ok() && std::chrono::steady_clock::now() < listed_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (ts.empty() || ts == "ending") {
      // Back to the source: a job still parked gets a permit naming no other posd (one that is
      // re-attaching there by itself, its shim's fallback, ignores it; it is removed below).
      struct stat st {};
      if (::stat(permit.c_str(), &st) != 0) (void)grant_reattach(permit, "", owner_of(pid));
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      std::string ss;
      for (;;) {
        auto sps = posd_control(socket, "ps");
        ss = sps.ok() ? session_state(*sps, pid) : "";
        if (ss != "detached" || std::chrono::steady_clock::now() > until) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      (void)::unlink(permit.c_str());
      if (ss.empty() || ss == "detached" || ss == "ending")
        return Status::Unavailable("the target " + to + " gave the job up, and it did not come back to its session at the source " +
                                   socket + " (" + (ss.empty() ? "none listed: has it ended?" : ss) + ")");
      return std::string("source");
    }
    if (std::chrono::steady_clock::now() > end)
      return Status::Unavailable("the job neither re-attached to the target " + to + " nor came back to the source within " +
                                 std::to_string(static_cast<int>(seconds)) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// On one host (docs/migration.md, "The live switch"): the job is detached and its last dirty GPU
// bytes saved (no CRIU: its process stays), the GPU state is restored into the target, and the job
// is let re-attach there; its session at the source waits, detached, until the target says the job
// re-attached, and is released then. Until then the job can always go back to it.
template <typename Guardian, typename Event>
Status live_switch(const JobMigrateOptions& o, const std::string& prev, const std::string& final_dir, JobMigrateReport* rep,
                   Guardian& guardian, Event&& event) {
  event("switch");
  const auto t_stop = std::chrono::steady_clock::now();
  JobDumpOptions d;
  d.socket = o.socket, d.pid = o.pid, d.dir = final_dir, d.prev = prev, d.lazy_ok = true;
  d.gpu_only = true;
  d.peer = o.peer;
  auto dumped = dump_job(d);
  if (!dumped.ok()) {
    guardian.done();
    return dumped.status().with_context("the stop (the job runs on at the source)");
  }
  rep->live = true;
  const std::string permit = dumped->permit;
  guardian.say("a" + permit + "\n");
  rep->final_bytes = dumped->gpu.bytes_stored;
  rep->dump_s = seconds_since(t_stop);
  rep->detach_s = dumped->detach_s, rep->stop_image_s = dumped->gpu_s;
  ckpt::fault_point("migrate-stopped");
  event("restore");
  const auto t_restore = std::chrono::steady_clock::now();
  auto finish = [&] {
    rep->restore_s = seconds_since(t_restore);
    rep->downtime_s = seconds_since(t_stop);  // an upper bound: it counts the dump's checks before its detach
    guardian.done();
  };
  // Back to its session at the source, which waits detached: the permit names no other posd.
  auto back = [&](const std::string& why) -> Status {
    rep->target_error = why;
    rep->where = "source";
    event("fallback");
    Status s = grant_reattach(permit, "", owner_of(o.pid));
    if (s.ok()) wait_until_taken(permit, o.pid);
    finish();
    return s.ok() ? Status::Ok() : s.with_context("the target failed (" + why + ") and the job could not be let back");
  };
  Status noted = write_small_file(rep->work_dir + "/permit-path", permit + "\n", 0600);  // for the guardian's settle
  if (!noted.ok()) return back(noted.message());
  char real[PATH_MAX];
  if (::realpath(o.to.c_str(), real) == nullptr) return back("no posd socket at " + o.to + " (" + std::strerror(errno) + ")");
  RestoreRequest req;
  req.pid = o.pid, req.uid = dumped->owner, req.arena_bytes = dumped->arena_bytes;
  req.token = dumped->token, req.job = dumped->job, req.lazy = o.lazy;
  // The peer path: the job's memory itself, from the source's session (it stays detached, holding
  // it, until the release), to the target's, which copies it before it answers "restored".
  std::vector<PeerMemory> peer;
  if (o.peer) {
    rep->peer = true;
    const auto te = std::chrono::steady_clock::now();
    auto mem = posd_peer_export(o.socket, o.pid, dumped->token);
    if (!mem.ok()) {
      rep->peer_export_error = mem.status().message();
      return back("the source could not hand over the job's device memory: " + mem.status().message() +
                  " (pos-cli migrate --no-peer copies it through image files instead)");
    }
    peer = std::move(*mem);
    rep->peer_export_s = seconds_since(te);
    for (const PeerMemory& m : peer) rep->peer_bytes += m.size;
    ckpt::fault_point("migrate-peer-exported");
    req.peer = &peer;
    req.lazy = false;
  }
  // A session of this job may still be ending there (it left that posd a moment ago): busy until then.
  auto pending = begin_restore(real, final_dir, req);
  for (int tries = 0; !pending.ok() && pending.status().code() == Code::kBusy && tries < 300; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pending = begin_restore(real, final_dir, req);
  }
  peer.clear();  // the target copied it (or failed): the source's session alone holds it again
  if (!pending.ok()) return back(pending.status().message());
  rep->target_copy_s = pending->gpu_s;
  rep->target_welcome_s = pending->welcome_s, rep->peer_send_s = pending->table_s;
  // From the RestoreGo on, the target's session waits for the job (a minute at most) even if this
  // process dies; from the permit on, the job goes there. The guardian settles either way ('m').
  Status go = send_restore_go(*pending, o.pid);
  if (go.ok()) {
    guardian.say("m");
    ckpt::fault_point("migrate-live-go");
    go = grant_reattach(permit, real, static_cast<int64_t>(dumped->owner));
  }
  if (!go.ok()) {
    guardian.say("a" + permit + "\n");
    return back(go.message());
  }
  ckpt::fault_point("migrate-live-permit");
  const auto t_permit = std::chrono::steady_clock::now();
  Status attached = await_restore(*pending);
  rep->reattach_s = seconds_since(t_permit);
  if (attached.ok()) {
    rep->where = "target";
    Status rel = posd_release(o.socket, o.pid, dumped->token);
    if (!rel.ok()) rep->release_error = rel.message();
    finish();
    return Status::Ok();
  }
  // The target did not take it: it went (or goes) back to its session at the source.
  pending->sock.reset();
  auto where = settle_live(o.pid, real, o.socket, dumped->token, permit, 90);
  if (!where.ok()) {
    finish();
    return where.status().with_context("the target failed (" + attached.message() + ")");
  }
  rep->where = *where;
  if (*where == "source") rep->target_error = attached.message();
  finish();
  return Status::Ok();
}

// Sends a posd job's GPU part to the peer while posd drains it: posd tells of each range of the
// image's memory files once written (JobDumpOptions::gpu_written), and threads of this process send
// each as a part of `remote`/gpu (MigrationLink::send_part); the link is theirs alone from start()
// to close(). A send_dir of the image afterwards sends the rest: the records, and any range whose
// report posd dropped. The two went in turn before: the drain to files, then the send. Several
// threads: each reads, searches and checksums its range while another sends (one thread moved
// ~1.5 GB/s, below the link's rate). A thread-less or failed streamer sends nothing more; the
// image then goes whole afterwards, or its send fails the same way.
class PartStreamer {
 public:
  static constexpr size_t kThreads = 4;
  PartStreamer(MigrationLink* link, std::string local_image, std::string remote_image)
      : link_(link), local_(std::move(local_image)), remote_(std::move(remote_image)) {}
  ~PartStreamer() { (void)close(); }
  PartStreamer(const PartStreamer&) = delete;
  PartStreamer& operator=(const PartStreamer&) = delete;
  // Makes the part's directories at the peer and starts the threads: false if nothing will stream.
  bool start() {
    if (link_ == nullptr) return false;
    Status dirs = link_->make_dir(remote_);
    if (dirs.ok()) dirs = link_->make_dir(remote_ + "/gpu");
    if (!dirs.ok()) return false;
    before_ = link_->bytes_sent();
    size_t up = 0;
    for (auto& t : threads_) up += start_thread(&t, "the migration's streamed send", [this] { run(); }).ok() ? 1 : 0;
    if (up == 0) closed_ = true;
    return up > 0;
  }
  // A range of memory file `file` is written (from the thread that reads posd's answers).
  void written(const std::string& file, uint64_t off, uint64_t len) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(Range{file, off, len});
    }
    cv_.notify_one();
  }
  // Waits until every range told of is sent (or the first failure); the link is the caller's again.
  Status close() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (joined_) return status_;
      closed_ = joined_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    if (link_ != nullptr && before_ != kNone) bytes_ = link_->bytes_sent() - before_;
    return status_;
  }
  uint64_t bytes() const { return bytes_; }  // sent as parts (after close)

 private:
  struct Range {
    std::string file;
    uint64_t off, len;
  };
  static constexpr uint64_t kNone = ~uint64_t{0};
  void run() {
    for (;;) {
      Range r;
      int fd = -1;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return closed_ || !q_.empty(); });
        if (q_.empty()) return;
        r = std::move(q_.front());
        q_.pop_front();
        if (!status_.ok()) continue;  // failed: nothing more goes this way
        auto it = files_.find(r.file);
        if (it == files_.end()) {
          // posd writes into gpu.partial and renames it gpu once complete (a descriptor stays).
          UniqueFd f(::open((local_ + "/gpu.partial/" + r.file).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
          if (!f) f.reset(::open((local_ + "/gpu/" + r.file).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
          if (!f) {
            status_ = Status::Unavailable("cannot open " + local_ + "'s " + r.file + " as posd writes it: " +
                                         std::strerror(errno));
            continue;
          }
          it = files_.emplace(r.file, std::move(f)).first;
        }
        fd = it->second.get();
      }
      Status s = link_->send_part(remote_ + "/gpu/" + r.file, fd, r.off, r.len);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lk(mu_);
        if (status_.ok()) status_ = s;
      }
    }
  }
  MigrationLink* const link_;
  const std::string local_, remote_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Range> q_;                    // guarded by mu_, as the three below
  bool closed_ = false, joined_ = false;
  Status status_;                          // the first failure
  std::map<std::string, UniqueFd> files_;  // the memory files, opened at their first range
  std::thread threads_[kThreads];
  uint64_t before_ = kNone, bytes_ = 0;
};

StatusOr<JobMigrateReport> migrate_once(const JobMigrateOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  if (o.pid == 0) return Status::InvalidArgument("no job pid given");
  if (o.peer) prepare_descriptor_table();  // the peer table passes through here (peer_transfer.h)
  if (o.to.empty()) return Status::InvalidArgument("no target given (--to: another posd's socket on this host)");
  const bool remote = o.to.find('/') == std::string::npos && o.to.find(':') != std::string::npos;
  if (o.max_rounds == 0 || o.max_rounds > 100) return Status::InvalidArgument("--max-rounds must be 1 to 100");
  if (!(o.max_downtime_s > 0) || o.max_downtime_s > 3600) return Status::InvalidArgument("--max-downtime must be above 0");
  std::error_code ec;
  // Another host's posd: its secret, a connection that proves both sides hold it, before the job
  // is touched.
  std::unique_ptr<MigrationLink> link;
  std::string secret;
  if (remote) {
    if (o.secret_file.empty())
      return Status::InvalidArgument("--to " + o.to + " is another posd's migration address: --secret-file names the secret it shares");
    auto sec = read_migration_secret(o.secret_file);
    if (!sec.ok()) return sec.status();
    secret = *sec;
    auto l = MigrationLink::connect(o.to, secret);
    if (!l.ok()) return l.status();
    link = std::move(*l);
  }
  // (Not fs::equivalent: libstdc++ declines to compare sockets.)
  struct stat s1 {}, s2 {};
  const bool same = fs::path(o.socket).lexically_normal() == fs::path(o.to).lexically_normal() ||
                    (::stat(o.socket.c_str(), &s1) == 0 && ::stat(o.to.c_str(), &s2) == 0 && s1.st_dev == s2.st_dev &&
                     s1.st_ino == s2.st_ino);
  const bool inproc = !o.job_socket.empty();
  if (inproc && !remote)
    return Status::InvalidArgument("pid " + std::to_string(o.pid) + " is an in-process job (pos run): it moves to another "
                                   "GPU of this host with --device N, to another host with --to HOST:PORT of a posd "
                                   "accepting migrations there");
  if (!remote && same)
    return Status::InvalidArgument("the target " + o.to + " is the posd the job runs under already");
  // The target answers before anything is asked of the job.
  if (!remote) {
    if (auto ps = posd_control(o.to, "ps"); !ps.ok()) return ps.status().with_context("the target posd (" + o.to + ")");
  }
  const pid_t pid = static_cast<pid_t>(o.pid);
  if (link) {
    // Whether the other host could restore the job at all, before the job is touched: its files
    // (CRIU's rule for a process moved between hosts) and its pids.
    const std::string jobs_dir = inproc ? o.job_socket.substr(0, o.job_socket.rfind('/')) : std::string();
    if (Status c = link->check(restore_needs(o.pid, jobs_dir)); !c.ok())
      return c.with_context("the target at " + o.to + " could not restore pid " + std::to_string(o.pid) +
                            " (nothing was asked of the job)");
  }

  JobMigrateReport rep;
  rep.pid = o.pid;
  rep.remote = remote;
  rep.same_host = link && link->same_host();
  const std::string base = o.work_dir.empty() ? default_work_base() : o.work_dir;
  std::string tmpl = base + "/pos-migrate-" + std::to_string(o.pid) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    return Status::Unavailable("cannot make a work directory in " + base + ": " + std::strerror(errno));
  rep.work_dir = tmpl;
  auto cleanup = [&] {
    if (!o.keep_images) fs::remove_all(rep.work_dir, ec);
  };
  // The job runs where it ends up: the scratch goes in the background (the guardian's), so that
  // pos-cli returns as soon as the job runs.
  auto finish = [&](MigrateGuardian& g) {
    if (o.keep_images) g.done();
    else g.done_removing(rep.work_dir);
  };
  auto event = [&](const char* what) {
    if (o.progress) o.progress(what, rep.rounds.empty() ? JobMigrateOptions::Round{} : rep.rounds.back());
  };

  // From here a guardian watches this process (its scratch, then the job's way back).
  std::vector<std::string> resolve;
  if (link)
    resolve = {o.self_program, "migrate", "-t", std::to_string(o.pid), "--to", o.to, "--secret-file", o.secret_file,
               "--socket", o.socket, "--resolve", link->id(), "--resolve-dir", rep.work_dir};
  else if (!o.move_process && !o.self_program.empty())
    resolve = {o.self_program, "migrate", "-t", std::to_string(o.pid), "--to", o.to, "--socket", o.socket, "--settle",
               "--resolve-dir", rep.work_dir};
  MigrateGuardian guardian(pid, o.self_program, rep.work_dir, o.socket, resolve);
  // Pre-copy: the job runs on; each round stores only what changed since the one before. The peer
  // switch needs none: its stop hands the memory over device to device.
  std::string prev;
  const bool peer_switch = !link && !o.move_process && o.peer;
  const bool cpu_pages = link != nullptr && room_for_cpu_pages(o.pid, rep.work_dir);
  if (peer_switch) rep.stop_reason = "peer";
  bool staging = false;  // round 1 is being staged at the target
  // An in-process job's rounds share this process's context of its device (made at the first).
  const auto contexts = std::make_shared<DeviceContexts>();
  const auto t_rounds = std::chrono::steady_clock::now();
  rep.setup_s = seconds_since(t0);
  for (uint32_t n = 1; !peer_switch; ++n) {
    JobDumpOptions d;
    d.socket = o.socket, d.pid = o.pid, d.leave_running = true, d.async = !inproc, d.lazy_ok = true;
    d.job_socket = o.job_socket;
    d.contexts = contexts;
    d.dir = rep.work_dir + "/round-" + std::to_string(n);
    d.prev = prev;
    // To another host: each round also holds the job's memory as read while it runs (CPU pre-copy
    // without dirty tracking), so that the stop's CRIU part sends only the pages that changed since.
    d.cpu_pages = cpu_pages;
    // A posd job's round goes to the target while posd drains it, as the stop's GPU part does.
    PartStreamer streamer(link.get(), d.dir, "round-" + std::to_string(n));
    if (link && !inproc && streamer.start())
      d.gpu_written = [&](const std::string& file, uint64_t off, uint64_t len) { streamer.written(file, off, len); };
    // An in-process job's round is its GPU-only checkpoint (a copy on the device, written while it
    // runs on), with its pages as above; its CPU state is dumped at the stop (NVIDIA's checkpoint
    // must empty the driver first).
    auto r = inproc ? pre_dump_driver_job(d) : pre_dump_job(d);
    const auto t_drained = std::chrono::steady_clock::now();  // the sends still in flight count as transfer
    const Status streamed = streamer.close();
    if (!r.ok()) {
      guardian.done();
      cleanup();
      return r.status().with_context("pre-copy round " + std::to_string(n) + " (the job runs on at the source)");
    }
    JobMigrateOptions::Round round;
    round.n = n;
    round.bytes = r->gpu.bytes_stored;
    round.bytes_referenced = r->gpu.bytes_referenced;
    round.criu_bytes = r->criu_bytes;
    round.seconds = r->gpu_s;
    round.rate = r->gpu_s > 0 ? static_cast<double>(r->gpu.bytes_stored) / r->gpu_s : 0;
    round.pause_s = r->gpu.stall_s;
    if (link) {  // the round goes to the target while the job runs on
      const auto ts = t_drained;
      const uint64_t before = link->bytes_sent() - streamer.bytes();
      Status sent = streamed;
      if (sent.ok()) sent = link->send_dir(d.dir, "round-" + std::to_string(n));
      if (sent.ok()) sent = link->sync();
      if (!sent.ok()) {
        guardian.done();
        cleanup();
        return sent.with_context("sending pre-copy round " + std::to_string(n) + " (the job runs on at the source)");
      }
      // A posd job's first round is all of its device memory: the target restores it into a
      // staging session while the rounds go on, and the stop's restore ahead copies from there.
      if (n == 1 && !inproc && o.stage) staging = link->stage("round-1", "final", o.lazy).ok();
      round.transfer_s = seconds_since(ts);
      round.sent = link->bytes_sent() - before;
      round.streamed = streamer.bytes();
      round.seconds += round.transfer_s;
      round.rate = round.seconds > 0 ? static_cast<double>(round.bytes) / round.seconds : 0;
    }
    rep.rounds.push_back(round);
    prev = d.dir;
    event("round");
    ckpt::fault_point("migrate-round");
    // The stop copies about what the last round did (what the job wrote meanwhile): half the
    // budget for it, the other half for CRIU and the restore.
    if (round.seconds <= o.max_downtime_s / 2) {
      rep.stop_reason = "budget";
      break;
    }
    if (n > 1 && static_cast<double>(round.bytes) >= 0.9 * static_cast<double>(rep.rounds[n - 2].bytes)) {
      rep.stop_reason = "converged";
      break;
    }
    if (n >= o.max_rounds) {
      rep.stop_reason = "max-rounds";
      break;
    }
    // Before another round: what has the job written since this round's cut? A job that rewrites
    // the same buffers every step has rewritten all of them by now; another round would copy as
    // much again and leave the stop as much (it ran ~0.3 s for nothing on the 8 GiB bench job).
    // posd answers from the handles' metadata, without a cut or waiting for the device.
    if (!inproc) {
      auto est = posd_estimate_increment(o.socket, o.pid, d.dir);
      if (est.ok()) {
        rep.rounds.back().next_estimate = est->bytes_stored;
        if (n > 1 && static_cast<double>(est->bytes_stored) >= 0.9 * static_cast<double>(round.bytes)) {
          rep.stop_reason = "no-shrink";
          break;
        }
        // After round 1, without running round 2: would it shrink the stop? It would copy what the
        // job wrote since round 1's cut in about that many bytes' time at round 1's rate, and leave
        // the stop what the job writes meanwhile. That is measured over the same time, the job
        // running on (posd counts every buffer written since a call, rewrites too): a job that
        // rewrites its whole dirty set within it leaves the stop as much as round 2 would copy.
        // Only when round 2 would not fit the budget itself (else it is cheap and may converge).
        const double e1 = static_cast<double>(est->bytes_stored);
        const double window = round.rate > 0 ? e1 / round.rate : 0;
        if (n == 1 && est->bytes_stored > 0 && est->cut_pc > 0 && window > o.max_downtime_s / 2) {
          const double w = std::min(window, 2.0);
          std::this_thread::sleep_for(std::chrono::duration<double>(w));
          auto written = posd_estimate_increment(o.socket, o.pid, d.dir, est->cut_pc);
          if (written.ok()) {
            rep.rounds.back().window_s = w;
            rep.rounds.back().window_bytes = written->bytes_stored;
            if (static_cast<double>(written->bytes_stored) >= 0.9 * e1) {
              rep.stop_reason = "no-shrink";
              break;
            }
          }
        }
      }
    }
  }

  if (!peer_switch) rep.rounds_s = seconds_since(t_rounds);
  // The stop. From the dump's detach until the target's re-attach the job's calls are held.
  const std::string final_dir = rep.work_dir + "/final";
  if (!link && !o.move_process) {
    JobMigrateOptions lo = o;
    lo.peer = peer_switch;
    auto live = live_switch(lo, prev, final_dir, &rep, guardian, event);
    if (!live.ok()) {
      cleanup();
      return live;
    }
    finish(guardian);
    rep.total_s = seconds_since(t0);
    return rep;
  }
  if (staging) {
    // Not while the target still loads round 1 into its staging session: on one machine that load
    // slowed the stop (its drain and CRIU's dump took up to twice as long), and a prepare that
    // comes before it is done waits for it. Best effort: a staging that cannot be ready is not
    // waited for again (the stop's restore then reads from files what it does not find staged).
    const auto tw = std::chrono::steady_clock::now();
    rep.stage_ready = link->await_stage(10).ok();
    rep.stage_wait_s = seconds_since(tw);
  }
  event("switch");
  const auto t_stop = std::chrono::steady_clock::now();
  JobDumpOptions d;
  d.socket = o.socket, d.pid = o.pid, d.dir = final_dir, d.prev = prev, d.lazy_ok = true;
  d.leave_stopped = true;
  d.job_socket = o.job_socket;
  d.contexts = contexts;  // the rounds' (none made at the stop)
  if (inproc) d.resume_program = o.self_program;  // this process killed mid-dump: the job is resumed
  // To another host, the stop's GPU part goes as soon as it is complete, while CRIU (and an
  // in-process job's driver checkpoint) still run: the whole image after them took the send and
  // the dump in turn. A posd job is still whole at the source until its image is complete and
  // sent; an in-process job's image on the source stays its way back; the target keeps nothing that
  // is not committed.
  const uint64_t stop_sent_before = link ? link->bytes_sent() : 0;
  std::thread early;
  Status early_sent = Status::Ok();
  bool early_started = false;
  // A posd job's GPU part goes while posd drains it (PartStreamer); what was not told of goes with
  // the rest of that part once it is saved.
  PartStreamer streamer(link.get(), final_dir, "final");
  if (link && !inproc && streamer.start())
    d.gpu_written = [&](const std::string& file, uint64_t off, uint64_t len) { streamer.written(file, off, len); };
  if (link) {
    d.gpu_part_done = [&](const std::string& token, uint64_t arena, uint32_t uid) {
      // What the target's restore of the GPU part needs ahead of the manifest; the target starts
      // it at once (prepare), so that the job's device memory loads while CRIU and the rest follow.
      const std::string first = "pid " + std::to_string(o.pid) + "\nuid " + std::to_string(uid) + "\narena " +
                                std::to_string(arena) + "\ntoken " + token + "\n";
      rep.stop_gpu_part_s = seconds_since(t_stop);
      const auto send_ahead = [&, first] {
        early_sent = streamer.close();  // what it was told of is sent: the link is this thread's now
        if (early_sent.ok()) early_sent = link->make_dir("final");
        if (early_sent.ok()) early_sent = link->send_dir(final_dir + "/gpu", "final/gpu");
        if (!early_sent.ok() || inproc) return;  // an in-process job's restore reads its image whole
        // A directory of its own beside the image (the stream sends directories).
        const std::string ahead = rep.work_dir + "/final-ahead";
        if (::mkdir(ahead.c_str(), 0700) != 0 || !write_small_file(ahead + "/gpu-first", first, 0600).ok()) return;
        early_sent = link->send_dir(ahead, "final");
        if (early_sent.ok()) early_sent = link->prepare("final", o.lazy);
      };
      early_started = start_thread(&early, "the stop's early send", [&, send_ahead] {
                        const auto ts = std::chrono::steady_clock::now();
                        send_ahead();
                        rep.stop_early_send_s = seconds_since(ts);  // read after the join
                      }).ok();
    };
  }
  auto dumped = inproc ? dump_driver_job(d) : dump_job(d);
  if (early.joinable()) early.join();
  (void)streamer.close();  // (the GPU part was not saved: nothing sent it ahead)
  rep.final_sent_draining = streamer.bytes();
  if (link) rep.final_sent_early = link->bytes_sent() - stop_sent_before;
  if (!dumped.ok()) {
    guardian.done();
    cleanup();
    return dumped.status().with_context("the stop (the job runs on at the source)");
  }
  rep.stop_image_s = seconds_since(t_stop);
  rep.stop_cut_s = dumped->detach_s + dumped->cut_s;
  rep.stop_criu_s = dumped->criu_s;
  rep.final_bytes = dumped->gpu.bytes_stored;
  rep.final_criu_bytes = dumped->criu_bytes;
  rep.final_criu_pages_to_parent = dumped->criu_pages_to_parent;
  // The stop's image to the other host, its bytes counted in the report.
  const auto send_final = [&]() -> Status {
    const auto ts = std::chrono::steady_clock::now();
    Status sent = early_sent;
    if (sent.ok()) sent = link->send_dir(final_dir, "final", early_started ? std::vector<std::string>{"gpu"} : std::vector<std::string>{});
    if (sent.ok()) sent = link->sync();
    rep.final_sent = link->bytes_sent() - stop_sent_before;
    rep.final_send_s = seconds_since(ts);
    return sent;
  };
  // The source's copy ends (a posd job's session with it) and the pid comes free.
  auto t_kill = std::chrono::steady_clock::now();
  const auto end_source = [&] {
    t_kill = std::chrono::steady_clock::now();
    guardian.say("K");
    (void)::kill(pid, SIGKILL);
    (void)::kill(pid, SIGCONT);
  };
  Status sent_final = Status::Ok();
  if (inproc) {
    // Stopped, its driver state checkpointed and its device memory freed: it cannot run on where
    // it is without a restore, so its copy here ends now and the complete image is the way back
    // (the restore below, or the guardian's if this process dies).
    end_source();
    ckpt::fault_point("migrate-stopped");
    sent_final = send_final();
  } else {
    guardian.say("a" + dumped->permit + "\n");
    ckpt::fault_point("migrate-stopped");
    if (link) {  // the stop's image goes too, while the job is still whole at the source
      if (Status sent = send_final(); !sent.ok()) {
        // Let it run on where it is: its permit (the job's own, so that it may remove it), SIGCONT
        // (CRIU left it stopped).
        Status back = grant_reattach(dumped->permit, "", owner_of(o.pid));
        (void)::kill(pid, SIGCONT);
        guardian.done();
        cleanup();
        return sent.with_context(back.ok() ? "sending the stop's image (the job runs on at the source)"
                                           : "sending the stop's image; and the job could not be let run on (" + back.message() + ")");
      }
    }
    // The image is complete: the source's copy ends.
    end_source();
  }
  if (!wait_pid_free(pid, 30)) {
    guardian.leave();  // it restores the job on the source once the pid is free
    return Status::Unavailable("the job was stopped and its image is complete, but its pid " + std::to_string(pid) +
                               " was not reaped by its parent within 30 s, so it cannot be restored yet; pos-cli's "
                               "guardian restores it on the source once it is (image: " +
                               final_dir + ")");
  }
  rep.pid_free_s = seconds_since(t_kill);
  rep.dump_s = seconds_since(t_stop);
  ckpt::fault_point("migrate-before-restore");
  guardian.say(link ? "r" : "R");
  event("restore");
  const auto t_restore = std::chrono::steady_clock::now();
  JobRestoreOptions r;
  r.dir = final_dir, r.socket = o.to, r.lazy = o.lazy;
  Status target_ok;
  if (!sent_final.ok()) {
    target_ok = sent_final.with_context("sending the stop's image");
  } else if (link) {
    // The target restores it; it keeps the job only once told (commit): a source that dies before
    // that brings the job back here (its guardian), and the target ends its copy.
    auto res = link->restore("final", o.lazy, [] { ckpt::fault_point("migrate-target-restoring"); });
    target_ok = res.ok() ? Status::Ok() : res.status();
    rep.target_staged = res.ok() && res->find("{\"staged\":true") != std::string::npos;
    if (res.ok()) {
      // The target's own phases, from its held line: {"held":PID,"check_s":X,"criu_s":Y}.
      const size_t at = res->find("{\"held\":");
      const auto number = [&](const char* key) {
        const size_t k = at == std::string::npos ? at : res->find(key, at);
        return k == std::string::npos ? 0.0 : std::strtod(res->c_str() + k + std::strlen(key), nullptr);
      };
      rep.target_check_s = number("\"check_s\":");
      rep.target_criu_s = number("\"criu_s\":");
    }
  } else {
    auto res = restore_job(r);
    target_ok = res.ok() ? Status::Ok() : res.status();
  }
  rep.target_restore_s = seconds_since(t_restore);
  if (target_ok.ok() && link) {
    // Held there; from the commit on it runs there. Once the commit may have reached the target,
    // only the target knows where the job runs: if its answer is lost, it is asked (a new
    // connection), and the job comes back here only if the target says it ended its copy.
    ckpt::fault_point("migrate-before-commit");
    const auto t_commit = std::chrono::steady_clock::now();
    guardian.say("c");
    target_ok = link->send_commit();
    ckpt::fault_point("migrate-commit-sent");
    if (target_ok.ok()) target_ok = link->await_commit();
    rep.commit_s = seconds_since(t_commit);
    if (!target_ok.ok()) {
      link->close();  // the target ends a copy it holds uncommitted as this link closes
      auto out = MigrationLink::outcome(o.to, secret, link->id(), 180);
      if (out.ok() && *out == "committed") {
        rep.commit_answer_lost = true;
        target_ok = Status::Ok();
      } else if (!out.ok() || *out != "ended") {
        // Neither side may bring the job back without knowing: the image stays for an operator.
        guardian.done();
        return Status::Unavailable("the target at " + o.to + " was told to run the job (commit), but its answer was lost (" +
                                   target_ok.message() + ") and it cannot say how it ended (" +
                                   (out.ok() ? "it does not know migration " + link->id() : out.status().message()) +
                                   "); look there first (pos-cli ps); if the job does not run there, restore it here: "
                                   "pos-cli restore -D " + final_dir + " --socket " + o.socket);
      }
    }
    // Committed: the guardian stays until the end, to remove the scratch. Not: it must not restore
    // the job too (the fallback below does).
    if (!target_ok.ok()) guardian.done();
  }
  if (target_ok.ok()) {
    rep.where = "target";
  } else {
    rep.target_error = target_ok.message();
    event("fallback");
    r.socket = o.socket;
    r.lazy = false;  // the image is removed right after
    auto back = restore_job(r);
    if (!back.ok()) {
      guardian.done();
      return Status(back.status().code(), 0,
                    "the target failed (" + rep.target_error + ") and so did the way back to the source (" +
                        back.status().message() + "); the job's image is kept: pos-cli restore -D " + final_dir +
                        " --socket SOCKET");
    }
    rep.where = "source";
  }
  rep.restore_s = seconds_since(t_restore);
  rep.downtime_s = seconds_since(t_stop);  // an upper bound: it counts the dump's checks before its detach
  finish(guardian);
  rep.total_s = seconds_since(t0);
  return rep;
}

}  // namespace

StatusOr<JobMigrateReport> migrate_job(const JobMigrateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto first = migrate_once(o);
  if (!first.ok() || !o.peer_fallback || first->where != "source" || first->peer_export_error.empty()) return first;
  // The peer switch could not start (the job is back at the source): through image files instead.
  JobMigrateOptions again = o;
  again.peer = false, again.peer_fallback = false;
  if (o.progress) o.progress("peer-fallback", JobMigrateOptions::Round{});
  auto second = migrate_once(again);
  if (!second.ok()) return second.status().with_context("after the peer switch failed (" + first->peer_export_error + ")");
  second->peer_fallback = first->peer_export_error;
  second->total_s = seconds_since(t0);
  return second;
}

StatusOr<std::string> resolve_migration(const JobResolveOptions& o) {
  namespace fs = std::filesystem;
  if (o.id.empty() || o.dir.empty() || o.to.empty()) return Status::InvalidArgument("--resolve needs --resolve-dir and --to");
  auto secret = read_migration_secret(o.secret_file);
  if (!secret.ok()) return secret.status();
  auto out = MigrationLink::outcome(o.to, *secret, o.id, 180);
  if (!out.ok()) return out.status().with_context("asking " + o.to + " how migration " + o.id + " ended (image kept: " + o.dir + "/final)");
  std::error_code ec;
  if (*out == "committed") {
    fs::remove_all(o.dir, ec);
    return std::string("target");
  }
  if (*out != "ended")
    return Status::Unavailable("the target at " + o.to + " does not know migration " + o.id +
                               "; look there first (pos-cli ps); if the job does not run there: pos-cli restore -D " + o.dir +
                               "/final --socket " + o.socket);
  // Ended there: back here, once its pid is free (the source's copy was ended at the switch).
  if (!wait_pid_free(static_cast<pid_t>(o.pid), 60))
    return Status::Unavailable("pid " + std::to_string(o.pid) + " is still taken; restore later: pos-cli restore -D " + o.dir +
                               "/final --socket " + o.socket);
  JobRestoreOptions r;
  r.dir = o.dir + "/final", r.socket = o.socket, r.lazy = false;
  auto back = restore_job(r);
  if (!back.ok()) return back.status().with_context("restoring on the source (image kept: " + o.dir + "/final)");
  fs::remove_all(o.dir, ec);
  return std::string("source");
}

}  // namespace pos

namespace pos {

StatusOr<std::string> settle_migration(const JobSettleOptions& o) {
  namespace fs = std::filesystem;
  if (o.pid == 0 || o.dir.empty() || o.to.empty() || o.socket.empty())
    return Status::InvalidArgument("--settle needs -t, --to, --socket and --resolve-dir");
  auto token = read_small_file(o.dir + "/final/token", 64);
  if (!token.ok()) return token.status().with_context("the switch's token");
  auto permit = read_small_file(o.dir + "/permit-path", 600);
  if (!permit.ok()) return permit.status().with_context("the switch's permit");
  std::string tok = *token, per = *permit;
  while (!tok.empty() && tok.back() == '\n') tok.pop_back();
  while (!per.empty() && per.back() == '\n') per.pop_back();
  // The permit it may write names the target for the job, whose working directory is not ours.
  char real[PATH_MAX];
  const std::string to = ::realpath(o.to.c_str(), real) != nullptr ? std::string(real) : o.to;
  auto where = settle_live(o.pid, to, o.socket, tok, per, 90);
  std::error_code ec;
  if (where.ok()) fs::remove_all(o.dir, ec);
  return where;
}

}  // namespace pos
