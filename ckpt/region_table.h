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
  // Incremental images (format 2): per chunk, whether its bytes are the previous image's (its
  // checksum matched there), so not stored here; its place in the memory file is a hole. Empty:
  // every chunk stored.
  std::vector<bool> same;
  bool chunk_same(size_t i) const { return i < same.size() && same[i]; }
};

// The byte stream is cut into chunks (each region's own, the last one shorter) and chunk g (in table
// order) is stored in file g % files, after that file's earlier chunks: each copy thread writes a
// file of its own, since writers of one file take turns on its lock (docs/BENCHMARKS.md).
// An incremental image (format 2) also names allocations whose bytes it does not hold: unchanged
// since the previous image (the job image's `prev`), which holds them or inherits them in turn.
struct RegionTable {
  static constexpr uint32_t kFormat = 1;           // written when nothing is inherited
  static constexpr uint32_t kFormatIncremental = 2;
  static constexpr uint32_t kMaxFiles = 64;
  uint64_t chunk = 0;
  uint32_t files = 1;
  std::vector<SavedRegion> regions;    // stored here: ascending addresses, no overlap
  std::vector<SavedRegion> inherited;  // in a previous image (no offset, no checksums): ascending,
                                       // overlapping neither each other nor `regions`
  uint64_t bytes() const;              // the sum of the stored sizes
  uint64_t same_bytes() const;         // of those, the bytes of chunks left to the previous image
  bool incremental() const;            // inherits a region or leaves a chunk to the previous image
  // Every allocation of the image, stored or inherited, by address.
  std::vector<SavedRegion> allocations() const;
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
// chunk counts and the table's own checksum, and names what is wrong (kCorrupt). `inherit` lines
// (format 2) name the inherited allocations, and a region line's ` same A-B,C-D` the chunks (by
// index, inclusive ranges) it leaves to the previous image.
std::string region_table_text(const RegionTable& t);
StatusOr<RegionTable> parse_region_table(const std::string& text);
StatusOr<RegionTable> read_region_table(const std::string& dir);

// A whole file of at most `max` bytes (not following a link at `path`): kNotFound if it cannot be
// opened, kCorrupt if it is larger. Image files are input like any other.
StatusOr<std::string> read_bounded_file(const std::string& path, uint64_t max);

}  // namespace pos::ckpt
