// ckpt_bench.cc — checkpoint and restore throughput of one client's device memory through the
// engine: to host memory (cold and warm), to files, restores, and a stepping job's slowdown
// while an async checkpoint runs. Prints a table for docs/BENCHMARKS.md (backend: POS_BACKEND).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "pos/checkpoint/checkpoint.h"
#include "pos/workspace.h"
#include "remoting/common/api_client.h"
#include "pos/runtime.h"
#include "remoting/inproc/inproc_transport.h"

namespace {

using namespace pos;
namespace fs = std::filesystem;
constexpr uint64_t kGiB = 1ull << 30;

struct Options {
  std::vector<int> gib = {1, 8};
  int file_max_gib = 8;
  std::string dir = "/tmp/pos-ckpt-bench";
  int steps = 20;
  unsigned copy_threads = 8;  // the checkpoint copier's lanes (config checkpoint.copy_threads): the ceiling row's threads
};

bool check(const Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "ckpt_bench: %s: %s\n", what, s.to_string().c_str());
  return s.ok();
}

double gbps(uint64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0; }

struct Job {
  POSWorkspace* ws;
  uint64_t uuid;
  std::unique_ptr<InProcessTransport> t;
  std::unique_ptr<ApiClient> api;
  std::vector<uint64_t> bufs;
  void attach(uint64_t u) {
    uuid = u;
    api.reset();
    t = std::make_unique<InProcessTransport>(ws, u);
    api = std::make_unique<ApiClient>(t.get());
  }
  // One "training step": every buffer is written (as an optimizer updates every parameter).
  double step() {
    const double t0 = seconds_now();
    for (size_t i = 0; i < bufs.size(); ++i)
      if (!api->memset_async(bufs[i], static_cast<int>(i + 1), 64ull << 20, 0).ok()) return -1;
    if (!api->device_synchronize().ok()) return -1;
    return seconds_now() - t0;
  }
};

StatusOr<uint64_t> restore_timed(POSWorkspace* ws, Job& job, const ckpt::ImageReader& img, double* secs) {
  POS_RETURN_IF_ERROR(ws->remove_client(job.uuid));
  const double t0 = seconds_now();
  auto u = ws->restore(img);
  *secs = seconds_now() - t0;
  if (u.ok()) job.attach(*u);
  return u;
}

