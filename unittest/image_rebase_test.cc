// image_rebase_test.cc — incremental images made whole by linking their parents' memory files
// (ckpt/image_rebase.h), the format version 4 stripe that needs, and the copy when files run out.
#include "ckpt/image_rebase.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "unittest/crafted_image.h"

namespace pos::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::CraftedBuffer;
using testing::CraftedImage;
using testing::crafted_read;
using testing::write_crafted_image;

// n bytes that differ from chunk to chunk and from tag to tag.
std::string bytes_of(char tag, uint64_t n) {
  std::string s(n, tag);
  for (uint64_t i = 0; i < n; i += 97) s[i] = static_cast<char>(tag + i / 4096);
  return s;
}

class ImageRebaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("pos-rebase-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string at(const std::string& n) const { return (root_ / n).string(); }
  fs::path root_;
};

bool can_punch_holes(const std::string& dir) {
  const std::string p = dir + "/punch-probe";
  const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return false;
  const std::string b(16384, 'x');
  const bool ok = ::write(fd, b.data(), b.size()) == static_cast<ssize_t>(b.size()) &&
                  ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096) == 0;
  ::close(fd);
  ::unlink(p.c_str());
  return ok;
}

TEST_F(ImageRebaseTest, AnIncrementalImageMadeWholeReadsTheSameBytesAloneAndLinksItsParentsFilesInsteadOfCopying) {
  const std::string a = bytes_of('a', 5 * 4096), b = bytes_of('b', 2 * 4096), c = bytes_of('c', 4096);
  const std::string b2 = bytes_of('B', 2 * 4096), d = bytes_of('d', 3 * 4096), c3 = bytes_of('C', 4096), e = bytes_of('e', 4096);
  // g: whole, a striped over its three files; p on g: b rewritten, d new (striped); k on p: c rewritten, e new.
  CraftedImage g{3, 4096, 10, "g", "", "", 0, kFormatVersion,
                 {{1, a, false, 0, true, 0}, {2, b}, {3, c}}};
  CraftedImage p{2, 4096, 20, "p", "../g", "g", 10, kFormatVersion,
                 {{1, "", true, a.size()}, {2, b2}, {3, "", true, c.size()}, {4, d, false, 0, true, 0}}};
  CraftedImage k{2, 4096, 30, "k", "../p", "p", 20, kFormatVersion,
                 {{1, "", true, a.size()}, {2, "", true, b2.size()}, {3, c3}, {4, "", true, d.size()}, {5, e}}};
  write_crafted_image(at("g"), g);
  write_crafted_image(at("p"), p);
  write_crafted_image(at("k"), k);
  auto rep = write_whole_image(at("k"), at("w"));
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->files_linked, 5u);  // g's three (a's stripes) and p's two (b2, and d's stripes)
  EXPECT_EQ(rep->bytes_copied, 0u);
  EXPECT_EQ(rep->blobs_from_ancestors, 3u);
  EXPECT_EQ(rep->bytes_from_ancestors, a.size() + b2.size() + d.size());
  EXPECT_EQ(rep->blob_bytes, a.size() + b2.size() + c3.size() + d.size() + e.size());
  // Every memory file of the whole image is a link to one already written: nothing was copied.
  uint32_t files = 0;
  for (const auto& f : fs::directory_iterator(at("w"))) {
    const std::string n = f.path().filename().string();
    if (n.rfind("memory", 0) != 0) continue;
    ++files;
    struct stat st {};
    ASSERT_EQ(::stat(f.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_nlink, 2u) << n;
  }
  EXPECT_EQ(files, 7u);
  auto check = [&](const std::string& why) {
    auto w = ImageReader::open_dir(at("w"));
    ASSERT_TRUE(w.ok()) << why << ": " << w.status().to_string();
    EXPECT_EQ((*w)->parent(), nullptr) << why;
    EXPECT_FALSE((*w)->inventory().has_parent()) << why;
    EXPECT_EQ((*w)->inventory().image_id(), "k") << why;  // the same image: children of k still name it
    EXPECT_EQ((*w)->inventory().cut_pc(), 30u) << why;
    EXPECT_EQ((*w)->inventory().format_version(), 4u) << why;  // a's stripes start past memory.bin
    for (const std::string& f : (*w)->inventory().features()) EXPECT_NE(f, "incremental") << why;
    EXPECT_EQ(crafted_read(**w, 1), a) << why;
    EXPECT_EQ(crafted_read(**w, 2), b2) << why;
    EXPECT_EQ(crafted_read(**w, 3), c3) << why;
    EXPECT_EQ(crafted_read(**w, 4), d) << why;
    EXPECT_EQ(crafted_read(**w, 5), e) << why;
  };
  check("beside its chain");
  // Its chain gone, it is still whole, and the bytes no record uses (g's b and c) can be freed.
  for (const char* n : {"g", "p", "k"}) fs::remove_all(at(n));
  check("alone");
  auto punched = punch_unreferenced(at("w"));
  ASSERT_TRUE(punched.ok()) << punched.status().to_string();
  // g's b and c, and the 8 KiB before d's stripe in p's second file (d starts where p's first ends).
  EXPECT_EQ(*punched, can_punch_holes(root_.string()) ? b.size() + c.size() + 8192 : 0u);
  check("with its unused bytes freed");
  auto again = punch_unreferenced(at("w"));  // the holes are there already: nothing more to free
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, 0u);
}

