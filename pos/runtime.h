// runtime.h — assembles a working POS: the core's workspace with the CUDA API set (pos/cuda_impl)
// and the device backend the config names (pos/backends). The one file that ties the layers together.
#pragma once

#include <memory>

#include "pos/backend.h"
#include "pos/config.h"
#include "pos/workspace.h"

namespace pos {

// The CUDA API set's dispatch table, filled and checked once (every API has a parser and a worker
// function, every resource type its image and device hooks: a gap stops POS at start-up).
const ApiTable& cuda_api_table();

// A workspace on the backend the config names (sets the log level from the config too).
StatusOr<std::unique_ptr<POSWorkspace>> create_workspace(const Config& config);
// A workspace on a backend the caller brings (tests, embedders).
StatusOr<std::unique_ptr<POSWorkspace>> create_workspace(const Config& config, std::unique_ptr<DeviceBackend> backend);

}  // namespace pos
