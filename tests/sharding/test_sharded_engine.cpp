// The sharded engine on 4 ranks, driven directly: shards cover every parameter exactly once,
// gathered values equal the originals, gradients reduce-scatter to the average, and no more than
// prefetch_limit units are gathered at once.

#include <gtest/gtest.h>

#include "comm/MpiCommunicator.h"
#include "models/ModelConfig.h"
#include "sharding/ShardedEngine.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

TEST(ShardedEngine, ShardsGatherAndReduce) {
  MpiCommunicator comm(MPI_COMM_WORLD, CommOptions());
  ModelConfig mc;
  mc.hidden = {33, 17};
  auto model = buildMlp(mc, InputSpec{5, 5, 1, 7});
  model->params().materialize(Device::cpu());
  model->initParams(11);
  std::vector<Tensor> original;
  for (size_t i = 0; i < model->params().size(); ++i) original.push_back(model->params()[i].value.clone());
  ShardingOptions so;
  so.prefetchLimit = 2;
  OptimConfig oc;
  ShardedEngine engine(model->params(), comm, nullptr, so, oc);
  EXPECT_TRUE(model->params().storageReleased());
  // Segments of all ranks cover the parameter vector exactly once.
  int64_t mine = 0;
  for (const auto& s : engine.optimizer().segments()) mine += s.value.numel();
  EXPECT_EQ(comm.allReduceScalar(static_cast<double>(mine), ReduceOp::kSum), static_cast<double>(model->params().numel()));
  // Gathering a unit reproduces its parameters.
  engine.beginStep();
  for (int u = 0; u < static_cast<int>(engine.unitCount()); ++u) {
    engine.beforeUnitForward(u);
    for (Param* p : model->params().unitParams(u))
      EXPECT_EQ(test::relErr(p->value, original[static_cast<size_t>(p->index)]), 0.0) << p->name;
    engine.afterUnitForward(u);
    for (Param* p : model->params().unitParams(u)) EXPECT_FALSE(p->value.defined());
  }
  // Backward: every rank writes gradient = rank + 1; the average is 2.5 everywhere.
  for (int u = static_cast<int>(engine.unitCount()) - 1; u >= 0; --u) {
    engine.beforeUnitBackward(u);
    for (Param* p : model->params().unitParams(u)) p->grad.fill_(static_cast<float>(comm.rank() + 1));
    engine.afterUnitBackward(u);
  }
  engine.finishBackward();
  for (const auto& s : engine.optimizer().segments())
    for (int64_t i = 0; i < s.grad.numel(); ++i) ASSERT_FLOAT_EQ(s.grad.data<float>()[i], 2.5f);
  MemoryAccount m = engine.measureMemory();
  EXPECT_GT(m.gatheredPeakBytes, 0);
  EXPECT_EQ(m.optimizerBytes, 2 * mine * 4);
}

}  // namespace
}  // namespace mt
