// module_api.cc — modules (fatbins), functions, variables and kernel launches. Launch parsing
// finds pointer parameters (8-byte words inside live buffers, also inside structs) and records edges.
#include <cstring>

#include "pos/cuda_impl/api_functions.h"
#include "pos/base/fatbin.h"

namespace pos::cuda_impl {
namespace {

constexpr uint64_t kMaxNameLength = 4096;
constexpr uint64_t kMaxSharedMem = 228u << 10;  // Hopper's per-block maximum

std::string param_string(const APIContext& c, size_t i) {
  auto b = c.param_bytes(i);
  std::string s(reinterpret_cast<const char*>(b.data()), b.size());
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

Status check_name(const APIContext& c, size_t i, std::string* out) {
  if (i >= c.param_count()) return cuda_error(cuda::kErrorInvalidValue, "missing name");
  *out = param_string(c, i);
  if (out->empty() || out->size() > kMaxNameLength || out->find('\0') != std::string::npos)
    return cuda_error(cuda::kErrorInvalidValue, "invalid symbol name");
  return Status::Ok();
}

// __cudaRegisterFatBinary(fatbin bytes) → module handle
Status parse_register_fatbin(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  auto bytes = c.param_bytes(0);
  POS_RETURN_IF_ERROR(validate_fatbin(bytes));
  auto h = ps.mgr(ResourceType::kModule).allocate_mocked_resource(0, {ps.context}, c.pc);
  if (!h.ok()) return h.status();
  (*h)->blob.assign(bytes.begin(), bytes.end());
  c.h[0] = *h;
  c.add_edge(*h, EdgeKind::kCreate);
  c.set_ret<uint64_t>((*h)->client_addr);
  return Status::Ok();
}
Status work_register_fatbin(WorkerScope& ws, APIContext& c) {
  auto m = ws.backend->module_load(c.h[0]->blob);
  if (!m.ok()) return m.status();
  c.h[0]->backend_obj = *m;
  ws.loaded.push_back(c.h[0]);
  return Status::Ok();
}

// __cudaRegisterFunction(module, mangled name) → FunctionRegistration + parameter layout
Status parse_register_function(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(2));
  POS_PARAM(c, 0, uint64_t, mv);
  Handle* m = ps.mgr(ResourceType::kModule).get(mv);
  if (m == nullptr) return cuda_error(cuda::kErrorInvalidResourceHandle, "unknown module " + hex(mv));
  std::string name;
  POS_RETURN_IF_ERROR(check_name(c, 1, &name));
  auto h = ps.mgr(ResourceType::kFunction).allocate_mocked_resource(0, {m}, c.pc);
  if (!h.ok()) return h.status();
  (*h)->name = std::move(name);
  c.h[0] = *h, c.h[1] = m;
  c.add_edge(*h, EdgeKind::kCreate);
  return Status::Ok();
}
Status work_register_function(WorkerScope& ws, APIContext& c) {
  Handle* f = c.h[0];
  auto info = ws.backend->function_get(c.h[1]->backend_obj, f->name);
  if (!info.ok()) return info.status();
  f->backend_obj = info->obj;
  f->resolved = info->found;
  f->layout = info->layout;
  f->param_bytes = info->param_bytes;
  ws.loaded.push_back(f);
  // Result: header + one record per parameter, so the client can serialize arguments.
  FunctionRegistration r{};
  r.handle = f->client_addr;
  r.found = info->found ? 1 : 0;
  r.param_count = static_cast<uint32_t>(f->layout.size());
  r.param_bytes = f->param_bytes;
  std::vector<std::byte> out(sizeof(r) + f->layout.size() * sizeof(RegisteredParam));
  std::memcpy(out.data(), &r, sizeof(r));
  for (size_t i = 0; i < f->layout.size(); ++i) {
    RegisteredParam p{f->layout[i].offset, f->layout[i].size, f->layout[i].read_only ? 1u : 0u};
    std::memcpy(out.data() + sizeof(r) + i * sizeof(p), &p, sizeof(p));
  }
  c.set_ret_bytes(out.data(), out.size());
  return Status::Ok();
}

// __cudaRegisterVar(module, name, size, constant) → device address of the variable
Status parse_register_var(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(4));
  POS_PARAM(c, 0, uint64_t, mv);
  POS_PARAM(c, 2, uint64_t, size);
  POS_PARAM(c, 3, int32_t, constant);
  Handle* m = ps.mgr(ResourceType::kModule).get(mv);
  if (m == nullptr) return cuda_error(cuda::kErrorInvalidResourceHandle, "unknown module " + hex(mv));
  std::string name;
  POS_RETURN_IF_ERROR(check_name(c, 1, &name));
  if (size == 0 || size > (1ull << 30)) return cuda_error(cuda::kErrorInvalidValue, "variable size out of range");
  auto h = ps.mgr(ResourceType::kVar).allocate_mocked_resource(size, {m}, c.pc);
  if (!h.ok()) return h.status();
  (*h)->charged = ps.mgr(ResourceType::kVar).round_up(size);
  if (!ps.device_backend->try_reserve((*h)->charged)) {
    ps.mgr(ResourceType::kVar).mark_deleted(*h);
    ps.mgr(ResourceType::kVar).release(*h);
    return cuda_error(cuda::kErrorMemoryAllocation, "device memory exhausted");
  }
  (*h)->name = std::move(name);
  (*h)->flags = constant != 0 ? 1 : 0;
  c.h[0] = *h, c.h[1] = m;
  c.add_edge(*h, EdgeKind::kCreate);
  return Status::Ok();
}
Status work_register_var(WorkerScope& ws, APIContext& c) {
  Handle* v = c.h[0];
  POS_RETURN_IF_ERROR(ws.backend->var_bind(c.h[1]->backend_obj, v->name, v->client_addr, v->size));
  ws.loaded.push_back(v);
  c.set_ret<uint64_t>(v->client_addr);
  return Status::Ok();
}

// __cudaUnregisterFatBinary(module): the module, its functions and its variables go.
Status parse_unregister_fatbin(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, mv);
  HandleManager& mods = ps.mgr(ResourceType::kModule);
  Handle* m = mods.get(mv);
  if (m == nullptr) return cuda_error(cuda::kErrorInvalidResourceHandle, "unknown module " + hex(mv));
  for (ResourceType t : {ResourceType::kFunction, ResourceType::kVar}) {
    HandleManager& mgr = ps.mgr(t);
    mgr.for_each([&](Handle* h) {
      if (h->state == HandleState::kActive && !h->parents.empty() && h->parents[0] == m) {
        mgr.mark_deleted(h);
        c.add_edge(h, EdgeKind::kDelete);
      }
    });
  }
  mods.mark_deleted(m);
  c.h[0] = m;
  c.add_edge(m, EdgeKind::kDelete);  // last: children are released before their parent
  return Status::Ok();
}
Status work_unregister_fatbin(WorkerScope& ws, APIContext& c) {
  Status first;
  // The edges are the module and everything registered on it (parse_unregister_fatbin).
  ws.forget_loaded([&](const Handle* h) { return h == c.h[0] || (!h->parents.empty() && h->parents[0] == c.h[0]); });
  for (size_t i = 0; i < c.edges.size(); ++i) {
    Handle* h = c.edges[i].handle;
    if (h->type == ResourceType::kVar) {
      Status s = ws.backend->free_at(h->client_addr, h->size);
      if (first.ok() && !s.ok()) first = s;
    }
  }
  Status s = ws.backend->module_unload(c.h[0]->backend_obj);
  return first.ok() ? s : first;
}

