// device_api.cc — device management and error APIs: device count/selection, properties,
// attributes, synchronize, memory info, versions, and the last-error pair.
#include <algorithm>

#include "pos/cuda_impl/api_functions.h"

namespace pos::cuda_impl {
namespace {

constexpr int32_t kRuntimeVersion = 13000;  // the CUDA runtime API version POS implements

Status check_device(const ParserScope& ps, int32_t dev) {
  if (dev < 0 || dev >= ps.device_count)
    return cuda_error(cuda::kErrorInvalidDevice, "device " + std::to_string(dev) + " does not exist (" +
                                                     std::to_string(ps.device_count) + " visible)");
  return Status::Ok();
}

// The app's device numbers are indices into the devices its client sees (ClientOptions::devices:
// posd's `devices`, renumbered as CUDA_VISIBLE_DEVICES does); the backend is asked about the device
// behind the number (-1, which the backend refuses, for a number that names none).
int32_t backend_device(const ParserScope& ps, int32_t dev) {
  return dev >= 0 && static_cast<size_t>(dev) < ps.devices.size() ? ps.devices[static_cast<size_t>(dev)] : -1;
}

// cudaGetDeviceCount: the devices this client sees.
Status parse_get_device_count(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  c.set_ret<int32_t>(ps.device_count);
  return Status::Ok();
}

// cudaGetDevice: the parser owns the current device.
Status parse_get_device(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  c.set_ret<int32_t>(ps.current_device);
  return Status::Ok();
}
Status work_nothing(WorkerScope&, APIContext&) { return Status::Ok(); }  // parser answered

// cudaSetDevice
Status parse_set_device(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, int32_t, dev);
  POS_RETURN_IF_ERROR(check_device(ps, dev));
  ps.current_device = dev;
  // The job's state follows the device it selects until it holds some (memory, streams, ...):
  // the usual `cudaSetDevice(local_rank)` first thing lands a job where it asked to be. After
  // that the number changes and the state stays (the worker says so once in the log).
  c.u[0] = static_cast<uint64_t>(backend_device(ps, dev));
  c.u[1] = ps.holds_device_state() ? 0 : 1;
  return Status::Ok();
}
Status work_set_device(WorkerScope& ws, APIContext& c) {
  const int to = static_cast<int>(c.u[0]);
  if (c.u[1] != 0) return ws.client->move_device(to);
  if (to != ws.client->device()) ws.client->note_device_stays(to);
  return Status::Ok();
}

// cudaGetDeviceProperties
Status parse_get_properties(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(1));
  POS_PARAM(c, 0, int32_t, dev);
  POS_RETURN_IF_ERROR(check_device(ps, dev));
  c.u[0] = static_cast<uint64_t>(backend_device(ps, dev));
  return Status::Ok();
}
Status work_get_properties(WorkerScope& ws, APIContext& c) {
  DeviceProps p{};
  POS_RETURN_IF_ERROR(ws.device->properties(static_cast<int>(c.u[0]), &p));
  c.set_ret(p);
  return Status::Ok();
}

// cudaDeviceGetAttribute(attr, device)
Status parse_get_attribute(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(2));
  POS_PARAM(c, 0, int32_t, attr);
  POS_PARAM(c, 1, int32_t, dev);
  POS_RETURN_IF_ERROR(check_device(ps, dev));
  c.u[0] = static_cast<uint64_t>(static_cast<uint32_t>(attr));
  c.u[1] = static_cast<uint64_t>(backend_device(ps, dev));
  return Status::Ok();
}
Status work_get_attribute(WorkerScope& ws, APIContext& c) {
  int32_t v = 0;
  POS_RETURN_IF_ERROR(ws.device->attribute(static_cast<int32_t>(c.u[0]), static_cast<int>(c.u[1]), &v));
  c.set_ret(v);
  return Status::Ok();
}

// cudaDeviceSynchronize: also reports an earlier asynchronous failure, as CUDA does.
Status parse_device_sync(ParserScope&, APIContext& c) { return c.expect_params(0); }
Status work_device_sync(WorkerScope& ws, APIContext&) {
  POS_RETURN_IF_ERROR(ws.backend->synchronize_all());
  if (const int32_t e = ws.async_error(); e != 0)
    return cuda_error(e, "earlier asynchronous error: " + ws.async_error_message);
  return Status::Ok();
}

// cudaMemGetInfo: the device's numbers, narrowed to the client's quota.
Status parse_mem_get_info(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  c.u[0] = ps.memory_quota.load(std::memory_order_relaxed);
  c.u[1] = ps.memory_in_use;
  c.u[2] = static_cast<uint64_t>(backend_device(ps, ps.current_device));
  return Status::Ok();
}
Status work_mem_get_info(WorkerScope& ws, APIContext& c) {
  MemInfo m{};
  POS_RETURN_IF_ERROR(ws.device->mem_info(static_cast<int>(c.u[2]), &m));
  const uint64_t quota = c.u[0], used = c.u[1];
  if (quota != 0) {
    m.total = std::min(m.total, quota);
    m.free = std::min(m.free, quota > used ? quota - used : 0);
  }
  c.set_ret(m);
  return Status::Ok();
}

Status parse_driver_version(ParserScope&, APIContext& c) { return c.expect_params(0); }
Status work_driver_version(WorkerScope& ws, APIContext& c) {
  c.set_ret<int32_t>(ws.device->driver_version());
  return Status::Ok();
}

Status parse_runtime_version(ParserScope&, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  c.set_ret<int32_t>(kRuntimeVersion);
  return Status::Ok();
}

// cudaGetLastError / cudaPeekAtLastError: the latest failure of a call that had already returned
// success to the app, as far as the worker has run: answered by the parser, never waiting for the
// worker (CUDA reports the errors known so far; a later failure shows at a later call or sync).
// Waiting would make every launch-then-check pair a round trip through the worker. Errors
// returned directly by a call are the client library's to remember (runtime semantics live there).
Status parse_get_last_error(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  c.skip_worker = true;
  const int32_t e = ps.async_error->exchange(0, std::memory_order_acq_rel);
  return e == 0 ? Status::Ok() : cuda_error(e, "an earlier call failed asynchronously");
}
Status parse_peek_last_error(ParserScope& ps, APIContext& c) {
  POS_RETURN_IF_ERROR(c.expect_params(0));
  c.skip_worker = true;
  const int32_t e = ps.async_error->load(std::memory_order_acquire);
  return e == 0 ? Status::Ok() : cuda_error(e, "an earlier call failed asynchronously");
}

}  // namespace

void register_device_apis(ApiTable* t) {
  t->set(ApiId::kGetDeviceCount, {parse_get_device_count, work_nothing});
  t->set(ApiId::kGetDevice, {parse_get_device, work_nothing});
  t->set(ApiId::kSetDevice, {parse_set_device, work_set_device});
  t->set(ApiId::kGetDeviceProperties, {parse_get_properties, work_get_properties});
  t->set(ApiId::kDeviceGetAttribute, {parse_get_attribute, work_get_attribute});
  t->set(ApiId::kDeviceSynchronize, {parse_device_sync, work_device_sync});
  t->set(ApiId::kMemGetInfo, {parse_mem_get_info, work_mem_get_info});
  t->set(ApiId::kDriverGetVersion, {parse_driver_version, work_driver_version});
  t->set(ApiId::kRuntimeGetVersion, {parse_runtime_version, work_nothing});
  t->set(ApiId::kGetLastError, {parse_get_last_error, work_nothing});
  t->set(ApiId::kPeekAtLastError, {parse_peek_last_error, work_nothing});
}

}  // namespace pos::cuda_impl
