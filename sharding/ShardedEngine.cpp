#include "sharding/ShardedEngine.h"

#include <algorithm>
#include <cmath>

#include "core/Convert.h"
#include "core/Log.h"
#include "core/Timer.h"
#include "core/optim/GradClip.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaRuntime.h"
#endif

namespace mt {

const EnumTable<ShardStrategy>& shardStrategies() {
  static const EnumTable<ShardStrategy> kTable = {
      {ShardStrategy::kNoShard, "no_shard", "data parallel"},
      {ShardStrategy::kFullShard, "full_shard"},
      {ShardStrategy::kShardGradOp, "shard_grad_op"},
      {ShardStrategy::kHybridShard, "hybrid_shard"},
  };
  return kTable;
}

const EnumTable<EnginePhase>& enginePhases() {
  static const EnumTable<EnginePhase> kTable = {
      {EnginePhase::kIdle, "idle"}, {EnginePhase::kForward, "forward"}, {EnginePhase::kBackward, "backward"}};
  return kTable;
}

namespace {

// Offload: a unit's device gradient shard lives from its reduce-scatter until it is on its way
// down. Beyond this many units holding one, backward waits for the oldest reduction, so the GPU
// holds a few units' gradient shards at most (not one per parameter).
constexpr size_t kGradShardsInFlight = 2;

Allocator& hostAllocatorFor(Device device) {
#ifdef MT_WITH_CUDA
  if (device.isCuda()) return CudaRuntime::require().pinned();
#endif
  return cpuAllocator();
}

}  // namespace

ShardedEngine::ShardedEngine(ParamTable& params, Communicator& shardComm, Communicator* replicaComm,
                             ShardingOptions options, const OptimConfig& optim,
                             std::function<int64_t()> activationBytes)
    : activationBytes_(std::move(activationBytes)),
      table_(params),
      shardComm_(shardComm),
      replicaComm_(replicaComm),
      opt_(options) {
  MT_CHECK(opt_.strategy != ShardStrategy::kNoShard, "no_shard goes through DataParallel");
  MT_CHECK(opt_.strategy != ShardStrategy::kHybridShard || replicaComm_,
           "hybrid_shard needs a replica group");
  MT_CHECK(table_.materialized() && !table_.storageReleased(), "sharding needs the initialised parameters");
  MT_REQUIRE(opt_.paramDtype == DType::kF32 || opt_.paramDtype == DType::kBF16, ConfigError,
             "sharding.param_dtype must be f32 or bf16");
  MT_REQUIRE(opt_.reduceDtype == DType::kF32 || opt_.reduceDtype == DType::kBF16, ConfigError,
             "sharding.reduce_dtype must be f32 or bf16");
  MT_REQUIRE(opt_.offloadFraction > 0.0 && opt_.offloadFraction <= 1.0, ConfigError,
             "sharding.offload_fraction must be in (0, 1]");
  device_ = table_.device();
  const int W = shardComm_.size(), r = shardComm_.rank();
  // On a GPU the gradient shard comes down as it is (the CPU step reads bf16 gradients); else in f32.
  const DType hostGrad = device_.isCuda() ? opt_.reduceDtype : DType::kF32;
  std::vector<int64_t> unitNumel;
  for (int u = 0; u < table_.numUnits(); ++u) {
    int64_t n = 0;
    for (const Param* p : table_.unitParams(u)) n += alignParam(p->numel());  // as `trainer plan` counts
    unitNumel.push_back(n);
  }
  firstOffloaded_ = opt_.offloadCpu ? firstOffloadedUnit(unitNumel, opt_.offloadFraction) : table_.numUnits();
  units_.reserve(static_cast<size_t>(table_.numUnits()));
  for (int u = 0; u < table_.numUnits(); ++u) {
    const bool offload = u >= firstOffloaded_;
    units_.emplace_back(u, table_.unitParams(u), W, r, device_,
                        offload ? hostAllocatorFor(device_) : allocatorFor(device_), opt_.paramDtype,
                        opt_.reduceDtype, offload, hostGrad);
  }
  refreshGatherCopies();
  // The staged values go before the optimizer's state comes: with offload both are host memory,
  // and at 6.7B parameters (27 GB of values, 53 GB of AdamW state) the two would not fit together.
  table_.releaseStorage();
  // Optimizer segments over the gradient shard itself (f32 or bf16; its host copy with offload).
  // Partial offload: the kept units' segments on the GPU, then the rest on the host — a
  // SplitOptimizer with one part per device (one part on a CPU run).
  std::vector<Tensor> hostGrads;
  for (const auto& unit : units_) hostGrads.push_back(unit.gradShardHost());
  std::vector<std::pair<size_t, size_t>> ranges;
  optimizer_ = makeOptimizer(optim, shardSegments(hostGrads, &ranges));
  keptSegments_ = firstOffloaded_ > 0 ? ranges[static_cast<size_t>(firstOffloaded_) - 1].second : 0;
  if (opt_.offloadCpu && device_.isCuda()) startOffload();
  measureMemory();
}

int firstOffloadedUnit(const std::vector<int64_t>& unitNumel, double fraction) {
  const int n = static_cast<int>(unitNumel.size());
  if (n == 0) return 0;
  int64_t total = 0;
  for (int64_t x : unitNumel) total += x;
  const double want = fraction * static_cast<double>(total);
  int best = n - 1;
  double bestDiff = 1e300;
  int64_t tail = 0;  // elements of units k..n-1
  for (int k = n - 1; k >= 0; --k) {
    tail += unitNumel[static_cast<size_t>(k)];
    const double diff = std::abs(static_cast<double>(tail) - want);
    if (diff <= bestDiff) {  // ties: the smaller k (more offloaded)
      best = k;
      bestDiff = diff;
    }
  }
  return best;
}

std::vector<OptimSegment> ShardedEngine::keptSegments() const {
  const auto& all = optimizer_->segments();
  return std::vector<OptimSegment>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keptSegments_));
}

