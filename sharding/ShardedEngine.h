#pragma once
// Fully sharded data parallelism (ZeRO-3 / FSDP) and its relatives, as model hooks.
//
// The model's parameters are grouped into units (the ParamTable's units: a layer, or a block);
// each is a ShardUnit (sharding/ShardUnit.h): one flat buffer split into W equal shards, rank r
// keeping shard r of every unit for good: the f32 master copy, the optimizer state, the gradient
// shard (in sharding.reduce_dtype; with offload its host copy only) and — when the parameter dtype
// is bf16, or with offload — a copy on the device used for the all-gathers. Everything else a unit holds
// exists only in some states of its state machine.
//
//   full_shard     all-gather a unit before its forward, free it after; all-gather it again
//                  before its backward; reduce-scatter its gradient as its backward ends
//   shard_grad_op  as full_shard, but a unit gathered in forward stays (kept) until its backward
//   hybrid_shard   full_shard inside a node; gradient shards are then averaged across nodes
//                  (each node holds a full replica of the sharded state)
//   no_shard       not handled here: data parallelism through comm/DataParallel
//
// The engine itself is in one phase at a time — idle, forward (units' forwards, also evaluation)
// or backward — entered by the hooks; a hook called in a phase it cannot follow throws
// InternalError. While a unit computes, the all-gathers of the next units are issued (forward:
// the following units, backward: the preceding ones) as long as the unit computing plus the
// gathers in flight stay within `prefetchLimit`; units that are held gathered for another reason
// (shard_grad_op's kept units, a unit the model keeps open around the whole pass) do not count.
// Activation checkpointing (models/gpt) recomputes a block's forward inside its backward hooks, so
// the unit is gathered once for both. With offload = cpu the master shard and the optimizer state
// live in (pinned) host memory and the optimizer step runs on the CPU; the GPU keeps only the gather
// copies (bf16 under bf16/f16 compute, sharding.param_dtype = auto): each unit's gradient shard is
// reduce-scattered into a device buffer of its own that goes down to its host copy (added to it
// after the first micro-step) as soon as the reduction ends, and updated parameter shards come back
// up. offloadFraction < 1 (ZeRO-Offload++'s twin flow) offloads only the last units, about that
// share of the parameters: the first units, whose updates the next forward needs first and whose
// gradients land last, keep their shards on the device and step there while the CPU steps the rest
// (firstOffloadedUnit; core/optim/SplitOptimizer).
//
// The optimizer's segments carry their global offsets, so sharded checkpoints load into any world
// size and any strategy (launch/Checkpoint).

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "comm/DataParallel.h"
#include "core/EnumTable.h"
#include "core/ModelHooks.h"
#include "core/ParamTable.h"
#include "core/optim/Optimizer.h"
#include "sharding/ShardUnit.h"

