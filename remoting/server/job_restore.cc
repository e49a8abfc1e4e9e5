// job_restore.cc — the restore's phases in order (check everything, GPU state, CRIU, re-attach),
// each timed; a failure before CRIU changes nothing, one after it ends the half-restored job.
#include "remoting/server/job_restore.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <future>
#include <thread>

#include "ckpt/criu.h"
#include "ckpt/criu_image.h"
#include "ckpt/driver_checkpoint.h"
#include "ckpt/image.h"
#include "pos/base/log.h"
#include "pos/base/parse.h"
#include "pos/base/text.h"
#include "pos/base/thread.h"
#include "remoting/common/job_control.h"
#include "remoting/common/usage_region.h"
#include "remoting/driver/gpu_identity.h"
#include "remoting/driver/held_memory.h"
#include "remoting/driver/lazy_load.h"
#include "remoting/server/job_dump.h"
#include "remoting/server/control_client.h"
#include "remoting/server/job_inspect.h"
#include "remoting/server/job_manifest.h"
#include "remoting/server/peer_transfer.h"

namespace pos {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// CRIU's images of the dumped root process: their absence means the CPU part is no dump of it.
Status check_criu_part(const std::string& criu_dir, uint32_t pid) {
  for (const std::string& f : {std::string("inventory.img"), std::string("pstree.img"), "core-" + std::to_string(pid) + ".img"})
    if (!exists(criu_dir + "/" + f))
      return Status::Corrupt("the image's CPU part " + criu_dir + " has no " + f + " (not CRIU's dump of pid " +
                             std::to_string(pid) + ")");
  return Status::Ok();
}

// Every pid of the dumped tree free: CRIU restores each process under its own pid. The tree comes
// from CRIU's pstree.img (a child the job started, such as a compiler worker pool, counts too); a
// CPU part that cannot be read is left to CRIU's own error.
Status check_pid_free(uint32_t pid, const std::string& criu_dir) {
  std::vector<uint32_t> pids = {pid};
  if (auto tree = ckpt::read_criu_image(criu_dir); tree.ok())
    for (const auto& p : tree->processes)
      if (p.pid != pid) pids.push_back(p.pid);
  for (uint32_t p : pids)
    if (::kill(static_cast<pid_t>(p), 0) == 0 || errno == EPERM)
      return Status::FailedPrecondition(
          "pid " + std::to_string(p) + (p == pid ? "" : " (a process the job started)") +
          " is in use (is the dumped job still running, or one of its processes not yet reaped?): CRIU restores "
          "every process of the job under its own pid");
  return Status::Ok();
}

}  // namespace

