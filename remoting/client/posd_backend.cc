// posd_backend.cc — libpos_client's RuntimeBackend: every call goes to posd through a shared-memory
// session (ShmSession); the session's arena backs cudaMallocHost. The only backend in libpos_client.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "pos/base/parse.h"
#include "remoting/client/client_runtime.h"
#include "remoting/client/shm_client.h"
#include "remoting/common/handshake.h"

namespace pos {
namespace {

// The job name posd shows (pos-cli ps): POS_JOB_NAME, else the program's name.
std::string job_name() {
  if (const char* j = std::getenv("POS_JOB_NAME"); j != nullptr) return j;
  std::string comm = "client";
  if (FILE* f = std::fopen("/proc/self/comm", "r")) {
    char b[64] = {};
    if (std::fgets(b, sizeof(b), f) != nullptr) {
      comm = b;
      while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    }
    std::fclose(f);
  }
  return comm;
}

class PosdBackend final : public RuntimeBackend {
 public:
  explicit PosdBackend(std::unique_ptr<ShmSession> session) : session_(std::move(session)) {}
  Transport* transport() override { return session_.get(); }
  // Blocks of the session's arena, which posd has page-locked.
  Status host_alloc(uint64_t bytes, void** out) override { return session_->host_alloc(bytes, out); }
  Status host_free(void* p) override { return session_->host_free(p); }
  int32_t take_async_error() override { return session_->take_async_error(); }
  int32_t peek_async_error() override { return session_->peek_async_error(); }
  // No shutdown: the process's exit closes the socket, and posd reclaims the session then.

 private:
  std::unique_ptr<ShmSession> session_;
};

}  // namespace

StatusOr<std::unique_ptr<RuntimeBackend>> make_runtime_backend() {
  // Refused rather than ignored: a job that asked for checkpoints must not run without them.
  if (std::getenv("POS_CHECKPOINT") != nullptr)
    return Status::InvalidArgument(
        "POS_CHECKPOINT drives checkpoints of in-process jobs (libpos_inproc); under posd it is not available");
  uint64_t arena = 0;  // posd's default
  if (const char* a = std::getenv("POS_ARENA_SIZE"); a != nullptr && *a != '\0') {
    auto v = parse_size(a);
    if (!v.ok()) return v.status().with_context("POS_ARENA_SIZE");
    arena = *v;
  }
  auto session = ShmSession::connect(default_socket_path(), job_name(), arena);
  if (!session.ok()) return session.status();
  return std::unique_ptr<RuntimeBackend>(std::make_unique<PosdBackend>(std::move(session.value())));
}

}  // namespace pos
