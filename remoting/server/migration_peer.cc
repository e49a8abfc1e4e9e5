// migration_peer.cc — the migration stream: frames over TCP, a mutual HMAC-SHA256 challenge, image
// files checked chunk by chunk (CRC-32C) and written under one private directory per migration.
#include "remoting/server/migration_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "ckpt/crc32c.h"
#include "pos/base/log.h"
#include "pos/base/sync.h"
#include "pos/base/thread.h"
#include "pos/base/sha256.h"
#include "pos/base/text.h"
#include "remoting/common/socket_io.h"

extern char** environ;

namespace pos {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kMagic = 0x47494d50;  // "PMIG"
constexpr uint32_t kVersion = 6;  // 2: kAuthOk carries the migration's id; kOutcome. 3: kHole. 4: kPrepare. 5: kStage. 6: kPart, kPartEnd, kStageWait
constexpr uint64_t kMaxFrame = (8u << 20) + 4096;
constexpr size_t kChunk = 8u << 20;
constexpr size_t kZeroPage = 4096;  // the unit in which runs of zeros are found (and not sent)
const char* zeros_page() {
  static const std::vector<char> z(kZeroPage, 0);
  return z.data();
}

enum class Type : uint16_t {
  kHello = 1, kAuth = 2, kAuthOk = 3, kDir = 4, kFile = 5, kData = 6, kSymlink = 7, kSync = 8,
  kRestore = 9, kResult = 10, kError = 11, kCommit = 12, kOutcome = 13,
  kHole = 14,  // u64 n: the open file's next n bytes are a hole (zeros, never sent)
  kCheck = 15,  // what a restore of the job needs here: lines "pid N" and "path /ABS"; answered
  kPrepare = 16,  // as kRestore's body: restore that image's GPU part now, the rest at kRestore; no answer
  kStage = 17,    // u8 lazy, STAGED NUL IMAGE: stage image STAGED (complete here) for IMAGE's kPrepare; no answer
  kPart = 18,     // PartHead, path, bytes: bytes of a file sent in parts, at their offset (any order)
  kPartEnd = 19,  // u64 size, path: the file sent in parts is whole: sized, closed
  kStageWait = 20,  // u32 seconds: answered once the staging restore is ready (0), or it cannot be (1)
};
// kPart's body begins with this, then `path_len` bytes of path, then the bytes.
struct PartHead {
  uint32_t crc32c;
  uint32_t path_len;
  uint64_t offset;
};
static_assert(sizeof(PartHead) == 16);
constexpr uint64_t kMaxPartOffset = uint64_t{1} << 48;  // 256 TiB: a bound, not a limit anyone meets
constexpr size_t kIdBytes = 16;  // a migration's id: 16 hex digits, in kAuthOk after the MAC

struct Header {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint64_t length;
};
static_assert(sizeof(Header) == 16);

struct HelloBody {  // kHello (target → source) and the head of kAuth (source → target)
  uint32_t version;
  uint8_t nonce[32];
  char boot_id[48];
};
struct AuthBody {
  HelloBody hello;
  uint8_t mac[32];
};

// One frame in one sendmsg where the socket takes it whole: with TCP_NODELAY (both sides set it,
// for the small request frames whose answers the migration waits for), a header sent on its own
// would go as a segment of its own.
Status send_frame(int fd, Type t, const void* body, uint64_t n, const void* tail = nullptr, uint64_t tail_n = 0) {
  Header h{kMagic, static_cast<uint16_t>(t), 0, n + tail_n};
  iovec v[3] = {{&h, sizeof(h)}, {const_cast<void*>(body), n}, {const_cast<void*>(tail), tail_n}};
  size_t first = 0;
  const size_t count = tail_n > 0 ? 3 : n > 0 ? 2 : 1;
  while (first < count) {
    msghdr m{};
    m.msg_iov = v + first;
    m.msg_iovlen = count - first;
    const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Unavailable(std::string("socket write: ") + std::strerror(errno));
    size_t done = static_cast<size_t>(w);
    while (first < count && done >= v[first].iov_len) done -= v[first++].iov_len;
    if (first < count) {
      v[first].iov_base = static_cast<char*>(v[first].iov_base) + done;
      v[first].iov_len -= done;
    }
  }
  return Status::Ok();
}

void no_delay(int fd) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A frame's header, checked: its body is at most kMaxFrame bytes (a peer cannot make this side
// allocate more).
Status recv_header(int fd, Header* h) {
  POS_RETURN_IF_ERROR(recv_all(fd, h, sizeof(*h)));
  if (h->magic != kMagic || h->flags != 0 || h->length > kMaxFrame)
    return Status::Corrupt("not a migration stream frame (bad magic, flags or length)");
  return Status::Ok();
}

// One frame; its body in `body`.
Status recv_frame(int fd, Type* t, std::string* body) {
  Header h{};
  POS_RETURN_IF_ERROR(recv_header(fd, &h));
  *t = static_cast<Type>(h.type);
  body->resize(h.length);
  if (h.length > 0) POS_RETURN_IF_ERROR(recv_all(fd, body->data(), body->size()));
  return Status::Ok();
}

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s;
}

void fill_random(uint8_t* p, size_t n) {
  std::random_device rd;  // the kernel's randomness (getrandom) on Linux
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t v = rd();
    std::memcpy(p + i, &v, std::min<size_t>(4, n - i));
  }
}

// The MAC one side sends: over who it is and both nonces, its own first.
Digest256 mac_of(const std::string& secret, const char* role, const uint8_t* mine, const uint8_t* theirs) {
  std::string m = std::string("POS-MIGRATE-1 ") + role;
  m.append(reinterpret_cast<const char*>(mine), 32);
  m.append(reinterpret_cast<const char*>(theirs), 32);
  return hmac_sha256(secret, m);
}

// A relative path of plain components ([A-Za-z0-9._-], not "." or ".."), at most 16 deep.
bool safe_relative(const std::string& p) {
  if (p.empty() || p.size() > 1024 || p.front() == '/') return false;
  size_t depth = 0, start = 0;
  while (start <= p.size()) {
    const size_t end = std::min(p.find('/', start), p.size());
    const std::string c = p.substr(start, end - start);
    if (c.empty() || c == "." || c == ".." || ++depth > 16) return false;
    for (char ch : c)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-')) return false;
    start = end + 1;
  }
  return true;
}

void put_u32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

Status send_result(int fd, int32_t code, const std::string& text) {
  std::string b;
  b.append(reinterpret_cast<const char*>(&code), 4);
  b += text.substr(0, 64u << 10);
  return send_frame(fd, Type::kResult, b.data(), b.size());
}

StatusOr<std::string> expect_result(int fd) {
  Type t;
  std::string b;
  POS_RETURN_IF_ERROR(recv_frame(fd, &t, &b));
  if (t == Type::kError) return Status::Unavailable("the target: " + printable(b, 2000));
  if (t != Type::kResult || b.size() < 4) return Status::Corrupt("the target answered with an unexpected frame");
  int32_t code = 0;
  std::memcpy(&code, b.data(), 4);
  std::string text = b.substr(4);
  if (code != 0) return Status::Unavailable("the target: " + printable(text, 4000));
  return text;
}

}  // namespace

StatusOr<std::string> read_migration_secret(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::InvalidArgument("cannot open the migration secret " + path + ": " + std::strerror(errno));
  UniqueFd f(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return Status::InvalidArgument(path + " is no regular file");
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return Status::InvalidArgument("the migration secret " + path + " belongs to another user");
  if ((st.st_mode & 077) != 0)
    return Status::InvalidArgument("the migration secret " + path + " is open to group or others (chmod 600 it)");
  if (st.st_size > 4096) return Status::InvalidArgument("the migration secret " + path + " is longer than 4 KiB");
  std::string s(static_cast<size_t>(st.st_size), '\0');
  if (!s.empty() && ::read(fd, s.data(), s.size()) != static_cast<ssize_t>(s.size()))
    return Status::InvalidArgument("cannot read " + path);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) return Status::InvalidArgument("the migration secret in " + path + " is shorter than 16 bytes");
  return s;
}

