#pragma once
// Where each rank sits: node, place in the node, GPU, the rail NIC(s) it should use (NCCL's
// notion: the NICs nearest its GPU, PIX < PXB < PHB < SYS), the NCCL variable that restricts it to
// them, and the groups a rail-optimised fabric wants: one intra-node group per node (NVLink/PCIe)
// and one inter-node group per rail slot (the ranks of every node whose GPUs hang on the same rail,
// whose NICs share a leaf switch). Built from every rank's RankIdentity, which launch/ exchanges
// between ranks at start; `trainer topo --ranks N` prints it for machines built like a file.
//
// Inside a node ranks are ordered by (rail, GPU bus id, rank), so the k-th rank of every node uses
// the same rail even when the launcher numbered GPUs differently: the inter-node group of slot k
// is then a rail's group, and the k-th slice of the hierarchical all-reduce crosses the fabric on
// that rail only.

#include <string>
#include <vector>

#include "topo/Topology.h"

namespace mt {

// What a rank says of itself at start.
struct RankIdentity {
  std::string host;          // hostname; an emulated node's name when nodes are emulated
  std::string machine;       // the machine it runs on (empty: host); GPUs are the machine's
  std::string busid;         // its GPU's PCI bus id, lower case; empty without one
  int rail = -1;             // the first NIC of its GPU's rail in the topology file; -1: none
  bool gpuFromFile = false;  // CPU rank standing in for the file's GPU (emulated layouts)
};

struct RankPlacement {
  int rank = 0, node = 0, localRank = 0;  // localRank: the place in the node (the intra rank)
  std::string host;
  int gpu = -1;  // index in the file; -1: not in it (or no file)
  std::string busid;
  bool gpuFromFile = false;
  int numa = -1;
  std::vector<int> nics;  // the rail
  int rail = -1;          // nics' first, as exchanged
  PathType railPath = PathType::kSYS;
  // "NCCL_IB_HCA==mlx5_0:1" (IB, RoCE), "NCCL_SOCKET_IFNAME==eth0" (sockets); empty where the file
  // names no device for the rail (class-only NICs, EFA: the OFI plugin picks the EFA device itself).
  std::string nicBinding;
};

struct RankLayout {
  int ranks = 0, nodes = 0;
  int ranksPerNode = 0;                      // when uniform; else the largest node's
  bool uniform = true;                       // every node has ranksPerNode ranks (node groups need it)
  std::string unequalNodes;                  // !uniform: the nodes' sizes, as a sentence
  bool railAligned = true;                   // each slot's ranks use the same rail on every node
  std::vector<RankPlacement> placements;     // by world rank
  std::vector<std::vector<int>> intraNode;   // per node, its ranks in slot order
  std::vector<std::vector<int>> rails;       // per slot, that slot's rank on every node (uniform only)
  std::vector<std::string> problems;         // why not uniform / not rail-aligned / GPUs shared
  std::vector<std::vector<int>> sharedGpus;  // ranks driving the same GPU of one machine
  std::string summary() const;
};

// The identity of a rank on GPU `busid` (any case) of host `host` in a machine built like `t`
// (null: no file): its rail from the file. A bus id the file lacks leaves the rail unset.
RankIdentity identify(const Topology* t, const std::string& host, const std::string& busid,
                      bool gpuFromFile = false);

// Nodes are the ranks with the same host, numbered in order of their lowest rank; or, with
// ranksPerNode > 0 (emulated nodes), consecutive blocks of that many ranks.
RankLayout groupRanks(const std::vector<RankIdentity>& ids, const Topology* t, int ranksPerNode = 0);

// N ranks on machines built like `t`, local rank i on the file's GPU i. ranksPerNode = 0: the
// file's GPU count. Throws ConfigError when ranks is not a multiple of it or the file has fewer
// GPUs than ranksPerNode.
RankLayout layoutRanks(const Topology& t, int ranks, int ranksPerNode = 0);

}  // namespace mt
