// session_share.h — a posd session in its user's usage region (issue #24, docs/limits.md): the
// session process joins the region in-process jobs use, so that they and posd's jobs on a GPU see
// one accounting, and its worker passes the GPU-time scheduler's gate before each call.
//
// The TurnGate (pos/client.h) the session's client passes; the scheduler is the in-process jobs'
// (remoting/common/share_gate.h on remoting/common/usage_region.h). The slot is the session
// process's (its pid lives as long as the session's device state).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "pos/client.h"
#include "remoting/common/usage_region.h"
#include "remoting/common/share_gate.h"

namespace pos {

class SessionShare final : public TurnGate {
 public:
  // Joins the region posd keeps (`kept`, posd.usage_region) or else the one of `jobs_dir`, for
  // `client` (its device, quota and usage), with a GPU-time share in per mille (0: none). Null,
  // with `why`, when the region cannot be used or the share would make its GPU's shares pass
  // 100 % (then the session runs without either).
  static std::unique_ptr<SessionShare> join(const std::string& jobs_dir, const std::string& kept, POSClient* client,
                                            uint32_t share, std::string* why);
  ~SessionShare() override;

  // pos-cli limit --gpu-share for a posd job: the slot's share changes (0: none); refused, with
  // nothing changed, when its GPU's shares would pass 100 % (the holders named).
  Status set_share(uint32_t per_mille);
  uint32_t share() const { return share_.load(std::memory_order_relaxed); }

  int enter(void (*drain)(void*), void* ctx) override {
    return gate_.enter([drain, ctx] { drain(ctx); });
  }
  void done(int token) override { gate_.done(token); }

 private:
  SessionShare(std::unique_ptr<UsageRegion> r, int slot, POSClient* client)
      : region_(std::move(r)), slot_(slot), client_(client) {}
  std::unique_ptr<UsageRegion> region_;
  int slot_;
  POSClient* client_;  // outlived by this gate's users only (set_turn_gate's rule)
  std::atomic<uint32_t> share_{0};
  ShareGate gate_;
};

}  // namespace pos
