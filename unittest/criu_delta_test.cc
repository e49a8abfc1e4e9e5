// criu_delta_test.cc — CRIU page images made incremental by comparing contents, and a live
// process's pages written as such a parent (ckpt/criu_delta.h). CRIU's own restore of these images
// is in posd_e2e_test (a pre-dump, then a dump --prev, restored) and the migration tests.
#include "ckpt/criu_delta.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/criu_image.h"

namespace pos::ckpt {
namespace {

namespace fs = std::filesystem;
const uint64_t kPg = criu_page_size();

// One page of bytes named by `tag`.
std::string page_of(char tag) { return std::string(kPg, tag); }

// An image directory with one pagemap (`name`) of runs and the pages of its present runs, in order.
void make_image(const std::string& dir, const std::string& name, uint64_t pages_id, const CriuPagemap& pm,
                const std::string& pages) {
  fs::create_directories(dir);
  CriuPagemap m = pm;
  m.pages_id = pages_id;
  ASSERT_TRUE(write_criu_pagemap(dir + "/" + name, m).ok());
  std::ofstream(dir + "/pages-" + std::to_string(pages_id) + ".img", std::ios::binary) << pages;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class CriuDeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("pos-criu-delta-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string at(const std::string& n) const { return (root_ / n).string(); }
  fs::path root_;
};

TEST_F(CriuDeltaTest, PagesEqualToTheParentsAtTheSameAddressAreLeftToItAndTheOthersStay) {
  // The parent holds pages a b c d at 0x10000 and e f at 0x20000.
  make_image(at("pre"), "pagemap-7.img", 1,
             {0, {{0x10000, 4, kCriuPagePresent}, {0x20000, 2, kCriuPagePresent}}},
             page_of('a') + page_of('b') + page_of('c') + page_of('d') + page_of('e') + page_of('f'));
  // The dump: a b X d at 0x10000 (PE_LAZY too, as CRIU marks anonymous memory), g at 0x30000 (no
  // parent page there), and a shared memory pagemap the parent has no namesake of.
  make_image(at("dump"), "pagemap-7.img", 3,
             {0, {{0x10000, 4, kCriuPagePresent | kCriuPageLazy}, {0x30000, 1, kCriuPagePresent}}},
             page_of('a') + page_of('b') + page_of('X') + page_of('d') + page_of('g'));
  make_image(at("dump"), "pagemap-shmem-9.img", 4, {0, {{0, 1, kCriuPagePresent}}}, page_of('s'));
  std::ofstream(at("dump") + "/fs-7.img") << "untouched";
  auto r = make_criu_image_incremental(at("dump"), at("pre"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->pages, 6u);
  EXPECT_EQ(r->pages_to_parent, 3u);
  EXPECT_EQ(r->files, 1u);
  EXPECT_EQ(fs::read_symlink(at("dump") + "/parent").string(), "../pre");
  auto pm = read_criu_pagemap(at("dump") + "/pagemap-7.img");
  ASSERT_TRUE(pm.ok()) << pm.status().message();
  ASSERT_EQ(pm->runs.size(), 4u);
  const uint32_t lazy = kCriuPagePresent | kCriuPageLazy;
  EXPECT_EQ(pm->runs[0].vaddr, 0x10000u);
  EXPECT_EQ(pm->runs[0].pages, 2u);
  EXPECT_EQ(pm->runs[0].flags, kCriuPageParent);
  EXPECT_EQ(pm->runs[1].vaddr, 0x10000u + 2 * kPg);
  EXPECT_EQ(pm->runs[1].flags, lazy);
  EXPECT_EQ(pm->runs[2].flags, kCriuPageParent);
  EXPECT_EQ(pm->runs[3].vaddr, 0x30000u);
  EXPECT_EQ(pm->runs[3].flags, kCriuPagePresent);
  // The pages file it names holds the two unequal pages only; the old one is gone.
  EXPECT_NE(pm->pages_id, 3u);
  EXPECT_EQ(read_all(at("dump") + "/pages-" + std::to_string(pm->pages_id) + ".img"), page_of('X') + page_of('g'));
  EXPECT_FALSE(fs::exists(at("dump") + "/pages-3.img"));
  // Untouched: the shared memory (nothing to compare with) and every other file.
  EXPECT_EQ(read_all(at("dump") + "/pages-4.img"), page_of('s'));
  EXPECT_EQ(read_all(at("dump") + "/fs-7.img"), "untouched");
  // CRIU's image as inspect reads it: consistent, the pages counted where they are.
  auto s = read_criu_image(at("dump"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->pages_stored, 3u);
  EXPECT_EQ(s->pages_in_parent, 3u);
  EXPECT_TRUE(s->has_parent);
  // Done once: an image with a parent is left as it is.
  auto again = make_criu_image_incremental(at("dump"), at("pre"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pages_to_parent, 0u);
}

TEST_F(CriuDeltaTest, AParentsOwnParentsAreFollowedAndOnlyPresentBytesCount) {
  // Grandparent: p q at 0x40000. Parent: the first left to it, the second rewritten as r.
  make_image(at("g"), "pagemap-5.img", 1, {0, {{0x40000, 2, kCriuPagePresent}}}, page_of('p') + page_of('q'));
  make_image(at("p"), "pagemap-5.img", 1,
             {0, {{0x40000, 1, kCriuPageParent}, {0x40000 + kPg, 1, kCriuPagePresent}, {0x50000, 1, kCriuPageLazy}}},
             page_of('r'));
  fs::create_directory_symlink("../g", at("p") + "/parent");
  // The dump: p (found two levels up), q (no longer anyone's: the parent holds r), z at a lazy-only
  // address (no bytes there).
  make_image(at("d"), "pagemap-5.img", 1, {0, {{0x40000, 2, kCriuPagePresent}, {0x50000, 1, kCriuPagePresent}}},
             page_of('p') + page_of('q') + page_of('z'));
  auto r = make_criu_image_incremental(at("d"), at("p"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->pages_to_parent, 1u);
  auto pm = read_criu_pagemap(at("d") + "/pagemap-5.img");
  ASSERT_TRUE(pm.ok());
  ASSERT_EQ(pm->runs.size(), 3u);  // p left to the parents; q, then z apart from it
  EXPECT_EQ(pm->runs[0].flags, kCriuPageParent);
  EXPECT_EQ(pm->runs[0].pages, 1u);
  EXPECT_EQ(pm->runs[1].flags, kCriuPagePresent);
  EXPECT_EQ(pm->runs[2].vaddr, 0x50000u);
  EXPECT_EQ(read_all(at("d") + "/pages-" + std::to_string(pm->pages_id) + ".img"), page_of('q') + page_of('z'));
}

TEST_F(CriuDeltaTest, ADamagedOrMissingParentIsRefusedAndTheDumpStaysWholeAndUnchanged) {
  make_image(at("dump"), "pagemap-7.img", 1, {0, {{0x10000, 2, kCriuPagePresent}}}, page_of('a') + page_of('b'));
  // The parent's pages file is shorter than its pagemap says.
  make_image(at("bad"), "pagemap-7.img", 1, {0, {{0x10000, 2, kCriuPagePresent}}}, page_of('a'));
  auto r = make_criu_image_incremental(at("dump"), at("bad"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pages-1.img"), std::string::npos) << r.status().message();
  // A pagemap that is not one.
  fs::create_directories(at("junk"));
  std::ofstream(at("junk") + "/pagemap-7.img") << "not a pagemap";
  EXPECT_FALSE(make_criu_image_incremental(at("dump"), at("junk")).ok());
  EXPECT_FALSE(make_criu_image_incremental(at("dump"), at("absent")).ok());
  EXPECT_FALSE(make_criu_image_incremental(at("dump"), at("dump")).ok());  // its own parent
  // After each: the dump as it was.
  EXPECT_FALSE(fs::exists(at("dump") + "/parent"));
  EXPECT_EQ(read_all(at("dump") + "/pages-1.img"), page_of('a') + page_of('b'));
  auto pm = read_criu_pagemap(at("dump") + "/pagemap-7.img");
  ASSERT_TRUE(pm.ok());
  EXPECT_EQ(pm->runs.size(), 1u);
  EXPECT_EQ(pm->pages_id, 1u);
  // No page equal: nothing changes, no link.
  make_image(at("other"), "pagemap-7.img", 1, {0, {{0x10000, 2, kCriuPagePresent}}}, page_of('x') + page_of('y'));
  auto none = make_criu_image_incremental(at("dump"), at("other"));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->pages_to_parent, 0u);
  EXPECT_FALSE(fs::exists(at("dump") + "/parent"));
  // Pagemaps out of address order are refused as input.
  make_image(at("unordered"), "pagemap-7.img", 1, {0, {{0x20000, 1, kCriuPagePresent}, {0x10000, 1, kCriuPagePresent}}},
             page_of('a') + page_of('b'));
  EXPECT_FALSE(read_criu_pagemap(at("unordered") + "/pagemap-7.img").ok());
}

TEST_F(CriuDeltaTest, AProcesssPagesReadWhileItRunsAreItsAnonymousMemoryAndNotItsCode) {
  // The child fills 64 pages with a pattern, says where, and waits.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const uint64_t n = 64;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* p = static_cast<unsigned char*>(::mmap(nullptr, n * kPg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (uint64_t i = 0; i < n * kPg; ++i) p[i] = static_cast<unsigned char>(i * 7 + i / kPg);
    const uint64_t addr = reinterpret_cast<uint64_t>(p);
    (void)!::write(fds[1], &addr, sizeof(addr));
    for (;;) ::pause();
  }
  ::close(fds[1]);
  uint64_t addr = 0;
  ASSERT_EQ(::read(fds[0], &addr, sizeof(addr)), static_cast<ssize_t>(sizeof(addr)));
  ::close(fds[0]);
  auto r = write_process_pages(child, at("cpu"));
  auto pm = read_criu_pagemap(at("cpu") + "/pagemap-" + std::to_string(child) + ".img");
  const std::string pages = read_all(at("cpu") + "/pages-1.img");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(pm.ok()) << pm.status().message();
  EXPECT_EQ(pm->present_pages(), r->pages);
  EXPECT_EQ(pages.size(), r->pages * kPg);
  // Every page of the buffer, byte for byte, where the pagemap puts it.
  uint64_t found = 0, off = 0;
  bool code = false;
  const uint64_t text = reinterpret_cast<uint64_t>(&write_process_pages);
  for (const auto& run : pm->runs) {
    for (uint64_t k = 0; k < run.pages; ++k) {
      const uint64_t v = run.vaddr + k * kPg;
      if (v >= addr && v < addr + n * kPg) {
        bool same = true;
        for (uint64_t b = 0; b < kPg; ++b) {
          const uint64_t i = v - addr + b;
          same = same && static_cast<unsigned char>(pages[off + k * kPg + b]) == static_cast<unsigned char>(i * 7 + i / kPg);
        }
        EXPECT_TRUE(same) << "page at " << std::hex << v;
        ++found;
      }
      code = code || (text >= v && text < v + kPg);
    }
    off += run.pages * kPg;
  }
  EXPECT_EQ(found, n);
  EXPECT_FALSE(code) << "the program's code is not anonymous memory";
  // A process that does not exist: refused, nothing made.
  EXPECT_FALSE(write_process_pages(child, at("gone")).ok());
  EXPECT_FALSE(fs::exists(at("gone")));
  // An existing directory is not written into.
  EXPECT_FALSE(write_process_pages(::getpid(), at("cpu")).ok());
}

TEST_F(CriuDeltaTest, AWholeImageHoldsEveryPageItsChainHeldAndNeedsNoParent) {
  // gp: a b c d at 0x10000. p: the first two left to gp, C D2 its own. k: A2 its own, the next three
  // left to p (b through p to gp), z at 0x20000 its own, with a file that is not a pagemap.
  make_image(at("gp"), "pagemap-7.img", 1, {0, {{0x10000, 4, kCriuPagePresent}}},
             page_of('a') + page_of('b') + page_of('c') + page_of('d'));
  make_image(at("p"), "pagemap-7.img", 1,
             {0, {{0x10000, 2, kCriuPageParent}, {0x12000, 2, kCriuPagePresent | kCriuPageLazy}}}, page_of('C') + page_of('D'));
  fs::create_symlink("../gp", at("p/parent"));
  make_image(at("k"), "pagemap-7.img", 1,
             {0, {{0x10000, 1, kCriuPagePresent}, {0x11000, 3, kCriuPageParent}, {0x20000, 1, kCriuPagePresent}}},
             page_of('A') + page_of('z'));
  fs::create_symlink("../p", at("k/parent"));
  std::ofstream(at("k/core-7.img"), std::ios::binary) << "core";
  auto rep = write_whole_criu_image(at("k"), at("w"));
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->pages, 5u);
  EXPECT_EQ(rep->pages_from_parents, 3u);
  EXPECT_EQ(rep->files, 1u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(at("w/parent"))));
  struct stat st {};
  ASSERT_EQ(::stat(at("w/core-7.img").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);  // linked, not copied
  auto pm = read_criu_pagemap(at("w/pagemap-7.img"));
  ASSERT_TRUE(pm.ok()) << pm.status().to_string();
  for (const CriuPagemap::Run& r : pm->runs) EXPECT_EQ(r.flags & kCriuPageParent, 0u) << std::hex << r.vaddr;
  ASSERT_EQ(pm->runs.size(), 3u);  // A b (present), C D (present, lazy as p had them), z
  EXPECT_EQ(pm->runs[0].vaddr, 0x10000u);
  EXPECT_EQ(pm->runs[0].pages, 2u);
  EXPECT_EQ(pm->runs[1].flags, kCriuPagePresent | kCriuPageLazy);
  EXPECT_EQ(read_all(at("w/pages-1.img")), page_of('A') + page_of('b') + page_of('C') + page_of('D') + page_of('z'));
  // A page left to a parent that no image of the chain holds: refused, nothing left.
  fs::remove_all(at("gp"));
  auto bad = write_whole_criu_image(at("k"), at("w2"));
  ASSERT_FALSE(bad.ok());
  EXPECT_FALSE(fs::exists(at("w2")));
}

}  // namespace
}  // namespace pos::ckpt
