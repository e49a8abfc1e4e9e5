// parse.cc — number and size parsing for parse.h: every malformed text is an error, never a guess.
// Integer arithmetic only (a double would round 2^64-scale sizes); no exceptions leave this file.
#include "pos/base/parse.h"

#include <string>
#include <utility>

namespace pos {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

StatusOr<uint64_t> parse_uint(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument("'" + text + "' is not a whole number (decimal digits, or 0x and hex digits)");
  };
  const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  const unsigned base = hex ? 16 : 10;
  size_t i = hex ? 2 : 0;
  if (i == text.size()) return bad();
  uint64_t v = 0;
  for (; i < text.size(); ++i) {
    const int d = hex ? hex_value(text[i]) : (is_digit(text[i]) ? text[i] - '0' : -1);
    if (d < 0) return bad();
    if (v > (UINT64_MAX - static_cast<uint64_t>(d)) / base)
      return Status::InvalidArgument("'" + text + "' is too large (at most 18446744073709551615)");
    v = v * base + static_cast<uint64_t>(d);
  }
  return v;
}

StatusOr<uint32_t> parse_share(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument("'" + text + "' is not a GPU-time share: a per cent above 0 and at most 100, "
                                   "with at most one decimal (30%, 12.5%)");
  };
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  const size_t dot = t.find('.');
  const std::string whole = t.substr(0, dot), tenth = dot == std::string::npos ? "" : t.substr(dot + 1);
  if (whole.empty() || whole.size() > 3 || (dot != std::string::npos && tenth.size() != 1)) return bad();
  uint32_t v = 0;
  for (char c : whole + (tenth.empty() ? "0" : tenth)) {
    if (!is_digit(c)) return bad();
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (v == 0 || v > 1000) return bad();
  return v;
}

StatusOr<uint64_t> parse_size(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("'" + text + "' is not a size: " + why);
  };
  size_t i = 0;
  uint64_t whole = 0;
  bool overflow = false;
  for (; i < text.size() && is_digit(text[i]); ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) overflow = true;
    else whole = whole * 10 + d;
  }
  if (i == 0) return bad("it must start with a digit (e.g. 64, 4KiB, 1.5GiB)");
  // The fraction as digits / 10^n, kept exact; 19 digits are more than any unit can use.
  uint64_t frac = 0, frac_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t start = i;
    for (; i < text.size() && is_digit(text[i]); ++i) {
      if (frac_scale > UINT64_MAX / 10 / 10) return bad("too many digits after the '.'");
      frac = frac * 10 + static_cast<uint64_t>(text[i] - '0');
      frac_scale *= 10;
    }
    if (i == start) return bad("a '.' must be followed by digits");
  }
  std::string unit = text.substr(i);
  if (unit.size() > 1 && unit.front() == ' ') unit.erase(unit.begin());  // "4 KiB", not "64 "
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},           {"B", 1},
      {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"M", 1ull << 20}, {"MiB", 1ull << 20},
      {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"T", 1ull << 40}, {"TiB", 1ull << 40},
      {"KB", 1000ull},   {"MB", 1000000ull},  {"GB", 1000000000ull}, {"TB", 1000000000000ull},
  };
  uint64_t mul = 0;
  for (const auto& [name, m] : kUnits)
    if (unit == name) mul = m;
  if (mul == 0) {
    if (!unit.empty() && (unit[0] == '.' || is_digit(unit[0]))) return bad("more than one '.'");
    return bad("unknown unit '" + unit + "' (B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB, TB)");
  }
  // whole * mul + frac * mul / frac_scale, in 128 bits: the fraction must come out as whole bytes.
  const unsigned __int128 frac_bytes = static_cast<unsigned __int128>(frac) * mul;
  if (frac_bytes % frac_scale != 0) return bad("that is not a whole number of bytes");
  const unsigned __int128 bytes = static_cast<unsigned __int128>(whole) * mul + frac_bytes / frac_scale;
  if (overflow || bytes > UINT64_MAX) return bad("it is larger than 2^64 - 1 bytes");
  return static_cast<uint64_t>(bytes);
}

}  // namespace pos
