// The sharding state machines on the local communicator (one process): every edge of a ShardUnit
// from every state, with and without offload (legal ones taken, illegal ones refused naming unit,
// state and edge), the offload's transient device gradient shard and its host accumulation, the
// engine's phases and each unit's state through a step of every strategy, with gradient
// accumulation and hybrid_shard, evaluation forwards, and the offload worker's job queue.

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "comm/Communicator.h"
#include "core/Convert.h"
#include "models/ModelConfig.h"
#include "sharding/OffloadQueue.h"
#include "sharding/ShardUnit.h"
#include "sharding/ShardedEngine.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

using S = UnitState;
using E = UnitEdge;

// What each edge does from each state: the state it enters, or nothing (refused). Offload swaps
// finish_reduce for land_grad + send_grad_down.
const std::map<E, std::map<S, S>>& legalEdges(bool offload) {
  static const std::map<E, std::map<S, S>> kEdges = {
      {E::kGather, {{S::kSharded, S::kGathering}}},
      {E::kFinishGather, {{S::kGathering, S::kGathered}}},
      {E::kCancelGather, {{S::kGathering, S::kSharded}}},
      {E::kKeep, {{S::kGathered, S::kKept}}},
      {E::kRelease, {{S::kGathered, S::kSharded}, {S::kKept, S::kSharded}}},
      {E::kBindGrads, {{S::kGathered, S::kBackward}, {S::kKept, S::kBackward}}},
      {E::kStartReduce, {{S::kBackward, S::kReducing}}},
      {E::kFinishReduce, {{S::kReducing, S::kSharded}}},
      {E::kLandGrad, {}},
      {E::kSendGradDown, {}},
  };
  static const std::map<E, std::map<S, S>> kOffload = [] {
    std::map<E, std::map<S, S>> m = kEdges;
    m[E::kFinishReduce] = {};
    m[E::kLandGrad] = {{S::kReducing, S::kReduced}};
    m[E::kSendGradDown] = {{S::kReduced, S::kSharded}};
    return m;
  }();
  return offload ? kOffload : kEdges;
}

struct UnitFixture {
  ParamTable table;
  LocalCommunicator comm;
  std::unique_ptr<ShardUnit> unit;
  DType reduceDtype;
  std::vector<std::pair<std::vector<float>, bool>> sunk;  // what send_grad_down handed over
  explicit UnitFixture(DType paramDtype = DType::kF32, bool offload = false, DType reduce = DType::kF32)
      : reduceDtype(reduce) {
    table.add("w", {5, 7});
    table.add("b", {7}, false);
    table.materialize(Device::cpu());
    for (size_t i = 0; i < table.size(); ++i)
      for (int64_t e = 0; e < table[i].numel(); ++e)
        table[i].value.data<float>()[e] = 0.5f * static_cast<float>(e + i);
    unit = std::make_unique<ShardUnit>(3, table.unitParams(0), 1, 0, Device::cpu(), cpuAllocator(),
                                       paramDtype, reduceDtype, offload, DType::kF32);
    unit->refreshGatherCopy();
  }
  void take(E e) {
    switch (e) {
      case E::kGather:
        unit->gather(comm);
        break;
      case E::kFinishGather:
        unit->finishGather(comm.timeout());
        break;
      case E::kCancelGather:
        unit->cancelGather(comm.timeout());
        break;
      case E::kKeep:
        unit->keep();
        break;
      case E::kRelease:
        unit->release();
        break;
      case E::kBindGrads:
        unit->bindGrads();
        break;
      case E::kStartReduce:
        unit->startReduce(comm, reduceDtype, false, nullptr);
        break;
      case E::kFinishReduce:
        unit->finishReduce(comm, nullptr, false, true);
        break;
      case E::kLandGrad:
        unit->landGrad(comm);
        break;
      case E::kSendGradDown:
        unit->sendGradDown([this](const Tensor& shard, bool accumulate) {
          Tensor f32 = Tensor::empty(shard.shape(), DType::kF32, shard.device());
          convertInto(f32, shard);
          sunk.push_back(
              {std::vector<float>(f32.data<float>(), f32.data<float>() + f32.numel()), accumulate});
        });
        break;
    }
  }
  // A legal path from kSharded into each state.
  void driveTo(S s) {
    static const std::map<S, std::vector<E>> kPaths = {
        {S::kSharded, {}},
        {S::kGathering, {E::kGather}},
        {S::kGathered, {E::kGather, E::kFinishGather}},
        {S::kKept, {E::kGather, E::kFinishGather, E::kKeep}},
        {S::kBackward, {E::kGather, E::kFinishGather, E::kBindGrads}},
        {S::kReducing, {E::kGather, E::kFinishGather, E::kBindGrads, E::kStartReduce}},
        {S::kReduced, {E::kGather, E::kFinishGather, E::kBindGrads, E::kStartReduce, E::kLandGrad}},
    };
    for (E e : kPaths.at(s))
      take(e);
    ASSERT_EQ(unit->state(), s);
  }
};

