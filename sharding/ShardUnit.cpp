#include "sharding/ShardUnit.h"

#include <algorithm>

#include "comm/CompressionOps.h"
#include "core/Check.h"
#include "core/Convert.h"
#include "core/Timer.h"

namespace mt {

const EnumTable<UnitState>& unitStates() {
  static const EnumTable<UnitState> kTable = {
      {UnitState::kSharded, "sharded"},   {UnitState::kGathering, "gathering"},
      {UnitState::kGathered, "gathered"}, {UnitState::kKept, "kept"},
      {UnitState::kBackward, "backward"}, {UnitState::kReducing, "reducing"},
      {UnitState::kReduced, "reduced"},
  };
  return kTable;
}

const EnumTable<UnitEdge>& unitEdges() {
  static const EnumTable<UnitEdge> kTable = {
      {UnitEdge::kGather, "gather"},
      {UnitEdge::kFinishGather, "finish_gather"},
      {UnitEdge::kCancelGather, "cancel_gather"},
      {UnitEdge::kKeep, "keep"},
      {UnitEdge::kRelease, "release"},
      {UnitEdge::kBindGrads, "bind_grads"},
      {UnitEdge::kStartReduce, "start_reduce"},
      {UnitEdge::kFinishReduce, "finish_reduce"},
      {UnitEdge::kLandGrad, "land_grad"},
      {UnitEdge::kSendGradDown, "send_grad_down"},
  };
  return kTable;
}

namespace {

// The machine's edges: the states each leaves and the one it enters.
struct EdgeRule {
  UnitEdge edge;
  std::vector<UnitState> from;
  UnitState to;
};
const std::vector<EdgeRule>& edgeRules() {
  using S = UnitState;
  static const std::vector<EdgeRule> kRules = {
      {UnitEdge::kGather, {S::kSharded}, S::kGathering},
      {UnitEdge::kFinishGather, {S::kGathering}, S::kGathered},
      {UnitEdge::kCancelGather, {S::kGathering}, S::kSharded},
      {UnitEdge::kKeep, {S::kGathered}, S::kKept},
      {UnitEdge::kRelease, {S::kGathered, S::kKept}, S::kSharded},
      {UnitEdge::kBindGrads, {S::kGathered, S::kKept}, S::kBackward},
      {UnitEdge::kStartReduce, {S::kBackward}, S::kReducing},
      {UnitEdge::kFinishReduce, {S::kReducing}, S::kSharded},
      {UnitEdge::kLandGrad, {S::kReducing}, S::kReduced},
      {UnitEdge::kSendGradDown, {S::kReduced}, S::kSharded},
  };
  return kRules;
}

// A collective's buffers stay alive until it ends, even when the job is going down.
void waitQuietly(const std::shared_ptr<Work>& w, std::chrono::milliseconds timeout) noexcept {
  if (!w || w->isCompleted()) return;
  try {
    w->wait(timeout);
  } catch (...) {
    // The job is going down already; the buffer must simply not be freed under the op.
  }
}

}  // namespace

void addShardInto(Tensor& shard, const Tensor& more) {
  if (shard.dtype() == DType::kF32 && more.dtype() == DType::kF32) {
    addInto(shard, more);
    return;
  }
  Tensor sum =
      shard.dtype() == DType::kF32 ? shard : Tensor::empty(shard.shape(), DType::kF32, shard.device());
  if (!sum.sharesStorageWith(shard)) convertInto(sum, shard);
  Tensor b = more;
  if (more.dtype() != DType::kF32) {
    b = Tensor::empty(more.shape(), DType::kF32, more.device());
    convertInto(b, more);
  }
  addInto(sum, b);
  if (!sum.sharesStorageWith(shard)) convertInto(shard, sum);
}

ShardUnit::ShardUnit(int index, const std::vector<Param*>& params, int worldSize, int rank, Device device,
                     Allocator& masterAlloc, DType paramDtype, DType reduceDtype, bool offload,
                     DType hostGradDtype)
    : index_(index), device_(device), offload_(offload) {
  int64_t cursor = 0;
  for (Param* p : params) {
    members_.push_back({p, cursor});
    cursor += alignParam(p->numel());
  }
  shard_ = shardElements(cursor, worldSize);
  numel_ = shard_ * worldSize;
  master_ = Tensor::empty({shard_}, DType::kF32, masterAlloc);
  master_.zero_();
  const int64_t lo = static_cast<int64_t>(rank) * shard_, hi = lo + shard_;
  for (const Member& m : members_) {
    const int64_t a = std::max(lo, m.unitOffset), b = std::min(hi, m.unitOffset + m.param->numel());
    if (a >= b) continue;
    Tensor dst = master_.flatSlice(a - lo, b - a);
    dst.copyFrom(m.param->value.flat().flatSlice(a - m.unitOffset, b - a));
  }
  gatherCopy_ =
      paramDtype == DType::kF32 && !offload ? master_ : Tensor::empty({shard_}, paramDtype, device_);
  if (!offload) gradShard_ = Tensor::zeros({shard_}, reduceDtype, device_);
  if (offload) {
    gradShardHost_ = Tensor::empty({shard_}, hostGradDtype, masterAlloc);
    gradShardHost_.zero_();
  }
}

ShardUnit::~ShardUnit() {
  waitQuietly(gatherWork_, opTimeout_);
  waitQuietly(reduceWork_, opTimeout_);
  waitQuietly(replicaWork_, opTimeout_);
}

void ShardUnit::refreshGatherCopy() {
  if (gatherCopy_.sharesStorageWith(master_)) return;
  if (master_.device() == gatherCopy_.device()) {
    convertInto(gatherCopy_, master_);
  } else if (gatherCopy_.dtype() == DType::kF32) {
    gatherCopy_.copyFrom(master_);  // offload, f32: host -> device
  } else {
    Tensor onDevice = master_.to(gatherCopy_.device());  // offload, bf16: up, then cast there
    convertInto(gatherCopy_, onDevice);
  }
}

void ShardUnit::advance(UnitEdge edge) {
  for (const EdgeRule& r : edgeRules()) {
    if (r.edge != edge) continue;
    MT_CHECK(std::find(r.from.begin(), r.from.end(), state_) != r.from.end(), "sharding unit ", index_,
             ": illegal edge ", unitEdgeName(edge), " from state ", unitStateName(state_));
    state_ = r.to;
    return;
  }
  MT_CHECK(false, "sharding unit ", index_, ": unknown edge ", static_cast<int>(edge));
}

int64_t ShardUnit::transientBytes() const {
  int64_t b = 0;
  if (gathered_.defined() && !gathered_.sharesStorageWith(gatherCopy_))
    b += static_cast<int64_t>(gathered_.nbytes());
  if (gatheredLow_.defined()) b += static_cast<int64_t>(gatheredLow_.nbytes());
  if (gradFull_.defined()) b += static_cast<int64_t>(gradFull_.nbytes());
  if (offload_ && gradShard_.defined()) b += static_cast<int64_t>(gradShard_.nbytes());
  return b;
}

bool ShardUnit::reduceCompleted() const {
  return state_ == UnitState::kReducing && (!reduceWork_ || reduceWork_->isCompleted()) &&
         (!replicaWork_ || replicaWork_->isCompleted());
}

void ShardUnit::bindValues() {
  for (const Member& m : members_)
    m.param->value = gathered_.flatSlice(m.unitOffset, m.param->numel()).view(m.param->shape);
}

void ShardUnit::unbindValues() {
  for (const Member& m : members_)
    m.param->value = Tensor();
}

void ShardUnit::gather(Communicator& comm) {
  advance(UnitEdge::kGather);
  opTimeout_ = comm.timeout();
  if (comm.size() == 1) {
    // A shard group of one rank gathers nothing: the shard is the unit. In f32 it is used in place
    // (the master itself without offload); in bf16 it is widened straight from the gather copy.
    // Saves a unit-sized copy per gather (twice a step for full_shard), about 8 bytes a parameter.
    if (gatherCopy_.dtype() == DType::kF32) {
      gathered_ = gatherCopy_;
    } else {
      gathered_ = Tensor::empty({numel_}, DType::kF32, device_);
      convertInto(gathered_, gatherCopy_);
    }
    return;
  }
  gathered_ = Tensor::empty({numel_}, DType::kF32, device_);
  if (gatherCopy_.dtype() != DType::kF32) {
    gatheredLow_ = Tensor::empty({numel_}, gatherCopy_.dtype(), device_);
    gatherWork_ = comm.allGather(gatherCopy_, gatheredLow_);
  } else {
    gatherWork_ = comm.allGather(gatherCopy_, gathered_);
  }
}

void ShardUnit::finishGather(std::chrono::milliseconds timeout) {
  advance(UnitEdge::kFinishGather);
  if (gatherWork_) {
    gatherWork_->wait(timeout);
    gatherWork_ = nullptr;
  }
  if (gatheredLow_.defined()) {
    convertInto(gathered_, gatheredLow_);
    gatheredLow_ = Tensor();
  }
  bindValues();
}

void ShardUnit::cancelGather(std::chrono::milliseconds timeout) {
  advance(UnitEdge::kCancelGather);
  if (gatherWork_) gatherWork_->wait(timeout);  // the buffers stay until the op is done
  gatherWork_ = nullptr;
  gathered_ = Tensor();
  gatheredLow_ = Tensor();
}

void ShardUnit::keep() {
  advance(UnitEdge::kKeep);
}

void ShardUnit::release() {
  advance(UnitEdge::kRelease);
  unbindValues();
  gathered_ = Tensor();
}

void ShardUnit::bindGrads() {
  advance(UnitEdge::kBindGrads);
  gradFull_ = Tensor::zeros({numel_}, DType::kF32, device_);
  for (const Member& m : members_)
    m.param->grad = gradFull_.flatSlice(m.unitOffset, m.param->numel()).view(m.param->shape);
}

void ShardUnit::startReduce(Communicator& comm, DType reduceDtype, bool intoScratch,
                            Communicator* chainedReplica) {
  advance(UnitEdge::kStartReduce);
  opTimeout_ = comm.timeout();
  trace_ = BucketTrace();
  trace_.bucket = index_;
  trace_.bytes = numel_ * static_cast<int64_t>(dtypeSize(reduceDtype));
  trace_.readyUs = wallMicros();
  for (const Member& m : members_)
    m.param->grad = Tensor();
  if (reduceDtype != DType::kF32) {
    Tensor low = Tensor::empty({numel_}, reduceDtype, device_);
    convertInto(low, gradFull_);
    gradFull_ = low;  // kept alive until its reduce-scatter completes
  }
  usedScratch_ = intoScratch;
  if (offload_) {
    // Every micro-step reduces into a device shard of its own; the host copy accumulates them.
    gradShard_ = Tensor::empty({shard_}, reduceDtype, device_);
    intoScratch = false;
  } else if (intoScratch && !gradScratch_.defined()) {
    gradScratch_ = Tensor::empty({shard_}, gradShard_.dtype(), device_);
  }
  reduceWork_ = comm.reduceScatter(gradFull_, intoScratch ? gradScratch_ : gradShard_, ReduceOp::kAvg);
  // hybrid_shard, one micro-step: the replicas' all-reduce of the shard is chained on its
  // reduce-scatter now, so the inter-node phase of early units runs while backward computes the
  // later ones.
  replicaComm_ = chainedReplica;
  if (chainedReplica) replicaWork_ = chainedReplica->allReduce(gradShard_, ReduceOp::kAvg, reduceWork_);
  unbindValues();
  gathered_ = Tensor();
}

void ShardUnit::waitReduction(Communicator& comm) {
  if (reduceWork_) {
    reduceWork_->wait(comm.timeout());
    const CollectiveRecord r = reduceWork_->record();
    trace_.startedUs = r.startedUs;
    trace_.doneUs = r.completedUs;
    reduceWork_ = nullptr;
  }
  gradFull_ = Tensor();
}

void ShardUnit::waitChainedReplica() {
  if (!replicaWork_) return;
  replicaWork_->wait(replicaComm_->timeout());
  const CollectiveRecord r = replicaWork_->record();
  trace_.interStartedUs = r.startedUs;
  trace_.interDoneUs = trace_.doneUs = r.completedUs;
  replicaWork_ = nullptr;
}

void ShardUnit::finishReduce(Communicator& comm, Communicator* replica, bool replicaNow, bool dropScratch) {
  MT_CHECK(!offload_, "sharding unit ", index_, ": illegal edge finish_reduce from state ",
           unitStateName(state_), " with offload (land_grad)");
  advance(UnitEdge::kFinishReduce);
  waitReduction(comm);
  if (usedScratch_) addShardInto(gradShard_, gradScratch_);
  usedScratch_ = false;
  if (replicaWork_) {
    waitChainedReplica();
  } else if (replica && replicaNow) {
    replica->allReduce(gradShard_, ReduceOp::kAvg)->wait(replica->timeout());
  }
  if (dropScratch) gradScratch_ = Tensor();
}

void ShardUnit::landGrad(Communicator& comm) {
  MT_CHECK(offload_, "sharding unit ", index_, ": illegal edge land_grad from state ", unitStateName(state_),
           " without offload (finish_reduce)");
  advance(UnitEdge::kLandGrad);
  waitReduction(comm);
  waitChainedReplica();
}

void ShardUnit::sendGradDown(const GradSink& sink) {
  advance(UnitEdge::kSendGradDown);
  sink(gradShard_, usedScratch_);
  usedScratch_ = false;
  gradShard_ = Tensor();
}

}  // namespace mt
