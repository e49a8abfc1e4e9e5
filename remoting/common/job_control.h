// job_control.h — the control sockets of in-process jobs (`pos run`, remoting/driver): where they
// live, the one-line protocol, and both ends of it — the job's server (a thread answering ps) and
// the asker (pos-cli ps). Base layer only, so the preloaded driver layer can carry it.
//
// A job listens on JOBS_DIR/<pid>.sock (JOBS_DIR: $POS_JOBS_DIR, else posd's private socket
// directory + "-jobs", e.g. /run/pos-jobs for root; made 0700). A client connects, writes one command line ("ps\n",
// "ps-row\n", "dump-save DIR\n"; at most 4200 bytes), and reads the answer until the job closes. Only the job's own uid
// or root is answered (SO_PEERCRED), on top of the directory being private (docs/driver_runtime.md).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/status.h"
#include "remoting/common/unique_fd.h"

namespace pos {

// $POS_JOBS_DIR, else the directory of private_socket_path(this uid) + "-jobs": /run/pos-jobs for
// root, $XDG_RUNTIME_DIR/pos-jobs or /run/user/<uid>/pos-jobs for others, else /tmp/pos-<uid>-jobs.
std::string default_jobs_dir();
std::string job_socket_path(const std::string& dir, pid_t pid);
// The jobs directory process `pid` uses, from its own environment (/proc/PID/environ: its
// POS_JOBS_DIR, else its uid's default with its XDG_RUNTIME_DIR), so that root's pos-cli finds a
// user's job. Empty if the process cannot be read (gone, or another user's without privilege).
std::string jobs_dir_of_process(pid_t pid);

// A command or an answer with the descriptors that came or go with it. Descriptors travel as
// SCM_RIGHTS on the line's first bytes, at most kFdsPerByte on each (so a line carries at most
// line-length x kFdsPerByte, and never more than kMaxFds); the dump's device-memory hand-off
// (docs/wire_format.md, "Job control socket").
struct ControlMessage {
  std::string text;
  std::vector<UniqueFd> fds;
};
constexpr size_t kFdsPerByte = 250;
constexpr size_t kMaxFds = 64 * kFdsPerByte;

// The job's end. Answers each command with answer(command) (the command without its newline);
// a command the callback does not know should get a JSON error object. Thread-safe.
class JobControlServer {
 public:
  // Makes `dir` (0700; its parent must exist) if missing and refuses one that is not this uid's or that others may write;
  // binds DIR/<pid>.sock (replacing a stale one of this pid) and starts the answering thread.
  static StatusOr<std::unique_ptr<JobControlServer>> start(const std::string& dir,
                                                          std::function<std::string(const std::string&)> answer);
  // The same, for commands that carry descriptors or answer with them.
  static StatusOr<std::unique_ptr<JobControlServer>> start_with_fds(const std::string& dir,
                                                                   std::function<ControlMessage(ControlMessage&)> answer);
  ~JobControlServer();
  JobControlServer(const JobControlServer&) = delete;
  JobControlServer& operator=(const JobControlServer&) = delete;

  const std::string& path() const { return path_; }
  // Removes the socket file, but only in the process that made it (not in a fork's child, which
  // inherits the object but not the thread). The thread is left to end with the process.
  void remove_socket();

 private:
  JobControlServer() = default;
  void serve();

  std::string path_;
  pid_t owner_ = 0;
  UniqueFd listen_;
  std::function<ControlMessage(ControlMessage&)> answer_;
  std::thread thread_;
};

// The asker's end: `command` to the job at `socket`, its whole answer. The peer must run as this
// process's uid or root; a job that does not answer within `timeout_ms` is kUnavailable.
StatusOr<std::string> ask_job(const std::string& socket, const std::string& command, int timeout_ms = 2000);
// The same with descriptors both ways: `fds` go with the command (the caller's stay open), the
// answer's come back in the result.
StatusOr<ControlMessage> ask_job_fds(const std::string& socket, const std::string& command, const std::vector<int>& fds,
                                     int timeout_ms);

// One line (no newline in it; it is added) with `fds` on its first bytes; kInvalidArgument when
// the line is too short to carry them or they are more than kMaxFds.
Status send_line_with_fds(int sock, const std::string& line, const std::vector<int>& fds);
// One line (newline removed) of at most `max` bytes and the descriptors on it (close-on-exec).
// kUnavailable when the peer hangs up or times out first, kCorrupt when the line is too long or
// descriptors were lost (the receiver's descriptor limit).
StatusOr<ControlMessage> recv_line_with_fds(int sock, size_t max);

struct JobAnswer {
  pid_t pid = 0;
  std::string text;
};
// Every job in `dir` asked `command`, by pid. A socket whose process is gone is removed; a job
// that cannot be asked is left out and named in `skipped`. No directory: no jobs.
std::vector<JobAnswer> ask_jobs(const std::string& dir, const std::string& command, std::vector<std::string>* skipped);

}  // namespace pos
