// posd_server.h — the daemon's core: reads every hello on its Unix socket in one acceptor thread and
// hands each admitted session to a session process of its own (posd.isolation: process) or a thread on posd's workspace (shared).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pos/base/gate.h"
#include "pos/config.h"
#include "pos/base/status.h"
#include "pos/workspace.h"
#include "remoting/server/session_process.h"

namespace pos {

struct SessionInfo {
  uint64_t uuid = 0;
  uint32_t pid = 0, uid = 0;
  int32_t device = 0;  // the backend device that holds the session's memory, streams and kernels
  std::string job;
  uint64_t arena_bytes = 0;
  uint64_t frames = 0;  // frames handled
  bool ending = false;  // its client is being torn down
  bool starting = false;  // its session process is still setting up
  bool detached = false;  // its job let go of it (a dump, a migration) or has not re-attached yet (a restore)
  uint32_t server_pid = 0;  // the process that serves it: its session process, or posd (shared)
  ClientStats stats;
};

// A connecting process, as the kernel reports it (SO_PEERCRED, SO_PEERGROUPS).
struct PeerCredentials {
  uint32_t uid = 0, gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups
};

// Who may open a session or ask posd anything: posd's own uid, or, with posd.group (`group_gid`
// >= 0), a process whose primary or supplementary group it is. A refusal says who and why; its
// api_error is cudaErrorInitializationError (what the app's calls return). Pure, so it is tested
// without a second user.
Status admit(const PeerCredentials& peer, uint32_t server_uid, int64_t group_gid);

// Who may dump (and later restore, migrate) a job: root and the job's own uid. Pure, so it is
// tested without a second user.
Status authorize_job_control(uint32_t caller_uid, uint32_t job_uid, const std::string& what);

// posd.group → the gid to admit: "" → -1 (none), digits → that gid, else a group name looked up
// in the group database; an unknown name is an error naming it.
StatusOr<int64_t> resolve_group(const std::string& group);

// Thread-safe. Embeddable (tests run it in-process); tools/posd.cc is a thin main around it.
//
// Bounded under a flood of connections: one acceptor thread reads every hello with poll() (each
// must arrive within the hello deadline, 5 s), at most posd.max_pending connections wait for
// theirs, and at most client.max_clients sessions run, one thread each, started only once a hello
// is admitted. Beyond a bound, or when the kernel refuses a thread, the connection gets a welcome
// that refuses it and says why; posd never aborts for it.
class PosdServer {
 public:
  // Creates the workspace, loads host kernel libraries (host backend), binds the socket (an
  // existing socket file is replaced only if no daemon answers on it) and starts accepting. A
  // start that fails after binding removes the socket again.
  static StatusOr<std::unique_ptr<PosdServer>> start(const Config& config);
  ~PosdServer();
  PosdServer(const PosdServer&) = delete;
  PosdServer& operator=(const PosdServer&) = delete;

  // Stops accepting, ends every session (their clients' memory is freed), removes the socket.
  void stop();
  // A migration from another host was authenticated (posd.migration): with posd.spare_session,
  // a second spare is started now, so that its round 1's staging and the stop's restore each find
  // one whose backend is up (a spare started when the staging took the first was still coming up
  // when the stop's restore came, 0.5 s later).
  void expect_incoming_job();
  // That migration's connection ended: a spare beyond one is ended (an idle context's device
  // memory and its page-locked staging are not kept for a migration that may never come).
  void incoming_job_done();

  const std::string& socket_path() const { return socket_path_; }
  // posd.group resolved at start (-1: none).
  int64_t group_gid() const { return group_gid_; }
  // Test hook: admission compares peers with this uid instead of posd's own (a test cannot
  // connect as another user without root, but it can make its own uid look foreign).
  void set_owner_uid_for_test(uint32_t uid) { owner_uid_.store(uid); }
  // Test hook: job control requests (dump) are judged as if their caller had this uid (-1: as it has).
  void set_caller_uid_for_test(int64_t uid) { caller_uid_for_test_.store(uid); }
  // posd's workspace with posd.isolation: shared; nullptr with process (each session process has its own).
  POSWorkspace* workspace() { return ws_.get(); }
  std::vector<SessionInfo> sessions() const;
  // Connections that closed before sending a byte: liveness probes (a second posd's start asking
  // whether this one answers). They are logged at debug only; the count lets tests see them.
  uint64_t probes_seen() const { return probes_.load(std::memory_order_acquire); }
  // Connections accepted whose hello has not all arrived (at most posd.max_pending).
  size_t handshakes_waiting() const { return waiting_.load(std::memory_order_acquire); }
  // Test hook: how long a connection may take to send its hello, from connections accepted from
  // now on (default 5 s).
  void set_hello_timeout_for_test(std::chrono::milliseconds t) { hello_timeout_ms_.store(t.count()); }
  // `pos-cli ps --json`'s text.
  std::string sessions_json() const;
  // `pos-cli ps`'s table.
  std::string sessions_table() const;