// ---- the receiving posd ----

StatusOr<std::unique_ptr<MigrationServer>> MigrationServer::start(const MigrationServerOptions& o) {
  auto sa = parse_ipv4_endpoint(o.listen, "posd.migration.listen");
  if (!sa.ok()) return sa.status();
  if (o.secret.size() < 16) return Status::InvalidArgument("posd.migration: the secret is shorter than 16 bytes");
  if (o.dir.empty() || o.dir.front() != '/') return Status::InvalidArgument("posd.migration.dir must be an absolute path");
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (::chmod(o.dir.c_str(), 0700) != 0)
    return Status::InvalidArgument("posd.migration.dir " + o.dir + ": " + std::strerror(errno));
  std::unique_ptr<MigrationServer> m(new MigrationServer());
  m->opt_ = o;
  auto server = TcpServer::start(*sa, 4, "migrations", [p = m.get()](int fd, const std::string& peer) { p->handle(fd, peer); });
  if (!server.ok()) return server.status();
  m->server_ = std::move(*server);
  return m;
}

MigrationServer::~MigrationServer() = default;

namespace {

// A one-shot test hook: the environment variable names a file; if it exists it is removed and the
// hook fires (so that a test makes one migration fail among several).
bool test_hook(const char* var) {
  const char* f = std::getenv(var);
  return f != nullptr && *f != '\0' && ::unlink(f) == 0;
}
// The same, armed for one name: the file holds it (a line); it fires when `name` is that.
bool test_hook_names(const char* var, const std::string& name) {
  const char* f = std::getenv(var);
  if (f == nullptr || *f == '\0') return false;
  std::ifstream in(f);
  std::string want;
  if (!std::getline(in, want) || want != name) return false;
  return ::unlink(f) == 0;
}

// A check frame's answer: empty when this host has every path it names (and, with `pids`, none of
// its pids is in use), else what is missing, in at most 20 items. The body is the peer's: bounded
// and checked line by line.
std::string missing_for_restore(const std::string& body, bool pids) {
  std::string out;
  size_t items = 0, lines = 0;
  auto add = [&](const std::string& what) {
    if (++items <= 20) out += (out.empty() ? "" : "; ") + what;
  };
  if (body.size() > (1u << 20)) return "a check of more than 1 MiB";
  size_t at = 0;
  while (at < body.size()) {
    size_t nl = body.find('\n', at);
    if (nl == std::string::npos) nl = body.size();
    const std::string line = body.substr(at, nl - at);
    at = nl + 1;
    if (line.empty()) continue;
    if (++lines > 8192) return "a check of more than 8192 lines";
    if (line.rfind("pid ", 0) == 0) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(line.c_str() + 4, &end, 10);
      if (end == line.c_str() + 4 || *end != '\0' || v == 0 || v > (1ul << 22)) return "a bad pid line in the check";
      if (pids && (::kill(static_cast<pid_t>(v), 0) == 0 || errno == EPERM))
        add("pid " + std::to_string(v) + " is in use here (CRIU restores the job under its own pids)");
    } else if (line.rfind("path /", 0) == 0 && line.size() <= 4096 + 5 && line.find('\0') == std::string::npos) {
      const std::string path = line.substr(5);
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) add(printable(path, 300) + " does not exist here");
    } else {
      return "a line the check does not know: '" + printable(line, 100) + "'";
    }
  }
  if (items > 20) out += "; and " + std::to_string(items - 20) + " more";
  return out;
}

