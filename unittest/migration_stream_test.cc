// migration_stream_test.cc — the migration stream's file transfer (remoting/server/migration_peer.h)
// between a MigrationLink and a MigrationServer on loopback: files arrive byte for byte, holes are
// not sent but arrive as holes of the same file size, and a stream with the wrong secret is refused.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "pos/base/thread.h"
#include "remoting/server/migration_peer.h"

namespace {
namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Writes `pieces` (offset, bytes) into a new file of `size` bytes, the rest left as holes.
void sparse_file(const fs::path& p, uint64_t size, const std::vector<std::pair<uint64_t, std::string>>& pieces) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
  for (const auto& [off, bytes] : pieces)
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off)), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

class MigrationStream : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("pos-ms-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "src" / "sub");
    fs::create_directories(root_ / "in");
    pos::MigrationServerOptions o;
    o.listen = "127.0.0.1:0";
    o.secret = "a secret of at least sixteen bytes";
    o.dir = (root_ / "in").string();
    o.posd_socket = (root_ / "none.sock").string();
    o.cli = "/bin/false";
    o.on_authenticated = [this] { authenticated_.fetch_add(1); };
    auto s = pos::MigrationServer::start(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(root_);
  }
  std::atomic<int> authenticated_{0};  // posd's hook: a peer proved the secret
  // Where the server wrote the migration's files (its one directory under in/).
  fs::path received() const {
    for (const auto& e : fs::directory_iterator(root_ / "in")) return e.path();
    return {};
  }
  fs::path root_;
  std::unique_ptr<pos::MigrationServer> server_;
};

TEST_F(MigrationStream, FilesArriveByteForByteAndTheirHolesAreNotSentButKeptAsHoles) {
  const uint64_t mib = 1 << 20;
  // 24 MiB with 8 KiB of data at 0, 4 KiB at 12 MiB, and a hole to the end.
  sparse_file(root_ / "src" / "memory.0.bin", 24 * mib, {{0, std::string(8192, 'a')}, {12 * mib, std::string(4096, 'b')}});
  // Starts with a hole, ends with data.
  sparse_file(root_ / "src" / "sub" / "tail.bin", 3 * mib, {{3 * mib - 4096, std::string(4096, 'c')}});
  std::ofstream(root_ / "src" / "manifest") << "{\"kind\":\"test\"}\n";
  std::ofstream(root_ / "src" / "empty");
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "round-1").ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_TRUE(synced.ok()) << synced.message();
  const fs::path got = received() / "round-1";
  for (const char* f : {"memory.0.bin", "sub/tail.bin", "manifest", "empty"}) {
    SCOPED_TRACE(f);
    ASSERT_TRUE(fs::exists(got / f));
    EXPECT_EQ(fs::file_size(got / f), fs::file_size(root_ / "src" / f));
    EXPECT_EQ(slurp(got / f), slurp(root_ / "src" / f));
  }
  // The data was sent, not the holes (where the file system keeps holes, as tmpfs and ext4 do).
  struct stat st {};
  ASSERT_EQ(::stat((root_ / "src" / "memory.0.bin").c_str(), &st), 0);
  if (static_cast<uint64_t>(st.st_blocks) * 512 < 4 * mib) {
    EXPECT_LT((*link)->bytes_sent(), 4 * mib) << "holes were sent as zeros";
    ASSERT_EQ(::stat((got / "memory.0.bin").c_str(), &st), 0);
    EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 4 * mib) << "the holes did not arrive as holes";
  }
  EXPECT_GE((*link)->bytes_sent(), 8192u + 4096u + 4096u);
}