std::vector<OptimSegment> ShardedEngine::shardSegments(const std::vector<Tensor>& hostGrads,
                                                       std::vector<std::pair<size_t, size_t>>* ranges) const {
  std::vector<OptimSegment> segments;
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    const ShardUnit& unit = units_[ui];
    const Tensor& grad = unit.offload() ? hostGrads[ui] : unit.gradShard();
    const int64_t lo = static_cast<int64_t>(shardComm_.rank()) * unit.shard();
    const size_t first = segments.size();
    const Tensor master = unit.master();
    for (const auto& m : unit.members()) {
      const int64_t a = std::max(lo, m.unitOffset),
                    b = std::min(lo + unit.shard(), m.unitOffset + m.param->numel());
      if (a >= b) continue;
      segments.push_back({master.flatSlice(a - lo, b - a), grad.flatSlice(a - lo, b - a), m.param->decay,
                          m.param->offset + (a - m.unitOffset)});
    }
    if (ranges) ranges->emplace_back(first, segments.size());
  }
  return segments;
}

// Each unit waits for an op of its own still in flight as it goes (ShardUnit's destructor).
ShardedEngine::~ShardedEngine() {
  stopOffload();
}

bool ShardedEngine::isReplicaWriter() const {
  return opt_.strategy != ShardStrategy::kHybridShard || !replicaComm_ || replicaComm_->rank() == 0;
}

Optimizer& ShardedEngine::optimizer() {
  if (off_) {
    settleHostGrads();
    forgetDeviceNorms();
  }
  return *optimizer_;
}

void ShardedEngine::refreshGatherCopies() {
  if (off_) uploadAllParams();  // the offloaded units'
  for (auto& u : units_)
    if (!off_ || !u.offload()) u.refreshGatherCopy();
}

int ShardedEngine::gathersInFlight() const {
  int n = 0;
  for (const auto& u : units_)
    n += u.state() == UnitState::kGathering ? 1 : 0;
  return n;
}

void ShardedEngine::trackGathered() {
  int64_t b = 0;
  for (const auto& u : units_)
    b += u.transientBytes();
  memory_.gatheredPeakBytes = std::max(memory_.gatheredPeakBytes, b);
}

void ShardedEngine::enterPhase(EnginePhase to, const char* event, std::initializer_list<EnginePhase> from) {
  MT_CHECK(std::find(from.begin(), from.end(), phase_) != from.end(), "sharded engine: ", event, " in phase ",
           enumName(enginePhases(), phase_));
  phase_ = to;
}

void ShardedEngine::gather(int u) {
  awaitParams(u);  // offload: this unit's update is on the device (or on its way, stream-ordered)
  units_[static_cast<size_t>(u)].gather(shardComm_);
}

