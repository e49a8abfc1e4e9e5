// criu.cc — runs CRIU as a child process (fork + exec, no shell), reads its logs for the cause of a
// failure. No CRIU library is linked: the program is the interface CRIU keeps stable.
#include "ckpt/criu.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <linux/magic.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include "ckpt/image.h"  // fault_point

extern char** environ;

namespace pos::ckpt {
namespace {

struct Ran {
  int status = -1;
  std::string output;  // stdout and stderr, at most 64 KiB
  bool abandoned = false;  // ended by the caller's `abandon`
};

constexpr std::chrono::seconds kGoneGrace{5};

// /proc/PID/stat's fields from the state on (field 3 first; the command name before it may hold
// spaces), or none when the process is gone. read(2), not a stream: a process that exits between
// open and read fails the read with ESRCH, and libstdc++'s stream buffer throws on that.
std::vector<std::string> stat_fields(pid_t pid) {
  std::string stat;
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];  // the whole line: 52 numbers of at most 20 digits and a short command name
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) stat.assign(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  const size_t close = stat.rfind(')');
  std::vector<std::string> out;
  if (close == std::string::npos) return out;
  std::istringstream in(stat.substr(close + 1));
  for (std::string field; in >> field;) out.push_back(field);
  return out;
}

// Whether `pid` runs: it exists and is no zombie (/proc/PID/stat's state).
bool process_alive(pid_t pid) {
  const std::vector<std::string> f = stat_fields(pid);
  return !f.empty() && f[0] != "Z" && f[0] != "X";
}

// Runs argv[0] with argv; stdout and stderr captured (bounded). CRIU dies with this thread (a
// parent-death signal): a pos-cli killed mid-dump must not leave a CRIU behind that goes on to end
// the job it was dumping. `fault_stage`: a fault point (fault_point) once CRIU is mid-dump: when
// `mid` says so (polled every millisecond, 5 s at most; without it, 50 ms after CRIU started), CRIU
// is stopped (SIGSTOP) so that it cannot finish before the fault point kills this process, and with
// it CRIU (its parent-death signal). `tick`: called about every 100 ms while the program runs.
// `abandon`, asked every 100 ms while the program runs: true ends it (SIGKILL) and stops waiting
// for its output; the result then says so (Ran::abandoned).
StatusOr<Ran> run(const std::vector<std::string>& argv, const char* fault_stage = nullptr,
                  const std::function<void()>& tick = {}, const std::function<bool()>& mid = {},
                  const std::function<bool()>& abandon = {}) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Status::Unavailable(std::string("pipe: ") + std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // async-signal-safe calls only: the parent may have other threads
    (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent is gone already
    const int nul = ::open("/dev/null", O_RDONLY);
    if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(p[1], 1) < 0 || ::dup2(p[1], 2) < 0) ::_exit(127);
    ::execve(args[0], args.data(), environ);
    ::_exit(127);
  }
  const int e = errno;
  ::close(p[1]);
  if (pid < 0) {
    ::close(p[0]);
    return Status::Unavailable("cannot run " + argv[0] + ": " + std::strerror(e));
  }
  if (fault_stage != nullptr) {
    const char* want = std::getenv("POS_FAULT_POINT");
    if (want != nullptr && std::strcmp(want, fault_stage) == 0) {
      if (mid) {
        for (int i = 0; i < 5000 && !mid(); ++i) ::usleep(1000);
        (void)::kill(pid, SIGSTOP);
      } else {
        ::usleep(50'000);
      }
      fault_point(fault_stage);
    }
  }
  Ran r;
  char buf[4096];
  for (;;) {
    if (tick || abandon) {
      pollfd pf{p[0], POLLIN, 0};
      const int ready = ::poll(&pf, 1, 100);
      if (abandon && abandon()) {
        (void)::kill(pid, SIGKILL);
        r.abandoned = true;
        break;  // a helper it forked may hold the pipe open: no waiting for its end
      }
      if (ready == 0 || (ready < 0 && errno == EINTR)) {
        if (tick) tick();
        continue;
      }
    }
    const ssize_t n = ::read(p[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (r.output.size() < (64u << 10)) r.output.append(buf, static_cast<size_t>(n));
  }
  ::close(p[0]);
  while (::waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
  }
  return r;
}

bool exited_ok(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string l;
  std::getline(f, l);
  return l;
}

// "Version: 4.1.1" → 4.
int major_version(const std::string& out) {
  const size_t v = out.find("Version: ");
  return v == std::string::npos ? -1 : std::atoi(out.c_str() + v + 9);
}

}  // namespace

std::string criu_errors(const std::string& log_path, size_t max) {
  std::ifstream f(log_path);
  std::string line, out;
  size_t n = 0;
  while (std::getline(f, line) && n < max) {
    const size_t at = line.find("Error (");  // "(00.012345) Error (criu/...): ...", at any level
    if (at == std::string::npos) continue;
    line = line.substr(at);
    // RLIMIT_NOFILE for itself is a warning in effect: CRIU carries on (containers forbid raising it).
    if (line.find("RLIMIT_NOFILE") != std::string::npos) continue;
    out += (out.empty() ? "" : "; ") + line;
    ++n;
  }
  return out.empty() ? "no error line in " + log_path : out;
}

namespace {

// What `criu check` said of one CRIU binary on this boot of this kernel. Kept in this process and,
// for root, in a small file (criu_cache_path) that every later pos-cli reads: each run of
// `pos-cli dump` or of a checkpointer would otherwise pay for `criu check` again. The key names the
// binary (path, device, inode, size, modification time) and the boot (kernel release and boot id),
// so a new CRIU or a new kernel is checked afresh. A wrong file can only make POS skip the check:
// the dump then fails with CRIU's own error, never silently.
struct CriuFacts {
  bool check_ok = false;
  int tracks_memory = -1;  // -1: not asked yet
};

std::string criu_key(const std::string& criu) {
  struct stat st {};
  if (::stat(criu.c_str(), &st) != 0) return "";
  std::string boot = first_line("/proc/sys/kernel/random/boot_id");
  std::string release = first_line("/proc/sys/kernel/osrelease");
  std::ostringstream k;
  k << criu << "|" << st.st_dev << ":" << st.st_ino << "|" << st.st_size << "|" << st.st_mtim.tv_sec << "."
    << st.st_mtim.tv_nsec << "|" << release << "|" << boot;
  const std::string key = k.str();
  return key.find('\n') == std::string::npos ? key : "";
}

// $POS_CRIU_CACHE (empty: none), else /run/pos-criu-check for root (/run is root's; a user cannot
// run CRIU without capabilities anyway, so nothing is kept for users).
std::string criu_cache_path() {
  if (const char* e = std::getenv("POS_CRIU_CACHE"); e != nullptr) return e;
  return ::geteuid() == 0 ? "/run/pos-criu-check" : "";
}

std::mutex facts_mu;
std::map<std::string, CriuFacts>& facts_in_process() {
  static std::map<std::string, CriuFacts> m;
  return m;
}

// The file is trusted only if it is a small regular file of this user that no one else may write.
CriuFacts read_cached_facts(const std::string& path, const std::string& key) {
  CriuFacts f;
  if (path.empty() || key.empty()) return f;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return f;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 022) == 0 &&
      st.st_size < 4096) {
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) text.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "pos-criu-check 1") return f;
  if (!std::getline(in, line) || line != "key " + key) return f;
  while (std::getline(in, line)) {
    if (line == "check ok") f.check_ok = true;
    if (line == "mem_dirty_track 0") f.tracks_memory = 0;
    if (line == "mem_dirty_track 1") f.tracks_memory = 1;
  }
  return f;
}

