// peer_transfer.cc — sending and receiving a peer table (wire::PeerHeader, PeerRange) with one
// descriptor per range; used by posd's session processes and by pos-cli migrate.
#include "remoting/server/peer_transfer.h"

#include <sys/resource.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "remoting/common/socket_io.h"
#include "remoting/common/wire.h"

namespace pos {

void raise_descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &r);
  }
}

void prepare_descriptor_table(int entries) {
  raise_descriptor_limit();
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t top = std::min<rlim_t>(r.rlim_cur, static_cast<rlim_t>(entries)) - 1;
  // A descriptor at the top grows the table once; closing it leaves the table as large.
  if (top < 3 || ::fcntl(static_cast<int>(top), F_GETFD) >= 0) return;  // in use: the table is that large
  const int any = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (any < 0) return;
  const int fd = ::fcntl(any, F_DUPFD_CLOEXEC, static_cast<int>(top));
  if (fd >= 0) ::close(fd);
  ::close(any);
}

Status send_peer_table(int sock, const std::vector<PeerMemory>& ranges) {
  if (ranges.size() > wire::kMaxPeerRanges) {
    const Status why = Status::Unsupported("the job's device memory lies in " + std::to_string(ranges.size()) +
                                           " pieces, more than a peer table carries (" +
                                           std::to_string(wire::kMaxPeerRanges) + ")");
    (void)send_peer_failure(sock, why);  // the receiver learns why
    return why;
  }
  wire::PeerHeader h;
  h.count = static_cast<uint32_t>(ranges.size());
  for (const PeerMemory& r : ranges) h.bytes += r.size;
  POS_RETURN_IF_ERROR(send_all(sock, &h, sizeof(h)));
  // In batches of kPeerBatch ranges, each batch one message with its descriptors in order: one
  // message per range cost the receiver a wake-up each (a stop's table has tens to thousands).
  static_assert(wire::kPeerBatch <= kMaxFdsPerMessage);
  wire::PeerRange batch[wire::kPeerBatch];
  int fds[wire::kPeerBatch];
  for (size_t i = 0; i < ranges.size(); i += wire::kPeerBatch) {
    const size_t k = std::min<size_t>(wire::kPeerBatch, ranges.size() - i);
    for (size_t j = 0; j < k; ++j) {
      batch[j] = wire::PeerRange{};
      batch[j].index = static_cast<uint32_t>(i + j);
      batch[j].addr = ranges[i + j].addr, batch[j].size = ranges[i + j].size;
      fds[j] = ranges[i + j].fd;
    }
    POS_RETURN_IF_ERROR(send_with_fds(sock, batch, k * sizeof(wire::PeerRange), std::span<const int>(fds, k))
                            .with_context("sending the peer memory table"));
  }
  return Status::Ok();
}

Status send_peer_failure(int sock, const Status& why) {
  wire::PeerHeader h;
  h.code = static_cast<int32_t>(why.ok() ? Code::kInternal : why.code());
  h.api_error = why.api_error();
  wire::put_cstr(h.message, sizeof(h.message), why.ok() ? std::string("no memory handed out") : why.message());
  return send_all(sock, &h, sizeof(h));
}

namespace {

// One batch of `k` ranges and the descriptors that came with its first byte, in order.
Status recv_batch(int sock, wire::PeerRange* r, size_t k, std::vector<UniqueFd>* fds) {
  msghdr msg{};
  iovec iov{r, k * sizeof(*r)};
  alignas(cmsghdr) char cbuf[CMSG_SPACE((wire::kPeerBatch + 4) * sizeof(int))];
  msg.msg_iov = &iov, msg.msg_iovlen = 1, msg.msg_control = cbuf, msg.msg_controllen = sizeof(cbuf);
  ssize_t got = 0;
  do got = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); while (got < 0 && errno == EINTR);
  if (got == 0) return Status::Unavailable("the peer closed the connection in the middle of its memory table");
  if (got < 0) return Status::Unavailable(std::string("receiving the peer's memory table: ") + std::strerror(errno));
  fds->clear();
  for_each_received_fd(&msg, [&](int f) { fds->emplace_back(f); });
  if ((msg.msg_flags & MSG_CTRUNC) != 0 && fds->size() < k)
    return Status::Unavailable("ranges of the peer's memory table lost their descriptors on the way (this process's "
                               "open-file limit, RLIMIT_NOFILE, is reached?)");
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds->size() != k)
    return Status::InvalidArgument("a range of the peer's memory table came without its descriptor (a batch of " +
                                   std::to_string(k) + " ranges brought " + std::to_string(fds->size()) + ")");
  const size_t want = k * sizeof(*r);
  if (static_cast<size_t>(got) < want)
    POS_RETURN_IF_ERROR(recv_all(sock, reinterpret_cast<char*>(r) + got, want - static_cast<size_t>(got)));
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<PeerMemory>> recv_peer_table(int sock) {
  raise_descriptor_limit();  // one open descriptor per range
  wire::PeerHeader h;
  POS_RETURN_IF_ERROR(recv_all(sock, &h, sizeof(h)).with_context("the peer's memory table"));
  if (h.magic != wire::kPeerMagic) return Status::Corrupt("a malformed peer memory table");
  if (h.code != 0) {
    const std::string why = wire::get_cstr(h.message, sizeof(h.message));
    const int32_t c = h.code;
    const Code code = c > 0 && c <= static_cast<int32_t>(Code::kInternal) ? static_cast<Code>(c) : Code::kInternal;
    return Status(code, h.api_error, why.empty() ? std::string("the peer handed out no memory") : why);
  }
  if (h.count > wire::kMaxPeerRanges)
    return Status::InvalidArgument("a peer memory table of " + std::to_string(h.count) + " ranges (at most " +
                                   std::to_string(wire::kMaxPeerRanges) + ")");
  std::vector<PeerMemory> out;
  out.reserve(h.count);
  uint64_t bytes = 0;
  wire::PeerRange batch[wire::kPeerBatch];
  std::vector<UniqueFd> fds;
  for (uint32_t i = 0; i < h.count; i += wire::kPeerBatch) {
    const uint32_t k = std::min<uint32_t>(wire::kPeerBatch, h.count - i);
    POS_RETURN_IF_ERROR(recv_batch(sock, batch, k, &fds));
    for (uint32_t j = 0; j < k; ++j) {
      const wire::PeerRange& r = batch[j];
      const uint32_t n = i + j;
      if (r.magic != wire::kPeerMagic || r.index != n)
        return Status::Corrupt("range " + std::to_string(n) + " of the peer's memory table is malformed or out of order");
      if (r.size == 0 || r.size > (uint64_t{1} << 50) || bytes + r.size < bytes)
        return Status::InvalidArgument("range " + std::to_string(n) + " of the peer's memory table has a bad size");
      bytes += r.size;
      out.emplace_back(r.addr, r.size, fds[j].release());
    }
  }
  if (bytes != h.bytes) return Status::Corrupt("the peer's memory table does not add up to the bytes it announced");
  return out;
}

}  // namespace pos
