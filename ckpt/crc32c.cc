// crc32c.cc — CRC-32C with three interleaved hardware streams (the crc32 instruction has a 3-cycle
// latency), combined by a table-driven shift; a byte table where SSE4.2 is missing.
#include "ckpt/crc32c.h"

#include <array>
#include <cstring>

namespace pos::ckpt {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();

uint32_t crc_table(const uint8_t* p, size_t n, uint32_t crc) {
  while (n--) crc = kTable[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

// Multiplication in GF(2) modulo the polynomial (reflected), for shifting a crc past zeros.
uint32_t gf2_mul(uint32_t a, uint32_t b) {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & 0x80000000u) r ^= b;
    a <<= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return r;
}
// x^(8n) mod P in reflected form: the factor that appends n zero bytes to a crc state.
uint32_t zeros_operator(size_t n) {
  uint32_t result = 0x80000000u;  // x^0
  uint32_t sq = 0x00800000u;      // x^8 (one byte)
  while (n) {
    if (n & 1) result = gf2_mul(result, sq);
    sq = gf2_mul(sq, sq);
    n >>= 1;
  }
  return result;
}

constexpr size_t kStripe = 8192;  // bytes per interleaved stream per round

bool have_sse42() {
  static const bool v = __builtin_cpu_supports("sse4.2");
  return v;
}

__attribute__((target("sse4.2"))) uint32_t crc_hw(const uint8_t* p, size_t n, uint32_t crc) {
  static const uint32_t kShift = zeros_operator(kStripe);
  uint64_t c0 = crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c0 = __builtin_ia32_crc32qi(static_cast<uint32_t>(c0), *p++);
    --n;
  }
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t a, b, d;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kStripe + i, 8);
      std::memcpy(&d, p + 2 * kStripe + i, 8);
      c0 = __builtin_ia32_crc32di(c0, a);
      c1 = __builtin_ia32_crc32di(c1, b);
      c2 = __builtin_ia32_crc32di(c2, d);
    }
    // crc(A||B) = shift(crc(A), |B|) ^ crc0(B), where crc0 starts from 0.
    c0 = gf2_mul(static_cast<uint32_t>(c0), kShift) ^ c1;
    c0 = gf2_mul(static_cast<uint32_t>(c0), kShift) ^ c2;
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= 8) {
    uint64_t a;
    std::memcpy(&a, p, 8);
    c0 = __builtin_ia32_crc32di(c0, a);
    p += 8;
    n -= 8;
  }
  while (n--) c0 = __builtin_ia32_crc32qi(static_cast<uint32_t>(c0), *p++);
  return static_cast<uint32_t>(c0);
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  crc = have_sse42() ? crc_hw(p, n, crc) : crc_table(p, n, crc);
  return ~crc;
}

}  // namespace pos::ckpt
