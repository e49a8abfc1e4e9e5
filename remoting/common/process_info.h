// process_info.h — what /proc says of a process: whether it runs, and when it started (which tells
// a process from a later one under the same pid: a job restored by CRIU, or a reused pid).
// Base layer only: the checkpoint policies, the dumps, pos-cli and the usage region use it.
#pragma once

#include <cstdint>

namespace pos {

// Whether process `pid` runs: it exists and is no zombie (a job killed but not yet reaped is gone).
bool process_running(uint32_t pid);
// When process `pid` started (clock ticks since boot, /proc/PID/stat), or 0 if unknown.
uint64_t process_start_time(uint32_t pid);

}  // namespace pos
