// log.cc — the log sink: one line per call, written atomically with a single fprintf.
// stderr is unbuffered, so lines from several client threads do not interleave mid-line.
#include "pos/base/log.h"

#include <cstdarg>

namespace pos {

std::atomic<int> g_log_level{static_cast<int>(LogLevel::kWarn)};

void set_log_level(LogLevel l) { g_log_level.store(static_cast<int>(l)); }

void log_line(LogLevel l, const char* fmt, ...) {
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "pos %s: %s\n", kNames[static_cast<int>(l)], buf);
}

}  // namespace pos
