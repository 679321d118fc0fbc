#pragma once
// Where each of N ranks lands on machines built like a topology file: node, local rank, GPU, the
// rail NIC(s) it should use (NCCL's notion: the NICs nearest its GPU, PIX < PXB < PHB < SYS), the
// NCCL variable that restricts it to them, and the groups a rail-optimised fabric wants: one
// intra-node group per node (NVLink/PCIe) and one inter-node group per rail (the ranks of every
// node on the same local GPU, whose NICs share a leaf switch). `trainer topo --ranks N` prints it.

#include <string>
#include <vector>

#include "topo/Topology.h"

namespace mt {

struct RankPlacement {
  int rank = 0, node = 0, localRank = 0;
  int gpu = -1;  // index in the file
  std::string busid;
  int numa = -1;
  std::vector<int> nics;  // the rail
  PathType railPath = PathType::kSYS;
  // "NCCL_IB_HCA==mlx5_0:1" (IB, RoCE), "NCCL_SOCKET_IFNAME==eth0" (sockets); empty where the file
  // names no device for the rail (class-only NICs, EFA: the OFI plugin picks the EFA device itself).
  std::string nicBinding;
};

struct RankLayout {
  int ranks = 0, nodes = 0, ranksPerNode = 0;
  std::vector<RankPlacement> placements;
  std::vector<std::vector<int>> intraNode;  // per node, its ranks
  std::vector<std::vector<int>> rails;      // per local rank, that rank on every node
  std::string summary() const;
};

// ranksPerNode = 0: the file's GPU count. Throws ConfigError when ranks is not a multiple of it or
// the file has fewer GPUs than ranksPerNode.
RankLayout layoutRanks(const Topology& t, int ranks, int ranksPerNode = 0);

}  // namespace mt
