// sha256.h — SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for authenticating migration peers
// with a shared secret (docs/migration.md). Written here: no crypto library is linked for one MAC.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pos {

using Digest256 = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest256 finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Digest256 sha256(std::string_view data);
Digest256 hmac_sha256(std::string_view key, std::string_view message);

// Equal without an early exit (a MAC check must not tell how much of a guess was right).
bool equal_in_constant_time(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace pos
