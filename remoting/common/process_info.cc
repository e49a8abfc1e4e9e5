// process_info.cc — /proc/PID/stat read for a process's state and start time (process_info.h).
// Plain file reads: called on rare paths (a dump's undo, a policy's tick, the usage region's reaping).
#include "remoting/common/process_info.h"

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace pos {

bool process_running(uint32_t pid) {
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // A zombie is gone for every purpose here (its parent has not reaped it yet).
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return true;  // another user's /proc may be hidden: kill said it exists
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

uint64_t process_start_time(uint32_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  // Fields after the command: state is field 3, starttime field 22.
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

}  // namespace pos
