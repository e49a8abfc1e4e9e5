// factory.h — the one place that turns a backend name from the config into a device backend.
// Above the backends (it knows them all); the core sees only the DeviceBackend interface.
#pragma once

#include <memory>

#include "pos/backend.h"
#include "pos/config.h"

namespace pos {

// The backend named by the config ("host"; "cuda" where built with the CUDA toolkit).
StatusOr<std::unique_ptr<DeviceBackend>> make_backend(const Config& config);

}  // namespace pos
