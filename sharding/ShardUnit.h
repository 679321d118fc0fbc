#pragma once
// One sharding unit and its life over a step, as an explicit state machine (in the spirit of
// PyTorch FSDP2's FSDPParamGroup). The unit's flat buffer holds its parameters, each 256-byte
// aligned, padded so it splits into W equal shards; this rank keeps shard r of it for good (the
// f32 master, the gather copy in the parameter dtype, the gradient shard in the reduce dtype, and
// with offload the gradient shard's host copy). Everything else exists only in some states:
//
//                 gather           finish_gather
//   kSharded ------------> kGathering ----------> kGathered --keep--> kKept    (shard_grad_op,
//      ^  ^                    |                   |   |                |       after forward)
//      |  +---cancel_gather----+                   |   +--bind_grads--+ | bind_grads
//      +-------------------- release --------------+                  v v
//      |     (and from kKept: after evaluation forwards)            kBackward
//      |                                                                | start_reduce
//      +--------------------------- finish_reduce --------------- kReducing
//
//   kSharded    only the persistent shards
//   kGathering  the all-gather into the unit buffer is issued (a shard group of one rank: the
//               buffer is the shard itself, or its f32 widening; nothing in flight)
//   kGathered   the op waited for, the parameters' values bound to the unit buffer
//   kKept       as kGathered, held from the unit's forward to its backward (shard_grad_op)
//   kBackward   gathered, the parameters' gradients bound to the unit's full f32 gradient buffer
//   kReducing   values and gradients unbound, the gathered buffer freed; the reduce-scatter of the
//               full gradient (and, chained on it, hybrid_shard's replica all-reduce) in flight
//
// Each edge is one member function, the only writer of the unit's transient fields and of its
// parameters' value/grad bindings; called from a state the edge does not leave, it throws
// InternalError naming the unit, the state and the edge.

#include <chrono>
#include <memory>
#include <vector>

#include "comm/Communicator.h"
#include "comm/DataParallel.h"
#include "core/EnumTable.h"
#include "core/ParamTable.h"

namespace mt {

enum class UnitState { kSharded, kGathering, kGathered, kKept, kBackward, kReducing };
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
  kFinishReduce
};
const EnumTable<UnitEdge>& unitEdges();
inline const char* unitEdgeName(UnitEdge e) {
  return enumName(unitEdges(), e);
}

class ShardUnit {
 public:
  struct Member {
    Param* param;
    int64_t unitOffset;  // inside the unit buffer (aligned)
  };

  // Lays the unit out over `params` (initialised), copies this rank's shard of their values into
  // the f32 master (allocated from `masterAlloc`: the device, or host memory with offload) and
  // allocates the gather copy (aliasing the master for f32 without offload), the gradient shard
  // and, with offload, its host copy (`hostGradDtype`).
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
  // The persistent shards: their contents change (optimizer, uploads), the handles never.
  Tensor master() const { return master_; }                // f32 [shard]
  Tensor gatherCopy() const { return gatherCopy_; }        // paramDtype [shard]
  Tensor gradShard() const { return gradShard_; }          // reduceDtype [shard]
  Tensor gradShardHost() const { return gradShardHost_; }  // offload: host copy [shard]
  // The gather copy made from the master shard again (after an optimizer step or a checkpoint
  // load; offload on a GPU uploads it instead, sharding/ShardedOffload).
  void refreshGatherCopy();
  // Bytes held beyond the persistent shards: the gathered parameters (where not the shard itself),
  // the low-precision landing buffer, the full gradient.
  int64_t transientBytes() const;
  // kReducing with its reduce-scatter complete (asks without waiting).
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
  // to it: a later micro-step of gradient accumulation); `chainedReplica` (hybrid_shard, one
  // micro-step): the replica all-reduce of the shard chained on it. The parameters are released.
  void startReduce(Communicator& comm, DType reduceDtype, bool intoScratch, Communicator* chainedReplica);
  // kReducing -> kSharded: waits for the reduction, adds the scratch shard (when it was used), then
  // `replicaNow` (hybrid_shard after the last of several micro-steps): the replica all-reduce, waited
  // for. dropScratch: the step's last micro-step (the scratch shard is freed).
  void finishReduce(Communicator& comm, Communicator* replica, bool replicaNow, bool dropScratch);

 private:
  void advance(UnitEdge edge);  // checks the edge leaves the current state, then takes it
  void bindValues();
  void unbindValues();

  int index_;
  Device device_;
  std::vector<Member> members_;
  int64_t numel_ = 0, shard_ = 0;
  Tensor master_, gatherCopy_, gradShard_, gradShardHost_;
  // Written by the edges only.
  UnitState state_ = UnitState::kSharded;
  Tensor gathered_;     // f32 [numel]: kGathering .. kBackward
  Tensor gatheredLow_;  // paramDtype [numel] landing buffer (bf16 gathers): kGathering
  Tensor gradFull_;     // f32 [numel] in kBackward; reduceDtype in kReducing (alive until reduced)
  Tensor gradScratch_;  // reduceDtype [shard]: later micro-steps' reduce-scatter target
  bool usedScratch_ = false;
  std::shared_ptr<Work> gatherWork_, reduceWork_, replicaWork_;
  Communicator* replicaComm_ = nullptr;                           // of replicaWork_
  std::chrono::milliseconds opTimeout_{std::chrono::minutes(5)};  // of the last op issued (destructor)
  BucketTrace trace_;
};

}  // namespace mt
