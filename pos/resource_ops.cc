// resource_ops.cc — the completeness check of the resource types' descriptors (resource_ops.h).
// The runtime runs it once at start-up; the unit tests run it on tables with a hook taken out.
#include "pos/resource_ops.h"

namespace pos {

std::vector<std::string> ResourceTable::gaps() const {
  std::vector<std::string> out;
  for (uint32_t i = 0; i < kResourceTypeCount; ++i) {
    const auto t = static_cast<ResourceType>(i);
    const ResourceOps& o = get(t);
    const std::string who = "resource type '" + std::string(resource_type_name(t)) + "'";
    if (o.restore == nullptr) out.push_back(who + " has no restore hook");
    if (o.pins == nullptr) out.push_back(who + " has no pins hook (does a live one keep its client on its device?)");
    if (o.move == nullptr) out.push_back(who + " has no move hook");
  }
  return out;
}

}  // namespace pos
