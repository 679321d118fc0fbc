// Data-parallel buckets on 4 ranks: layout, launch order, averaging, rebuilds.

#include <gtest/gtest.h>

#include "comm/DataParallel.h"
#include "comm/MpiCommunicator.h"
#include "models/ModelConfig.h"

namespace mt {
namespace {

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommOptions o;
    o.timeout = std::chrono::seconds(60);
    comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, o);
  }
  std::unique_ptr<MpiCommunicator> comm_;
};

// A table of 6 parameters of 64 KiB each (16384 floats).
void fill(ParamTable& t) {
  for (int i = 0; i < 6; ++i) t.add("p" + std::to_string(i), {16384});
  t.materialize(Device::cpu());
}

TEST_F(DataParallelTest, BucketsAreReverseOrderContiguousSlices) {
  ParamTable t;
  fill(t);
  DataParallelOptions o;
  o.firstBucketMb = 64.0 / 1024;   // first bucket closes at 64 KiB: one parameter
  o.bucketCapMb = 128.0 / 1024;    // then two per bucket
  DataParallel dp(t, *comm_, o);
  const auto& b = dp.buckets();
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].params, (std::vector<int>{5}));
  EXPECT_EQ(b[1].params, (std::vector<int>{4, 3}));
  EXPECT_EQ(b[2].params, (std::vector<int>{2, 1}));
  EXPECT_EQ(b[3].params, (std::vector<int>{0}));
  int64_t cursor = 0;
  for (const auto& bucket : b) {
    EXPECT_EQ(bucket.offset, cursor);
    for (int pi : bucket.params) {
      EXPECT_EQ(t[static_cast<size_t>(pi)].grad.rawData(),
                static_cast<char*>(t.flatGrads().rawData()) + cursor * 4);
      cursor += t[static_cast<size_t>(pi)].numel();
    }
  }
}

TEST_F(DataParallelTest, GradientsAreAveragedOverRanks) {
  ParamTable t;
  fill(t);
  DataParallelOptions o;
  o.firstBucketMb = 0.1;
  o.bucketCapMb = 0.2;
  DataParallel dp(t, *comm_, o);
  const int r = comm_->rank(), n = comm_->size();
  for (int step = 0; step < 3; ++step) {
    t.zeroGrads();
    dp.beginBackward();
    for (int i = 5; i >= 0; --i) {
      float* g = t[static_cast<size_t>(i)].grad.data<float>();
      for (int64_t e = 0; e < 16384; ++e) g[e] = static_cast<float>((r + 1) * (i + 1) + step);
      dp.gradReady(t[static_cast<size_t>(i)]);
    }
    dp.finishBackward();
    const float meanRank = (n + 1) / 2.f;
    for (int i = 0; i < 6; ++i)
      EXPECT_FLOAT_EQ(t[static_cast<size_t>(i)].grad.data<float>()[123], meanRank * (i + 1) + step);
  }
}

TEST_F(DataParallelTest, BucketsLaunchDuringBackwardInIndexOrder) {
  ParamTable t;
  fill(t);
  DataParallelOptions o;
  o.firstBucketMb = 64.0 / 1024;
  o.bucketCapMb = 64.0 / 1024;  // one parameter per bucket
  DataParallel dp(t, *comm_, o);
  dp.beginBackward();
  // Ready out of order: bucket 1 (param 4) before bucket 0 (param 5) must wait for bucket 0.
  dp.gradReady(t[4]);
  EXPECT_EQ(dp.lastTrace()[1].readyUs, 0);
  dp.gradReady(t[5]);
  EXPECT_GT(dp.lastTrace()[0].readyUs, 0);
  EXPECT_GE(dp.lastTrace()[1].readyUs, dp.lastTrace()[0].readyUs);
  for (int i = 3; i >= 0; --i) dp.gradReady(t[static_cast<size_t>(i)]);
  dp.finishBackward();
  for (const auto& tr : dp.lastTrace()) EXPECT_GT(tr.doneUs, 0);
  EXPECT_THROW(({
                 dp.beginBackward();
                 dp.gradReady(t[5]);
                 dp.gradReady(t[5]);
               }),
               InternalError);
  for (int i = 4; i >= 0; --i) dp.gradReady(t[static_cast<size_t>(i)]);
  dp.finishBackward();
}

TEST_F(DataParallelTest, RebuildFollowsRankZerosObservedOrder) {
  ParamTable t;
  fill(t);
  DataParallelOptions o;
  o.firstBucketMb = 64.0 / 1024;
  o.bucketCapMb = 128.0 / 1024;
  o.rebuildBuckets = true;
  DataParallel dp(t, *comm_, o);
  // Rank 0 sees the order 0,2,4,1,3,5; the others something else: rank 0's order wins.
  std::vector<int> order = comm_->rank() == 0 ? std::vector<int>{0, 2, 4, 1, 3, 5} : std::vector<int>{5, 4, 3, 2, 1, 0};
  dp.beginBackward();
  for (int i : order) dp.gradReady(t[static_cast<size_t>(i)]);
  dp.finishBackward();
  EXPECT_FALSE(dp.buckets()[0].params == std::vector<int>{0});  // not yet: after the step
  EXPECT_TRUE(dp.afterStep());
  ASSERT_EQ(dp.buckets().size(), 4u);
  EXPECT_EQ(dp.buckets()[0].params, (std::vector<int>{0}));
  EXPECT_EQ(dp.buckets()[1].params, (std::vector<int>{2, 4}));
  EXPECT_EQ(dp.buckets()[3].params, (std::vector<int>{5}));
  EXPECT_FALSE(dp.afterStep());  // once only
}

TEST_F(DataParallelTest, NoSyncAccumulatesLocally) {
  ParamTable t;
  fill(t);
  DataParallel dp(t, *comm_, DataParallelOptions());
  const int r = comm_->rank();
  dp.beginBackward(/*sync=*/false);
  for (int i = 5; i >= 0; --i) {
    t[static_cast<size_t>(i)].grad.data<float>()[0] = static_cast<float>(r);
    dp.gradReady(t[static_cast<size_t>(i)]);
  }
  dp.finishBackward();
  EXPECT_EQ(t[0].grad.data<float>()[0], static_cast<float>(r));  // untouched by other ranks
}

}  // namespace
}  // namespace mt
