// memory_api.cc — device memory APIs: malloc/free at parser-chosen addresses, copies, memsets,
// pointer attributes and symbol copies. Every client address is checked against this client's handles.
#include "pos/cuda_impl/api_functions.h"

namespace pos::cuda_impl {
namespace {

Status invalid(std::string m) { return cuda_error(cuda::kErrorInvalidValue, std::move(m)); }

// cudaMalloc(size) → device pointer
Status parse_malloc(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, size);
  if (size == 0) {  // CUDA: success and a null pointer
    c.set_ret<uint64_t>(0);
    c.skip_worker = true;
    return Status::Ok();
  }
  HandleManager& mem = ps.mgr(ResourceType::kMemory);
  const uint64_t charge = mem.round_up(size);  // what the allocation really takes
  if (charge < size) return cuda_error(cuda::kErrorMemoryAllocation, "allocation size out of range");
  const uint64_t quota = ps.memory_quota.load(std::memory_order_relaxed);
  if (quota != 0 && (charge > quota || ps.memory_in_use > quota - charge))
    return cuda_error(cuda::kErrorMemoryAllocation, "allocation of " + std::to_string(size) +
                                                        " bytes exceeds the client's quota (" +
                                                        std::to_string(ps.memory_in_use) + " of " +
                                                        std::to_string(quota) + " in use)");
  StatusOr<Handle*> h = Status::Internal("unset");
  if (c.replay_ret != nullptr) {
    // Replay (restore): the address the app got. First fit could pick another one here, as the
    // original parse may not yet have seen frees the worker had executed; that address is free
    // on replay (the replayed client has never held more than the original did).
    uint64_t at = 0;
    if (c.replay_ret->size() != sizeof(at)) return invalid("replayed cudaMalloc without its original address");
    std::memcpy(&at, c.replay_ret->data(), sizeof(at));
    h = mem.adopt_at(at, size, {ps.context}, c.pc);
    if (!h.ok()) return h.status().with_context("replaying cudaMalloc at " + hex(at));
  } else {
    h = mem.allocate_mocked_resource(size, {ps.context}, c.pc);
  }
  if (!h.ok()) return h.status();
  (*h)->charged = charge;
  if (!ps.device_backend->try_reserve((*h)->charged)) {
    mem.mark_deleted(*h);
    mem.release(*h);
    return cuda_error(cuda::kErrorMemoryAllocation, "device memory exhausted (" + std::to_string(size) + " bytes requested)");
  }
  ps.memory_in_use += (*h)->charged;
  c.h[0] = *h;
  c.add_edge(*h, EdgeKind::kCreate);
  c.set_ret<uint64_t>((*h)->client_addr);
  return Status::Ok();
}
Status work_malloc(WorkerScope& ws, APIContext& c) {
  if (c.h[0] == nullptr) return Status::Ok();
  return ws.backend->alloc_at(c.h[0]->client_addr, c.h[0]->size);
}

// cudaFree(ptr)
Status parse_free(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, ptr);
  if (ptr == 0) return Status::Ok();  // CUDA: freeing null is a no-op
  HandleManager& mem = ps.mgr(ResourceType::kMemory);
  Handle* h = mem.get(ptr);
  if (h == nullptr) {
    Handle* any = mem.find_any_containing(ptr);
    if (any != nullptr && any->state != HandleState::kActive)
      return invalid("double free of device pointer " + hex(ptr));
    if (any != nullptr) return invalid(hex(ptr) + " is inside an allocation, not its start");
    return invalid(hex(ptr) + " is not a device allocation of this client");
  }
  ps.memory_in_use -= h->charged;
  mem.mark_deleted(h);
  c.h[0] = h;
  c.add_edge(h, EdgeKind::kDelete);
  return Status::Ok();
}
Status work_free(WorkerScope& ws, APIContext& c) {
  if (c.h[0] == nullptr) return Status::Ok();
  return ws.backend->free_at(c.h[0]->client_addr, c.h[0]->size);
}

