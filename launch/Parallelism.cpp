#include "launch/Parallelism.h"

#include "comm/Hierarchy.h"
#include "core/Allocator.h"
#include "core/Timer.h"
#include "core/optim/GradClip.h"

namespace mt {

namespace {

std::vector<Communicator*> groupsOf(NodeGroups* g) {
  if (!g) return {};
  return g->communicators();
}

// The node groups of the layout over `world`, for whichever strategy needs them (`key`: the
// setting that asked for them, named when the layout has none).
std::unique_ptr<NodeGroups> makeGroups(const Config& cfg, const char* key, Communicator& world, const NodePlan& plan) {
  if (!plan.unusable.empty()) cfg.fail(key, plan.unusable);
  if (world.size() % plan.ranksPerNode != 0)
    cfg.fail("topo.node_ranks", std::to_string(plan.ranksPerNode) + " ranks per node do not divide the " +
                                    std::to_string(world.size()) + " ranks");
  return std::make_unique<NodeGroups>(world, plan);
}

// no_shard: every rank holds the whole model and optimizer state; gradients are averaged by
// DataParallel's buckets (absent on a single rank of the local backend: nothing to reduce).
class Replicated final : public Parallelism {
 public:
  Replicated(const Settings& s, const Config& cfg, Model& model, Communicator& world, const NodePlan& nodes)
      : model_(model) {
    // An explicitly chosen backend is used even by a single rank (so a 1-rank NCCL run exercises it).
    if (world.size() > 1 || std::string(world.backend()) != "local") {
      dp_ = std::make_unique<DataParallel>(model.params(), world, s.dp);
      if (s.hierarchical) {
        groups_ = makeGroups(cfg, "topo.hierarchical", world, nodes);
        dp_->setReducer(std::make_unique<HierarchicalReducer>(*groups_));
      } else {
        dp_->setReducer(makeBucketReducer(s.compression, world, model.params()));
      }
      dp_->broadcastParameters(0);
      model.setHooks(dp_.get());
    }
    // After the buckets' layout: per-step gradients are one buffer per bucket (or per unit).
    model.params().setGradLifetime(s.gradLifetime);
    optimizer_ = makeOptimizer(s.optim, segmentsOf(model.params()));
  }
  ~Replicated() override {
    optimizer_.reset();
    if (dp_) model_.setHooks(nullptr);
    dp_.reset();
    groups_.reset();
  }

  std::string strategyName() const override { return "no_shard"; }
  Optimizer& optimizer() override { return *optimizer_; }
  bool keepsWeightCasts() const override { return true; }
  void beginStep(int64_t) override {}
  void beforeBackward(int k, int count, int64_t step) override {
    if (!dp_) return;
    const bool last = k + 1 == count;
    if (last) dp_->reducer().beginStep(step);
    dp_->beginBackward(/*sync=*/last);  // earlier micro-steps only accumulate: no bucket launches
  }
  void finishBackward() override {
    if (dp_) dp_->finishBackward();
    rebindGrads();
  }
  void clipGradNorm(float maxNorm) override { clipGradNormInPlace(optimizer_->segments(), maxNorm); }
  void step(float lr) override { optimizer_->step(lr); }
  void afterStep() override {
    ParamTable& t = model_.params();
    // Per-step gradients go now, before evaluation or the next forward: the optimizer's views
    // are dropped with them (they would keep the buffers alive).
    const bool perStep = t.gradLifetime() == GradLifetime::kPerStep;
    if (perStep) t.dropGrads();
    if ((dp_ && dp_->afterStep()) || perStep) optimizer_->rebind(segmentsOf(t));
  }
  void afterEvalForward() override {}
  void afterLoad() override {}
  MemoryAccount measureMemory() override {
    MemoryAccount m;
    m.paramBytes = static_cast<int64_t>(model_.params().flatValues().nbytes());
    m.gradBytes = model_.params().gradBytes();
    m.optimizerBytes = optimizer_->stateBytes();
    m.devicePeakBytes = allocatorFor(model_.params().device()).stats().peakAllocatedBytes;
    return m;
  }
  CommReport takeCommReport() override {
    CommReport r;
    if (!dp_) return r;
    r.present = true;
    r.reducer = dp_->reducer().name();
    r.stats = dp_->reducer().takeStats();
    return r;
  }
  std::vector<BucketTrace> bucketTrace() const override { return dp_ ? dp_->lastTrace() : std::vector<BucketTrace>{}; }
  int64_t backwardEndUs() const override { return dp_ ? dp_->backwardEndUs() : wallMicros(); }
  CheckpointRole checkpointRole() const override { return {}; }
  BucketReducer* reducer() override { return dp_ ? &dp_->reducer() : nullptr; }
  std::vector<Communicator*> groupCommunicators() override { return groupsOf(groups_.get()); }

