// fatbin.cc — fatbin header validation (untrusted client bytes) and a test-blob builder.
// Only the container is checked here; the device backend validates the code inside.
#include "pos/base/fatbin.h"

#include <cstring>

namespace pos {

Status validate_fatbin(std::span<const std::byte> blob) {
  if (blob.size() < sizeof(FatbinHeader))
    return Status::Cuda(cuda::kErrorInvalidKernelImage, "fatbin of " + std::to_string(blob.size()) + " bytes is shorter than its header");
  FatbinHeader h{};
  std::memcpy(&h, blob.data(), sizeof(h));
  if (h.magic != kFatbinMagic) return Status::Cuda(cuda::kErrorInvalidKernelImage, "not a fatbin (bad magic)");
  if (h.header_size < sizeof(FatbinHeader) || h.header_size > blob.size())
    return Status::Cuda(cuda::kErrorInvalidKernelImage, "fatbin header size out of range");
  if (h.fat_size != blob.size() - h.header_size)
    return Status::Cuda(cuda::kErrorInvalidKernelImage, "fatbin size field (" + std::to_string(h.fat_size) +
                                                              ") does not match the blob (" +
                                                              std::to_string(blob.size() - h.header_size) + ")");
  return Status::Ok();
}

std::vector<std::byte> make_test_fatbin(size_t payload) {
  FatbinHeader h{kFatbinMagic, 1, static_cast<uint16_t>(sizeof(FatbinHeader)), payload};
  std::vector<std::byte> out(sizeof(h) + payload);
  std::memcpy(out.data(), &h, sizeof(h));
  for (size_t i = 0; i < payload; ++i) out[sizeof(h) + i] = static_cast<std::byte>(i * 31 + 7);
  return out;
}

}  // namespace pos