// pos-cli restore --hold, run for a migration: its stdin (the commit's "go"), its output.
class HeldRestore {
 public:
  bool start(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return false;
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]), ::close(in[1]);
      return false;
    }
    std::vector<char*> a;
    for (const auto& x : argv) a.push_back(const_cast<char*>(x.c_str()));
    a.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(in[0], 0), ::dup2(out[1], 1), ::dup2(out[1], 2);
      ::close_range(3, ~0u, 0);
      ::execve(a[0], a.data(), environ);
      ::_exit(127);
    }
    ::close(in[0]), ::close(out[1]);
    if (pid_ < 0) {
      ::close(in[1]), ::close(out[0]);
      return false;
    }
    in_ = UniqueFd(in[1]), out_ = UniqueFd(out[0]);
    return true;
  }
  // Reads its output until `until` appears in it (true) or it closes its output / `seconds` pass.
  bool read_until(const std::string& until, int seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    char buf[4096];
    while (until.empty() || output.find(until) == std::string::npos) {
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
      if (left <= 0) return false;
      pollfd pf{out_.get(), POLLIN, 0};
      if (::poll(&pf, 1, left) <= 0) continue;
      const ssize_t n = ::read(out_.get(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return until.empty();
      if (output.size() < (64u << 10)) output.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // A line on its stdin. A process that has ended already does not take posd with it: SIGPIPE is
  // held for this write, and a pending one is taken back.
  void say(const char* line) {
    sigset_t pipe, old;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe, &old);
    const ssize_t n = ::write(in_.get(), line, std::strlen(line));
    if (n < 0 && errno == EPIPE) {
      const timespec zero{0, 0};
      while (::sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  // Its exit code (-1: killed or never started), after closing its stdin (no "go": it ends the job).
  int finish(int seconds) {
    if (pid_ <= 0) return -1;
    in_.reset();
    if (!read_until("", seconds)) ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  ~HeldRestore() { (void)finish(60); }
  bool running() const { return pid_ > 0; }
  // Becomes `o` (which must have ended or never started here), which is left without a process.
  void take(HeldRestore& o) {
    (void)finish(60);
    pid_ = o.pid_, in_ = std::move(o.in_), out_ = std::move(o.out_), output = std::move(o.output);
    o.pid_ = -1;
    o.output.clear();
  }
  std::string output;

 private:
  pid_t pid_ = -1;
  UniqueFd in_, out_;
};


// The receiving side's writers: each checks a chunk's CRC-32C and writes it at its offset, on
// threads of their own while the next chunk arrives. One thread that received, checked and wrote in
// turn moved ~1.5 GB/s on the H200 host, one writer beside the receiver 1.8–2.1 GB/s: a tmpfs file
// takes one writer's bytes at 2.7–3.2 GB/s, and the check comes on top, while the veth carries
// 3.2–3.6 GB/s. kWriters of them write different chunks (of one file or several: every chunk has
// its own offset) side by side. At most kBuffers chunks wait.
class ChunkWriter {
 public:
  using Buffer = std::unique_ptr<char[]>;
  static constexpr size_t kWriters = 4;
  static constexpr size_t kBuffers = 8;
  ~ChunkWriter() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : ts_)
      if (t.joinable()) t.join();
  }
  // A buffer of kMaxFrame bytes for the next frame's body; waits while all of them are queued.
  Buffer take() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !free_.empty() || made_ < kBuffers; });
    if (free_.empty()) {
      ++made_;
      return Buffer(new char[kMaxFrame]);
    }
    Buffer b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void give_back(Buffer b) {
    {
      std::lock_guard<std::mutex> l(m_);
      free_.push_back(std::move(b));
    }
    cv_.notify_all();
  }
  // Queues the chunk in `b` (its CRC-32C in the first 4 bytes, then `n` bytes) for `file` at `off`.
  // Without a thread (the kernel refused one) it is written here, now.
  void write(std::shared_ptr<UniqueFd> file, uint64_t off, Buffer b, size_t n) {
    Job j{std::move(file), off, std::move(b), n};
    if (!started_) {
      started_ = true;
      ts_.resize(kWriters);
      size_t up = 0;
      for (auto& t : ts_) up += start_thread(&t, "the migration stream's writer", [this] { run(); }).ok() ? 1 : 0;
      inline_ = up == 0;  // fewer than kWriters still write; none: this thread does
    }
    if (inline_) {
      do_job(j);
      give_back(std::move(j.b));
      return;
    }
    {
      std::lock_guard<std::mutex> l(m_);
      q_.push_back(std::move(j));
    }
    cv_.notify_all();
  }
  // Waits until everything queued is written; the first error so far (it stays).
  Status drain() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return q_.empty() && busy_ == 0; });
    std::lock_guard<std::mutex> e(err_m_);
    return err_;
  }
  bool failed() const { return has_error_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    std::shared_ptr<UniqueFd> file;
    uint64_t off;
    Buffer b;
    size_t n;
  };
  void run() {
    name_this_thread("pos-mig-write");
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      Job j = std::move(q_.front());
      q_.pop_front();
      ++busy_;
      l.unlock();
      do_job(j);
      j.file.reset();  // the file closes with its last chunk
      l.lock();
      free_.push_back(std::move(j.b));
      --busy_;
      cv_.notify_all();
    }
  }
  void do_job(const Job& j) {
    if (failed()) return;  // after the first error nothing more is written
    uint32_t crc = 0;
    std::memcpy(&crc, j.b.get(), 4);
    const char* p = j.b.get() + 4;
    if (ckpt::crc32c(p, j.n) != crc) return fail("a chunk arrived damaged (CRC-32C)");
    size_t done = 0;
    while (done < j.n) {
      const ssize_t w = ::pwrite(j.file->get(), p + done, j.n - done, static_cast<off_t>(j.off + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return fail(std::string("writing: ") + (w < 0 ? std::strerror(errno) : "no progress"));
      done += static_cast<size_t>(w);
    }
  }
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> l(err_m_);
    if (err_.ok()) err_ = Status::Unavailable(why);
    has_error_.store(true, std::memory_order_relaxed);
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> q_;
  std::vector<Buffer> free_;
  size_t made_ = 0, busy_ = 0;  // buffers made; chunks being written
  bool stop_ = false, started_ = false, inline_ = false;
  std::mutex err_m_;
  Status err_;
  std::atomic<bool> has_error_{false};
  std::vector<std::thread> ts_;
};

std::atomic<int> g_damage_chunks{0};  // damage_sent_chunks_for_test

// What the sending side's reader hands its sender: one frame of `body` (an entry, a hole), or a
// chunk of a file's data read into `buf` with the frames it goes as (runs of data, each with its
// CRC-32C, and runs of whole pages of zeros, which go as holes).
struct Piece {
  Type type = Type::kData;
  std::string body;
  std::unique_ptr<char[]> buf;
  struct Run {
    size_t off, len;
    bool zero;
    uint32_t crc;
  };
  std::vector<Run> runs;
};

// Reads a directory for the stream on a thread of its own (file reads, the search for pages of
// zeros, the checksums) while the caller sends what it read: the two went in turn before, and the
// stream moved at the sum of their times. At most kBuffers chunks of 8 MiB are read ahead (the
// reader takes kReadAhead at a time).
class DirFeed {
 public:
  static constexpr size_t kBuffers = 8, kMaxQueued = 256;
  using Emit = std::function<Status(Piece&&)>;
  using Walk = std::function<Status(const Emit&, const std::function<std::unique_ptr<char[]>()>&)>;
  explicit DirFeed(Walk walk) : walk_(std::move(walk)) {}
  ~DirFeed() {
    cancel();
    if (t_.joinable()) t_.join();
  }
  // Starts the reader; false if the kernel refused a thread (then run_inline sends as it reads).
  bool start() {
    return start_thread(&t_, "the migration stream's reader", [this] {
             name_this_thread("pos-mig-read");
             Status s = walk_([this](Piece&& p) { return push(std::move(p)); }, [this] { return take(); });
             std::lock_guard<std::mutex> l(m_);
             done_ = true;
             result_ = s;
             cv_.notify_all();
           }).ok();
  }
  Status run_inline(const Emit& send) {
    return walk_(send, [] { return std::unique_ptr<char[]>(new char[kChunk]); });
  }
  // The next piece; false once the reader ended (its status in result()).
  bool next(Piece* p) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !q_.empty() || done_; });
    if (q_.empty()) return false;
    *p = std::move(q_.front());
    q_.pop_front();
    cv_.notify_all();
    return true;
  }
  void recycle(std::unique_ptr<char[]> b) {
    if (!b) return;
    std::lock_guard<std::mutex> l(m_);
    free_.push_back(std::move(b));
    cv_.notify_all();
  }
  Status result() {
    std::lock_guard<std::mutex> l(m_);
    return result_;
  }
  // The sender failed: the reader stops at its next piece.
  void cancel() {
    std::lock_guard<std::mutex> l(m_);
    cancelled_ = true;
    cv_.notify_all();
  }

 private:
  Status push(Piece&& p) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return cancelled_ || q_.size() < kMaxQueued; });
    if (cancelled_) return Status::Unavailable("the send failed");
    q_.push_back(std::move(p));
    cv_.notify_all();
    return Status::Ok();
  }
  std::unique_ptr<char[]> take() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return cancelled_ || !free_.empty() || made_ < kBuffers; });
    if (cancelled_) return nullptr;
    if (free_.empty()) {
      ++made_;
      return std::unique_ptr<char[]>(new char[kChunk]);
    }
    auto b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  Walk walk_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Piece> q_;
  std::vector<std::unique_ptr<char[]>> free_;
  size_t made_ = 0;
  bool done_ = false, cancelled_ = false;
  Status result_;
  std::thread t_;
};


// Chunks read and scanned at once by read_dir_for_stream (threads of their own).
constexpr size_t kReadAhead = 4;

// `len` bytes of `fd` at `at` into p->buf, cut into runs of data (each with its CRC-32C) and runs
// of whole pages of zeros, which go as holes (the target's file is sized up front, so a hole reads
// as zeros there): a CRIU dump holds many (memory the job touched but never wrote, the driver's
// zeroed buffers).
Status scan_chunk(int fd, uint64_t at, size_t len, Piece* p) {
  char* buf = p->buf.get();
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, buf + got, len - got, static_cast<off_t>(at + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Unavailable("it shrank or failed");
    got += static_cast<size_t>(n);
  }
  // A whole page of zeros at `i` (a shorter tail never is: it goes with the data).
  auto zero_at = [&](size_t i) { return got - i >= kZeroPage && std::memcmp(buf + i, zeros_page(), kZeroPage) == 0; };
  for (size_t i = 0; i < got;) {
    const bool zero = zero_at(i);
    size_t j = i;
    do j = std::min(j + kZeroPage, got);
    while (j < got && zero_at(j) == zero);
    uint32_t crc = zero ? 0u : ckpt::crc32c(buf + i, j - i);
    if (!zero && g_damage_chunks.load(std::memory_order_relaxed) > 0 && g_damage_chunks.fetch_sub(1) > 0) crc ^= 1;
    p->runs.push_back({i, j - i, zero, crc});
    i = j;
  }
  return Status::Ok();
}

