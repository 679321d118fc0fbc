#include "sharding/ShardedEngine.h"

#include <algorithm>

#include "comm/CompressionOps.h"
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

namespace {

// shard += more (a later micro-step's reduced gradient), in f32 whatever the reduce dtype.
void accumulateShard(Tensor& shard, const Tensor& more) {
  if (shard.dtype() == DType::kF32) {
    addInto(shard, more);
    return;
  }
  Tensor a = Tensor::empty(shard.shape(), DType::kF32, shard.device());
  Tensor b = Tensor::empty(more.shape(), DType::kF32, more.device());
  convertInto(a, shard);
  convertInto(b, more);
  addInto(a, b);
  convertInto(shard, a);
}

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
  MT_CHECK(opt_.strategy != ShardStrategy::kHybridShard || replicaComm_, "hybrid_shard needs a replica group");
  MT_CHECK(table_.materialized() && !table_.storageReleased(), "sharding needs the initialised parameters");
  MT_REQUIRE(opt_.paramDtype == DType::kF32 || opt_.paramDtype == DType::kBF16, ConfigError,
             "sharding.param_dtype must be f32 or bf16");
  MT_REQUIRE(opt_.reduceDtype == DType::kF32 || opt_.reduceDtype == DType::kBF16, ConfigError,
             "sharding.reduce_dtype must be f32 or bf16");
  device_ = table_.device();
  const int W = shardComm_.size(), r = shardComm_.rank();
  Allocator& optAlloc = opt_.offloadCpu ? hostAllocatorFor(device_) : allocatorFor(device_);
  for (int u = 0; u < table_.numUnits(); ++u) {
    Unit unit;
    int64_t cursor = 0;
    for (Param* p : table_.unitParams(u)) {
      unit.params.push_back({p, cursor});
      cursor += alignParam(p->numel());
    }
    unit.shard = alignParam((cursor + W - 1) / W);
    unit.numel = unit.shard * W;
    unit.master = Tensor::empty({unit.shard}, DType::kF32, optAlloc);
    unit.master.zero_();
    const int64_t lo = static_cast<int64_t>(r) * unit.shard, hi = lo + unit.shard;
    for (const auto& up : unit.params) {
      const int64_t a = std::max(lo, up.unitOffset), b = std::min(hi, up.unitOffset + up.param->numel());
      if (a >= b) continue;
      Tensor src = up.param->value.flat().flatSlice(a - up.unitOffset, b - a);
      Tensor dst = unit.master.flatSlice(a - lo, b - a);
      dst.copyFrom(src);
    }
    if (opt_.paramDtype == DType::kF32 && !opt_.offloadCpu) {
      unit.gatherCopy = unit.master;
    } else {
      unit.gatherCopy = Tensor::empty({unit.shard}, opt_.paramDtype, device_);
    }
    unit.gradShard = Tensor::zeros({unit.shard}, opt_.reduceDtype, device_);
    if (opt_.offloadCpu) {
      // On a GPU the shard comes down as it is (the CPU step reads bf16 gradients); else in f32.
      unit.gradShardHost = Tensor::empty({unit.shard}, device_.isCuda() ? opt_.reduceDtype : DType::kF32, optAlloc);
      unit.gradShardHost.zero_();
    }
    units_.push_back(std::move(unit));
  }
  refreshGatherCopies();
  // Optimizer segments over the gradient shard itself (f32 or bf16; its host copy with offload).
  std::vector<Tensor> grads;
  for (auto& unit : units_) grads.push_back(opt_.offloadCpu ? unit.gradShardHost : unit.gradShard);
  optimizer_ = makeOptimizer(optim, shardSegments(grads));
  table_.releaseStorage();
  if (opt_.offloadCpu && device_.isCuda()) startOffload();
  measureMemory();
}

