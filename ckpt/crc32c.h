// crc32c.h — CRC-32C (Castagnoli), the checksum on every blob chunk and record file of an image.
// Hardware (SSE4.2) where the CPU has it, a table otherwise; both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pos::ckpt {

// Continues `crc` (0 to start) over n bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace pos::ckpt
