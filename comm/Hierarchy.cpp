#include "comm/Hierarchy.h"

#include "core/Check.h"

namespace mt {

namespace {

NodePlan contiguous(const Communicator& world, int L) {
  MT_REQUIRE(L > 0 && world.size() % L == 0, ConfigError, "ranks per node (", L, ") must divide the world size (",
             world.size(), ")");
  NodePlan p;
  p.node = world.rank() / L;
  p.slot = world.rank() % L;
  p.ranksPerNode = L;
  return p;
}

CommOptions optionsFor(const Communicator& parent, const std::string& suffix, const CommTuning& tuning) {
  CommOptions o = parent.options();
  o.name = parent.name() + suffix;
  o.tuning = tuning;
  return o;
}

}  // namespace

NodeGroups::NodeGroups(Communicator& world, int ranksPerNode)
    : NodeGroups(world, contiguous(world, ranksPerNode)) {}

NodeGroups::NodeGroups(Communicator& world, const NodePlan& plan)
    : world_(world), plan_(plan), L_(plan.ranksPerNode) {
  MT_REQUIRE(plan.unusable.empty(), ConfigError, plan.unusable);
  MT_REQUIRE(L_ > 0 && world.size() % L_ == 0 && plan.slot >= 0 && plan.slot < L_, ConfigError, "ranks per node (", L_,
             ") must divide the world size (", world.size(), ") and hold slot ", plan.slot);
  intra_ = world.split(plan.node, plan.slot, optionsFor(world, ".intra", plan.intra));
  inter_ = world.split(plan.slot, plan.node, optionsFor(world, ".inter", plan.inter));
  // The same answer on every rank (each node has L ranks, so every node has each slot once):
  // collective, so a layout that breaks it fails everywhere instead of hanging in a phase later.
  const bool mine = intra_->size() == L_ && inter_->size() == world.size() / L_;
  const double bad = world.allReduceScalar(mine ? 0.0 : 1.0, ReduceOp::kSum);
  MT_REQUIRE(bad == 0, ConfigError, "node groups: ", static_cast<int>(bad), " rank(s) found a node of other than ", L_,
             " ranks or a slot missing on some node (intra size ", intra_->size(), ", inter size ", inter_->size(),
             " here)");
}

std::vector<Communicator*> NodeGroups::communicators() const {
  std::vector<Communicator*> out{intra_.get(), inter_.get()};
  if (gather_) out.push_back(gather_.get());
  return out;
}

Communicator& NodeGroups::intraGather() {
  if (!gather_) gather_ = world_.split(plan_.node, plan_.slot, optionsFor(world_, ".intra-gather", plan_.intra));
  return *gather_;
}

void NodeGroups::allReduce(Tensor& t, ReduceOp op) {
  MT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, "hierarchical all-reduce supports sum and avg only");
  const int64_t n = t.numel();
  const int64_t chunk = (n + L_ - 1) / L_;
  Tensor padded = Tensor::zeros({chunk * L_}, t.dtype(), t.device());
  padded.flatSlice(0, n).copyFrom(t.flat());
  Tensor slice = Tensor::empty({chunk}, t.dtype(), t.device());
  // Averages compose: mean over the node, then mean over nodes = mean over the world.
  intra_->reduceScatter(padded, slice, op)->wait(intra_->timeout());
  inter_->allReduce(slice, op)->wait(inter_->timeout());
  intra_->allGather(slice, padded)->wait(intra_->timeout());
  t.flat().copyFrom(padded.flatSlice(0, n));
}

void HierarchicalReducer::launch(const Bucket& bucket, Tensor grads) {
  if (state_.size() <= static_cast<size_t>(bucket.index))
    state_.resize(static_cast<size_t>(bucket.index) + 1);
  State& s = state_[static_cast<size_t>(bucket.index)];
  const int L = g_.ranksPerNode();
  const int64_t n = grads.numel(), chunk = (n + L - 1) / L;
  if (!s.padded.defined() || s.padded.numel() != chunk * L) {
    s.padded = Tensor::zeros({chunk * L}, grads.dtype(), grads.device());
    s.slice = Tensor::empty({chunk}, grads.dtype(), grads.device());
  }
  s.padded.flatSlice(0, n).copyFrom(grads);
  // Averages compose: mean over the node, then mean over nodes = mean over the world.
  s.rs = g_.intra().reduceScatter(s.padded, s.slice, ReduceOp::kAvg);
  s.ar = g_.inter().allReduce(s.slice, ReduceOp::kAvg, s.rs);
  s.ag = g_.intraGather().allGather(s.slice, s.padded, s.ar);
  setWork(bucket.index, s.ag);  // traces: the bucket is done with its last phase
  const int64_t bytes = static_cast<int64_t>(grads.nbytes());
  stats_.bytesBefore += bytes;
  stats_.bytesAfter += bytes;
}

void HierarchicalReducer::wait(const Bucket& bucket, Tensor grads) {
  State& s = state_.at(static_cast<size_t>(bucket.index));
  s.ag->wait(g_.intraGather().timeout());
  grads.copyFrom(s.padded.flatSlice(0, grads.numel()));
}

std::shared_ptr<Work> HierarchicalReducer::firstWork(int bucket) const {
  return static_cast<size_t>(bucket) < state_.size() ? state_[static_cast<size_t>(bucket)].rs : nullptr;
}

std::shared_ptr<Work> HierarchicalReducer::interWork(int bucket) const {
  return static_cast<size_t>(bucket) < state_.size() ? state_[static_cast<size_t>(bucket)].ar : nullptr;
}

}  // namespace mt
