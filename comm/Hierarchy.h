#pragma once
// World, intra-node and inter-node communicators, and the hierarchical all-reduce over them:
//   1. reduce-scatter inside the node (each of the L local ranks ends with 1/L of the sum),
//   2. all-reduce of that slice across nodes (ranks with the same local rank, one per node),
//   3. all-gather inside the node.
// Every byte crosses the network once per node instead of once per GPU: what NCCL's ring does
// implicitly, made explicit and usable on the MPI backend, and selectable for data parallelism.
// The inter-node communicator joins the ranks with the same local rank: with one GPU per rail NIC
// (the rail-optimised layout topo/RankLayout prints) it is that rail's communicator.
// Per bucket the three phases are chained ops (Communicator: `after`) issued together as the
// bucket fills during backward, so the inter-node phase of early buckets runs while backward
// still computes later ones. The all-gathers have a communicator of their own (a second split of
// the node): on the intra-node one an all-gather waiting for the network would hold back the
// next bucket's reduce-scatter queued behind it, and every communicator sees its ops in bucket
// order on every rank (the collective contract; NCCL deadlocks otherwise).
// Nodes and slots come from the rank layout launch/ builds from every rank's (host, GPU bus id,
// rail) (topo/RankLayout): inside a node ranks are ordered by rail, so the inter-node communicator
// of slot k joins the GPUs of one rail on every node. Nodes are real (hosts) or emulated
// (MT_NODE_SPLIT / topo.node_ranks).

#include <memory>
#include <string>
#include <vector>

#include "comm/BucketReducer.h"
#include "comm/Communicator.h"

namespace mt {

// This rank's place: node `node`, position `slot` in it (0..ranksPerNode-1, distinct within a
// node), and the NCCL config of the node and rail communicators.
struct NodePlan {
  int node = 0, slot = 0, ranksPerNode = 1;
  CommTuning intra, inter;
  // Non-empty: the layout has no node groups (nodes of different sizes), and why.
  std::string unusable;
};

class NodeGroups {
 public:
  // Collective over `world`: the ranks of one node form its intra-node communicators (ranked by
  // slot), the ranks of one slot the inter-node one (ranked by node). Every node must have
  // ranksPerNode ranks (ConfigError otherwise, on every rank).
  NodeGroups(Communicator& world, const NodePlan& plan);
  // Contiguous nodes: ranks [k*L, (k+1)*L) form node k, slot = rank % L. L must divide the world.
  NodeGroups(Communicator& world, int ranksPerNode);
  Communicator& world() { return world_; }
  Communicator& intra() { return *intra_; }
  Communicator& inter() { return *inter_; }
  // The node again, for the hierarchical reducer's last phase. Made at the first call, which is a
  // collective over the world (HierarchicalReducer's constructor makes it at setup, so that
  // hybrid_shard, which never needs it, holds no third communicator: an NCCL one costs memory).
  Communicator& intraGather();
  // The communicators made so far (intra, inter, and the gather one once made), for reports.
  std::vector<Communicator*> communicators() const;
  int ranksPerNode() const { return L_; }
  int numNodes() const { return world_.size() / L_; }

  // In-place average or sum over the world (blocking; other ops rejected).
  void allReduce(Tensor& t, ReduceOp op);

 private:
  Communicator& world_;
  NodePlan plan_;
  int L_;
  std::unique_ptr<Communicator> intra_, inter_, gather_;
};

// Data-parallel buckets reduced hierarchically: launch() issues all three phases, chained, as the
// bucket fills during backward; wait() waits for the last and copies the result into the bucket.
class HierarchicalReducer final : public BucketReducer {
 public:
  explicit HierarchicalReducer(NodeGroups& groups) : g_(groups) { g_.intraGather(); }
  std::string name() const override { return "hierarchical"; }
  void launch(const Bucket& bucket, Tensor grads) override;
  void wait(const Bucket& bucket, Tensor grads) override;
  std::shared_ptr<Work> firstWork(int bucket) const override;
  std::shared_ptr<Work> interWork(int bucket) const override;

 private:
  struct State {
    Tensor padded, slice;
    std::shared_ptr<Work> rs, ar, ag;
  };
  NodeGroups& g_;
  std::vector<State> state_;
};

}  // namespace mt
