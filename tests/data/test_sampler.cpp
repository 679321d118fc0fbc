#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data/Sampler.h"

namespace mt {
namespace {

TEST(Sampler, ShardsAreDisjointAndCoverTheEpoch) {
  const int W = 4;
  std::vector<int64_t> all;
  for (int r = 0; r < W; ++r) {
    DistributedSampler s(1000, r, W, true, 7, false);
    auto idx = s.indices(3);
    EXPECT_EQ(static_cast<int64_t>(idx.size()), s.samplesPerRank());
    all.insert(all.end(), idx.begin(), idx.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expect(1000);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(all, expect);
}

TEST(Sampler, ShuffleDependsOnSeedAndEpoch) {
  DistributedSampler a(500, 0, 1, true, 1, false), b(500, 0, 1, true, 2, false);
  EXPECT_NE(a.indices(0), a.indices(1));
  EXPECT_NE(a.indices(0), b.indices(0));
  EXPECT_EQ(a.indices(5), a.indices(5));
  DistributedSampler plain(10, 0, 1, false, 1, false);
  EXPECT_EQ(plain.indices(0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Sampler, PadOrDropLast) {
  // 10 samples on 4 ranks: pad to 12 by wrapping around, or drop to 8.
  std::multiset<int64_t> padded;
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(10, r, 4, false, 0, false);
    EXPECT_EQ(s.samplesPerRank(), 3);
    for (int64_t i : s.indices(0)) padded.insert(i);
  }
  EXPECT_EQ(padded.size(), 12u);
  EXPECT_EQ(padded.count(0), 2u);
  EXPECT_EQ(padded.count(1), 2u);
  std::set<int64_t> dropped;
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(10, r, 4, false, 0, true);
    EXPECT_EQ(s.samplesPerRank(), 2);
    for (int64_t i : s.indices(0)) dropped.insert(i);
  }
  EXPECT_EQ(dropped.size(), 8u);
  // A dataset smaller than the world still gives every rank a sample.
  DistributedSampler tiny(2, 4, 5, false, 0, false);
  EXPECT_EQ(tiny.indices(0), (std::vector<int64_t>{0}));
}

TEST(Sampler, FeistelIsAKeyedBijection) {
  for (int64_t n : {1, 2, 3, 17, 1000, 4097, 65536}) {
    std::vector<int64_t> seen;
    for (int64_t i = 0; i < n; ++i) seen.push_back(feistelPermute(i, n, 11, 2));
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i) << n;  // a permutation
    if (n >= 1000) {
      int64_t fixed = 0, other = 0;
      for (int64_t i = 0; i < n; ++i) {
        fixed += seen[static_cast<size_t>(i)] == i;
        other += feistelPermute(i, n, 11, 3) != seen[static_cast<size_t>(i)];
      }
      EXPECT_LT(fixed, n / 50) << n;   // shuffled, not the identity
      EXPECT_GT(other, n * 9 / 10) << n;  // another epoch, another order
    }
  }
}

TEST(Sampler, HugeDatasetsNeedNoPerSampleMemory) {
  // A billion samples on 8 ranks: a batch's indices come out without the epoch being built, and
  // the ranks' batches at one position are disjoint.
  const int64_t n = 1000000000;
  std::set<int64_t> batch;
  for (int r = 0; r < 8; ++r) {
    DistributedSampler s(n, r, 8, true, 5, true);
    EXPECT_EQ(s.samplesPerRank(), n / 8);
    for (int64_t i : s.indices(0, 1000, 1064)) {
      EXPECT_GE(i, 0);
      EXPECT_LT(i, n);
      batch.insert(i);
    }
  }
  EXPECT_EQ(batch.size(), 8u * 64u);
  // Ranges agree with the whole epoch where that is small enough to build.
  DistributedSampler small(5000, 1, 3, true, 9, false);
  auto all = small.indices(4);
  EXPECT_EQ(small.indices(4, 100, 200), std::vector<int64_t>(all.begin() + 100, all.begin() + 200));
}

TEST(Sampler, LocalBatchesUnionToTheGlobalBatch) {
  // Rank r's local batch k over W ranks holds exactly the samples of global batch k of one rank
  // with batch W*b: the property that makes -np W match -np 1.
  const int W = 4, b = 8;
  DistributedSampler single(1000, 0, 1, true, 9, true);
  auto global = single.indices(2);
  for (int k = 0; k < 10; ++k) {
    std::set<int64_t> fromRanks, expect(global.begin() + k * W * b, global.begin() + (k + 1) * W * b);
    for (int r = 0; r < W; ++r) {
      auto local = DistributedSampler(1000, r, W, true, 9, true).indices(2);
      fromRanks.insert(local.begin() + k * b, local.begin() + (k + 1) * b);
    }
    EXPECT_EQ(fromRanks, expect) << "batch " << k;
  }
}

}  // namespace
}  // namespace mt
