// session_share.cc — a posd session's slot in its user's usage region and its turn gate
// (session_share.h): joined when the session starts, left when it ends.
#include "remoting/server/session_share.h"

#include <sys/stat.h>
#include <unistd.h>

#include "remoting/common/process_info.h"

namespace pos {

std::unique_ptr<SessionShare> SessionShare::join(const std::string& jobs_dir, const std::string& kept,
                                                 POSClient* client, uint32_t share, std::string* why) {
  if (kept.empty()) (void)::mkdir(jobs_dir.c_str(), 0700);  // the in-process jobs' directory; theirs when it exists
  const UsageRegionChoice use = choose_usage_region(jobs_dir, kept);
  auto region = UsageRegion::open(use.path, use.access);
  if (!region.ok()) {
    *why = region.status().message();
    return nullptr;
  }
  UsageRegion::Entry e;
  e.pid = static_cast<uint32_t>(::getpid());
  e.start_time = process_start_time(e.pid);
  e.device = client->device();
  const ClientStats st = client->stats();
  e.memory_limit = st.memory_quota;
  e.memory_used = st.memory_in_use;
  auto slot = (*region)->join(e);
  if (!slot.ok()) {
    *why = slot.status().message();
    return nullptr;
  }
  if (share != 0) {
    if (Status s = (*region)->set_share(*slot, share); !s.ok()) {
      (*region)->leave(*slot);
      *why = s.message();
      return nullptr;
    }
  }
  std::unique_ptr<SessionShare> out(new SessionShare(std::move(*region), *slot, client));
  out->share_.store(share, std::memory_order_relaxed);
  // Every 10 ms of calls: what the session holds, its quota and its device, for ps and the others.
  SessionShare* self = out.get();
  out->gate_.set_verify([self] {
    const ClientStats now = self->client_->stats();
    self->region_->set_used(self->slot_, now.memory_in_use);
    self->region_->set_limit(self->slot_, now.memory_quota);
    self->region_->set_device(self->slot_, self->client_->device());
  });
  out->gate_.attach(out->region_.get(), *slot, e.device);
  return out;
}

Status SessionShare::set_share(uint32_t per_mille) {
  POS_RETURN_IF_ERROR(region_->set_share(slot_, per_mille));
  share_.store(per_mille, std::memory_order_relaxed);
  return Status::Ok();
}

SessionShare::~SessionShare() {
  gate_.attach(nullptr, -1, -1);
  region_->leave(slot_);
}

}  // namespace pos
