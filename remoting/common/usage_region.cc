// usage_region.cc — the shared usage region (usage_region.h): a file of fixed layout mapped by
// every job of a user; a robust mutex for joins and reaping, relaxed atomics for a slot's values.
#include "remoting/common/usage_region.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "remoting/common/process_info.h"

namespace pos {

namespace {

// One process's slot: 64 bytes. pid 0: free. Only its owner writes its values (relaxed atomics:
// readers want a recent figure, not a consistent snapshot); joins and frees go under the mutex.
struct Slot {
  std::atomic<uint32_t> pid;
  std::atomic<int32_t> device;
  std::atomic<uint64_t> start_time;
  std::atomic<uint64_t> memory_limit;
  std::atomic<uint64_t> memory_used;
  uint64_t reserved[4];
};
static_assert(sizeof(Slot) == 64);
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
constexpr size_t kFileSize = kHeaderSize + UsageRegion::kSlots * sizeof(Slot);

bool alive(uint32_t pid, uint64_t start) {
  return process_running(pid) && (start == 0 || process_start_time(pid) == start);
}

}  // namespace

struct UsageRegion::Mapped {
  void* base = nullptr;
  Header* h() const { return static_cast<Header*>(base); }
  Slot* slot(int i) const { return reinterpret_cast<Slot*>(static_cast<char*>(base) + kHeaderSize) + i; }
};

std::string usage_region_path(const std::string& jobs_dir) { return jobs_dir + "/usage"; }

StatusOr<std::unique_ptr<UsageRegion>> UsageRegion::open(const std::string& path) {
  const std::string where = "the usage region " + path;
  bool created = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  }
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
  if (st.st_uid != ::geteuid())
    return Status::FailedPrecondition(where + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (" +
                                      std::to_string(::geteuid()) + "): not used");
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
    out.push_back(e);
  }
  return out;
}

}  // namespace pos