StatusOr<DevicePlan> plan_device(const JobRestoreOptions& o, const JobManifest& m, void* driver, int image_dev) {
  DevicePlan p;
  p.ordinal = image_dev;
  auto used = driver::split_gpu_uuids(m.gpu_uuids);
  auto seen = driver::split_gpu_uuids(m.gpus_visible);
  if (!used.ok() || !seen.ok()) return Status::Corrupt("the manifest's GPU UUIDs are malformed");
  if (used->empty()) {
    if (o.device < 0) return p;  // an older image: the job's own ordinal, as it always was
    return Status::FailedPrecondition(
        "the image does not record which GPU the job used (it was dumped by an older pos-cli, or the job could not "
        "say): it can only be restored onto the GPU it was dumped from, without --device");
  }
  if (o.device >= 0 && used->size() > 1)
    return Status::Unsupported("--device moves a job of one GPU; this one used " + std::to_string(used->size()) + " (" +
                               m.gpu_uuids + ")");
  auto host = driver::list_gpus(driver::gpu_id_calls([driver](const char* name) { return ::dlsym(driver, name); }));
  if (!host.ok()) {
    if (o.device < 0) return p;  // nothing to look the GPU up with: the job's own ordinal
    return host.status().with_context("listing this host's GPUs for --device");
  }
  const auto ordinal_of = [&](const std::string& uuid) {
    for (size_t i = 0; i < host->size(); ++i)
      if ((*host)[i].uuid == uuid) return static_cast<int>(i);
    return -1;
  };
  const std::string& from = used->front();
  const std::string model = m.gpu_name.empty() ? std::string() : " (" + m.gpu_name + ")";
  if (o.device < 0) {
    // By UUID: the job's ordinal is its own view (its CUDA_VISIBLE_DEVICES), not this process's.
    for (const std::string& u : *used)
      if (ordinal_of(u) < 0) {
        // An image moved to another host: NVIDIA's restore without a map goes by device number, as
        // it always did here; nothing can be checked by UUID.
        p.note = "the GPU the job was dumped on, " + u + model +
                 ", is not on this host: restored onto device " + std::to_string(image_dev) +
                 " by number (--device N picks a GPU)";
        return p;
      }
    p.ordinal = ordinal_of(from);
    p.uuid = from;
    p.expect = *used;
    return p;
  }
  if (static_cast<size_t>(o.device) >= host->size()) {
    std::string list;
    for (size_t i = 0; i < host->size(); ++i)
      list += (list.empty() ? "" : "; ") + std::to_string(i) + ": " + (*host)[i].name + " " + (*host)[i].uuid;
    return Status::InvalidArgument("there is no CUDA device " + std::to_string(o.device) + " on this host (it has " +
                                   std::to_string(host->size()) + (list.empty() ? "" : ": " + list) + ")");
  }
  const driver::GpuInfo& target = (*host)[static_cast<size_t>(o.device)];
  if (m.gpu_name.empty())
    return Status::FailedPrecondition("the image does not record the model of the job's GPU: it can only be restored "
                                      "onto the GPU it was dumped from, without --device");
  if (target.name != m.gpu_name)
    return Status::FailedPrecondition("CUDA device " + std::to_string(o.device) + " is a " + target.name +
                                      "; the job ran on a " + m.gpu_name +
                                      ": NVIDIA's restore moves a job only to a GPU of the same model");
  p.ordinal = o.device;
  p.uuid = target.uuid;
  p.expect = {target.uuid};
  if (target.uuid == from) return p;  // its own GPU: nothing moves
  if (seen->empty())
    return Status::FailedPrecondition("the image does not record every GPU the job saw, which NVIDIA's restore onto "
                                      "another GPU must name: restore it without --device");
  auto pairs = driver::gpu_remap_pairs(*seen, from, target.uuid);
  if (!pairs.ok()) return Status::Corrupt("the manifest's GPUs disagree: " + pairs.status().message());
  for (const auto& [old_uuid, new_uuid] : *pairs) {
    if (ordinal_of(new_uuid) < 0)
      return Status::FailedPrecondition("the job saw the GPU " + new_uuid +
                                        ", which this host does not have (or pos-cli cannot see): NVIDIA's restore "
                                        "must place every GPU the job saw");
    p.pairs.push_back(
        ckpt::DriverCheckpoint::GpuPair{*driver::parse_gpu_uuid(old_uuid), *driver::parse_gpu_uuid(new_uuid)});
  }
  return p;
}

