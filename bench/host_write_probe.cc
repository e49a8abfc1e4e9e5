// host_write_probe.cc — how fast this host takes N GB of new file data into its page cache, by the
// ways a dump could write it: threads pwrite()ing one file, one file each, or copying into a shared
// mapping of the file. What bounds the save of an in-process job's device memory (docs/BENCHMARKS.md).
//
// Usage: host_write_probe DIR [--gib G] [--threads T] [--chunk-mib C]   prints a table
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs body(thread, chunk index) over `chunks` chunks on `threads` threads; seconds taken.
template <typename F>
double parallel(int threads, uint64_t chunks, F body) {
  std::atomic<uint64_t> next{0};
  const double t0 = now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (uint64_t i; (i = next.fetch_add(1)) < chunks;) body(t, i);
    });
  for (auto& t : ts) t.join();
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [--gib G] [--threads T] [--chunk-mib C]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  double gib = 4;
  int threads = 8;
  uint64_t chunk = 16ull << 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--gib") gib = std::atof(argv[i + 1]);
    else if (k == "--threads") threads = std::atoi(argv[i + 1]);
    else if (k == "--chunk-mib") chunk = std::strtoull(argv[i + 1], nullptr, 10) << 20;
  }
  const uint64_t total = static_cast<uint64_t>(gib * (1ull << 30)) / chunk * chunk, chunks = total / chunk;
  // One source buffer per thread, touched: what a staging buffer holds after a device copy.
  std::vector<std::vector<char>> src(threads, std::vector<char>(chunk, 7));
  std::printf("| way (%d threads, %llu MiB chunks, %.1f GiB into %s) | s | GB/s |\n|---|---|---|\n", threads,
              static_cast<unsigned long long>(chunk >> 20), gib, dir.c_str());
  // Each way starts with no dirty pages left by the one before (writeback throttling would bill it).
  const auto row = [&](const char* what, double s) {
    std::printf("| %s | %.3f | %.2f |\n", what, s, total / s / 1e9);
    std::fflush(stdout);
    ::sync();
  };
  ::sync();

  {  // one file, every thread pwrite()s its chunks
    const std::string p = dir + "/probe-one.bin";
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(total)) != 0) return std::perror("one file"), 1;
    row("pwrite, one file sized first (ftruncate)", parallel(threads, chunks, [&](int t, uint64_t i) {
          if (::pwrite(fd, src[t].data(), chunk, static_cast<off_t>(i * chunk)) != static_cast<ssize_t>(chunk)) std::abort();
        }));
    ::close(fd);
    ::unlink(p.c_str());
  }
  {  // one file, not sized first: it grows as the chunks land
    const std::string p = dir + "/probe-grow.bin";
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return std::perror("grow file"), 1;
    row("pwrite, one file, not sized first", parallel(threads, chunks, [&](int t, uint64_t i) {
          if (::pwrite(fd, src[t].data(), chunk, static_cast<off_t>(i * chunk)) != static_cast<ssize_t>(chunk)) std::abort();
        }));
    ::close(fd);
    ::unlink(p.c_str());
  }
  {  // a file per thread (each thread's chunks in its own file)
    std::vector<int> fds(threads);
    std::vector<uint64_t> off(threads, 0);
    for (int t = 0; t < threads; ++t) fds[t] = ::open((dir + "/probe-" + std::to_string(t) + ".bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    row("pwrite, a file per thread", parallel(threads, chunks, [&](int t, uint64_t) {
          if (::pwrite(fds[t], src[t].data(), chunk, static_cast<off_t>(off[t])) != static_cast<ssize_t>(chunk)) std::abort();
          off[t] += chunk;
        }));
    for (int t = 0; t < threads; ++t) ::close(fds[t]), ::unlink((dir + "/probe-" + std::to_string(t) + ".bin").c_str());
  }
  {  // one file, mapped shared; every thread memcpy()s its chunks into the mapping
    const std::string p = dir + "/probe-map.bin";
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(total)) != 0) return std::perror("map file"), 1;
    char* m = static_cast<char*>(::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (m == MAP_FAILED) return std::perror("mmap"), 1;
    row("memcpy into a shared mapping", parallel(threads, chunks, [&](int t, uint64_t i) {
          std::memcpy(m + i * chunk, src[t].data(), chunk);
        }));
    ::munmap(m, total);
    ::close(fd);
    ::unlink(p.c_str());
  }
  {  // the ceiling: fresh anonymous memory
    char* m = static_cast<char*>(::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (m == MAP_FAILED) return std::perror("mmap anon"), 1;
    row("memcpy into fresh anonymous memory", parallel(threads, chunks, [&](int t, uint64_t i) {
          std::memcpy(m + i * chunk, src[t].data(), chunk);
        }));
    ::munmap(m, total);
  }
  return 0;
}
