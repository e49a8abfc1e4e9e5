// api_id.cc — the API table behind api_id.h: names, return modes, lookup by id.
// A sorted array plus a compile-time index by id: O(1) lookups, no allocation, safe from any thread.
#include "pos/base/api_id.h"

#include <algorithm>
#include <cstdlib>

namespace pos {
namespace {
constexpr ApiInfo kApis[] = {
#define POS_API_ROW(e, n, id, m, d) {ApiId::k##e, n, ReturnMode::m, Delivery::d, std::string_view(n).starts_with("cublas")},
    POS_API_LIST(POS_API_ROW)
#undef POS_API_ROW
};
constexpr bool sorted_unique() {
  for (size_t i = 1; i < std::size(kApis); ++i)
    if (static_cast<uint32_t>(kApis[i - 1].id) >= static_cast<uint32_t>(kApis[i].id)) return false;
  return true;
}
static_assert(sorted_unique(), "POS_API_LIST must be in increasing, unique id order");
// A posted call returns before posd answers: it cannot carry a result the caller waits for.
constexpr bool posted_calls_return_at_parse() {
  for (const ApiInfo& a : kApis)
    if (a.delivery == Delivery::kPosted && a.mode != ReturnMode::kParse) return false;
  return true;
}
static_assert(posted_calls_return_at_parse(), "a kPosted API must be kParse");
}  // namespace

// Ids are small (< kApiIdLimit): a direct index, built at compile time, answers every lookup in O(1).
constexpr uint32_t kMaxApiId = kApiIdLimit;
struct ApiIndex {
  const ApiInfo* by_id[kMaxApiId] = {};
  constexpr ApiIndex() {
    for (const ApiInfo& a : kApis) by_id[static_cast<uint32_t>(a.id)] = &a;
  }
};
constexpr ApiIndex kIndex;
static_assert(static_cast<uint32_t>(kApis[std::size(kApis) - 1].id) < kMaxApiId, "api id beyond the index");

const ApiInfo* find_api(uint32_t id) { return id < kMaxApiId ? kIndex.by_id[id] : nullptr; }

const ApiInfo& api_info(ApiId id) {
  const ApiInfo* a = find_api(static_cast<uint32_t>(id));
  if (a == nullptr) std::abort();  // an ApiId value outside the table is a POS bug
  return *a;
}

std::string_view api_name(ApiId id) {
  const ApiInfo* a = find_api(static_cast<uint32_t>(id));
  return a ? a->name : std::string_view("unknown-api");
}

const ApiInfo* all_apis(size_t* count) {
  *count = std::size(kApis);
  return kApis;
}

}  // namespace pos