// Resolves a copy's direction and checks both ends. Device ends must lie wholly inside one live
// buffer of this client; anything in the client's device range that is not is an error.
// src_carried: the call carries the source bytes (async host-to-device), so `src` is never read.
Status resolve_copy(ParserScope& ps, APIContext& c, uint64_t dst, uint64_t src, uint64_t n, int32_t kind,
                    int32_t* resolved, bool src_carried = false) {
  if (kind < cuda::kMemcpyHostToHost || kind > cuda::kMemcpyDefault)
    return cuda_error(cuda::kErrorInvalidMemcpyDirection, "invalid cudaMemcpyKind " + std::to_string(kind));
  bool dst_dev, src_dev;
  if (kind == cuda::kMemcpyDefault) {
    dst_dev = ps.in_device_range(dst);
    src_dev = ps.in_device_range(src);
  } else {
    dst_dev = kind == cuda::kMemcpyHostToDevice || kind == cuda::kMemcpyDeviceToDevice;
    src_dev = kind == cuda::kMemcpyDeviceToHost || kind == cuda::kMemcpyDeviceToDevice;
  }
  if (n > 0) {
    if (dst_dev) {
      uint64_t off = 0;
      Handle* h = ps.device_range(dst, n, &off);
      if (h == nullptr) return invalid("destination " + hex(dst) + " + " + std::to_string(n) + " bytes is not inside a live device allocation of this client");
      c.add_edge(h, EdgeKind::kOut, off, n);
    } else if (!ps.host_ok(dst, n)) {
      return invalid("destination " + hex(dst) + " + " + std::to_string(n) + " bytes is not valid host memory for this copy");
    }
    if (src_dev) {
      uint64_t off = 0;
      Handle* h = ps.device_range(src, n, &off);
      if (h == nullptr) return invalid("source " + hex(src) + " + " + std::to_string(n) + " bytes is not inside a live device allocation of this client");
      c.add_edge(h, EdgeKind::kIn, off, n);
    } else if (!src_carried && !ps.host_ok(src, n)) {
      return invalid("source " + hex(src) + " + " + std::to_string(n) + " bytes is not valid host memory for this copy");
    }
  }
  *resolved = dst_dev ? (src_dev ? cuda::kMemcpyDeviceToDevice : cuda::kMemcpyHostToDevice)
                      : (src_dev ? cuda::kMemcpyDeviceToHost : cuda::kMemcpyHostToHost);
  return Status::Ok();
}

// cudaMemcpy(dst, src, count, kind): host pointers are this process's (the remoting server
// translates a client's shared-memory offsets before calling pos_process).
Status parse_memcpy(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(4));
  POS_PARAM(c, 0, uint64_t, dst);
  POS_PARAM(c, 1, uint64_t, src);
  POS_PARAM(c, 2, uint64_t, n);
  POS_PARAM(c, 3, int32_t, kind);
  int32_t k = 0;
  POS_RETURN_IF_ERROR(resolve_copy(ps, c, dst, src, n, kind, &k));
  c.u[0] = dst, c.u[1] = src, c.u[2] = n, c.u[3] = static_cast<uint64_t>(k);
  return Status::Ok();
}
Status work_memcpy(WorkerScope& ws, APIContext& c) {
  const uint64_t dst = c.u[0], src = c.u[1], n = c.u[2];
  if (n == 0) return Status::Ok();
  switch (static_cast<int32_t>(c.u[3])) {
    case cuda::kMemcpyHostToDevice: return ws.backend->memcpy_h2d(dst, reinterpret_cast<const void*>(src), n);
    case cuda::kMemcpyDeviceToHost: return ws.backend->memcpy_d2h(reinterpret_cast<void*>(dst), src, n);
    // CUDA: a device-to-device cudaMemcpy does not wait for the copy (it is ordered on the legacy
    // stream); the caller still gets the verdict once the worker has queued it.
    case cuda::kMemcpyDeviceToDevice: return ws.backend->memcpy_d2d(dst, src, n, 0, false);
    default:
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
      return Status::Ok();
  }
}

// cudaMemcpyAsync(dst, src, count, kind, stream[, bytes]): a host→device copy carries its bytes
// as parameter 5 (staged, so the caller may reuse its buffer at once).
Status parse_memcpy_async(ParserScope& ps, APIContext& c) {
  if (c.param_count() != 5 && c.param_count() != 6) return c.expect_params(5);
  POS_PARAM(c, 0, uint64_t, dst);
  POS_PARAM(c, 1, uint64_t, src);
  POS_PARAM(c, 2, uint64_t, n);
  POS_PARAM(c, 3, int32_t, kind);
  POS_PARAM(c, 4, uint64_t, stream);
  Handle* s = ps.stream(stream);
  if (s == nullptr) return cuda_error(cuda::kErrorInvalidResourceHandle, "unknown stream " + hex(stream));
  int32_t k = 0;
  POS_RETURN_IF_ERROR(resolve_copy(ps, c, dst, src, n, kind, &k, /*src_carried=*/c.param_count() == 6));
  if (k == cuda::kMemcpyHostToDevice) {
    if (c.param_count() != 6 || c.param_bytes(5).size() != n)
      return invalid("host-to-device cudaMemcpyAsync needs its " + std::to_string(n) + " source bytes as parameter 5");
  } else if (c.param_count() != 5) {
    return invalid("only host-to-device cudaMemcpyAsync carries data");
  }
  if (k == cuda::kMemcpyHostToHost) return invalid("host-to-host cudaMemcpyAsync is not supported");
  c.h[0] = s;
  c.add_edge(s, EdgeKind::kIn);
  c.u[0] = dst, c.u[1] = src, c.u[2] = n, c.u[3] = static_cast<uint64_t>(k);
  return Status::Ok();
}
Status work_memcpy_async(WorkerScope& ws, APIContext& c) {
  const uint64_t dst = c.u[0], src = c.u[1], n = c.u[2];
  if (n == 0) return Status::Ok();
  const BackendObj s = c.h[0]->backend_obj;
  switch (static_cast<int32_t>(c.u[3])) {
    case cuda::kMemcpyHostToDevice: {
      const uint64_t off = c.param_offset(5);
      return ws.backend->memcpy_h2d_async(dst, c.take_params(), off, n, s);
    }
    case cuda::kMemcpyDeviceToHost: return ws.backend->memcpy_d2h_async(reinterpret_cast<void*>(dst), src, n, s);
    default: return ws.backend->memcpy_d2d(dst, src, n, s, false);
  }
}

