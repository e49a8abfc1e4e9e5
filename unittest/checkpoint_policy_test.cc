// checkpoint_policy_test.cc — the continuous-checkpointing loop with a stand-in tick (a manifest
// written as a dump would): complete-or-absent restore points, chains, retention, failures, coalescing.
#include "remoting/server/checkpoint_policy.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "ckpt/criu_delta.h"
#include "ckpt/criu_image.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/job_manifest.h"
#include "unittest/crafted_image.h"

namespace pos {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "policy-" + name + "-" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

// A tick that writes what a dump would: the directory, a part, then the manifest last (prev as a
// sibling). `fail` makes it write the part and fail before the manifest, as a full disk would.
struct FakeTick {
  uint32_t pid = static_cast<uint32_t>(::getpid());
  std::atomic<bool> fail{false};
  int fail_from = 0;                 // if set: calls from this one on fail as `fail` does
  std::atomic<int> not_started{0};  // calls left that answer as a job that has not used the GPU yet
  bool timeout = false;              // answer as a dump whose job did not answer in time
  std::atomic<int> calls{0};
  double sleep_s = 0;
  uint64_t referenced = 500;       // bytes an incremental point leaves to earlier ones (of 1000 + these)
  std::vector<std::string> prevs;  // what each call was given
  uint32_t big_files = 0;          // sparse files of 1 GiB each in every point (slow to free gently)
  CheckpointTick fn() {
    return [this](const std::string& dir, const std::string& prev) -> StatusOr<TickOutcome> {
      ++calls;
      prevs.push_back(prev.empty() ? "" : fs::path(prev).filename().string());
      if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
      if (not_started > 0) {
        --not_started;
        return job_not_started_error("the job has not used the GPU yet");
      }
      if (timeout) return Status(Code::kNotReady, 0, "no answer within 600000 ms");
      fs::create_directories(dir + "/gpu");
      std::ofstream(dir + "/gpu/blob") << "bytes";
      for (uint32_t f = 0; f < big_files; ++f) {
        std::ofstream(dir + "/gpu/memory." + std::to_string(f)) << "x";
        fs::resize_file(dir + "/gpu/memory." + std::to_string(f), 1ull << 30);
      }
      if (fail || (fail_from > 0 && calls >= fail_from)) return Status::Unavailable("cannot write " + dir + "/gpu/blob: No space left on device");
      JobManifest m;
      m.pid = pid, m.uid = static_cast<uint32_t>(::geteuid()), m.arena_bytes = 1 << 20;
      m.permit = "/dev/shm/pos-permit-test", m.socket = "/tmp/posd.sock", m.job = "job";
      m.prev = prev.empty() ? "" : "../" + fs::path(prev).filename().string();
      EXPECT_TRUE(write_small_file(dir + "/manifest", manifest_json(m), 0600).ok());
      TickOutcome t;
      t.bytes = 1000, t.bytes_referenced = prev.empty() ? 0 : referenced, t.pause_s = 0.001;
      return t;
    };
  }
};

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

CheckpointPolicy policy(const std::string& dir, uint32_t keep, uint32_t full_every) {
  CheckpointPolicy p;
  p.pid = static_cast<uint32_t>(::getpid());
  p.dir = dir, p.keep = keep, p.full_every = full_every, p.every_s = 0.05;
  return p;
}

TEST(CheckpointPolicy, EachPointIsWrittenUnderATemporaryNameAndAppearsOnlyComplete) {
  const std::string dir = fresh_dir("complete");
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 3, 10), dir + ".status", t.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE((*r)->tick().ok());
  ASSERT_TRUE((*r)->tick().ok());
  const std::set<std::string> e = entries(dir);
  EXPECT_TRUE(e.count("cp-000001") && e.count("cp-000002")) << e.size();
  for (const std::string& n : e) EXPECT_NE(n.rfind(".tmp-", 0), 0u) << n;
  // The second builds on the first; the first is whole.
  ASSERT_EQ(t.prevs.size(), 2u);
  EXPECT_EQ(t.prevs[0], "");
  EXPECT_EQ(t.prevs[1], "cp-000001");
  const std::vector<RestorePoint> pts = list_restore_points(dir);
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_EQ(pts[1].parent, "cp-000001");
  EXPECT_TRUE(pts[1].restorable);
  auto s = read_policy_status(dir + ".status");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->taken, 2u);
  EXPECT_EQ(s->newest, "cp-000002");
  EXPECT_EQ(s->bytes_total, 2000u);
  EXPECT_EQ(s->last_bytes_referenced, 500u);
  EXPECT_EQ(s->state, "running");
  EXPECT_EQ(s->points, 2u);
}

