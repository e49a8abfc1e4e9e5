// log.h — leveled logging to stderr. Every line says when (UTC, ms), which process, how bad and
// who speaks: "2025-06-01T12:00:00.123Z pos[4242] warn client 3 (job mlp_train): message".
// Cheap when filtered out: the level check happens before any formatting.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

namespace pos {

enum class LogLevel : uint8_t { kError = 0, kWarn, kInfo, kDebug };

extern std::atomic<int> g_log_level;
void set_log_level(LogLevel l);

// The component is who speaks: "posd", "ckpt", "cuda backend", "host backend", or a client as
// client_component() names it. Messages do not repeat it. One write(2) per line, so lines from
// several threads (and from the app sharing stderr under LD_PRELOAD) never interleave mid-line.
void log_line(LogLevel l, std::string_view component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// "client 3 (job mlp_train)"; "client 3" for a job without a name. The same words in every line
// about one client, so one grep finds them all (posd's own lines name the session's job too).
std::string client_component(uint64_t uuid, std::string_view job);

// The whole line, newline included, as log_line writes it; at most cap - 1 bytes (a longer
// message is cut and ends in "..."), NUL-terminated. Returns the length. Separate so that the
// format is tested with a fixed clock and pid.
size_t format_log_line(char* out, size_t cap, LogLevel l, std::string_view component, const timespec& wall, long pid,
                       std::string_view message);

}  // namespace pos

// Usage: POS_WARN("posd", "pid %d sent no valid hello", pid); POS_INFO(log_name_, "started").
#define POS_LOG(level, component, ...)                                                 \
  do {                                                                                 \
    if (static_cast<int>(level) <= ::pos::g_log_level.load(std::memory_order_relaxed)) \
      ::pos::log_line(level, component, __VA_ARGS__);                                  \
  } while (0)
#define POS_ERROR(component, ...) POS_LOG(::pos::LogLevel::kError, component, __VA_ARGS__)
#define POS_WARN(component, ...) POS_LOG(::pos::LogLevel::kWarn, component, __VA_ARGS__)
#define POS_INFO(component, ...) POS_LOG(::pos::LogLevel::kInfo, component, __VA_ARGS__)
#define POS_DEBUG(component, ...) POS_LOG(::pos::LogLevel::kDebug, component, __VA_ARGS__)
