// control_client.h — the operator's side of posd's control socket (pos-cli ps and, later, dump,
// restore, migrate). Never linked into the client library that runs inside applications.
#pragma once

#include <string>

#include "pos/base/status.h"

namespace pos {

// One control request ("ps", "ps-table") to posd; returns its reply text.
StatusOr<std::string> posd_control(const std::string& socket_path, const std::string& command);

}  // namespace pos
