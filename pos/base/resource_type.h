// resource_type.h — the kinds of resource a client holds (handles of the core, records of an image).
// Base layer: the core's managers and the image format (ckpt/) share these numbers.
#pragma once

#include <cstdint>
#include <string_view>

namespace pos {

// Part of the image format (HandleRecord.type): never renumber, only append before kCount.
enum class ResourceType : uint8_t {
  kDevice = 0,
  kContext,
  kStream,
  kEvent,
  kMemory,
  kModule,
  kFunction,
  kVar,
  kCublas,
  kCount,
};
inline constexpr uint32_t kResourceTypeCount = static_cast<uint32_t>(ResourceType::kCount);

constexpr std::string_view resource_type_name(ResourceType t) {
  switch (t) {
    case ResourceType::kDevice: return "device";
    case ResourceType::kContext: return "context";
    case ResourceType::kStream: return "stream";
    case ResourceType::kEvent: return "event";
    case ResourceType::kMemory: return "memory";
    case ResourceType::kModule: return "module";
    case ResourceType::kFunction: return "function";
    case ResourceType::kVar: return "var";
    case ResourceType::kCublas: return "cublas";
    case ResourceType::kCount: break;
  }
  return "?";
}

}  // namespace pos