bool run_size(POSWorkspace* ws, const Options& o, int gib) {
  const uint64_t total = static_cast<uint64_t>(gib) * kGiB;
  auto u = ws->create_client("ckpt-bench");
  if (!check(u.status(), "create client")) return false;
  Job job{ws, *u, nullptr, nullptr, {}};
  job.attach(*u);
  for (uint64_t left = total; left > 0;) {
    const uint64_t n = std::min<uint64_t>(left, kGiB);
    uint64_t p = 0;
    if (!check(job.api->malloc(&p, n), "cudaMalloc") || !check(job.api->memset(p, static_cast<int>(job.bufs.size() + 7), n), "cudaMemset"))
      return false;
    job.bufs.push_back(p);
    left -= n;
  }
  auto row = [&](const char* what, uint64_t bytes, double s, const char* note = "") {
    std::printf("| %d GiB | %s | %.3f s | %.1f GB/s | %s |\n", gib, what, s, gbps(bytes, s), note);
    std::fflush(stdout);
  };
  // The host's own ceiling for what a staged dump into pageable memory does on the CPU side: the
  // same bytes memcpy'd by as many threads as the copier has lanes, in 2 MiB pieces from a 64 MiB source (a stand-in for the
  // slots) into fresh memory (every huge page faulted and zeroed on first write) and again into the
  // same memory. No device involved: a staged dump cannot beat these.
  {
    const uint64_t bytes = static_cast<uint64_t>(gib) * kGiB, piece = 2ull << 20, src_bytes = 64ull << 20;
    const unsigned threads = o.copy_threads;
    std::vector<std::byte> src(src_bytes, std::byte{0x5a});
    ckpt::HostAllocator alloc = ckpt::HostAllocator::pageable();
    std::byte* dst = static_cast<std::byte*>(alloc.alloc(bytes));
    if (dst == nullptr) return check(Status::Unavailable("no host memory for the ceiling row"), "host ceiling");
    const std::string fresh = "host memcpy ceiling, " + std::to_string(threads) + " threads, into fresh pageable memory";
    const std::string again = "host memcpy ceiling, " + std::to_string(threads) + " threads, into the same memory again";
    for (const std::string& pass : {fresh, again}) {
      std::atomic<uint64_t> next{0};
      const double t0 = seconds_now();
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&] {
          for (uint64_t i; (i = next.fetch_add(1)) * piece < bytes;)
            std::memcpy(dst + i * piece, src.data() + (i * piece) % src_bytes, std::min(piece, bytes - i * piece));
        });
      for (auto& t : ts) t.join();
      row(pass.c_str(), bytes, seconds_now() - t0, "no device: the CPU side alone");
    }
    alloc.free(dst);
  }
  // Into memory that is not page-locked: the engine stages through its copier's lanes (8 threads,
  // each with a stream and two 2 MiB page-locked slots), so a first dump pins nothing of its image.
  {
    ckpt::MemoryImage pageable(ckpt::HostAllocator::pageable());
    for (const char* pass : {"to host memory, pageable (first: bounded staging)", "to host memory, pageable (again)"}) {
      CheckpointRequest r;
      r.memory = &pageable;
      auto res = ws->checkpoint(job.uuid, r);
      if (!check(res.status(), "checkpoint to pageable memory")) return false;
      row(pass, res->bytes_stored, res->total_s);
    }
    auto img = ckpt::ImageReader::open_memory(&pageable);
    if (!check(img.status(), "open pageable memory image")) return false;
    double s = 0;
    auto r = restore_timed(ws, job, **img, &s);
    if (!check(r.status(), "restore from pageable memory")) return false;
    row("restore from pageable host memory", total, s);
  }
  ckpt::MemoryImage mem(pinned_allocator(&ws->backend()));
  for (const char* pass : {"to host memory (first: pins memory)", "to host memory (again: pinned reused)"}) {
    CheckpointRequest r;
    r.memory = &mem;
    auto res = ws->checkpoint(job.uuid, r);
    if (!check(res.status(), "checkpoint to memory")) return false;
    row(pass, res->bytes_stored, res->total_s);
  }
  {
    auto img = ckpt::ImageReader::open_memory(&mem);
    if (!check(img.status(), "open memory image")) return false;
    double s = 0;
    auto r = restore_timed(ws, job, **img, &s);
    if (!check(r.status(), "restore from memory")) return false;
    row("restore from host memory", total, s);
  }
  if (gib <= o.file_max_gib) {
    const std::string d = o.dir + "/img-" + std::to_string(gib);
    fs::remove_all(d);
    CheckpointRequest r;
    r.dir = d;
    auto res = ws->checkpoint(job.uuid, r);
    if (!check(res.status(), "checkpoint to files")) return false;
    row("to files (O_DIRECT, fsync, rename)", res->bytes_stored, res->total_s);
    auto img = ckpt::ImageReader::open_dir(d);
    if (!check(img.status(), "open image")) return false;
    double s = 0;
    auto rr = restore_timed(ws, job, **img, &s);
    if (!check(rr.status(), "restore from files")) return false;
    row("restore from files (page cache warm)", total, s);
    fs::remove_all(d);
  }
  // A job that writes every buffer each step, with and without an async checkpoint under way.
  std::vector<double> base, during;
  for (int i = 0; i < o.steps; ++i) base.push_back(job.step());
  {
    std::atomic<bool> running{true};
    CheckpointRequest r;
    r.memory = &mem;
    r.mode = CheckpointMode::kAsync;
    r.shadow_pool_bytes = total + kGiB;
    StatusOr<CheckpointResult> res = Status::Internal("not run");
    std::thread t([&] {
      res = ws->checkpoint(job.uuid, r);
      running = false;
    });
    while (running.load() || during.size() < 3) during.push_back(job.step());
    t.join();
    if (!check(res.status(), "async checkpoint")) return false;
    double b = 0, d = 0;
    for (double x : base) b += x;
    for (double x : during) d += x;
    b /= static_cast<double>(base.size());
    d /= static_cast<double>(during.size());
    char note[200];
    std::snprintf(note, sizeof(note), "step %.2f ms alone, %.2f ms during (%.1f %%), stall %.2f ms, shadows %.2f GiB", b * 1e3,
                  d * 1e3, 100 * (d / b - 1), res->stall_s * 1e3, static_cast<double>(res->shadow_bytes) / kGiB);
    row("async to host memory while stepping", res->bytes_stored, res->total_s, note);
  }
  return check(ws->remove_client(job.uuid), "remove client");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--gib" && i + 1 < argc) {
      o.gib.clear();
      for (char* p = argv[++i]; *p;) {
        o.gib.push_back(static_cast<int>(std::strtol(p, &p, 10)));
        if (*p == ',') ++p;
        else if (*p) return std::fprintf(stderr, "ckpt_bench: bad --gib\n"), 2;
      }
    } else if (a == "--dir" && i + 1 < argc) {
      o.dir = argv[++i];
    } else if (a == "--file-max-gib" && i + 1 < argc) {
      o.file_max_gib = std::atoi(argv[++i]);
    } else if (a == "--steps" && i + 1 < argc) {
      o.steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: ckpt_bench [--gib 1,8,32] [--file-max-gib N] [--dir DIR] [--steps N]\n");
      return 2;
    }
  }
  auto cfg = config_from_environment();
  if (!cfg.ok()) return std::fprintf(stderr, "ckpt_bench: %s\n", cfg.status().to_string().c_str()), 1;
  cfg->host_device_memory = 40ull << 30;
  o.copy_threads = cfg->ckpt_copy_threads != 0 ? cfg->ckpt_copy_threads
                                               : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  auto ws = create_workspace(*cfg);
  if (!ws.ok()) return std::fprintf(stderr, "ckpt_bench: %s\n", ws.status().to_string().c_str()), 1;
  fs::create_directories(o.dir);
  std::printf("backend %s, device %s\n", std::string((*ws)->backend().name()).c_str(),
              (*ws)->backend().device_name(0).c_str());
  std::printf("| state | operation | time | throughput | notes |\n|---|---|---|---|---|\n");
  for (int g : o.gib)
    if (!run_size(ws->get(), o, g)) return 1;
  return 0;
}