Status parse_memset_common(ParserScope& ps, APIContext& c, uint64_t dst, uint64_t n) {
  if (n == 0) return Status::Ok();
  uint64_t off = 0;
  Handle* h = ps.device_range(dst, n, &off);
  if (h == nullptr) return invalid(hex(dst) + " + " + std::to_string(n) + " bytes is not inside a live device allocation of this client");
  c.add_edge(h, EdgeKind::kOut, off, n);
  return Status::Ok();
}

// cudaMemset(dst, value, count): asynchronous on the legacy stream, like CUDA.
Status parse_memset(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(3));
  POS_PARAM(c, 0, uint64_t, dst);
  POS_PARAM(c, 1, int32_t, value);
  POS_PARAM(c, 2, uint64_t, n);
  POS_RETURN_IF_ERROR(parse_memset_common(ps, c, dst, n));
  c.h[0] = ps.default_stream;
  c.u[0] = dst, c.u[1] = static_cast<uint64_t>(static_cast<uint8_t>(value)), c.u[2] = n;
  return Status::Ok();
}
// cudaMemsetAsync(dst, value, count, stream)
Status parse_memset_async(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(4));
  POS_PARAM(c, 0, uint64_t, dst);
  POS_PARAM(c, 1, int32_t, value);
  POS_PARAM(c, 2, uint64_t, n);
  POS_PARAM(c, 3, uint64_t, stream);
  Handle* s = ps.stream(stream);
  if (s == nullptr) return cuda_error(cuda::kErrorInvalidResourceHandle, "unknown stream " + hex(stream));
  POS_RETURN_IF_ERROR(parse_memset_common(ps, c, dst, n));
  c.h[0] = s;
  c.u[0] = dst, c.u[1] = static_cast<uint64_t>(static_cast<uint8_t>(value)), c.u[2] = n;
  return Status::Ok();
}
Status work_memset(WorkerScope& ws, APIContext& c) {
  if (c.u[2] == 0) return Status::Ok();
  return ws.backend->memset(c.u[0], static_cast<int>(c.u[1]), c.u[2], c.h[0]->backend_obj, false);
}

// cudaPointerGetAttributes(ptr): answered by the parser from the client's handles.
Status parse_pointer_attributes(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, ptr);
  PointerAttributes a{};
  uint64_t off = 0;
  if (ps.in_device_range(ptr)) {
    if (ps.device_range(ptr, 0, &off) == nullptr && ps.device_range(ptr, 1, &off) == nullptr)
      return invalid(hex(ptr) + " is in the device range but not in a live allocation");
    a.type = cuda::kMemoryTypeDevice;
    a.device = ps.current_device;
    a.device_pointer = ptr;
  } else if (ps.in_pos_window(ptr)) {
    return invalid(hex(ptr) + " is not a pointer of this client");
  } else {
    a.type = cuda::kMemoryTypeUnregistered;
    a.device = -2;  // what CUDA reports for unregistered host memory
  }
  c.set_ret(a);
  return Status::Ok();
}
Status work_nothing(WorkerScope&, APIContext&) { return Status::Ok(); }

Status symbol_range(ParserScope& ps, APIContext& c, uint64_t symbol, uint64_t n, uint64_t offset, EdgeKind kind,
                    Handle** out) {
  Handle* v = ps.mgr(ResourceType::kVar).get(symbol);
  if (v == nullptr) return cuda_error(cuda::kErrorInvalidSymbol, hex(symbol) + " is not a registered symbol");
  if (offset > v->size || n > v->size - offset)
    return invalid("symbol " + quoted_name(v->name) + " has " + std::to_string(v->size) + " bytes; offset " +
                   std::to_string(offset) + " + " + std::to_string(n) + " is past its end");
  c.add_edge(v, kind, offset, n);
  *out = v;
  return Status::Ok();
}

