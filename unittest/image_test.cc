// image_test.cc — the image format on its own: checksums, inventory framing, writer/reader round
// trips through a directory and host memory, and the reader's refusal of damaged records.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <fstream>
#include <set>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <algorithm>
#include <tuple>
#include <mutex>

#include "ckpt/crc32c.h"
#include "ckpt/image.h"
#include "pos/base/api_id.h"
#include "unittest/run_program.h"

namespace pos::ckpt {
namespace {

namespace fs = std::filesystem;

uint32_t crc_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32cTest, MatchesTheStandardCheckValueAndABitwiseReferenceAtEveryLengthAndAlignment) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C check value
  std::mt19937 g(7);
  std::vector<uint8_t> buf(3 * 8192 * 2 + 100);
  for (auto& b : buf) b = static_cast<uint8_t>(g());
  for (size_t len : {0ul, 1ul, 7ul, 8ul, 9ul, 4095ul, 24576ul, 24577ul, 49251ul}) {
    for (size_t align = 0; align < 3; ++align) {
      if (align + len > buf.size()) continue;
      EXPECT_EQ(crc32c(buf.data() + align, len), crc_bitwise(buf.data() + align, len)) << len << "+" << align;
    }
  }
  // Continuation equals one pass.
  EXPECT_EQ(crc32c(buf.data() + 5000, 30000, crc32c(buf.data(), 5000)), crc32c(buf.data(), 35000));
}

