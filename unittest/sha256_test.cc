// sha256_test.cc — pos/base/sha256 against the published vectors (FIPS 180-4 examples, RFC 4231's
// HMAC-SHA256 cases), which the migration handshake's MACs depend on.
#include <gtest/gtest.h>

#include <string>

#include "pos/base/sha256.h"

namespace pos {
namespace {

std::string hex(const Digest256& d) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) s += k[b >> 4], s += k[b & 15];
  return s;
}

TEST(Sha256Test, MatchesTheStandardsExamples) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a', fed in uneven pieces: the block boundary handling.
  Sha256 s;
  const std::string piece(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, piece.size());
    s.update(piece.data(), n);
    left -= n;
  }
  EXPECT_EQ(hex(s.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, HmacMatchesRfc4231IncludingAKeyLongerThanABlock) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Sha256Test, ConstantTimeCompareTellsEqualFromDifferentAtAnyByte) {
  const Digest256 a = sha256("x");
  for (size_t i = 0; i < a.size(); ++i) {
    Digest256 b = a;
    b[i] ^= 1;
    EXPECT_FALSE(equal_in_constant_time(a.data(), b.data(), a.size())) << i;
  }
  EXPECT_TRUE(equal_in_constant_time(a.data(), a.data(), a.size()));
}

}  // namespace
}  // namespace pos
