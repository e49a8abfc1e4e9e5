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

// The job name posd shows (pos-cli ps): POS_JOB_NAME, else the file name of the program (argv[0]).
// Read from /proc/self/cmdline, not /proc/self/comm, which Linux cuts to 15 characters; the wire
// field keeps 63.
std::string job_name() {
  if (const char* j = std::getenv("POS_JOB_NAME"); j != nullptr && *j != '\0') return j;
  std::string argv0;
  if (FILE* f = std::fopen("/proc/self/cmdline", "r")) {
    for (int c; (c = std::fgetc(f)) != EOF && c != '\0';) argv0.push_back(static_cast<char>(c));
    std::fclose(f);
  }
  std::string name = argv0.substr(argv0.rfind('/') + 1);  // npos + 1 == 0: no slash, the whole of it
  return name.empty() ? "client" : name;
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