// cudaLaunchKernel(function, dims, stream, parameter buffer)
Status parse_launch(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(4));
  POS_PARAM(c, 0, uint64_t, fv);
  POS_PARAM(c, 1, LaunchDims, d);
  POS_PARAM(c, 2, uint64_t, sv);
  Handle* f = ps.mgr(ResourceType::kFunction).get(fv);
  if (f == nullptr) return cuda_error(cuda::kErrorInvalidDeviceFunction, hex(fv) + " is not a registered function");
  if (!f->resolved)
    return cuda_error(cuda::kErrorInvalidDeviceFunction, "the device has no kernel " + quoted_name(f->name));
  const uint64_t threads = uint64_t{d.block[0]} * d.block[1] * d.block[2];
  if (d.grid[0] == 0 || d.grid[1] == 0 || d.grid[2] == 0 || threads == 0 || threads > 1024 || d.block[0] > 1024 ||
      d.block[1] > 1024 || d.block[2] > 64 || d.grid[0] > 0x7fffffffu || d.grid[1] > 65535 || d.grid[2] > 65535)
    return cuda_error(cuda::kErrorInvalidConfiguration, "invalid launch configuration for " + quoted_name(f->name));
  if (d.shared_mem > kMaxSharedMem)
    return cuda_error(cuda::kErrorInvalidValue, "dynamic shared memory of " + std::to_string(d.shared_mem) + " bytes is too large");
  Handle* s = ps.stream(sv);
  if (s == nullptr) return cuda_error(cuda::kErrorInvalidResourceHandle, "unknown stream " + hex(sv));
  auto params = c.param_bytes(3);
  if (params.size() != f->param_bytes)
    return cuda_error(cuda::kErrorInvalidValue, quoted_name(f->name) + " takes " + std::to_string(f->param_bytes) +
                                                    " parameter bytes, got " + std::to_string(params.size()));
  // Pointer parameters: every aligned 8-byte word (also inside struct parameters) that falls in
  // the POS window must be inside a live buffer of this client; those buffers get edges. A word
  // outside the window may be an integer and passes here; the host backend, whose kernels run
  // inside posd, checks each real pointer parameter by its type before the kernel runs, so such a
  // value never reaches a host kernel as a pointer (the CUDA backend cannot: it has no types).
  for (size_t i = 0; i < f->layout.size(); ++i) {
    const KernelParam& p = f->layout[i];
    if (p.offset > params.size() || p.size > params.size() - p.offset) return Status::Internal("layout out of range");
    for (uint64_t w = 0; w + 8 <= p.size; w += 8) {
      uint64_t v = 0;
      std::memcpy(&v, params.data() + p.offset + w, 8);
      if (!ps.in_pos_window(v)) continue;  // not a device pointer of any tenant
      uint64_t off = 0;
      Handle* h = ps.device_range(v, 0, &off);
      // One past the end (an end iterator) is the buffer's own: reservations keep a guard byte,
      // so it is never the start of another buffer.
      if (h == nullptr && (h = ps.device_range(v - 1, 1, &off)) != nullptr) ++off;
      if (h == nullptr)
        return cuda_error(cuda::kErrorInvalidValue, "parameter " + std::to_string(i) + " of " + quoted_name(f->name) + " (" +
                                                        hex(v) + ") points to freed or unallocated device memory");
      c.add_edge(h, (p.read_only && p.size == 8) ? EdgeKind::kIn : EdgeKind::kInOut, off);
    }
  }
  c.h[0] = f, c.h[1] = s;
  return Status::Ok();
}
Status work_launch(WorkerScope& ws, APIContext& c) {
  LaunchDims d{};
  std::memcpy(&d, c.param_bytes(1).data(), sizeof(d));
  return ws.backend->launch(c.h[0]->backend_obj, d, c.param_bytes(3), c.h[1]->backend_obj);
}