std::vector<OptimSegment> ShardedEngine::shardSegments(const std::vector<Tensor>& grads,
                                                       std::vector<std::pair<size_t, size_t>>* ranges) const {
  std::vector<OptimSegment> segments;
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    const Unit& unit = units_[ui];
    const int64_t lo = static_cast<int64_t>(shardComm_.rank()) * unit.shard;
    const size_t first = segments.size();
    for (const auto& up : unit.params) {
      const int64_t a = std::max(lo, up.unitOffset), b = std::min(lo + unit.shard, up.unitOffset + up.param->numel());
      if (a >= b) continue;
      segments.push_back({unit.master.flatSlice(a - lo, b - a), grads[ui].flatSlice(a - lo, b - a), up.param->decay,
                          up.param->offset + (a - up.unitOffset)});
    }
    if (ranges) ranges->emplace_back(first, segments.size());
  }
  return segments;
}

ShardedEngine::~ShardedEngine() {
  stopOffload();
  for (auto& u : units_)
    if (u.gatherWork && !u.gatherWork->isCompleted()) {
      try {
        u.gatherWork->wait(shardComm_.timeout());
      } catch (...) {
        // The job is going down; the buffer must simply not be freed under an in-flight op.
      }
    }
}

bool ShardedEngine::isReplicaWriter() const {
  return opt_.strategy != ShardStrategy::kHybridShard || !replicaComm_ || replicaComm_->rank() == 0;
}

Optimizer& ShardedEngine::optimizer() {
  if (off_) settleHostGrads();
  return *optimizer_;
}

void ShardedEngine::refreshGatherCopies() {
  if (off_) {
    uploadAllParams();
    return;
  }
  for (auto& u : units_) {
    if (u.gatherCopy.sharesStorageWith(u.master)) continue;
    if (u.master.device() == u.gatherCopy.device() || u.gatherCopy.dtype() == DType::kF32) {
      if (u.master.device() == u.gatherCopy.device()) {
        convertInto(u.gatherCopy, u.master);
      } else {
        u.gatherCopy.copyFrom(u.master);  // offload, f32: host -> device
      }
    } else {
      Tensor onDevice = u.master.to(u.gatherCopy.device());  // offload, bf16: up, then cast there
      convertInto(u.gatherCopy, onDevice);
    }
  }
}

int ShardedEngine::liveUnits() const {
  int n = 0;
  for (const auto& u : units_) n += u.gatherIssued ? 1 : 0;
  return n;
}

void ShardedEngine::trackGathered() {
  int64_t b = 0;
  for (const auto& u : units_) {
    if (u.gathered.defined() && !u.gathered.sharesStorageWith(u.gatherCopy)) b += static_cast<int64_t>(u.gathered.nbytes());
    if (u.gatheredLow.defined()) b += static_cast<int64_t>(u.gatheredLow.nbytes());
    if (u.gradFull.defined()) b += static_cast<int64_t>(u.gradFull.nbytes());
  }
  memory_.gatheredPeakBytes = std::max(memory_.gatheredPeakBytes, b);
}

void ShardedEngine::issueGather(int ui) {
  Unit& u = units_[static_cast<size_t>(ui)];
  if (u.gatherIssued) return;
  awaitParams(ui);  // offload: this unit's update is on the device (or on its way, stream-ordered)
  if (shardComm_.size() == 1) {
    // A shard group of one rank gathers nothing: the shard is the unit. In f32 it is used in place
    // (the master itself without offload); in bf16 it is widened straight from the gather copy.
    // Saves a unit-sized copy per gather (twice a step for full_shard), about 8 bytes a parameter.
    if (u.gatherCopy.dtype() == DType::kF32) {
      u.gathered = u.gatherCopy;
    } else {
      u.gathered = Tensor::empty({u.numel}, DType::kF32, device_);
      convertInto(u.gathered, u.gatherCopy);
    }
    u.gatherIssued = true;
    trackGathered();
    return;
  }
  u.gathered = Tensor::empty({u.numel}, DType::kF32, device_);
  if (opt_.paramDtype != DType::kF32) {
    u.gatheredLow = Tensor::empty({u.numel}, opt_.paramDtype, device_);
    u.gatherWork = shardComm_.allGather(u.gatherCopy, u.gatheredLow);
  } else {
    u.gatherWork = shardComm_.allGather(u.gatherCopy, u.gathered);
  }
  u.gatherIssued = true;
  trackGathered();
}

