// text_test.cc — pos/base/text: which bytes are UTF-8, how client-chosen names are made printable,
// fitted to a table column and quoted for JSON (job names in images and in `pos-cli ps`).
#include <gtest/gtest.h>

#include <string>

#include "pos/base/text.h"

namespace pos {
namespace {

TEST(Utf8Test, AcceptsAsciiAndEveryLengthOfWellFormedSequence) {
  EXPECT_TRUE(is_utf8(""));
  EXPECT_TRUE(is_utf8("mlp_train"));
  EXPECT_TRUE(is_utf8("caf\xc3\xa9"));                    // é, 2 bytes
  EXPECT_TRUE(is_utf8("\xe2\x82\xac"));                   // €, 3 bytes
  EXPECT_TRUE(is_utf8("\xed\x9f\xbf"));                   // U+D7FF, just below the surrogates
  EXPECT_TRUE(is_utf8("\xee\x80\x80"));                   // U+E000, just above them
  EXPECT_TRUE(is_utf8("\xf0\x9f\x98\x80"));               // 😀, 4 bytes
  EXPECT_TRUE(is_utf8("\xf4\x8f\xbf\xbf"));               // U+10FFFF, the last code point
  EXPECT_TRUE(is_utf8(std::string("a\0b", 3)));           // NUL is UTF-8 (printable escapes it)
}

TEST(Utf8Test, RefusesStrayBytesOverlongFormsSurrogatesTruncationAndCodePointsAbove10FFFF) {
  EXPECT_FALSE(is_utf8("caf\xe9"));                       // Latin-1 é
  EXPECT_FALSE(is_utf8("\x80"));                          // a lone continuation byte
  EXPECT_FALSE(is_utf8("\xc0\xaf"));                      // overlong '/'
  EXPECT_FALSE(is_utf8("\xc1\xbf"));                      // overlong
  EXPECT_FALSE(is_utf8("\xe0\x80\xaf"));                  // overlong, 3 bytes
  EXPECT_FALSE(is_utf8("\xf0\x80\x80\xaf"));              // overlong, 4 bytes
  EXPECT_FALSE(is_utf8("\xed\xa0\x80"));                  // U+D800, a surrogate
  EXPECT_FALSE(is_utf8("\xed\xbf\xbf"));                  // U+DFFF
  EXPECT_FALSE(is_utf8("\xf4\x90\x80\x80"));              // U+110000
  EXPECT_FALSE(is_utf8("\xf5\x80\x80\x80"));              // no such lead byte
  EXPECT_FALSE(is_utf8("\xff"));
  EXPECT_FALSE(is_utf8("\xe2\x82"));                      // truncated at the end
  EXPECT_FALSE(is_utf8("\xe2\x82x"));                     // truncated before another character
  EXPECT_FALSE(is_utf8("\xf0\x9f\x98"));
}

TEST(PrintableTest, KeepsWellFormedTextIncludingMultibyteCharactersAsItIs) {
  for (const char* s : {"", "mlp_train", "job \"two\" with \\ and spaces", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                        "\xc2\xa0non-breaking", "\xf4\x8f\xbf\xbf"})
    EXPECT_EQ(printable(s), s);
}

TEST(PrintableTest, EscapesBytesThatAreNotUtf8OneByOne) {
  EXPECT_EQ(printable("caf\xe9"), "caf\\xe9");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                  // overlong
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");         // surrogate
  EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");                  // truncated
  EXPECT_EQ(printable("\xe2\x82\xc3\xa9"), "\\xe2\\x82\xc3\xa9");  // truncated, then a good é
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
}

TEST(PrintableTest, EscapesC0ControlsDelAndC1Controls) {
  EXPECT_EQ(printable("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(printable("a\nb\tc\rd\a"), "a\\x0ab\\x09c\\x0dd\\x07");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("\x7f"), "\\x7f");
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\u009b2J");  // CSI as a C1 control
  EXPECT_EQ(printable("\xc2\x80\xc2\x9f"), "\\u0080\\u009f");
}

TEST(PrintableTest, ItsResultIsUtf8WithoutControlsAndSanitizingTwiceChangesNothing) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  all += "\xe2\x82\xac\xf0\x9f\x98\x80\xc2\x85";
  const std::string p = printable(all);
  EXPECT_TRUE(is_utf8(p));
  for (unsigned char c : p) EXPECT_TRUE(c >= 0x20 && c != 0x7f) << static_cast<int>(c);
  EXPECT_EQ(p.find("\xc2\x85"), std::string::npos);
  EXPECT_EQ(printable(p), p);
}

TEST(PrintableTest, BoundsTheLengthCuttingBetweenCharactersAndEscapes) {
  EXPECT_EQ(printable("abcdefgh", 8), "abcdefgh");
  EXPECT_EQ(printable("abcdefghi", 8), "abcde...");
  // An escape or a multibyte character is never cut in half.
  EXPECT_EQ(printable("abcd\xff", 8), "abcd\\xff");  // fits exactly
  EXPECT_EQ(printable("abcde\xff", 8), "abcde...");
  EXPECT_EQ(printable("abcd\xe2\x82\xac\xe2\x82\xac", 8), "abcd...");
  EXPECT_EQ(printable("ab\xe2\x82\xac\xe2\x82\xacx", 8), "ab\xe2\x82\xac...");
  const std::string longest = printable(std::string(1000, '\xe9'), 256);
  EXPECT_LE(longest.size(), 256u);
  EXPECT_TRUE(is_utf8(longest));
  EXPECT_EQ(longest.substr(longest.size() - 3), "...");
  EXPECT_EQ(printable(longest, 256), longest);
}

TEST(FitColumnsTest, CutsAndPadsByCharactersNotBytes) {
  EXPECT_EQ(fit_columns("abc", 5), "abc  ");
  EXPECT_EQ(fit_columns("abcdef", 4), "abcd");
  EXPECT_EQ(fit_columns("caf\xc3\xa9", 5), "caf\xc3\xa9 ");
  EXPECT_EQ(fit_columns("\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac", 2), "\xe2\x82\xac\xe2\x82\xac");
  EXPECT_TRUE(is_utf8(fit_columns("\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 1)));
}

TEST(JsonStringTest, QuotesEscapesAndNeverEmitsControlsOrBytesThatAreNotUtf8) {
  EXPECT_EQ(json_string("job"), "\"job\"");
  EXPECT_EQ(json_string("job \"two\""), "\"job \\\"two\\\"\"");
  EXPECT_EQ(json_string("a\\b"), "\"a\\\\b\"");
  EXPECT_EQ(json_string("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
  // What printable shows, quoted: the escape's backslash is itself escaped for JSON.
  EXPECT_EQ(json_string("\x1b[2J\a\n\xe9"), "\"\\\\x1b[2J\\\\x07\\\\x0a\\\\xe9\"");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string j = json_string(all);
  EXPECT_TRUE(is_utf8(j));
  for (unsigned char c : j) EXPECT_TRUE(c >= 0x20 && c != 0x7f) << static_cast<int>(c);
}

}  // namespace
}  // namespace pos