TEST(ShardUnit, EveryEdgeFromEveryState) {
  for (bool offload : {false, true}) {
    std::vector<S> states = {S::kSharded, S::kGathering, S::kGathered, S::kKept, S::kBackward, S::kReducing};
    if (offload) states.push_back(S::kReduced);
    for (const auto& [edge, moves] : legalEdges(offload))
      for (S from : states) {
        SCOPED_TRACE(std::string(unitEdgeName(edge)) + " from " + unitStateName(from) +
                     (offload ? " (offload)" : ""));
        UnitFixture f(DType::kF32, offload);
        f.driveTo(from);
        const auto it = moves.find(from);
        if (it != moves.end()) {
          f.take(edge);
          EXPECT_EQ(f.unit->state(), it->second);
          continue;
        }
        try {
          f.take(edge);
          ADD_FAILURE() << "illegal edge taken";
        } catch (const InternalError& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("sharding unit 3"), std::string::npos) << msg;
          EXPECT_NE(msg.find(std::string("edge ") + unitEdgeName(edge)), std::string::npos) << msg;
          EXPECT_NE(msg.find(std::string("from state ") + unitStateName(from)), std::string::npos) << msg;
        }
        EXPECT_EQ(f.unit->state(), from) << "a refused edge changed the state";
      }
  }
}

// Offload: the device gradient shard exists only from start_reduce to send_grad_down (never
// between steps), is counted as transient meanwhile, and send_grad_down hands it over once per
// micro-step — overwriting the host copy in the first, adding in later ones.
TEST(ShardUnit, OffloadGradientShardIsTransient) {
  for (DType reduce : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtypeName(reduce));
    UnitFixture f(DType::kF32, true, reduce);
    EXPECT_FALSE(f.unit->gradShard().defined()) << "a persistent device gradient shard with offload";
    ASSERT_TRUE(f.unit->gradShardHost().defined());
    for (int k = 0; k < 2; ++k) {
      f.take(E::kGather);
      f.take(E::kFinishGather);
      f.take(E::kBindGrads);
      f.table[0].grad.fill_(static_cast<float>(k + 2));
      f.unit->startReduce(f.comm, reduce, k > 0, nullptr);
      ASSERT_TRUE(f.unit->gradShard().defined());
      EXPECT_EQ(f.unit->gradShard().dtype(), reduce);
      EXPECT_GE(f.unit->transientBytes(), static_cast<int64_t>(f.unit->gradShard().nbytes()));
      f.take(E::kLandGrad);
      EXPECT_EQ(f.unit->transientBytes(), static_cast<int64_t>(f.unit->gradShard().nbytes()))
          << "the full gradient is freed once its reduce-scatter is done";
      f.take(E::kSendGradDown);
      EXPECT_FALSE(f.unit->gradShard().defined());
      EXPECT_EQ(f.unit->transientBytes(), 0);
      ASSERT_EQ(f.sunk.size(), static_cast<size_t>(k + 1));
      EXPECT_EQ(f.sunk.back().first[0], static_cast<float>(k + 2));  // one rank: the average is the gradient
      EXPECT_EQ(f.sunk.back().second, k > 0) << "micro-step " << k;
    }
  }
}

TEST(ShardUnit, AddShardIntoWidensToF32) {
  Tensor host = Tensor::zeros({4}, DType::kF32, Device::cpu());
  host.fill_(1.f);
  Tensor low = Tensor::empty({4}, DType::kBF16, Device::cpu());
  Tensor src = Tensor::empty({4}, DType::kF32, Device::cpu());
  src.fill_(0.00390625f);  // 2^-8: 1 + 2^-8 is not a bf16, so an add in bf16 would lose it
  convertInto(low, src);
  addShardInto(host, low);
  EXPECT_EQ(host.data<float>()[3], 1.00390625f);
}

