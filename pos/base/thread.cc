// thread.cc — thread.h's test hook: which thread starts to fail, and how many more times.
// A relaxed counter keeps start_thread's usual path to one load; the name is read under a mutex.
#include "pos/base/thread.h"

#include <atomic>
#include <mutex>

namespace pos {
namespace {

std::atomic<int> g_failures{0};
std::mutex g_mu;
std::string g_what;  // guarded by g_mu

}  // namespace

namespace detail {
bool injected_thread_failure(const char* what) {
  if (g_failures.load(std::memory_order_relaxed) == 0) [[likely]] return false;
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_failures.load(std::memory_order_relaxed) == 0 || g_what != what) return false;
  g_failures.fetch_sub(1, std::memory_order_relaxed);
  return true;
}
}  // namespace detail

void fail_thread_starts_for_test(const std::string& what, int n) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_what = what;
  g_failures.store(n, std::memory_order_relaxed);
}

}  // namespace pos
