// crafted_image.h — POS images written by hand for tests: chosen buffers, memory files, stripes and
// parent, each chunk's checksum computed here; and a buffer's bytes read back through an image's chain.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/crc32c.h"
#include "ckpt/image.h"

namespace pos::ckpt::testing {

struct CraftedBuffer {
  uint64_t id = 0;      // the handle's id within the memory type; its address is id << 20
  std::string bytes;    // stored here (empty with in_parent)
  bool in_parent = false;
  uint64_t size = 0;    // with in_parent: the buffer's size
  bool striped = false;  // over all of the image's memory files, from `first_file`
  uint32_t first_file = 0;
};

struct CraftedImage {
  uint32_t files = 1;    // memory files
  uint32_t chunk = 4096;
  uint64_t cut = 10;
  std::string image_id;
  std::string parent_path, parent_id;  // empty: a whole image
  uint64_t parent_cut = 0;
  uint32_t version = kFormatVersion;
  std::vector<CraftedBuffer> buffers;
};

inline uint64_t crafted_key(uint64_t id) { return (4ull << 56) | id; }

// Writes `c` as the image directory `dir` (made). Unstriped buffers go to the files in turn.
inline void write_crafted_image(const std::string& dir, const CraftedImage& c) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::vector<std::string> files(c.files);
  auto align = [](uint64_t n) { return (n + 4095) / 4096 * 4096; };
  auto place = [&](uint32_t f, uint64_t off, const std::string& b) {
    if (files[f].size() < off + b.size()) files[f].resize(off + b.size(), '\0');
    files[f].replace(off, b.size(), b);
  };
  pb::ClientImage client;
  client.mutable_client()->set_next_pc(c.cut);
  uint32_t turn = 0;
  uint64_t stored = 0;
  for (const CraftedBuffer& b : c.buffers) {
    pb::HandleRecord* h = client.add_handles();
    h->set_id(crafted_key(b.id));
    h->set_type(4);
    h->set_addr(b.id << 20);
    h->set_size(b.in_parent ? b.size : b.bytes.size());
    h->set_version(1);
    pb::BlobRef* r = h->mutable_memory();
    if (b.in_parent) {
      r->set_in_parent(true);
      continue;
    }
    stored += b.bytes.size();
    r->set_length(b.bytes.size());
    r->set_chunk_size(c.chunk);
    for (uint64_t off = 0; off < b.bytes.size(); off += c.chunk)
      r->add_chunk_crc(crc32c(b.bytes.data() + off, std::min<uint64_t>(c.chunk, b.bytes.size() - off)));
    if (b.striped) {
      const uint32_t s = c.files - b.first_file;
      uint64_t at = 0;
      for (uint32_t f = b.first_file; f < c.files; ++f) at = std::max<uint64_t>(at, align(files[f].size()));
      r->set_file(b.first_file), r->set_stripes(s), r->set_offset(at);
      for (uint64_t i = 0; i * c.chunk < b.bytes.size(); ++i)
        place(b.first_file + static_cast<uint32_t>(i % s), at + (i / s) * c.chunk, b.bytes.substr(i * c.chunk, c.chunk));
    } else {
      const uint32_t f = turn++ % c.files;
      const uint64_t at = align(files[f].size());
      r->set_file(f), r->set_offset(at);
      place(f, at, b.bytes);
    }
  }
  std::string cbytes;
  client.SerializeToString(&cbytes);
  pb::Inventory inv;
  inv.set_format_version(c.version);
  inv.set_backend("host");
  inv.set_cut_pc(c.cut);
  inv.set_image_id(c.image_id);
  if (!c.parent_path.empty()) {
    inv.mutable_parent()->set_path(c.parent_path);
    inv.mutable_parent()->set_image_id(c.parent_id);
    inv.mutable_parent()->set_cut_pc(c.parent_cut);
    inv.add_features("incremental");
  }
  inv.set_memory_size(files[0].size());
  for (uint32_t f = 1; f < c.files; ++f) inv.add_memory_file_sizes(files[f].size());
  inv.set_blob_bytes(stored);
  inv.set_client_size(cbytes.size());
  inv.set_client_crc(crc32c(cbytes.data(), cbytes.size()));
  for (uint32_t f = 0; f < c.files; ++f)
    std::ofstream(dir + "/" + (f == 0 ? std::string("memory.bin") : "memory." + std::to_string(f) + ".bin"),
                  std::ios::binary) << files[f];
  std::ofstream(dir + "/client.pb", std::ios::binary) << cbytes;
  std::ofstream(dir + "/inventory.pb", std::ios::binary) << encode_inventory(inv);
}

// Buffer `id`'s bytes as a restore would read them (through the chain, every chunk verified), or
// "ERROR: why".
inline std::string crafted_read(const ImageReader& r, uint64_t id) {
  for (const pb::HandleRecord& h : r.client().handles()) {
    if (h.id() != crafted_key(id)) continue;
    auto at = r.resolve(h);
    if (!at.ok()) return "ERROR: " + at.status().message();
    const pb::BlobRef& ref = *at->second;
    std::string out(ref.length(), '\0');
    for (uint64_t off = 0; off < ref.length(); off += ref.chunk_size()) {
      const uint64_t n = std::min<uint64_t>(ref.chunk_size(), ref.length() - off);
      Status s = at->first->read_chunk(ref, off, n, reinterpret_cast<std::byte*>(out.data() + off));
      if (!s.ok()) return "ERROR: " + s.message();
    }
    return out;
  }
  return "ERROR: no buffer " + std::to_string(id);
}

}  // namespace pos::ckpt::testing
