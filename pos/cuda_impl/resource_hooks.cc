// resource_hooks.cc — the CUDA semantics of each resource type for the checkpoint engine and device
// moves (pos/resource_ops.h): its fields in an image, its backend object made again, what a move carries.
#include "ckpt/image.pb.h"
#include "pos/cuda_impl/api_functions.h"

namespace pos::cuda_impl {
namespace {

// ---- shared ----

bool never_pins(const ParserScope&, const Handle&) { return false; }
bool always_pins(const ParserScope&, const Handle&) { return true; }
// The new device's context (BackendClient) brings what these handles stand for.
Status move_with_context(MoveScope&, Handle*) { return Status::Ok(); }
// Only handles the worker loads (WorkerScope::loaded) reach a move; a type that gets here pins its
// client (its pins hook), so this is a POS bug, said as one rather than state dropped.
Status move_pinned(MoveScope&, Handle* h) {
  return Status::Internal(std::string(resource_type_name(h->type)) + " " + hex(h->client_addr) +
                          " cannot move to another device: a live one keeps its client on its device");
}

// The backend object of h's module on the backend it moves to (modules move first).
StatusOr<uint64_t> moved_module(const MoveScope& s, const Handle& h, const std::string& what) {
  auto it = h.parents.empty() ? s.objs.end() : s.objs.find(h.parents[0]);
  if (it == s.objs.end()) return Status::Internal(what + ": its module was not loaded");
  return it->second;
}

// The module a function or variable was registered on (restored before it: parents come first).
StatusOr<Handle*> restored_module(const Handle& h) {
  if (h.parents.empty() || h.parents[0]->type != ResourceType::kModule)
    return Status::Corrupt(std::string("a ") + std::string(resource_type_name(h.type)) + " needs its module");
  return h.parents[0];
}

// ---- device and context: the roots; the backend client is their device state ----

Status restore_device(RestoreScope& s, const ckpt::pb::HandleRecord&, Handle* h) {
  s.ps.device = h;
  return Status::Ok();
}
Status restore_context(RestoreScope& s, const ckpt::pb::HandleRecord&, Handle* h) {
  s.ps.context = h;
  return Status::Ok();
}

// ---- streams: the legacy default stream comes with the context; the others are made again ----

void record_stream(const Handle& h, ckpt::pb::HandleRecord* r) {
  r->set_flags(h.flags);
  r->set_priority(h.priority);
}
Status restore_stream(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h) {
  h->flags = r.flags();
  h->priority = r.priority();
  if (r.id() == s.client.default_stream()) {
    s.ps.default_stream = h;
    h->backend_obj = 0;
    return Status::Ok();
  }
  auto st = s.ws.backend->stream_create(h->flags, h->priority);
  if (!st.ok()) return st.status();
  h->backend_obj = *st;
  return Status::Ok();
}
bool stream_pins(const ParserScope& ps, const Handle& h) { return &h != ps.default_stream; }
Status move_stream(MoveScope& s, Handle* h) {
  if (h->backend_obj == 0) return move_with_context(s, h);  // the default stream
  return move_pinned(s, h);
}

// ---- events ----

void record_event(const Handle& h, ckpt::pb::HandleRecord* r) {
  r->set_flags(h.flags);
  r->set_recorded(h.recorded);
}
Status restore_event(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h) {
  h->flags = r.flags();
  h->recorded = r.recorded();
  auto e = s.ws.backend->event_create(h->flags);
  if (!e.ok()) return e.status();
  h->backend_obj = *e;
  // A recorded event had completed by the cut (the cut synchronizes): record it again so that
  // queries and waits see it complete.
  if (h->recorded) return s.ws.backend->event_record(*e, 0);
  return Status::Ok();
}

// ---- memory: the engine has reserved its charge; its bytes come from the engine's loaders ----

Status restore_memory(RestoreScope& s, const ckpt::pb::HandleRecord&, Handle* h) {
  s.ps.memory_in_use += h->charged;  // the client's quota (cudaMalloc's parser counts the same)
  return s.ws.backend->alloc_at(h->client_addr, h->size);
}

// ---- modules, functions, variables: what the worker loads, and a device move loads again ----

void record_module(const Handle& h, ckpt::pb::HandleRecord* r) {
  if (!h.blob.empty()) r->set_fatbin(h.blob.data(), h.blob.size());
}
Status restore_module(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h) {
  const auto* b = reinterpret_cast<const std::byte*>(r.fatbin().data());
  h->blob.assign(b, b + r.fatbin().size());
  auto m = s.ws.backend->module_load(h->blob);
  if (!m.ok()) return m.status();
  h->backend_obj = *m;
  s.ws.loaded.push_back(h);
  return Status::Ok();
}
Status move_module(MoveScope& s, Handle* h) {
  auto m = s.backend.module_load(h->blob);
  if (!m.ok()) return m.status().with_context("module " + std::to_string(h->id));
  s.objs[h] = *m;
  return Status::Ok();
}

void record_function(const Handle& h, ckpt::pb::HandleRecord* r) {
  r->set_name(h.name);
  for (auto [a, v] : h.func_attrs) {
    auto* fa = r->add_func_attrs();
    fa->set_attr(a);
    fa->set_value(v);
  }
}
Status restore_function(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h) {
  h->name = r.name();
  for (const auto& fa : r.func_attrs()) h->func_attrs.emplace_back(fa.attr(), fa.value());
  auto module = restored_module(*h);
  if (!module.ok()) return module.status();
  auto info = s.ws.backend->function_get((*module)->backend_obj, h->name);
  if (!info.ok()) return info.status();
  h->backend_obj = info->obj;
  h->resolved = info->found;
  h->layout = info->layout;
  h->param_bytes = info->param_bytes;
  for (auto [a, v] : h->func_attrs) POS_RETURN_IF_ERROR(s.ws.backend->function_set_attribute(h->backend_obj, a, v));
  s.ws.loaded.push_back(h);
  return Status::Ok();
}
// An attribute set on the kernel (cudaFuncSetAttribute) is device state a reload would not have.
bool function_pins(const ParserScope&, const Handle& h) { return !h.func_attrs.empty(); }
Status move_function(MoveScope& s, Handle* h) {
  const std::string what = "function " + quoted_name(h->name);
  auto module = moved_module(s, *h, what);
  if (!module.ok()) return module.status();
  auto info = s.backend.function_get(*module, h->name);
  if (!info.ok()) return info.status().with_context(what);
  // The parser has told the app whether the kernel exists: a device that disagrees (another
  // architecture) cannot take the job.
  if (info->found != h->resolved || info->param_bytes != h->param_bytes) {
    const char* why = h->resolved ? " has no kernel on device " : " differs on device ";
    return Status::Cuda(cuda::kErrorInvalidDeviceFunction, what + why + std::to_string(s.device));
  }
  s.objs[h] = info->obj;
  return Status::Ok();
}

void record_var(const Handle& h, ckpt::pb::HandleRecord* r) {
  r->set_name(h.name);
  r->set_flags(h.flags);  // 1: __constant__
}
Status restore_var(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h) {
  h->name = r.name();
  h->flags = r.flags();
  auto module = restored_module(*h);
  if (!module.ok()) return module.status();
  POS_RETURN_IF_ERROR(s.ws.backend->var_bind((*module)->backend_obj, h->name, h->client_addr, h->size));
  s.ws.loaded.push_back(h);
  return Status::Ok();
}
// Written since registration: its bytes are the job's, not the module's initial image.
bool var_pins(const ParserScope&, const Handle& h) { return h.version != h.created_pc; }
Status move_var(MoveScope& s, Handle* h) {
  const std::string what = "var " + quoted_name(h->name);
  auto module = moved_module(s, *h, what);
  if (!module.ok()) return module.status();
  return s.backend.var_bind(*module, h->name, h->client_addr, h->size).with_context(what);
}

// ---- cuBLAS handles: made again, then bound to their streams once every stream exists ----

void record_cublas(const Handle& h, ckpt::pb::HandleRecord* r) {
  r->set_math_mode(h.math_mode);
  r->set_bound_stream(h.bound_stream);
}
Status restore_cublas(RestoreScope& s, const ckpt::pb::HandleRecord& r, Handle* h) {
  h->math_mode = r.math_mode();
  h->bound_stream = r.bound_stream();
  auto b = s.ws.backend->blas_create();
  if (!b.ok()) return b.status();
  h->backend_obj = *b;
  return s.ws.backend->blas_set_math_mode(*b, h->math_mode);
}
Status link_cublas(RestoreScope& s, Handle* h) {
  h->bound_stream_handle = s.ps.stream(h->bound_stream);
  if (h->bound_stream_handle == nullptr) h->bound_stream_handle = s.ps.default_stream, h->bound_stream = 0;
  return s.ws.backend->blas_set_stream(h->backend_obj, h->bound_stream_handle->backend_obj);
}

}  // namespace

void register_resource_hooks(ResourceTable* t) {
  using enum DeviceBytes;
  t->set(ResourceType::kDevice, {.restore = restore_device, .pins = never_pins, .move = move_with_context});
  t->set(ResourceType::kContext, {.restore = restore_context, .pins = never_pins, .move = move_with_context});
  t->set(ResourceType::kStream,
         {.record = record_stream, .restore = restore_stream, .pins = stream_pins, .move = move_stream});
  t->set(ResourceType::kEvent,
         {.record = record_event, .restore = restore_event, .pins = always_pins, .move = move_pinned});
  t->set(ResourceType::kMemory,
         {.bytes = kBuffer, .restore = restore_memory, .pins = always_pins, .move = move_pinned});
  t->set(ResourceType::kModule,
         {.record = record_module, .restore = restore_module, .pins = never_pins, .move = move_module});
  t->set(ResourceType::kFunction,
         {.record = record_function, .restore = restore_function, .pins = function_pins, .move = move_function});
  t->set(ResourceType::kVar,
         {.bytes = kVariable, .record = record_var, .restore = restore_var, .pins = var_pins, .move = move_var});
  t->set(ResourceType::kCublas, {.record = record_cublas,
                                 .restore = restore_cublas,
                                 .link = link_cublas,
                                 .pins = always_pins,
                                 .move = move_pinned});
}

}  // namespace pos::cuda_impl
