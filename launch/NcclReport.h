#pragma once
// topo.report = true: <run_dir>/nccl_report.json, what the communication layer actually ran with:
//   backend and NCCL version; every NCCL_* variable in effect with its origin (profile, topo.file,
//   topo.report, topo.bind_nic, environment); each communicator (world, intra-node, inter-node,
//   ...) with its size, all its groups of world ranks and its ncclConfig_t settings; the rank
//   layout (every rank's host, GPU, rail NICs and NIC binding); and per process the rings, trees, network and NICs NCCL
//   chose, parsed from its NCCL_DEBUG=INFO file (topo/NcclLog). Collective over `world`: every
//   rank calls it after the communicators exist; rank 0 writes.

#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "launch/TopologySetup.h"

namespace mt {

void writeNcclReport(const std::string& runDir, Communicator& world, int worldRank,
                     const std::vector<Communicator*>& groups, const TopologySetup& topo);

// The groups of world ranks a split formed, from each world rank's group id (its group's lowest
// world rank): ids[r] for world rank r. Groups are ordered by id, ranks ascending.
std::vector<std::vector<int>> groupsFromIds(const std::vector<int>& ids);

}  // namespace mt
