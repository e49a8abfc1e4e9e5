// stream_api.cc — streams and events: creation with the app's flags and priorities, ordering
// (wait-event), synchronization, queries and timing.
#include <algorithm>

#include "pos/cuda_impl/api_functions.h"

namespace pos::cuda_impl {
namespace {

constexpr int32_t kGreatestPriority = -5;  // what H100/H200 report for cudaDeviceGetStreamPriorityRange
constexpr int32_t kLeastPriority = 0;

Status bad_handle(const char* what, uint64_t v) {
  return cuda_error(cuda::kErrorInvalidResourceHandle, std::string("unknown ") + what + " " + hex(v));
}

Status create_stream(ParserScope& ps, APIContext& c, uint32_t flags, int32_t priority) {
  if ((flags & ~cuda::kStreamNonBlocking) != 0)
    return cuda_error(cuda::kErrorInvalidValue, "invalid stream flags " + hex(flags));
  auto h = ps.mgr(ResourceType::kStream).allocate_mocked_resource(0, {ps.context}, c.pc);
  if (!h.ok()) return h.status();
  (*h)->flags = flags;
  (*h)->priority = std::clamp(priority, kGreatestPriority, kLeastPriority);  // CUDA clamps too
  c.h[0] = *h;
  c.add_edge(*h, EdgeKind::kCreate);
  c.set_ret<uint64_t>((*h)->client_addr);
  return Status::Ok();
}
Status parse_stream_create(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  return create_stream(ps, c, 0, 0);
}
Status parse_stream_create_flags(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint32_t, flags);
  return create_stream(ps, c, flags, 0);
}
Status parse_stream_create_priority(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(2));
  POS_PARAM(c, 0, uint32_t, flags);
  POS_PARAM(c, 1, int32_t, priority);
  return create_stream(ps, c, flags, priority);
}
Status work_stream_create(WorkerScope& ws, APIContext& c) {
  auto s = ws.backend->stream_create(c.h[0]->flags, c.h[0]->priority);
  if (!s.ok()) return s.status();
  c.h[0]->backend_obj = *s;
  return Status::Ok();
}

Status parse_stream_destroy(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, v);
  Handle* s = ps.stream(v);
  if (s == nullptr || s == ps.default_stream) return bad_handle("stream", v);
  ps.mgr(ResourceType::kStream).mark_deleted(s);
  c.h[0] = s;
  c.add_edge(s, EdgeKind::kDelete);
  return Status::Ok();
}
Status work_stream_destroy(WorkerScope& ws, APIContext& c) { return ws.backend->stream_destroy(c.h[0]->backend_obj); }

Status parse_stream_one(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, v);
  Handle* s = ps.stream(v);
  if (s == nullptr) return bad_handle("stream", v);
  c.h[0] = s;
  c.add_edge(s, EdgeKind::kIn);
  return Status::Ok();
}
Status work_stream_sync(WorkerScope& ws, APIContext& c) {
  POS_RETURN_IF_ERROR(ws.backend->stream_synchronize(c.h[0]->backend_obj));
  if (const int32_t e = ws.async_error(); e != 0)
    return cuda_error(e, "earlier asynchronous error: " + ws.async_error_message);
  return Status::Ok();
}
Status work_stream_query(WorkerScope& ws, APIContext& c) { return ws.backend->stream_query(c.h[0]->backend_obj); }

// cudaStreamWaitEvent(stream, event, flags)
Status parse_stream_wait_event(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(3));
  POS_PARAM(c, 0, uint64_t, sv);
  POS_PARAM(c, 1, uint64_t, ev);
  POS_PARAM(c, 2, uint32_t, flags);
  Handle* s = ps.stream(sv);
  if (s == nullptr) return bad_handle("stream", sv);
  Handle* e = ps.mgr(ResourceType::kEvent).get(ev);
  if (e == nullptr) return bad_handle("event", ev);
  if (flags != 0 && flags != 1) return cuda_error(cuda::kErrorInvalidValue, "invalid cudaStreamWaitEvent flags");
  c.h[0] = s, c.h[1] = e;
  c.add_edge(s, EdgeKind::kInOut);
  c.add_edge(e, EdgeKind::kIn);
  return Status::Ok();
}
Status work_stream_wait_event(WorkerScope& ws, APIContext& c) {
  return ws.backend->stream_wait_event(c.h[0]->backend_obj, c.h[1]->backend_obj);
}

// ---- events ----
Status create_event(ParserScope& ps, APIContext& c, uint32_t flags) {
  const uint32_t known = cuda::kEventBlockingSync | cuda::kEventDisableTiming | cuda::kEventInterprocess;
  if ((flags & ~known) != 0) return cuda_error(cuda::kErrorInvalidValue, "invalid event flags " + hex(flags));
  if ((flags & cuda::kEventInterprocess) != 0 && (flags & cuda::kEventDisableTiming) == 0)
    return cuda_error(cuda::kErrorInvalidValue, "interprocess events need cudaEventDisableTiming");
  auto h = ps.mgr(ResourceType::kEvent).allocate_mocked_resource(0, {ps.context}, c.pc);
  if (!h.ok()) return h.status();
  (*h)->flags = flags;
  c.h[0] = *h;
  c.add_edge(*h, EdgeKind::kCreate);
  c.set_ret<uint64_t>((*h)->client_addr);
  return Status::Ok();
}
Status parse_event_create(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  return create_event(ps, c, 0);
}
Status parse_event_create_flags(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint32_t, flags);
  return create_event(ps, c, flags);
}
Status work_event_create(WorkerScope& ws, APIContext& c) {
  auto e = ws.backend->event_create(c.h[0]->flags);
  if (!e.ok()) return e.status();
  c.h[0]->backend_obj = *e;
  return Status::Ok();
}

