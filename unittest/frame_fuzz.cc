// frame_fuzz.cc — fuzz target for posd's frame decoder (remoting/wire): every byte a client puts on
// its ring. libFuzzer entry point; without libFuzzer (gcc, CI), a seeded mutation driver.
// Input: the ring bytes; the last 4 KiB-aligned arena is a fixed 64 KiB buffer.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "remoting/common/wire.h"

namespace {
std::vector<std::byte> g_arena(64 << 10);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pos::wire::DecodedFrame f;
  const auto* p = reinterpret_cast<const std::byte*>(data);
  if (!pos::wire::decode_frame(p, size, g_arena.data(), g_arena.size(), &f).ok()) return 0;
  // Whatever decodes must be safe to read: every parameter inside the frame or the arena.
  const auto* arena_end = g_arena.data() + g_arena.size();
  uint64_t sum = 0;
  for (uint32_t i = 0; i < f.nparams; ++i) {
    const auto* b = static_cast<const std::byte*>(f.params[i].data);
    const bool in_frame = b >= p && b + f.params[i].size <= p + f.h.total_len;
    const bool in_arena = b >= g_arena.data() && b + f.params[i].size <= arena_end;
    if (!in_frame && !in_arena) __builtin_trap();
    for (uint64_t j = 0; j < f.params[i].size; j += 512) sum += static_cast<uint8_t>(b[j]);
  }
  if (f.h.total_len > size) __builtin_trap();
  return static_cast<int>(sum & 0);
}

#ifndef POS_LIBFUZZER
// Seeds: valid frames (inline, indirect, pad), then byte flips, truncations and insertions.
int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
  std::vector<std::vector<uint8_t>> seeds;
  uint64_t a = 5, off = 128;
  const char name[] = "_Z10test_kernelPfi";
  {
    std::array<pos::Param, 2> p{pos::Param{&a, 8}, pos::Param{name, sizeof(name)}};
    std::array<uint64_t, 2> s{8, sizeof(name)};
    std::vector<uint8_t> b(pos::wire::frame_bytes(s));
    pos::wire::encode_frame(reinterpret_cast<std::byte*>(b.data()), 0x402, pos::wire::kFlagReply, 9, 64, p, s);
    seeds.push_back(b);
  }
  {
    std::array<pos::Param, 2> p{pos::Param{&a, 8}, pos::Param{&off, 8}};
    std::array<uint64_t, 2> s{8, 4096 | pos::wire::kIndirect};
    std::vector<uint8_t> b(pos::wire::frame_bytes(s));
    pos::wire::encode_frame(reinterpret_cast<std::byte*>(b.data()), 0x204, 0, 10, 0, p, s);
    seeds.push_back(b);
  }
  {
    pos::wire::FrameHeader pad{pos::wire::kFrameMagic, 64, 0, 0, pos::wire::kFlagPad, 0, 0};
    std::vector<uint8_t> b(64);
    std::memcpy(b.data(), &pad, sizeof(pad));
    seeds.push_back(b);
  }
  std::mt19937_64 rng(12345);
  long decoded = 0;
  for (long it = 0; it < iterations; ++it) {
    std::vector<uint8_t> b = seeds[it % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits && !b.empty(); ++e) {
      switch (rng() % 4) {
        case 0: b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: b[rng() % b.size()] = static_cast<uint8_t>(rng()); break;
        case 2: b.resize(rng() % (b.size() + 1)); break;
        default: b.insert(b.begin() + static_cast<long>(rng() % (b.size() + 1)), static_cast<uint8_t>(rng())); break;
      }
    }
    pos::wire::DecodedFrame f;
    decoded += pos::wire::decode_frame(reinterpret_cast<const std::byte*>(b.data()), b.size(), g_arena.data(),
                                       g_arena.size(), &f).ok();
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  std::printf("frame_fuzz: %ld mutated frames, %ld decoded, no invariant broken\n", iterations, decoded);
  return 0;
}
#endif
