// api_functions.cc — assembles the dispatch table from the per-family files and checks coverage.
// Every API in POS_API_LIST must have both functions: a gap is a POS bug, caught at start-up.
#include "pos/cuda_impl/api_functions.h"

#include <cstdio>
#include <cstdlib>

namespace pos::cuda_impl {

void fill_api_table(ApiTable* t) {
  register_device_apis(t);
  register_memory_apis(t);
  register_stream_apis(t);
  register_module_apis(t);
  register_cublas_apis(t);
  size_t n = 0;
  const ApiInfo* apis = all_apis(&n);
  for (size_t i = 0; i < n; ++i) {
    const ApiFunctions& f = t->get(apis[i].id);
    if (f.parse == nullptr || f.work == nullptr) {
      std::fprintf(stderr, "pos: internal error: %.*s lacks a parser or worker function\n",
                   (int)apis[i].name.size(), apis[i].name.data());
      std::abort();
    }
  }
}

}  // namespace pos::cuda_impl
