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
// What a rank knows of itself before the exchange.
struct RankSelf {
  int rank = 0;
  std::string hostname;
  int machine = 0;            // MPI's shared-memory node index: the machine, also when nodes are emulated
  int localRank = 0;          // its place in its node (emulated or not)
  int emulatedNodeRanks = 0;  // topo.node_ranks / MT_NODE_SPLIT; 0: nodes are machines
  int device = -1;            // its CUDA device; -1 for a CPU rank
  bool nccl = false;          // dist.backend = nccl
  // MT_NCCL_SHARE_GPU_FOR_TESTS: NCCL ranks may share a GPU (each its own NCCL_HOSTID).
  bool shareGpuForTests = false;
};
// Every rank's (host, GPU bus id, rail), exchanged over `comm` (collective), into setup.layout:
// nodes by host ("name#machine"), or blocks of emulatedNodeRanks when > 0; slots by rail. A CPU
// rank, with topo.file, stands in for the file's GPU of its place in the node, so CPU runs emulate
// the file's layout. Refuses on every rank (ConfigError) a topo.file that lists some rank's GPU
// nowhere, and NCCL ranks that share a GPU of one machine (emulated nodes included) unless
// shareGpuForTests.
void exchangeRankLayout(MPI_Comm comm, const RankSelf& self, TopologySetup& setup);
// MT_NCCL_SHARE_GPU_FOR_TESTS: gives this rank its own NCCL host identity (NCCL_HOSTID) and NCCL's
// socket transport (NCCL_IB_DISABLE=1), so NCCL accepts ranks that share a GPU; listed in
// setup.ncclEnv. ConfigError when either variable is set already (its value would be overridden).
void shareGpuForTests(TopologySetup& setup, const RankSelf& self);
// The hierarchical all-reduce and hybrid_shard (`why`) run kernels of several NCCL communicators
// (the profile scopes `scopes`) at once, on separate streams. NCCL promises progress for that only
// when every GPU launches them in one order, so their launches are ordered by the host's issue
// order (NCCL_LAUNCH_ORDER_IMPLICIT=1, NCCL >= 2.26; every rank issues in bucket order from one
// thread), exported before NCCL's first call and listed in setup.ncclEnv; a profile or environment
// that sets it to 0 is refused. The scopes' profile min_ctas together must leave SMs to spare
// (they run next to each other and to the backward's kernels): more than `smCount` is refused.
void orderConcurrentCommunicators(TopologySetup& setup, const std::string& why,
                                  const std::vector<std::string>& scopes, int smCount);
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
