#pragma once
// One sharding unit and its life over a step, as an explicit state machine (in the spirit of
// PyTorch FSDP2's FSDPParamGroup). The unit's flat buffer holds its parameters, each 256-byte
// aligned, padded so it splits into W equal shards; this rank keeps shard r of it for good: the
// f32 master, the gather copy in the parameter dtype, and the gradient shard in the reduce dtype —
// or, with offload, the gradient shard's host copy instead (ZeRO-Offload: the device shard exists
// only while its reduction is in flight and until it is on its way down). Everything else exists
// only in some states:
//
//                 gather           finish_gather
//   kSharded ------------> kGathering ----------> kGathered --keep--> kKept    (shard_grad_op,
//      ^  ^                    |                   |   |                |       after forward)
//      |  +---cancel_gather----+                   |   +--bind_grads--+ | bind_grads
//      +-------------------- release --------------+                  v v
//      |     (and from kKept: after evaluation forwards)            kBackward
//      |                                                                | start_reduce
//      +--------------------------- finish_reduce --------------- kReducing
//      |                                                                | land_grad (offload)
//      +--------------------------- send_grad_down -------------- kReduced  (offload)
//
//   kSharded    only the persistent shards
//   kGathering  the all-gather into the unit buffer is issued (a shard group of one rank: the
//               buffer is the shard itself, or its f32 widening; nothing in flight)
//   kGathered   the op waited for, the parameters' values bound to the unit buffer
//   kKept       as kGathered, held from the unit's forward to its backward (shard_grad_op)
//   kBackward   gathered, the parameters' gradients bound to the unit's full f32 gradient buffer
//   kReducing   values and gradients unbound, the gathered buffer freed; the reduce-scatter of the
//               full gradient (and, chained on it, hybrid_shard's replica all-reduce) in flight
//               (offload: into a device gradient shard allocated for it)
//   kReduced    offload: the reductions waited for, the full gradient freed; the device gradient
//               shard holds this micro-step's average until send_grad_down hands it to the copy
//               into the host copy (the first micro-step overwrites it, later ones add to it)
//
// Each edge is one member function, the only writer of the unit's transient fields and of its
// parameters' value/grad bindings; called from a state the edge does not leave, it throws
// InternalError naming the unit, the state and the edge. finish_reduce is refused with offload and
// land_grad without it (the unit's mode decides which of the two leaves kReducing).

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "comm/Communicator.h"
#include "comm/DataParallel.h"
#include "core/EnumTable.h"
#include "core/ParamTable.h"

namespace mt {

enum class UnitState { kSharded, kGathering, kGathered, kKept, kBackward, kReducing, kReduced };
const EnumTable<UnitState>& unitStates();
inline const char* unitStateName(UnitState s) {
  return enumName(unitStates(), s);
}

enum class UnitEdge {
  kGather,
  kFinishGather,
  kCancelGather,
  kKeep,
  kRelease,
  kBindGrads,
  kStartReduce,
  kFinishReduce,
  kLandGrad,
  kSendGradDown
};
const EnumTable<UnitEdge>& unitEdges();
inline const char* unitEdgeName(UnitEdge e) {
  return enumName(unitEdges(), e);
}

// shard += more, added in f32 whatever either dtype is (same device): gradient accumulation.
void addShardInto(Tensor& shard, const Tensor& more);

class ShardUnit {
 public:
  // send_grad_down's copy: the device gradient shard (this micro-step's average) into the host
  // copy, overwriting it (accumulate false: the first micro-step) or adding to it. It may return
  // before the copy is done (a copy stream) if it keeps the device shard's memory alive until then.
  using GradSink = std::function<void(const Tensor& deviceShard, bool accumulate)>;

  struct Member {
    Param* param;
    int64_t unitOffset;  // inside the unit buffer (aligned)
  };

  // Lays the unit out over `params` (initialised, on any device), copies this rank's shard of their
  // values into the f32 master (allocated from `masterAlloc`: the device, or host memory with
  // offload) and allocates the gather copy (aliasing the master for f32 without offload) and the
  // gradient shard — with offload, its host copy (`hostGradDtype`, from `masterAlloc`) instead.
  ShardUnit(int index, const std::vector<Param*>& params, int worldSize, int rank, Device device,
            Allocator& masterAlloc, DType paramDtype, DType reduceDtype, bool offload, DType hostGradDtype);
  ~ShardUnit();  // waits for an op in flight (its buffers must not be freed under it)
  ShardUnit(ShardUnit&&) = default;
  ShardUnit& operator=(ShardUnit&&) = delete;