TEST(CheckpointPolicy, RetentionKeepsTheNewestPointsAndEveryParentTheirChainsNeed) {
  const std::string dir = fresh_dir("retain");
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 2, 3), "", t.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // 1 whole, 2 on 1, 3 on 2, 4 whole, 5 on 4, 6 on 5, 7 whole.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*r)->tick().ok());
  // Kept: 5 and 6, and 4 that 5 builds on; 1-3 retired (nothing kept needs them).
  std::set<std::string> e = entries(dir);
  EXPECT_EQ(e.count("cp-000001") + e.count("cp-000002") + e.count("cp-000003"), 0u);
  EXPECT_EQ(e.count("cp-000004") + e.count("cp-000005") + e.count("cp-000006"), 3u);
  ASSERT_TRUE((*r)->tick().ok());
  // Kept: 6 (with 5 and 4) and 7 (whole).
  e = entries(dir);
  EXPECT_EQ(e.count("cp-000004") + e.count("cp-000005") + e.count("cp-000006") + e.count("cp-000007"), 4u);
  // Their bytes are freed on a thread of retention's own, which outlives the tick.
  (*r)->finish_retention();
  for (const std::string& n : entries(dir)) EXPECT_NE(n.rfind(".del-", 0), 0u) << n;
  EXPECT_EQ((*r)->status().retired, 3u);
  EXPECT_EQ(t.prevs, (std::vector<std::string>{"", "cp-000001", "cp-000002", "", "cp-000004", "cp-000005", ""}));
}

TEST(CheckpointPolicy, AJobThatRewritesNearlyAllItsMemoryBetweenTicksGetsWholePointsNotChains) {
  const std::string dir = fresh_dir("rewrites");
  FakeTick t;
  t.referenced = 50;  // 4.8 % of the point's bytes left to earlier points
  auto r = CheckpointRunner::open(policy(dir, 1, 3), "", t.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::string> log;
  (*r)->set_log([&](const std::string& l) { log.push_back(l); });
  for (int i = 0; i < 9; ++i) ASSERT_TRUE((*r)->tick().ok());
  // An incremental point that saved so little makes the next three whole; then one looks again.
  EXPECT_EQ(t.prevs, (std::vector<std::string>{"", "cp-000001", "", "", "", "cp-000005", "", "", ""}));
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& l) {
                            return l.find("left 4.8 % of its bytes to earlier points: the next 3 points are whole") !=
                                   std::string::npos;
                          }),
            2)
      << log.size();
  // So the directory holds the newest point alone, not the chain --keep 1 --full-every 3 would keep.
  (*r)->finish_retention();
  EXPECT_EQ(entries(dir), (std::set<std::string>{".policy.lock", "cp-000009"}));

  // A point that saves a third goes on building a chain, and so does one with a CPU part (CRIU's
  // incremental dumps save on their own).
  for (bool with_cpu : {false, true}) {
    const std::string d2 = fresh_dir(with_cpu ? "rewrites-cpu" : "saves");
    FakeTick t2;
    t2.referenced = with_cpu ? 50 : 500;
    CheckpointPolicy p = policy(d2, 1, 3);
    p.with_cpu = with_cpu;
    auto r2 = CheckpointRunner::open(p, "", t2.fn());
    ASSERT_TRUE(r2.ok()) << r2.status().to_string();
    for (int i = 0; i < 4; ++i) ASSERT_TRUE((*r2)->tick().ok());
    EXPECT_EQ(t2.prevs, (std::vector<std::string>{"", "cp-000001", "cp-000002", ""})) << with_cpu;
  }
}

