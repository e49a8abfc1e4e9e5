// api_table.cc — the completeness check of the dispatch table (api_table.h): every API of
// POS_API_LIST has both functions, every resource type its hooks. The runtime refuses to start with a gap.
#include "pos/api_table.h"

namespace pos {

std::vector<std::string> ApiTable::gaps() const {
  std::vector<std::string> out;
  size_t n = 0;
  const ApiInfo* apis = all_apis(&n);
  for (size_t i = 0; i < n; ++i) {
    const ApiFunctions& f = get(apis[i].id);
    const std::string who(apis[i].name);
    if (f.parse == nullptr) out.push_back(who + " has no parser function");
    if (f.work == nullptr) out.push_back(who + " has no worker function");
  }
  for (std::string& g : resources_.gaps()) out.push_back(std::move(g));
  return out;
}

}  // namespace pos
