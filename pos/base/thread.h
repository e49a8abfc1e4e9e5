// thread.h — starting a thread whose failure comes back as a Status: std::thread throws when the
// kernel refuses a thread (RLIMIT_NPROC, memory), and an uncaught throw would abort the daemon.
#pragma once

#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "pos/base/cuda_errors.h"
#include "pos/base/status.h"

namespace pos {

namespace detail {
// The test hook's side: true if this start must fail as if the kernel had refused it.
bool injected_thread_failure(const char* what);
}  // namespace detail

// Starts `body` on a new thread, stored in *t. The one place where POS catches std::thread's
// std::system_error (EAGAIN under `ulimit -u`, ENOMEM): it becomes kUnavailable naming `what`
// ("posd's session thread"), so that posd refuses the session that asked for the thread and serves
// on instead of calling std::terminate. *t is untouched on failure.
template <typename F>
Status start_thread(std::thread* t, const char* what, F&& body) {
  try {
    if (detail::injected_thread_failure(what))
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "injected by a test");
    *t = std::thread(std::forward<F>(body));
    return Status::Ok();
  } catch (const std::system_error& e) {
    return Status(Code::kUnavailable, cuda::kErrorInitializationError,
                  std::string("cannot start ") + what + ": " + e.code().message());
  }
}

// Joins *t (if it runs) when the scope ends: a thread that writes to the scope's variables is done
// before any return leaves them. Declare it after those variables.
class JoinOnExit {
 public:
  explicit JoinOnExit(std::thread* t) : t_(t) {}
  ~JoinOnExit() {
    if (t_->joinable()) t_->join();
  }
  JoinOnExit(const JoinOnExit&) = delete;
  JoinOnExit& operator=(const JoinOnExit&) = delete;

 private:
  std::thread* t_;
};

// Test hook: the next `n` start_thread calls whose `what` is `what` fail as if the kernel had
// refused the thread (n = 0 ends it). Thread-safe.
void fail_thread_starts_for_test(const std::string& what, int n);

}  // namespace pos