// What each state binds: values while gathered (kGathered .. kBackward), gradients in kBackward,
// nothing in kSharded and kReducing; the gathered values are the parameters'.
TEST(ShardUnit, BindingsFollowTheState) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    UnitFixture f(dt);
    Param& w = f.table[0];
    std::vector<float> original(w.value.data<float>(), w.value.data<float>() + w.numel());
    f.table.releaseStorage();
    EXPECT_FALSE(w.value.defined());
    f.take(E::kGather);
    EXPECT_FALSE(w.value.defined()) << "bound before its gather was waited for";
    f.take(E::kFinishGather);
    ASSERT_TRUE(w.value.defined());
    for (int64_t i = 0; i < w.numel(); ++i)
      EXPECT_EQ(w.value.data<float>()[i], original[static_cast<size_t>(i)]);
    EXPECT_FALSE(w.grad.defined());
    f.take(E::kBindGrads);
    ASSERT_TRUE(w.grad.defined());
    w.grad.fill_(2.f);
    f.take(E::kStartReduce);
    EXPECT_FALSE(w.value.defined());
    EXPECT_FALSE(w.grad.defined());
    f.take(E::kFinishReduce);
    EXPECT_EQ(f.unit->gradShard().data<float>()[0], 2.f);  // one rank: the average is the gradient
    EXPECT_EQ(f.unit->transientBytes(), 0);
    EXPECT_GT(f.unit->trace().readyUs, 0);
  }
}

// A model of several units and an engine over the local communicator (W = 1); `replica` makes it
// hybrid_shard's (a one-rank replica group).
struct EngineFixture {
  LocalCommunicator shard, replica;
  std::unique_ptr<Sequential> model;
  std::unique_ptr<ShardedEngine> engine;
  int n = 0;
  EngineFixture(ShardStrategy strategy, int prefetch = 2, bool offload = false, double offloadFraction = 1.0) {
    ModelConfig mc;
    mc.hidden = {6, 5, 4};
    model = buildMlp(mc, InputSpec{2, 2, 1, 3});
    // As the trainer does for sharded runs: values staged on the host, no gradient buffer.
    model->params().materialize(Device::cpu(), DType::kF32, ParamStorage::kHostValuesOnly);
    model->initParams(3);
    ShardingOptions so;
    so.strategy = strategy;
    so.prefetchLimit = prefetch;
    so.offloadCpu = offload;
    so.offloadFraction = offloadFraction;
    engine = std::make_unique<ShardedEngine>(model->params(), shard,
                                             strategy == ShardStrategy::kHybridShard ? &replica : nullptr, so,
                                             OptimConfig());
    n = static_cast<int>(engine->unitCount());
  }
  std::vector<S> states() const {
    std::vector<S> out;
    for (int u = 0; u < n; ++u)
      out.push_back(engine->unitState(u));
    return out;
  }
  void forward() {
    for (int u = 0; u < n; ++u) {
      engine->beforeUnitForward(u);
      engine->afterUnitForward(u);
    }
  }
  // Every gradient of micro-step k is k + 1.
  void backward(int k) {
    for (int u = n - 1; u >= 0; --u) {
      engine->beforeUnitBackward(u);
      for (Param* p : model->params().unitParams(u))
        p->grad.fill_(static_cast<float>(k + 1));
      engine->afterUnitBackward(u);
    }
    engine->finishBackward();
  }
};

std::string str(const std::vector<S>& v) {
  std::string s;
  for (S x : v)
    s += std::string(unitStateName(x)) + " ";
  return s;
}

