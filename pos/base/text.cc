// text.cc — UTF-8 validation and the printable form of client-chosen bytes (text.h), by the table
// of well-formed sequences in Unicode chapter 3 (Table 3-7), so overlong forms and surrogates fail.
#include "pos/base/text.h"

#include <cstdint>
#include <cstdio>

namespace pos {
namespace {

// The length of the well-formed UTF-8 sequence at s[i] (its code point in *cp), or 0 when the
// byte there does not start one. The second byte's range depends on the lead byte: that is what
// excludes overlong forms (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
size_t sequence_at(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c >= 0xe1 && c <= 0xec) n = 3;
  else if (c == 0xed) n = 3, hi = 0x9f;
  else if (c >= 0xee && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  else return 0;  // 80..C1 (continuation bytes, overlong 2-byte leads), F5..FF
  if (s.size() - i < n) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  uint32_t v = c & (0xff >> (n + 1));
  for (size_t k = 1; k < n; ++k) v = (v << 6) | (b(k) & 0x3f);
  *cp = v;
  return n;
}

}  // namespace

bool is_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = sequence_at(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view s, size_t max_bytes) {
  if (max_bytes < 3) max_bytes = 3;
  std::string out;
  // Where the text is cut if it turns out too long: the end of the last piece that leaves room for
  // "...". Pieces (a character or an escape) are never split.
  size_t cut = std::string::npos;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t n = sequence_at(s, i, &cp);
    char esc[8];
    std::string_view piece;
    if (n == 0) {  // not UTF-8: this byte alone, so the next one gets its own chance
      std::snprintf(esc, sizeof(esc), "\\x%02x", static_cast<uint8_t>(s[i]));
      piece = esc, n = 1;
    } else if (cp < 0x20 || cp == 0x7f) {
      std::snprintf(esc, sizeof(esc), "\\x%02x", static_cast<unsigned>(cp));
      piece = esc;
    } else if (cp >= 0x80 && cp <= 0x9f) {
      std::snprintf(esc, sizeof(esc), "\\u%04x", static_cast<unsigned>(cp));
      piece = esc;
    } else {
      piece = s.substr(i, n);
    }
    if (cut == std::string::npos && out.size() + piece.size() > max_bytes - 3) cut = out.size();
    out += piece;
    if (out.size() > max_bytes) {
      out.resize(cut);
      return out + "...";
    }
    i += n;
  }
  return out;
}

std::string fit_columns(std::string_view text, size_t columns) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool starts = (static_cast<uint8_t>(text[i]) & 0xc0) != 0x80;  // not a continuation byte
    if (starts && chars++ == columns) break;
    out += text[i];
  }
  if (chars < columns) out.append(columns - chars, ' ');
  return out;
}

std::string json_string(std::string_view s) {
  const std::string p = printable(s);
  std::string o = "\"";
  for (char ch : p) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c < 0x20 || c == 0x7f) {  // printable leaves none; kept so the function stands alone
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      o += b;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

}  // namespace pos
