#include <gtest/gtest.h>

#include <cstdint>

#include "core/BlockPool.h"
#include "core/Error.h"

namespace mt {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// The pool never touches the memory: made-up addresses stand in for device segments.
void* at(uintptr_t mib) {
  return reinterpret_cast<void*>((uintptr_t{1} << 40) + mib * kMiB);
}
const void* const kStreamA = at(100000);
const void* const kStreamB = at(200000);

TEST(BlockPool, SplitsTheBestFitAndMergesWhatIsGivenBack) {
  BlockPool pool;
  pool.addSegment(at(0), 64 * kMiB, kStreamA);
  size_t got = 0;
  void* a = pool.take(kStreamA, 10 * kMiB, &got);
  EXPECT_EQ(a, at(0));
  EXPECT_EQ(got, 10 * kMiB);
  void* b = pool.take(kStreamA, 20 * kMiB, &got);
  EXPECT_EQ(b, at(10));  // cut from the rest, right after a
  EXPECT_EQ(pool.freeBytes(), 34 * kMiB);
  EXPECT_EQ(pool.give(a), 10 * kMiB);
  EXPECT_TRUE(pool.releasable().empty());
  EXPECT_EQ(pool.take(kStreamA, 40 * kMiB, &got), nullptr);  // 10 + 34 free, not adjacent
  pool.give(b);  // a, b and the rest merge into the whole segment again
  EXPECT_EQ(pool.numBlocks(), 1u);
  ASSERT_EQ(pool.releasable().size(), 1u);
  EXPECT_EQ(pool.take(kStreamA, 64 * kMiB, &got), at(0));
}

TEST(BlockPool, SmallRemaindersStayWithTheBlock) {
  BlockPool pool;
  pool.addSegment(at(0), 10 * kMiB + kMiB / 2, kStreamA);
  size_t got = 0;
  EXPECT_EQ(pool.take(kStreamA, 10 * kMiB, &got), at(0));
  EXPECT_EQ(got, 10 * kMiB + kMiB / 2);
  EXPECT_EQ(pool.freeBytes(), 0u);
}

TEST(BlockPool, TakesTheSmallestBlockThatFitsOnTheSameStream) {
  BlockPool pool;
  pool.addSegment(at(0), 32 * kMiB, kStreamA);
  pool.addSegment(at(100), 8 * kMiB, kStreamA);
  pool.addSegment(at(200), 6 * kMiB, kStreamB);
  size_t got = 0;
  EXPECT_EQ(pool.take(kStreamA, 6 * kMiB, &got), at(100));  // not stream B's exact fit
  EXPECT_EQ(got, 6 * kMiB);
  EXPECT_EQ(pool.take(kStreamB, 7 * kMiB, &got), nullptr);  // never stream A's memory
  EXPECT_EQ(pool.take(kStreamB, 6 * kMiB, &got), at(200));
}

TEST(BlockPool, SegmentsNeverMergeAcrossTheirBoundary) {
  BlockPool pool;  // two segments that happen to be adjacent in the address space
  pool.addSegment(at(0), 4 * kMiB, kStreamA);
  pool.addSegment(at(4), 4 * kMiB, kStreamA);
  size_t got = 0;
  void* a = pool.take(kStreamA, 4 * kMiB, &got);
  void* b = pool.take(kStreamA, 4 * kMiB, &got);
  pool.give(a);
  pool.give(b);
  EXPECT_EQ(pool.numBlocks(), 2u);
  EXPECT_EQ(pool.take(kStreamA, 8 * kMiB, &got), nullptr);
  auto r = pool.releasable();
  ASSERT_EQ(r.size(), 2u);
  for (auto& seg : r)
    pool.removeSegment(seg.first);
  EXPECT_EQ(pool.segmentBytes(), 0u);
  EXPECT_EQ(pool.freeBytes(), 0u);
}

// What per-step gradient buffers need: blocks freed in one size (activations of a block) serve
// requests of another (a unit's gradients) with no new segment.
TEST(BlockPool, FreedBlocksServeOtherSizes) {
  BlockPool pool;
  std::vector<void*> act;
  size_t got = 0;
  for (uintptr_t i = 0; i < 3; ++i) {
    pool.addSegment(at(1000 * i), 210 * kMiB, kStreamA);
    act.push_back(pool.take(kStreamA, 210 * kMiB, &got));
  }
  pool.give(act[2]);
  pool.give(act[1]);
  for (int g = 0; g < 4; ++g)
    EXPECT_NE(pool.take(kStreamA, 100 * kMiB, &got), nullptr) << g;  // two a block
  EXPECT_EQ(pool.take(kStreamA, 100 * kMiB, &got), nullptr);         // 2 x 10 MiB left
  EXPECT_EQ(pool.segmentBytes(), 3 * 210 * kMiB);
  EXPECT_THROW(pool.give(at(5)), InternalError);           // not a block it handed out
  EXPECT_THROW(pool.removeSegment(at(0)), InternalError);  // in use
}

}  // namespace
}  // namespace mt
