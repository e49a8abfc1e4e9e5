// api_context.h — one API call in flight: its parameters, sequence number, DAG edges and result.
// Contexts are pooled per client and travel rpc → parser → worker → parser → rpc without allocation.
#pragma once

#include <cstdint>
#include <atomic>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "pos/base/api_id.h"
#include "pos/base/param.h"
#include "pos/handle.h"
#include "pos/inline_vec.h"
#include "pos/base/status.h"
#include "pos/base/sync.h"

namespace pos {

enum class EdgeKind : uint8_t { kIn, kOut, kInOut, kCreate, kDelete };
std::string_view edge_kind_name(EdgeKind k);

struct Edge {
  Handle* handle = nullptr;
  EdgeKind kind = EdgeKind::kIn;
  uint64_t offset = 0;  // where in the handle the call touches (memory)
  uint64_t bytes = 0;   // how much (0 = whole / unknown)
};

// A call's progress. The state word is never reset: each use of a context starts at a new base
// (base + kQueued), so the submitter does not write the word the worker last wrote (one cache-line
// transfer less per call); comparisons are wrap-safe.
// kFailed is kDone with a non-ok status: a caller that sees any other final value knows the call
// succeeded without reading `status` (a line the parser or worker wrote: one transfer less).
enum CallState : uint32_t { kQueued = 0, kParsed = 1, kDone = 2, kFailed = 3, kStatesPerUse = 4 };

// Laid out by writer, so that a call moves as few cache lines between threads as possible: the
// submitter writes the first block, the hand-off word sits on its own line, and the parser and
// worker write the last block. Each side resets only its own fields (recycle / begin_parse).
struct APIContext {
  // ---- written by the submitter; read by the parser and the worker ----
  // Packed so that an ordinary call (a kernel launch with up to 24 bytes of kernel parameters)
  // fills three lines: the header, then the parameter sizes and bytes. Every line written here was
  // read on the parser's and worker's cores during the context's last use and has to be taken
  // back before the store completes, and the hand-off to the parser waits for all of them
  // (stores become visible in order).
  // line 0: the header
  ApiId api_id{};
  uint32_t state_base = 0;  // this use's base value of `state`
  const ApiInfo* info = nullptr;
  uint64_t pc = 0;  // api_inst_pc: the client's sequence number of this call
  uint64_t client_uuid = 0;
  uint64_t t_submit_ns = 0;
  // Replay of a pending call from an image (restore): the answer the app got when the call was
  // first parsed; nullptr for every other call. Parser functions whose answer depends on timing
  // (cudaMalloc's first fit sees ranges the worker has freed) give that answer again.
  const std::string* replay_ret = nullptr;
  std::byte* param_base = nullptr;
  uint32_t param_n = 0;  // parameter count
  // line 1 onwards: parameter sizes, then their bytes, each at the next 8-byte boundary (offsets
  // follow from the sizes). Bytes inside the context for ordinary calls (no separate allocation
  // whose line could be shared with a neighbour's), on the heap for big ones (fatbins, copies).
  static constexpr size_t kInlineParams = 6;
  static constexpr size_t kInlineParamBytes = 192;
  alignas(64) uint64_t param_size = 0;  // all parameter bytes, with padding
  uint64_t param_sizes[kInlineParams] = {};
  std::byte param_inline[kInlineParamBytes];
  std::vector<uint64_t> param_sizes_more;  // sizes of parameters kInlineParams, ...
  std::vector<std::byte> param_heap;

  // ---- the hand-off ----
  alignas(64) StateWord state{kQueued};

  // ---- written by the parser, then the worker ----
  // The first line holds what every call writes or resets, the next the edge count and the first
  // edge: a launch touches these two lines of the block and no other (the parser and worker
  // prefetch just these; asking for all seven would keep most of a core's line-fill buffers busy).
  alignas(64) Status status;
  Handle* h[4] = {};
  uint64_t ret_size = 0;
  bool skip_worker = false;  // nothing for the worker (failed, or nothing to do)
  bool ret_grown = false;    // `ret` holds more than 1 MiB: begin_parse gives it back
  alignas(64) InlineVec<Edge, 8> edges;
  uint64_t u[8] = {};
  std::vector<std::byte> ret;
  uint64_t t_done_ns = 0;

  // ---- the submitters' own line: no parser or worker reads it ----
  // The caller has read its result (a context back from the pipeline is reused only then). On
  // the state word's line, this store had to take the line back from the parser that had just
  // written the verdict, and the caller's next locked instruction waited for that transfer.
  alignas(64) std::atomic<bool> caller_released{false};

  // ---- parameter access (parser / worker) ----
  static constexpr uint64_t padded(uint64_t n) { return (n + 7) & ~uint64_t{7}; }
  size_t param_count() const { return param_n; }
  uint64_t param_size_of(size_t i) const {
    return i < kInlineParams ? param_sizes[i] : param_sizes_more[i - kInlineParams];
  }
  uint64_t param_offset(size_t i) const {
    uint64_t off = 0;
    for (size_t j = 0; j < i; ++j) off += padded(param_size_of(j));
    return off;
  }
  std::span<const std::byte> param_bytes(size_t i) const { return {param_base + param_offset(i), param_size_of(i)}; }
  // Exactly sizeof(T) bytes, or a clear error naming the parameter. Every parse reads its
  // parameters through here: the good case is inline, the message is built out of line.
  template <typename T>
  Status get(size_t i, T* out) const {
    if (i < param_n && param_size_of(i) == sizeof(T)) [[likely]] {
      std::memcpy(out, param_base + param_offset(i), sizeof(T));
      return Status();
    }
    return bad_param(i, sizeof(T));
  }
  Status expect_params(size_t n) const {
    if (param_n == n) [[likely]] return Status();
    return wrong_param_count(n);
  }
  [[gnu::cold, gnu::noinline]] Status bad_param(size_t i, uint64_t expected) const {
    if (i >= param_n) return Status::InvalidArgument("missing parameter " + std::to_string(i));
    return Status::InvalidArgument("parameter " + std::to_string(i) + " has " + std::to_string(param_size_of(i)) +
                                   " bytes, expected " + std::to_string(expected));
  }
  [[gnu::cold, gnu::noinline]] Status wrong_param_count(size_t n) const {
    return Status::InvalidArgument("expected " + std::to_string(n) + " parameters, got " + std::to_string(param_n));
  }