// The frames that carry `local_dir` as `as` (after its own directory frame), in order, through
// `emit`; a file's data is read into buffers from `take` (nullptr: the sender stopped).
Status read_dir_for_stream(const std::string& local_dir, const std::string& as, const std::vector<std::string>& skip,
                           const DirFeed::Emit& emit, const std::function<std::unique_ptr<char[]>()>& take) {
  const auto frame = [&](Type t, std::string body) {
    Piece p;
    p.type = t;
    p.body = std::move(body);
    return emit(std::move(p));
  };
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(local_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(local_dir);
    if (std::find(skip.begin(), skip.end(), rel.string()) != skip.end()) {
      it.disable_recursion_pending();
      continue;
    }
    const std::string name = as + "/" + rel.string();
    if (!safe_relative(name)) return Status::InvalidArgument("cannot send " + it->path().string() + ": an unusual name");
    const fs::file_status st = it->symlink_status(ec);
    if (fs::is_symlink(st)) {
      const std::string target = fs::read_symlink(it->path(), ec).string();
      std::string body = name;
      body.push_back('\0');
      body += target;
      POS_RETURN_IF_ERROR(frame(Type::kSymlink, std::move(body)));
    } else if (fs::is_directory(st)) {
      POS_RETURN_IF_ERROR(frame(Type::kDir, name));
    } else if (fs::is_regular_file(st)) {
      UniqueFd f(::open(it->path().c_str(), O_RDONLY | O_CLOEXEC));
      struct stat s {};
      if (!f || ::fstat(f.get(), &s) != 0) return Status::Unavailable("cannot read " + it->path().string());
      std::string head;
      put_u32(&head, static_cast<uint32_t>(s.st_mode & 0600));
      put_u64(&head, static_cast<uint64_t>(s.st_size));
      head += name;
      POS_RETURN_IF_ERROR(frame(Type::kFile, std::move(head)));
      // Holes are not sent (an incremental image's memory files leave unchanged chunks as holes):
      // the file system says where its data is; one that cannot say has data everywhere.
      const uint64_t size = static_cast<uint64_t>(s.st_size);
      uint64_t at = 0;
      while (at < size) {
        off_t data = ::lseek(f.get(), static_cast<off_t>(at), SEEK_DATA);
        if (data < 0 && errno == ENXIO) data = static_cast<off_t>(size);  // a hole to the end
        else if (data < 0) data = static_cast<off_t>(at);
        if (static_cast<uint64_t>(data) > at) {
          const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(data), size) - at;
          POS_RETURN_IF_ERROR(frame(Type::kHole, std::string(reinterpret_cast<const char*>(&n), 8)));
          at += n;
          continue;
        }
        off_t hole = ::lseek(f.get(), static_cast<off_t>(at), SEEK_HOLE);
        const uint64_t end = hole < 0 ? size : std::min<uint64_t>(static_cast<uint64_t>(hole), size);
        // Up to kReadAhead chunks at a time, each read, searched and checksummed on a thread of its
        // own, then emitted in order: one thread moved ~2-3 GB/s of file bytes, below the stream's
        // rate (the stop's GPU part of the H200's 8 GB job took ~0.15 s to send, 0.15-0.29 GB on
        // the wire of 0.41-0.55 GB read).
        while (at < end) {
          Piece batch[kReadAhead];
          Status scanned[kReadAhead];
          uint64_t from[kReadAhead];
          size_t n = 0;
          for (; n < kReadAhead && at < end; ++n) {
            batch[n].buf = take();
            if (!batch[n].buf) return Status::Unavailable("the send failed");
            from[n] = at;
            at += std::min<uint64_t>(end - at, kChunk);
          }
          const auto scan = [&, fd = f.get()](size_t i) {
            scanned[i] = scan_chunk(fd, from[i], static_cast<size_t>((i + 1 < n ? from[i + 1] : at) - from[i]), &batch[i]);
          };
          std::thread helpers[kReadAhead];
          for (size_t i = 1; i < n; ++i)
            if (!start_thread(&helpers[i], "the migration stream's read-ahead", [&scan, i] { scan(i); }).ok()) scan(i);
          scan(0);
          for (size_t i = 1; i < n; ++i)
            if (helpers[i].joinable()) helpers[i].join();
          for (size_t i = 0; i < n; ++i) {
            if (!scanned[i].ok()) return scanned[i].with_context("reading " + it->path().string());
            POS_RETURN_IF_ERROR(emit(std::move(batch[i])));
          }
        }
      }
    }
  }
  if (ec) return Status::Unavailable("reading " + local_dir + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

// One migration: the handshake, then frames until the peer closes. Everything it wrote goes when
// it ends; a job it restored and the peer did not commit is ended.
void MigrationServer::handle(int fd, const std::string& peer) {
  no_delay(fd);
  timeval tv{10, 0};  // the handshake's limit; then 2 minutes per frame
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  auto refuse = [&](const std::string& why) {
    POS_WARN("posd", "migration from %s refused: %s", peer.c_str(), why.c_str());
    (void)send_frame(fd, Type::kError, why.data(), why.size());
  };
  HelloBody hello{};
  hello.version = kVersion;
  fill_random(hello.nonce, sizeof(hello.nonce));
  const std::string my_boot = boot_id();
  std::memcpy(hello.boot_id, my_boot.data(), std::min(my_boot.size(), sizeof(hello.boot_id) - 1));
  if (!send_frame(fd, Type::kHello, &hello, sizeof(hello)).ok()) return;
  Type t;
  std::string b;
  if (Status s = recv_frame(fd, &t, &b); !s.ok()) {
    POS_WARN("posd", "migration from %s refused: %s", peer.c_str(), s.message().c_str());
    return;
  }
  if (t != Type::kAuth || b.size() != sizeof(AuthBody)) return refuse("the first frame must be the peer's authentication");
  AuthBody auth{};
  std::memcpy(&auth, b.data(), sizeof(auth));
  if (auth.hello.version != kVersion)
    return refuse("migration stream version " + std::to_string(auth.hello.version) + " is not " + std::to_string(kVersion));
  const Digest256 want = mac_of(opt_.secret, "source", auth.hello.nonce, hello.nonce);
  if (!equal_in_constant_time(want.data(), auth.mac, want.size()))
    return refuse("the peer does not hold this posd's migration secret");
  // The migration's id: the source asks for its outcome by it (kOutcome) when it lost the answer.
  uint8_t tag[8];
  fill_random(tag, sizeof(tag));
  char hexs[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hexs + 2 * i, 3, "%02x", tag[i]);
  const std::string id(hexs, kIdBytes);
  const Digest256 mine = mac_of(opt_.secret, "target", hello.nonce, auth.hello.nonce);
  if (!send_frame(fd, Type::kAuthOk, mine.data(), mine.size(), id.data(), id.size()).ok()) return;
  tv = timeval{120, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

  // A connection that asks how an earlier migration ended, and nothing else. The server takes one
  // connection at a time, so that migration's own connection has ended: its outcome is final.
  Type first;
  std::string fb;
  if (Status s = recv_frame(fd, &first, &fb); !s.ok()) return;
  if (first == Type::kOutcome) {
    const auto it = fb.size() == kIdBytes ? outcomes_.find(fb) : outcomes_.end();
    const std::string answer = it == outcomes_.end() ? "unknown" : it->second.committed ? "committed" : "ended";
    POS_INFO("posd", "migration from %s: asked how migration %s ended: %s", peer.c_str(), printable(fb, 40).c_str(),
             answer.c_str());
    (void)send_result(fd, 0, answer);
    return;
  }
  const bool same_boot = std::string(auth.hello.boot_id, strnlen(auth.hello.boot_id, sizeof(auth.hello.boot_id))) == my_boot;
  const std::string root = opt_.dir + "/in-" + id;
  if (::mkdir(root.c_str(), 0700) != 0) return refuse("cannot make " + root + ": " + std::strerror(errno));
  POS_INFO("posd", "migration from %s: authenticated; receiving into %s", peer.c_str(), root.c_str());
  if (opt_.on_authenticated) opt_.on_authenticated();
  // Last out of this scope: after the held restores below have ended or been handed over.
  struct Finished {
    const std::function<void()>& f;
    ~Finished() {
      if (f) f();
    }
  } finished{opt_.on_finished};
  uint32_t restored_pid = 0;
  bool committed = false;
  HeldRestore held;
  HeldRestore prepared;  // kPrepare's: the GPU part restored ahead, waiting for "criu"
  std::string prepared_image;
  HeldRestore staged;  // kStage's: an earlier image staged, waiting for "prepare" (then it is `prepared`)
  std::string staged_image;
  Status failed;  // the first write error: reported at the next sync or restore, then the stream ends
  // The open file's bytes go to the writer's thread (checked and written there, in order, at the
  // offsets this loop counts); its first error joins `failed` at the next sync or restore.
  ChunkWriter writer;
  std::shared_ptr<UniqueFd> file;
  uint64_t file_size = 0, file_left = 0, total = 0, files = 0;
  // Files sent in parts (the stop's GPU part while the source's posd drains it): by path, with the
  // end of the furthest part so far, until their kPartEnd.
  struct PartFile {
    std::shared_ptr<UniqueFd> fd;
    uint64_t end = 0;
  };
  std::map<std::string, PartFile> parts;
  auto fail = [&](const std::string& why) {
    if (failed.ok()) failed = Status::Unavailable(why);
    file.reset();
    file_left = 0;
  };
  auto settle = [&] {
    if (Status w = writer.drain(); !w.ok() && failed.ok()) {
      failed = w;
      file.reset();
      file_left = 0;
    }
  };
  bool have = true;  // the first frame, read above
  t = first, b = std::move(fb);
  for (;;) {
    if (!have) {
      Header h{};
      if (!recv_header(fd, &h).ok()) break;  // closed, timed out or garbled: the migration ends
      t = static_cast<Type>(h.type);
      if (t == Type::kData) {
        // A file's bytes: received straight into a writer's buffer, which the writer checks and
        // writes while the next frame arrives.
        ChunkWriter::Buffer buf = writer.take();
        if (h.length > 0 && !recv_all(fd, buf.get(), h.length).ok()) break;
        if (h.length < 4 || h.length - 4 > file_left) {
          if (failed.ok()) fail("file bytes beyond the file's announced size, or outside a file");
          writer.give_back(std::move(buf));
          continue;
        }
        const size_t n = h.length - 4;
        const uint64_t off = file_size - file_left;
        file_left -= n;
        total += n;
        if (file && failed.ok() && !writer.failed()) writer.write(file, off, std::move(buf), n);
        else writer.give_back(std::move(buf));
        if (file_left == 0) file.reset();
        continue;
      }
      if (t == Type::kPart) {
        // Like kData, straight into a writer's buffer (its CRC-32C in the first 4 bytes), after the
        // part's head and path.
        PartHead ph{};
        if (h.length < sizeof(ph) || !recv_all(fd, &ph, sizeof(ph)).ok()) break;
        if (ph.path_len == 0 || ph.path_len > 1024 || h.length - sizeof(ph) <= ph.path_len) {
          fail("a malformed part frame");
          break;  // its length cannot be trusted: the stream cannot go on
        }
        std::string path(ph.path_len, '\0');
        if (!recv_all(fd, path.data(), path.size()).ok()) break;
        const uint64_t n = h.length - sizeof(ph) - ph.path_len;
        ChunkWriter::Buffer buf = writer.take();
        if (!recv_all(fd, buf.get() + 4, n).ok()) break;
        std::memcpy(buf.get(), &ph.crc32c, 4);
        auto it = parts.find(path);
        if (failed.ok() && it == parts.end()) {
          if (!safe_relative(path)) {
            fail("an unsafe path in the stream: '" + printable(path, 200) + "'");
          } else if (file_left != 0) {
            fail("a part began before the last file's bytes were all sent");
          } else if (++files > 100000) {
            fail("more than 100000 entries");
          } else {
            auto f = std::make_shared<UniqueFd>(
                ::open((root + "/" + path).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
            if (!*f) fail("create " + path + ": " + std::strerror(errno));
            else it = parts.emplace(path, PartFile{std::move(f), 0}).first;
          }
        }
        if (failed.ok() && it != parts.end()) {
          struct statvfs v {};
          if (ph.offset > kMaxPartOffset) {
            fail("a part of " + path + " beyond any file's size");
          } else if (::statvfs(root.c_str(), &v) == 0 && static_cast<uint64_t>(v.f_bavail) * v.f_frsize < n + (256ull << 20)) {
            fail("no room in " + opt_.dir + " for " + path);
          }
        }
        if (failed.ok() && it != parts.end() && !writer.failed()) {
          it->second.end = std::max(it->second.end, ph.offset + n);
          total += n;
          writer.write(it->second.fd, ph.offset, std::move(buf), n);
        } else {
          writer.give_back(std::move(buf));
        }
        continue;
      }
      b.resize(h.length);
      if (h.length > 0 && !recv_all(fd, b.data(), b.size()).ok()) break;
    }
    have = false;
    if (t == Type::kDir || t == Type::kFile || t == Type::kSymlink) {
      // Test hook (docs/migration.md, "Fault points"): the link drops as the image the hook file
      // names begins to arrive ("round-2", "final").
      if (t == Type::kDir && test_hook_names("POS_MIGRATION_DROP_AT_FILE", b)) break;
      // Test hook: this posd dies there, as a target posd killed mid-migration (kill -9).
      if (t == Type::kDir && test_hook_names("POS_MIGRATION_DIE_AT_FILE", b)) (void)::raise(SIGKILL);
      if (file_left != 0) {
        fail("a new entry began before the last file's bytes were all sent");
        continue;
      }
      size_t off = 0;
      uint32_t mode = 0600;
      uint64_t size = 0;
      if (t == Type::kFile) {
        if (b.size() < 12) {
          fail("a short file frame");
          continue;
        }
        std::memcpy(&mode, b.data(), 4);
        std::memcpy(&size, b.data() + 4, 8);
        off = 12;
      }
      std::string path = b.substr(off), target;
      if (t == Type::kSymlink) {
        const size_t nul = path.find('\0');
        if (nul == std::string::npos) {
          fail("a symbolic link frame without its target");
          continue;
        }
        target = path.substr(nul + 1);
        path.resize(nul);
      }
      if (!safe_relative(path)) {
        fail("an unsafe path in the stream: '" + printable(path, 200) + "'");
        continue;
      }
      if (writer.failed()) settle();
      if (!failed.ok()) continue;
      if (++files > 100000) {
        fail("more than 100000 entries");
        continue;
      }
      const std::string full = root + "/" + path;
      if (t == Type::kDir) {
        if (::mkdir(full.c_str(), 0700) != 0 && errno != EEXIST) fail("mkdir " + path + ": " + std::strerror(errno));
      } else if (t == Type::kSymlink) {
        // Only within the migration's directory: resolved lexically from the link's own directory.
        const fs::path resolved = (fs::path(path).parent_path() / target).lexically_normal();
        if (target.empty() || target.front() == '/' || resolved.empty() || *resolved.begin() == ".." ||
            target.size() > 1024) {
          fail("a symbolic link leaving the image: '" + printable(target, 200) + "'");
        } else if (::symlink(target.c_str(), full.c_str()) != 0) {
          fail("symlink " + path + ": " + std::strerror(errno));
        }
      } else {
        struct statvfs v {};
        if (::statvfs(root.c_str(), &v) == 0 && static_cast<uint64_t>(v.f_bavail) * v.f_frsize < size + (256ull << 20)) {
          fail("no room in " + opt_.dir + " for " + path + " (" + std::to_string(size) + " bytes)");
          continue;
        }
        file = std::make_shared<UniqueFd>(::open(full.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0600));
        if (!*file) {
          fail("create " + path + ": " + std::strerror(errno));
          continue;
        }
        // Its whole size at once, sparse: a hole frame only moves the offset, and a file that ends
        // in a hole still has its size.
        if (::ftruncate(file->get(), static_cast<off_t>(size)) != 0) {
          fail("sizing " + path + ": " + std::strerror(errno));
          file.reset();
          continue;
        }
        file_size = file_left = size;
        if (size == 0) file.reset();
      }
    } else if (t == Type::kHole) {
      uint64_t n = 0;
      if (b.size() == 8) std::memcpy(&n, b.data(), 8);
      if (n == 0 || n > file_left) {
        if (failed.ok()) fail("a hole beyond the file's announced size, or outside a file");
        continue;
      }
      file_left -= n;  // the writer writes at offsets: a hole only moves the next one
      if (file_left == 0) file.reset();
    } else if (t == Type::kStageWait) {
      // The source is about to stop the job: a staging restore still loading would share this
      // machine's CPUs, memory and GPU with the stop (on one machine, as in CI) and arrive late for
      // its prepare. Answered when it is ready, or why it will not be; at most 30 s.
      uint32_t seconds = 0;
      if (b.size() == 4) std::memcpy(&seconds, b.data(), 4);
      seconds = std::clamp<uint32_t>(seconds, 1, 30);
      std::string answer;
      int32_t code = 1;
      if (!staged.running()) {
        answer = "nothing is being staged";
      } else if (staged.read_until("{\"staged\":true", static_cast<int>(seconds))) {
        code = 0, answer = "staged";
      } else {
        answer = staged.running() ? "the staging restore is not ready yet" : "the staging restore ended";
      }
      if (!send_result(fd, code, answer).ok()) break;
    } else if (t == Type::kPartEnd) {
      uint64_t size = 0;
      const std::string path = b.size() > 8 ? b.substr(8) : "";
      if (b.size() > 8) std::memcpy(&size, b.data(), 8);
      auto it = parts.find(path);
      if (!failed.ok()) continue;
      if (it == parts.end()) {
        fail("the end of a file that was not sent in parts: '" + printable(path, 200) + "'");
      } else if (size < it->second.end || size > kMaxPartOffset) {
        fail("the size of " + path + " does not hold its parts");
      } else {
        // Its whole size, sparse: what no part carried reads as zeros (the source's holes).
        if (::ftruncate(it->second.fd->get(), static_cast<off_t>(size)) != 0) fail("sizing " + path + ": " + std::strerror(errno));
        parts.erase(it);  // closed with its last queued part
      }
    } else if (t == Type::kCheck) {
      // Before the job is touched: what CRIU will need here. The source's copy holds its pids
      // until the switch when both run on one machine, so they are checked only across boots.
      const std::string missing = missing_for_restore(b, !same_boot);
      if (!missing.empty())
        POS_INFO("posd", "migration from %s: this host cannot restore the job: %s", peer.c_str(), printable(missing, 400).c_str());
      if (!send_result(fd, missing.empty() ? 0 : 1, missing).ok()) break;
    } else if (t == Type::kSync) {
      settle();
      if (!failed.ok()) {
        (void)send_result(fd, 1, failed.message());
        break;
      }
      if (!send_result(fd, 0, std::to_string(total)).ok()) break;
    } else if (t == Type::kStage) {
      // A pre-copy round is here whole: a restore of it starts now, into a staging session, so that
      // the job's device memory is on this GPU before the stop; the stop's restore then copies what
      // did not change since from there (docs/migration.md, "Staged at the target"). Best effort.
      const size_t nul = b.size() >= 1 ? b.find('\0', 1) : std::string::npos;
      const std::string from = nul != std::string::npos ? b.substr(1, nul - 1) : "";
      const std::string to = nul != std::string::npos ? b.substr(nul + 1) : "";
      struct stat ms {};
      if (from.empty() || to.empty() || !safe_relative(from) || !safe_relative(to) || !failed.ok() || file_left != 0 || !parts.empty() ||
          held.running() || prepared.running() || staged.running() ||
          ::lstat((root + "/" + from + "/manifest").c_str(), &ms) != 0 || !S_ISREG(ms.st_mode)) {
        POS_INFO("posd", "migration from %s: nothing is staged (a bad or early stage request)", peer.c_str());
        continue;
      }
      settle();  // the round's files are all written before it is read
      if (!failed.ok()) continue;
      const std::string image = root + "/" + to;
      std::vector<std::string> argv{opt_.cli,  "restore", "-D", image, "--socket", opt_.posd_socket, "--json", "--hold",
                                    "--gpu-first", image + "/gpu-first", "--stage", root + "/" + from};
      if (b[0] != 0) argv.push_back("--lazy");
      if (staged.start(argv)) {
        staged_image = image;
        POS_INFO("posd", "migration from %s: staging %s for %s", peer.c_str(), from.c_str(), to.c_str());
      }
    } else if (t == Type::kPrepare) {
      // The stop's GPU part is here (the rest is on its way): its restore starts now, so that its
      // device memory loads meanwhile. Best effort: kRestore restores everything if this failed.
      // Its files are all written first: their last chunks may still be with the writers, and a
      // restore that read gpu-first half written failed (seen with a staged restore, which reads it
      // at once).
      settle();
      const std::string image = b.size() >= 1 && safe_relative(b.substr(1)) ? root + "/" + b.substr(1) : "";
      struct stat gs {}, ps {};
      if (image.empty() || !failed.ok() || file_left != 0 || !parts.empty() || held.running() || prepared.running() ||
          ::lstat((image + "/gpu").c_str(), &gs) != 0 || !S_ISDIR(gs.st_mode) ||
          ::lstat((image + "/gpu-first").c_str(), &ps) != 0 || !S_ISREG(ps.st_mode)) {
        POS_INFO("posd", "migration from %s: the GPU part cannot be restored ahead (a bad or early prepare)", peer.c_str());
        continue;
      }
      if (staged.running() && staged_image == image) {
        // Staged for this image: the same process restores its GPU part now.
        prepared.take(staged);
        prepared.say("prepare\n");
        prepared_image = image;
        POS_INFO("posd", "migration from %s: restoring the GPU part of %s ahead of the rest, from the staged image",
                 peer.c_str(), image.c_str());
        continue;
      }
      if (staged.running()) (void)staged.finish(60);  // staged for another image: its memory goes
      std::vector<std::string> argv{opt_.cli, "restore", "-D", image, "--socket", opt_.posd_socket, "--json", "--hold",
                                    "--gpu-first", image + "/gpu-first"};
      if (b[0] != 0) argv.push_back("--lazy");
      if (prepared.start(argv)) {
        prepared_image = image;
        POS_INFO("posd", "migration from %s: restoring the GPU part of %s ahead of the rest", peer.c_str(), image.c_str());
      }
    } else if (t == Type::kRestore) {
      settle();
      if (b.size() < 1 || !safe_relative(b.substr(1)) || !failed.ok() || file_left != 0 || !parts.empty() ||
          held.running()) {
        (void)send_result(fd, 1, failed.ok() ? "a bad restore request" : failed.message());
        break;
      }
      // Restored and held: the job waits for its permit (no CUDA call runs) until the commit.
      const std::string image = root + "/" + b.substr(1);
      bool up = false;
      if (prepared.running() && prepared_image == image) {
        // Its GPU part was restored ahead: the rest is here now.
        held.take(prepared);
        held.say("criu\n");
        up = held.read_until("{\"held\":", 600);
        if (up && held.output.find("\"gpu_ahead\":false") != std::string::npos)
          POS_INFO("posd", "migration from %s: the GPU part of %s could not be restored ahead; restored from its files after "
                   "the process", peer.c_str(), image.c_str());
        else if (up)
          POS_INFO("posd", "migration from %s: the GPU part of %s was restored ahead", peer.c_str(), image.c_str());
        if (!up) {
          const int code = held.finish(60);
          POS_INFO("posd", "migration from %s: the restore that began with the GPU part failed (%d), restoring anew: %s",
                   peer.c_str(), code, printable(held.output, 400).c_str());
          held.output.clear();
        }
      }
      std::vector<std::string> argv{opt_.cli, "restore", "-D", image, "--socket", opt_.posd_socket, "--json", "--hold"};
      if (b[0] != 0) argv.push_back("--lazy");
      if (!up) up = held.start(argv) && held.read_until("{\"held\":", 600);
      if (!up) {
        const int code = held.finish(60);
        POS_INFO("posd", "migration from %s: restore of %s failed (%d): %s", peer.c_str(), image.c_str(), code,
                 printable(held.output, 400).c_str());
        if (!send_result(fd, 1, held.output).ok()) break;
        continue;
      }
      const size_t at = held.output.find("{\"held\":");
      restored_pid = static_cast<uint32_t>(std::strtoul(held.output.c_str() + at + 8, nullptr, 10));
      POS_INFO("posd", "migration from %s: pid %u restored from %s, held until the source commits", peer.c_str(),
               restored_pid, image.c_str());
      if (!send_result(fd, 0, held.output).ok()) break;
    } else if (t == Type::kCommit) {
      if (!held.running()) {
        (void)send_result(fd, 1, "nothing to commit");
        break;
      }
      // Test hook (docs/migration.md, "Fault points"): the link drops as the commit arrives, before
      // this side acts on it (the job is ended, as for any link lost before a commit).
      if (test_hook("POS_MIGRATION_DROP_COMMIT_FILE")) break;
      held.say("go\n");
      const int code = held.finish(120);
      committed = code == 0;
      if (committed) POS_INFO("posd", "migration from %s: committed; pid %u runs here", peer.c_str(), restored_pid);
      else POS_WARN("posd", "migration from %s: committed, but the job did not re-attach: %s", peer.c_str(), printable(held.output, 400).c_str());
      // Test hook: committed, but the answer is lost (the source must ask, kOutcome).
      if (test_hook("POS_MIGRATION_DROP_ANSWER_FILE")) break;
      (void)send_result(fd, committed ? 0 : 1, held.output);
      break;
    } else {
      fail("an unknown frame type " + std::to_string(static_cast<int>(t)));
    }
  }
  settle();  // nothing is written into the directory after it goes
  if (staged.running()) (void)staged.finish(60);      // its staging session ends with it
  if (prepared.running()) (void)prepared.finish(60);  // its GPU session ends with it
  if (held.running()) {
    // The source never said the job is ours: it may bring it back itself. One copy only: the held
    // restore, told no "go", ends it before it ran a step.
    POS_WARN("posd", "migration from %s ended before it was committed: ending restored pid %u", peer.c_str(), restored_pid);
    (void)held.finish(60);
  }
  // Remembered for a source that lost the answer (the newest 256, an hour at most).
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(outcomes_, [&](const auto& e) { return now - e.second.at > std::chrono::hours(1); });
  while (outcomes_.size() >= 256) {
    auto oldest = outcomes_.begin();
    for (auto it = outcomes_.begin(); it != outcomes_.end(); ++it)
      if (it->second.at < oldest->second.at) oldest = it;
    outcomes_.erase(oldest);
  }
  outcomes_[id] = Outcome{committed, now};
  std::error_code ec;
  fs::remove_all(root, ec);
  if (!failed.ok()) POS_WARN("posd", "migration from %s failed: %s", peer.c_str(), failed.message().c_str());
}

// ---- the sending side ----

void damage_sent_chunks_for_test(int n) { g_damage_chunks.store(n); }

StatusOr<std::unique_ptr<MigrationLink>> MigrationLink::connect(const std::string& host_port, const std::string& secret) {
  auto sa = parse_ipv4_endpoint(host_port, "--to");
  if (!sa.ok()) return sa.status();
  std::unique_ptr<MigrationLink> l(new MigrationLink());
  l->fd_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!l->fd_) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  const int fd = l->fd_.get();
  timeval tv{10, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a = *sa;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Status::Unavailable("cannot reach a posd accepting migrations at " + host_port + ": " + std::strerror(errno));
  no_delay(fd);
  Type t;
  std::string b;
  POS_RETURN_IF_ERROR(recv_frame(fd, &t, &b).with_context("the target at " + host_port));
  if (t != Type::kHello || b.size() != sizeof(HelloBody))
    return Status::Corrupt(host_port + " is no posd accepting migrations (no hello)");
  HelloBody theirs{};
  std::memcpy(&theirs, b.data(), sizeof(theirs));
  if (theirs.version != kVersion) return Status::Unsupported(host_port + " speaks migration stream version " + std::to_string(theirs.version));
  AuthBody auth{};
  auth.hello.version = kVersion;
  fill_random(auth.hello.nonce, sizeof(auth.hello.nonce));
  const std::string my_boot = boot_id();
  std::memcpy(auth.hello.boot_id, my_boot.data(), std::min(my_boot.size(), sizeof(auth.hello.boot_id) - 1));
  const Digest256 mac = mac_of(secret, "source", auth.hello.nonce, theirs.nonce);
  std::memcpy(auth.mac, mac.data(), mac.size());
  POS_RETURN_IF_ERROR(send_frame(fd, Type::kAuth, &auth, sizeof(auth)));
  POS_RETURN_IF_ERROR(recv_frame(fd, &t, &b).with_context("the target at " + host_port));
  if (t == Type::kError) return Status::FailedPrecondition("the target at " + host_port + " refused: " + printable(b, 500));
  const Digest256 want = mac_of(secret, "target", theirs.nonce, auth.hello.nonce);
  if (t != Type::kAuthOk || b.size() != want.size() + kIdBytes ||
      !equal_in_constant_time(want.data(), reinterpret_cast<const uint8_t*>(b.data()), want.size()))
    return Status::FailedPrecondition("the target at " + host_port + " does not hold the migration secret");
  l->id_ = b.substr(want.size());
  for (char c : l->id_)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return Status::Corrupt("the target at " + host_port + " sent a bad migration id");
  theirs.boot_id[sizeof(theirs.boot_id) - 1] = '\0';
  l->same_host_ = !my_boot.empty() && my_boot == theirs.boot_id;
  tv = timeval{600, 0};  // a restore on the target may take minutes
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return l;
}

Status MigrationLink::make_dir(const std::string& as) {
  if (!safe_relative(as)) return Status::InvalidArgument("an unsafe remote name: " + as);
  return send_frame(fd_.get(), Type::kDir, as.data(), as.size());
}

Status MigrationLink::send_part(const std::string& as, int fd, uint64_t offset, uint64_t length) {
  if (!safe_relative(as) || as.size() > 1024) return Status::InvalidArgument("an unsafe remote name: " + as);
  PartOut* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    auto it = parts_.find(as);
    if (it == parts_.end()) {
      UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!own) return Status::Unavailable("cannot keep the descriptor of " + as + ": " + std::strerror(errno));
      it = parts_.emplace(as, PartOut{std::move(own), {}}).first;
    }
    p = &it->second;  // a map's element stays put; only send_dir removes it, with no part in flight
  }
  return send_range(as, *p, offset, length);
}

Status MigrationLink::send_range(const std::string& as, PartOut& p, uint64_t offset, uint64_t length) {
  if (offset > kMaxPartOffset || length > kMaxPartOffset) return Status::InvalidArgument("a part of " + as + " out of bounds");
  // Read, searched for pages of zeros and checksummed outside the lock: callers on several threads
  // prepare their parts side by side while one of them sends (one thread that read, then sent,
  // moved ~1.5 GB/s).
  std::unique_ptr<char[]> buf;
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    if (!part_bufs_.empty()) {
      buf = std::move(part_bufs_.back());
      part_bufs_.pop_back();
    }
  }
  if (!buf) buf.reset(new char[kChunk]);
  Status st;
  while (st.ok() && length > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(length, kChunk));
    Piece piece;
    piece.buf = std::move(buf);
    st = scan_chunk(p.fd.get(), offset, n, &piece);
    buf = std::move(piece.buf);
    if (!st.ok()) {
      st = st.with_context("reading the part of " + as + " at " + std::to_string(offset));
      break;
    }
    std::lock_guard<std::mutex> lk(part_mu_);
    for (const Piece::Run& r : piece.runs) {
      if (r.zero) continue;  // the peer's file is sized at its end: a gap reads as zeros
      PartHead h{r.crc, static_cast<uint32_t>(as.size()), offset + r.off};
      std::string head(reinterpret_cast<const char*>(&h), sizeof(h));
      head += as;
      st = send_frame(fd_.get(), Type::kPart, head.data(), head.size(), buf.get() + r.off, r.len);
      if (!st.ok()) break;
      bytes_ += r.len;
    }
    if (!st.ok()) break;
    // Merged into the ranges sent, so that finish_part sends only what no part covered.
    uint64_t lo = offset, hi = offset + n;
    auto it = p.sent.upper_bound(lo);
    if (it != p.sent.begin() && std::prev(it)->second >= lo) --it;
    while (it != p.sent.end() && it->first <= hi) {
      lo = std::min(lo, it->first), hi = std::max(hi, it->second);
      it = p.sent.erase(it);
    }
    p.sent.emplace(lo, hi);
    offset += n, length -= n;
  }
  std::lock_guard<std::mutex> lk(part_mu_);
  part_bufs_.push_back(std::move(buf));
  return st;
}

