// gpu_identity.h — which physical GPU a CUDA device ordinal is, by UUID: the job lists the GPUs it
// sees and uses, a dump records them, and a restore onto another GPU builds NVIDIA's remap from them.
//
// Header-only and device-neutral (the driver's calls come in as function pointers, as in
// placement.h): both ends use it, the job (libpos_driver) and pos-cli (job_dump.cc, job_restore.cc),
// which build from different libraries. UUIDs are spelled as nvidia-smi prints them
// ("GPU-" then 8-4-4-4-12 lowercase hex digits), so that an operator can compare them by eye.
#pragma once

#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pos/base/status.h"
#include "remoting/driver/driver_api.h"

namespace pos::driver {

using GpuUuid = std::array<unsigned char, 16>;  // CUuuid's bytes

inline std::string gpu_uuid_text(const GpuUuid& u) {
  char s[48];
  std::snprintf(s, sizeof(s),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
                u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return s;
}

// The bytes of a UUID in gpu_uuid_text's spelling (nothing else is accepted).
inline std::optional<GpuUuid> parse_gpu_uuid(std::string_view t) {
  if (t.size() != 40 || t.substr(0, 4) != "GPU-") return std::nullopt;
  GpuUuid u{};
  size_t at = 4;
  for (size_t i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) {
      if (t[at++] != '-') return std::nullopt;
    }
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = t[at++];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + d;
    }
    u[i] = static_cast<unsigned char>(v);
  }
  return u;
}

// A manifest's or an answer's list ("GPU-…,GPU-…"; empty: none known), each entry checked.
inline StatusOr<std::vector<std::string>> split_gpu_uuids(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view one = list.substr(0, comma);
    if (!parse_gpu_uuid(one)) return Status::Corrupt("\"" + std::string(one.substr(0, 48)) + "\" is not a GPU UUID");
    out.emplace_back(one);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
    if (list.empty()) return Status::Corrupt("a GPU UUID list ends with ','");
  }
  return out;
}

inline std::string join_gpu_uuids(const std::vector<std::string>& uuids) {
  std::string s;
  for (const std::string& u : uuids) s += (s.empty() ? "" : ",") + u;
  return s;
}

// NVIDIA's restore onto other GPUs (CUcheckpointRestoreArgs' gpuPairs) must name every GPU the
// checkpointed process had, old → new, with no new GPU twice. `seen`: the job's GPUs (every one
// its driver enumerated, in its ordinal order); the one at `from` moves to `to`. If `to` was among
// them too, the two swap, so that the new set has no GPU twice; every other GPU stays (old = new).
// kInvalidArgument when `from` is not among `seen`.
inline StatusOr<std::vector<std::pair<std::string, std::string>>> gpu_remap_pairs(const std::vector<std::string>& seen,
                                                                                  const std::string& from,
                                                                                  const std::string& to) {
  bool found = false;
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const std::string& g : seen) {
    found = found || g == from;
    pairs.emplace_back(g, g == from ? to : g == to ? from : g);
  }
  if (!found) return Status::InvalidArgument("the GPU " + from + " is not among the job's GPUs");
  return pairs;
}

// The driver's device queries the job answers pos-cli's `gpus` with. Not hooked: the real driver's.
struct GpuIdCalls {
  CUresult (*device_get_count)(int* n) = nullptr;
  CUresult (*device_get)(CUdevice* d, int ordinal) = nullptr;
  CUresult (*device_get_uuid)(GpuUuid* u, CUdevice d) = nullptr;  // cuDeviceGetUuid_v2, else cuDeviceGetUuid
  CUresult (*device_get_name)(char* name, int len, CUdevice d) = nullptr;
  bool complete() const { return device_get_count && device_get && device_get_uuid && device_get_name; }
};

// The calls from a loaded driver, looked up with `sym(name)` (the job passes glibc's dlsym, past
// its own; pos-cli plain dlsym). The UUID call is cuDeviceGetUuid_v2 where the driver has it (the
// newer one; cuDeviceGetUuid otherwise).
template <typename Lookup>
GpuIdCalls gpu_id_calls(Lookup&& sym) {
  GpuIdCalls c;
  c.device_get_count = reinterpret_cast<decltype(c.device_get_count)>(sym("cuDeviceGetCount"));
  c.device_get = reinterpret_cast<decltype(c.device_get)>(sym("cuDeviceGet"));
  c.device_get_uuid = reinterpret_cast<decltype(c.device_get_uuid)>(sym("cuDeviceGetUuid_v2"));
  if (c.device_get_uuid == nullptr) c.device_get_uuid = reinterpret_cast<decltype(c.device_get_uuid)>(sym("cuDeviceGetUuid"));
  c.device_get_name = reinterpret_cast<decltype(c.device_get_name)>(sym("cuDeviceGetName"));
  return c;
}

struct GpuInfo {
  std::string uuid, name;
};

// Every device the driver enumerates (this process's view: its CUDA_VISIBLE_DEVICES applies), in
// ordinal order. An error names the call that failed (CUDA_ERROR_NOT_INITIALIZED before cuInit).
inline StatusOr<std::vector<GpuInfo>> list_gpus(const GpuIdCalls& c) {
  if (!c.complete()) return Status::Unsupported("the driver lacks a device query (cuDeviceGetUuid)");
  int n = 0;
  if (const CUresult rc = c.device_get_count(&n); rc != kSuccess)
    return Status::Unavailable("cuDeviceGetCount failed: CUDA driver error " + std::to_string(rc));
  std::vector<GpuInfo> out;
  for (int i = 0; i < n; ++i) {
    CUdevice d = 0;
    GpuUuid u{};
    char name[256] = {};
    CUresult rc = c.device_get(&d, i);
    if (rc == kSuccess) rc = c.device_get_uuid(&u, d);
    if (rc == kSuccess) rc = c.device_get_name(name, static_cast<int>(sizeof(name) - 1), d);
    if (rc != kSuccess)
      return Status::Unavailable("querying CUDA device " + std::to_string(i) + " failed: CUDA driver error " +
                                 std::to_string(rc));
    out.push_back(GpuInfo{gpu_uuid_text(u), name});
  }
  return out;
}

}  // namespace pos::driver
