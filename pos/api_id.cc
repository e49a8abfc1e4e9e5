// api_id.cc — the API table behind api_id.h: names, return modes, lookup by id.
// A sorted array: lookups are a binary search, no allocation, safe from any thread.
#include "pos/api_id.h"

#include <algorithm>
#include <cstdlib>

namespace pos {
namespace {
constexpr ApiInfo kApis[] = {
#define POS_API_ROW(e, n, id, m) {ApiId::k##e, n, ReturnMode::m, std::string_view(n).starts_with("cublas")},
    POS_API_LIST(POS_API_ROW)
#undef POS_API_ROW
};
constexpr bool sorted_unique() {
  for (size_t i = 1; i < std::size(kApis); ++i)
    if (static_cast<uint32_t>(kApis[i - 1].id) >= static_cast<uint32_t>(kApis[i].id)) return false;
  return true;
}
static_assert(sorted_unique(), "POS_API_LIST must be in increasing, unique id order");
}  // namespace

const ApiInfo* find_api(uint32_t id) {
  auto it = std::lower_bound(std::begin(kApis), std::end(kApis), id,
                             [](const ApiInfo& a, uint32_t v) { return static_cast<uint32_t>(a.id) < v; });
  if (it == std::end(kApis) || static_cast<uint32_t>(it->id) != id) return nullptr;
  return it;
}

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
