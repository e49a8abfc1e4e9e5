// log.cc — the log sink: one line per call, formatted whole in a buffer and written with a single
// write(2) to fd 2, so lines from client threads, posd sessions and the app never interleave.
#include "pos/base/log.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace pos {

std::atomic<int> g_log_level{static_cast<int>(LogLevel::kWarn)};

void set_log_level(LogLevel l) { g_log_level.store(static_cast<int>(l)); }

std::string client_component(uint64_t uuid, std::string_view job) {
  std::string s = "client " + std::to_string(uuid);
  if (!job.empty()) {
    s += " (job ";
    s += job;
    s += ")";
  }
  return s;
}

size_t format_log_line(char* out, size_t cap, LogLevel l, std::string_view component, const timespec& wall, long pid,
                       std::string_view message) {
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  if (cap == 0) return 0;
  tm utc{};
  const time_t secs = wall.tv_sec;
  gmtime_r(&secs, &utc);
  char stamp[40];
  const size_t n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  stamp[n] = '\0';
  const int head = std::snprintf(out, cap, "%s.%03ldZ pos[%ld] %s %.*s: ", stamp, wall.tv_nsec / 1000000, pid,
                                 kNames[static_cast<int>(l) & 3], static_cast<int>(component.size()), component.data());
  if (head < 0) return 0;
  size_t len = std::min(static_cast<size_t>(head), cap - 1);
  // Message and newline; a message that does not fit is cut and marked, the newline is kept.
  static constexpr std::string_view kCut = "...";
  const size_t room = cap - 1 - len;  // bytes left before the NUL
  if (room == 0) {
    out[cap - 1] = '\0';
    return len;
  }
  if (message.size() + 1 <= room) {
    std::memcpy(out + len, message.data(), message.size());
    len += message.size();
  } else if (room > kCut.size() + 1) {
    const size_t keep = room - 1 - kCut.size();
    std::memcpy(out + len, message.data(), keep);
    std::memcpy(out + len + keep, kCut.data(), kCut.size());
    len += keep + kCut.size();
  }
  out[len++] = '\n';
  out[len] = '\0';
  return len;
}

void log_line(LogLevel l, std::string_view component, const char* fmt, ...) {
  char message[1024];
  va_list ap;
  va_start(ap, fmt);
  const int m = vsnprintf(message, sizeof(message), fmt, ap);
  va_end(ap);
  const size_t message_len = m < 0 ? 0 : std::min(static_cast<size_t>(m), sizeof(message) - 1);
  if (m >= static_cast<int>(sizeof(message))) std::memcpy(message + message_len - 3, "...", 3);  // cut: say so
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  char line[1280];
  const size_t len = format_log_line(line, sizeof(line), l, component, now, static_cast<long>(::getpid()),
                                     std::string_view(message, message_len));
  // One write: a pipe or file gets the line whole (pipes: up to PIPE_BUF, 4 KiB, is atomic).
  ssize_t w;
  do {
    w = ::write(STDERR_FILENO, line, len);
  } while (w < 0 && errno == EINTR);
}

}  // namespace pos