TEST(ShardedEngineStates, FullShardStepUnitByUnit) {
  EngineFixture f(ShardStrategy::kFullShard);
  ASSERT_GE(f.n, 4);
  f.engine->beginStep();
  EXPECT_EQ(f.engine->phase(), EnginePhase::kIdle);
  f.engine->beforeUnitForward(0);
  EXPECT_EQ(f.engine->phase(), EnginePhase::kForward);
  EXPECT_EQ(f.engine->unitState(0), S::kGathered);
  EXPECT_EQ(f.engine->unitState(1), S::kGathering) << "prefetched";
  EXPECT_EQ(f.engine->unitState(2), S::kSharded) << "beyond prefetch_limit 2";
  f.engine->afterUnitForward(0);
  EXPECT_EQ(f.engine->unitState(0), S::kSharded) << "full_shard frees a unit after its forward";
  for (int u = 1; u < f.n; ++u) {
    f.engine->beforeUnitForward(u);
    EXPECT_EQ(f.engine->unitState(u), S::kGathered);
    if (u + 1 < f.n) EXPECT_EQ(f.engine->unitState(u + 1), S::kGathering);
    f.engine->afterUnitForward(u);
  }
  EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kSharded)));
  const int last = f.n - 1;
  f.engine->beforeUnitBackward(last);
  EXPECT_EQ(f.engine->phase(), EnginePhase::kBackward);
  EXPECT_EQ(f.engine->unitState(last), S::kBackward);
  EXPECT_EQ(f.engine->unitState(last - 1), S::kGathering) << "prefetched in backward order";
  f.engine->afterUnitBackward(last);
  EXPECT_EQ(f.engine->unitState(last), S::kReducing);
  for (int u = last - 1; u >= 0; --u) {
    f.engine->beforeUnitBackward(u);
    f.engine->afterUnitBackward(u);
  }
  f.engine->finishBackward();
  EXPECT_EQ(f.engine->phase(), EnginePhase::kIdle);
  EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kSharded)));
  EXPECT_EQ(f.engine->lastTrace().size(), static_cast<size_t>(f.n));
  f.engine->step(1e-3f);
}

TEST(ShardedEngineStates, ShardGradOpKeepsUnitsFromForwardToBackward) {
  EngineFixture f(ShardStrategy::kShardGradOp);
  f.engine->beginStep();
  f.forward();
  EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kKept)));
  EXPECT_EQ(f.engine->gathersInFlight(), 0) << "kept units are no gathers in flight";
  f.engine->beforeUnitBackward(f.n - 1);
  EXPECT_EQ(f.engine->unitState(f.n - 1), S::kBackward);
  EXPECT_EQ(f.engine->unitState(f.n - 2), S::kKept) << "nothing to prefetch: still gathered";
  f.engine->afterUnitBackward(f.n - 1);
  for (int u = f.n - 2; u >= 0; --u) {
    f.engine->beforeUnitBackward(u);
    f.engine->afterUnitBackward(u);
  }
  f.engine->finishBackward();
  EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kSharded)));
}

// Gradient accumulation over 3 micro-steps (gradients 1, 2, 3 on the one rank): the shard holds
// their sum, for every strategy (hybrid_shard's replica all-reduce after the last only) and with
// offload (the host copy, made after the last).
TEST(ShardedEngineStates, MicroStepsAccumulateForEveryStrategy) {
  for (ShardStrategy strategy :
       {ShardStrategy::kFullShard, ShardStrategy::kShardGradOp, ShardStrategy::kHybridShard})
    for (double offload : {0.0, 1.0, 0.5}) {  // none, all, the last units (partial offload)
      SCOPED_TRACE(std::string(shardStrategyName(strategy)) + " offload " + std::to_string(offload));
      EngineFixture f(strategy, 2, offload > 0, offload > 0 ? offload : 1.0);
      f.engine->beginStep();
      for (int k = 0; k < 3; ++k) {
        f.forward();
        f.engine->setMicroStep(k, 3);
        f.backward(k);
        EXPECT_EQ(f.engine->phase(), EnginePhase::kIdle);
        EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kSharded)));
      }
      for (const auto& seg : f.engine->optimizer().segments())
        for (int64_t i = 0; i < seg.grad.numel(); ++i)
          ASSERT_EQ(seg.grad.data<float>()[i], 6.f);
      f.engine->step(1e-3f);
    }
}