Status check_job_gpus(const std::string& socket, const DevicePlan& p, std::string* note) {
  if (p.expect.empty()) return Status::Ok();
  const std::string want = driver::join_gpu_uuids(p.expect);
  auto a = ask_job(socket, "gpus", 30'000);
  std::map<std::string, FlatJsonValue> v;
  Status got = a.ok() ? parse_flat_json(*a, "the job's GPU list", &v) : a.status();
  const auto text = [&](const char* key) {
    auto it = v.find(key);
    return it != v.end() && it->second.kind == FlatJsonValue::kString ? it->second.s : std::string();
  };
  const auto ok = v.find("ok");
  if (got.ok() && (ok == v.end() || ok->second.kind != FlatJsonValue::kBool || !ok->second.b))
    got = Status::Unavailable(text("error"));
  if (!got.ok()) {
    if (!p.pairs.empty()) return got.with_context("asking the restored job which GPU it runs on");
    *note += (note->empty() ? "" : "; ") + ("the job could not say which GPU it runs on (" + got.message() + ")");
    return Status::Ok();
  }
  if (text("gpu_uuids") != want)
    return Status::FailedPrecondition("after NVIDIA's restore the job's GPU is " + text("gpu_uuids") + ", not " + want +
                                      ", where its memory was put");
  return Status::Ok();
}

namespace {

// An in-process job's image (kind "driver-dump"): CRIU restores the process (its device memory
// still unmapped, its driver calls held at POS's gate), NVIDIA's driver restores its driver state,
// then POS in the job maps its memory again at the same addresses and loads it.
StatusOr<JobRestoreReport> restore_driver_job(const JobRestoreOptions& o, const std::string& dir, const JobManifest& m,
                                              const std::string& criu, std::chrono::steady_clock::time_point t0) {
  auto say = [&](const char* phase) {
    if (o.progress) o.progress(phase);
  };
  if (m.uid != ::geteuid() && ::geteuid() != 0)
    return Status::FailedPrecondition("the image is of a job of uid " + std::to_string(m.uid) +
                                      ": only that user or root may restore it");
  const std::string gpu_dir = dir + "/" + m.gpu, criu_dir = dir + "/" + m.criu;
  auto table = open_driver_gpu_part(gpu_dir, m);
  if (!table.ok()) return table.status();
  auto parents = driver_image_parents(dir, m);  // an incremental image's chain, whole
  if (!parents.ok()) return parents.status();
  const std::vector<ckpt::SavedRegion> allocations = table->allocations();
  POS_RETURN_IF_ERROR(check_criu_part(criu_dir, m.pid));
  POS_RETURN_IF_ERROR(check_criu_parents(dir, m));  // CRIU reads pages through them into the job
  POS_RETURN_IF_ERROR(check_pid_free(m.pid, criu_dir));
  auto driver = ckpt::DriverCheckpoint::open();
  if (!driver.ok()) return driver.status();
  auto plan = plan_device(o, m, (*driver)->library(), allocations.empty() ? 0 : allocations.front().dev);
  if (!plan.ok()) return plan.status();
  // The dumped process ended without removing its control socket; CRIU binds it anew.
  struct stat ss {};
  if (::lstat(m.socket.c_str(), &ss) == 0) {
    if (!S_ISSOCK(ss.st_mode)) return Status::FailedPrecondition(m.socket + " is in the way of the job's control socket");
    if (::unlink(m.socket.c_str()) != 0)
      return Status::Unavailable("cannot remove the old control socket " + m.socket + ": " + std::strerror(errno));
  }
  JobRestoreReport r;
  r.pid = m.pid;
  r.check_s = seconds_since(t0);
  if (!plan->uuid.empty()) r.device = plan->ordinal, r.device_uuid = plan->uuid;
  r.moved = !plan->pairs.empty();
  r.note = plan->note;
  // The device memory is loaded here, into memory this process makes and then hands to the job,
  // while CRIU and the driver restore the process (docs/driver_runtime.md, "Dump and restore").
  // With --lazy the memory is handed over as soon as it exists, and the job's GPU work waits on the
  // device for the load to end (driver/lazy_load.h); `made` says when it exists.
  std::unique_ptr<driver::HeldMemory> held;
  Status loaded = Status::Unavailable("not tried");
  std::promise<Status> made_promise;
  std::future<Status> made = made_promise.get_future();
  std::thread loader;
  const auto t_load = std::chrono::steady_clock::now();
  double load_s = 0;
  if (!allocations.empty()) {
    // Its context too (0.3-0.4 s on a GPU): none of it waits for the process.
    loader = std::thread([&] {
      auto h = driver::HeldMemory::open(driver::peer_calls((*driver)->library()), plan->ordinal);
      if (!h.ok()) {
        loaded = h.status();
        made_promise.set_value(loaded);
        return;
      }
      std::vector<ckpt::SavedRegion> regions = allocations;
      for (ckpt::SavedRegion& g : regions) g.crcs.clear(), g.offset = 0;
      Status c = (*h)->create(regions);
      held = std::move(*h);
      made_promise.set_value(c);
      driver::CopyOptions lo;
      lo.parents = *parents;  // inherited allocations come from the previous images
      loaded = c.ok() ? held->load(gpu_dir, lo).status() : c;
      load_s = seconds_since(t_load);
    });
  } else {
    made_promise.set_value(Status::FailedPrecondition("no device memory"));
  }
  const auto join_loader = [&] {
    if (loader.joinable()) loader.join();
  };

  // The job mapped its jobs' usage region (docs/limits.md); CRIU maps that file again by its path,
  // so it must be there (after a reboot, or on another machine, it may not be yet): made, the job's.
  if (const std::string usage = usage_region_path(m.socket.substr(0, m.socket.rfind('/')));
      ::access(usage.c_str(), F_OK) != 0 && ::access(m.socket.substr(0, m.socket.rfind('/')).c_str(), F_OK) == 0) {
    if (UsageRegion::open(usage).ok() && m.uid != ::geteuid()) (void)::chown(usage.c_str(), m.uid, static_cast<gid_t>(-1));
  }
  say("criu");
  auto t = std::chrono::steady_clock::now();
  ckpt::CriuRestoreOptions co;
  co.shell_job = m.shell_job;
  auto pid = ckpt::criu_restore(criu, criu_dir, co);
  if (!pid.ok()) join_loader();
  r.criu_s = seconds_since(t);
  if (!pid.ok()) return pid.status().with_context("restoring the CPU state");
  // From here a failure ends the restored process: the image is unchanged, restore it again.
  auto end = [&](const Status& why) {
    join_loader();
    ::kill(*pid, SIGKILL);
    return why.with_context("the restored job was ended");
  };
  say("driver");
  t = std::chrono::steady_clock::now();
  Status d = (*driver)->restore(*pid, plan->pairs);
  double held_s = 0;  // the driver's restore before a hold
  if (d.ok() && o.hold) {
    // A migration target's (docs/migration.md, "In-process jobs to another host"): the job's driver
    // state is back but stays locked, so none of its CUDA calls runs until the source commits; the
    // memory goes on loading meanwhile. Not let go: the job is ended before it ran a step.
    held_s = seconds_since(t);
    if (!o.hold(static_cast<uint32_t>(*pid), r))
      return end(Status::Unavailable("the restored job was not let go (its migration was not committed)"));
    t = std::chrono::steady_clock::now();  // the wait is no part of the restore's time
  }
  if (d.ok()) d = (*driver)->unlock(*pid);
  r.reattach_s = held_s + seconds_since(t);
  if (!d.ok()) return end(d.with_context(plan->pairs.empty() ? "the driver's restore"
                                                             : "the driver's restore onto " + plan->uuid));
  if (Status g = check_job_gpus(m.socket, *plan, &r.note); !g.ok()) return end(g);

  say("gpu");
  ckpt::fault_point("driver-restore-gpu");  // the process back, its memory not yet handed to it
  t = std::chrono::steady_clock::now();
  bool taken = false;
  std::string refused;  // the job's own words when it did not take the memory
  if (o.lazy && !allocations.empty()) {
    // The memory goes to the job now, with the flag its streams wait for; the job runs on while
    // this process loads. Refused (the driver cannot make the job's streams wait, say): eager.
    std::string why_eager;
    std::unique_ptr<driver::LazyFlag> flag;
    if (Status mk = made.get(); !mk.ok()) {
      why_eager = mk.message();
    } else if (auto f = driver::LazyFlag::make(); !f.ok()) {
      why_eager = f.status().message();
    } else {
      flag = std::move(*f);
      auto a = hand_back_memory(m.socket, *held, driver::allocation_list_checksum(held->regions()), m.cut, flag->fd());
      if (!a.ok() && a.status().code() != Code::kFailedPrecondition)
        return end(a.status().with_context("handing the device memory to the job"));
      if (!a.ok()) {
        why_eager = a.status().message();
      } else {
        taken = r.handoff = r.lazy = true;
        if (a->find("\"gate_held\":true") != std::string::npos)
          r.note += (r.note.empty() ? "" : "; ") + std::string("a stream of the job could not wait on the device: its driver calls waited instead");
      }
    }
    if (!r.lazy) {
      r.note += (r.note.empty() ? "" : "; ") + ("loaded before the job ran (not lazily): " + why_eager);
    } else {
      r.gpu_s = seconds_since(t);
      r.resumed_s = seconds_since(t0);
      say("loading");
      ckpt::fault_point("driver-lazy-load");  // the job running, its memory handed over, not yet loaded
      join_loader();
      r.load_s = load_s;
      // The job runs on memory that will never be whole: it is ended (the image is unchanged).
      if (!loaded.ok()) return end(loaded.with_context("loading the device memory while the job ran (--lazy)"));
      flag->set();  // every copy has completed: the job's streams go on
      auto done = ask_job(m.socket, "lazy-done", 10'000);
      if (!done.ok() || done->find("\"ok\":true") == std::string::npos)
        r.note += (r.note.empty() ? "" : "; ") + ("the job did not confirm the end of the load: " +
                                                  (done.ok() ? printable(*done, 200) : done.status().message()));
      r.gpu_bytes = table->bytes(), r.handles = allocations.size();
      r.total_s = seconds_since(t0);
      return r;
    }
  }
  join_loader();
  r.load_s = load_s;
  if (loaded.ok()) {
    auto a = hand_back_memory(m.socket, *held, driver::allocation_list_checksum(held->regions()), m.cut);
    taken = r.handoff = a.ok();
    // Refused (an image with memory the job mapped itself, say): the job loads it below.
    if (!a.ok() && a.status().code() != Code::kFailedPrecondition)
      return end(a.status().with_context("handing the device memory to the job"));
    if (!taken) refused = a.status().message();
    if (!taken) r.note += (r.note.empty() ? "" : "; ") + ("the job loaded its memory itself: " + refused);
  } else if (!allocations.empty()) {
    r.note += (r.note.empty() ? "" : "; ") + ("the job loaded its memory itself: " + loaded.message());
  }
  held.reset();  // the job holds what it took; anything else is freed before the job loads its own
  if (!taken && !table->inherited.empty())  // the job loads one image only
    return end(Status::FailedPrecondition("an incremental image's memory must be handed to the job, and it could not be (" +
                                          (loaded.ok() ? "the job refused it: " + refused : loaded.message()) + ")"));
  if (!taken) {
    auto a = ask_job(m.socket, "dump-resume @" + std::to_string(m.cut) + " " + gpu_dir, 600'000);
    if (a.ok() && a->find("\"ok\":true") == std::string::npos)
      a = Status::Corrupt("the job answered: " + printable(*a, 300));
    if (!a.ok()) return end(a.status().with_context("loading the device memory"));
  }
  r.gpu_s = seconds_since(t);
  r.gpu_bytes = table->bytes(), r.handles = allocations.size();
  r.total_s = r.resumed_s = seconds_since(t0);
  return r;
}

// begin_restore, retried while posd answers busy: the dumped job's own session may still be ending
// there (freeing its device memory, which waits for the dump's drain); that takes seconds, not longer.
StatusOr<PendingRestore> begin_restore_when_free(const std::string& socket, const std::string& dir,
                                                 const RestoreRequest& req) {
  auto pending = begin_restore(socket, dir, req);
  for (int tries = 0; !pending.ok() && pending.status().code() == Code::kBusy && tries < 300; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pending = begin_restore(socket, dir, req);
  }
  return pending;
}

// JobRestoreOptions::gpu_first: the job's pid, uid, arena and token, ahead of its manifest.
StatusOr<RestoreRequest> read_gpu_first(const std::string& path) {
  auto text = read_small_file(path, 4096);
  if (!text.ok()) return text.status();
  RestoreRequest q;
  std::istringstream in(*text);
  std::string key, value;
  int seen = 0;
  while (in >> key >> value) {
    auto n = parse_uint(value);
    if (key == "token" && value.size() == 32 && value.find_first_not_of("0123456789abcdef") == std::string::npos) {
      q.token = value, seen |= 1;
    } else if (key == "pid" && n.ok() && *n > 0 && *n <= static_cast<uint64_t>(INT32_MAX)) {
      q.pid = static_cast<uint32_t>(*n), seen |= 2;
    } else if (key == "uid" && n.ok() && *n < 0xffffffffull) {
      q.uid = static_cast<uint32_t>(*n), seen |= 4;
    } else if (key == "arena" && n.ok() && *n > 0) {
      q.arena_bytes = *n, seen |= 8;
    } else {
      return Status::Corrupt(path + ": a bad line '" + printable(key + " " + value, 80) + "'");
    }
  }
  if (seen != 15) return Status::Corrupt(path + " lacks one of pid, uid, arena, token");
  return q;
}

// JobRestoreOptions::stage: an earlier image of the job restored into a staging session, whose
// memory this process holds until the job's own restore has copied from it.
struct Staged {
  PendingRestore pending;  // closing it ends the staging session
  std::vector<PeerMemory> table;
  std::string image_id;
};

StatusOr<Staged> stage_image(const std::string& dir, const std::string& socket) {
  char real[PATH_MAX], sock[PATH_MAX];
  if (::realpath(dir.c_str(), real) == nullptr) return Status::InvalidArgument("cannot resolve " + dir + ": " + std::strerror(errno));
  if (::realpath(socket.c_str(), sock) == nullptr)
    return Status::Unavailable("no posd socket at " + socket + " (" + std::strerror(errno) + ")");
  auto m = read_manifest(real);
  if (!m.ok()) return m.status();
  if ((m->kind != "pre-dump" && m->kind != "dump") || m->gpu != "gpu")
    return Status::FailedPrecondition(std::string(real) + " is not a posd job's image with its GPU part in gpu/");
  auto img = ckpt::ImageReader::open_dir(std::string(real) + "/gpu");
  if (!img.ok()) return img.status().with_context("the staged image's GPU part");
  Staged st;
  st.image_id = (*img)->inventory().image_id();
  if (st.image_id != m->gpu_image_id) return Status::Corrupt(std::string(real) + "/gpu is not the GPU part its manifest names");
  img->reset();
  RestoreRequest q;
  q.pid = m->pid, q.uid = m->uid;
  q.arena_bytes = 1u << 20;  // nothing runs in it: the least posd takes
  q.token = ckpt::random_image_id();  // never used: no job re-attaches to a staging session
  q.job = m->job;
  q.stage = true;
  auto p = begin_restore(sock, real, q);
  if (!p.ok()) return p.status();
  timeval t{60, 0};
  (void)setsockopt(p->sock.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  auto table = recv_peer_table(p->sock.get());
  if (!table.ok()) return table.status().with_context("the staging session's memory");
  st.pending = std::move(*p);
  st.table = std::move(*table);
  return st;
}

}  // namespace

StatusOr<JobRestoreReport> restore_job(const JobRestoreOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const char* phase) {
    if (o.progress) o.progress(phase);
  };
  if (o.dir.empty()) return Status::InvalidArgument("no image directory given");
  // Staged first: the image to restore does not exist yet.
  std::optional<Staged> staged;
  std::string stage_note;
  if (!o.stage.empty()) {
    if (o.gpu_first.empty() || !o.staged)
      return Status::InvalidArgument("staging is for a migration target's restore of the GPU part ahead (gpu_first)");
    say("stage");
    (void)ckpt::find_criu();  // long before the stop (below): a first check after boot costs the downtime nothing
    const auto ts = std::chrono::steady_clock::now();
    auto st = stage_image(o.stage, o.socket);
    if (st.ok()) {
      staged = std::move(*st);
      POS_INFO("pos-cli", "staged %s (%zu ranges) in %.3f s", o.stage.c_str(), staged->table.size(), seconds_since(ts));
    } else {
      stage_note = "staging " + o.stage + " failed (" + st.status().message() + "): every byte was read from files";
    }
    if (!o.staged(staged.has_value(), stage_note)) return Status::Unavailable("the migration ended before its stop");
  }
  say("check");
  // Everything is checked before anything changes; what the caller asked for first.
  char real[PATH_MAX];
  if (::realpath(o.dir.c_str(), real) == nullptr)
    return Status::InvalidArgument("cannot resolve " + o.dir + ": " + std::strerror(errno));
  const std::string dir = real;
  // GPU first: the session restores (and starts loading) while the rest of the image is on its way.
  StatusOr<PendingRestore> pending = Status::Unavailable("the GPU state was not restored");
  RestoreRequest early;
  double early_s = 0;
  bool staged_used = false;
  auto t_rest = t0;  // when the whole image was there
  std::thread gpu_ahead;
  const JoinOnExit join_gpu_ahead(&gpu_ahead);  // it writes to what this frame holds
  if (!o.gpu_first.empty() && !o.hold)
    return Status::InvalidArgument("the GPU part restored first is for a held restore (a migration target's)");
  if (!o.gpu_first.empty()) {
    say("gpu");
    const auto te = std::chrono::steady_clock::now();
    auto q = read_gpu_first(o.gpu_first);
    if (!q.ok()) return q.status();
    early = *q;
    auto img = ckpt::ImageReader::open_dir(dir + "/gpu");
    if (!img.ok()) return img.status().with_context("the image's GPU part " + dir + "/gpu");
    early.job = printable((*img)->client().client().job_name());  // as the dump's manifest takes it
    early.lazy = o.lazy;
    char early_sock[PATH_MAX];
    if (::realpath(o.socket.c_str(), early_sock) == nullptr)
      return Status::Unavailable("no posd socket at " + o.socket + " (" + std::strerror(errno) + ")");
    // The GPU state is rebuilt on a thread of its own: its session's answer (handles, device memory
    // made and the staged part copied: ~0.1-0.2 s for the 8 GB job on the H200) overlaps the wait
    // for the rest and CRIU's restore of the process, which needs nothing of it. They meet before
    // the hold (the job runs nothing until its permit).
    const auto restore_ahead = [&, sock = std::string(early_sock), te] {
      if (staged) {
        RestoreRequest from_stage = early;
        from_stage.peer = &staged->table;
        from_stage.staged_image = staged->image_id;
        pending = begin_restore_when_free(sock, dir, from_stage);
        if (!pending.ok()) {
          stage_note = "the staged memory could not be used (" + pending.status().message() + "): every byte was read from files";
          staged.reset();  // its memory goes before the restore from files needs room
        }
        // Else the staging session ends with this restore, once the job runs here: freeing its
        // memory now (gigabytes) held up the driver work of the restored session's loaders (their
        // page-locked staging, measured: 0.55 GB took 0.24-0.30 s to load instead of tens of ms)
        // just when the job's first step may wait for them.
      }
      if (pending.ok()) {
        staged_used = true;
      } else {
        pending = begin_restore_when_free(sock, dir, early);
      }
      // A one-shot test hook (docs/migration.md, "Fault points"): the restore ahead fails as a GPU
      // without room for it would, and the one from files after CRIU's restore is taken.
      const char* hook = std::getenv("POS_RESTORE_AHEAD_FAIL_FILE");
      if (pending.ok() && hook != nullptr && *hook != '\0' && ::unlink(hook) == 0)
        pending = Status::Unavailable("failed by POS_RESTORE_AHEAD_FAIL_FILE");
      early_s = seconds_since(te);
    };
    // Without a thread (the kernel refused one) it runs here, before the wait for the rest.
    if (!start_thread(&gpu_ahead, "the GPU part's restore ahead", restore_ahead).ok()) restore_ahead();
    // CRIU found and checked now (if staging did not already), while the rest of the image is on
    // its way: a machine's first `criu check` after boot takes tens of milliseconds to seconds,
    // which the call after the rest came would add to a migration's downtime (its result is kept:
    // that call is then a lookup).
    (void)ckpt::find_criu();
    if (!o.rest || !o.rest()) return Status::Unavailable("the rest of the image did not come");  // the session ends with `pending`
    t_rest = std::chrono::steady_clock::now();
  }
  auto m = read_manifest(dir);
  if (!m.ok()) return m.status();
  if (o.device >= 0 && m->kind == "dump")
    return Status::InvalidArgument("--device is for in-process jobs (pos run): " + dir +
                                   " is a posd job's image, which is restored onto the GPU of the posd it is restored "
                                   "into (posd.devices in that posd's YAML; --socket picks the posd)");
  auto criu = ckpt::find_criu();
  if (!criu.ok()) return criu.status();
  if (m->kind == "driver-dump") return restore_driver_job(o, dir, *m, *criu, t0);
  if (m->kind == "driver-pre-dump")
    return Status::FailedPrecondition(dir + " is a GPU-only checkpoint of an in-process job (pos-cli pre-dump): it holds "
                                      "no CPU state, so it cannot be restored; pos-cli dump makes a restore point");
  if (m->kind != "dump")
    return Status::FailedPrecondition(dir + " is a pre-dump: it only serves as --prev of a later pos-cli dump, "
                                      "which is what a restore takes");
  auto token = read_small_file(dir + "/token", 64);
  if (!token.ok()) return token.status();
  std::string tok = *token;
  while (!tok.empty() && tok.back() == '\n') tok.pop_back();
  if (tok.size() != 32 || tok.find_first_not_of("0123456789abcdef") != std::string::npos)
    return Status::Corrupt(dir + "/token is not a session token (32 hex digits)");
  struct stat ts {};
  if (::stat((dir + "/token").c_str(), &ts) == 0 && (ts.st_mode & 077) != 0)
    return Status::FailedPrecondition(dir + "/token is readable by others (mode " + std::to_string(ts.st_mode & 0777) +
                                      "): whoever reads it could take the job's session; chmod 600 it");
  const std::string gpu_dir = dir + "/" + m->gpu, criu_dir = dir + "/" + m->criu;
  auto image = ckpt::ImageReader::open_dir(gpu_dir);
  if (!image.ok()) return image.status().with_context("the image's GPU part " + gpu_dir);
  if ((*image)->inventory().cut_pc() != m->cut || (*image)->inventory().image_id() != m->gpu_image_id)
    return Status::Corrupt("the GPU part " + gpu_dir + " is not the one the manifest names (cut " +
                           std::to_string((*image)->inventory().cut_pc()) + ", image " + (*image)->inventory().image_id() +
                           "; the manifest: cut " + std::to_string(m->cut) + ", image " + m->gpu_image_id + ")");
  POS_RETURN_IF_ERROR(check_criu_part(criu_dir, m->pid));
  // An incremental image needs its previous ones: their GPU parts were opened with this one's; CRIU's
  // pages of unchanged memory are in the previous CPU part, through its `parent` link.
  if (m->criu_parent) {
    struct stat ps {};
    if (::stat((criu_dir + "/parent").c_str(), &ps) != 0 || !S_ISDIR(ps.st_mode))
      return Status::Corrupt("the image's CPU part " + criu_dir + " is incremental, but its previous part (" + criu_dir +
                             "/parent, the image " + m->prev + ") is gone");
  }
  POS_RETURN_IF_ERROR(check_criu_parents(dir, *m));  // CRIU reads pages through them into the job
  POS_RETURN_IF_ERROR(check_pid_free(m->pid, criu_dir));
  const std::string permit_dir = m->permit.substr(0, m->permit.rfind('/'));
  struct stat pd {};
  if (::stat(permit_dir.empty() ? "/" : permit_dir.c_str(), &pd) != 0 || !S_ISDIR(pd.st_mode))
    return Status::FailedPrecondition("the restored job looks for its permit to re-attach in " + permit_dir +
                                      ", which this host does not have");
  char sock_real[PATH_MAX];
  if (::realpath(o.socket.c_str(), sock_real) == nullptr)
    return Status::Unavailable("no posd socket at " + o.socket + " (" + std::strerror(errno) + ")");
  JobRestoreReport r;
  r.pid = m->pid;
  r.check_s = seconds_since(t0);
  r.rest_check_s = seconds_since(t_rest);

  say("gpu");
  auto t = std::chrono::steady_clock::now();
  RestoreRequest req;
  req.pid = m->pid, req.uid = m->uid;
  req.arena_bytes = m->arena_bytes;
  req.token = tok;
  req.job = m->job;
  req.lazy = o.lazy;
  if (!o.gpu_first.empty()) {
    // Being restored already: from this image's GPU part, for the job its manifest names (joined
    // after CRIU's restore, below).
    if (early.pid != req.pid || early.uid != req.uid || early.arena_bytes != req.arena_bytes || early.token != req.token ||
        early.job != req.job || m->gpu != "gpu")
      return Status::Corrupt("the GPU state restored ahead (" + o.gpu_first + ") is not the job " + dir +
                             "/manifest names (pid, uid, arena, token, name and GPU part must agree)");
  } else {
    pending = begin_restore_when_free(sock_real, dir, req);
    if (!pending.ok()) return pending.status().with_context("restoring the GPU state");
    r.gpu_s = seconds_since(t);
    r.gpu_bytes = pending->bytes, r.handles = pending->handles;
    ckpt::fault_point("job-restore-gpu");
  }

  say("criu");
  t = std::chrono::steady_clock::now();
  // The job looks for its permit first thing once CRIU lets it run: it is there already, naming
  // the posd that holds its GPU state now.
  // (Held: the permit comes only once the holder says go.)
  if (!o.hold) {
    if (Status s = grant_reattach(m->permit, sock_real, m->uid); !s.ok()) return s.with_context("letting the job re-attach");
  }
  ckpt::CriuRestoreOptions co;
  co.shell_job = m->shell_job;
  auto pid = ckpt::criu_restore(*criu, criu_dir, co);
  r.criu_s = seconds_since(t);
  if (!pid.ok()) {
    (void)::unlink(m->permit.c_str());
    return pid.status().with_context("restoring the CPU state");  // closing `pending` ends the GPU session
  }
  if (!o.gpu_first.empty()) {
    if (gpu_ahead.joinable()) gpu_ahead.join();
    r.gpu_ahead = pending.ok();
    if (!pending.ok()) {
      // The restore ahead failed (a GPU without room for it beside a staging session, say): the
      // whole image is here now, so the GPU part is restored from its files.
      POS_INFO("pos-cli", "the GPU part could not be restored ahead (%s): restoring it from the image",
               pending.status().message().c_str());
      staged.reset();  // a staging session's memory goes before the restore from files needs room
      t = std::chrono::steady_clock::now();
      pending = begin_restore_when_free(sock_real, dir, req);
      early_s = seconds_since(t);
    }
    if (!pending.ok()) {
      ::kill(*pid, SIGKILL);
      return pending.status().with_context("restoring the GPU state (the restored process was ended)");
    }
    r.gpu_s = early_s;
    r.gpu_bytes = pending->bytes, r.handles = pending->handles;
    r.staged = staged_used;
    r.note = stage_note;
    ckpt::fault_point("job-restore-gpu");
  }
  if (o.hold) {
    if (!o.hold(static_cast<uint32_t>(*pid), r)) {
      ::kill(*pid, SIGKILL);
      return Status::Unavailable("the restored job was not let go (its migration was not committed), so it was ended");
    }
    if (Status s = grant_reattach(m->permit, sock_real, m->uid); !s.ok()) {
      ::kill(*pid, SIGKILL);
      return s.with_context("letting the job re-attach");
    }
  }

  ckpt::fault_point("job-restore-criu-done");
  say("reattach");
  t = std::chrono::steady_clock::now();
  if (Status s = finish_restore(*pending, static_cast<uint32_t>(*pid)); !s.ok()) {
    // Half a job is no job: the restored tree goes; the image is unchanged, so a later restore can work.
    ::kill(*pid, SIGKILL);
    (void)::unlink(m->permit.c_str());
    return s.with_context("the restored job did not re-attach, so it was ended");
  }
  r.reattach_s = seconds_since(t);
  r.total_s = seconds_since(t0);
  return r;
}

}  // namespace pos