void ShardedEngine::waitGather(int ui) {
  Unit& u = units_[static_cast<size_t>(ui)];
  if (u.gatherWork) {
    u.gatherWork->wait(shardComm_.timeout());
    u.gatherWork = nullptr;
    if (u.gatheredLow.defined()) {
      convertInto(u.gathered, u.gatheredLow);
      u.gatheredLow = Tensor();
    }
  }
  bindValues(ui);
}

void ShardedEngine::bindValues(int ui) {
  Unit& u = units_[static_cast<size_t>(ui)];
  for (const auto& up : u.params)
    up.param->value = u.gathered.flatSlice(up.unitOffset, up.param->numel()).view(up.param->shape);
}

void ShardedEngine::release(int ui) {
  Unit& u = units_[static_cast<size_t>(ui)];
  if (u.gatherWork) {
    u.gatherWork->wait(shardComm_.timeout());
    u.gatherWork = nullptr;
  }
  for (const auto& up : u.params) up.param->value = Tensor();
  u.gathered = Tensor();
  u.gatheredLow = Tensor();
  u.gatherIssued = false;
}

void ShardedEngine::beginStep() {
  memory_.gatheredPeakBytes = 0;
  memory_.activationPeakBytes = 0;
}

void ShardedEngine::beforeUnitForward(int u) {
  issueGather(u);
  waitGather(u);
  if (u + 1 < static_cast<int>(units_.size()) && liveUnits() < opt_.prefetchLimit) issueGather(u + 1);
}

void ShardedEngine::afterUnitForward(int u) {
  if (opt_.strategy != ShardStrategy::kShardGradOp) release(u);
}

void ShardedEngine::beforeUnitBackward(int ui) {
  inBackward_ = true;
  if (activationBytes_) memory_.activationPeakBytes = std::max(memory_.activationPeakBytes, activationBytes_());
  issueGather(ui);
  waitGather(ui);
  Unit& u = units_[static_cast<size_t>(ui)];
  u.gradFull = Tensor::zeros({u.numel}, DType::kF32, device_);
  for (const auto& up : u.params)
    up.param->grad = u.gradFull.flatSlice(up.unitOffset, up.param->numel()).view(up.param->shape);
  trackGathered();
  if (ui > 0 && liveUnits() < opt_.prefetchLimit) issueGather(ui - 1);
}

void ShardedEngine::afterUnitBackward(int ui) {
  Unit& u = units_[static_cast<size_t>(ui)];
  u.readyUs = wallMicros();
  for (const auto& up : u.params) up.param->grad = Tensor();
  if (opt_.reduceDtype != DType::kF32) {
    Tensor low = Tensor::empty({u.numel}, opt_.reduceDtype, device_);
    convertInto(low, u.gradFull);
    u.gradFull = low;  // kept alive until its reduce-scatter completes
  }
  Tensor* dst = &u.gradShard;
  if (microStep_ > 0) {
    if (!u.gradScratch.defined()) u.gradScratch = Tensor::empty({u.shard}, u.gradShard.dtype(), device_);
    dst = &u.gradScratch;
  }
  u.reduceWork = shardComm_.reduceScatter(u.gradFull, *dst, ReduceOp::kAvg);
  // hybrid_shard, one micro-step: the replicas' all-reduce of the shard is chained on its
  // reduce-scatter now, so the inter-node phase of early units runs while backward computes the
  // later ones (with accumulation it follows the last micro-step's accumulate, in finishBackward).
  if (replicaComm_ && microSteps_ == 1)
    u.replicaWork = replicaComm_->allReduce(u.gradShard, ReduceOp::kAvg, u.reduceWork);
  release(ui);
  copyReadyGradsDown();  // offload: shards whose reduction finished start down now
}

void ShardedEngine::setMicroStep(int k, int count) {
  MT_CHECK(count >= 1 && k >= 0 && k < count, "micro-step ", k, " of ", count);
  microStep_ = k;
  microSteps_ = count;
}