Status function_of(ParserScope& ps, APIContext& c, uint64_t fv) {
  Handle* f = ps.mgr(ResourceType::kFunction).get(fv);
  if (f == nullptr) return cuda_error(cuda::kErrorInvalidDeviceFunction, hex(fv) + " is not a registered function");
  if (!f->resolved) return cuda_error(cuda::kErrorInvalidDeviceFunction, "the device has no kernel " + quoted_name(f->name));
  c.h[0] = f;
  c.add_edge(f, EdgeKind::kIn);
  return Status::Ok();
}

Status parse_func_get_attributes(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, fv);
  return function_of(ps, c, fv);
}
Status work_func_get_attributes(WorkerScope& ws, APIContext& c) {
  auto a = ws.backend->function_attributes(c.h[0]->backend_obj);
  if (!a.ok()) return a.status();
  c.set_ret(*a);
  return Status::Ok();
}

// cudaFuncSetAttribute(function, attr, value): remembered on the handle (it is state a restore
// must re-apply).
Status parse_func_set_attribute(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(3));
  POS_PARAM(c, 0, uint64_t, fv);
  POS_PARAM(c, 1, int32_t, attr);
  POS_PARAM(c, 2, int32_t, value);
  POS_RETURN_IF_ERROR(function_of(ps, c, fv));
  c.edges[c.edges.size() - 1].kind = EdgeKind::kInOut;
  c.u[0] = static_cast<uint32_t>(attr), c.u[1] = static_cast<uint32_t>(value);
  c.h[0]->func_attrs.emplace_back(attr, value);  // state a restore re-applies (parser-owned)
  return Status::Ok();
}
Status work_func_set_attribute(WorkerScope& ws, APIContext& c) {
  const auto attr = static_cast<int32_t>(c.u[0]), value = static_cast<int32_t>(c.u[1]);
  return ws.backend->function_set_attribute(c.h[0]->backend_obj, attr, value);
}

