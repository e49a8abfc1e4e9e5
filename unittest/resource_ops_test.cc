// resource_ops_test.cc — the descriptors of the resource types and APIs are complete: the real
// table has every hook, and the start-up check names a type or an API whose hook is taken out.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pos/api_table.h"
#include "pos/runtime.h"

namespace pos {
namespace {

std::vector<ResourceType> all_types() {
  std::vector<ResourceType> out;
  for (uint32_t i = 0; i < kResourceTypeCount; ++i) out.push_back(static_cast<ResourceType>(i));
  return out;
}

TEST(ResourceOps, EveryResourceTypeHasRestorePinsAndMoveHooksInTheRealTable) {
  const ResourceTable& t = cuda_api_table().resources();
  for (ResourceType type : all_types()) {
    const ResourceOps& o = t.get(type);
    EXPECT_NE(o.restore, nullptr) << resource_type_name(type);
    EXPECT_NE(o.pins, nullptr) << resource_type_name(type);
    EXPECT_NE(o.move, nullptr) << resource_type_name(type);
  }
  EXPECT_TRUE(t.gaps().empty());
}

TEST(ResourceOps, TheRealTableHasNoGapsAtAll) {
  std::string all;
  for (const std::string& g : cuda_api_table().gaps()) all += g + "\n";
  EXPECT_EQ(all, "");
}

TEST(ResourceOps, TypesWithDeviceBytesAreBuffersAndVariables) {
  const ResourceTable& t = cuda_api_table().resources();
  for (ResourceType type : all_types()) {
    const DeviceBytes want = type == ResourceType::kMemory ? DeviceBytes::kBuffer
                             : type == ResourceType::kVar  ? DeviceBytes::kVariable
                                                           : DeviceBytes::kNone;
    EXPECT_EQ(t.get(type).bytes, want) << resource_type_name(type);
  }
}

// The real table with one hook of `type` removed (`drop` clears it) reports exactly one gap, which
// names the type and the hook.
template <typename Drop>
void expect_one_gap(ResourceType type, Drop drop, const std::string& hook) {
  ResourceTable t = cuda_api_table().resources();
  ResourceOps o = t.get(type);
  drop(o);
  t.set(type, o);
  const std::vector<std::string> gaps = t.gaps();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_NE(gaps[0].find("'" + std::string(resource_type_name(type)) + "'"), std::string::npos) << gaps[0];
  EXPECT_NE(gaps[0].find(hook), std::string::npos) << gaps[0];
}

TEST(ResourceOps, AMissingRestoreHookIsReportedNamingItsType) {
  expect_one_gap(ResourceType::kEvent, [](ResourceOps& o) { o.restore = nullptr; }, "restore");
}

TEST(ResourceOps, AMissingMoveHookIsReportedNamingItsType) {
  expect_one_gap(ResourceType::kModule, [](ResourceOps& o) { o.move = nullptr; }, "move");
}

TEST(ResourceOps, AnEmptyTableReportsEveryTypeThreeTimes) {
  const std::vector<std::string> gaps = ResourceTable{}.gaps();
  EXPECT_EQ(gaps.size(), 3u * kResourceTypeCount);
  for (ResourceType type : all_types()) {
    const std::string name = "'" + std::string(resource_type_name(type)) + "'";
    size_t n = 0;
    for (const std::string& g : gaps) n += g.find(name) != std::string::npos;
    EXPECT_EQ(n, 3u) << name;
  }
}

TEST(ApiTableGaps, AnApiWithoutItsWorkerFunctionIsReportedByItsCudaName) {
  ApiTable t = cuda_api_table();
  t.set(ApiId::kFuncSetAttribute, {t.get(ApiId::kFuncSetAttribute).parse, nullptr});
  const std::vector<std::string> gaps = t.gaps();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0], "cudaFuncSetAttribute has no worker function");
}

TEST(ApiTableGaps, AResourceGapShowsInTheWholeTablesCheck) {
  ApiTable t = cuda_api_table();
  ResourceOps o = t.resources().get(ResourceType::kCublas);
  o.restore = nullptr;
  t.resources().set(ResourceType::kCublas, o);
  const std::vector<std::string> gaps = t.gaps();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_NE(gaps[0].find("'cublas'"), std::string::npos) << gaps[0];
}

}  // namespace
}  // namespace pos
