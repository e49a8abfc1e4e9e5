// inproc_transport.h — the Transport of the in-process runtime: calls pos_process on a workspace
// in this process (libpos_inproc, tests, benches). posd-bound clients use ShmSession instead.
#pragma once

#include <cstdint>
#include <span>

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

}  // namespace pos
