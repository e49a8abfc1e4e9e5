// host_backend.h — the host device backend: device memory is host RAM mapped at the exact
// addresses the parser chose, streams are executor threads, kernels come from the host kernel library.
// It is CI's test double for the CUDA backend, never the product.
#pragma once

#include <memory>

#include "pos/backend.h"
#include "pos/config.h"

namespace pos::host {

std::unique_ptr<DeviceBackend> make_host_backend(const Config& config);

}  // namespace pos::host
