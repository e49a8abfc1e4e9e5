// parse.h — strict parsing of numbers and sizes from text a user or a client wrote.
// Base layer: the config, the CLI and the client library (POS_ARENA_SIZE) read values through here.
#pragma once

#include <cstdint>
#include <string>

#include "pos/base/status.h"

namespace pos {

// "64", "4KiB", "16GiB", "1.5GB" → bytes.
StatusOr<uint64_t> parse_size(const std::string& text);

}  // namespace pos