  // ---- result ----
  template <typename T>
  void set_ret(const T& v) {
    ret.resize(sizeof(T));
    std::memcpy(ret.data(), &v, sizeof(T));
    ret_size = sizeof(T);
  }
  void set_ret_bytes(const void* p, size_t n) {
    ret.resize(n);
    if (n > 0) std::memcpy(ret.data(), p, n);
    ret_size = n;
    if (ret.capacity() > kKeptRetBytes) ret_grown = true;
  }
  static constexpr size_t kKeptRetBytes = 1u << 20;

  void add_edge(Handle* handle, EdgeKind kind, uint64_t offset = 0, uint64_t bytes = 0) {
    edges.push_back(Edge{handle, kind, offset, bytes});
  }

  // Submitter, before reuse: its own fields only. Keeps the parameter buffer unless it grew large.
  void recycle() {
    param_n = 0;
    replay_ret = nullptr;
    if (!param_sizes_more.empty()) param_sizes_more.clear();
    if (param_heap.capacity() > (1u << 20)) std::vector<std::byte>().swap(param_heap);
    state_base += kStatesPerUse;  // the word was left at the old base + kDone or kFailed
    caller_released.store(false, std::memory_order_relaxed);
  }
  // Parser / worker: publish progress of this use of the context. kDone becomes kFailed when the
  // status is not ok.
  void advance(CallState s) { state.set(state_base + final_state(s)); }
  CallState final_state(CallState s) const { return s == kDone && !status.ok() ? kFailed : s; }
  // Submitter: whether the state value it saw says the call failed.
  bool failed(uint32_t seen) const { return seen == state_base + kFailed; }
  // Submitter: the call's parameters, copied in. `size(i)` and `data(i)` describe parameter i.
  template <typename Size, typename Data>
  void set_params(size_t n, Size&& size, Data&& data) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) total += padded(size(i));
    std::byte* dst = reserve_params(total);
    param_n = static_cast<uint32_t>(n);
    if (n > kInlineParams) param_sizes_more.resize(n - kInlineParams);
    uint64_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t len = size(i);
      if (len > 0) std::memcpy(dst + off, data(i), len);
      (i < kInlineParams ? param_sizes[i] : param_sizes_more[i - kInlineParams]) = len;
      off += padded(len);
    }
  }
  void set_params(std::span<const Param> ps) {
    // The common case (every hot call): a few small parameters, inline, copied a word at a time
    // rather than through a library memcpy call each.
    const size_t n = ps.size();
    if (n <= kInlineParams) {
      uint64_t total = 0;
      for (size_t i = 0; i < n; ++i) total += padded(ps[i].size);
      if (total <= kInlineParamBytes) {
        param_base = param_inline;
        param_size = total;
        param_n = static_cast<uint32_t>(n);
        std::byte* dst = param_inline;
        for (size_t i = 0; i < n; ++i) {
          const uint64_t len = ps[i].size;
          const auto* src = static_cast<const std::byte*>(ps[i].data);
          param_sizes[i] = len;
          uint64_t k = 0;
          for (; k + 8 <= len; k += 8) std::memcpy(dst + k, src + k, 8);
          if (len - k == 4) std::memcpy(dst + k, src + k, 4);
          else if (k < len) std::memcpy(dst + k, src + k, len - k);
          dst += padded(len);
        }
        return;
      }
    }
    set_params(n, [&](size_t i) { return ps[i].size; }, [&](size_t i) { return ps[i].data; });
  }
  // Submitter: room for n parameter bytes.
  std::byte* reserve_params(uint64_t n) {
    if (n <= kInlineParamBytes) {
      param_base = param_inline;
    } else {
      param_heap.resize(n);
      param_base = param_heap.data();
    }
    param_size = n;
    return param_base;
  }
  // Worker: the parameter bytes as an owned buffer (async copies whose data outlives the call).
  std::vector<std::byte> take_params() {
    if (param_base == param_heap.data() && !param_heap.empty()) {
      std::vector<std::byte> v = std::move(param_heap);
      param_heap = {};
      param_base = nullptr;
      return v;
    }
    return std::vector<std::byte>(param_base, param_base + param_size);
  }
  // Parser, before the parser function runs: the fields the parser and worker write.
  void begin_parse() {
    if (!edges.empty()) edges.clear();
    for (auto& p : h) p = nullptr;
    ret_size = 0;
    if (!status.ok()) status = Status();
    skip_worker = false;
    // Only a context that once returned a big result touches `ret` here (its line is otherwise
    // the worker's, and reading it would stall every parse).
    if (ret_grown) {
      std::vector<std::byte>().swap(ret);
      ret_grown = false;
    }
  }
};

}  // namespace pos