Status parse_occupancy_common(ParserScope& ps, APIContext& c, size_t nparams) {
  POS_RETURN_IF_ERROR(c.expect_params(nparams));
  POS_PARAM(c, 0, uint64_t, fv);
  POS_PARAM(c, 1, int32_t, block);
  POS_PARAM(c, 2, uint64_t, smem);
  uint32_t flags = 0;
  if (nparams == 4) POS_RETURN_IF_ERROR(c.get(3, &flags));
  if (block <= 0) return cuda_error(cuda::kErrorInvalidValue, "block size must be positive");
  if (flags > 1) return cuda_error(cuda::kErrorInvalidValue, "invalid occupancy flags");
  POS_RETURN_IF_ERROR(function_of(ps, c, fv));
  c.u[0] = static_cast<uint64_t>(block), c.u[1] = smem, c.u[2] = flags;
  return Status::Ok();
}
Status parse_occupancy(ParserScope& ps, APIContext& c) { return parse_occupancy_common(ps, c, 3); }
Status parse_occupancy_flags(ParserScope& ps, APIContext& c) { return parse_occupancy_common(ps, c, 4); }
Status work_occupancy(WorkerScope& ws, APIContext& c) {
  auto n = ws.backend->occupancy(c.h[0]->backend_obj, static_cast<int32_t>(c.u[0]), c.u[1], static_cast<uint32_t>(c.u[2]));
  if (!n.ok()) return n.status();
  c.set_ret<int32_t>(*n);
  return Status::Ok();
}

}  // namespace

void register_module_apis(ApiTable* t) {
  t->set(ApiId::kRegisterFatBinary, {parse_register_fatbin, work_register_fatbin});
  t->set(ApiId::kRegisterFunction, {parse_register_function, work_register_function});
  t->set(ApiId::kRegisterVar, {parse_register_var, work_register_var});
  t->set(ApiId::kUnregisterFatBinary, {parse_unregister_fatbin, work_unregister_fatbin});
  t->set(ApiId::kLaunchKernel, {parse_launch, work_launch});
  t->set(ApiId::kFuncGetAttributes, {parse_func_get_attributes, work_func_get_attributes});
  t->set(ApiId::kFuncSetAttribute, {parse_func_set_attribute, work_func_set_attribute});
  t->set(ApiId::kOccupancyMaxActiveBlocks, {parse_occupancy, work_occupancy});
  t->set(ApiId::kOccupancyMaxActiveBlocksWithFlags, {parse_occupancy_flags, work_occupancy});
}

}  // namespace pos::cuda_impl
