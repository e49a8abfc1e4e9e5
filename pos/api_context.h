// api_context.h — one API call in flight: its parameters, sequence number, DAG edges and result.
// Contexts are pooled per client and travel rpc → parser → worker → parser → rpc without allocation.
#pragma once

#include <cstdint>
#include <atomic>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "pos/api_id.h"
#include "pos/handle.h"
#include "pos/inline_vec.h"
#include "pos/status.h"
#include "pos/sync.h"

namespace pos {

// A parameter as the caller hands it to pos_process: bytes, copied into the context.
struct Param {
  const void* data;
  uint64_t size;
};
template <typename T>
Param param_of(const T& v) {
  return Param{&v, sizeof(T)};
}

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
enum CallState : uint32_t { kQueued = 0, kParsed = 1, kDone = 2, kStatesPerUse = 3 };

// Laid out by writer, so that a call moves as few cache lines between threads as possible: the
// submitter writes the first block, the hand-off word sits on its own line, and the parser and
// worker write the last block. Each side resets only its own fields (recycle / begin_parse).
struct APIContext {
  // ---- written by the submitter; read by the parser and the worker ----
  ApiId api_id{};
  const ApiInfo* info = nullptr;
  uint64_t pc = 0;  // api_inst_pc: the client's sequence number of this call
  uint64_t client_uuid = 0;
  uint64_t t_submit_ns = 0;
  uint32_t state_base = 0;  // this use's base value of `state`
  // Replay of a pending call from an image (restore): the answer the app got when the call was
  // first parsed; nullptr for every other call. Parser functions whose answer depends on timing
  // (cudaMalloc's first fit sees ranges the worker has freed) give that answer again.
  const std::string* replay_ret = nullptr;
  struct Slot {
    uint64_t offset, size;
  };
  InlineVec<Slot, 6> params;
  // Parameter bytes: inside the context for ordinary calls (no separate allocation whose cache
  // line could be shared with a neighbour's), on the heap for big ones (fatbins, async copies).
  static constexpr size_t kInlineParamBytes = 192;
  std::byte* param_base = nullptr;
  uint64_t param_size = 0;
  std::vector<std::byte> param_heap;
  alignas(64) std::byte param_inline[kInlineParamBytes];

  // ---- the hand-off ----
  alignas(64) StateWord state{kQueued};
  std::atomic<bool> caller_released{false};  // the submitting thread has read the result

  // ---- written by the parser, then the worker ----
  alignas(64) Status status;
  bool skip_worker = false;  // nothing for the worker (failed, or nothing to do)
  Handle* h[4] = {};
  uint64_t u[8] = {};
  InlineVec<Edge, 8> edges;
  std::vector<std::byte> ret;
  uint64_t ret_size = 0;
  uint64_t t_done_ns = 0;

  // ---- parameter access (parser / worker) ----
  size_t param_count() const { return params.size(); }
  std::span<const std::byte> param_bytes(size_t i) const {
    const Slot& s = params[i];
    return {param_base + s.offset, s.size};
  }
  // Exactly sizeof(T) bytes, or a clear error naming the parameter.
  template <typename T>
  Status get(size_t i, T* out) const {
    if (i >= params.size()) return Status::InvalidArgument("missing parameter " + std::to_string(i));
    if (params[i].size != sizeof(T))
      return Status::InvalidArgument("parameter " + std::to_string(i) + " has " + std::to_string(params[i].size) +
                                     " bytes, expected " + std::to_string(sizeof(T)));
    std::memcpy(out, param_base + params[i].offset, sizeof(T));
    return Status::Ok();
  }
  Status expect_params(size_t n) const {
    if (params.size() != n)
      return Status::InvalidArgument("expected " + std::to_string(n) + " parameters, got " +
                                     std::to_string(params.size()));
    return Status::Ok();
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
  }

  void add_edge(Handle* handle, EdgeKind kind, uint64_t offset = 0, uint64_t bytes = 0) {
    edges.push_back(Edge{handle, kind, offset, bytes});
  }

  // Submitter, before reuse: its own fields only. Keeps the parameter buffer unless it grew large.
  void recycle() {
    params.clear();
    replay_ret = nullptr;
    if (param_heap.capacity() > (1u << 20)) std::vector<std::byte>().swap(param_heap);
    state_base += kStatesPerUse;  // the worker left the word at the old base + kDone
    caller_released.store(false, std::memory_order_relaxed);
  }
  // Parser / worker: publish progress of this use of the context.
  void advance(CallState s) { state.set(state_base + s); }
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
    if (ret.capacity() > (1u << 20)) std::vector<std::byte>().swap(ret);
  }
};

}  // namespace pos
