// parse.h — strict parsing of numbers and sizes from text a user or a client wrote.
// Base layer: the config, the CLI and the client library (POS_ARENA_SIZE) read values through here.
#pragma once

#include <cstdint>
#include <string>

#include "pos/base/status.h"

namespace pos {

// "64", "4KiB", "16GiB", "1.5GB" → bytes. The number is decimal digits with at most one '.'
// between digits; the unit (optional; a space may precede it) is B, K/KiB .. T/TiB (powers of
// 1024) or KB .. TB (powers of 1000). Signs, a second '.', a fraction that is not a whole number of
// bytes, anything after the unit and values past 2^64 - 1 are errors, never rounded or cut off.
StatusOr<uint64_t> parse_size(const std::string& text);

// "4096" or "0x110000000000" → the value. Decimal digits, or 0x / 0X and hex digits; nothing else
// (no sign, no spaces, no suffix). Values past 2^64 - 1 are errors.
StatusOr<uint64_t> parse_uint(const std::string& text);

// A share of a GPU's time as people write it: "30%", "30", "12.5%" (per cent, at most one
// decimal) → per mille (300, 300, 125). Above 0 and at most 100; anything else is an error.
StatusOr<uint32_t> parse_share(const std::string& text);

}  // namespace pos
