// gpu_identity_test.cc — GPU UUIDs as the job reports them and a dump records them, and the GPU
// pairs a restore onto another GPU hands NVIDIA's driver (remoting/driver/gpu_identity.h), no GPU needed.
#include "remoting/driver/gpu_identity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace pos::driver {
namespace {

const std::string kA = "GPU-5b2c6f1e-0a1b-4c2d-8e3f-00112233aabb", kB = "GPU-9f00aa11-2233-4455-6677-8899aabbccdd",
                  kC = "GPU-00000000-0000-0000-0000-0000000000c0";

TEST(GpuIdentity, AUuidIsSpelledAsNvidiaSmiPrintsItAndReadBackToTheSameBytes) {
  GpuUuid u{};
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<unsigned char>(i * 17 + 3);
  const std::string t = gpu_uuid_text(u);
  EXPECT_EQ(t, "GPU-03142536-4758-697a-8b9c-adbecfe0f102");
  auto back = parse_gpu_uuid(t);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, u);
  for (const char* bad : {"", "GPU-", "MIG-03142536-4758-697a-8b9c-adbecfe0f102", "GPU-03142536-4758-697a-8b9c-adbecfe0f10",
                          "GPU-03142536-4758-697a-8b9c-adbecfe0f1020", "GPU-0314253647-58-697a-8b9c-adbecfe0f102",
                          "GPU-03142536-4758-697A-8b9c-adbecfe0f102", "GPU-03142536-4758-697a-8b9c-adbecfe0f1g2"})
    EXPECT_FALSE(parse_gpu_uuid(bad).has_value()) << bad;
}

TEST(GpuIdentity, AListOfUuidsIsSplitCheckedAndJoinedBack) {
  auto two = split_gpu_uuids(kA + "," + kB);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(*two, (std::vector<std::string>{kA, kB}));
  EXPECT_EQ(join_gpu_uuids(*two), kA + "," + kB);
  auto none = split_gpu_uuids("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(split_gpu_uuids(kA + ",").ok());
  EXPECT_FALSE(split_gpu_uuids(kA + ",," + kB).ok());
  EXPECT_FALSE(split_gpu_uuids("GPU-0").ok());
}

using Pairs = std::vector<std::pair<std::string, std::string>>;

TEST(GpuIdentity, AJobThatSawTwoGpusMovesFromOneToTheOtherByASwapThatNamesBoth) {
  auto p = gpu_remap_pairs({kA, kB}, kA, kB);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(*p, (Pairs{{kA, kB}, {kB, kA}}));
  // A third GPU it saw but does not move stays where it is, and is named too.
  p = gpu_remap_pairs({kA, kB, kC}, kB, kC);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (Pairs{{kA, kA}, {kB, kC}, {kC, kB}}));
}

TEST(GpuIdentity, AJobThatSawOnlyItsGpuMovesWithOnePairAndAGpuItNeverSawIsRefused) {
  // CUDA_VISIBLE_DEVICES showed the job one GPU: moving it names only that one.
  auto p = gpu_remap_pairs({kA}, kA, kB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (Pairs{{kA, kB}}));
  p = gpu_remap_pairs({kA, kB}, kC, kB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kInvalidArgument);
}

// A driver of two GPUs, as function pointers (captureless: the calls are C functions).
CUresult two_count(int* n) {
  *n = 2;
  return kSuccess;
}
CUresult two_get(CUdevice* d, int i) {
  *d = i;
  return i < 2 ? kSuccess : 101;
}
CUresult two_uuid(GpuUuid* u, CUdevice d) {
  u->fill(0);
  (*u)[15] = static_cast<unsigned char>(0xc0 + d);
  return kSuccess;
}
CUresult two_name(char* name, int len, CUdevice d) {
  std::snprintf(name, static_cast<size_t>(len), "%s", d == 0 ? "Model X" : "Model Y");
  return kSuccess;
}
CUresult not_initialized(int*) { return kErrorNotInitialized; }

TEST(GpuIdentity, TheDriversDevicesAreListedInOrdinalOrderAndAFailingQueryIsNamed) {
  GpuIdCalls c;
  EXPECT_EQ(list_gpus(c).status().code(), Code::kUnsupported);
  c.device_get_count = two_count, c.device_get = two_get, c.device_get_uuid = two_uuid, c.device_get_name = two_name;
  auto gpus = list_gpus(c);
  ASSERT_TRUE(gpus.ok()) << gpus.status().to_string();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].uuid, kC);
  EXPECT_EQ((*gpus)[0].name, "Model X");
  EXPECT_EQ((*gpus)[1].uuid, "GPU-00000000-0000-0000-0000-0000000000c1");
  EXPECT_EQ((*gpus)[1].name, "Model Y");
  c.device_get_count = not_initialized;
  auto none = list_gpus(c);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cuDeviceGetCount failed: CUDA driver error 3"), std::string::npos);
}

TEST(GpuIdentity, TheCallsAreLookedUpByNameAndTheOlderUuidCallServesWhenTheNewerIsMissing) {
  std::vector<std::string> asked;
  const auto calls = gpu_id_calls([&](const char* name) -> void* {
    asked.emplace_back(name);
    if (std::strcmp(name, "cuDeviceGetUuid_v2") == 0) return nullptr;  // an older driver
    if (std::strcmp(name, "cuDeviceGetUuid") == 0) return reinterpret_cast<void*>(&two_uuid);
    if (std::strcmp(name, "cuDeviceGetCount") == 0) return reinterpret_cast<void*>(&two_count);
    if (std::strcmp(name, "cuDeviceGet") == 0) return reinterpret_cast<void*>(&two_get);
    if (std::strcmp(name, "cuDeviceGetName") == 0) return reinterpret_cast<void*>(&two_name);
    return nullptr;
  });
  EXPECT_TRUE(calls.complete());
  EXPECT_EQ(calls.device_get_uuid, &two_uuid);
  EXPECT_NE(std::find(asked.begin(), asked.end(), "cuDeviceGetUuid_v2"), asked.end());
}

}  // namespace
}  // namespace pos::driver
