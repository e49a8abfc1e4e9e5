// job_migrate.cc — `pos-cli migrate` on one host: pre-copy rounds of pre-dumps, the stop (a dump on
// top of the last round, the job left stopped), then the restore on the target posd. docs/migration.md.
#include "remoting/server/job_migrate.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "ckpt/image.h"  // fault_point
#include "remoting/server/checkpoint_policy.h"
#include "remoting/server/control_client.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/job_restore.h"
#include "remoting/server/migration_peer.h"

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
  // restores the job on the source only if it does not run there (state 'c': commit in flight).
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
      if (state == 'c' && resolve_argv_.size() > 1) {
        // The commit was sent (or was being sent) to the target: only it knows whether the job
        // runs there. The resolver asks it, and restores on the source only if it does not.
        static const char kMsg[] = "pos-cli migrate: ended early (its process was killed) after the commit was sent; asking the target how it ended\n";
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
  void done() {
    if (pid_ <= 0) return;
    say("X");
    ::close(fd_);
    fd_ = -1;
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
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

}  // namespace

StatusOr<JobMigrateReport> migrate_job(const JobMigrateOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  if (o.pid == 0) return Status::InvalidArgument("no job pid given");
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
  if (!remote && same)
    return Status::InvalidArgument("the target " + o.to + " is the posd the job runs under already");
  // The target answers before anything is asked of the job.
  if (!remote) {
    if (auto ps = posd_control(o.to, "ps"); !ps.ok()) return ps.status().with_context("the target posd (" + o.to + ")");
  }
  const pid_t pid = static_cast<pid_t>(o.pid);

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
  auto event = [&](const char* what) {
    if (o.progress) o.progress(what, rep.rounds.empty() ? JobMigrateOptions::Round{} : rep.rounds.back());
  };

  // From here a guardian watches this process (its scratch, then the job's way back).
  std::vector<std::string> resolve;
  if (link)
    resolve = {o.self_program, "migrate", "-t", std::to_string(o.pid), "--to", o.to, "--secret-file", o.secret_file,
               "--socket", o.socket, "--resolve", link->id(), "--resolve-dir", rep.work_dir};
  MigrateGuardian guardian(pid, o.self_program, rep.work_dir, o.socket, resolve);
  // Pre-copy: the job runs on; each round stores only what changed since the one before.
  std::string prev;
  for (uint32_t n = 1;; ++n) {
    JobDumpOptions d;
    d.socket = o.socket, d.pid = o.pid, d.leave_running = true, d.async = true, d.lazy_ok = true;
    d.dir = rep.work_dir + "/round-" + std::to_string(n);
    d.prev = prev;
    auto r = pre_dump_job(d);
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
      const auto ts = std::chrono::steady_clock::now();
      const uint64_t before = link->bytes_sent();
      Status sent = link->send_dir(d.dir, "round-" + std::to_string(n));
      if (sent.ok()) sent = link->sync();
      if (!sent.ok()) {
        guardian.done();
        cleanup();
        return sent.with_context("sending pre-copy round " + std::to_string(n) + " (the job runs on at the source)");
      }
      round.transfer_s = seconds_since(ts);
      round.sent = link->bytes_sent() - before;
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
  }

  // The stop. From the dump's detach until the target's re-attach the job's calls are held.
  const std::string final_dir = rep.work_dir + "/final";
  event("switch");
  const auto t_stop = std::chrono::steady_clock::now();
  JobDumpOptions d;
  d.socket = o.socket, d.pid = o.pid, d.dir = final_dir, d.prev = prev, d.lazy_ok = true;
  d.leave_stopped = true;
  auto dumped = dump_job(d);
  if (!dumped.ok()) {
    guardian.done();
    cleanup();
    return dumped.status().with_context("the stop (the job runs on at the source)");
  }
  guardian.say("a" + dumped->permit + "\n");
  rep.final_bytes = dumped->gpu.bytes_stored;
  rep.final_criu_bytes = dumped->criu_bytes;
  ckpt::fault_point("migrate-stopped");
  if (link) {  // the stop's image goes too, while the job is still whole at the source
    const uint64_t before = link->bytes_sent();
    Status sent = link->send_dir(final_dir, "final");
    if (sent.ok()) sent = link->sync();
    if (!sent.ok()) {
      // Let it run on where it is: its permit (the job's own, so that it may remove it), SIGCONT
      // (CRIU left it stopped).
      struct stat js {};
      const int64_t owner = ::stat(("/proc/" + std::to_string(pid)).c_str(), &js) == 0 ? static_cast<int64_t>(js.st_uid) : -1;
      Status back = grant_reattach(dumped->permit, "", owner);
      (void)::kill(pid, SIGCONT);
      guardian.done();
      cleanup();
      return sent.with_context(back.ok() ? "sending the stop's image (the job runs on at the source)"
                                         : "sending the stop's image; and the job could not be let run on (" + back.message() + ")");
    }
    rep.final_sent = link->bytes_sent() - before;
  }
  // The image is complete: the source's copy ends (its session with it) and the pid comes free.
  guardian.say("K");
  (void)::kill(pid, SIGKILL);
  (void)::kill(pid, SIGCONT);
  if (!wait_pid_free(pid, 30)) {
    guardian.leave();  // it restores the job on the source once the pid is free
    return Status::Unavailable("the job was stopped and its image is complete, but its pid " + std::to_string(pid) +
                               " was not reaped by its parent within 30 s, so it cannot be restored yet; pos-cli's "
                               "guardian restores it on the source once it is (image: " +
                               final_dir + ")");
  }
  rep.dump_s = seconds_since(t_stop);
  ckpt::fault_point("migrate-before-restore");
  guardian.say(link ? "r" : "R");
  event("restore");
  const auto t_restore = std::chrono::steady_clock::now();
  JobRestoreOptions r;
  r.dir = final_dir, r.socket = o.to, r.lazy = o.lazy;
  Status target_ok;
  if (link) {
    // The target restores it; it keeps the job only once told (commit): a source that dies before
    // that brings the job back here (its guardian), and the target ends its copy.
    auto res = link->restore("final", o.lazy);
    target_ok = res.ok() ? Status::Ok() : res.status();
  } else {
    auto res = restore_job(r);
    target_ok = res.ok() ? Status::Ok() : res.status();
  }
  if (target_ok.ok() && link) {
    // Held there; from the commit on it runs there. Once the commit may have reached the target,
    // only the target knows where the job runs: if its answer is lost, it is asked (a new
    // connection), and the job comes back here only if the target says it ended its copy.
    ckpt::fault_point("migrate-before-commit");
    guardian.say("c");
    target_ok = link->send_commit();
    ckpt::fault_point("migrate-commit-sent");
    if (target_ok.ok()) target_ok = link->await_commit();
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
    guardian.done();
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
  guardian.done();
  cleanup();
  rep.total_s = seconds_since(t0);
  return rep;
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