TEST(CheckpointPolicy, RetiredPointsAreFreedBySeveralThreadsAtOnceAndAFileAKeptPointLinksKeepsItsBytes) {
  const std::string dir = fresh_dir("free");
  // Two retired points of three files each (200 MiB apiece, sparse: shrunk in 64 MiB pieces like
  // real ones), and a kept point that links one file of the first.
  std::vector<std::string> retired;
  for (int p = 0; p < 2; ++p) {
    const std::string d = dir + "/.del-cp-00000" + std::to_string(p + 1) + "/gpu";
    fs::create_directories(d);
    for (int f = 0; f < 3; ++f) {
      const std::string file = d + "/memory." + std::to_string(f);
      std::ofstream(file) << "head of " << p << "." << f;
      fs::resize_file(file, 200ull << 20);
    }
    retired.push_back(fs::path(d).parent_path().string());
  }
  fs::create_directories(dir + "/cp-000003/gpu");
  fs::create_hard_link(retired[0] + "/gpu/memory.1", dir + "/cp-000003/gpu/memory.1");
  // Four threads take part, as retention's thread and its helpers do; then the trees go.
  std::unique_ptr<FreeList> list = list_files_to_free(retired);
  EXPECT_EQ(list->files.size(), 6u);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { take_part_in_freeing(*list); });
  for (std::thread& th : threads) th.join();
  // Each file of their own is shrunk to its last piece at most; the linked one is not touched.
  EXPECT_LE(fs::file_size(retired[1] + "/gpu/memory.0"), 64ull << 20);
  EXPECT_LE(fs::file_size(retired[0] + "/gpu/memory.2"), 64ull << 20);
  for (const std::string& r : retired) fs::remove_all(r);
  EXPECT_FALSE(fs::exists(retired[0]));
  EXPECT_FALSE(fs::exists(retired[1]));
  // The linked file is whole: its size and its first bytes.
  const std::string kept = dir + "/cp-000003/gpu/memory.1";
  ASSERT_TRUE(fs::exists(kept));
  EXPECT_EQ(fs::file_size(kept), 200ull << 20);
  std::string head;
  std::getline(std::ifstream(kept), head);
  EXPECT_EQ(head.substr(0, 11), "head of 0.1");
  EXPECT_EQ(fs::hard_link_count(kept), 1u);
  // Nothing to free is no work, and paths that are not there are no error.
  EXPECT_TRUE(list_files_to_free({})->files.empty());
  std::unique_ptr<FreeList> none = list_files_to_free({dir + "/.del-cp-000009"});
  EXPECT_TRUE(none->files.empty());
  take_part_in_freeing(*none);
  EXPECT_GE(freeing_threads(), 2u);
  EXPECT_LE(freeing_threads(), 4u);
  fs::remove_all(dir);
}

TEST(CheckpointPolicy, ATickThatFindsTheLastRetentionStillFreeingWaitsForItWithHelpers) {
  const std::string dir = fresh_dir("help");
  FakeTick t;
  t.big_files = 48;  // 48 GiB of sparse files: 768 pieces, each followed by a 1 ms pause
  auto r = CheckpointRunner::open(policy(dir, 1, 1), "", t.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::string> lines;
  (*r)->set_log([&](const std::string& l) { lines.push_back(l); });
  // Each point whole: each tick retires the one before, and the third finds the second's retention
  // still freeing (a thread alone needs over 0.7 s for it).
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*r)->tick().ok());
  (*r)->finish_retention();
  const auto waited = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("waited") != std::string::npos && l.find("more thread(s)") != std::string::npos;
  });
  EXPECT_NE(waited, lines.end());
  for (const std::string& n : entries(dir)) EXPECT_NE(n.rfind(".del-", 0), 0u) << n;
  EXPECT_EQ(entries(dir).count("cp-000003"), 1u);
  EXPECT_EQ((*r)->status().retired, 2u);
  fs::remove_all(dir);
}

TEST(CheckpointPolicy, RetentionAloneNeverRetiresAParentOfAKeptPoint) {
  std::vector<RestorePoint> pts;
  for (uint64_t i = 1; i <= 6; ++i) {
    RestorePoint p;
    p.seq = i, p.name = "cp-" + std::to_string(i);
    if (i != 1 && i != 4) p.parent = "cp-" + std::to_string(i - 1);
    pts.push_back(p);
  }
  EXPECT_EQ(points_to_retire(pts, 1), (std::vector<std::string>{"cp-1", "cp-2", "cp-3"}));
  EXPECT_EQ(points_to_retire(pts, 4), (std::vector<std::string>{}));  // 3 is kept, and 1-2 with it
  pts[5].parent = "";  // 6 whole: 4 and 5 go when only 6 is kept
  EXPECT_EQ(points_to_retire(pts, 1), (std::vector<std::string>{"cp-1", "cp-2", "cp-3", "cp-4", "cp-5"}));
  pts[0].parent = "cp-6";  // a loop (a damaged manifest) ends the walk, nothing more
  EXPECT_EQ(points_to_retire(pts, 1).size(), 5u);
}

