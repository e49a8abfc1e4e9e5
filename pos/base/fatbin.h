// fatbin.h — the fatbinary container header nvcc emits, and the checks POS applies to it.
// A module blob from a client is untrusted bytes: sizes are validated before anything keeps it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pos/base/status.h"

namespace pos {

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
inline constexpr uint32_t kFatbinWrapperMagic = 0x466243B1u;  // __fatBinC_Wrapper_t

struct FatbinHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;
  uint64_t fat_size;  // bytes after the header
};

// Results of __cudaRegisterFunction as the worker reports them.
struct FunctionRegistration {
  uint64_t handle;
  uint32_t found;
  uint32_t param_count;
  uint32_t param_bytes;
  uint32_t reserved;
};
struct RegisteredParam {
  uint32_t offset;
  uint32_t size;
  uint32_t read_only;
};

// The blob must be exactly one fatbin: magic, a sane header size, and header + fat_size bytes.
Status validate_fatbin(std::span<const std::byte> blob);
// A minimal valid fatbin with `payload` bytes of body (tests, host-only modules).
std::vector<std::byte> make_test_fatbin(size_t payload);

}  // namespace pos
