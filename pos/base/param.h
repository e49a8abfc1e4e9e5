// param.h — a parameter as a caller hands it to POS: a pointer to bytes and their length.
// Base layer: the transport, the core and every front end pass calls as spans of these.
#pragma once

#include <cstdint>

namespace pos {

struct Param {
  const void* data;
  uint64_t size;
};
template <typename T>
Param param_of(const T& v) {
  return Param{&v, sizeof(T)};
}

}  // namespace pos