// A tick that writes real parts: a POS GPU image and a CRIU page image, each incremental on the
// previous point's where given one, of a job whose state after tick n is known (state_of below).
// Buffer 1 is written once (frozen, striped over two files), 2 at every tick, 3 at ticks 1, 4, 7, ...;
// page 0 changes at every tick, page 1 never, page 2 at even ticks.
struct RealTick {
  uint32_t pid = static_cast<uint32_t>(::getpid());
  int n = 0;
  std::map<std::string, int> tick_of;  // point name -> the tick it holds
  static std::string bytes(char tag, uint64_t len) {
    std::string s(len, tag);
    for (uint64_t i = 0; i < len; i += 61) s[i] = static_cast<char>(tag ^ (i / 4096));
    return s;
  }
  static std::string buffer(int id, int tick) {
    if (id == 1) return bytes('F', 3 * 4096);
    if (id == 2) return bytes(static_cast<char>('a' + tick), 2 * 4096);
    return bytes(static_cast<char>('m' + (tick - 1) / 3 * 3 + 1), 4096);
  }
  static int written_at(int id, int tick) { return id == 1 ? 1 : id == 2 ? tick : (tick - 1) / 3 * 3 + 1; }
  static std::string page(int k, int tick) {
    const uint64_t pg = ckpt::criu_page_size();
    if (k == 0) return std::string(pg, static_cast<char>('p' + tick));
    if (k == 1) return std::string(pg, 'k');
    return std::string(pg, static_cast<char>('q' + tick / 2));
  }
  static int page_written_at(int k, int tick) { return k == 0 ? tick : k == 1 ? 1 : std::max(1, tick / 2 * 2); }
  CheckpointTick fn() {
    return [this](const std::string& dir, const std::string& prev) -> StatusOr<TickOutcome> {
      ++n;
      const std::string name = fs::path(dir).filename().string().substr(5);  // .tmp-cp-N
      const std::string prev_name = prev.empty() ? "" : fs::path(prev).filename().string();
      const int prev_tick = prev.empty() ? 0 : tick_of.at(prev_name);
      tick_of[name] = n;
      fs::create_directories(dir);
      ckpt::testing::CraftedImage g{2, 4096, static_cast<uint64_t>(10 * n), "t" + std::to_string(n), "", "", 0,
                                    ckpt::kFormatVersion, {}};
      if (prev_tick > 0) {
        g.parent_path = "../../" + prev_name + "/gpu";
        g.parent_id = "t" + std::to_string(prev_tick);
        g.parent_cut = static_cast<uint64_t>(10 * prev_tick);
      }
      for (int id = 1; id <= 3; ++id) {
        const std::string b = buffer(id, n);
        if (prev_tick > 0 && written_at(id, n) <= prev_tick) g.buffers.push_back({static_cast<uint64_t>(id), "", true, b.size()});
        else g.buffers.push_back({static_cast<uint64_t>(id), b, false, 0, id == 1, 0});
      }
      ckpt::testing::write_crafted_image(dir + "/gpu", g);
      fs::create_directories(dir + "/criu");
      ckpt::CriuPagemap pm;
      pm.pages_id = 1;
      std::string pages;
      const uint64_t pg = ckpt::criu_page_size();
      for (int k = 0; k < 3; ++k) {
        const bool parent = prev_tick > 0 && page_written_at(k, n) <= prev_tick;
        pm.runs.push_back({0x10000 + k * pg, 1, parent ? ckpt::kCriuPageParent : ckpt::kCriuPagePresent});
        if (!parent) pages += page(k, n);
      }
      EXPECT_TRUE(ckpt::write_criu_pagemap(dir + "/criu/pagemap-" + std::to_string(pid) + ".img", pm).ok());
      std::ofstream(dir + "/criu/pages-1.img", std::ios::binary) << pages;
      std::ofstream(dir + "/criu/core-" + std::to_string(pid) + ".img", std::ios::binary) << "core";
      if (prev_tick > 0) fs::create_directory_symlink("../../" + prev_name + "/criu", dir + "/criu/parent");
      JobManifest m;
      m.pid = pid, m.uid = static_cast<uint32_t>(::geteuid()), m.arena_bytes = 1 << 20;
      m.permit = "/dev/shm/pos-permit-test", m.socket = "/tmp/posd.sock", m.job = "job";
      m.prev = prev.empty() ? "" : "../" + prev_name;
      m.criu_parent = !prev.empty();
      m.gpu_image_id = g.image_id;
      EXPECT_TRUE(write_small_file(dir + "/manifest", manifest_json(m), 0600).ok());
      return TickOutcome{};
    };
  }
  // That point DIR/name holds tick `tick`'s state, read the way a restore reads it (through its chains).
  static void expect_state(const std::string& dir, const std::string& name, int tick) {
    const std::string why = name + " (tick " + std::to_string(tick) + ")";
    auto r = ckpt::ImageReader::open_dir(dir + "/" + name + "/gpu");
    ASSERT_TRUE(r.ok()) << why << ": " << r.status().to_string();
    EXPECT_EQ((*r)->inventory().image_id(), "t" + std::to_string(tick)) << why;
    for (int id = 1; id <= 3; ++id) EXPECT_EQ(ckpt::testing::crafted_read(**r, static_cast<uint64_t>(id)), buffer(id, tick)) << why << " buffer " << id;
    const std::string flat = dir + "/.flat-" + name;
    fs::remove_all(flat);
    auto w = ckpt::write_whole_criu_image(dir + "/" + name + "/criu", flat);
    ASSERT_TRUE(w.ok()) << why << ": " << w.status().to_string();
    std::ifstream f(flat + "/pages-1.img", std::ios::binary);
    const std::string got((std::istreambuf_iterator<char>(f)), {});
    EXPECT_EQ(got, page(0, tick) + page(1, tick) + page(2, tick)) << why;
    fs::remove_all(flat);
  }
};

