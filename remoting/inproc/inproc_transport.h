// inproc_transport.h — the Transports of the in-process runtime: calls pos_process on a workspace in
// this process (libpos_inproc, tests, benches), optionally through a RestoreGate (POS_CHECKPOINT).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "pos/checkpoint/restore_gate.h"
#include "pos/workspace.h"
#include "remoting/common/api_client.h"

namespace pos {

// Thread-safe as pos_process is.
class InProcessTransport final : public Transport {
 public:
  InProcessTransport(POSWorkspace* ws, uint64_t client_uuid) : ws_(ws), uuid_(client_uuid) {}
  Status call(ApiId api, std::span<const Param> params, void* ret, uint64_t ret_len, uint64_t* ret_written) override {
    return ws_->pos_process(static_cast<uint32_t>(api), uuid_, params, ret, ret_len, ret_written);
  }
  uint64_t client_uuid() const { return uuid_; }

 private:
  POSWorkspace* ws_;
  uint64_t uuid_;
};

// Routes every call of a transport through a RestoreGate.
class GatedTransport final : public Transport {
 public:
  GatedTransport(std::unique_ptr<Transport> inner, RestoreGate* gate) : inner_(std::move(inner)), gate_(gate) {}
  Status call(ApiId api, std::span<const Param> params, void* ret, uint64_t ret_len, uint64_t* ret_written) override {
    return gate_->run([&] { return inner_->call(api, params, ret, ret_len, ret_written); });
  }

 private:
  std::unique_ptr<Transport> inner_;
  RestoreGate* gate_;
};

}  // namespace pos