// The other end of a symbol copy: a live device range of this client, or a host pointer that is
// not in the POS window. Returns whether it is device memory.
Status symbol_peer(ParserScope& ps, APIContext& c, uint64_t ptr, uint64_t n, int32_t kind, bool to_symbol, bool* dev) {
  const char* what = to_symbol ? "source " : "destination ";
  *dev = kind == cuda::kMemcpyDeviceToDevice || (kind == cuda::kMemcpyDefault && ps.in_device_range(ptr));
  if (n == 0) return Status::Ok();
  if (*dev) {
    uint64_t off = 0;
    Handle* h = ps.device_range(ptr, n, &off);
    if (h == nullptr) return invalid(what + hex(ptr) + " is not inside a live device allocation");
    c.add_edge(h, to_symbol ? EdgeKind::kIn : EdgeKind::kOut, off, n);
  } else if (!ps.host_ok(ptr, n)) {
    return invalid(what + hex(ptr) + " + " + std::to_string(n) + " bytes is not valid host memory");
  }
  return Status::Ok();
}

// cudaMemcpyToSymbol(symbol, src, count, offset, kind) and
// cudaMemcpyFromSymbol(dst, symbol, count, offset, kind): u = {dst, src, count, peer is device}.
Status parse_symbol_copy(ParserScope& ps, APIContext& c, bool to_symbol) {
  POS_RETURN_IF_ERROR(c.expect_params(5));
  POS_PARAM(c, 0, uint64_t, first);
  POS_PARAM(c, 1, uint64_t, second);
  POS_PARAM(c, 2, uint64_t, n);
  POS_PARAM(c, 3, uint64_t, offset);
  POS_PARAM(c, 4, int32_t, kind);
  const uint64_t symbol = to_symbol ? first : second, peer = to_symbol ? second : first;
  const int32_t host_kind = to_symbol ? cuda::kMemcpyHostToDevice : cuda::kMemcpyDeviceToHost;
  if (kind != host_kind && kind != cuda::kMemcpyDeviceToDevice && kind != cuda::kMemcpyDefault)
    return cuda_error(cuda::kErrorInvalidMemcpyDirection,
                      std::string(to_symbol ? "cudaMemcpyToSymbol" : "cudaMemcpyFromSymbol") +
                          " needs a host or device-to-device kind in the symbol's direction");
  Handle* v = nullptr;
  POS_RETURN_IF_ERROR(symbol_range(ps, c, symbol, n, offset, to_symbol ? EdgeKind::kOut : EdgeKind::kIn, &v));
  bool peer_dev = false;
  POS_RETURN_IF_ERROR(symbol_peer(ps, c, peer, n, kind, to_symbol, &peer_dev));
  const uint64_t sym_addr = v->client_addr + offset;
  c.u[0] = to_symbol ? sym_addr : peer, c.u[1] = to_symbol ? peer : sym_addr, c.u[2] = n, c.u[3] = peer_dev ? 1 : 0;
  return Status::Ok();
}
Status parse_to_symbol(ParserScope& ps, APIContext& c) { return parse_symbol_copy(ps, c, true); }
Status parse_from_symbol(ParserScope& ps, APIContext& c) { return parse_symbol_copy(ps, c, false); }
Status work_to_symbol(WorkerScope& ws, APIContext& c) {
  if (c.u[2] == 0) return Status::Ok();
  if (c.u[3] != 0) return ws.backend->memcpy_d2d(c.u[0], c.u[1], c.u[2], 0, true);
  return ws.backend->memcpy_h2d(c.u[0], reinterpret_cast<const void*>(c.u[1]), c.u[2]);
}

Status work_from_symbol(WorkerScope& ws, APIContext& c) {
  if (c.u[2] == 0) return Status::Ok();
  if (c.u[3] != 0) return ws.backend->memcpy_d2d(c.u[0], c.u[1], c.u[2], 0, true);
  return ws.backend->memcpy_d2h(reinterpret_cast<void*>(c.u[0]), c.u[1], c.u[2]);
}

}  // namespace

void register_memory_apis(ApiTable* t) {
  t->set(ApiId::kMalloc, {parse_malloc, work_malloc});
  t->set(ApiId::kFree, {parse_free, work_free});
  t->set(ApiId::kMemcpy, {parse_memcpy, work_memcpy});
  t->set(ApiId::kMemcpyAsync, {parse_memcpy_async, work_memcpy_async});
  t->set(ApiId::kMemset, {parse_memset, work_memset});
  t->set(ApiId::kMemsetAsync, {parse_memset_async, work_memset});
  t->set(ApiId::kPointerGetAttributes, {parse_pointer_attributes, work_nothing});
  t->set(ApiId::kMemcpyToSymbol, {parse_to_symbol, work_to_symbol});
  t->set(ApiId::kMemcpyFromSymbol, {parse_from_symbol, work_from_symbol});
}

}  // namespace pos::cuda_impl