void ShardedEngine::makeReady(int u) {
  ShardUnit& unit = units_[static_cast<size_t>(u)];
  if (unit.state() == UnitState::kSharded) gather(u);
  if (unit.state() == UnitState::kGathering) unit.finishGather(shardComm_.timeout());
}

// The units after (step 1) or before (step -1) `from` that are not gathered yet, while the unit
// computing and the all-gathers in flight stay within the limit. Units held gathered are passed
// over: they cost no gather and are not in flight.
void ShardedEngine::prefetch(int from, int step) {
  const int n = static_cast<int>(units_.size());
  int inFlight = gathersInFlight();
  for (int v = from + step; v >= 0 && v < n && 1 + inFlight < opt_.prefetchLimit; v += step) {
    if (units_[static_cast<size_t>(v)].state() != UnitState::kSharded) continue;
    gather(v);
    ++inFlight;
  }
}

void ShardedEngine::beginStep() {
  enterPhase(EnginePhase::kIdle, "beginStep", {EnginePhase::kIdle});
  memory_.gatheredPeakBytes = 0;
  memory_.activationPeakBytes = 0;
}

void ShardedEngine::beforeUnitForward(int u) {
  enterPhase(EnginePhase::kForward, "beforeUnitForward", {EnginePhase::kIdle, EnginePhase::kForward});
  makeReady(u);
  prefetch(u, 1);
  trackGathered();
}

void ShardedEngine::afterUnitForward(int u) {
  enterPhase(EnginePhase::kForward, "afterUnitForward", {EnginePhase::kForward});
  ShardUnit& unit = units_[static_cast<size_t>(u)];
  if (opt_.strategy == ShardStrategy::kShardGradOp)
    unit.keep();
  else
    unit.release();
}

void ShardedEngine::beforeUnitBackward(int u) {
  enterPhase(EnginePhase::kBackward, "beforeUnitBackward", {EnginePhase::kForward, EnginePhase::kBackward});
  if (activationBytes_)
    memory_.activationPeakBytes = std::max(memory_.activationPeakBytes, activationBytes_());
  makeReady(u);
  units_[static_cast<size_t>(u)].bindGrads();
  trackGathered();
  prefetch(u, -1);
}

void ShardedEngine::afterUnitBackward(int u) {
  enterPhase(EnginePhase::kBackward, "afterUnitBackward", {EnginePhase::kBackward});
  // hybrid_shard, one micro-step: the replica all-reduce is chained on the reduce-scatter now;
  // with accumulation it follows the last micro-step's accumulate, in finishBackward.
  // Offload chains it on every micro-step: the device shard goes down (and is summed on the host)
  // at once, and averaging is linear.
  ShardUnit& unit = units_[static_cast<size_t>(u)];
  unit.startReduce(shardComm_, opt_.reduceDtype, microStep_ > 0,
                   microSteps_ == 1 || unit.offload() ? replicaComm_ : nullptr);
  landGrads(false);  // offload: shards whose reduction finished start down now
}

void ShardedEngine::landGrads(bool all) {
  if (!opt_.offloadCpu) return;
  // Backward runs the units last to first: the highest index reducing started first.
  std::vector<size_t> reducing;
  for (size_t ui = units_.size(); ui-- > 0;)
    if (units_[ui].offload() && units_[ui].state() == UnitState::kReducing) reducing.push_back(ui);
  const size_t mustLand = all                                     ? reducing.size()
                          : reducing.size() > kGradShardsInFlight ? reducing.size() - kGradShardsInFlight
                                                                  : 0;
  for (size_t i = 0; i < reducing.size(); ++i) {
    ShardUnit& unit = units_[reducing[i]];
    if (i >= mustLand && !unit.reduceCompleted()) continue;
    unit.landGrad(shardComm_);
    unit.sendGradDown(gradSink(static_cast<int>(reducing[i])));
  }
}

ShardUnit::GradSink ShardedEngine::hostGradSink(int u) {
  Tensor host = units_[static_cast<size_t>(u)].gradShardHost();
  return [host](const Tensor& shard, bool accumulate) mutable {
    const Tensor src = shard.device() == host.device() ? shard : shard.to(host.device());
    if (accumulate)
      addShardInto(host, src);  // in f32 (bf16 reductions: as the device accumulation did)
    else
      convertInto(host, src);
  };
}

