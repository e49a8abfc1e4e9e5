// wire.cc — frame encoding and the frame decoder posd runs on every byte a client publishes.
// The decoder trusts nothing: lengths, counts and arena references are all checked before use.
#include "remoting/common/wire.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>

namespace pos::wire {

Layout layout_for(uint64_t arena_bytes) {
  Layout l{};
  l.ring_offset = kHeaderBytes;
  l.ring_bytes = kRingBytes;
  l.reply_offset = l.ring_offset + l.ring_bytes;
  l.arena_offset = l.reply_offset + kReplyBytes;
  l.arena_bytes = (arena_bytes + kArenaAlign - 1) & ~(kArenaAlign - 1);
  l.total = l.arena_offset + l.arena_bytes;
  return l;
}

uint64_t frame_bytes(std::span<const uint64_t> sizes) {
  uint64_t n = sizeof(FrameHeader) + 8 * sizes.size();
  for (uint64_t s : sizes) n += (s & kIndirect) ? 8 : pad8(s);
  return n;
}

void encode_frame(std::byte* out, uint32_t api_id, uint16_t flags, uint64_t seq, uint64_t ret_cap,
                  std::span<const Param> params, std::span<const uint64_t> sizes) {
  FrameHeader h{kFrameMagic, static_cast<uint32_t>(frame_bytes(sizes)), api_id,
                static_cast<uint16_t>(params.size()), flags, seq, ret_cap};
  std::memcpy(out, &h, sizeof(h));
  std::byte* p = out + sizeof(h);
  std::memcpy(p, sizes.data(), 8 * sizes.size());
  p += 8 * sizes.size();
  for (size_t i = 0; i < params.size(); ++i) {
    const uint64_t n = (sizes[i] & kIndirect) ? 8 : sizes[i];
    if (n > 0) std::memcpy(p, params[i].data, n);
    if (pad8(n) > n) std::memset(p + n, 0, pad8(n) - n);
    p += pad8(n);
  }
}

Status decode_frame(const std::byte* p, uint64_t avail, const std::byte* arena, uint64_t arena_bytes,
                    DecodedFrame* out) {
  if (avail < sizeof(FrameHeader)) return Status::Corrupt("frame header truncated");
  FrameHeader h;
  std::memcpy(&h, p, sizeof(h));  // once: the peer may rewrite the ring under us
  if (h.magic != kFrameMagic) return Status::Corrupt("bad frame magic");
  if (h.total_len < sizeof(FrameHeader) || h.total_len % 8 != 0 || h.total_len > avail)
    return Status::Corrupt("frame length " + std::to_string(h.total_len) + " is invalid (" + std::to_string(avail) +
                           " bytes published)");
  if (h.flags & ~uint16_t{kFlagReply | kFlagPad}) return Status::Corrupt("unknown frame flags");
  out->h = h;
  out->nparams = 0;
  if (h.flags & kFlagPad) {
    if (h.nparams != 0) return Status::Corrupt("pad frame with parameters");
    return Status::Ok();
  }
  if (h.nparams > kMaxParams) return Status::Corrupt("frame has " + std::to_string(h.nparams) + " parameters");
  if (h.ret_cap > kMaxRet) return Status::Corrupt("frame asks for " + std::to_string(h.ret_cap) + " result bytes");
  const uint64_t sizes_end = sizeof(FrameHeader) + 8ull * h.nparams;
  if (sizes_end > h.total_len) return Status::Corrupt("frame too short for its parameter table");
  uint64_t sizes[kMaxParams];
  std::memcpy(sizes, p + sizeof(FrameHeader), 8ull * h.nparams);
  uint64_t off = sizes_end;
  for (uint32_t i = 0; i < h.nparams; ++i) {
    const bool indirect = (sizes[i] & kIndirect) != 0;
    const uint64_t size = sizes[i] & ~kIndirect;
    if (indirect) {
      if (h.total_len - off < 8) return Status::Corrupt("parameter " + std::to_string(i) + " overruns the frame");
      uint64_t at = 0;
      std::memcpy(&at, p + off, 8);
      if (at > arena_bytes || size > arena_bytes - at)
        return Status::Corrupt("parameter " + std::to_string(i) + " names arena bytes outside the arena");
      out->params[i] = Param{arena + at, size};
      off += 8;
    } else {
      if (size > h.total_len - off || pad8(size) > h.total_len - off)
        return Status::Corrupt("parameter " + std::to_string(i) + " overruns the frame");
      out->params[i] = Param{p + off, size};
      off += pad8(size);
    }
  }
  if (off != h.total_len) return Status::Corrupt("frame has trailing bytes");
  out->nparams = h.nparams;
  return Status::Ok();
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, timeout_ms >= 0 ? &ts : nullptr,
          nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void put_cstr(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  std::memset(dst + n, 0, cap - n);
}

std::string get_cstr(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

}  // namespace pos::wire