TEST(CheckpointPolicy, RebasingMakesTheOldestKeptPointWholeSoThatOnlyTheKeptPointsStayAndEachRestoresItsState) {
  for (uint32_t keep : {1u, 2u}) {
    const std::string dir = fresh_dir("rebase-" + std::to_string(keep));
    RealTick t;
    auto r = CheckpointRunner::open(policy(dir, keep, 100), dir + ".status", t.fn());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<std::string> log;
    (*r)->set_log([&](const std::string& l) { log.push_back(l); });
    for (int i = 0; i < 8; ++i) ASSERT_TRUE((*r)->tick().ok());
    (*r)->finish_retention();
    // Only the kept points: no chain of earlier ones (full_every 100 never cut one).
    std::set<std::string> want{".policy.lock", "cp-000008"};
    if (keep == 2) want.insert("cp-000007");
    EXPECT_EQ(entries(dir), want) << keep;
    const std::string oldest = keep == 2 ? "cp-000007" : "cp-000008";
    auto m = read_manifest(dir + "/" + oldest);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->prev, "");
    EXPECT_FALSE(m->criu_parent);
    EXPECT_FALSE(fs::exists(fs::symlink_status(dir + "/" + oldest + "/criu/parent")));
    const std::vector<RestorePoint> pts = list_restore_points(dir);
    ASSERT_EQ(pts.size(), keep);
    if (keep == 2) {
      EXPECT_EQ(pts[1].parent, "cp-000007");  // the newest still builds on it
    }
    RealTick::expect_state(dir, "cp-000008", 8);
    if (keep == 2) {
      RealTick::expect_state(dir, "cp-000007", 7);
    }
    // Every tick built on the one before (each made whole in turn): the chain was never cut.
    EXPECT_EQ((*r)->status().rebased, keep == 1 ? 7u : 6u);
    EXPECT_EQ((*r)->status().retired, keep == 1 ? 7u : 6u);
    EXPECT_TRUE((*r)->status().last_error.empty()) << (*r)->status().last_error;
    auto s = read_policy_status(dir + ".status");
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->rebased, (*r)->status().rebased);
    bool said = false;
    for (const std::string& l : log) said |= l.find("made whole") != std::string::npos;
    EXPECT_TRUE(said);
    fs::remove_all(dir);
    fs::remove(dir + ".status");
  }
}