Status MigrationLink::finish_part(const std::string& as, PartOut& p) {
  struct stat st {};
  if (::fstat(p.fd.get(), &st) != 0) return Status::Unavailable("cannot read " + as + ": " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // What the file system says is data, less what the parts carried (posd's writer reports every
  // range it wrote, but a report that did not fit its socket was dropped).
  std::vector<std::pair<uint64_t, uint64_t>> left;
  for (uint64_t at = 0; at < size;) {
    off_t data = ::lseek(p.fd.get(), static_cast<off_t>(at), SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // a hole to the end
    if (data < 0) data = static_cast<off_t>(at);
    const off_t hole = ::lseek(p.fd.get(), data, SEEK_HOLE);
    const uint64_t end = hole < 0 ? size : std::min<uint64_t>(static_cast<uint64_t>(hole), size);
    uint64_t from = static_cast<uint64_t>(data);
    for (auto it = p.sent.upper_bound(from); from < end;) {
      if (it != p.sent.begin() && std::prev(it)->second > from) {
        from = std::prev(it)->second;  // inside a range sent: skip to its end
        continue;
      }
      const uint64_t to = it == p.sent.end() ? end : std::min(end, it->first);
      if (to > from) left.emplace_back(from, to - from);
      from = to;
      if (it != p.sent.end()) ++it;
    }
    at = std::max(end, at + 1);
  }
  for (const auto& [off, n] : left) POS_RETURN_IF_ERROR(send_range(as, p, off, n));
  std::string body(reinterpret_cast<const char*>(&size), 8);
  body += as;
  return send_frame(fd_.get(), Type::kPartEnd, body.data(), body.size());
}

Status MigrationLink::send_dir(const std::string& local_dir, const std::string& as, const std::vector<std::string>& skip_in) {
  const int fd = fd_.get();
  if (!safe_relative(as)) return Status::InvalidArgument("an unsafe remote name: " + as);
  POS_RETURN_IF_ERROR(send_frame(fd, Type::kDir, as.data(), as.size()));
  // Files of this directory sent in parts: completed now, and not sent again.
  std::vector<std::string> skip = skip_in;
  for (auto it = parts_.begin(); it != parts_.end();) {
    const std::string& name = it->first;
    if (name.size() <= as.size() + 1 || name.compare(0, as.size() + 1, as + "/") != 0) {
      ++it;
      continue;
    }
    POS_RETURN_IF_ERROR(finish_part(name, it->second));
    skip.push_back(name.substr(as.size() + 1));
    it = parts_.erase(it);
  }
  // The reader (a thread of its own) walks the directory and reads ahead; this thread sends.
  DirFeed feed([&](const DirFeed::Emit& emit, const std::function<std::unique_ptr<char[]>()>& take) -> Status {
    return read_dir_for_stream(local_dir, as, skip, emit, take);
  });
  const auto send_piece = [&](const Piece& p) -> Status {
    if (p.type != Type::kData) return send_frame(fd, p.type, p.body.data(), p.body.size());
    for (const Piece::Run& r : p.runs) {
      if (r.zero) {
        const uint64_t len = r.len;
        POS_RETURN_IF_ERROR(send_frame(fd, Type::kHole, &len, 8));
      } else {
        POS_RETURN_IF_ERROR(send_frame(fd, Type::kData, &r.crc, 4, p.buf.get() + r.off, r.len));
        bytes_ += r.len;
      }
    }
    return Status::Ok();
  };
  if (!feed.start()) return feed.run_inline([&](Piece&& p) { return send_piece(p); });
  Piece p;
  while (feed.next(&p)) {
    Status sent = send_piece(p);
    feed.recycle(std::move(p.buf));
    if (!sent.ok()) {
      feed.cancel();
      return sent;
    }
  }
  return feed.result();
}

Status MigrationLink::check(const std::string& needs) {
  POS_RETURN_IF_ERROR(send_frame(fd_.get(), Type::kCheck, needs.data(), needs.size()));
  auto r = expect_result(fd_.get());
  return r.ok() ? Status::Ok() : r.status();
}

Status MigrationLink::sync() {
  POS_RETURN_IF_ERROR(send_frame(fd_.get(), Type::kSync, nullptr, 0));
  auto r = expect_result(fd_.get());
  return r.ok() ? Status::Ok() : r.status();
}

Status MigrationLink::prepare(const std::string& as, bool lazy) {
  if (!safe_relative(as)) return Status::InvalidArgument("an unsafe remote name: " + as);
  std::string b(1, lazy ? 1 : 0);
  b += as;
  return send_frame(fd_.get(), Type::kPrepare, b.data(), b.size());
}

Status MigrationLink::stage(const std::string& staged, const std::string& as, bool lazy) {
  if (!safe_relative(staged) || !safe_relative(as)) return Status::InvalidArgument("an unsafe remote name: " + staged + ", " + as);
  std::string b(1, lazy ? 1 : 0);
  b += staged;
  b += '\0';
  b += as;
  return send_frame(fd_.get(), Type::kStage, b.data(), b.size());
}

Status MigrationLink::await_stage(uint32_t seconds) {
  POS_RETURN_IF_ERROR(send_frame(fd_.get(), Type::kStageWait, &seconds, sizeof(seconds)));
  auto r = expect_result(fd_.get());
  return r.ok() ? Status::Ok() : r.status();
}

StatusOr<std::string> MigrationLink::restore(const std::string& as, bool lazy, const std::function<void()>& sent) {
  std::string b(1, lazy ? 1 : 0);
  b += as;
  POS_RETURN_IF_ERROR(send_frame(fd_.get(), Type::kRestore, b.data(), b.size()));
  if (sent) sent();
  return expect_result(fd_.get());
}

Status MigrationLink::send_commit() { return send_frame(fd_.get(), Type::kCommit, nullptr, 0); }

Status MigrationLink::await_commit() {
  auto r = expect_result(fd_.get());
  return r.ok() ? Status::Ok() : r.status();
}

void MigrationLink::close() { fd_.reset(); }

StatusOr<std::string> MigrationLink::outcome(const std::string& host_port, const std::string& secret,
                                             const std::string& id, double seconds) {
  if (id.size() != kIdBytes) return Status::InvalidArgument("a bad migration id");
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  Status last = Status::Unavailable("not asked");
  for (;;) {
    auto l = connect(host_port, secret);
    if (l.ok()) {
      Status s = send_frame((*l)->fd_.get(), Type::kOutcome, id.data(), id.size());
      if (s.ok()) {
        auto r = expect_result((*l)->fd_.get());
        if (r.ok() && (*r == "committed" || *r == "ended" || *r == "unknown")) return *r;
        last = r.ok() ? Status::Corrupt("the target answered " + printable(*r, 80)) : r.status();
      } else {
        last = s;
      }
    } else {
      last = l.status();
    }
    if (std::chrono::steady_clock::now() >= until) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace pos