  int index() const { return index_; }
  UnitState state() const { return state_; }
  const std::vector<Member>& members() const { return members_; }
  int64_t numel() const { return numel_; }  // padded: shard * W
  int64_t shard() const { return shard_; }  // elements per rank
  // The shard of a unit of unitElements (its members each padded by alignParam) over worldSize
  // ranks: what shard() is, for `trainer plan` without building one.
  static int64_t shardElements(int64_t unitElements, int worldSize) {
    return alignParam((unitElements + worldSize - 1) / worldSize);
  }
  // The persistent shards: their contents change (optimizer, uploads), the handles never.
  Tensor master() const { return master_; }          // f32 [shard]
  Tensor gatherCopy() const { return gatherCopy_; }  // paramDtype [shard]
  // reduceDtype [shard]; with offload only in kReducing and kReduced (the one in flight).
  Tensor gradShard() const { return gradShard_; }
  Tensor gradShardHost() const { return gradShardHost_; }  // offload: host copy [shard]
  bool offload() const { return offload_; }
  // The gather copy made from the master shard again (after an optimizer step or a checkpoint
  // load; offload on a GPU uploads it instead, sharding/ShardedOffload).
  void refreshGatherCopy();
  // Bytes held beyond the persistent shards: the gathered parameters (where not the shard itself),
  // the low-precision landing buffer, the full gradient, the offload's device gradient shard.
  int64_t transientBytes() const;
  // kReducing with its reduce-scatter (and a replica all-reduce chained on it) complete (asks
  // without waiting).
  bool reduceCompleted() const;
  // The last backward's timestamps (gradient ready, reduce-scatter, replica all-reduce).
  const BucketTrace& trace() const { return trace_; }

  // kSharded -> kGathering: the all-gather of the gather copies over `comm` (W ranks).
  void gather(Communicator& comm);
  // kGathering -> kGathered: waits for it, widens a bf16 landing buffer to f32, binds the values.
  void finishGather(std::chrono::milliseconds timeout);
  // kGathering -> kSharded: a prefetch nobody used (evaluation ends): waits, frees.
  void cancelGather(std::chrono::milliseconds timeout);
  // kGathered -> kKept (shard_grad_op after the unit's forward).
  void keep();
  // kGathered | kKept -> kSharded: values unbound, the unit buffer freed.
  void release();
  // kGathered | kKept -> kBackward: a zeroed f32 full gradient, each parameter's grad a view of it.
  void bindGrads();
  // kBackward -> kReducing: gradients unbound, the gradient cast to reduceDtype, its reduce-scatter
  // (average) into the gradient shard (intoScratch: into a scratch shard that finish_reduce adds
  // to it: a later micro-step of gradient accumulation; with offload: a fresh device shard that
  // send_grad_down adds to the host copy); `chainedReplica` (hybrid_shard, one micro-step, or
  // every micro-step with offload): the replica all-reduce of the shard chained on it. The
  // parameters are released.
  void startReduce(Communicator& comm, DType reduceDtype, bool intoScratch, Communicator* chainedReplica);
  // kReducing -> kSharded: waits for the reduction, adds the scratch shard (when it was used), then
  // `replicaNow` (hybrid_shard after the last of several micro-steps): the replica all-reduce, waited
  // for. dropScratch: the step's last micro-step (the scratch shard is freed).
  void finishReduce(Communicator& comm, Communicator* replica, bool replicaNow, bool dropScratch);
  // kReducing -> kReduced (offload): waits for the reduce-scatter and a chained replica all-reduce;
  // the full gradient is freed, the device gradient shard final.
  void landGrad(Communicator& comm);
  // kReduced -> kSharded (offload): `sink` copies the device gradient shard into the host copy
  // (adding after the first micro-step), then the unit drops the device shard.
  void sendGradDown(const GradSink& sink);

 private:
  void advance(UnitEdge edge);  // checks the edge leaves the current state, then takes it
  void bindValues();
  void unbindValues();
  void waitReduction(Communicator& comm);  // the reduce-scatter done, the full gradient freed
  void waitChainedReplica();

  int index_;
  Device device_;
  std::vector<Member> members_;
  int64_t numel_ = 0, shard_ = 0;
  bool offload_ = false;
  Tensor master_, gatherCopy_, gradShardHost_;
  Tensor gradShard_;  // persistent; with offload written by the edges (kReducing .. kReduced)
  // Written by the edges only.
  UnitState state_ = UnitState::kSharded;
  Tensor gathered_;           // f32 [numel]: kGathering .. kBackward
  Tensor gatheredLow_;        // paramDtype [numel] landing buffer (bf16 gathers): kGathering
  Tensor gradFull_;           // f32 [numel] in kBackward; reduceDtype in kReducing (alive until reduced)
  Tensor gradScratch_;        // reduceDtype [shard]: later micro-steps' reduce-scatter target
  bool usedScratch_ = false;  // offload: the host copy accumulates this micro-step
  std::shared_ptr<Work> gatherWork_, reduceWork_, replicaWork_;
  Communicator* replicaComm_ = nullptr;                           // of replicaWork_
  std::chrono::milliseconds opTimeout_{std::chrono::minutes(5)};  // of the last op issued (destructor)
  BucketTrace trace_;
};

}  // namespace mt
