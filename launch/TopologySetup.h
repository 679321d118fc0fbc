#pragma once
// The node's topology file (topo.file) and environment profile (topo.profile), applied before any
// communicator exists: NCCL reads its environment at its first call. Also this process's binding
// to the CPU cores of its GPU's NUMA node, and the <run_dir>/nccl.env record of what was set.

#include <memory>
#include <string>
#include <vector>

#include "launch/Settings.h"
#include "topo/Profile.h"
#include "topo/Topology.h"

namespace mt {

// topo.report: NCCL_DEBUG_FILE = <run_dir>/<prefix><host>.<pid>.log
constexpr const char* kNcclDebugFilePrefix = "nccl-debug.";

struct TopologySetup {
  std::unique_ptr<Topology> topology;  // topo.file, when given
  std::unique_ptr<Profile> profile;    // topo.profile, when given
  std::vector<std::string> ncclEnv;    // "NAME=value (origin)", as exported
};

// Loads both, exports the profile's variables and NCCL_TOPO_FILE (and with topo.report NCCL's debug
// output to the run directory); lists every NCCL_* variable in effect, checking those set in the
// environment (a bad value: ConfigError); rank 0 logs them.
TopologySetup applyTopology(const Settings& s, int rank);
// Binds the calling process to the cores of CUDA device `device`'s NUMA node, found by PCI bus id
// in the topology (by index when no bus id matches). A no-op without CUDA or a matching CPU.
void bindToGpuCpus(const Topology& topology, int device);
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
