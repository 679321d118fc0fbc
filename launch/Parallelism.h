#pragma once
// One interface for how a step's gradients are reduced and the parameters updated, whatever the
// strategy: replicated (no_shard: comm/DataParallel's buckets, or nothing on a single local rank)
// or sharded (full_shard / shard_grad_op / hybrid_shard: sharding/ShardedEngine). The trainer
// drives a step through it alone:
//   beginStep -> (forward, beforeBackward(k), backward, finishBackward) per micro-step
//   -> clipGradNorm -> step -> afterStep
// makeParallelism() builds it from the settings, with the node groups (hierarchical all-reduce,
// hybrid_shard) made once, and installs it as the model's hooks.

#include <memory>
#include <string>
#include <vector>

#include "comm/Hierarchy.h"
#include "comm/Communicator.h"
#include "comm/Compression.h"
#include "comm/DataParallel.h"
#include "launch/Config.h"
#include "launch/Settings.h"
#include "models/Model.h"
#include "core/optim/Optimizer.h"
#include "sharding/ShardedEngine.h"

namespace mt {

// What a step's gradient traffic cost (data parallelism), and for sharded strategies with
// sharding.offload = cpu where the offload's time went.
struct CommReport {
  bool present = false;
  std::string reducer;  // "allreduce", "powersgd", "hierarchical", ...
  CompressionStats stats;
  OffloadTimes offload;  // jobs == 0: no offload
};

// How checkpoints treat this rank's optimizer state.
struct CheckpointRole {
  bool replicated = true;  // every rank holds all of it (rank 0 writes)
  bool writes = true;      // this rank's shards go into the checkpoint
};

class Parallelism {
 public:
  virtual ~Parallelism() = default;
  virtual std::string strategyName() const = 0;
  virtual Optimizer& optimizer() = 0;
  // Weight casts may be kept from forward to backward (parameters stay in place between them).
  virtual bool keepsWeightCasts() const = 0;

  // Before a training step's first forward.
  virtual void beginStep(int64_t step) = 0;
  // Before the backward of micro-step k of `count` (only the last one reduces across ranks).
  virtual void beforeBackward(int k, int count, int64_t step) = 0;
  // After each backward: waits for what it reduces; gradients are then the average over ranks.
  virtual void finishBackward() = 0;
  // Global gradient norm clipped to maxNorm (> 0), over all ranks' gradients or shards.
  virtual void clipGradNorm(float maxNorm) = 0;
  // The optimizer step (skipped by the caller when a loss scaler found inf/nan gradients).
  virtual void step(float lr) = 0;
  // After every step, applied or skipped (a pending bucket rebuild rebinds the optimizer).
  virtual void afterStep() = 0;
  // After evaluation forwards (no backward follows).
  virtual void afterEvalForward() = 0;
  // After the optimizer state was loaded from a checkpoint.
  virtual void afterLoad() = 0;

  virtual MemoryAccount measureMemory() = 0;
  virtual CommReport takeCommReport() = 0;
  // Per-bucket timestamps of the last step's backward (data parallelism), and when it ended.
  virtual std::vector<BucketTrace> bucketTrace() const = 0;
  virtual int64_t backwardEndUs() const = 0;
  virtual CheckpointRole checkpointRole() const = 0;
  // The data-parallel gradient reducer, whose compressor state checkpoints keep; null without one.
  virtual BucketReducer* reducer() { return nullptr; }
  // The communicators built besides the world (node groups: intra-node, inter-node), for reports.
  virtual std::vector<Communicator*> groupCommunicators() = 0;
};

// Builds the strategy of `s` for `model` (parameters initialised) over `world`; `nodes` is this
// rank's place in the rank layout (node, slot, communicator config) that node groups use.
// Configuration errors (a layout without node groups) go through cfg.fail.
std::unique_ptr<Parallelism> makeParallelism(const Settings& s, const Config& cfg, Model& model, Communicator& world,
                                             const NodePlan& nodes);

}  // namespace mt