// Offload: each unit's gradient shard goes down as its reduction ends (the local communicator's
// are done at once), so no unit waits in kReducing and the engine keeps no device gradient shard:
// the persistent gradient bytes are the host copies (as many bytes as the f32 master shards).
TEST(ShardedEngineStates, OffloadSendsEachGradientShardDownAsItsReductionEnds) {
  for (ShardStrategy strategy : {ShardStrategy::kFullShard, ShardStrategy::kHybridShard}) {
    SCOPED_TRACE(shardStrategyName(strategy));
    EngineFixture f(strategy, 2, true);
    const MemoryAccount m = f.engine->measureMemory();
    EXPECT_EQ(m.gradBytes * 2, m.paramBytes)
        << "gradients: the host copies only (params: master + gather copy)";
    f.engine->beginStep();
    f.forward();
    for (int u = f.n - 1; u >= 0; --u) {
      f.engine->beforeUnitBackward(u);
      for (Param* p : f.model->params().unitParams(u))
        p->grad.fill_(2.f);
      f.engine->afterUnitBackward(u);
      EXPECT_EQ(f.engine->unitState(u), S::kSharded) << "unit " << u << " still holds its gradient shard";
    }
    f.engine->finishBackward();
    for (const auto& seg : f.engine->optimizer().segments())
      for (int64_t i = 0; i < seg.grad.numel(); ++i)
        ASSERT_EQ(seg.grad.data<float>()[i], 2.f);
    EXPECT_GT(f.engine->clipGradNorm(1.f), 0.0);
    f.engine->step(1e-3f);
  }
}

// Partial offload chooses the last units whose elements are nearest the fraction (all for 1, at
// least the last one), and the engine keeps the first ones as without offload: a device (here CPU)
// gradient shard and no host copy; the offloaded ones the reverse. Their gradients still go down
// as each reduction ends, the kept ones' are reduced at finishBackward, and the step runs both.
TEST(ShardedEngineStates, PartialOffloadKeepsTheFirstUnits) {
  EXPECT_EQ(firstOffloadedUnit({10, 10, 10, 10}, 1.0), 0);
  EXPECT_EQ(firstOffloadedUnit({10, 10, 10, 10}, 0.5), 2);
  EXPECT_EQ(firstOffloadedUnit({10, 10, 10, 10}, 0.6), 2) << "24 of 40: the last two (20) are nearest";
  EXPECT_EQ(firstOffloadedUnit({10, 10, 10, 10}, 0.01), 3) << "the last unit at least";
  EXPECT_EQ(firstOffloadedUnit({5, 100, 100, 5}, 0.5), 2);
  EXPECT_EQ(firstOffloadedUnit({}, 0.5), 0);
  EngineFixture f(ShardStrategy::kFullShard, 2, true, 0.5);
  const int k = f.engine->firstOffloaded();
  ASSERT_GT(k, 0);
  ASSERT_LT(k, f.n);
  EngineFixture all(ShardStrategy::kFullShard, 2, true);
  EXPECT_EQ(all.engine->firstOffloaded(), 0);
  EngineFixture none(ShardStrategy::kFullShard);
  EXPECT_EQ(none.engine->firstOffloaded(), none.n);
  f.engine->beginStep();
  f.forward();
  for (int u = f.n - 1; u >= 0; --u) {
    f.engine->beforeUnitBackward(u);
    for (Param* p : f.model->params().unitParams(u)) p->grad.fill_(3.f);
    f.engine->afterUnitBackward(u);
    EXPECT_EQ(f.engine->unitState(u), u >= k ? S::kSharded : S::kReducing) << "unit " << u;
  }
  f.engine->finishBackward();
  EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kSharded)));
  for (const auto& seg : f.engine->optimizer().segments())
    for (int64_t i = 0; i < seg.grad.numel(); ++i) ASSERT_EQ(seg.grad.data<float>()[i], 3.f);
  std::vector<float> before;
  for (const auto& seg : f.engine->optimizer().segments()) before.push_back(seg.value.data<float>()[0]);
  EXPECT_GT(f.engine->clipGradNorm(1.f), 0.0);
  f.engine->step(1e-2f);
  const auto& segs = f.engine->optimizer().segments();
  for (size_t i = 0; i < segs.size(); ++i) EXPECT_NE(segs[i].value.data<float>()[0], before[i]) << "segment " << i;
  EXPECT_EQ(f.engine->optimizer().stepCount(), 1);
}

// Evaluation forwards leave units gathered (shard_grad_op) or prefetched (prefetch_limit 3 with
// units freed as they go); releaseAll frees them whatever their state, and training goes on.
TEST(ShardedEngineStates, ReleaseAllAfterEvaluation) {
  for (ShardStrategy strategy :
       {ShardStrategy::kFullShard, ShardStrategy::kShardGradOp, ShardStrategy::kHybridShard}) {
    SCOPED_TRACE(shardStrategyName(strategy));
    EngineFixture f(strategy, 3);
    f.engine->beforeUnitForward(0);
    f.engine->afterUnitForward(0);
    EXPECT_GT(f.engine->gathersInFlight(), 0);
    f.engine->releaseAll();
    EXPECT_EQ(f.engine->phase(), EnginePhase::kIdle);
    EXPECT_EQ(str(f.states()), str(std::vector<S>(static_cast<size_t>(f.n), S::kSharded)));
    f.engine->beginStep();
    f.forward();
    f.backward(0);
  }
}