// Zeros written into a file (not holes on this side: a CRIU dump's untouched pages, say) are not
// sent either: they arrive as holes that read back as the same zeros; an odd tail arrives whole.
TEST_F(MigrationStream, PagesOfZerosInAFilesDataAreNotSentAndArriveAsTheSameBytes) {
  const uint64_t mib = 1 << 20;
  std::string bytes = std::string(mib, 'a') + std::string(2 * mib, '\0') + std::string(mib + 100, 'b');
  bytes[mib + 5000] = 'z';  // one non-zero byte inside the zeros: its page is sent
  bytes += std::string(3000, '\0');  // a tail shorter than a page, of zeros
  std::ofstream(root_ / "src" / "pages-1.img", std::ios::binary) << bytes;
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "final").ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_TRUE(synced.ok()) << synced.message();
  EXPECT_EQ(slurp(received() / "final" / "pages-1.img"), bytes);
  EXPECT_LT((*link)->bytes_sent(), 2 * mib + 200 + 2 * 4096 + 4096) << "pages of zeros were sent";
  EXPECT_GE((*link)->bytes_sent(), 2 * mib + 100 + 4096);
}

// Many chunks of several files: the reader reads ahead of the sender (four chunks at a time, each
// on a thread of its own: the last file takes two batches, the second one short) and the writer
// writes behind the receiver, and every byte lands where it belongs.
TEST_F(MigrationStream, ManyChunksOfSeveralFilesArriveByteForByteThroughTheReadAheadAndTheWriteBehind) {
  std::mt19937_64 rng(42);
  std::vector<std::string> want;
  uint64_t data_bytes = 0;
  for (int f = 0; f < 3; ++f) {
    std::string bytes((f == 2 ? (45u << 20) : (20u << 20)) + 777u * f, '\0');
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(bytes.data() + i, &v, 8);
    }
    std::memset(bytes.data() + (4u << 20), 0, 3u << 20);  // zeros inside: holes on the wire
    data_bytes += bytes.size() - (3u << 20);
    std::ofstream(root_ / "src" / ("memory." + std::to_string(f) + ".bin"), std::ios::binary) << bytes;
    want.push_back(std::move(bytes));
  }
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "round-1").ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_TRUE(synced.ok()) << synced.message();
  for (int f = 0; f < 3; ++f) {
    const std::string got = slurp(received() / "round-1" / ("memory." + std::to_string(f) + ".bin"));
    ASSERT_EQ(got.size(), want[f].size()) << f;
    EXPECT_TRUE(got == want[f]) << "file " << f << " arrived with other bytes";
  }
  EXPECT_EQ((*link)->bytes_sent(), data_bytes) << "the zeros were sent, or data was not";
}

// Without threads (the kernel refused them) both sides read, send, check and write in turn.
TEST_F(MigrationStream, WhereNoThreadCanStartTheStreamStillArrivesByteForByte) {
  std::string bytes(10u << 20, 'x');
  bytes[12345] = 'y';
  std::ofstream(root_ / "src" / "memory.bin", std::ios::binary) << bytes;
  pos::fail_thread_starts_for_test("the migration stream's reader", 1);
  pos::fail_thread_starts_for_test("the migration stream's read-ahead", 100);  // the 10 MiB are two chunks
  pos::fail_thread_starts_for_test("the migration stream's writer", 1);
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  const pos::Status sent = (*link)->send_dir((root_ / "src").string(), "round-1");
  const pos::Status synced = (*link)->sync();
  pos::fail_thread_starts_for_test("the migration stream's reader", 0);
  pos::fail_thread_starts_for_test("the migration stream's read-ahead", 0);
  pos::fail_thread_starts_for_test("the migration stream's writer", 0);
  ASSERT_TRUE(sent.ok()) << sent.message();
  ASSERT_TRUE(synced.ok()) << synced.message();
  EXPECT_TRUE(slurp(received() / "round-1" / "memory.bin") == bytes);
}