TEST_F(ImageRebaseTest, UnusedBytesAreFreedOnlyInFilesNoOtherImageLinks) {
  CraftedImage g{1, 4096, 10, "g", "", "", 0, kFormatVersion, {{1, bytes_of('a', 8192)}, {2, bytes_of('b', 4096)}}};
  CraftedImage k{1, 4096, 20, "k", "../g", "g", 10, kFormatVersion, {{1, "", true, 8192}, {2, bytes_of('B', 4096)}}};
  write_crafted_image(at("g"), g);
  write_crafted_image(at("k"), k);
  ASSERT_TRUE(write_whole_image(at("k"), at("w")).ok());
  // g still exists and links memory.bin: its b must stay readable.
  auto punched = punch_unreferenced(at("w"));
  ASSERT_TRUE(punched.ok()) << punched.status().to_string();
  EXPECT_EQ(*punched, 0u);
  auto gr = ImageReader::open_dir(at("g"));
  ASSERT_TRUE(gr.ok());
  EXPECT_EQ(crafted_read(**gr, 2), bytes_of('b', 4096));
}

TEST_F(ImageRebaseTest, AStripeStartingPastMemoryBinIsRefusedInAVersion3ImageAndReadInVersion4) {
  const std::string s = bytes_of('s', 4 * 4096);
  CraftedImage img{3, 4096, 10, "x", "", "", 0, 3, {{1, bytes_of('z', 4096)}, {2, s, false, 0, true, 1}}};
  write_crafted_image(at("v3"), img);
  auto v3 = ImageReader::open_dir(at("v3"));
  ASSERT_FALSE(v3.ok());
  EXPECT_NE(v3.status().message().find("stripes blobs from memory.bin only"), std::string::npos) << v3.status().message();
  img.version = 4;
  write_crafted_image(at("v4"), img);
  auto v4 = ImageReader::open_dir(at("v4"));
  ASSERT_TRUE(v4.ok()) << v4.status().to_string();
  EXPECT_EQ(crafted_read(**v4, 2), s);
  EXPECT_EQ(blob_chunk_at((*v4)->client().handles(1).memory(), 3).file, 2u);  // chunks 0 2 in file 1, 1 3 in file 2
  // A stripe that runs past the image's files is refused whatever the version.
  pb::ClientImage c = (*v4)->client();
  c.mutable_handles(1)->mutable_memory()->set_stripes(3);
  EXPECT_FALSE(validate_client(c, std::vector<uint64_t>{8192, 8192, 8192}, false).ok());
}

TEST_F(ImageRebaseTest, TooManyFilesToLinkCopiesTheParentsBytesVerifyingEachChunkAndDamageLeavesNothing) {
  CraftedImage g{40, 4096, 10, "g", "", "", 0, kFormatVersion, {}};
  CraftedImage k{30, 4096, 20, "k", "../g", "g", 10, kFormatVersion, {}};
  for (uint64_t i = 1; i <= 40; ++i) {
    g.buffers.push_back({i, bytes_of(static_cast<char>('A' + i), 4096)});
    k.buffers.push_back({i, "", true, 4096});
  }
  for (uint64_t i = 41; i <= 70; ++i) k.buffers.push_back({i, bytes_of(static_cast<char>('A' + i), 4096)});
  write_crafted_image(at("g"), g);
  write_crafted_image(at("k"), k);
  auto rep = write_whole_image(at("k"), at("w"));  // 30 + 40 files would exceed 64
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->files_linked, 0u);
  EXPECT_EQ(rep->bytes_copied, 40u * 4096);
  fs::remove_all(at("g"));
  auto w = ImageReader::open_dir(at("w"));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ((*w)->inventory().memory_file_sizes_size(), 30);  // its own 30 and one more
  for (uint64_t i = 1; i <= 70; ++i) EXPECT_EQ(crafted_read(**w, i), bytes_of(static_cast<char>('A' + i), 4096)) << i;
  // A damaged chunk in the parent: the copy stops at its checksum and leaves no image.
  write_crafted_image(at("g"), g);
  {
    std::fstream f(at("g") + "/memory.5.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('!');
  }
  auto bad = write_whole_image(at("k"), at("w2"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(fs::exists(at("w2")));
}

TEST_F(ImageRebaseTest, AChainThatDoesNotOpenOrAnExistingTargetIsRefusedAndNothingIsLeft) {
  CraftedImage k{1, 4096, 20, "k", "../gone", "g", 10, kFormatVersion, {{1, "", true, 4096}}};
  write_crafted_image(at("k"), k);
  auto r = write_whole_image(at("k"), at("w"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("parent image"), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(at("w")));
  CraftedImage g{1, 4096, 10, "g", "", "", 0, kFormatVersion, {{1, bytes_of('a', 4096)}}};
  write_crafted_image(at("g"), g);
  fs::create_directories(at("taken"));
  EXPECT_FALSE(write_whole_image(at("g"), at("taken")).ok());
  EXPECT_TRUE(fs::is_empty(at("taken")));
}

}  // namespace
}  // namespace pos::ckpt