TEST(InventoryTest, EncodesAndDecodesAndRefusesDamage) {
  pb::Inventory inv;
  inv.set_format_version(kFormatVersion);
  inv.set_backend("host");
  inv.set_cut_pc(42);
  const std::string b = encode_inventory(inv);
  auto d = decode_inventory(b);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->cut_pc(), 42u);
  for (size_t i = 0; i < b.size(); ++i) {
    std::string bad = b;
    bad[i] ^= 0x20;
    EXPECT_FALSE(decode_inventory(bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(decode_inventory(b.substr(0, b.size() - 1)).ok());
  EXPECT_FALSE(decode_inventory(b + "x").ok());
}

pb::ClientImage one_buffer_client(const pb::BlobRef& ref, uint64_t size) {
  pb::ClientImage c;
  c.mutable_client()->set_next_pc(10);
  auto* h = c.add_handles();
  h->set_id((4ull << 56) | 1);
  h->set_type(4);
  h->set_addr(0x1000);
  h->set_size(size);
  h->set_version(3);
  *h->mutable_memory() = ref;
  return c;
}

void write_blob(ImageWriter& w, const std::vector<std::byte>& data, size_t* blob) {
  ASSERT_TRUE(w.begin_blob(data.size(), blob).ok());
  for (uint64_t off = 0; off < data.size(); off += kChunkSize) {
    const uint64_t n = std::min<uint64_t>(kChunkSize, data.size() - off);
    auto buf = w.chunk(*blob, off, n);
    ASSERT_TRUE(buf.ok());
    std::memcpy(*buf, data.data() + off, n);
    ASSERT_TRUE(w.chunk_filled(*blob, off, n).ok());
  }
}

// `data` as the one buffer of a new image at `dir`; *client: the records it was committed with.
void write_one_buffer_image(const fs::path& dir, const std::vector<std::byte>& data, const DirWriterOptions& o,
                            pb::ClientImage* client) {
  auto w = open_dir_writer(dir.string(), o);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  size_t blob = 0;
  write_blob(**w, data, &blob);
  ASSERT_TRUE((*w)->finish_blobs().ok());
  pb::Inventory inv;
  inv.set_cut_pc(10);
  *client = one_buffer_client((*w)->ref(blob), data.size());
  ASSERT_TRUE((*w)->commit(inv, *client).ok());
}

// The one buffer's bytes, read back chunk by chunk (each chunk's checksum verified).
void read_one_buffer(const ImageReader& r, size_t size, std::vector<std::byte>* got) {
  const pb::BlobRef& ref = r.client().handles(0).memory();
  got->assign(size, std::byte{0xee});
  for (uint64_t off = 0; off < size; off += ref.chunk_size()) {
    const uint64_t n = std::min<uint64_t>(ref.chunk_size(), size - off);
    ASSERT_TRUE(r.read_chunk(ref, off, n, got->data() + off).ok()) << off;
  }
}

TEST(ImageRoundTripTest, ADirectoryImageReadsBackByteForByteAndReencodesIdentically) {
  const fs::path dir = fs::temp_directory_path() / ("pos-image-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<std::byte> data(kChunkSize + 12345);
  std::mt19937 g(3);
  for (auto& b : data) b = static_cast<std::byte>(g());
  pb::ClientImage client;
  write_one_buffer_image(dir, data, DirWriterOptions{}, &client);
  auto r = ImageReader::open_dir(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string a, b;
  ASSERT_TRUE(client.SerializeToString(&a));
  ASSERT_TRUE((*r)->client().SerializeToString(&b));
  EXPECT_EQ(a, b);  // decode → re-encode is the identity
  std::vector<std::byte> got;
  read_one_buffer(**r, data.size(), &got);
  EXPECT_EQ(got, data);
  fs::remove_all(dir);
}

// A chunk of zeros (memory the job never wrote) is not written: memory.bin keeps a hole there,
// which the file system reports as such (the migration stream sends only data), and the blob still
// reads back byte for byte, its checksum that of the zeros.
TEST(ImageRoundTripTest, AChunkOfZerosIsLeftAHoleInTheMemoryFileAndReadsBackAsZeros) {
  const fs::path dir = fs::temp_directory_path() / ("pos-image-zeros-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // Chunks: data, zeros, zeros, data (the last one short).
  std::vector<std::byte> data(3 * kChunkSize + 4096 * 3);
  std::mt19937 g(5);
  for (size_t i = 0; i < data.size(); ++i)
    if (i < kChunkSize || i >= 3 * kChunkSize) data[i] = static_cast<std::byte>(g() | 1);
  DirWriterOptions o;
  o.direct_io = false;
  pb::ClientImage client;
  write_one_buffer_image(dir, data, o, &client);
  auto r = ImageReader::open_dir(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const pb::BlobRef& ref = (*r)->client().handles(0).memory();
  ASSERT_EQ(ref.chunk_size(), kChunkSize);
  std::vector<std::byte> got;
  read_one_buffer(**r, data.size(), &got);
  EXPECT_TRUE(got == data);
  // Where the file system says the data is: the first chunk, then from the fourth on.
  const int fd = ::open((dir / "memory.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const off_t at = static_cast<off_t>(ref.offset());
  EXPECT_EQ(::lseek(fd, at, SEEK_DATA), at);
  const off_t hole = ::lseek(fd, at, SEEK_HOLE);
  EXPECT_GE(hole, at + static_cast<off_t>(kChunkSize));
  EXPECT_LE(hole, at + static_cast<off_t>(kChunkSize) + 4096);
  EXPECT_GE(::lseek(fd, at + static_cast<off_t>(kChunkSize), SEEK_DATA), at + static_cast<off_t>(3 * kChunkSize) - 4096);
  ::close(fd);
  fs::remove_all(dir);
}

// A session keeps DirWriterOptions::staging_chunks() page-locked chunks ahead so that its first
// checkpoint makes none: the writer must take exactly that many, each of kChunkSize, and give them
// all back; with more memory files, more.
TEST(ImageRoundTripTest, TheWriterTakesExactlyTheStagingChunksItsOptionsNameAndGivesThemBack) {
  for (uint32_t files : {0u, 1u, 12u}) {
    const fs::path dir = fs::temp_directory_path() / ("pos-image-staging-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    size_t taken = 0, given = 0, wrong_size = 0;
    DirWriterOptions o;
    o.direct_io = false;
    o.memory_files = files;
    o.alloc = HostAllocator{[&](uint64_t n) -> void* {
                              if (n != kChunkSize) ++wrong_size;
                              ++taken;
                              return std::aligned_alloc(4096, n);
                            },
                            [&](void* p) {
                              ++given;
                              std::free(p);
                            }};
    const uint32_t want = o.staging_chunks();
    EXPECT_GE(want, 2 * o.files()) << files;
    if (files == 12) {
      EXPECT_EQ(want, 24u);
    }
    std::vector<std::byte> data(2 * kChunkSize, std::byte{7});
    pb::ClientImage client;
    write_one_buffer_image(dir, data, o, &client);
    EXPECT_EQ(taken, want) << files;
    EXPECT_EQ(given, want) << files;
    EXPECT_EQ(wrong_size, 0u) << files;
    fs::remove_all(dir);
  }
}

// The writer tells of each range it wrote, once the bytes are in the file (pos-cli migrate sends
// them on from there): every chunk with data once, the chunks of zeros never; the ranges told of
// hold exactly the file's data.
TEST(ImageRoundTripTest, TheWriterTellsOfEachRangeWrittenAndNotOfChunksLeftHoles) {
  const fs::path dir = fs::temp_directory_path() / ("pos-image-written-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<std::byte> data(3 * kChunkSize + 4096 * 3);
  std::mt19937 g(7);
  for (size_t i = 0; i < data.size(); ++i)
    if (i < kChunkSize || i >= 3 * kChunkSize) data[i] = static_cast<std::byte>(g() | 1);
  DirWriterOptions o;
  o.direct_io = false;
  std::mutex mu;
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> told;
  o.on_written = [&](const std::string& file, uint64_t off, uint64_t len) {
    // The bytes are there when it is told: read them back now, from the directory being written.
    std::vector<std::byte> now(len);
    const int fd = ::open((fs::path(dir.string() + ".partial") / file).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, now.data(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
    ::close(fd);
    EXPECT_NE(now[0], std::byte{0}) << "told of a range not written yet";
    std::lock_guard<std::mutex> lk(mu);
    told.emplace_back(file, off, len);
  };
  pb::ClientImage client;
  write_one_buffer_image(dir, data, o, &client);
  auto r = ImageReader::open_dir(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const pb::BlobRef& ref = (*r)->client().handles(0).memory();
  std::sort(told.begin(), told.end());
  ASSERT_EQ(told.size(), 2u) << "the first and the last chunk; the two of zeros are holes";
  EXPECT_EQ(told[0], std::make_tuple(std::string("memory.bin"), ref.offset(), uint64_t{kChunkSize}));
  EXPECT_EQ(std::get<1>(told[1]), ref.offset() + 3 * kChunkSize);
  EXPECT_GE(std::get<2>(told[1]), 4096u * 3);
  fs::remove_all(dir);
}

// A large image spreads its blobs over memory files that the writer's threads fill side by side
// (format 3): past kSpreadAfter in memory.bin, a blob above kStripeAfter is striped chunk by chunk
// over every file and a smaller one goes to the least filled file; every byte reads back; a
// damaged byte is found and named in its own file (a striped chunk's too); a truncated or missing
// extra file, a blob naming a file the image lacks and a stripe count above the files are refused.
TEST(ImageRoundTripTest, ALargeImageSpreadOverSeveralMemoryFilesReadsBackAndDamageInAnyFileIsFound) {
  const fs::path dir = fs::temp_directory_path() / ("pos-image-files-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<uint64_t> sizes = {kSpreadAfter, 3 * uint64_t{kChunkSize} + 5, 2 * uint64_t{kChunkSize}, 4097,
                                 kChunkSize + 1, 12345};
  std::vector<std::vector<std::byte>> data;
  std::mt19937 g(5);
  for (uint64_t n : sizes) {
    data.emplace_back(n);
    for (auto& b : data.back()) b = static_cast<std::byte>(g());
  }
  DirWriterOptions o;
  o.memory_files = 3;
  auto w = open_dir_writer(dir.string(), o);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  std::vector<size_t> blobs(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) write_blob(**w, data[i], &blobs[i]);
  ASSERT_TRUE((*w)->finish_blobs().ok());
  std::set<uint32_t> files;
  pb::ClientImage client;
  client.mutable_client()->set_next_pc(10);
  for (size_t i = 0; i < sizes.size(); ++i) {
    files.insert((*w)->ref(blobs[i]).file());
    auto* h = client.add_handles();
    h->set_id((4ull << 56) | (i + 1));
    h->set_type(4);
    h->set_addr(0x10000000 * (i + 1));
    h->set_size(sizes[i]);
    h->set_version(1);
    *h->mutable_memory() = (*w)->ref(blobs[i]);
  }
  EXPECT_EQ(files, (std::set<uint32_t>{0, 1, 2}));
  EXPECT_EQ((*w)->ref(blobs[0]).file(), 0u);  // memory.bin first
  EXPECT_EQ((*w)->ref(blobs[0]).stripes(), 0u);
  EXPECT_EQ((*w)->ref(blobs[1]).stripes(), 3u);  // 3 chunks and 5 bytes: over all three files
  EXPECT_EQ((*w)->ref(blobs[2]).stripes(), 0u);  // 2 chunks: not above kStripeAfter
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(blob_chunk_at((*w)->ref(blobs[1]), i).file, i % 3);
  pb::Inventory inv;
  inv.set_cut_pc(10);
  ASSERT_TRUE((*w)->commit(inv, client).ok());
  ASSERT_TRUE(fs::exists(dir / "memory.1.bin"));
  ASSERT_TRUE(fs::exists(dir / "memory.2.bin"));
  EXPECT_FALSE(fs::exists(dir / "memory.3.bin"));
  std::vector<uint64_t> real;  // the memory files' sizes, as the inventory gives them
  auto read_all_blobs = [&](const fs::path& d) -> Status {
    auto r = ImageReader::open_dir(d.string());
    if (!r.ok()) return r.status();
    real = {(*r)->inventory().memory_size()};
    for (uint64_t n : (*r)->inventory().memory_file_sizes()) real.push_back(n);
    EXPECT_EQ((*r)->inventory().format_version(), kFormatVersion);
    EXPECT_EQ((*r)->inventory().memory_file_sizes_size(), 2);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const pb::BlobRef& ref = (*r)->client().handles(static_cast<int>(i)).memory();
      std::vector<std::byte> got(sizes[i]);
      for (uint64_t off = 0; off < sizes[i]; off += ref.chunk_size()) {
        const uint64_t n = std::min<uint64_t>(ref.chunk_size(), sizes[i] - off);
        Status st = (*r)->read_chunk(ref, off, n, got.data() + off);
        if (!st.ok()) return st;
      }
      EXPECT_EQ(got, data[i]) << "blob " << i;
    }
    return Status::Ok();
  };
  ASSERT_TRUE(read_all_blobs(dir).ok());
  // One byte of the striped blob's fourth chunk (back in memory.bin) changed: found there.
  const BlobChunkAt fourth = blob_chunk_at((*w)->ref(blobs[1]), 3);
  ASSERT_EQ(fourth.file, 0u);
  {
    std::fstream f(dir / "memory.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fourth.offset + 2));
    const char was = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(fourth.offset + 2));
    f.put(static_cast<char>(was ^ 0x40));
    f.flush();
    Status bad = read_all_blobs(dir);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("checksum mismatch in memory.bin at offset " + std::to_string(fourth.offset)),
              std::string::npos) << bad.message();
    f.seekp(static_cast<std::streamoff>(fourth.offset + 2));
    f.put(was);
  }
  ASSERT_TRUE(read_all_blobs(dir).ok());
  // One byte changed in memory.2.bin: found, and the file named.
  size_t in2 = 0;
  while ((*w)->ref(blobs[in2]).file() != 2 || (*w)->ref(blobs[in2]).stripes() != 0) ++in2;
  {
    std::fstream f(dir / "memory.2.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>((*w)->ref(blobs[in2]).offset() + 3));
    f.put('\x5a' ^ static_cast<char>(data[in2][3]));
  }
  Status bad = read_all_blobs(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("checksum mismatch in memory.2.bin"), std::string::npos) << bad.message();
  // memory.1.bin shorter than the inventory says, then gone: the image does not open.
  fs::resize_file(dir / "memory.1.bin", 4096);
  auto r = ImageReader::open_dir(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("memory.1.bin is truncated"), std::string::npos) << r.status().message();
  fs::remove(dir / "memory.1.bin");
  EXPECT_FALSE(ImageReader::open_dir(dir.string()).ok());
  // A blob in a file the image does not have.
  pb::ClientImage other = client;
  other.mutable_handles(2)->mutable_memory()->set_file(7);
  const std::vector<uint64_t> three = real;
  ASSERT_EQ(three.size(), 3u);
  Status v = validate_client(other, three, false);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("memory file 7"), std::string::npos) << v.message();
  EXPECT_TRUE(validate_client(client, three, false).ok());
  pb::ClientImage wide = client;
  wide.mutable_handles(1)->mutable_memory()->set_stripes(4);
  Status sv = validate_client(wide, three, false);
  ASSERT_FALSE(sv.ok());
  EXPECT_NE(sv.message().find("striped over 4 memory files"), std::string::npos) << sv.message();
  fs::remove_all(dir);
}

TEST(ImageRoundTripTest, TheValidatorRefusesInconsistentRecords) {
  pb::BlobRef ref;
  ref.set_offset(0);
  ref.set_length(100);
  ref.set_chunk_size(kChunkSize);
  ref.add_chunk_crc(0);
  EXPECT_TRUE(validate_client(one_buffer_client(ref, 100), 4096, false).ok());
  EXPECT_FALSE(validate_client(one_buffer_client(ref, 101), 4096, false).ok());  // size vs blob
  EXPECT_FALSE(validate_client(one_buffer_client(ref, 100), 50, false).ok());    // past memory.bin
  pb::BlobRef two = ref;
  two.add_chunk_crc(0);
  EXPECT_FALSE(validate_client(one_buffer_client(two, 100), 4096, false).ok());  // checksum count
  pb::BlobRef up;
  up.set_in_parent(true);
  EXPECT_FALSE(validate_client(one_buffer_client(up, 100), 4096, false).ok());  // no parent
  pb::ClientImage c = one_buffer_client(ref, 100);
  c.mutable_handles(0)->add_parents(99);
  EXPECT_FALSE(validate_client(c, 4096, false).ok());  // parent not an earlier record
  c = one_buffer_client(ref, 100);
  c.mutable_handles(0)->set_version(10);
  EXPECT_FALSE(validate_client(c, 4096, false).ok());  // written at or after the cut
}

pb::PendingCall pending_call(uint64_t pc, ApiId api) {
  pb::PendingCall p;
  p.set_pc(pc);
  p.set_api_id(static_cast<uint32_t>(api));
  p.add_params(std::string(8, '\1'));
  return p;
}

TEST(ImageRoundTripTest, TheValidatorChecksPendingCallsAgainstTheCutTheApiTableAndTheBounds) {
  pb::BlobRef ref;
  ref.set_offset(0);
  ref.set_length(100);
  ref.set_chunk_size(kChunkSize);
  ref.add_chunk_crc(0);
  const pb::ClientImage base = one_buffer_client(ref, 100);  // cut 10
  auto with = [&](std::vector<pb::PendingCall> calls) {
    pb::ClientImage c = base;
    for (auto& p : calls) *c.add_pending() = std::move(p);
    return validate_client(c, 4096, false);
  };
  EXPECT_TRUE(with({pending_call(10, ApiId::kMalloc), pending_call(12, ApiId::kMemsetAsync)}).ok());
  EXPECT_EQ(with({pending_call(9, ApiId::kMalloc)}).code(), Code::kCorrupt);  // before the cut
  EXPECT_EQ(with({pending_call(11, ApiId::kMalloc), pending_call(11, ApiId::kMalloc)}).code(), Code::kCorrupt);
  EXPECT_EQ(with({pending_call(12, ApiId::kMalloc), pending_call(11, ApiId::kMalloc)}).code(), Code::kCorrupt);
  pb::PendingCall unknown = pending_call(10, ApiId::kMalloc);
  unknown.set_api_id(0x5ff);
  EXPECT_EQ(with({unknown}).code(), Code::kCorrupt);
  EXPECT_EQ(with({pending_call(10, ApiId::kDeviceSynchronize)}).code(), Code::kCorrupt);  // waits for the worker
  pb::PendingCall many = pending_call(10, ApiId::kLaunchKernel);
  for (uint64_t i = 0; i < kMaxPendingParams; ++i) many.add_params("p");
  EXPECT_EQ(with({many}).code(), Code::kCorrupt);
  pb::PendingCall answer = pending_call(10, ApiId::kMalloc);
  answer.set_ret(std::string(kMaxPendingRetBytes + 1, 'r'));
  EXPECT_EQ(with({answer}).code(), Code::kCorrupt);
  pb::PendingCall big = pending_call(10, ApiId::kMemcpyAsync);
  big.add_params(std::string(kMaxPendingCallBytes, 'b'));  // with the first parameter: one byte too many
  Status s = with({big});
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("parameter bytes"), std::string::npos) << s.to_string();
}

// A fresh directory for one image under the system's temporary directory.
fs::path image_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("pos-image-test-" + std::to_string(::getpid())) / name;
  fs::create_directories(d.parent_path());
  fs::remove_all(d);
  return d;
}

// A one-buffer image in `dir` whose client record and handles are `client` (blob filled in).
Status write_image(const fs::path& dir, pb::ClientImage client, pb::Inventory inv = {}) {
  auto w = open_dir_writer(dir.string(), DirWriterOptions{});
  if (!w.ok()) return w.status();
  size_t blob = 0;
  const std::vector<std::byte> data(4096, std::byte{7});
  write_blob(**w, data, &blob);
  POS_RETURN_IF_ERROR((*w)->finish_blobs());
  *client.mutable_handles(0)->mutable_memory() = (*w)->ref(blob);
  client.mutable_handles(0)->set_size(data.size());
  inv.set_cut_pc(10);
  return (*w)->commit(inv, client);
}

pb::ClientImage client_with_buffer() {
  pb::BlobRef ref;
  return one_buffer_client(ref, 4096);
}

TEST(ImageTextTest, SymbolNamesParentPathsAndErrorMessagesOfAnyBytesRoundTripExactly) {
  // A hostile client registers kernels and variables under names of any bytes; the image must
  // give them back byte for byte (a kernel is looked up by its exact mangled name).
  const std::string name("_Z4k\xff\xfe\xc0\xaf\xed\xa0\x80\x1b[2J\0x", 17);
  pb::ClientImage c = client_with_buffer();
  auto* mod = c.add_handles();
  mod->set_id((5ull << 56) | 1);
  mod->set_type(5);
  auto* fn = c.add_handles();
  fn->set_id((6ull << 56) | 1);
  fn->set_type(6);
  fn->add_parents(mod->id());
  fn->set_name(name);
  c.mutable_client()->set_async_error(700);
  c.mutable_client()->set_async_error_message("launch of '" + name + "' failed");
  const fs::path d = image_dir("names");
  Status s = write_image(d, c);
  ASSERT_TRUE(s.ok()) << s.to_string();
  auto r = ImageReader::open_dir(d.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->client().handles(2).name(), name);
  EXPECT_EQ((*r)->client().client().async_error_message(), "launch of '" + name + "' failed");
  // The parent's path is a file name: bytes too (read back exactly, checked by the decoder only).
  pb::Inventory inv;
  inv.set_format_version(kFormatVersion);
  inv.mutable_parent()->set_path("../p\xe9re");
  std::string bytes = encode_inventory(inv);
  auto back = decode_inventory(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->parent().path(), "../p\xe9re");
  fs::remove_all(d);
}

TEST(ImageTextTest, AWriterRefusesTextThatIsNotUtf8BeforeAnImageAppearsAndNamesTheField) {
  // Text fields (the job name, what POS itself writes) stay `string`: one that is not UTF-8 would
  // give an image that never reads back, so the writer refuses it and leaves nothing behind.
  pb::ClientImage c = client_with_buffer();
  c.mutable_client()->set_job_name("caf\xe9");
  const fs::path d = image_dir("bad-job");
  Status s = write_image(d, c);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("ClientRecord.job_name"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("caf\\xe9"), std::string::npos) << s.to_string();  // shown escaped
  EXPECT_FALSE(fs::exists(d));
  EXPECT_FALSE(fs::exists(d.string() + ".partial"));
  pb::Inventory inv;
  inv.add_features("handles");
  inv.add_features("bad\xff");
  s = write_image(d, client_with_buffer(), inv);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("Inventory.features[1]"), std::string::npos) << s.to_string();
  EXPECT_FALSE(fs::exists(d));
  // The memory writer refuses the same (its image is saved to a directory later).
  MemoryImage mem(HostAllocator::plain());
  auto w = open_memory_writer(&mem);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->finish_blobs().ok());
  pb::ClientImage empty;
  empty.mutable_client()->set_next_pc(10);
  empty.mutable_client()->set_job_name("\xc0\xaf");
  pb::Inventory minv;
  minv.set_cut_pc(10);
  s = (*w)->commit(minv, empty);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_FALSE(mem.valid());
  // Valid UTF-8 in every text field is written and read back as it was.
  c.mutable_client()->set_job_name("caf\xc3\xa9 \xe2\x82\xac");
  s = write_image(d, c);
  ASSERT_TRUE(s.ok()) << s.to_string();
  auto r = ImageReader::open_dir(d.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->client().client().job_name(), "caf\xc3\xa9 \xe2\x82\xac");
  fs::remove_all(d);
}

// ImageReader::open_dir(dir) in a child process, so that a reader that blocks (on a FIFO) fails
// the test after `seconds` instead of hanging it. Returns the child's verdict: "ok", the error, or
// "hung".
std::string open_in_child(const fs::path& dir, int seconds = 10) {
  int p[2];
  if (::pipe(p) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    auto r = ImageReader::open_dir(dir.string());
    const std::string m = r.ok() ? "ok" : r.status().to_string();
    (void)!::write(p[1], m.data(), m.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  pollfd pfd{p[0], POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
      ::kill(pid, SIGKILL);
      out = "hung";
      break;
    }
    char buf[4096];
    const ssize_t n = ::read(p[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

// A copy of image `from` at `to` whose file `name` is replaced by what `make` creates there.
void copy_with(const fs::path& from, const fs::path& to, const std::string& name, const std::function<void(const fs::path&)>& make) {
  fs::remove_all(to);
  fs::copy(from, to);
  fs::remove(to / name);
  make(to / name);
}

void make_fifo(const fs::path& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0) << p; }
void make_socket(const fs::path& p) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  ASSERT_LT(p.string().size(), sizeof(a.sun_path));
  std::strncpy(a.sun_path, p.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << p;
  ::close(fd);  // the socket file stays
}

TEST(ImageFilesTest, AFifoSocketOrDirectoryInPlaceOfAnImagesFileIsRefusedAtOnceByName) {
  const fs::path good = image_dir("good");
  ASSERT_TRUE(write_image(good, client_with_buffer()).ok());
  EXPECT_EQ(open_in_child(good), "ok");  // regular files: as before
  struct Kind {
    const char* what;
    std::function<void(const fs::path&)> make;
  };
  const Kind kinds[] = {{"a FIFO", make_fifo},
                        {"a socket", make_socket},
                        {"a directory", [](const fs::path& p) { fs::create_directory(p); }}};
  for (const char* file : {"inventory.pb", "client.pb", "memory.bin"}) {
    for (const Kind& k : kinds) {
      const fs::path d = image_dir("odd");
      copy_with(good, d, file, k.make);
      const std::string m = open_in_child(d);
      EXPECT_NE(m, "hung") << file << " as " << k.what;
      EXPECT_NE(m.find((d / file).string() + " is " + k.what), std::string::npos) << file << ": " << m;
      EXPECT_NE(m.find("not a regular file"), std::string::npos) << m;
    }
  }
  // In place of the image directory itself.
  const fs::path fifo = image_dir("fifo-dir");
  make_fifo(fifo);
  const std::string m = open_in_child(fifo);
  EXPECT_NE(m.find(fifo.string() + " is a FIFO, not an image directory"), std::string::npos) << m;
  fs::remove_all(good.parent_path());
}

TEST(ImageFilesTest, AFifoInAParentImageIsRefusedToo) {
  const fs::path parent = image_dir("parent"), child = image_dir("child");
  pb::Inventory pinv;
  pinv.set_image_id("p1");
  ASSERT_TRUE(write_image(parent, client_with_buffer(), pinv).ok());
  pb::Inventory cinv;
  cinv.set_image_id("c1");
  cinv.mutable_parent()->set_path("../parent");
  cinv.mutable_parent()->set_image_id("p1");
  cinv.mutable_parent()->set_cut_pc(10);
  ASSERT_TRUE(write_image(child, client_with_buffer(), cinv).ok());
  EXPECT_EQ(open_in_child(child), "ok");
  fs::remove(parent / "memory.bin");
  make_fifo(parent / "memory.bin");
  const std::string m = open_in_child(child);
  EXPECT_NE(m, "hung");
  EXPECT_NE(m.find("parent image"), std::string::npos) << m;
  EXPECT_NE(m.find("memory.bin is a FIFO"), std::string::npos) << m;
  fs::remove_all(parent.parent_path());
}

TEST(ImageFilesTest, ASymbolicLinkInPlaceOfAnImagesFileIsRefusedEvenToARegularFile) {
  const fs::path good = image_dir("good-link");
  ASSERT_TRUE(write_image(good, client_with_buffer()).ok());
  const fs::path elsewhere = image_dir("elsewhere");
  fs::create_directories(elsewhere);
  fs::copy_file(good / "client.pb", elsewhere / "client.pb");
  const fs::path d = image_dir("linked");
  copy_with(good, d, "client.pb", [&](const fs::path& p) { fs::create_symlink(elsewhere / "client.pb", p); });
  const std::string m = open_in_child(d);
  EXPECT_NE(m.find((d / "client.pb").string() + " is a symbolic link"), std::string::npos) << m;
  // The image directory itself may be a link (an operator's `latest`): its files are still checked.
  const fs::path latest = image_dir("latest");
  fs::create_directory_symlink(good, latest);
  EXPECT_EQ(open_in_child(latest), "ok");
  fs::remove_all(good.parent_path());
}

TEST(ImageFilesTest, PosCliInspectOfAnImageWithAFifoExitsNonZeroWithTheReason) {
  const fs::path good = image_dir("good-cli");
  ASSERT_TRUE(write_image(good, client_with_buffer()).ok());
  const fs::path d = image_dir("fifo-cli");
  copy_with(good, d, "client.pb", make_fifo);
  int rc = 0;
  std::string err;
  // Under timeout(1): a regression fails with 124 instead of hanging the suite.
  (void)pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", d.string()}, &rc, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find((d / "client.pb").string() + " is a FIFO"), std::string::npos) << err;
  const std::string out = pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", good.string()}, &rc);
  EXPECT_EQ(rc, 0) << out;
  fs::remove_all(good.parent_path());
}

// `pos-cli inspect` checks what it says it validates: four overwritten bytes in memory.bin, which
// open_dir's structural checks cannot see, fail it with the handle and the offset named.
TEST(PosCliTest, InspectReadsEveryBlobAndFailsOnFourOverwrittenBytesNamingWhere) {
  const fs::path d = image_dir("damaged-blob");
  ASSERT_TRUE(write_image(d, client_with_buffer()).ok());
  int rc = 0;
  std::string err;
  std::string out = pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", d.string()}, &rc, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("verified: 4096 bytes in 1 chunks of 1 blobs, 1 image(s), every checksum right"), std::string::npos)
      << out;
  {
    std::fstream f(d / "memory.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("\x01\x02\x03\x04", 4);
  }
  (void)pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", d.string()}, &rc, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("checksum mismatch in memory.bin"), std::string::npos) << err;
  EXPECT_NE(err.find("handle #"), std::string::npos) << err;
  EXPECT_NE(err.find("bytes 0..4096"), std::string::npos) << err;
  // --no-verify says so instead of claiming it.
  out = pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", "--no-verify", d.string()}, &rc, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("not verified"), std::string::npos) << out;
  fs::remove_all(d.parent_path());
}

TEST(PosCliTest, InspectJsonNamesHandleTypesAndSummaryCountsThemByType) {
  const fs::path d = image_dir("json-names");
  ASSERT_TRUE(write_image(d, client_with_buffer()).ok());
  int rc = 0;
  std::string err;
  std::string out = pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", "--json", d.string()}, &rc, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("\"handles\":[{\"id\":"), std::string::npos) << out;
  EXPECT_NE(out.find("\"type\":\"memory\""), std::string::npos) << out;
  EXPECT_EQ(out.find("\"type\":4"), std::string::npos) << out;
  out = pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", "--summary", "--json", d.string()}, &rc, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("\"handle_summary\":{\"memory\":{\"count\":1,\"bytes\":4096,\"stored_bytes\":4096}}"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("\"handles\":["), std::string::npos) << out;
  out = pos::test::run_program("POS_CLI", "timeout 10 ", {"inspect", "--summary", d.string()}, &rc, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("memory          1              4096 bytes"), std::string::npos) << out;
  fs::remove_all(d.parent_path());
}

TEST(PosCliTest, HelpAndVersionExitZeroAndAnUnknownCommandOrFlagIsNamedWithExitTwo) {
  int rc = 0;
  std::string err;
  std::string out = pos::test::run_program("POS_CLI", "", {"--help"}, &rc, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("inspect"), std::string::npos) << out;
  EXPECT_NE(out.find("ps"), std::string::npos) << out;
  out = pos::test::run_program("POS_CLI", "", {"help", "inspect"}, &rc, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("Usage: pos-cli inspect"), std::string::npos) << out;
  EXPECT_NE(out.find("--summary"), std::string::npos) << out;
  for (const char* cmd : {"dump", "pre-dump", "restore"}) {
    out = pos::test::run_program("POS_CLI", "", {"help", cmd}, &rc, &err);
    EXPECT_EQ(rc, 0) << cmd << err;
    EXPECT_NE(out.find(std::string("Usage: pos-cli ") + cmd), std::string::npos) << out;
    if (std::string(cmd) != "restore") {
      EXPECT_NE(out.find("--prev"), std::string::npos) << out;
    }
  }
  out = pos::test::run_program("POS_CLI", "", {"--version"}, &rc, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(out.find("pos-cli "), std::string::npos) << out;
  EXPECT_NE(out.find("image format " + std::to_string(kFormatVersion)), std::string::npos) << out;
  (void)pos::test::run_program("POS_CLI", "", {"bogus"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("unknown command 'bogus'"), std::string::npos) << err;
  (void)pos::test::run_program("POS_CLI", "", {"inspect", "--bogus", "x"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("inspect: "), std::string::npos) << err;
  EXPECT_NE(err.find("--bogus"), std::string::npos) << err;
  (void)pos::test::run_program("POS_CLI", "", {"help", "bogus"}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("unknown command 'bogus'"), std::string::npos) << err;
  (void)pos::test::run_program("POS_CLI", "", {}, &rc, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("a command is required"), std::string::npos) << err;
}

}  // namespace
}  // namespace pos::ckpt