CriuFacts criu_facts(const std::string& criu) {
  const std::string key = criu_key(criu);
  if (key.empty()) return {};
  {
    std::lock_guard<std::mutex> lk(facts_mu);
    auto it = facts_in_process().find(key);
    if (it != facts_in_process().end() && it->second.check_ok && it->second.tracks_memory >= 0) return it->second;
  }
  CriuFacts mine;
  {
    std::lock_guard<std::mutex> lk(facts_mu);
    if (auto it = facts_in_process().find(key); it != facts_in_process().end()) mine = it->second;
  }
  const CriuFacts file = read_cached_facts(criu_cache_path(), key);
  mine.check_ok = mine.check_ok || file.check_ok;
  if (mine.tracks_memory < 0) mine.tracks_memory = file.tracks_memory;
  return mine;
}

// Kept in this process, and written whole under a temporary name then renamed: a reader sees the
// old file or the new one. A failure to write is no error (the next pos-cli checks again).
void remember_criu_facts(const std::string& criu, const CriuFacts& f) {
  const std::string key = criu_key(criu);
  if (key.empty()) return;
  {
    std::lock_guard<std::mutex> lk(facts_mu);
    facts_in_process()[key] = f;
  }
  const std::string path = criu_cache_path();
  if (path.empty()) return;
  std::string text = "pos-criu-check 1\nkey " + key + "\n";
  if (f.check_ok) text += "check ok\n";
  if (f.tracks_memory >= 0) text += "mem_dirty_track " + std::to_string(f.tracks_memory) + "\n";
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

// CRIU learns what it needs of the kernel at the start of every run (30-45 ms measured: it makes a
// network namespace and a veth pair, among other probes) unless it finds it in /run/criu.kdat, which
// it writes only where /run is a tmpfs, so that a reboot (perhaps into another kernel) clears it.
// Where /run is on disk (containers, some VMs) every dump and restore paid for the probes, twice
// in a migration's downtime. There, POS seeds the file once per boot: `criu check --feature
// mem_dirty_track` in a mount namespace of its own with a tmpfs on /run, whose /run/criu.kdat is
// copied to the real /run, with the boot it is of in /run/criu.kdat.pos-boot. A file left by
// another boot is removed before CRIU can read it (CRIU checks only its format). Root only (CRIU
// reads /run/criu.kdat only as root); best effort: any failure leaves CRIU probing as before.
// POS_CRIU_KDAT=0 turns it off.
void seed_kdat_cache(const std::string& criu) {
  static std::atomic<bool> failed{false};  // tried once in this process and it could not be done
  if (::geteuid() != 0 || failed.load()) return;
  if (const char* e = std::getenv("POS_CRIU_KDAT"); e != nullptr && std::strcmp(e, "0") == 0) return;
  struct statfs fs {};
  if (::statfs("/run", &fs) != 0 || fs.f_type == TMPFS_MAGIC) return;  // CRIU keeps it there itself
  const std::string boot = first_line("/proc/sys/kernel/random/boot_id");
  if (boot.empty() || boot.size() > 64) return;
  struct stat st {};
  if (first_line("/run/criu.kdat.pos-boot") == boot && ::lstat("/run/criu.kdat", &st) == 0 && S_ISREG(st.st_mode)) return;
  (void)::unlink("/run/criu.kdat");  // another boot's, or none
  (void)::unlink("/run/criu.kdat.pos-boot");
  // Everything the child needs is made before the fork: the parent may have other threads.
  const std::string stamp = boot + "\n";
  std::vector<std::string> argv_s{criu, "check", "--feature", "mem_dirty_track"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // async-signal-safe calls only
    (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int run = ::open("/run", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (run < 0 || ::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("pos-kdat", "/run", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4m,mode=0755") != 0)
      ::_exit(2);
    const pid_t c = ::fork();
    if (c == 0) {
      const int nul = ::open("/dev/null", O_RDWR);
      if (nul < 0 || ::dup2(nul, 0) < 0 || ::dup2(nul, 1) < 0 || ::dup2(nul, 2) < 0) ::_exit(127);
      ::execve(argv[0], argv.data(), environ);
      ::_exit(127);
    }
    int cs = 0;
    if (c < 0 || ::waitpid(c, &cs, 0) != c) ::_exit(3);
    static char buf[1 << 16];
    const int in = ::open("/run/criu.kdat", O_RDONLY | O_CLOEXEC);
    const ssize_t n = in >= 0 ? ::read(in, buf, sizeof(buf)) : -1;
    if (n <= 0 || n == static_cast<ssize_t>(sizeof(buf))) ::_exit(4);
    auto put = [&](const char* tmp, const char* name, const char* data, size_t len) {
      const int out = ::openat(run, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (out < 0) return false;
      const bool ok = ::write(out, data, len) == static_cast<ssize_t>(len) && ::fsync(out) == 0;
      ::close(out);
      if (ok && ::renameat(run, tmp, run, name) == 0) return true;
      (void)::unlinkat(run, tmp, 0);
      return false;
    };
    // The cache first, then the boot it is of: a stamp never names a file that is not there.
    if (!put("criu.kdat.pos-tmp", "criu.kdat", buf, static_cast<size_t>(n)) ||
        !put("criu.kdat.pos-boot.tmp", "criu.kdat.pos-boot", stamp.data(), stamp.size()))
      ::_exit(5);
    ::_exit(0);
  }
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed.store(true);
}

}  // namespace

StatusOr<std::string> find_criu() {
  std::string criu;
  if (const char* e = std::getenv("POS_CRIU"); e != nullptr && *e != '\0') {
    criu = e;
  } else {
    const char* prefix = std::getenv("POS_CRIU_PREFIX");
    std::string path_file = "/opt/pos/criu.path";
    if (prefix != nullptr && *prefix != '\0') {
      std::string p = prefix;
      while (p.size() > 1 && p.back() == '/') p.pop_back();
      path_file = p.substr(0, p.rfind('/')) + "/criu.path";
    }
    criu = first_line(path_file);
    if (criu.empty() && prefix != nullptr && *prefix != '\0') criu = std::string(prefix) + "/bin/criu";
    if (criu.empty()) criu = "/usr/sbin/criu";
  }
  if (::access(criu.c_str(), X_OK) != 0)
    return Status::FailedPrecondition("CRIU is not installed (" + criu + " is not an executable): run tools/setup.sh as root, "
                                      "which provides CRIU >= 4 (tools/install_criu.sh), or set POS_CRIU to a criu binary");
  // `criu check` takes from a few milliseconds to over fifty seconds (seen on a loaded two-core VM:
  // its netlink and socket-diag probes): it is run once per binary and boot, and what it said is
  // kept for every later pos-cli (criu_facts).
  seed_kdat_cache(criu);
  CriuFacts f = criu_facts(criu);
  if (f.check_ok) return criu;
  auto v = run({criu, "--version"});
  if (!v.ok()) return v.status();
  const int major = major_version(v->output);
  if (major < 4)
    return Status::FailedPrecondition(criu + " is CRIU " + (major < 0 ? std::string("of an unknown version") : std::to_string(major) + ".x") +
                                      "; POS needs CRIU >= 4 (Debian 12's 3.17 fails on these kernels): run "
                                      "tools/install_criu.sh, or set POS_CRIU");
  auto c = run({criu, "check"});
  if (!c.ok()) return c.status();
  if (!exited_ok(c->status)) {
    std::string why = c->output;
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    return Status::FailedPrecondition(criu + " check failed (" + why +
                                      "): CRIU needs root (CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE) and a kernel it supports");
  }
  f = criu_facts(criu);  // another process may have learnt more meanwhile
  f.check_ok = true;
  remember_criu_facts(criu, f);
  return criu;
}

bool criu_tracks_memory(const std::string& criu) {
  CriuFacts f = criu_facts(criu);
  if (f.tracks_memory >= 0) return f.tracks_memory == 1;
  auto c = run({criu, "check", "--feature", "mem_dirty_track"});
  if (!c.ok()) return false;  // not known: asked again next time
  const bool yes = exited_ok(c->status);
  f = criu_facts(criu);
  f.tracks_memory = yes ? 1 : 0;
  remember_criu_facts(criu, f);
  return yes;
}

namespace {

// "Anonymous:   123 kB" → bytes, from a smaps_rollup text; 0 if absent.
uint64_t rollup_field(const std::string& text, const char* key) {
  const size_t at = text.find(std::string("\n") + key + ":");
  if (at == std::string::npos) return 0;
  return std::strtoull(text.c_str() + at + std::strlen(key) + 2, nullptr, 10) * 1024;
}

void tree_pids(pid_t pid, std::vector<pid_t>* out, int depth) {
  if (depth > 64 || out->size() > 4096) return;  // bounded (a job's tree is far smaller)
  out->push_back(pid);
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(task.c_str());
  if (d == nullptr) return;
  std::vector<pid_t> children;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(task + "/" + e->d_name + "/children");
    long c = 0;
    while (f >> c)
      if (c > 0) children.push_back(static_cast<pid_t>(c));
  }
  ::closedir(d);
  for (pid_t c : children) tree_pids(c, out, depth + 1);
}

}  // namespace

void kill_tree(pid_t pid) {
  std::vector<pid_t> pids;
  tree_pids(pid, &pids, 0);  // a stopped tree: no process forks or leaves meanwhile
  for (pid_t p : pids) (void)::kill(p, SIGKILL);
  // Back once each is dead, as after CRIU's own end of the tree: gone, or a zombie with no thread
  // left (a process's first thread shows as a zombie while its others still exit, and only then
  // is the process its parent's to reap), so that whoever restores the job under its pid next
  // finds it free once reaped. 10 s at most.
  for (pid_t p : pids) {
    for (int i = 0; i < 10'000; ++i) {
      const std::vector<std::string> f = stat_fields(p);
      if (f.empty()) break;  // gone
      const long threads = f.size() > 17 ? std::strtol(f[17].c_str(), nullptr, 10) : -1;  // field 20
      if ((f[0] == "Z" || f[0] == "X") && threads <= 1) break;
      ::usleep(1000);
    }
  }
}

uint64_t tree_memory_bytes(pid_t pid) {
  std::vector<pid_t> pids;
  tree_pids(pid, &pids, 0);
  uint64_t total = 0;
  for (pid_t p : pids) {
    std::ifstream f("/proc/" + std::to_string(p) + "/smaps_rollup");
    std::stringstream text;
    text << "\n" << f.rdbuf();
    const std::string t = text.str();
    if (t.size() > 1) {
      total += rollup_field(t, "Anonymous") + rollup_field(t, "Pss_Shmem");
      continue;
    }
    std::ifstream statm("/proc/" + std::to_string(p) + "/statm");
    uint64_t size = 0, resident = 0;
    if (statm >> size >> resident) total += resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  }
  return total;
}

uint64_t dir_file_bytes(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  uint64_t total = 0;
  while (dirent* e = ::readdir(d)) {
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      total += static_cast<uint64_t>(st.st_size);
  }
  ::closedir(d);
  return total;
}

int criu_verbosity() {
  const char* e = std::getenv("POS_CRIU_VERBOSITY");
  if (e != nullptr && e[0] >= '0' && e[0] <= '4' && e[1] == '\0') return e[0] - '0';
  return 2;
}

namespace {
std::string verbosity_flag(int v) { return "-v" + std::to_string(v >= 0 && v <= 4 ? v : criu_verbosity()); }
}  // namespace

Status criu_dump(const std::string& criu, pid_t pid, const std::string& dir, const CriuDumpOptions& o) {
  if (pid <= 0) return Status::InvalidArgument("criu dump: no process given");
  const char* log = o.pre_dump ? "pre-dump.log" : "dump.log";
  std::vector<std::string> argv{criu, o.pre_dump ? "pre-dump" : "dump", "-t", std::to_string(pid), "-D", dir,
                                "-o", log, verbosity_flag(o.verbosity)};
  if (o.leave_running && !o.pre_dump) argv.push_back("--leave-running");
  if (o.shell_job) argv.push_back("--shell-job");
  if (o.track_mem) argv.push_back("--track-mem");
  if (!o.prev_images_dir.empty()) argv.insert(argv.end(), {"--prev-images-dir", o.prev_images_dir});
  argv.insert(argv.end(), o.extra.begin(), o.extra.end());
  // The criu-dump-running fault point stops CRIU once its first image is there; a CRIU that got
  // the CPU first (a loaded machine) could by then have finished and ended the job. For the fault
  // point only, CRIU is held at its post-dump stage (its images written, the job not yet ended or
  // let go) until the fault point ends pos-cli and, with it, CRIU, which lets the job go on.
  if (const char* want = std::getenv("POS_FAULT_POINT"); want != nullptr && std::strcmp(want, "criu-dump-running") == 0) {
    const std::string hold = dir + "/.fault-hold.sh";
    std::ofstream(hold) << "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] && sleep 30\nexit 0\n";
    if (::chmod(hold.c_str(), 0700) == 0) argv.insert(argv.end(), {"--action-script", hold});
  }
  std::function<void()> tick;
  uint64_t expected = 0;
  if (o.progress) {
    expected = tree_memory_bytes(pid);
    tick = [&] {
      const uint64_t done = dir_file_bytes(dir);
      expected = std::max(expected, done);
      o.progress(done, expected);
    };
  }
  // Mid-dump: CRIU has seized the tree and written its first image; ending the dumped tree is the
  // last thing it does, after all of them.
  // A dumped process that is killed in the middle can leave CRIU waiting forever (CRIU 4.1.1 was
  // seen blocked on a futex after "killed by 9 unexpectedly"): once the process has been gone for
  // kGoneGrace, CRIU is ended and the dump fails. (Without --leave-running CRIU ends the process
  // itself as its last step, and exits well within the grace.)
  std::chrono::steady_clock::time_point gone_since{};
  const auto abandon = [&] {
    if (process_alive(pid)) return false;
    const auto now = std::chrono::steady_clock::now();
    if (gone_since == std::chrono::steady_clock::time_point{}) gone_since = now;
    return now - gone_since >= kGoneGrace;
  };
  auto r = run(argv, "criu-dump-running", tick, [&] {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return false;
    bool img = false;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      img = img || (n.size() > 4 && n.compare(n.size() - 4, 4, ".img") == 0);
    }
    ::closedir(d);
    return img;
  }, abandon);
  if (!r.ok()) return r.status();
  if (r->abandoned)
    return Status::Unavailable(std::string("criu ") + (o.pre_dump ? "pre-dump" : "dump") + " of pid " +
                               std::to_string(pid) + " abandoned: the process ended during the dump and CRIU did not " +
                               "return within " + std::to_string(kGoneGrace.count()) + " s (log: " + dir + "/" + log + ")");
  if (tick && exited_ok(r->status)) tick();  // the last word: what was written, as the total
  if (r->status == 127 << 8 && r->output.empty()) return Status::Unavailable("cannot run " + criu);
  if (!exited_ok(r->status))
    return Status::Unavailable(std::string("criu ") + (o.pre_dump ? "pre-dump" : "dump") + " of pid " +
                               std::to_string(pid) + " failed: " + criu_errors(dir + "/" + log) + " (log: " + dir +
                               "/" + log + ")");
  return Status::Ok();
}

StatusOr<pid_t> criu_restore(const std::string& criu, const std::string& dir, const CriuRestoreOptions& o) {
  const std::string pidfile = dir + "/restored.pid";
  ::unlink(pidfile.c_str());
  std::vector<std::string> argv{criu, "restore", "-D", dir, "-o", "restore.log", verbosity_flag(o.verbosity), "--restore-detached",
                                "--pidfile", pidfile};
  if (o.shell_job) argv.push_back("--shell-job");
  argv.insert(argv.end(), o.extra.begin(), o.extra.end());
  auto r = run(argv);
  if (!r.ok()) return r.status();
  if (!exited_ok(r->status)) {
    const std::string errors = criu_errors(dir + "/restore.log");
    const bool taken = errors.find("File exists") != std::string::npos && errors.find("fork") != std::string::npos;
    return Status::Unavailable("criu restore from " + dir + " failed: " + errors +
                               (taken ? " (a pid of the dumped tree is in use: is the original still running?)" : "") +
                               " (log: " + dir + "/restore.log)");
  }
  const std::string p = first_line(pidfile);
  const long pid = std::atol(p.c_str());
  if (pid <= 0) return Status::Internal("criu restore wrote no pid to " + pidfile);
  return static_cast<pid_t>(pid);
}

}  // namespace pos::ckpt
