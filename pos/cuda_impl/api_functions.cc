// api_functions.cc — assembles the dispatch table from the per-family files and the resource hooks.
// The runtime checks it (ApiTable::gaps): a missing function or hook stops POS at start-up.
#include "pos/cuda_impl/api_functions.h"

namespace pos::cuda_impl {

void fill_api_table(ApiTable* t) {
  register_device_apis(t);
  register_memory_apis(t);
  register_stream_apis(t);
  register_module_apis(t);
  register_cublas_apis(t);
  register_resource_hooks(&t->resources());
}

}  // namespace pos::cuda_impl
