#include "launch/TopologySetup.h"

#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/EnvParams.h"
#include "core/Error.h"
#include "core/Log.h"

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace mt {

TopologySetup applyTopology(const Settings& s, int rank) {
  TopologySetup t;
  if (!s.topoFile.empty()) t.topology = std::make_unique<Topology>(Topology::load(s.topoFile));
  if (!s.profile.empty()) {
    std::string dir = envString(EnvParam::kProfileDir);
    if (dir.empty()) dir = MT_DEFAULT_PROFILE_DIR;
    t.profile = std::make_unique<Profile>(Profile::load(s.profile, dir));
    auto it = t.profile->hints.find("fabric");
    Fabric f;
    if (t.topology && it != t.profile->hints.end() && parseFabric(it->second, &f)) t.topology->setFabric(f);
  }
  // NCCL reads its environment at the first call: everything is exported here, before any.
  if (t.profile) t.ncclEnv = t.profile->apply();
  if (s.topoReport) {
    // NCCL's own account of its choices, one file per process in the run directory (a profile's
    // or the user's NCCL_DEBUG* settings win; the report then says what is missing).
    std::error_code ec;
    std::filesystem::create_directories(s.runDir, ec);
    const std::pair<const char*, std::string> debug[] = {
        {"NCCL_DEBUG", "INFO"},
        {"NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV,NET"},
        {"NCCL_DEBUG_FILE", s.runDir + "/" + kNcclDebugFilePrefix + "%h.%p.log"}};
    for (const auto& [key, value] : debug) {
      bool listed = false;
      for (const auto& l : t.ncclEnv) listed = listed || l.rfind(std::string(key) + "=", 0) == 0;
      if (listed || std::getenv(key)) continue;
      setenv(key, value.c_str(), 0);
      t.ncclEnv.push_back(std::string(key) + "=" + value + " (topo.report)");
    }
  }
  if (!s.topoFile.empty()) {
    if (std::getenv("NCCL_TOPO_FILE")) {
      t.ncclEnv.push_back(std::string("NCCL_TOPO_FILE=") + std::getenv("NCCL_TOPO_FILE") + " (environment)");
    } else {
      setenv("NCCL_TOPO_FILE", s.topoFile.c_str(), 0);
      t.ncclEnv.push_back("NCCL_TOPO_FILE=" + s.topoFile + " (topo.file)");
    }
  }
  // Set outside any profile, these steer NCCL as much: listed too, and checked against the table.
  std::vector<std::string> warnings;
  for (auto& l : environmentNcclVars(t.ncclEnv, &warnings)) t.ncclEnv.push_back(std::move(l));
  if (rank == 0) {
    for (const auto& w : warnings) MT_LOG_WARN << w;
    for (const auto& l : t.ncclEnv) MT_LOG_INFO << "nccl env: " << l;
    if (t.topology) MT_LOG_INFO << t.topology->summary();
  }
  return t;
}

void bindToGpuCpus(const Topology& topology, int device) {
#ifdef MT_WITH_CUDA
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) return;
  std::string id = bus;
  for (auto& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  // By bus id only: falling back to the index order bound ranks to the wrong NUMA node's cores
  // when the file described another machine.
  const TopoGpu* match = topology.gpuByBusId(id);
  if (!match) {
    std::string listed;
    for (const auto& g : topology.gpus()) listed += (listed.empty() ? "" : ", ") + g.busid;
    throw ConfigError("topo.file " + topology.source() + ": no GPU at this rank's bus id " + id + " (GPU " +
                      std::to_string(device) + "; the file lists " + (listed.empty() ? "none" : listed) +
                      "): it describes another machine; dump this one's with NCCL_TOPO_DUMP_FILE, or set "
                      "topo.bind_cpus = false");
  }
  if (match->cpu < 0) return;
  const auto& cores = topology.cpus()[static_cast<size_t>(match->cpu)].cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  int usable = 0;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  for (int c : cores)
    if (c < hw && c < CPU_SETSIZE) CPU_SET(c, &set), ++usable;
  if (usable == 0) return;  // the file describes another machine
  if (sched_setaffinity(0, sizeof(set), &set) == 0) {
    MT_LOG_DEBUG << "bound to " << usable << " cores of NUMA node "
                 << topology.cpus()[static_cast<size_t>(match->cpu)].numa << " (GPU " << id << ")";
  }
#else
  (void)topology;
  (void)device;
#endif
}

NcclEnvEntry parseNcclEnvEntry(const std::string& entry) {
  NcclEnvEntry e;
  const size_t eq = entry.find('=');
  e.name = entry.substr(0, eq);
  if (eq == std::string::npos) return e;
  e.value = entry.substr(eq + 1);
  const size_t paren = e.value.rfind(" (");
  if (!e.value.empty() && e.value.back() == ')' && paren != std::string::npos) {
    e.origin = e.value.substr(paren + 2, e.value.size() - paren - 3);
    e.value.resize(paren);
  }
  return e;
}

std::string shellExportLine(const std::string& entry) {
  if (entry.find('=') == std::string::npos) return "# " + entry;
  const NcclEnvEntry e = parseNcclEnvEntry(entry);
  std::string quoted = "'";
  for (char c : e.value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  return "export " + e.name + "=" + quoted + (e.origin.empty() ? "" : "  # " + e.origin);
}

void writeNcclEnv(const std::string& path, const TopologySetup& setup) {
  std::ofstream env(path);
  env << "# NCCL environment in effect (profile " << (setup.profile ? setup.profile->name : "none") << ")\n";
  for (const auto& l : setup.ncclEnv) env << shellExportLine(l) << "\n";
  if (!env) throw IoError("cannot write " + path);
}

}  // namespace mt