 private:
  struct Session;
  struct Handshake;
  struct AcceptorLogs;
  PosdServer() = default;
  void accept_main();
  void accept_new(std::vector<Handshake>* waiting, AcceptorLogs* logs);
  bool read_hello(Handshake& h);
  void on_hello(Handshake& h);
  void start_session(Handshake& h, std::string job, uint64_t arena_bytes);
  void start_process_session(Handshake& h, std::string job, uint64_t arena_bytes);
  // A session process for a client: the spare (posd.spare_session) if there is one still alive,
  // else a new one; then the next spare. `spare_used` says which.
  StatusOr<SessionProcess> session_process_for(int client_fd, const session_channel::Start& start,
                                               const std::string& job, int dir_fd, bool* spare_used);
  void start_spare();
  SessionProcess take_spare();  // the spare, leaving none (pid -1: there was none)
  void session_main(Session* s);
  void reap_process(Session* s);
  void control(int fd, const std::string& command);
  void control_checkpoint(Handshake& h);
  void control_limit(Handshake& h, const std::string& command);
  uint32_t caller_uid(const Handshake& h) const;
  StatusOr<Session*> job_session(uint32_t pid, uint32_t caller, const std::string& what = "dump");
  void control_detach(Handshake& h);
  void control_release(Handshake& h);
  void control_peer_export(Handshake& h);
  Status to_detached_session(Session* target, const std::string& token, session_channel::Type type, int fd, bool forget);
  void reattach(Handshake& h);
  void control_restore(Handshake& h);
  void reap_finished();
  // posd.checkpoint_policy: a `pos-cli checkpoint` for a new session whose job matches.
  void start_policy(uint32_t pid, const std::string& job);
  size_t live_sessions() const;
  Status prepare_socket_dir();

  Config config_;
  std::unique_ptr<POSWorkspace> ws_;  // posd.isolation: shared only
  std::string backend_name_;
  std::string session_binary_, config_yaml_;  // posd.isolation: process
  // The config a session of a job posd.checkpoint_policy names gets: its staging made ahead, its
  // copy-on-write shadows kept between ticks (unless checkpoint.keep_shadows says otherwise).
  std::string config_yaml_ahead_;
  const std::string& session_yaml(const std::string& job) const {
    return policy_names_job(config_, job) ? config_yaml_ahead_ : config_yaml_;
  }
  std::vector<std::string> session_env_;      // the environment at start, for every session process
  std::mutex spare_mu_;
  // posd.spare_session: started ahead, no client yet, oldest first; under spare_mu_. One, or two
  // once a migration came in (expect_incoming_job).
  std::deque<SessionProcess> spares_;
  uint64_t next_generation_ = 0;              // acceptor-only: the next session process's uuid generation
  std::vector<void*> kernel_libs_;  // dlopen handles, closed after the workspace
  std::string socket_path_;
  int64_t group_gid_ = -1;
  std::atomic<uint32_t> owner_uid_{0};
  std::atomic<int64_t> caller_uid_for_test_{-1};  // posd's effective uid (see set_owner_uid_for_test)
  int listen_fd_ = -1;
  bool bound_ = false;        // the socket file is this posd's: stop() removes it
  bool created_dir_ = false;  // so is its directory: stop() removes it if empty
  int stop_fd_ = -1;  // eventfd: readable once stop() began
  std::string policy_cli_;  // the pos-cli posd.checkpoint_policy runs
  std::mutex policy_mu_;
  // Each starts one policy; finished ones are joined when the next starts, the rest at stop().
  struct PolicyStarter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<PolicyStarter> policy_threads_;
  std::atomic<uint64_t> probes_{0};
  std::atomic<size_t> waiting_{0};               // handshakes_waiting()
  std::atomic<int64_t> hello_timeout_ms_{5000};  // set_hello_timeout_for_test
  // Each session holds it from the start of its thread to the end of its teardown; stop() closes
  // it (no new sessions; serving loops stop spinning) and waits the sessions out.
  Gate sessions_gate_;
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Session>> sessions_;  // guarded by mu_
};

}  // namespace pos
