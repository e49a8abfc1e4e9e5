// job_manifest_test.cc — DIR/manifest of a pos-cli dump image: what dump writes, restore reads back
// the same; every malformed manifest is refused with what is wrong (restore changes nothing then).
#include "remoting/server/job_manifest.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace pos {
namespace {

JobManifest sample() {
  JobManifest m;
  m.pid = 4242, m.uid = 1000;
  m.job = "train \"quoted\" \\ job";
  m.socket = "/run/pos/posd.sock";
  m.permit = "/data/img/.reattach";
  m.arena_bytes = 256ull << 20;
  m.leave_running = true, m.shell_job = false;
  m.cut = 123456789012ull, m.gpu_bytes = 8843757572ull, m.handles = 51;
  m.gpu_image_id = "0123456789abcdef0123456789abcdef";
  m.prev = "../pre";
  m.gpu_bytes_referenced = 77;
  m.criu_track_mem = true, m.criu_parent = true;
  return m;
}

void expect_refused(const std::string& text, const std::string& why) {
  auto m = parse_manifest(text);
  ASSERT_FALSE(m.ok()) << text;
  EXPECT_EQ(m.status().code(), Code::kCorrupt) << m.status().to_string();
  EXPECT_NE(m.status().message().find(why), std::string::npos) << m.status().message();
}

TEST(JobManifest, WhatADumpWritesARestoreReadsBackTheSame) {
  const JobManifest m = sample();
  auto back = parse_manifest(manifest_json(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->pid, m.pid);
  EXPECT_EQ(back->uid, m.uid);
  EXPECT_EQ(back->job, m.job);
  EXPECT_EQ(back->socket, m.socket);
  EXPECT_EQ(back->permit, m.permit);
  EXPECT_EQ(back->arena_bytes, m.arena_bytes);
  EXPECT_EQ(back->leave_running, true);
  EXPECT_EQ(back->shell_job, false);
  EXPECT_EQ(back->cut, m.cut);
  EXPECT_EQ(back->gpu_bytes, m.gpu_bytes);
  EXPECT_EQ(back->handles, m.handles);
  EXPECT_EQ(back->gpu_image_id, m.gpu_image_id);
  EXPECT_EQ(back->gpu, "gpu");
  EXPECT_EQ(back->criu, "criu");
  EXPECT_EQ(back->kind, "dump");
  EXPECT_EQ(back->prev, "../pre");
  EXPECT_EQ(back->gpu_bytes_referenced, 77u);
  EXPECT_TRUE(back->criu_track_mem);
  EXPECT_TRUE(back->criu_parent);
}

TEST(JobManifest, APreDumpNeedsNoArenaPermitOrCriuPartButADumpDoes) {
  JobManifest m = sample();
  m.kind = "pre-dump";
  m.arena_bytes = 0, m.permit.clear(), m.criu.clear();
  auto back = parse_manifest(manifest_json(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->kind, "pre-dump");
  EXPECT_EQ(back->criu, "");
  m.kind = "dump";
  m.arena_bytes = 1;
  m.permit = "/x/.reattach";
  expect_refused(manifest_json(m), "outside its directory");
  m.kind = "snapshot";
  expect_refused(manifest_json(m), "none of \"dump\", \"pre-dump\", \"driver-dump\", \"driver-pre-dump\"");
  m = sample();
  m.prev = "/abs/prev";
  expect_refused(manifest_json(m), "not a relative, printable path");
}

TEST(JobManifest, AnInProcessJobsDumpNeedsItsControlSocketAndARelativePreviousImageIfAny) {
  JobManifest m = sample();
  m.kind = "driver-dump";
  m.prev.clear();
  m.permit.clear();
  m.arena_bytes = 0;
  m.socket = "/run/pos-jobs/4242.sock";
  auto back = parse_manifest(manifest_json(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->kind, "driver-dump");
  EXPECT_EQ(back->socket, m.socket);
  JobManifest bad = m;
  bad.prev = "/abs/pre";
  expect_refused(manifest_json(bad), "not a relative, printable path");
  bad = m;
  bad.prev = "../pre";  // an incremental one
  EXPECT_TRUE(parse_manifest(manifest_json(bad)).ok());
  bad = m;
  bad.socket = "relative.sock";
  expect_refused(manifest_json(bad), "no control socket");
  bad = m;
  bad.gpu = "other";
  expect_refused(manifest_json(bad), "other parts than gpu and criu, or no control socket");
  // Its GPU-only pre-dump: no CPU part at all; a migration round's also holds the job's pages
  // (criu); no other part is taken.
  m.kind = "driver-pre-dump";
  m.criu.clear();
  back = parse_manifest(manifest_json(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->kind, "driver-pre-dump");
  EXPECT_TRUE(back->criu.empty());
  m.criu = "criu";
  back = parse_manifest(manifest_json(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->criu, "criu");
  bad = m;
  bad.criu = "cpu";
  expect_refused(manifest_json(bad), "other parts than gpu and criu, or no control socket");
  bad = m;
  bad.socket.clear();
  expect_refused(manifest_json(bad), "other parts than gpu and criu, or no control socket");
}

// The GPUs of an in-process job's dump, by UUID: written and read back; absent in an older image's
// manifest and in a posd job's (read as unknown); a malformed list refused.
TEST(JobManifest, AnInProcessJobsGpusAreReadBackAndAManifestWithoutThemReadsAsUnknown) {
  JobManifest m = sample();
  m.kind = "driver-dump";
  m.prev.clear(), m.permit.clear();
  m.arena_bytes = 0;
  m.socket = "/run/pos-jobs/4242.sock";
  m.gpu_uuids = "GPU-5b2c6f1e-0a1b-4c2d-8e3f-00112233aabb";
  m.gpus_visible = m.gpu_uuids + ",GPU-9f00aa11-2233-4455-6677-8899aabbccdd";
  m.gpu_name = "NVIDIA H100 80GB HBM3";
  auto back = parse_manifest(manifest_json(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->gpu_uuids, m.gpu_uuids);
  EXPECT_EQ(back->gpus_visible, m.gpus_visible);
  EXPECT_EQ(back->gpu_name, m.gpu_name);
  EXPECT_EQ(manifest_json(*back), manifest_json(m));  // decode, encode: the same bytes
  // An older pos-cli's manifest has none of the three keys: unknown, not an error.
  const std::string with = manifest_json(m);
  const std::string without = with.substr(0, with.find(",\"gpu_uuids\":")) + "}\n";
  back = parse_manifest(without);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->gpu_uuids.empty() && back->gpus_visible.empty() && back->gpu_name.empty());
  // A posd job's manifest does not carry them at all.
  EXPECT_EQ(manifest_json(sample()).find("gpu_uuids"), std::string::npos);
  for (const char* bad : {"GPU-5B2C6F1E-0A1B-4C2D-8E3F-00112233AABB", "5b2c6f1e-0a1b-4c2d-8e3f-00112233aabb",
                          "GPU-5b2c6f1e-0a1b-4c2d-8e3f-00112233aabb,", "GPU-5b2c6f1e0a1b4c2d8e3f00112233aabb",
                          "GPU-5b2c6f1e-0a1b-4c2d-8e3f-00112233aabb;GPU-9f00aa11-2233-4455-6677-8899aabbccdd"}) {
    JobManifest b = m;
    b.gpu_uuids = bad;
    expect_refused(manifest_json(b), "not a comma-separated list of GPU-");
  }
  std::string number = with;
  number.replace(number.find("\"gpu_name\":\""), 12, "\"gpu_name\":7,\"x\":\"");
  expect_refused(number, "\"gpu_name\" (a string) is missing or of another type");
}

TEST(JobManifest, MalformedTextIsRefusedSayingWhatIsWrong) {
  const std::string good = manifest_json(sample());
  expect_refused("", "does not start with '{'");
  expect_refused(good + "x", "bytes follow the object");
  expect_refused(good.substr(0, good.size() / 2), "");
  std::string dup = good;
  dup.insert(1, "\"pid\":1,");
  expect_refused(dup, "\"pid\" appears twice");
  std::string wrong_type = good;
  wrong_type.replace(wrong_type.find("\"pid\":4242"), 10, "\"pid\":\"4242\"");
  expect_refused(wrong_type, "\"pid\" (a number) is missing or of another type");
  std::string escape = good;
  escape.replace(escape.find("posd.sock"), 9, "posd\\u0041");
  expect_refused(escape, "escaped character");
  std::string huge = good;
  huge.replace(huge.find("\"handles\":51"), 12, "\"handles\":123456789012345678901");
  expect_refused(huge, "too large");
  expect_refused(std::string(70 * 1024, ' '), "larger than 64 KiB");
}

TEST(JobManifest, AManifestThatNamesNoJobOrPartsOutsideItsDirectoryIsRefused) {
  JobManifest m = sample();
  m.format = 1;
  expect_refused(manifest_json(m), "format 1");
  m = sample();
  m.pid = 0;
  expect_refused(manifest_json(m), "no valid pid");
  m = sample();
  m.arena_bytes = 0;
  expect_refused(manifest_json(m), "no session arena");
  for (const char* part : {"..", "../etc", "", "."}) {
    m = sample();
    m.criu = part;
    expect_refused(manifest_json(m), "outside its directory");
  }
  m = sample();
  m.permit = "relative/.reattach";
  expect_refused(manifest_json(m), "not an absolute path");
}

// The CPU parts CRIU reads pages from (through `parent` links) must be this job's own images:
// a chain of them passes; a link into another job's image, into a directory with no manifest, a
// CPU part that is itself a link elsewhere, and a loop are refused, naming what is wrong.
TEST(JobManifest, ACpuPartReadsPagesOnlyThroughImagesOfTheSameJob) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("pos-criu-chain-" + std::to_string(::getpid()));
  fs::remove_all(root);
  JobManifest m = sample();
  m.criu = "criu";
  auto image = [&](const std::string& name, uint32_t uid, const std::string& parent) {
    fs::create_directories(root / name / "criu");
    JobManifest x = m;
    x.uid = uid;
    ASSERT_TRUE(write_small_file((root / name / "manifest").string(), manifest_json(x), 0600).ok());
    if (!parent.empty()) fs::create_directory_symlink(parent, root / name / "criu" / "parent");
  };
  image("cp-1", 1000, "");
  image("cp-2", 1000, "../../cp-1/criu");
  image("cp-3", 1000, "../../cp-2/criu");
  EXPECT_TRUE(check_criu_parents((root / "cp-3").string(), m).ok());
  // Another user's image in the chain (the same pid, another uid).
  image("theirs", 2000, "");
  image("mine", 1000, "../../theirs/criu");
  Status s = check_criu_parents((root / "mine").string(), m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not the CPU part of an image of this job"), std::string::npos) << s.message();
  // A directory that is no image at all.
  fs::create_directories(root / "loose" / "criu");
  image("stray", 1000, "../../loose/criu");
  EXPECT_FALSE(check_criu_parents((root / "stray").string(), m).ok());
  // The CPU part itself a link to another image's.
  fs::create_directories(root / "linked");
  ASSERT_TRUE(write_small_file((root / "linked" / "manifest").string(), manifest_json(m), 0600).ok());
  fs::create_directory_symlink("../theirs/criu", root / "linked" / "criu");
  s = check_criu_parents((root / "linked").string(), m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("leads outside its image"), std::string::npos) << s.message();
  // A loop: two images each other's parent.
  image("a", 1000, "../../b/criu");
  image("b", 1000, "../../a/criu");
  s = check_criu_parents((root / "a").string(), m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("more than 64"), std::string::npos) << s.message();
  fs::remove_all(root);
}

}  // namespace
}  // namespace pos