void ShardedEngine::finishBackward() {
  inBackward_ = false;
  const bool lastMicroStep = microStep_ + 1 >= microSteps_;
  backwardEndUs_ = wallMicros();
  trace_.clear();
  for (auto& u : units_) {
    BucketTrace t;
    t.bucket = static_cast<int>(trace_.size());
    t.bytes = static_cast<int64_t>(u.numel) * static_cast<int64_t>(dtypeSize(u.gradShard.dtype()));
    t.readyUs = u.readyUs;
    if (u.reduceWork) {
      u.reduceWork->wait(shardComm_.timeout());
      const CollectiveRecord r = u.reduceWork->record();
      t.startedUs = r.startedUs;
      t.doneUs = r.completedUs;
      u.reduceWork = nullptr;
    }
    u.gradFull = Tensor();
    if (microStep_ > 0) accumulateShard(u.gradShard, u.gradScratch);
    if (u.replicaWork) {
      u.replicaWork->wait(replicaComm_->timeout());
      const CollectiveRecord r = u.replicaWork->record();
      t.interStartedUs = r.startedUs;
      t.interDoneUs = t.doneUs = r.completedUs;
      u.replicaWork = nullptr;
    } else if (replicaComm_ && lastMicroStep) {
      replicaComm_->allReduce(u.gradShard, ReduceOp::kAvg)->wait(replicaComm_->timeout());
    }
    trace_.push_back(t);
  }
  if (!lastMicroStep) {
    trackGathered();
    return;
  }
  microStep_ = 0;
  microSteps_ = 1;
  for (auto& u : units_) u.gradScratch = Tensor();
  if (off_) {
    finishOffloadBackward();
  } else if (opt_.offloadCpu) {
    // Gradient shards go down to the host, where the optimizer runs (converted to f32 there).
    for (auto& u : units_) {
      if (u.gradShard.dtype() == DType::kF32) {
        u.gradShardHost.copyFrom(u.gradShard);
      } else {
        Tensor low = u.gradShard.to(Device::cpu());
        convertInto(u.gradShardHost, low);
      }
    }
  }
  trackGathered();
}

double ShardedEngine::clipGradNorm(float maxNorm) {
  if (off_) return clipOffloaded(maxNorm);
  // Shards are disjoint over the shard group; replicas hold copies, so they are not added.
  return mt::clipGradNorm(optimizer_->segments(), maxNorm,
                          [this](double s) { return shardComm_.allReduceScalar(s, ReduceOp::kSum); });
}

void ShardedEngine::step(float lr) {
  if (off_) {
    stepOffloaded(lr);  // returns while the CPU steps; the next gathers wait unit by unit
    return;
  }
  optimizer_->step(lr);
  refreshGatherCopies();
}

void ShardedEngine::releaseAll() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[static_cast<size_t>(u)].gatherIssued) release(u);
}

MemoryAccount ShardedEngine::measureMemory() {
  MemoryAccount& m = memory_;
  m.paramBytes = m.gradBytes = 0;
  for (const auto& u : units_) {
    m.paramBytes += static_cast<int64_t>(u.master.nbytes());
    if (!u.gatherCopy.sharesStorageWith(u.master)) m.paramBytes += static_cast<int64_t>(u.gatherCopy.nbytes());
    m.gradBytes += static_cast<int64_t>(u.gradShard.nbytes());
    if (u.gradShardHost.defined()) m.gradBytes += static_cast<int64_t>(u.gradShardHost.nbytes()) * (opt_.delayedUpdate ? 2 : 1);
  }
  m.optimizerBytes = optimizer_->stateBytes();
  m.hostBytes = 0;
  if (opt_.offloadCpu && device_.isCuda()) {  // the GPU keeps only the gather copies and gradient shards
    for (const auto& u : units_)
      m.hostBytes += static_cast<int64_t>(u.master.nbytes()) +
                     static_cast<int64_t>(u.gradShardHost.nbytes()) * (opt_.delayedUpdate ? 2 : 1);
    m.hostBytes += m.optimizerBytes;
  }
  m.devicePeakBytes = allocatorFor(device_).stats().peakAllocatedBytes;
  return m;
}

}  // namespace mt