Status parse_event_one(ParserScope& ps, APIContext& c, EdgeKind kind) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, uint64_t, ev);
  Handle* e = ps.mgr(ResourceType::kEvent).get(ev);
  if (e == nullptr) return bad_handle("event", ev);
  c.h[0] = e;
  c.add_edge(e, kind);
  return Status::Ok();
}
Status parse_event_destroy(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(parse_event_one(ps, c, EdgeKind::kDelete));
  ps.mgr(ResourceType::kEvent).mark_deleted(c.h[0]);
  return Status::Ok();
}
Status work_event_destroy(WorkerScope& ws, APIContext& c) { return ws.backend->event_destroy(c.h[0]->backend_obj); }
Status parse_event_in(ParserScope& ps, APIContext& c) { return parse_event_one(ps, c, EdgeKind::kIn); }
Status work_event_sync(WorkerScope& ws, APIContext& c) { return ws.backend->event_synchronize(c.h[0]->backend_obj); }
Status work_event_query(WorkerScope& ws, APIContext& c) { return ws.backend->event_query(c.h[0]->backend_obj); }

// cudaEventRecord(event, stream)
Status parse_event_record(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(2));
  POS_PARAM(c, 0, uint64_t, ev);
  POS_PARAM(c, 1, uint64_t, sv);
  Handle* e = ps.mgr(ResourceType::kEvent).get(ev);
  if (e == nullptr) return bad_handle("event", ev);
  Handle* s = ps.stream(sv);
  if (s == nullptr) return bad_handle("stream", sv);
  e->recorded = true;
  c.h[0] = e, c.h[1] = s;
  c.add_edge(e, EdgeKind::kOut);
  c.add_edge(s, EdgeKind::kIn);
  return Status::Ok();
}
Status work_event_record(WorkerScope& ws, APIContext& c) {
  return ws.backend->event_record(c.h[0]->backend_obj, c.h[1]->backend_obj);
}

// cudaEventElapsedTime(start, end) → milliseconds
Status parse_event_elapsed(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(2));
  POS_PARAM(c, 0, uint64_t, a);
  POS_PARAM(c, 1, uint64_t, b);
  Handle* ea = ps.mgr(ResourceType::kEvent).get(a);
  if (ea == nullptr) return bad_handle("event", a);
  Handle* eb = ps.mgr(ResourceType::kEvent).get(b);
  if (eb == nullptr) return bad_handle("event", b);
  if (((ea->flags | eb->flags) & cuda::kEventDisableTiming) != 0)
    return cuda_error(cuda::kErrorInvalidResourceHandle, "event created with cudaEventDisableTiming");
  if (!ea->recorded || !eb->recorded) return cuda_error(cuda::kErrorInvalidResourceHandle, "event was never recorded");
  c.h[0] = ea, c.h[1] = eb;
  c.add_edge(ea, EdgeKind::kIn);
  c.add_edge(eb, EdgeKind::kIn);
  return Status::Ok();
}
Status work_event_elapsed(WorkerScope& ws, APIContext& c) {
  auto ms = ws.backend->event_elapsed_ms(c.h[0]->backend_obj, c.h[1]->backend_obj);
  if (!ms.ok()) return ms.status();
  c.set_ret<float>(*ms);
  return Status::Ok();
}

}  // namespace

void register_stream_apis(ApiTable* t) {
  t->set(ApiId::kStreamCreate, {parse_stream_create, work_stream_create});
  t->set(ApiId::kStreamCreateWithFlags, {parse_stream_create_flags, work_stream_create});
  t->set(ApiId::kStreamCreateWithPriority, {parse_stream_create_priority, work_stream_create});
  t->set(ApiId::kStreamDestroy, {parse_stream_destroy, work_stream_destroy});
  t->set(ApiId::kStreamSynchronize, {parse_stream_one, work_stream_sync});
  t->set(ApiId::kStreamQuery, {parse_stream_one, work_stream_query});
  t->set(ApiId::kStreamWaitEvent, {parse_stream_wait_event, work_stream_wait_event});
  t->set(ApiId::kEventCreate, {parse_event_create, work_event_create});
  t->set(ApiId::kEventCreateWithFlags, {parse_event_create_flags, work_event_create});
  t->set(ApiId::kEventDestroy, {parse_event_destroy, work_event_destroy});
  t->set(ApiId::kEventRecord, {parse_event_record, work_event_record});
  t->set(ApiId::kEventSynchronize, {parse_event_in, work_event_sync});
  t->set(ApiId::kEventQuery, {parse_event_in, work_event_query});
  t->set(ApiId::kEventElapsedTime, {parse_event_elapsed, work_event_elapsed});
}

}  // namespace pos::cuda_impl
