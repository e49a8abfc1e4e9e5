// zdtm_cpu.cc — a ZDTM-shaped program for the CRIU driver's tests: builds CPU state (memory, a thread,
// an open file, a child process), says it is ready, waits for SIGUSR2, then checks that state.
// Usage: zdtm_cpu DIR. Writes DIR/ready (its pid), DIR/log (through one fd), DIR/result (PASS / FAIL: why).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fcntl.h>
#include <string>
#include <thread>
#include <vector>

namespace {

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

uint64_t word(size_t i) { return (i + 1) * 0x9e3779b97f4a7c15ull; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  (void)::setsid();  // a session of its own: CRIU dumps it without --shell-job
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, nullptr);  // every thread inherits it: only sigwait takes it

  std::vector<uint64_t> mem(8u << 20 >> 3);  // 8 MiB of state
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = word(i);
  const int log = ::open((dir + "/log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log < 0 || ::write(log, "before\n", 7) != 7) return 3;
  std::atomic<uint64_t> ticks{0};
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop.load()) {
      ticks.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const pid_t child = ::fork();
  if (child == 0) {
    signal(SIGTERM, [](int) { _exit(7); });
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    for (;;) ::pause();
  }
  write_file(dir + "/ready", std::to_string(::getpid()) + "\n");

  int sig = 0;
  sigwait(&usr2, &sig);

  std::string why;
  for (size_t i = 0; i < mem.size() && why.empty(); ++i)
    if (mem[i] != word(i)) why = "memory word " + std::to_string(i) + " changed";
  const uint64_t t0 = ticks.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (why.empty() && ticks.load() <= t0) why = "the ticker thread is not running";
  if (why.empty() && ::write(log, "after\n", 6) != 6) why = "the log fd does not write";
  int st = 0;
  if (why.empty() && (::kill(child, SIGTERM) != 0 || ::waitpid(child, &st, 0) != child || !WIFEXITED(st) ||
                      WEXITSTATUS(st) != 7))
    why = "the child process did not answer as before";
  stop.store(true);
  ticker.join();
  ::close(log);
  write_file(dir + "/result", why.empty() ? "PASS\n" : "FAIL: " + why + "\n");
  return why.empty() ? 0 : 1;
}
