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

// A node plan from the rank layout: node 0 = ranks {0, 3}, node 1 = {1, 2}, and slots not in rank
// order (rails numbered differently by the launcher). The node communicators are ranked by slot,
// the inter-node ones join equal slots, the config reaches each communicator's options, and the
// hierarchical reduction still equals the flat one.
TEST(Hierarchy, NodePlanFromTheLayout) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions());
  const int r = world.rank();
  ASSERT_EQ(world.size(), 4);
  NodePlan plan;
  plan.node = (r == 0 || r == 3) ? 0 : 1;
  plan.slot = (r == 0 || r == 1) ? 1 : 0;
  plan.ranksPerNode = 2;
  plan.inter.maxCtas = 4;
  plan.intra.splitShare = 1;
  NodeGroups g(world, plan);
  EXPECT_EQ(g.intra().rank(), plan.slot);
  EXPECT_EQ(g.inter().rank(), plan.node);
  EXPECT_EQ(g.inter().options().tuning.maxCtas, 4);
  EXPECT_EQ(g.intra().options().tuning.splitShare, 1);
  EXPECT_EQ(g.intraGather().options().tuning.splitShare, 1);
  EXPECT_EQ(g.inter().name(), "world.inter");
  // The inter-node peer is the other node's rank of the same slot: ranks 0 and 1 hold slot 1,
  // ranks 3 and 2 slot 0.
  Tensor mine = Tensor::empty({1}, DType::kI32), both = Tensor::empty({2}, DType::kI32);
  mine.data<int32_t>()[0] = r;
  g.inter().allGather(mine, both)->wait(g.inter().timeout());
  const int peer = both.data<int32_t>()[1 - plan.node];
  EXPECT_EQ(peer, r == 0 ? 1 : r == 1 ? 0 : r == 2 ? 3 : 2);
  Tensor a = test::randomTensor({1001}, 40 + static_cast<uint64_t>(r)), b = a.clone();
  world.allReduceSync(a, ReduceOp::kAvg);
  g.allReduce(b, ReduceOp::kAvg);
  EXPECT_LT(test::relErr(b, a), 1e-6);
  // Two ranks of a node claiming one slot: every rank refuses (no hang in a later phase).
  NodePlan bad = plan;
  bad.slot = 0;
  EXPECT_THROW(NodeGroups(world, bad), ConfigError);
  NodePlan unusable = plan;
  unusable.unusable = "nodes have different numbers of ranks";
  EXPECT_THROW(NodeGroups(world, unusable), ConfigError);
}

}  // namespace
}  // namespace mt