namespace mt {

enum class ShardStrategy { kNoShard, kFullShard, kShardGradOp, kHybridShard };
const EnumTable<ShardStrategy>& shardStrategies();
inline bool parseShardStrategy(const std::string& s, ShardStrategy* out) {
  return parseEnum(shardStrategies(), s, out);
}
inline const char* shardStrategyName(ShardStrategy s) {
  return enumName(shardStrategies(), s);
}

struct ShardingOptions {
  ShardStrategy strategy = ShardStrategy::kFullShard;
  bool offloadCpu = false;
  bool delayedUpdate = false;       // offload: step i's CPU update overlaps step i+1 (one step stale)
  // offload: the share of the parameters whose master, gradient shard and optimizer state go to the
  // host — the last units in forward order; the first ones stay on the GPU and step there
  // (ZeRO-Offload++'s twin flow), so the next forward runs them while the CPU steps the rest.
  double offloadFraction = 1.0;
  int prefetchLimit = 2;            // the unit computing + all-gathers in flight
  DType paramDtype = DType::kF32;   // all-gathered parameters (f32 or bf16)
  DType reduceDtype = DType::kF32;  // reduce-scattered gradients (f32 or bf16)
  // Offload on a GPU: each final gradient shard's sum of squares taken on the device for the clip's
  // norm (train.grad_clip > 0); without a clip nobody reads them.
  bool deviceNorms = true;
};

struct MemoryAccount {
  int64_t paramBytes = 0;         // persistent parameter shards (master + gather copy)
  int64_t gradBytes = 0;          // persistent gradient shards (offload: the host copies only)
  int64_t optimizerBytes = 0;     // optimizer state
  int64_t gatheredPeakBytes = 0;  // unsharded unit parameters and gradients alive at once
  int64_t activationPeakBytes = 0;
  int64_t devicePeakBytes = 0;  // the allocator's peak (GPU) or the CPU allocator's peak
  int64_t hostBytes = 0;  // of the persistent bytes, those in host memory (offload: master, grads, state)
  int64_t persistent() const { return paramBytes + gradBytes + optimizerBytes; }
};

// Partial offload: the first unit whose optimizer runs on the host, for units of `unitNumel`
// elements — the k whose units k..n-1 hold the share nearest `fraction` of all elements (1: 0,
// every unit; the last unit always). Shared by the engine and `trainer plan`.
int firstOffloadedUnit(const std::vector<int64_t>& unitNumel, double fraction);

enum class EnginePhase { kIdle, kForward, kBackward };
const EnumTable<EnginePhase>& enginePhases();

// Where ZeRO-Offload's time went since the last take (sharding.offload = cpu on a GPU): the CPU
// worker's jobs (one optimizer step each), the part of them spent waiting for gradient copies to
// land, and the time the training thread stood still waiting for the worker (the next forward's
// units, or the previous update at step()) and the GPU stood waiting for uploads. Both waits near
// zero: the CPU step is hidden.
struct OffloadTimes {
  int64_t jobs = 0;         // CPU steps finished (0: no offload, or none this interval)
  double jobS = 0.0;        // the worker's wall time in them
  double copyWaitS = 0.0;   // of which waiting for gradient shards to reach the host
  double trainWaitS = 0.0;  // the training thread blocked on the worker
  double gpuWaitS = 0.0;    // the compute stream stalled on parameter uploads (its all-gathers' waits)
};

class ShardedEngine final : public ModelHooks {
 public:
  // params: the model's parameter table, already initialised; the engine keeps this rank's shards
  // and releases the full copy. shardComm: the group a unit is sharded over (the world, or the node
  // for hybrid_shard); replicaComm: across replicas (hybrid_shard only; null otherwise).
  // activationBytes: the model's live activation bytes, read as backward starts for the memory
  // record (null: not recorded). The engine sees the model only through these and the hooks.
  ShardedEngine(ParamTable& params, Communicator& shardComm, Communicator* replicaComm,
                ShardingOptions options, const OptimConfig& optim,
                std::function<int64_t()> activationBytes = nullptr);
  ~ShardedEngine() override;

  void beforeUnitForward(int unit) override;
  void afterUnitForward(int unit) override;
  void beforeUnitBackward(int unit) override;
  void afterUnitBackward(int unit) override;
  // Gradient buffers are handed out unit by unit in backward (beforeUnitBackward).
  bool gradsKeptAcrossForward() const override { return false; }

  // Before a training step's forward: statistics reset, nothing gathered.
  void beginStep();
  // After backward: waits for the gradient reductions; gradients of the shards are then the
  // average over all ranks.
  void finishBackward();
  // Gradient accumulation: the backward that follows is micro-step k of `count` in this optimizer
  // step. After the first, reduce-scatters land in a scratch shard that finishBackward() adds to
  // the unit's gradient shard (FSDP's accumulation of sharded gradients); the replica all-reduce
  // (hybrid_shard) and the offload copy run after the last micro-step only.
  void setMicroStep(int k, int count);
  // Global gradient norm over all shards (sum of squares all-reduced), clipping when maxNorm > 0.
  double clipGradNorm(float maxNorm);
  // The optimizer step on the shards, then the gather copies refreshed.
  void step(float lr);
  // After evaluation forwards (no backward): free what the forwards left gathered.
  void releaseAll();

  // Introspection (tests, failure reports).
  EnginePhase phase() const { return phase_; }
  int firstOffloaded() const { return firstOffloaded_; }  // units.size() without offload
  UnitState unitState(int unit) const { return units_[static_cast<size_t>(unit)].state(); }
  int gathersInFlight() const;