// A chunk that arrives damaged is found by the writer; the next sync names it, and the stream
// ends there (nothing after it is taken).
TEST_F(MigrationStream, AChunkThatArrivesDamagedFailsTheNextSyncWithTheReason) {
  std::ofstream(root_ / "src" / "memory.bin", std::ios::binary) << std::string(20u << 20, 'q');
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  pos::damage_sent_chunks_for_test(1);
  const pos::Status sent = (*link)->send_dir((root_ / "src").string(), "round-1");
  pos::damage_sent_chunks_for_test(0);
  ASSERT_TRUE(sent.ok()) << sent.message();
  const pos::Status synced = (*link)->sync();
  ASSERT_FALSE(synced.ok());
  EXPECT_NE(synced.message().find("damaged (CRC-32C)"), std::string::npos) << synced.message();
}

// An entry sent ahead (the stop's GPU part while CRIU still dumps) and then the rest of its
// directory without it: each file arrives once, whole.
TEST_F(MigrationStream, AnEntrySentAheadIsLeftOutOfItsDirectoryLaterAndEverythingArrivesOnce) {
  fs::create_directories(root_ / "src" / "gpu" / "deep");
  std::ofstream(root_ / "src" / "gpu" / "memory.bin", std::ios::binary) << std::string(3u << 20, 'g');
  std::ofstream(root_ / "src" / "gpu" / "deep" / "inventory.pb") << "inv";
  std::ofstream(root_ / "src" / "manifest") << "{\"kind\":\"test\"}\n";
  std::ofstream(root_ / "src" / "sub" / "pages-1.img", std::ios::binary) << std::string(5000, 'p');
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->make_dir("final").ok());
  ASSERT_TRUE((*link)->send_dir((root_ / "src" / "gpu").string(), "final/gpu").ok());
  const uint64_t ahead = (*link)->bytes_sent();
  EXPECT_GE(ahead, 3u << 20);
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "final", {"gpu"}).ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_TRUE(synced.ok()) << synced.message();
  EXPECT_LT((*link)->bytes_sent() - ahead, 64u << 10) << "the entry sent ahead was sent again";
  const fs::path got = received() / "final";
  EXPECT_EQ(slurp(got / "gpu" / "memory.bin"), std::string(3u << 20, 'g'));
  EXPECT_EQ(slurp(got / "gpu" / "deep" / "inventory.pb"), "inv");
  EXPECT_EQ(slurp(got / "manifest"), "{\"kind\":\"test\"}\n");
  EXPECT_EQ(slurp(got / "sub" / "pages-1.img"), std::string(5000, 'p'));
}

// A file sent in parts while another process still writes it (the stop's GPU part as posd drains
// it): parts in any order, each range once; a range nobody reported (posd dropped the report) goes
// when its directory is sent, with the file's size; the rest of the directory goes as usual.
TEST_F(MigrationStream, AFileSentInPartsInAnyOrderArrivesWholeWithWhatNoPartCarriedSentByItsDirectory) {
  const uint64_t mib = 1 << 20;
  fs::create_directories(root_ / "src" / "gpu.partial");
  const fs::path mem = root_ / "src" / "gpu.partial" / "memory.bin";
  const int fd = ::open(mem.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  const auto put = [&](uint64_t off, const std::string& bytes) {
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off)), static_cast<ssize_t>(bytes.size()));
  };
  std::string b = std::string(mib, 'b') + std::string(4096, '\0') + std::string(mib - 4096, 'B');
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->make_dir("final").ok());
  ASSERT_TRUE((*link)->make_dir("final/gpu").ok());
  put(8 * mib, std::string(mib, 'a'));  // written first, at 8 MiB
  ASSERT_TRUE((*link)->send_part("final/gpu/memory.bin", fd, 8 * mib, mib).ok());
  put(0, b);  // then the start, a page of zeros inside
  ASSERT_TRUE((*link)->send_part("final/gpu/memory.bin", fd, 0, b.size()).ok());
  const uint64_t parts = (*link)->bytes_sent();
  EXPECT_EQ(parts, 3 * mib - 4096) << "each part's data once, its page of zeros left out";
  put(20 * mib, std::string(mib, 'c'));  // written, never reported
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(24 * mib)), 0);
  ::close(fd);
  std::ofstream(root_ / "src" / "gpu.partial" / "client.pb") << "records";
  fs::rename(root_ / "src" / "gpu.partial", root_ / "src" / "gpu");  // as posd publishes it
  ASSERT_TRUE((*link)->send_dir((root_ / "src" / "gpu").string(), "final/gpu").ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_TRUE(synced.ok()) << synced.message();
  const uint64_t rest = (*link)->bytes_sent() - parts;
  EXPECT_GE(rest, mib) << "the range no part carried was not sent";
  EXPECT_LT(rest, mib + 4096) << "ranges sent in parts were sent again";
  const fs::path got = received() / "final" / "gpu";
  EXPECT_EQ(fs::file_size(got / "memory.bin"), 24 * mib);
  EXPECT_EQ(slurp(got / "memory.bin"), slurp(root_ / "src" / "gpu" / "memory.bin"));
  EXPECT_EQ(slurp(got / "client.pb"), "records");
}

