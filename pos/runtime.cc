// runtime.cc — the assembly of runtime.h: the CUDA API table built once, the backend from the factory.
// Everything above the core that wants a workspace (posd, the in-process runtime, tests) comes here.
#include "pos/runtime.h"

#include <cstdio>
#include <cstdlib>

#include "pos/backends/factory.h"
#include "pos/base/log.h"
#include "pos/cuda_impl/api_functions.h"

namespace pos {

const ApiTable& cuda_api_table() {
  static const ApiTable table = [] {
    ApiTable t;
    cuda_impl::fill_api_table(&t);
    // A gap is a POS bug (an API registered without its functions, a resource type without its
    // restore or device-move hooks): refuse to run rather than lose a client's state later.
    const std::vector<std::string> gaps = t.gaps();
    for (const std::string& g : gaps) std::fprintf(stderr, "pos: internal error: %s\n", g.c_str());
    if (!gaps.empty()) std::abort();
    return t;
  }();
  return table;
}

StatusOr<std::unique_ptr<POSWorkspace>> create_workspace(const Config& config) {
  set_log_level(config.log_level);
  auto backend = make_backend(config);
  if (!backend.ok()) return backend.status();
  return POSWorkspace::create(config, std::move(backend.value()), cuda_api_table());
}

StatusOr<std::unique_ptr<POSWorkspace>> create_workspace(const Config& config, std::unique_ptr<DeviceBackend> backend) {
  return POSWorkspace::create(config, std::move(backend), cuda_api_table());
}

}  // namespace pos
