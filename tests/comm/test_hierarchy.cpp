// Hierarchical all-reduce on 4 ranks emulating 2 nodes x 2 ranks equals the flat all-reduce.

#include <gtest/gtest.h>

#include "comm/DataParallel.h"
#include "comm/MpiCommunicator.h"
#include "tests/common/TestUtil.h"
#include "comm/Hierarchy.h"

namespace mt {
namespace {

TEST(Hierarchy, EqualsFlatAllReduce) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions());
  NodeGroups g(world, 2);
  EXPECT_EQ(g.intra().size(), 2);
  EXPECT_EQ(g.inter().size(), 2);
  EXPECT_EQ(g.intra().rank(), world.rank() % 2);
  EXPECT_EQ(g.inter().rank(), world.rank() / 2);
  for (int64_t n : {1, 7, 1000, 12345}) {
    Tensor a = test::randomTensor({n}, 100 + static_cast<uint64_t>(world.rank()));
    Tensor b = a.clone();
    world.allReduceSync(a, ReduceOp::kAvg);
    g.allReduce(b, ReduceOp::kAvg);
    EXPECT_LT(test::relErr(b, a), 1e-6) << n;
    Tensor c = test::randomTensor({n}, 7 + static_cast<uint64_t>(world.rank())), d = c.clone();
    world.allReduceSync(c, ReduceOp::kSum);
    g.allReduce(d, ReduceOp::kSum);
    EXPECT_LT(test::relErr(d, c), 1e-6) << n;
  }
}

TEST(Hierarchy, DataParallelBucketsThroughTheHierarchy) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions());
  NodeGroups g(world, 2);
  ParamTable t;
  for (int i = 0; i < 3; ++i) t.add("p" + std::to_string(i), {3001});
  t.materialize(Device::cpu());
  DataParallelOptions o;
  o.firstBucketMb = 0.01;
  o.bucketCapMb = 0.02;
  DataParallel dp(t, world, o);
  dp.setReducer(std::make_unique<HierarchicalReducer>(g));
  dp.beginBackward();
  for (int i = 2; i >= 0; --i) {
    t[static_cast<size_t>(i)].grad.fill_(static_cast<float>(world.rank() * 10 + i));
    dp.gradReady(t[static_cast<size_t>(i)]);
  }
  dp.finishBackward();
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(t[static_cast<size_t>(i)].grad.data<float>()[3000], 15.f + i);
  EXPECT_THROW(NodeGroups(world, 3), ConfigError);
}

// Chained ops (`after`): the inter-node all-reduce issued right after the node reduce-scatter,
// without the caller waiting, starts only once that reduce-scatter has completed, and the
// all-gather on the second node communicator once the all-reduce has; the result is the flat
// average. The caller returns before any of them completes (nothing was waited for).
TEST(Hierarchy, ChainedPhasesStartAfterTheirPredecessor) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions());
  NodeGroups g(world, 2);
  EXPECT_EQ(g.intraGather().size(), 2);  // made on first use (a collective): here, before any op
  const int64_t n = 1 << 20;  // large enough that the phases take measurable time
  Tensor grads = test::randomTensor({n}, 500 + static_cast<uint64_t>(world.rank()));
  Tensor flat = grads.clone();
  world.allReduceSync(flat, ReduceOp::kAvg);
  Tensor slice = Tensor::empty({n / 2}, DType::kF32);
  Tensor out = Tensor::empty({n}, DType::kF32);
  auto rs = g.intra().reduceScatter(grads, slice, ReduceOp::kAvg);
  auto ar = g.inter().allReduce(slice, ReduceOp::kAvg, rs);
  auto ag = g.intraGather().allGather(slice, out, ar);
  ag->wait(g.intraGather().timeout());
  ar->wait(g.inter().timeout());
  rs->wait(g.intra().timeout());
  EXPECT_GE(ar->record().startedUs, rs->record().completedUs);
  EXPECT_GE(ag->record().startedUs, ar->record().completedUs);
  EXPECT_LT(test::relErr(out, flat), 1e-6);
  // A null `after` is the plain op.
  Tensor x = test::randomTensor({1000}, 9), y = x.clone();
  g.inter().allReduce(x, ReduceOp::kSum, nullptr)->wait(g.inter().timeout());
  g.inter().allReduceSync(y, ReduceOp::kSum);
  EXPECT_EQ(test::relErr(x, y), 0.0);
}

}  // namespace
}  // namespace mt
