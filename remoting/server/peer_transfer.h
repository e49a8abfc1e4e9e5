// peer_transfer.h — a peer table on a socket: device memory handed between sessions of one host as
// descriptors (pos-cli migrate's peer switch; wire::PeerHeader / PeerRange, docs/wire_format.md).
#pragma once

#include <vector>

#include "pos/backend.h"
#include "pos/base/status.h"

namespace pos {

// Raises this process's soft open-file limit to its hard one: a peer table holds one descriptor per
// range in the exporter, pos-cli and the importer at once.
void raise_descriptor_limit();
// raise_descriptor_limit, and the kernel's descriptor table grown to `entries` (or the limit) now:
// growing it later, in a process of several threads, waits for an RCU grace period each time (the
// kernel's expand_fdtable), which cost a peer switch 20-40 ms in the exporter and in the target on
// the H200 machine. Call it at start, while nothing waits on this process.
void prepare_descriptor_table(int entries = 4096);
// The header (code 0, the ranges' count and bytes), then each range alone with its descriptor.
// Too many ranges: a failure header saying so, and that error.
Status send_peer_table(int sock, const std::vector<PeerMemory>& ranges);
// A failed export: the header alone, with the reason.
Status send_peer_failure(int sock, const Status& why);
// Reads a table sent by send_peer_table (blocking; the socket's receive timeout applies): a header
// with an error gives that error; a range without its descriptor, out of order, more than
// wire::kMaxPeerRanges, or sizes that do not add up to the header's bytes are refused.
StatusOr<std::vector<PeerMemory>> recv_peer_table(int sock);

}  // namespace pos
