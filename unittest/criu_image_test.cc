// criu_image_test.cc — CRIU's image files as pos-cli inspect reads them: the process tree, names and
// page counts of a well-formed directory; every malformed or inconsistent file refused by name.
#include "ckpt/criu_image.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace pos::ckpt {
namespace {

// Protobuf by hand, as CRIU writes it.
std::string varint(uint64_t v) {
  std::string s;
  do {
    uint8_t c = v & 0x7f;
    v >>= 7;
    if (v) c |= 0x80;
    s += static_cast<char>(c);
  } while (v);
  return s;
}
std::string field(uint32_t n, uint64_t v) { return varint(uint64_t{n} << 3) + varint(v); }
std::string field(uint32_t n, const std::string& bytes) { return varint((uint64_t{n} << 3) | 2) + varint(bytes.size()) + bytes; }
std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string image(uint32_t magic, const std::vector<std::string>& records) {
  std::string s = u32(0x54564319) + u32(magic);
  for (const auto& r : records) s += u32(static_cast<uint32_t>(r.size())) + r;
  return s;
}
void put(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

const uint32_t kPstree = 0x50273030, kCore = 0x55053847, kPagemap = 0x56084025;
const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

class CriuImage : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "criu-image-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    // Root 100 (threads 100, 101, 102 unpacked) and its child 200 (thread 200, packed).
    put(dir_ + "/pstree.img",
        image(kPstree, {field(1, 100) + field(2, 0) + field(3, 100) + field(4, 100) + field(5, 100) + field(5, 101) +
                            field(5, 102),
                        field(1, 200) + field(2, 100) + field(3, 100) + field(4, 100) + field(5, varint(200))}));
    put(dir_ + "/core-100.img", image(kCore, {field(1, 1) + field(3, field(1, 1) + field(6, std::string("trainer")))}));
    // 3 pages here (flags PE_PRESENT), 5 in the parent (PE_PARENT), in pages-7.img.
    put(dir_ + "/pagemap-100.img", image(kPagemap, {field(1, 7), field(1, 0x400000) + field(2, 3) + field(4, 4),
                                                    field(1, 0x500000) + field(2, 5) + field(4, 1)}));
    put(dir_ + "/pages-7.img", std::string(3 * kPage, 'x'));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void expect_corrupt(const std::string& file_named) {
    auto s = read_criu_image(dir_);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kCorrupt) << s.status().to_string();
    EXPECT_NE(s.status().message().find(file_named), std::string::npos) << s.status().message();
  }
  std::string dir_;
};

TEST_F(CriuImage, AWellFormedDumpGivesItsProcessTreeNamesAndPageCounts) {
  auto s = read_criu_image(dir_);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->processes.size(), 2u);
  EXPECT_EQ(s->processes[0].pid, 100u);
  EXPECT_EQ(s->processes[0].threads, 3u);
  EXPECT_EQ(s->processes[0].comm, "trainer");
  EXPECT_EQ(s->processes[1].pid, 200u);
  EXPECT_EQ(s->processes[1].ppid, 100u);
  EXPECT_EQ(s->processes[1].threads, 1u);
  EXPECT_EQ(s->processes[1].comm, "");  // no core file: no name, no error
  EXPECT_EQ(s->pagemaps, 1u);
  EXPECT_EQ(s->pages_stored, 3u);
  EXPECT_EQ(s->pages_in_parent, 5u);
  EXPECT_FALSE(s->has_parent);
  EXPECT_FALSE(s->pre_dump);
}

TEST_F(CriuImage, APagesFileThatDoesNotHoldWhatItsPagemapsNameIsRefused) {
  std::filesystem::resize_file(dir_ + "/pages-7.img", 2 * kPage);
  expect_corrupt("pages-7.img");
  std::filesystem::remove(dir_ + "/pages-7.img");
  expect_corrupt("pages-7.img");
}

TEST_F(CriuImage, AFileWithAnotherMagicOrARecordPastItsEndIsRefusedByName) {
  put(dir_ + "/pstree.img", image(kCore, {field(1, 100)}));
  expect_corrupt("pstree.img");
  put(dir_ + "/pstree.img", image(kPstree, {field(1, 100)}).substr(0, 13));
  expect_corrupt("pstree.img");
  std::string cut = image(kPstree, {field(1, 100)});
  cut[8] = '\x7f';  // the record's length past the end
  put(dir_ + "/pstree.img", cut);
  expect_corrupt("pstree.img");
}

TEST_F(CriuImage, AMalformedRecordIsRefused) {
  put(dir_ + "/pstree.img", image(kPstree, {std::string("\x08\xff\xff", 3)}));  // a varint that never ends
  expect_corrupt("pstree.img");
  put(dir_ + "/pstree.img", image(kPstree, {field(2, 1)}));  // no pid
  expect_corrupt("pstree.img");
  put(dir_ + "/pstree.img", image(kPstree, {field(1, 100)}));
  put(dir_ + "/pagemap-100.img", image(kPagemap, {field(1, 7), field(1, 0x400000)}));  // no page count
  expect_corrupt("pagemap-100.img");
}

TEST_F(CriuImage, APreDumpHasPagesButNoProcessTree) {
  std::filesystem::remove(dir_ + "/pstree.img");
  auto s = read_criu_image(dir_);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->pre_dump);
  EXPECT_TRUE(s->processes.empty());
  EXPECT_EQ(s->pages_stored, 3u);
}

}  // namespace
}  // namespace pos::ckpt
