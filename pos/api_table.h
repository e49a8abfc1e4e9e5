// api_table.h — dispatch from ApiId to the API's parser function and worker function, and the
// resource types' hooks (resource_ops.h). The core knows no API semantics; pos/cuda_impl fills both.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "pos/api_context.h"
#include "pos/base/api_id.h"
#include "pos/base/status.h"
#include "pos/resource_ops.h"

namespace pos {

struct ParserScope;
struct WorkerScope;

using ParserFn = Status (*)(ParserScope&, APIContext&);
using WorkerFn = Status (*)(WorkerScope&, APIContext&);

struct ApiFunctions {
  ParserFn parse = nullptr;
  WorkerFn work = nullptr;
};

class ApiTable {
 public:
  static constexpr size_t kMaxId = kApiIdLimit;
  void set(ApiId id, ApiFunctions f) { fns_[static_cast<size_t>(id)] = f; }
  const ApiFunctions& get(ApiId id) const { return fns_[static_cast<size_t>(id)]; }
  // The hooks of the resources the APIs create travel with them (the workspace and its clients
  // take one table).
  ResourceTable& resources() { return resources_; }
  const ResourceTable& resources() const { return resources_; }
  // One line per gap: an API of POS_API_LIST without its parser or worker function (by its CUDA
  // name), a resource type without a required hook (ResourceTable::gaps). Empty when complete.
  std::vector<std::string> gaps() const {
    std::vector<std::string> out;
    size_t n = 0;
    const ApiInfo* apis = all_apis(&n);
    for (size_t i = 0; i < n; ++i) {
      const ApiFunctions& f = get(apis[i].id);
      if (f.parse == nullptr) out.push_back(std::string(apis[i].name) + " has no parser function");
      if (f.work == nullptr) out.push_back(std::string(apis[i].name) + " has no worker function");
    }
    for (std::string& g : resources_.gaps()) out.push_back(std::move(g));
    return out;
  }

 private:
  std::array<ApiFunctions, kMaxId> fns_{};
  ResourceTable resources_;
};

}  // namespace pos
