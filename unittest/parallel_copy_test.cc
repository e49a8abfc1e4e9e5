// parallel_copy_test.cc — ParallelCopier (pos/parallel_copy.h): blocks split among threads arrive
// whole, at odd sizes and offsets, and helpers start only when a copy is worth splitting.
#include "pos/base/parallel_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

namespace pos {
namespace {

// Bytes no power-of-two stride repeats, so a chunk or piece landing one slot off shows.
std::vector<uint8_t> pattern(uint64_t n) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + i / 251 + 1);
  return v;
}

TEST(ParallelCopy, BlocksOfOddSizesAndOffsetsArriveWholeAndNothingAroundThemChanges) {
  ParallelCopier pc(4, 200000);
  const uint64_t kMax = (8ull << 20) + 3;
  const std::vector<uint8_t> src = pattern(kMax + 4096);
  const uint64_t piece = ParallelCopier::kMinPiece;
  const std::initializer_list<uint64_t> sizes = {1, 4095, 2 * piece - 1, 2 * piece, 2 * piece + 1, (3ull << 20) + 17, kMax};
  for (uint64_t n : sizes) {
    for (auto [so, dof] : {std::pair<uint64_t, uint64_t>{0, 0}, {1, 3}, {4095, 7}}) {
      std::vector<uint8_t> dst(n + 8192, 0xee);
      pc.copy(dst.data() + dof, src.data() + so, n);
      ASSERT_EQ(std::memcmp(dst.data() + dof, src.data() + so, n), 0) << n << " bytes, offsets " << so << "/" << dof;
      for (uint64_t i = 0; i < dof; ++i) ASSERT_EQ(dst[i], 0xee);
      for (uint64_t i = dof + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xee) << n;
    }
  }
  EXPECT_EQ(pc.helpers_started(), 3u);  // started by the first copy worth splitting
}

TEST(ParallelCopy, OneThreadMeansTheCallerAloneAndSmallCopiesStartNoHelper) {
  const std::vector<uint8_t> src = pattern(4 << 20);
  std::vector<uint8_t> dst(src.size());
  ParallelCopier alone(1, 0);
  alone.copy(dst.data(), src.data(), src.size());
  EXPECT_EQ(dst, src);
  EXPECT_EQ(alone.helpers_started(), 0u);
  ParallelCopier lazy(4, 0);
  lazy.copy(dst.data(), src.data(), ParallelCopier::kMinPiece);
  EXPECT_EQ(lazy.helpers_started(), 0u);
}

}  // namespace
}  // namespace pos