TEST(CheckpointPolicy, ARunnerKilledWhileItMakesAPointWholeLeavesEveryPointCompleteAndTheNextRunnerClearsUp) {
  for (const char* stage : {"rebase-built", "rebase-exchanged"}) {
    const std::string dir = fresh_dir(std::string("rebase-killed-") + stage);
    RealTick t;
    {
      auto r = CheckpointRunner::open(policy(dir, 100, 100), "", t.fn());
      ASSERT_TRUE(r.ok());
      for (int i = 0; i < 3; ++i) ASSERT_TRUE((*r)->tick().ok());
    }
    const pid_t child = ::fork();
    if (child == 0) {
      ::setenv("POS_FAULT_POINT", stage, 1);
      auto r = CheckpointRunner::open(policy(dir, 2, 100), dir + ".status", t.fn());
      if (r.ok()) (void)(*r)->tick();  // cp-4 (a new runner's first: whole), then cp-3 made whole: killed there
      std::_Exit(3);
    }
    int st = 0;
    ASSERT_EQ(::waitpid(child, &st, 0), child);
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << stage << " " << st;
    EXPECT_TRUE(fs::exists(dir + "/.tmp-cp-000003.whole")) << stage;  // the new one, or the old one after the exchange
    EXPECT_EQ(list_restore_points(dir).size(), 4u) << stage;
    for (int i = 1; i <= 4; ++i) RealTick::expect_state(dir, "cp-00000" + std::to_string(i), i);
    // The status named cp-4 as soon as it was complete, before retention (where the runner died):
    // ps and the metrics show the job's real recovery point while an old one is being freed.
    auto s = read_policy_status(dir + ".status");
    ASSERT_TRUE(s.ok()) << stage;
    EXPECT_EQ(s->newest, "cp-000004") << stage;
    EXPECT_EQ(s->taken, 1u) << stage;
    fs::remove(dir + ".status");
    t.tick_of["cp-000004"] = 4;
    auto r = CheckpointRunner::open(policy(dir, 2, 100), "", t.fn());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_FALSE(fs::exists(dir + "/.tmp-cp-000003.whole")) << stage;
    ASSERT_TRUE((*r)->tick().ok());
    (*r)->finish_retention();
    EXPECT_EQ(entries(dir), (std::set<std::string>{".policy.lock", "cp-000004", "cp-000005"})) << stage;
    RealTick::expect_state(dir, "cp-000004", 4);
    RealTick::expect_state(dir, "cp-000005", 4);  // this process's tick counter had not seen the child's
    fs::remove_all(dir);
  }
}

TEST(CheckpointPolicy, AFailedTickKeepsEveryEarlierPointAndTheNextPointIsWhole) {
  const std::string dir = fresh_dir("fail");
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 5, 10), dir + ".status", t.fn());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->tick().ok());
  t.fail = true;
  const Status st = (*r)->tick();
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(entries(dir), (std::set<std::string>{".policy.lock", "cp-000001"}));  // the failed one left nothing
  auto s = read_policy_status(dir + ".status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->failed, 1u);
  EXPECT_EQ(s->taken, 1u);
  EXPECT_NE(s->last_error.find("No space left on device"), std::string::npos) << s->last_error;
  EXPECT_NE(s->last_error_time, 0u);
  EXPECT_EQ(s->newest, "cp-000001");
  t.fail = false;
  ASSERT_TRUE((*r)->tick().ok());
  EXPECT_EQ(t.prevs.back(), "");  // after a failure the chain starts again
}

TEST(CheckpointPolicy, TicksBeforeTheJobUsesTheGpuWaitForItAndCountNoFailure) {
  const std::string dir = fresh_dir("not-started");
  FakeTick t;
  t.not_started = 3;
  auto r = CheckpointRunner::open(policy(dir, 5, 10), dir + ".status", t.fn());
  ASSERT_TRUE(r.ok());
  std::vector<std::string> log;
  (*r)->set_log([&](const std::string& l) { log.push_back(l); });
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(job_not_started((*r)->tick()));
  ASSERT_TRUE((*r)->tick().ok());
  ASSERT_TRUE((*r)->tick().ok());
  // No point skipped in the names, nothing counted failed, and the wait said once.
  EXPECT_EQ(entries(dir), (std::set<std::string>{".policy.lock", "cp-000001", "cp-000002"}));
  auto s = read_policy_status(dir + ".status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->failed, 0u);
  EXPECT_EQ(s->taken, 2u);
  EXPECT_EQ(s->last_error, "");
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& l) { return l.rfind("waiting for the job: ", 0) == 0; }),
            1);
  // Any other not-ready answer (a job that did not answer in time) is a failure, as before.
  t.timeout = true;
  const Status st = (*r)->tick();
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(job_not_started(st));
  s = read_policy_status(dir + ".status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->failed, 1u);
  EXPECT_NE(s->last_error.find("no answer within"), std::string::npos) << s->last_error;
}

