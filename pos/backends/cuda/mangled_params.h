// mangled_params.h — which parameters of a kernel are pointers to const, read from its Itanium-mangled
// name. The driver reports offsets and sizes only; constness lets the parser record In edges, not InOut.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace pos::cudabk {

// One flag per parameter: true for `const T*` (also `const volatile T*`, `const T* __restrict__`).
// nullopt when the name is not a mangled function name this reader understands (then every pointer
// stays InOut, the safe answer). Pure function; thread-safe.
std::optional<std::vector<bool>> const_pointer_params(std::string_view mangled);

}  // namespace pos::cudabk