void ShardedEngine::setMicroStep(int k, int count) {
  MT_CHECK(count >= 1 && k >= 0 && k < count, "micro-step ", k, " of ", count);
  MT_CHECK(phase_ != EnginePhase::kBackward, "sharded engine: setMicroStep in phase backward");
  microStep_ = k;
  microSteps_ = count;
}

void ShardedEngine::finishBackward() {
  enterPhase(EnginePhase::kIdle, "finishBackward", {EnginePhase::kBackward});
  const bool lastMicroStep = microStep_ + 1 >= microSteps_;
  backwardEndUs_ = wallMicros();
  trace_.clear();
  landGrads(true);  // offload: every unit's gradient on its way to (or in) its host copy
  for (auto& u : units_) {
    if (u.state() == UnitState::kReducing)
      u.finishReduce(shardComm_, replicaComm_, lastMicroStep && microSteps_ > 1, lastMicroStep);
    MT_CHECK(u.state() == UnitState::kSharded, "sharding unit ", u.index(), " is ", unitStateName(u.state()),
             " after backward (a unit whose backward did not run)");
    trace_.push_back(u.trace());
  }
  trackGathered();
  if (!lastMicroStep) return;
  microStep_ = 0;
  microSteps_ = 1;
}

double ShardedEngine::clipGradNorm(float maxNorm) {
  enterPhase(EnginePhase::kIdle, "clipGradNorm", {EnginePhase::kIdle});
  if (off_) return clipOffloaded(maxNorm);
  // Shards are disjoint over the shard group; replicas hold copies, so they are not added.
  return mt::clipGradNorm(optimizer_->segments(), maxNorm,
                          [this](double s) { return shardComm_.allReduceScalar(s, ReduceOp::kSum); });
}

void ShardedEngine::step(float lr) {
  enterPhase(EnginePhase::kIdle, "step", {EnginePhase::kIdle});
  if (off_) {
    stepOffloaded(lr);  // returns while the CPU steps; the next gathers wait unit by unit
    return;
  }
  optimizer_->step(lr);
  refreshGatherCopies();
}

void ShardedEngine::releaseAll() {
  enterPhase(EnginePhase::kIdle, "releaseAll", {EnginePhase::kIdle, EnginePhase::kForward});
  for (auto& u : units_) {
    if (u.state() == UnitState::kGathering)
      u.cancelGather(shardComm_.timeout());
    else if (u.state() == UnitState::kGathered || u.state() == UnitState::kKept)
      u.release();
  }
}
MemoryAccount ShardedEngine::measureMemory() {
  MemoryAccount& m = memory_;
  m.paramBytes = m.gradBytes = 0;
  int64_t hostBytes = 0;
  const int64_t hostGradCopies = opt_.delayedUpdate ? 2 : 1;
  for (const auto& u : units_) {
    const int64_t master = static_cast<int64_t>(u.master().nbytes());
    const int64_t hostGrad =
        u.gradShardHost().defined() ? static_cast<int64_t>(u.gradShardHost().nbytes()) * hostGradCopies : 0;
    m.paramBytes += master;
    if (!u.gatherCopy().sharesStorageWith(u.master()))
      m.paramBytes += static_cast<int64_t>(u.gatherCopy().nbytes());
    // With offload the device gradient shard is transient (kReducing .. kReduced): not counted here.
    if (!u.offload()) m.gradBytes += static_cast<int64_t>(u.gradShard().nbytes());
    m.gradBytes += hostGrad;
    if (u.offload() && device_.isCuda()) hostBytes += master + hostGrad;
  }
  m.optimizerBytes = optimizer_->stateBytes();
  // The GPU keeps only the gather copies of offloaded units; the optimizer's state is per element,
  // so the offloaded segments' share of it is host memory.
  int64_t stateNumel = 0, hostStateNumel = 0;
  const auto& segs = optimizer_->segments();
  for (size_t i = 0; i < segs.size(); ++i) {
    stateNumel += segs[i].value.numel();
    if (i >= keptSegments_) hostStateNumel += segs[i].value.numel();
  }
  const int64_t hostState =
      stateNumel > 0 ? static_cast<int64_t>(static_cast<double>(m.optimizerBytes) * hostStateNumel / stateNumel) : 0;
  m.hostBytes = opt_.offloadCpu && device_.isCuda() ? hostBytes + hostState : 0;
  m.devicePeakBytes = allocatorFor(device_).stats().peakAllocatedBytes;
  return m;
}

}  // namespace mt