 private:
  // Per-step gradients: every buffer exists after backward (one a parameter without a gradient
  // this step gets as zeros), and the optimizer, clipping and the loss scaler read these views.
  void rebindGrads() {
    ParamTable& t = model_.params();
    if (t.gradLifetime() != GradLifetime::kPerStep) return;
    t.needAllGrads();
    optimizer_->rebind(segmentsOf(t));
  }

  Model& model_;
  std::unique_ptr<NodeGroups> groups_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<Optimizer> optimizer_;
};

// full_shard / shard_grad_op / hybrid_shard: ShardedEngine owns the shards and their optimizer.
class Sharded final : public Parallelism {
 public:
  Sharded(const Settings& s, const Config& cfg, Model& model, Communicator& world, const NodePlan& nodes)
      : model_(model) {
    Communicator* shardComm = &world;
    Communicator* replicaComm = nullptr;
    if (s.sharding.strategy == ShardStrategy::kHybridShard) {
      groups_ = makeGroups(cfg, "sharding.strategy", world, nodes);
      shardComm = &groups_->intra();
      replicaComm = &groups_->inter();
    }
    engine_ = std::make_unique<ShardedEngine>(model.params(), *shardComm, replicaComm, s.sharding, s.optim,
                                              [&model] { return model.activationBytes(); });
    model.setHooks(engine_.get());
  }
  ~Sharded() override {
    model_.setHooks(nullptr);
    engine_.reset();
    groups_.reset();
  }

  std::string strategyName() const override { return engine_->strategyName(); }
  Optimizer& optimizer() override { return engine_->optimizer(); }
  // Gathered weights are freed between forward and backward.
  bool keepsWeightCasts() const override { return false; }
  void beginStep(int64_t) override { engine_->beginStep(); }
  void beforeBackward(int k, int count, int64_t) override { engine_->setMicroStep(k, count); }
  void finishBackward() override { engine_->finishBackward(); }
  void clipGradNorm(float maxNorm) override { engine_->clipGradNorm(maxNorm); }
  void step(float lr) override { engine_->step(lr); }
  void afterStep() override {}
  void afterEvalForward() override { engine_->releaseAll(); }
  void afterLoad() override { engine_->refreshGatherCopies(); }
  MemoryAccount measureMemory() override { return engine_->measureMemory(); }
  CommReport takeCommReport() override {
    CommReport r;
    r.offload = engine_->takeOffloadTimes();
    return r;
  }
  std::vector<BucketTrace> bucketTrace() const override { return engine_->lastTrace(); }
  int64_t backwardEndUs() const override { return engine_->backwardEndUs(); }
  CheckpointRole checkpointRole() const override { return {false, engine_->isReplicaWriter()}; }
  std::vector<Communicator*> groupCommunicators() override { return groupsOf(groups_.get()); }

 private:
  Model& model_;
  std::unique_ptr<NodeGroups> groups_;
  std::unique_ptr<ShardedEngine> engine_;
};

}  // namespace

std::unique_ptr<Parallelism> makeParallelism(const Settings& s, const Config& cfg, Model& model, Communicator& world,
                                             const NodePlan& nodes) {
  if (s.sharding.strategy != ShardStrategy::kNoShard) return std::make_unique<Sharded>(s, cfg, model, world, nodes);
  return std::make_unique<Replicated>(s, cfg, model, world, nodes);
}

}  // namespace mt