// Parts sent from several threads at once (pos-cli's streamer): each range once, every byte where
// it belongs, and the directory's send afterwards adds nothing but the other files.
TEST_F(MigrationStream, PartsSentFromSeveralThreadsAtOnceArriveByteForByteAndOnce) {
  const uint64_t mib = 1 << 20;
  fs::create_directories(root_ / "src" / "gpu");
  std::string bytes(64 * mib, '\0');
  std::mt19937 g(3);
  for (size_t i = 0; i < bytes.size(); i += 64) bytes[i] = static_cast<char>(g() | 1);
  std::ofstream(root_ / "src" / "gpu" / "memory.1.bin", std::ios::binary) << bytes;
  std::ofstream(root_ / "src" / "gpu" / "inventory.pb") << "inv";
  const int fd = ::open((root_ / "src" / "gpu" / "memory.1.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->make_dir("final").ok());
  ASSERT_TRUE((*link)->make_dir("final/gpu").ok());
  std::vector<std::thread> ts;
  std::vector<pos::Status> got(4);
  for (size_t t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (uint64_t off = t * 8 * mib; off < 64 * mib && got[t].ok(); off += 32 * mib)
        got[t] = (*link)->send_part("final/gpu/memory.1.bin", fd, off, 8 * mib);
    });
  for (auto& t : ts) t.join();
  ::close(fd);
  for (const auto& st : got) ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ((*link)->bytes_sent(), 64 * mib);
  ASSERT_TRUE((*link)->send_dir((root_ / "src" / "gpu").string(), "final/gpu").ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_TRUE(synced.ok()) << synced.message();
  EXPECT_EQ((*link)->bytes_sent(), 64 * mib + 3) << "a range sent in parts was sent again";
  EXPECT_EQ(slurp(received() / "final" / "gpu" / "memory.1.bin"), bytes);
  EXPECT_EQ(slurp(received() / "final" / "gpu" / "inventory.pb"), "inv");
}

// Waiting for a staging restore when none runs is answered at once with the reason (the source
// then stops the job without waiting), and the stream goes on.
TEST_F(MigrationStream, WaitingForAStagingThatDoesNotRunIsAnsweredAtOnceWithTheReason) {
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  const auto t0 = std::chrono::steady_clock::now();
  const pos::Status waited = (*link)->await_stage(10);
  EXPECT_FALSE(waited.ok());
  EXPECT_NE(waited.message().find("nothing is being staged"), std::string::npos) << waited.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE((*link)->make_dir("after").ok());
  EXPECT_TRUE((*link)->sync().ok());
}

// A file sent in parts whose size would cut off a part it received fails the next sync, naming it;
// an unsafe name is refused before anything is sent.
TEST_F(MigrationStream, APartsFileEndingBeforeItsPartsFailsTheNextSyncAndAnUnsafeNameIsRefused) {
  const uint64_t mib = 1 << 20;
  fs::create_directories(root_ / "src" / "gpu");
  const fs::path mem = root_ / "src" / "gpu" / "memory.bin";
  const int fd = ::open(mem.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  const std::string a(mib, 'a');
  ASSERT_EQ(::pwrite(fd, a.data(), a.size(), static_cast<off_t>(4 * mib)), static_cast<ssize_t>(a.size()));
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  EXPECT_EQ((*link)->send_part("../outside", fd, 0, 4096).code(), pos::Code::kInvalidArgument);
  ASSERT_TRUE((*link)->make_dir("final").ok());
  ASSERT_TRUE((*link)->make_dir("final/gpu").ok());
  ASSERT_TRUE((*link)->send_part("final/gpu/memory.bin", fd, 4 * mib, mib).ok());
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(2 * mib)), 0);  // now shorter than the part sent
  ::close(fd);
  ASSERT_TRUE((*link)->send_dir((root_ / "src" / "gpu").string(), "final/gpu").ok());
  const pos::Status synced = (*link)->sync();
  ASSERT_FALSE(synced.ok());
  EXPECT_NE(synced.message().find("does not hold its parts"), std::string::npos) << synced.message();
}

// A restorer standing in for pos-cli: logs its arguments and what it reads, and answers as pos-cli
// restore --hold (--gpu-first) does. The server under test is restarted with it.
class MigrationRestore : public MigrationStream {
 protected:
  void SetUp() override {
    MigrationStream::SetUp();
    server_.reset();
    log_ = root_ / "cli.log";
    const fs::path cli = root_ / "fake-cli";
    std::ofstream(cli) << "#!/bin/sh\n"
                          "echo \"args $*\" >> " << log_.string() << "\n"
                          "case \"$*\" in *--gpu-first*)\n"
                          "  echo '{\"gpu_restored\":true}'; read l; echo \"rest $l\" >> " << log_.string() << "\n"
                          "  [ \"$l\" = criu ] || exit 1;;\n"
                          "esac\n"
                          "echo '{\"held\":4242}'\n"
                          "read g; echo \"go $g\" >> " << log_.string() << "\n"
                          "[ \"$g\" = go ] || exit 1\n";
    fs::permissions(cli, fs::perms::owner_all);
    pos::MigrationServerOptions o;
    o.listen = "127.0.0.1:0";
    o.secret = "a secret of at least sixteen bytes";
    o.dir = (root_ / "in").string();
    o.posd_socket = (root_ / "none.sock").string();
    o.cli = cli.string();
    auto s = pos::MigrationServer::start(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    fs::create_directories(root_ / "src" / "gpu");
    std::ofstream(root_ / "src" / "gpu" / "inventory.pb") << "inv";
    std::ofstream(root_ / "src" / "gpu-first") << "pid 4242\nuid 0\narena 1048576\ntoken 0123456789abcdef0123456789abcdef\n";
  }
  // The log once it has `lines` lines (or after 10 s).
  std::string log(size_t lines) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string text;
    for (;;) {
      text = slurp(log_);
      if (static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) >= lines ||
          std::chrono::steady_clock::now() >= until)
        return text;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  fs::path log_;
};

// The stop's GPU part is restored ahead (kPrepare), and the restore then goes on with that same
// restorer once the rest is there: one restorer, told "criu", then held and committed.
TEST_F(MigrationRestore, AGpuPartRestoredAheadIsTheRestoreThatHoldsAndCommitsTheJob) {
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "final").ok());
  ASSERT_TRUE((*link)->prepare("final", true).ok());
  EXPECT_NE(log(1).find("--gpu-first"), std::string::npos) << log(1);
  std::ofstream(root_ / "src" / "manifest") << "{}";
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "final", {"gpu", "gpu-first"}).ok());
  auto held = (*link)->restore("final", true);
  ASSERT_TRUE(held.ok()) << held.status().message();
  EXPECT_NE(held->find("{\"held\":4242}"), std::string::npos) << *held;
  ASSERT_TRUE((*link)->send_commit().ok());
  const pos::Status committed = (*link)->await_commit();
  EXPECT_TRUE(committed.ok()) << committed.message();
  const std::string text = log(3);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;  // one restorer: args, rest, go
  EXPECT_NE(text.find("rest criu\n"), std::string::npos) << text;
  EXPECT_NE(text.find("go go\n"), std::string::npos) << text;
  EXPECT_NE(text.find("--lazy"), std::string::npos) << text;
}

