// parse.cc — number and size parsing for parse.h: every malformed text is an error, never a guess.
// No exceptions leave this file.
#include "pos/base/parse.h"

#include <cctype>
#include <string>

namespace pos {

StatusOr<uint64_t> parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return Status::InvalidArgument("not a size: '" + text + "'");
  double v = 0;
  try {
    v = std::stod(text.substr(0, i));
  } catch (...) {
    return Status::InvalidArgument("not a size: '" + text + "'");
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KiB" || unit == "K") mul = 1024.0;
  else if (unit == "MiB" || unit == "M") mul = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mul = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else if (unit == "TB") mul = 1e12;
  else return Status::InvalidArgument("unknown size unit '" + unit + "' in '" + text + "'");
  const double bytes = v * mul;
  if (bytes < 0 || bytes > 1.8e19) return Status::InvalidArgument("size out of range: '" + text + "'");
  return static_cast<uint64_t>(bytes);
}

}  // namespace pos
