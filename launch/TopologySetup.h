#pragma once
// The node's topology file (topo.file) and environment profile (topo.profile), applied before any
// communicator exists: NCCL reads its environment at its first call. Also this process's binding
// to the CPU cores of its GPU's NUMA node, and the <run_dir>/nccl.env record of what was set.

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/Hierarchy.h"
#include "launch/Settings.h"
#include "topo/Profile.h"
#include "topo/RankLayout.h"
#include "topo/Topology.h"

namespace mt {

// topo.report: NCCL_DEBUG_FILE = <run_dir>/<prefix><host>.<pid>.log
constexpr const char* kNcclDebugFilePrefix = "nccl-debug.";

struct TopologySetup {
  std::unique_ptr<Topology> topology;  // topo.file, when given
  std::unique_ptr<Profile> profile;    // topo.profile, when given
  std::vector<std::string> ncclEnv;    // "NAME=value (origin)", as exported
  RankLayout layout;                   // every rank's place (exchangeRankLayout)
};

// Loads both, exports the profile's variables and NCCL_TOPO_FILE (and with topo.report NCCL's debug
// output to the run directory); lists every NCCL_* variable in effect, checking those set in the
// environment (a bad value: ConfigError); rank 0 logs them.
TopologySetup applyTopology(const Settings& s, int rank);
// Every rank's (host, GPU bus id, rail), exchanged over `comm` (collective), into setup.layout:
// nodes by host ("name#node", node: MPI's shared-memory node index), or blocks of
// `emulatedNodeRanks` (topo.node_ranks / MT_NODE_SPLIT) when > 0;
// slots by rail. `device`: this rank's CUDA device, -1 for a CPU rank (which, with topo.file, stands
// in for the file's GPU of its place in the node, so CPU runs emulate the file's layout). Refuses
// on every rank (ConfigError) a topo.file that lists some rank's GPU nowhere, and NCCL ranks that
// share a GPU.
void exchangeRankLayout(MPI_Comm comm, int rank, const std::string& host, int node, int localRank,
                        int emulatedNodeRanks, int device, bool nccl, TopologySetup& setup);
// topo.bind_nic: restricts NCCL to this rank's rail NIC(s) (NCCL_IB_HCA, or NCCL_SOCKET_IFNAME for
// a socket fabric), exported before the first NCCL call and listed in setup.ncclEnv. ConfigError
// when that variable is already set (profile or environment) or there is no topo.file; a warning
// where the file names no device for the rail (EFA: the OFI plugin chooses).
void bindRailNic(TopologySetup& setup, int rank);
// This rank's node plan from setup.layout, with the profile's intra / inter communicator config.
NodePlan nodePlanOf(const TopologySetup& setup, int rank);
// Binds the calling process to the cores of its GPU's NUMA node (`me`: its placement in the
// exchanged layout, the GPU found by PCI bus id). A no-op for a CPU rank or a GPU without a CPU.
void bindToGpuCpus(const Topology& topology, const RankPlacement& me);
// One line of TopologySetup::ncclEnv, "NAME=value (origin)", taken apart (origin may be empty).
struct NcclEnvEntry {
  std::string name, value, origin;
};
NcclEnvEntry parseNcclEnvEntry(const std::string& entry);
// "NAME=value (origin)" -> "export NAME='value'  # origin" (single-quoted, so any value survives).
std::string shellExportLine(const std::string& entry);
// <path>: a file `source` accepts, to rerun a case by hand with the same NCCL settings.
void writeNcclEnv(const std::string& path, const TopologySetup& setup);

}  // namespace mt
