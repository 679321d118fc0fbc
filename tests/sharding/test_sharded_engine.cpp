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

// The communicator the engine is given, counting the all-gathers it issues (everything forwarded).
class GatherCounter final : public Communicator {
 public:
  explicit GatherCounter(Communicator& inner) : Communicator(inner.options()), inner_(inner) {}
  using Communicator::allGather;
  using Communicator::allReduce;
  using Communicator::broadcast;
  using Communicator::reduceScatter;
  using Communicator::split;
  int gathers = 0;
  const char* backend() const override { return inner_.backend(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::shared_ptr<Work> allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Device device) override {
    return inner_.allReduce(buf, count, dtype, op, device);
  }
  std::shared_ptr<Work> reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                      Device device) override {
    return inner_.reduceScatter(in, out, count, dtype, op, device);
  }
  std::shared_ptr<Work> allGather(const void* in, void* out, size_t count, DType dtype,
                                  Device device) override {
    ++gathers;
    return inner_.allGather(in, out, count, dtype, device);
  }
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Device device) override {
    return inner_.broadcast(buf, count, dtype, root, device);
  }
  std::shared_ptr<Work> barrier() override { return inner_.barrier(); }
  std::shared_ptr<Work> send(const void* buf, size_t count, DType dtype, int peer, Device device) override {
    return inner_.send(buf, count, dtype, peer, device);
  }
  std::shared_ptr<Work> recv(void* buf, size_t count, DType dtype, int peer, Device device) override {
    return inner_.recv(buf, count, dtype, peer, device);
  }
  std::unique_ptr<Communicator> split(int color, int key, CommOptions options) override {
    return inner_.split(color, key, std::move(options));
  }
  void abort(const std::string& reason) override { inner_.abort(reason); }

 private:
  Communicator& inner_;
};

// The model the prefetch tests drive: six units (linear layers), initialised.
std::unique_ptr<Sequential> sixUnitMlp() {
  ModelConfig mc;
  mc.hidden = {9, 9, 9, 9, 9};
  auto model = buildMlp(mc, InputSpec{3, 3, 1, 4});
  model->params().materialize(Device::cpu());
  model->initParams(5);
  return model;
}

// Prefetching keeps going through the whole forward: when unit u's forward starts, unit u+1's
// all-gather is already issued (prefetch_limit = 2: the current unit and one in flight). Units that
// shard_grad_op keeps gathered for their backward are not gathers in flight and must not stop it
// (they did: shard_grad_op issued no prefetch after unit 1). In backward, full_shard prefetches
// unit u-1 while u computes; shard_grad_op gathers nothing (every unit is still gathered).
TEST(ShardedEngine, PrefetchCountsOnlyGathersInFlight) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions());
  for (ShardStrategy strategy : {ShardStrategy::kFullShard, ShardStrategy::kShardGradOp})
    for (int limit : {1, 2}) {
      SCOPED_TRACE(std::string(shardStrategyName(strategy)) + ", prefetch_limit " + std::to_string(limit));
      auto model = sixUnitMlp();
      GatherCounter comm(world);
      ShardingOptions so;
      so.strategy = strategy;
      so.prefetchLimit = limit;
      ShardedEngine engine(model->params(), comm, nullptr, so, OptimConfig());
      const int n = static_cast<int>(engine.unitCount());
      ASSERT_GE(n, 5);
      engine.beginStep();
      for (int u = 0; u < n; ++u) {
        engine.beforeUnitForward(u);
        // Units 0..u gathered, and the next one prefetched when the limit allows.
        EXPECT_EQ(comm.gathers, std::min(n, u + limit)) << "after unit " << u << "'s forward started";
        engine.afterUnitForward(u);
      }
      const int forwardGathers = comm.gathers;
      for (int u = n - 1; u >= 0; --u) {
        engine.beforeUnitBackward(u);
        for (Param* p : model->params().unitParams(u))
          p->grad.fill_(1.f);
        if (strategy == ShardStrategy::kShardGradOp) {
          EXPECT_EQ(comm.gathers, forwardGathers) << "unit " << u << " was kept gathered since its forward";
        } else {
          // Unit u gathered (it was prefetched unless it is the last one), u-1 prefetched.
          EXPECT_EQ(comm.gathers, forwardGathers + (n - u) + (limit > 1 && u > 0 ? 1 : 0))
              << "after unit " << u << "'s backward started";
        }
        engine.afterUnitBackward(u);
      }
      engine.finishBackward();
    }
}

// A unit the model keeps open around the whole pass (GPT's embeddings: wte is read again by the
// classifier) is not a gather in flight either: full_shard still prefetches every next block.
TEST(ShardedEngine, PrefetchPassesOverAUnitHeldOpen) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions());
  auto model = sixUnitMlp();
  GatherCounter comm(world);
  ShardingOptions so;
  so.strategy = ShardStrategy::kFullShard;
  ShardedEngine engine(model->params(), comm, nullptr, so, OptimConfig());
  const int n = static_cast<int>(engine.unitCount());
  engine.beginStep();
  engine.beforeUnitForward(0);  // held open until the end of the pass
  for (int u = 1; u < n; ++u) {
    engine.beforeUnitForward(u);
    EXPECT_EQ(comm.gathers, std::min(n, u + 2)) << "after unit " << u << "'s forward started";
    engine.afterUnitForward(u);
  }
  engine.afterUnitForward(0);
  engine.releaseAll();
}

}  // namespace
}  // namespace mt