  // The optimizer, its segments' gradients readable on the host (with offload: after the pending
  // CPU step and gradient copies; the loss scaler and checkpoints come through here).
  Optimizer& optimizer();
  const MemoryAccount& memory() const { return memory_; }
  MemoryAccount measureMemory();
  // After the optimizer state or master shards were overwritten (checkpoint load).
  void refreshGatherCopies();
  bool isReplicaWriter() const;  // whether this rank's shards go into checkpoints
  std::string strategyName() const { return shardStrategyName(opt_.strategy); }
  int64_t unitCount() const { return static_cast<int64_t>(units_.size()); }
  // Per unit of the last backward: gradient ready, reduce-scatter, replica all-reduce (hybrid_shard:
  // its inter-node phase), for run.trace; and when backward's compute ended.
  const std::vector<BucketTrace>& lastTrace() const { return trace_; }
  int64_t backwardEndUs() const { return backwardEndUs_; }
  // Offload's timings since the last call (zeros without offload), then reset.
  OffloadTimes takeOffloadTimes();

 private:
  // ZeRO-Offload on a GPU (sharding/ShardedOffload.cpp): gradient shards copied down as their
  // reductions finish, the CPU step on a worker thread unit by unit, each unit's parameter shard
  // copied up behind it; a unit's next all-gather waits for that unit only.
  struct Offload;
  struct OffloadDeleter {
    void operator()(Offload* o) const noexcept;  // defined where Offload is
  };
  void startOffload();
  void stopOffload() noexcept;
  void offloadWorker();
  void uploadParams(int u);  // packParams + sendParams
  void packParams(int u);    // master shard -> pinned stage in the gather dtype (bf16); f32: nothing
  void sendParams(int u);    // stage (or f32 master) -> gather copy on the copy stream
  void uploadAllParams();
  Tensor& gradTarget(int u);
  // Offload: units whose reductions finished (all: every unit still reducing; and the oldest beyond
  // kGradShardsInFlight) land their gradient shard and send it down to the host.
  void landGrads(bool all);
  ShardUnit::GradSink gradSink(int u);      // the copy stream on a GPU (ShardedOffload.cpp), else:
  ShardUnit::GradSink hostGradSink(int u);  // a synchronous copy / add into the unit's host copy
  void bindHostGrads(int buffer);
  void settle();           // the worker idle (its error rethrown here)
  void settleHostGrads();  // settle() and this iteration's gradients on the host
  void awaitParams(int u);
  void foldStall(size_t u);  // a completed upload stall of unit u into the interval's GPU wait
  double clipOffloaded(float maxNorm);
  // The host gradients handed out (optimizer()) may change (the loss scaler unscales them): the
  // norms summed on the GPU before their copies no longer hold, clipOffloaded sums the host's.
  void forgetDeviceNorms();
  void stepOffloaded(float lr);

  // Every parameter's piece inside this rank's shard of each unit, in unit order: values over the
  // master shard, gradients over the unit's gradient shard (an offloaded unit's: hostGrads[unit]);
  // ranges (when given) gets each unit's [first, last).
  std::vector<OptimSegment> shardSegments(const std::vector<Tensor>& hostGrads,
                                          std::vector<std::pair<size_t, size_t>>* ranges = nullptr) const;
  // Partial offload: the optimizer's segments of the units kept on the GPU ([0, keptSegments_)).
  std::vector<OptimSegment> keptSegments() const;
  // Phase edges: `to` from the phases allowed to precede it (else InternalError naming `event`).
  void enterPhase(EnginePhase to, const char* event, std::initializer_list<EnginePhase> from);
  void gather(int u);     // offload: after the unit's update is on its way up
  void makeReady(int u);  // gathered (issued now or prefetched) and waited for
  void prefetch(int from, int step);
  void trackGathered();

  int microStep_ = 0, microSteps_ = 1;
  std::function<int64_t()> activationBytes_;
  ParamTable& table_;
  Communicator& shardComm_;
  Communicator* replicaComm_;
  ShardingOptions opt_;
  Device device_;
  std::vector<ShardUnit> units_;
  int firstOffloaded_ = 0;    // units [firstOffloaded_, n) are offloaded (n: none)
  size_t keptSegments_ = 0;   // their segments follow the kept units' ones in the optimizer
  std::unique_ptr<Optimizer> optimizer_;
  MemoryAccount memory_;
  EnginePhase phase_ = EnginePhase::kIdle;
  std::vector<BucketTrace> trace_;
  int64_t backwardEndUs_ = 0;
  std::unique_ptr<Offload, OffloadDeleter> off_;  // last: its worker stops before the units go
};

}  // namespace mt
