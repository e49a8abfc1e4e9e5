// netns_peer.h — a network namespace joined to the test's by a veth pair: CI's stand-in for a
// second host, where a test starts a posd that accepts migrations (posd_e2e_test, driver_dump_test).
#pragma once

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "unittest/run_program.h"

namespace pos::test {

// NAME-PID, with HERE/THERE-named veth ends, 10.SUBNET.N.1 here and .2 there (/24; nothing else
// reachable from it); removed when it goes. Needs root and iproute2; `ok` and `error` say whether
// it was made.
struct NetnsPeer {
  std::string ns, dev_here, dev_there, ip_here, ip_there, error;
  bool ok = false;
  NetnsPeer(const std::string& name, const std::string& here, const std::string& there, int subnet) {
    const std::string tag = std::to_string(::getpid() % 100000);
    const int n = static_cast<int>(::getpid() % 250) + 1;
    ns = name + "-" + std::to_string(::getpid());
    dev_here = here + tag, dev_there = there + tag;
    ip_here = "10." + std::to_string(subnet) + "." + std::to_string(n) + ".1";
    ip_there = "10." + std::to_string(subnet) + "." + std::to_string(n) + ".2";
    int code = -1;
    (void)run_shell("ip netns add " + ns + " && ip link add " + dev_here + " type veth peer name " + dev_there +
                        " && ip link set " + dev_there + " netns " + ns + " && ip addr add " + ip_here + "/24 dev " +
                        dev_here + " && ip -n " + ns + " addr add " + ip_there + "/24 dev " + dev_there +
                        " && ip link set " + dev_here + " up && ip -n " + ns + " link set " + dev_there +
                        " up && ip -n " + ns + " link set lo up",
                    &code, &error);
    ok = code == 0;
  }
  ~NetnsPeer() {
    int code = -1;
    (void)run_shell("ip link del " + dev_here + " 2>/dev/null; ip netns del " + ns + " 2>/dev/null", &code);
  }
  NetnsPeer(const NetnsPeer&) = delete;
  NetnsPeer& operator=(const NetnsPeer&) = delete;
  // The prefix that runs a command in it.
  std::vector<std::string> in() const { return {"ip", "netns", "exec", ns}; }
};

// Whether `dir` is empty within `seconds`: pos-cli migrate's guardian removes the scratch in the
// background once the job runs at the target.
inline bool empties_within(const std::string& dir, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!std::filesystem::is_empty(dir)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace pos::test
