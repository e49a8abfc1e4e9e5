// region_table.h — DIR/regions of a driver memory image (the GPU part of an in-process job's dump):
// which device allocations it holds, where their bytes are in DIR/memory.bin, a CRC-32C per chunk.
// Written by the job's runtime (remoting/driver/device_image.h), read by it and by pos-cli.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos::ckpt {

// One saved allocation: where it lives and where its bytes are in memory.bin.
struct SavedRegion {
  int dev = 0;
  uint64_t addr = 0, size = 0, offset = 0;
  std::vector<uint32_t> crcs;  // CRC-32C of each chunk of `chunk` bytes (the last one shorter)
};

struct RegionTable {
  static constexpr uint32_t kFormat = 1;
  uint64_t chunk = 0;
  std::vector<SavedRegion> regions;  // ascending addresses, no overlap
  uint64_t bytes() const;            // the sum of the sizes
};

// DIR/regions as text (docs/image_format.md, "Driver memory image"); parse checks every field, the bounds, the order, the
// chunk counts and the table's own checksum, and names what is wrong (kCorrupt).
std::string region_table_text(const RegionTable& t);
StatusOr<RegionTable> parse_region_table(const std::string& text);
StatusOr<RegionTable> read_region_table(const std::string& dir);

}  // namespace pos::ckpt