// The link closes after the GPU part was restored ahead (the source's stop failed): that
// restorer is told nothing more and ends (its GPU session with it); no restore follows.
TEST_F(MigrationRestore, AGpuPartRestoredAheadEndsWhenTheLinkClosesBeforeTheRestore) {
  {
    auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
    ASSERT_TRUE(link.ok()) << link.status().message();
    ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "final").ok());
    ASSERT_TRUE((*link)->prepare("final", false).ok());
    EXPECT_NE(log(1).find("--gpu-first"), std::string::npos) << log(1);
  }
  const std::string text = log(2);
  EXPECT_NE(text.find("rest \n"), std::string::npos) << text;  // end of input, not "criu"
  EXPECT_EQ(text.find("held"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
}

// A prepare without the file a restore ahead needs starts nothing: the restore does it all.
TEST_F(MigrationRestore, APrepareWithoutTheJobsParametersStartsNothingAndTheRestoreDoesItAll) {
  fs::remove(root_ / "src" / "gpu-first");
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  ASSERT_TRUE((*link)->send_dir((root_ / "src").string(), "final").ok());
  ASSERT_TRUE((*link)->prepare("final", false).ok());
  auto held = (*link)->restore("final", false);
  ASSERT_TRUE(held.ok()) << held.status().message();
  const std::string text = log(1);
  EXPECT_EQ(text.find("--gpu-first"), std::string::npos) << text;
  EXPECT_EQ(text.find("--lazy"), std::string::npos) << text;
}

TEST_F(MigrationStream, APeerWithAnotherSecretIsRefusedBeforeAnythingIsSent) {
  auto link = pos::MigrationLink::connect(server_->address(), "another secret, sixteen bytes or more");
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("secret"), std::string::npos) << link.status().message();
  EXPECT_TRUE(fs::is_empty(root_ / "in"));
  EXPECT_EQ(authenticated_.load(), 0) << "posd was told of a peer that did not authenticate";
  // The right secret: posd is told once, before the first frame is answered.
  auto good = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(good.ok()) << good.status().message();
  ASSERT_TRUE((*good)->sync().ok());
  EXPECT_EQ(authenticated_.load(), 1);
}

}  // namespace

