// log.h — leveled logging to stderr with a component prefix ("pos[client 3] cudaMemcpy: ...").
// Cheap when filtered out: the level check happens before any formatting.
#pragma once

#include <atomic>
#include <cstdio>

#include <cstdint>

namespace pos {

enum class LogLevel : uint8_t { kError = 0, kWarn, kInfo, kDebug };

extern std::atomic<int> g_log_level;
void set_log_level(LogLevel l);
void log_line(LogLevel l, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace pos

#define POS_LOG(level, ...)                                                       \
  do {                                                                            \
    if (static_cast<int>(level) <= ::pos::g_log_level.load(std::memory_order_relaxed)) \
      ::pos::log_line(level, __VA_ARGS__);                                        \
  } while (0)
#define POS_ERROR(...) POS_LOG(::pos::LogLevel::kError, __VA_ARGS__)
#define POS_WARN(...) POS_LOG(::pos::LogLevel::kWarn, __VA_ARGS__)
#define POS_INFO(...) POS_LOG(::pos::LogLevel::kInfo, __VA_ARGS__)
#define POS_DEBUG(...) POS_LOG(::pos::LogLevel::kDebug, __VA_ARGS__)