TEST(CheckpointPolicy, ARunnerKilledMidwayLeavesNoPointAndTheNextRunnerClearsWhatItLeft) {
  const std::string dir = fresh_dir("killed");
  FakeTick t;
  {
    auto r = CheckpointRunner::open(policy(dir, 5, 10), "", t.fn());
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*r)->tick().ok());
    ASSERT_TRUE((*r)->tick().ok());
  }
  // What a kill -9 mid-tick and mid-retirement leaves.
  fs::create_directories(dir + "/.tmp-cp-000003/gpu");
  fs::create_directories(dir + "/.del-cp-000001/gpu");
  std::ofstream(dir + "/.del-cp-000001/manifest") << "{}";
  EXPECT_EQ(list_restore_points(dir).size(), 2u);  // neither is a restore point
  auto r = CheckpointRunner::open(policy(dir, 5, 10), "", t.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(entries(dir), (std::set<std::string>{".policy.lock", "cp-000001", "cp-000002"}));
  ASSERT_TRUE((*r)->tick().ok());
  EXPECT_TRUE(fs::exists(dir + "/cp-000004"));  // numbers never reused
  EXPECT_EQ(t.prevs.back(), "");                // a new runner starts with a whole point
}

TEST(CheckpointPolicy, OneRunnerPerDirectoryAndOnePolicyPerJob) {
  const std::string dir = fresh_dir("one");
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 3, 10), dir + ".status", t.fn());
  ASSERT_TRUE(r.ok());
  auto second = CheckpointRunner::open(policy(dir, 3, 10), "", t.fn());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kBusy);
  // The same job into another directory, while a live checkpointer (pid 1 stands for it) has it.
  PolicyStatus other;
  other.pid = static_cast<uint32_t>(::getpid()), other.checkpointer = 1, other.state = "running", other.dir = "/elsewhere";
  ASSERT_TRUE(write_small_file(dir + ".status2", policy_status_json(other), 0600).ok());
  auto third = CheckpointRunner::open(policy(dir + "-b", 3, 10), dir + ".status2", t.fn());
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.status().message().find("already checkpointed into /elsewhere"), std::string::npos)
      << third.status().message();
  EXPECT_FALSE(CheckpointRunner::open(policy(dir + "-c", 0, 10), "", t.fn()).ok());  // --keep 0
  EXPECT_FALSE(CheckpointRunner::open(policy(dir + "-c", 3, 0), "", t.fn()).ok());   // --full-every 0
}

TEST(CheckpointPolicy, TicksThatOutlastTheIntervalAreCoalescedNotQueued) {
  const std::string dir = fresh_dir("coalesce");
  FakeTick t;
  t.sleep_s = 0.16;  // three intervals of 50 ms and more
  auto r = CheckpointRunner::open(policy(dir, 2, 10), "", t.fn());
  ASSERT_TRUE(r.ok());
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  (*r)->run(stop, [] { return true; });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stopper.join();
  const PolicyStatus& s = (*r)->status();
  EXPECT_GE(s.taken, 3u);
  EXPECT_LE(s.taken, 7u);  // one at a time, back to back at most
  EXPECT_GE(s.coalesced, 2u * (s.taken - 1));  // each slow tick swallowed the slots it ran over
  EXPECT_LT(took, 1.5);  // the stop is seen once the tick in progress is done
  EXPECT_EQ(s.state, "stopped");
}

