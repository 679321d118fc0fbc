#pragma once
// World, intra-node and inter-node communicators, and the hierarchical all-reduce over them:
//   1. reduce-scatter inside the node (each of the L local ranks ends with 1/L of the sum),
//   2. all-reduce of that slice across nodes (ranks with the same local rank, one per node),
//   3. all-gather inside the node.
// Every byte crosses the network once per node instead of once per GPU: what NCCL's ring does
// implicitly, made explicit and usable on the MPI backend, and selectable for data parallelism.
// Nodes are the real ones (MPI_COMM_TYPE_SHARED) or emulated (MT_NODE_SPLIT / topo.node_ranks).

#include <memory>

#include "comm/BucketReducer.h"
#include "comm/Communicator.h"

namespace mt {

class NodeGroups {
 public:
  // Collective over `world`: ranks [k*L, (k+1)*L) form node k. L must divide the world size.
  NodeGroups(Communicator& world, int ranksPerNode);
  Communicator& world() { return world_; }
  Communicator& intra() { return *intra_; }
  Communicator& inter() { return *inter_; }
  int ranksPerNode() const { return L_; }
  int numNodes() const { return world_.size() / L_; }

  // In-place average or sum over the world (blocking; other ops rejected).
  void allReduce(Tensor& t, ReduceOp op);

 private:
  Communicator& world_;
  int L_;
  std::unique_ptr<Communicator> intra_, inter_;
};

// Data-parallel buckets reduced hierarchically: launch() starts the intra-node reduce-scatter
// (overlapping backward); wait() finishes the inter-node all-reduce and intra-node all-gather.
class HierarchicalReducer final : public BucketReducer {
 public:
  explicit HierarchicalReducer(NodeGroups& groups) : g_(groups) {}
  std::string name() const override { return "hierarchical"; }
  void launch(const Bucket& bucket, Tensor grads) override;
  void wait(const Bucket& bucket, Tensor grads) override;

 private:
  struct State {
    Tensor padded, slice;
    std::shared_ptr<Work> rs;
  };
  NodeGroups& g_;
  std::vector<State> state_;
};

}  // namespace mt
