// hex.h — addresses and handles in messages, as "0x..." (every layer names addresses in errors).
// Base layer: includes nothing of POS.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace pos {

inline std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace pos