TEST(CheckpointPolicy, ThePolicyEndsWhenTheJobIsGone) {
  const std::string dir = fresh_dir("gone");
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 2, 10), dir + ".status", t.fn());
  ASSERT_TRUE(r.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> checks{0};
  (*r)->run(stop, [&] { return ++checks < 20; });
  auto s = read_policy_status(dir + ".status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, "ended");
  EXPECT_GE(s->taken, 1u);
  EXPECT_FALSE(process_running(0));
  EXPECT_TRUE(process_running(static_cast<uint32_t>(::getpid())));
}

// A job at its exit refuses a tick (its driver shut down) a moment before its process is gone:
// that tick is the policy's end, not a failure. A tick that fails while the job lives on is one.
TEST(CheckpointPolicy, ATickRefusedByAJobThatEndsRightAfterIsNoFailure) {
  const std::string dir = fresh_dir("ending");
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 2, 10), dir + ".status", t.fn());
  ASSERT_TRUE(r.ok());
  std::vector<std::string> log;
  (*r)->set_log([&](const std::string& l) { log.push_back(l); });
  std::atomic<bool> stop{false};
  std::atomic<bool> gone{false};
  // Two good ticks, then the job refuses the third and is gone 200 ms later.
  t.fail_from = 3;
  std::thread ender([&] {
    while (t.calls < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gone = true;
  });
  (*r)->run(stop, [&] { return !gone; });
  ender.join();
  auto s = read_policy_status(dir + ".status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state, "ended");
  EXPECT_EQ(s->failed, 0u);
  EXPECT_EQ(s->taken, 2u);
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& l) { return l.find(": the job ended during this checkpoint") != std::string::npos; }),
            1);
  // A job that lives on: the refusal is a failure, said after the second's wait.
  FakeTick t2;
  t2.fail = true;
  const std::string d2 = fresh_dir("ending-not");
  auto r2 = CheckpointRunner::open(policy(d2, 2, 10), d2 + ".status", t2.fn());
  ASSERT_TRUE(r2.ok());
  std::thread stopper([&] {
    while (t2.calls < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop = true;
  });
  stop = false;
  (*r2)->run(stop, [] { return true; });
  stopper.join();
  s = read_policy_status(d2 + ".status");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->failed, 1u);
  EXPECT_EQ(s->state, "stopped");
}

TEST(CheckpointPolicy, TheStatusFileReadsBackAndADamagedOneIsRefused) {
  PolicyStatus s;
  s.pid = 77, s.checkpointer = 78, s.uid = 1000, s.dir = "/data/\"ckpt\"", s.every_us = 10000000, s.keep = 3;
  s.full_every = 10, s.with_cpu = true, s.state = "running", s.taken = 5, s.failed = 1, s.coalesced = 2;
  s.last_pause_us = 180000, s.newest = "cp-000005", s.newest_time = 1790000000, s.last_error = "disk full";
  auto back = parse_policy_status(policy_status_json(s));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(policy_status_json(*back), policy_status_json(s));
  EXPECT_FALSE(parse_policy_status("{\"pid\":77}").ok());
  EXPECT_FALSE(parse_policy_status(policy_status_json(s).substr(0, 40)).ok());
  std::string neg = policy_status_json(s);
  neg.replace(neg.find("\"taken\":5"), 9, "\"taken\":-5");
  EXPECT_EQ(parse_policy_status(neg).status().code(), Code::kCorrupt);
}

TEST(CheckpointPolicy, StatusFilesOfPoliciesThatEndedAWeekAgoAreClearedByTheNextPolicy) {
  const std::string dir = fresh_dir("prune"), statuses = dir + "-status";
  fs::create_directories(statuses);
  PolicyStatus old, recent, running;
  old.pid = 11, old.state = "ended", old.updated = 1000;          // 1970: long gone
  recent.pid = 12, recent.state = "stopped", recent.updated = static_cast<uint64_t>(std::time(nullptr)) - 60;
  running.pid = 13, running.state = "running", running.checkpointer = 1, running.updated = 1000;  // alive (pid 1)
  for (const PolicyStatus* p : {&old, &recent, &running})
    ASSERT_TRUE(write_small_file(statuses + "/" + std::to_string(p->pid) + ".json", policy_status_json(*p), 0600).ok());
  FakeTick t;
  auto r = CheckpointRunner::open(policy(dir, 3, 10), statuses + "/" + std::to_string(::getpid()) + ".json", t.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(fs::exists(statuses + "/11.json"));
  EXPECT_TRUE(fs::exists(statuses + "/12.json"));
  EXPECT_TRUE(fs::exists(statuses + "/13.json"));
  EXPECT_EQ(list_policy_statuses(dir + "-none").size(), 0u);
}

TEST(CheckpointPolicy, IntervalsAreParsedWithTheirUnitsAndBoundsChecked) {
  EXPECT_DOUBLE_EQ(*parse_interval("30s"), 30);
  EXPECT_DOUBLE_EQ(*parse_interval("500ms"), 0.5);
  EXPECT_DOUBLE_EQ(*parse_interval("2m"), 120);
  EXPECT_DOUBLE_EQ(*parse_interval("1h"), 3600);
  EXPECT_DOUBLE_EQ(*parse_interval("0.25"), 0.25);
  for (const char* bad : {"", "s", "10x", "1ms", "-3s", "2d", "nan", "inf", "25h"})
    EXPECT_FALSE(parse_interval(bad).ok()) << bad;
}

}  // namespace
}  // namespace pos