namespace {

TEST_F(MigrationStream, ACheckNamesThePathsThisHostLacksAndRefusesLinesItDoesNotKnow) {
  auto link = pos::MigrationLink::connect(server_->address(), "a secret of at least sixteen bytes");
  ASSERT_TRUE(link.ok()) << link.status().message();
  // This process's pid is in use, but the peer is on this boot: pids are checked across boots only.
  const std::string here = "pid " + std::to_string(::getpid()) + "\npath " + root_.string() + "\npath /bin/sh\n";
  pos::Status ok = (*link)->check(here);
  EXPECT_TRUE(ok.ok()) << ok.message();
  pos::Status lacking = (*link)->check(here + "path " + (root_ / "no-such-file").string() + "\n");
  ASSERT_FALSE(lacking.ok());
  EXPECT_NE(lacking.message().find((root_ / "no-such-file").string() + " does not exist here"), std::string::npos)
      << lacking.message();
  // The stream goes on after a refused check (the source decides); a malformed check is refused.
  EXPECT_TRUE((*link)->check(here).ok());
  pos::Status bad = (*link)->check("pid 12x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("a bad pid line"), std::string::npos) << bad.message();
  EXPECT_FALSE((*link)->check("path relative/not/allowed\n").ok());
}

}  // namespace