// A hook out of order is refused naming the phase; so are the optimizer's calls mid-pass.
TEST(ShardedEngineStates, PhaseEdgesOutOfOrderAreRefused) {
  auto expectRefused = [](const std::function<void()>& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << what << " was accepted";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  EngineFixture f(ShardStrategy::kFullShard);
  expectRefused([&] { f.engine->beforeUnitBackward(f.n - 1); }, "beforeUnitBackward in phase idle");
  expectRefused([&] { f.engine->finishBackward(); }, "finishBackward in phase idle");
  f.engine->beforeUnitForward(0);
  expectRefused([&] { f.engine->step(1e-3f); }, "step in phase forward");
  expectRefused([&] { f.engine->clipGradNorm(1.f); }, "clipGradNorm in phase forward");
  f.engine->afterUnitForward(0);
  for (int u = 1; u < f.n; ++u) {
    f.engine->beforeUnitForward(u);
    f.engine->afterUnitForward(u);
  }
  f.engine->beforeUnitBackward(f.n - 1);
  expectRefused([&] { f.engine->beforeUnitForward(0); }, "beforeUnitForward in phase backward");
  expectRefused([&] { f.engine->releaseAll(); }, "releaseAll in phase backward");
  // A unit edge out of order names the unit: its backward ended twice.
  f.engine->afterUnitBackward(f.n - 1);
  expectRefused([&] { f.engine->afterUnitBackward(f.n - 1); },
                "illegal edge start_reduce from state reducing");
}

TEST(OffloadQueue, JobsRunOneAtATimeAndReportUnits) {
  OffloadQueue q;
  std::atomic<int> ran{0};
  std::atomic<bool> go{false};  // holds each job until the test has tried a second submit
  std::thread worker([&] {
    OffloadJob job;
    while (q.take(&job)) {
      while (!go.exchange(false))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (size_t u = 0; u < 4; ++u) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        q.unitsDone(u + 1);
      }
      ran += static_cast<int>(job.lr);
      q.finish(nullptr);
    }
  });
  for (int i = 1; i <= 3; ++i) {
    OffloadJob job;
    job.lr = static_cast<float>(i);
    q.submit(job);
    EXPECT_THROW(q.submit(job), InternalError) << "a second job while one is queued or running";
    go = true;
    q.awaitUnit(1);
    EXPECT_NE(q.state(), OffloadQueue::State::kQueued);
    q.settle();
    EXPECT_EQ(q.state(), OffloadQueue::State::kIdle);
  }
  EXPECT_EQ(ran.load(), 6);
  q.stop();
  worker.join();
  EXPECT_EQ(q.state(), OffloadQueue::State::kStopped);
}

TEST(OffloadQueue, ErrorSurfacesOnTheTrainingThreadOnce) {
  OffloadQueue q;
  std::thread worker([&] {
    OffloadJob job;
    while (q.take(&job))
      q.finish(std::make_exception_ptr(IoError("cpu step failed")));
  });
  q.submit(OffloadJob());
  EXPECT_THROW(q.awaitUnit(0), IoError);
  q.settle();  // reported once
  q.submit(OffloadJob());
  EXPECT_THROW(q.settle(), IoError);
  q.stop();
  worker.join();
}

TEST(OffloadQueue, StopDropsAQueuedJobAndLetsARunningOneFinish) {
  OffloadQueue q;
  q.submit(OffloadJob());
  q.stop();  // nobody took it
  OffloadJob job;
  EXPECT_FALSE(q.take(&job));
  EXPECT_EQ(q.state(), OffloadQueue::State::kStopped);

  OffloadQueue r;
  r.submit(OffloadJob());
  ASSERT_TRUE(r.take(&job));
  r.stop();
  EXPECT_EQ(r.state(), OffloadQueue::State::kStopping);
  r.finish(nullptr);
  EXPECT_EQ(r.state(), OffloadQueue::State::kStopped);
  r.settle();  // returns: nothing runs any more
}

}  // namespace
}  // namespace mt
