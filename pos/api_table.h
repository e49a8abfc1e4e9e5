// api_table.h — dispatch from ApiId to the API's parser function and worker function.
// The core knows no API semantics; pos/cuda_impl fills the table (one parser + one worker per API).
#pragma once

#include <array>

#include "pos/api_context.h"
#include "pos/base/api_id.h"
#include "pos/base/status.h"

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

 private:
  std::array<ApiFunctions, kMaxId> fns_{};
};

}  // namespace pos
