// region_table.h — DIR/regions of a driver memory image (the GPU part of an in-process job's dump):
// which device allocations it holds, where their bytes are in DIR/memory.bin, a CRC-32C per chunk.
// Written by the job's runtime (remoting/driver/device_image.h), read by it and by pos-cli.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pos/base/status.h"

namespace pos::ckpt {

// One saved allocation: where it lives, and where its bytes start in the image's byte stream (the
// allocations back to back, in table order).
struct SavedRegion {
  int dev = 0;
  uint64_t addr = 0, size = 0, offset = 0;
  std::vector<uint32_t> crcs;  // CRC-32C of each chunk of `chunk` bytes (the last one shorter)
};

// The byte stream is cut into chunks (each region's own, the last one shorter) and chunk g (in table
// order) is stored in file g % files, after that file's earlier chunks: each copy thread writes a
// file of its own, since writers of one file take turns on its lock (docs/BENCHMARKS.md).
struct RegionTable {
  static constexpr uint32_t kFormat = 1;
  static constexpr uint32_t kMaxFiles = 64;
  uint64_t chunk = 0;
  uint32_t files = 1;
  std::vector<SavedRegion> regions;  // ascending addresses, no overlap
  uint64_t bytes() const;            // the sum of the sizes
};

struct ChunkPlace {
  size_t region;
  uint64_t off, n;  // within the region
  uint32_t file;
  uint64_t file_off;
};
// Every chunk of the table, in order, with where it is stored.
std::vector<ChunkPlace> chunk_places(const RegionTable& t);
// The size each memory file must have.
std::vector<uint64_t> file_sizes(const RegionTable& t);
// "memory.<i>.bin".
std::string memory_file_name(uint32_t i);

// DIR/regions as text (docs/image_format.md, "Driver memory image"); parse checks every field, the bounds, the order, the
// chunk counts and the table's own checksum, and names what is wrong (kCorrupt).
std::string region_table_text(const RegionTable& t);
StatusOr<RegionTable> parse_region_table(const std::string& text);
StatusOr<RegionTable> read_region_table(const std::string& dir);

// A whole file of at most `max` bytes (not following a link at `path`): kNotFound if it cannot be
// opened, kCorrupt if it is larger. Image files are input like any other.
StatusOr<std::string> read_bounded_file(const std::string& path, uint64_t max);

}  // namespace pos::ckpt
