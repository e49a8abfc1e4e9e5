// usage_region.cc — the shared usage region (usage_region.h): a file of fixed layout mapped by
// every job of a user; a robust mutex for joins, reaping and turn hand-offs, relaxed atomics for a
// slot's values and for the fast path of the GPU-time scheduler.
#include "remoting/common/usage_region.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

#include "remoting/common/process_info.h"

namespace pos {

namespace {

// One process's slot: 64 bytes. pid 0: free. Only its owner writes its values (relaxed atomics:
// readers want a recent figure, not a consistent snapshot); joins and frees go under the mutex, and
// so do the scheduler's writes of another slot's fields (waiting, vtime, gpu_ns at a hand-off).
struct Slot {
  std::atomic<uint32_t> pid;
  std::atomic<int32_t> device;
  std::atomic<uint64_t> start_time;
  std::atomic<uint64_t> memory_limit;
  std::atomic<uint64_t> memory_used;
  std::atomic<uint16_t> share;     // per mille of its GPU's time (0: none)
  std::atomic<uint16_t> busy;      // calls in flight that keep its GPU busy (a launch, a wait on its work)
  std::atomic<uint32_t> waiting;   // 1: wants its GPU's turn
  std::atomic<uint64_t> active_ns; // when it last launched or ended such a call (steady_now_ns)
  std::atomic<uint64_t> gpu_ns;    // turn time held while contended
  std::atomic<uint64_t> vtime;     // turn time held / its share: the least goes next
};
static_assert(sizeof(Slot) == 64);
static_assert(std::atomic<uint16_t>::is_always_lock_free);

// One GPU's turn: 64 bytes. holder and draining are slot + 1 (0: none).
struct Turn {
  std::atomic<uint32_t> holder;
  std::atomic<uint32_t> draining;
  std::atomic<uint64_t> start_ns, end_ns;
  std::atomic<uint64_t> vclock;  // the vtime of the last job given the turn: where a newcomer starts
  std::atomic<uint32_t> ring_next;
  uint32_t pad0;
  uint64_t reserved[3];
};
static_assert(sizeof(Turn) == 64);

// One ended turn, for the recent shares: whose, how long, when it ended.
struct TurnRecord {
  std::atomic<uint32_t> pid;
  std::atomic<uint32_t> held_us;
  std::atomic<uint64_t> end_ns;
};
static_assert(sizeof(TurnRecord) == 16);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the region's atomics must be lock-free to be shared between processes");

// The header: 128 bytes, the mutex at 64. `ready` is set last by the creator.
struct Header {
  uint64_t magic;
  uint32_t version, slots, slot_size, header_size;
  std::atomic<uint32_t> ready;
  uint32_t pad0;
  uint64_t pad1[4];
  pthread_mutex_t mutex;
};
static_assert(sizeof(pthread_mutex_t) <= 64);
constexpr size_t kHeaderSize = 128;
constexpr size_t kTurnsAt = kHeaderSize + UsageRegion::kSlots * sizeof(Slot);
constexpr size_t kRingsAt = kTurnsAt + UsageRegion::kDevices * sizeof(Turn);
constexpr size_t kFileSize = kRingsAt + UsageRegion::kDevices * UsageRegion::kTurnRing * sizeof(TurnRecord);
static_assert(kFileSize == 25728, "docs/limits.md gives the layout");
constexpr uint64_t kRecentNs = 3'000'000'000ull;  // turns that count for ps's recent share
constexpr uint64_t kOverrunNs = 1'000'000'000ull;  // a holder this far past its turn's end loses it, busy or not

bool alive(uint32_t pid, uint64_t start) {
  return process_running(pid) && (start == 0 || process_start_time(pid) == start);
}

}  // namespace

struct UsageRegion::Mapped {
  void* base = nullptr;
  Header* h() const { return static_cast<Header*>(base); }
  Slot* slot(int i) const { return reinterpret_cast<Slot*>(static_cast<char*>(base) + kHeaderSize) + i; }
  Turn* turn(int d) const { return reinterpret_cast<Turn*>(static_cast<char*>(base) + kTurnsAt) + d; }
  TurnRecord* ring(int d) const {
    return reinterpret_cast<TurnRecord*>(static_cast<char*>(base) + kRingsAt) + size_t(d) * UsageRegion::kTurnRing;
  }
};

std::string usage_region_path(const std::string& jobs_dir) { return jobs_dir + "/usage"; }

namespace {
std::string octal(unsigned mode) {
  char b[8];
  std::snprintf(b, sizeof(b), "%04o", mode);
  return b;
}
}  // namespace

uint64_t steady_now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

namespace {
bool in_group(gid_t g) {
  if (g == ::getegid()) return true;
  gid_t groups[256];
  const int n = ::getgroups(256, groups);
  for (int i = 0; i < n; ++i)
    if (groups[i] == g) return true;
  return false;
}
}  // namespace

UsageRegionChoice choose_usage_region(const std::string& jobs_dir, const std::string& kept) {
  if (kept.empty()) return {usage_region_path(jobs_dir), UsageRegion::Access::kOwn};
  return {kept, UsageRegion::Access::kKept};
}

std::string kept_usage_region() {
  const char* p = std::getenv("POS_USAGE_REGION");
  return p != nullptr && p[0] == '/' ? p : "";
}

Status UsageRegion::keep(const std::string& path, long gid) {
  auto r = open(path, Access::kOwn);  // made when missing; refused when not posd's user's
  if (!r.ok()) return r.status();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::Unavailable("cannot open the usage region " + path + ": " + std::strerror(errno));
  Status st;
  if (gid >= 0 && ::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0)
    st = Status::Unavailable("cannot give the usage region " + path + " to group " + std::to_string(gid) + ": " +
                             std::strerror(errno));
  else if (::fchmod(fd, gid >= 0 ? 0660 : 0600) != 0)
    st = Status::Unavailable("cannot set the mode of the usage region " + path + ": " + std::strerror(errno));
  ::close(fd);
  return st;
}

StatusOr<std::unique_ptr<UsageRegion>> UsageRegion::open(const std::string& path, Access access) {
  const std::string where = "the usage region " + path;
  bool created = access == Access::kOwn;
  int fd = access == Access::kOwn ? ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600) : -1;
  if (access == Access::kKept || (fd < 0 && errno == EEXIST)) {
    created = false;
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0 && access == Access::kKept && errno == EACCES)
    return Status::FailedPrecondition("cannot open " + where + ": " + std::strerror(errno) +
                                    " (posd shares it with posd.group: this user is not in it)");
  if (fd < 0) return Status::Unavailable("cannot open " + where + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (created && ::ftruncate(fd, static_cast<off_t>(kFileSize)) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(path.c_str());
    return Status::Unavailable("cannot size " + where + ": " + why);
  }
  // Another process may have created it a moment ago and not sized it yet: give it a little while.
  struct stat st {};
  for (int i = 0; i < 100; ++i) {
    if (::fstat(fd, &st) != 0) return Status::Unavailable("cannot stat " + where + ": " + std::strerror(errno));
    if (static_cast<size_t>(st.st_size) == kFileSize || created) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!S_ISREG(st.st_mode)) return Status::FailedPrecondition(where + " is no regular file");
  if (access == Access::kKept && st.st_uid != ::geteuid()) {
    // Another user's (posd's): shared with a group of this process's, and with nobody else.
    if ((st.st_mode & 0007) != 0)
      return Status::FailedPrecondition(where + " is open to every user (mode " + octal(st.st_mode & 0777) +
                                        "): not used (posd keeps it 0660, shared with posd.group)");
    if ((st.st_mode & 0060) != 0060 || !in_group(st.st_gid))
      return Status::FailedPrecondition(where + " belongs to uid " + std::to_string(st.st_uid) + " and is not shared "
                                        "with a group of this user's (its group " + std::to_string(st.st_gid) +
                                        ", mode " + octal(st.st_mode & 0777) + "): not used");
  } else if (st.st_uid != ::geteuid()) {
    return Status::FailedPrecondition(where + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (" +
                                      std::to_string(::geteuid()) + "): not used");
  }
  if (static_cast<size_t>(st.st_size) != kFileSize)
    return Status::Corrupt(where + " has " + std::to_string(st.st_size) + " bytes, not " + std::to_string(kFileSize) +
                           " (another version, or damaged): not used");
  void* base = ::mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return Status::Unavailable("cannot map " + where + ": " + std::strerror(errno));
  auto* m = new Mapped{base};
  std::unique_ptr<UsageRegion> r(new UsageRegion(path, m));
  Header* h = m->h();
  if (created) {
    h->magic = kMagic, h->version = kVersion, h->slots = kSlots;
    h->slot_size = sizeof(Slot), h->header_size = kHeaderSize;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);  // a holder killed mid-join does not block the rest
    const int rc = pthread_mutex_init(&h->mutex, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
      ::unlink(path.c_str());
      return Status::Unavailable("cannot make the mutex of " + where + ": " + std::strerror(rc));
    }
    h->ready.store(1, std::memory_order_release);
    return r;
  }
  // Its maker may still be writing the header (zeros until then): wait a little, but not for a file
  // that already says it is something else.
  for (int i = 0; i < 200 && h->ready.load(std::memory_order_acquire) != 1; ++i) {
    if ((h->magic != 0 && h->magic != kMagic) || (h->magic == kMagic && h->version != 0 && h->version != kVersion)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (h->magic != kMagic)
    return Status::Corrupt(where + " is not a POS usage region (its first bytes are not \"POSUSAGE\"): not used");
  if (h->version != kVersion || h->slots != kSlots || h->slot_size != sizeof(Slot) || h->header_size != kHeaderSize)
    return Status::Corrupt(where + " is of version " + std::to_string(h->version) + " with " + std::to_string(h->slots) +
                           " slots of " + std::to_string(h->slot_size) + " bytes, not version " +
                           std::to_string(kVersion) + " with " + std::to_string(kSlots) + " of " +
                           std::to_string(sizeof(Slot)) + ": not used");
  if (h->ready.load(std::memory_order_acquire) != 1)
    return Status::Corrupt(where + " was never finished by the process that made it: not used (remove it)");
  return r;
}

UsageRegion::~UsageRegion() {
  ::munmap(m_->base, kFileSize);
  delete m_;
}

bool UsageRegion::lock() {
  const int rc = pthread_mutex_lock(&m_->h()->mutex);
  if (rc == EOWNERDEAD) {  // its holder died mid-join: the slots are checked by reaping anyway
    pthread_mutex_consistent(&m_->h()->mutex);
    return true;
  }
  return rc == 0;
}

void UsageRegion::unlock() { pthread_mutex_unlock(&m_->h()->mutex); }

size_t UsageRegion::reap_locked() {
  size_t n = 0;
  for (int i = 0; i < static_cast<int>(kSlots); ++i) {
    Slot* s = m_->slot(i);
    const uint32_t pid = s->pid.load(std::memory_order_relaxed);
    if (pid == 0 || alive(pid, s->start_time.load(std::memory_order_relaxed))) continue;
    s->pid.store(0, std::memory_order_relaxed);
    s->waiting.store(0, std::memory_order_relaxed);
    for (uint32_t d = 0; d < kDevices; ++d) {  // a turn it held is free: the next waiting job takes it
      Turn* t = m_->turn(int(d));
      if (t->holder.load(std::memory_order_relaxed) == uint32_t(i) + 1) {
        t->holder.store(0, std::memory_order_relaxed);
        t->draining.store(0, std::memory_order_relaxed);
      }
    }
    ++n;
  }
  return n;
}

size_t UsageRegion::reap() {
  if (!lock()) return 0;
  const size_t n = reap_locked();
  unlock();
  return n;
}

StatusOr<int> UsageRegion::join(const Entry& e) {
  if (e.pid == 0) return Status::InvalidArgument("a usage entry needs its process's pid");
  if (!lock()) return Status::Unavailable("the mutex of the usage region " + path_ + " cannot be taken");
  reap_locked();
  int got = -1;
  for (int i = 0; i < static_cast<int>(kSlots) && got < 0; ++i) {
    Slot* s = m_->slot(i);
    if (s->pid.load(std::memory_order_relaxed) != 0) continue;
    s->device.store(e.device, std::memory_order_relaxed);
    s->start_time.store(e.start_time, std::memory_order_relaxed);
    s->memory_limit.store(e.memory_limit, std::memory_order_relaxed);
    s->memory_used.store(e.memory_used, std::memory_order_relaxed);
    s->share.store(0, std::memory_order_relaxed);
    s->busy.store(0, std::memory_order_relaxed);
    s->waiting.store(0, std::memory_order_relaxed);
    s->active_ns.store(0, std::memory_order_relaxed);
    s->gpu_ns.store(0, std::memory_order_relaxed);
    s->vtime.store(0, std::memory_order_relaxed);
    s->pid.store(e.pid, std::memory_order_release);
    got = i;
  }
  unlock();
  if (got < 0)
    return Status::Busy("the usage region " + path_ + " has no free slot (" + std::to_string(kSlots) +
                                     " live processes hold one)");
  return got;
}

bool UsageRegion::holds(int slot, uint32_t pid, uint64_t start_time) const {
  if (slot < 0 || slot >= static_cast<int>(kSlots)) return false;
  const Slot* s = m_->slot(slot);
  return s->pid.load(std::memory_order_acquire) == pid && s->start_time.load(std::memory_order_relaxed) == start_time;
}

void UsageRegion::set_used(int slot, uint64_t bytes) {
  if (slot >= 0 && slot < static_cast<int>(kSlots)) m_->slot(slot)->memory_used.store(bytes, std::memory_order_relaxed);
}
void UsageRegion::set_limit(int slot, uint64_t bytes) {
  if (slot >= 0 && slot < static_cast<int>(kSlots)) m_->slot(slot)->memory_limit.store(bytes, std::memory_order_relaxed);
}
void UsageRegion::set_device(int slot, int32_t device) {
  if (slot >= 0 && slot < static_cast<int>(kSlots)) m_->slot(slot)->device.store(device, std::memory_order_relaxed);
}

void UsageRegion::leave(int slot) {
  if (slot < 0 || slot >= static_cast<int>(kSlots) || !lock()) return;
  const uint64_t now = steady_now_ns();
  for (uint32_t d = 0; d < kDevices; ++d) {
    Turn* t = m_->turn(int(d));
    if (t->holder.load(std::memory_order_relaxed) != uint32_t(slot) + 1) continue;
    account_locked(slot, int(d), now);
    t->holder.store(0, std::memory_order_relaxed);
    t->draining.store(0, std::memory_order_relaxed);
    m_->slot(slot)->waiting.store(0, std::memory_order_relaxed);
    hand_off_locked(int(d), now, Timing());
  }
  m_->slot(slot)->waiting.store(0, std::memory_order_relaxed);
  m_->slot(slot)->pid.store(0, std::memory_order_relaxed);
  unlock();
}

std::vector<UsageRegion::Entry> UsageRegion::list() {
  reap();
  std::vector<Entry> out;
  for (int i = 0; i < static_cast<int>(kSlots); ++i) {
    const Slot* s = m_->slot(i);
    Entry e;
    e.pid = s->pid.load(std::memory_order_acquire);
    if (e.pid == 0) continue;
    e.device = s->device.load(std::memory_order_relaxed);
    e.start_time = s->start_time.load(std::memory_order_relaxed);
    e.memory_limit = s->memory_limit.load(std::memory_order_relaxed);
    e.memory_used = s->memory_used.load(std::memory_order_relaxed);
    e.share = s->share.load(std::memory_order_relaxed);
    e.gpu_ns = s->gpu_ns.load(std::memory_order_relaxed);
    out.push_back(e);
  }
  // Recent shares: each job's part of its GPU's turns that ended in the last few seconds.
  const uint64_t now = steady_now_ns();
  for (Entry& e : out) {
    if (e.device < 0 || e.device >= int32_t(kDevices)) continue;
    uint64_t all = 0, mine = 0;
    const TurnRecord* ring = m_->ring(e.device);
    for (uint32_t i = 0; i < kTurnRing; ++i) {
      const uint64_t end = ring[i].end_ns.load(std::memory_order_relaxed);
      if (end == 0 || end > now || now - end > kRecentNs) continue;
      const uint64_t us = ring[i].held_us.load(std::memory_order_relaxed);
      all += us;
      if (ring[i].pid.load(std::memory_order_relaxed) == e.pid) mine += us;
    }
    if (all > 0) e.recent_share = int32_t(mine * 1000 / all);
  }
  return out;
}

// ---- GPU-time shares -------------------------------------------------------------------------

Status UsageRegion::set_share(int slot, uint32_t per_mille) {
  if (slot < 0 || slot >= static_cast<int>(kSlots)) return Status::InvalidArgument("no usage slot");
  if (per_mille > kMaxShare)
    return Status::InvalidArgument("a GPU-time share of " + std::to_string(per_mille / 10) + "." +
                                   std::to_string(per_mille % 10) + "% is more than the whole GPU");
  if (!lock()) return Status::Unavailable("the mutex of the usage region " + path_ + " cannot be taken");
  reap_locked();
  Slot* me = m_->slot(slot);
  const int32_t d = me->device.load(std::memory_order_relaxed);
  uint32_t others = 0;
  std::string pids;
  for (int i = 0; i < static_cast<int>(kSlots); ++i) {
    const Slot* s = m_->slot(i);
    if (i == slot || s->pid.load(std::memory_order_relaxed) == 0 || s->device.load(std::memory_order_relaxed) != d)
      continue;
    const uint32_t sh = s->share.load(std::memory_order_relaxed);
    if (sh == 0) continue;
    others += sh;
    pids += (pids.empty() ? "" : ", ") + std::to_string(s->pid.load(std::memory_order_relaxed)) + " (" +
            std::to_string(sh / 10) + "%)";
  }
  if (per_mille != 0 && others + per_mille > kMaxShare) {
    unlock();
    return Status::FailedPrecondition("GPU " + std::to_string(d) + "'s time is already shared out: " + pids +
                                      "; a share of " + std::to_string(per_mille / 10) + "% would make " +
                                      std::to_string((others + per_mille) / 10) + "%");
  }
  me->share.store(uint16_t(per_mille), std::memory_order_relaxed);
  unlock();
  return Status::Ok();
}

bool UsageRegion::contended(int device) const {
  if (device < 0 || device >= int(kDevices)) return false;
  int jobs = 0;
  bool shares = false;
  for (uint32_t i = 0; i < kSlots; ++i) {
    const Slot* s = m_->slot(int(i));
    if (s->pid.load(std::memory_order_relaxed) == 0 || s->device.load(std::memory_order_relaxed) != device) continue;
    ++jobs;
    shares |= s->share.load(std::memory_order_relaxed) != 0;
  }
  return jobs >= 2 && shares;
}

int UsageRegion::holder(int device) const {
  if (device < 0 || device >= int(kDevices)) return -1;
  return int(m_->turn(device)->holder.load(std::memory_order_acquire)) - 1;
}

// A job's share as the scheduler counts it: its own, or (none set) an equal part of what the jobs
// with shares leave, at least 5 %.
uint32_t UsageRegion::effective_share_locked(int slot, int device) const {
  const uint32_t own = m_->slot(slot)->share.load(std::memory_order_relaxed);
  if (own != 0) return own;
  uint32_t set = 0, unset = 0;
  for (uint32_t i = 0; i < kSlots; ++i) {
    const Slot* s = m_->slot(int(i));
    if (s->pid.load(std::memory_order_relaxed) == 0 || s->device.load(std::memory_order_relaxed) != device) continue;
    const uint32_t sh = s->share.load(std::memory_order_relaxed);
    sh != 0 ? set += sh : ++unset;
  }
  const uint32_t left = set < kMaxShare ? kMaxShare - set : 0;
  return std::max<uint32_t>(50, left / std::max<uint32_t>(1, unset));
}

uint64_t UsageRegion::turn_locked(int slot, int device, const Timing& t) const {
  return std::max(t.min_turn_ns, t.period_ns * effective_share_locked(slot, device) / kMaxShare);
}

// The turn `slot` held on `device` until `until`: its time, its virtual time, the ring.
void UsageRegion::account_locked(int slot, int device, uint64_t until) {
  Turn* t = m_->turn(device);
  Slot* s = m_->slot(slot);
  const uint64_t start = t->start_ns.load(std::memory_order_relaxed);
  if (until <= start) return;
  const uint64_t held = until - start;
  s->gpu_ns.fetch_add(held, std::memory_order_relaxed);
  s->vtime.fetch_add(held * kMaxShare / effective_share_locked(slot, device), std::memory_order_relaxed);
  const uint32_t at = t->ring_next.fetch_add(1, std::memory_order_relaxed) % kTurnRing;
  TurnRecord& r = m_->ring(device)[at];
  r.pid.store(s->pid.load(std::memory_order_relaxed), std::memory_order_relaxed);
  r.held_us.store(uint32_t(std::min<uint64_t>(held / 1000, UINT32_MAX)), std::memory_order_relaxed);
  r.end_ns.store(until, std::memory_order_relaxed);
  t->start_ns.store(until, std::memory_order_relaxed);
}

// The turn of `device` to the waiting live job with the least virtual time (the holder among them
// when it asks to go on); nobody's when none waits.
void UsageRegion::hand_off_locked(int device, uint64_t now, const Timing& tm) {
  Turn* t = m_->turn(device);
  const uint32_t before = t->holder.load(std::memory_order_relaxed);
  int pick = -1;
  uint64_t best = UINT64_MAX;
  for (uint32_t i = 0; i < kSlots; ++i) {
    const Slot* s = m_->slot(int(i));
    if (s->pid.load(std::memory_order_relaxed) == 0 || s->device.load(std::memory_order_relaxed) != device ||
        s->waiting.load(std::memory_order_relaxed) == 0)
      continue;
    const uint64_t v = s->vtime.load(std::memory_order_relaxed);
    // On a tie the job that did not just hold the turn goes first.
    if (v < best || (v == best && before == uint32_t(pick) + 1)) best = v, pick = int(i);
  }
  t->draining.store(0, std::memory_order_relaxed);
  t->start_ns.store(now, std::memory_order_relaxed);
  if (pick < 0) {
    t->holder.store(0, std::memory_order_release);
    return;
  }
  m_->slot(pick)->waiting.store(0, std::memory_order_relaxed);
  t->vclock.store(best, std::memory_order_relaxed);
  t->end_ns.store(now + turn_locked(pick, device, tm), std::memory_order_relaxed);
  t->holder.store(uint32_t(pick) + 1, std::memory_order_release);
}

UsageRegion::Pass UsageRegion::pass(int slot, int device, uint64_t now, const Timing& tm) {
  if (slot < 0 || slot >= int(kSlots) || device < 0 || device >= int(kDevices)) return Pass::kGo;
  Slot* me = m_->slot(slot);
  Turn* t = m_->turn(device);
  const uint32_t h = t->holder.load(std::memory_order_acquire);
  if (h == uint32_t(slot) + 1) {
    me->active_ns.store(now, std::memory_order_relaxed);
    if (now < t->end_ns.load(std::memory_order_relaxed)) return Pass::kGo;
    for (uint32_t i = 0; i < kSlots; ++i) {  // over: only a job that waits takes it
      const Slot* s = m_->slot(int(i));
      if (int(i) != slot && s->waiting.load(std::memory_order_relaxed) != 0 && s->pid.load(std::memory_order_relaxed) != 0 &&
          s->device.load(std::memory_order_relaxed) == device)
        return Pass::kYield;
    }
    // Nobody waits: the turn goes on (work-conserving), counted from here for the ring.
    if (!lock()) return Pass::kGo;
    if (t->holder.load(std::memory_order_relaxed) == uint32_t(slot) + 1) {
      account_locked(slot, device, now);
      t->end_ns.store(now + turn_locked(slot, device, tm), std::memory_order_relaxed);
      t->vclock.store(me->vtime.load(std::memory_order_relaxed), std::memory_order_relaxed);  // a newcomer starts here
    }
    unlock();
    return Pass::kGo;
  }
  if (me->waiting.load(std::memory_order_relaxed) == 0) {  // starts waiting where the others are
    const uint64_t clock = t->vclock.load(std::memory_order_relaxed);
    if (me->vtime.load(std::memory_order_relaxed) < clock) me->vtime.store(clock, std::memory_order_relaxed);
    me->waiting.store(1, std::memory_order_relaxed);
  }
  // Nobody's turn, or the holder is gone, idle, or far past its turn: hand it on now.
  auto free_to_take = [&](uint32_t holder) {
    if (holder == 0) return true;
    const Slot* hs = m_->slot(int(holder) - 1);
    if (hs->pid.load(std::memory_order_relaxed) == 0 || hs->device.load(std::memory_order_relaxed) != device) return true;
    if (now > t->end_ns.load(std::memory_order_relaxed) + kOverrunNs) return true;
    const uint64_t since = std::max(hs->active_ns.load(std::memory_order_relaxed), t->start_ns.load(std::memory_order_relaxed));
    return t->draining.load(std::memory_order_relaxed) == 0 && hs->busy.load(std::memory_order_relaxed) == 0 &&
           now > since + tm.idle_ns;
  };
  if (!free_to_take(h)) return Pass::kWait;
  if (!lock()) return Pass::kWait;
  const uint32_t h2 = t->holder.load(std::memory_order_relaxed);
  if (h2 != 0 && now > t->end_ns.load(std::memory_order_relaxed) + kOverrunNs) reap_locked();  // dead or stopped?
  const uint32_t h3 = t->holder.load(std::memory_order_relaxed);
  if (h3 != uint32_t(slot) + 1 && free_to_take(h3)) {
    if (h3 != 0) {
      const Slot* hs = m_->slot(int(h3) - 1);
      const uint64_t last = std::max(hs->active_ns.load(std::memory_order_relaxed), t->start_ns.load(std::memory_order_relaxed));
      if (hs->pid.load(std::memory_order_relaxed) != 0) account_locked(int(h3) - 1, device, std::min(now, last));
    }
    hand_off_locked(device, now, tm);
  }
  const bool mine = t->holder.load(std::memory_order_relaxed) == uint32_t(slot) + 1;
  unlock();
  if (mine) me->active_ns.store(now, std::memory_order_relaxed);
  return mine ? Pass::kGo : Pass::kWait;
}

void UsageRegion::yield(int slot, int device, uint64_t now, const Timing& tm) {
  if (slot < 0 || slot >= int(kSlots) || device < 0 || device >= int(kDevices) || !lock()) return;
  Turn* t = m_->turn(device);
  if (t->holder.load(std::memory_order_relaxed) == uint32_t(slot) + 1) {
    account_locked(slot, device, now);
    m_->slot(slot)->waiting.store(1, std::memory_order_relaxed);  // it goes on wanting the GPU
    hand_off_locked(device, now, tm);
  }
  unlock();
}

void UsageRegion::begin_drain(int slot, int device) {
  if (device < 0 || device >= int(kDevices)) return;
  Turn* t = m_->turn(device);
  if (t->holder.load(std::memory_order_relaxed) == uint32_t(slot) + 1)
    t->draining.store(uint32_t(slot) + 1, std::memory_order_relaxed);
}

void UsageRegion::busy(int slot, int delta, uint64_t now) {
  if (slot < 0 || slot >= int(kSlots)) return;
  Slot* s = m_->slot(slot);
  if (delta > 0) s->busy.fetch_add(1, std::memory_order_relaxed);
  else if (s->busy.load(std::memory_order_relaxed) > 0) s->busy.fetch_sub(1, std::memory_order_relaxed);
  s->active_ns.store(now, std::memory_order_relaxed);
}

void UsageRegion::stop_waiting(int slot) {
  if (slot >= 0 && slot < int(kSlots)) m_->slot(slot)->waiting.store(0, std::memory_order_relaxed);
}

}  // namespace pos
