// image_fuzz.cc — fuzz target for the image reader's decoders (inventory framing, client records,
// their validation and rendering). libFuzzer entry point; without libFuzzer, a deterministic driver.
// Input: u32 length L, then L bytes of inventory.pb, then client.pb bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "ckpt/image.h"
#include "ckpt/inspect.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t len = 0;
  std::memcpy(&len, data, 4);
  if (len > size - 4) return 0;
  const std::string inv_bytes(reinterpret_cast<const char*>(data) + 4, len);
  auto inv = pos::ckpt::decode_inventory(inv_bytes);
  pos::ckpt::pb::ClientImage client;
  if (!client.ParseFromArray(data + 4 + len, static_cast<int>(size - 4 - len))) return 0;
  const uint64_t memory_size = inv.ok() ? inv->memory_size() : 1ull << 20;
  (void)pos::ckpt::validate_client(client, memory_size, inv.ok() && inv->has_parent());
  return 0;
}

#ifndef POS_LIBFUZZER
// Without libFuzzer (CI's gcc build): a valid seed, then seeded random mutations of it (bit flips,
// truncations, byte runs, length-field damage), plus any files named on the command line.
namespace {

std::string seed_input() {
  using namespace pos::ckpt;
  pb::Inventory inv;
  inv.set_format_version(kFormatVersion);
  inv.set_cut_pc(10);
  inv.set_memory_size(3 * 4096);
  pb::ClientImage c;
  c.mutable_client()->set_next_pc(10);
  for (int i = 0; i < 3; ++i) {
    auto* h = c.add_handles();
    h->set_id((4ull << 56) | (i + 1));
    h->set_type(4);
    h->set_addr(0x1000 * (i + 1));
    h->set_size(100);
    auto* m = h->mutable_memory();
    m->set_offset(4096 * i);
    m->set_length(100);
    m->set_chunk_size(kChunkSize);
    m->add_chunk_crc(1);
  }
  // Pending calls (format version 2): pcs from the cut, known APIs that return after parsing.
  for (uint32_t i = 0; i < 3; ++i) {
    auto* p = c.add_pending();
    p->set_pc(10 + 2 * i);
    p->set_api_id(i == 1 ? 0x206 : 0x201);  // cudaMemsetAsync, cudaMalloc
    p->add_params(std::string(8, static_cast<char>(i)));
    p->set_ret(std::string(8, 'r'));
  }
  const std::string ib = encode_inventory(inv);
  std::string cb;
  (void)c.SerializeToString(&cb);
  std::string out(4, '\0');
  const uint32_t len = static_cast<uint32_t>(ib.size());
  std::memcpy(out.data(), &len, 4);
  return out + ib + cb;
}

}  // namespace

int main(int argc, char** argv) {
  google::protobuf::SetLogHandler(nullptr);  // damaged strings are expected; the return codes matter
  for (int i = 1; i < argc; ++i) {
    FILE* f = std::fopen(argv[i], "rb");
    if (f == nullptr) return std::fprintf(stderr, "image_fuzz: cannot open %s\n", argv[i]), 1;
    std::vector<uint8_t> b;
    int ch;
    while ((ch = std::fgetc(f)) != EOF) b.push_back(static_cast<uint8_t>(ch));
    std::fclose(f);
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  const std::string seed = seed_input();
  {  // the seed itself is a valid image: mutations start from records that pass every check
    uint32_t len = 0;
    std::memcpy(&len, seed.data(), 4);
    auto inv = pos::ckpt::decode_inventory(seed.substr(4, len));
    pos::ckpt::pb::ClientImage client;
    if (!inv.ok() || !client.ParseFromString(seed.substr(4 + len))) return std::fprintf(stderr, "image_fuzz: bad seed\n"), 1;
    pos::Status s = pos::ckpt::validate_client(client, inv->memory_size(), false);
    if (!s.ok()) return std::fprintf(stderr, "image_fuzz: the seed does not validate: %s\n", s.to_string().c_str()), 1;
  }
  std::mt19937 g(12345);
  const int iterations = 200000;
  for (int it = 0; it < iterations; ++it) {
    std::string s = seed;
    const int edits = 1 + static_cast<int>(g() % 8);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      switch (g() % 4) {
        case 0: s[g() % s.size()] ^= static_cast<char>(1u << (g() % 8)); break;
        case 1: s.resize(g() % (s.size() + 1)); break;
        case 2: s.insert(g() % (s.size() + 1), std::string(1 + g() % 16, static_cast<char>(g()))); break;
        case 3: if (s.size() >= 4) { uint32_t v = static_cast<uint32_t>(g()); std::memcpy(s.data(), &v, 4); } break;
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("image_fuzz: %d mutated inputs decoded without a crash\n", iterations);
  return 0;
}
#endif
