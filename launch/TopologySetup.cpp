#include "launch/TopologySetup.h"

#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/MpiEnvironment.h"
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
      if (findNcclEnv(t.ncclEnv, key) || std::getenv(key)) continue;
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
  if (t.profile) t.profile->checkTuningAgainst(t.ncclEnv);
  if (rank == 0) {
    for (const auto& w : warnings) MT_LOG_WARN << w;
    for (const auto& l : t.ncclEnv) MT_LOG_INFO << "nccl env: " << l;
    if (t.topology) MT_LOG_INFO << t.topology->summary();
  }
  return t;
}

namespace {

std::string cudaBusId(int device) {
#ifdef MT_WITH_CUDA
  char bus[32] = {0};
  if (device >= 0 && cudaDeviceGetPCIBusId(bus, sizeof(bus), device) == cudaSuccess) {
    std::string id = bus;
    for (auto& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return id;
  }
#else
  (void)device;
#endif
  return "";
}

std::vector<std::string> splitTabs(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '\t') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

// This rank's identity: its CUDA GPU, or for a CPU rank the file's GPU of its place in the node.
// *inFile: the file (if any) lists its GPU.
RankIdentity selfIdentity(const Topology* t, const RankSelf& self, bool* inFile) {
  std::string busid = cudaBusId(self.device);
  bool fromFile = false;
  if (busid.empty() && t && !t->gpus().empty()) {
    // A CPU rank plays the file's GPU of its place in the node.
    busid = t->gpus()[static_cast<size_t>(self.localRank) % t->gpus().size()].busid;
    fromFile = true;
  }
  // The machine joins the name: containers on different machines may share a hostname. Emulated
  // nodes are blocks of ranks on it (their GPUs are still the machine's).
  const std::string machine = self.hostname + "#" + std::to_string(self.machine);
  const std::string myHost = self.emulatedNodeRanks > 0
                                 ? self.hostname + "#" + std::to_string(self.rank / self.emulatedNodeRanks)
                                 : machine;
  RankIdentity me = identify(t, myHost, busid, fromFile);
  me.machine = machine;
  *inFile = !t || busid.empty() || t->gpuByBusId(busid) != nullptr;
  return me;
}

// The exchanged record: host, bus id, rail, gpuFromFile, inFile and machine, tab-separated.
std::string encodeIdentity(const RankIdentity& me, bool inFile) {
  return me.host + "\t" + me.busid + "\t" + std::to_string(me.rail) + "\t" + (me.gpuFromFile ? "1" : "0") +
         "\t" + (inFile ? "1" : "0") + "\t" + me.machine;
}

// Rank r's record back into its identity; refuses a GPU the file does not list.
RankIdentity decodeIdentity(const std::string& record, size_t r, const Topology* t) {
  const auto f = splitTabs(record);
  if (f.size() != 6)
    throw InternalError("rank identity exchange: malformed record from rank " + std::to_string(r));
  RankIdentity id;
  id.host = f[0];
  id.busid = f[1];
  id.rail = std::stoi(f[2]);
  id.gpuFromFile = f[3] == "1";
  id.machine = f[5];
  // The file describes another machine: bound by index, ranks would take the wrong NUMA node's
  // cores and rail NICs. Every rank has every record, so every rank refuses alike.
  if (f[4] != "1") {
    std::string listed;
    for (const auto& g : t->gpus())
      listed += (listed.empty() ? "" : ", ") + g.busid;
    throw ConfigError("topo.file " + t->source() + ": rank " + std::to_string(r) + " on " + id.host +
                      " drives the GPU at bus id " + id.busid + ", which the file does not list (it lists " +
                      (listed.empty() ? "none" : listed) +
                      "): it describes another machine; dump this one's with NCCL_TOPO_DUMP_FILE");
  }
  return id;
}

// NCCL runs one rank per GPU: ranks sharing one are refused, unless testing allows it.
void checkSharedGpus(const RankLayout& layout, const std::vector<RankIdentity>& ids, const RankSelf& self) {
  if (!self.nccl || layout.sharedGpus.empty()) return;
  const auto& ranks = layout.sharedGpus.front();
  const RankIdentity& id = ids[static_cast<size_t>(ranks.front())];
  std::string list;
  for (int r : ranks)
    list += (list.empty() ? "" : ", ") + std::to_string(r);
  if (!self.shareGpuForTests)
    throw ConfigError(
        "dist.backend = nccl: ranks " + list + " share GPU " + id.busid + " of machine " + id.machine +
        ", and NCCL runs one rank per GPU (use dist.backend = mpi, or as many GPUs as ranks per "
        "machine; MT_NODE_SPLIT and topo.node_ranks emulate nodes but share the machine's GPUs)");
  if (self.rank == 0)
    MT_LOG_WARN << "MT_NCCL_SHARE_GPU_FOR_TESTS=1: NCCL ranks " << list << " share GPU " << id.busid
                << " over sockets (testing only: correct, but its timings are not throughput)";
}

}  // namespace

void exchangeRankLayout(MPI_Comm comm, const RankSelf& self, TopologySetup& setup) {
  const Topology* t = setup.topology.get();
  bool inFile = false;
  const RankIdentity me = selfIdentity(t, self, &inFile);
  const auto all = allGatherStrings(comm, encodeIdentity(me, inFile));
  std::vector<RankIdentity> ids;
  for (size_t r = 0; r < all.size(); ++r)
    ids.push_back(decodeIdentity(all[r], r, t));
  setup.layout = groupRanks(ids, t, self.emulatedNodeRanks);
  checkSharedGpus(setup.layout, ids, self);
  if (self.rank == 0) {
    for (const auto& p : setup.layout.problems) MT_LOG_WARN << "rank layout: " << p;
    MT_LOG_DEBUG << "rank layout:\n" << setup.layout.summary();
  }
}

void shareGpuForTests(TopologySetup& setup, const RankSelf& self) {
  const std::pair<const char*, std::string> vars[] = {
      {"NCCL_HOSTID", self.hostname + "-mt-rank" + std::to_string(self.rank)}, {"NCCL_IB_DISABLE", "1"}};
  for (const auto& [key, value] : vars) {
    if (const std::string* l = findNcclEnv(setup.ncclEnv, key))
      throw ConfigError(std::string("MT_NCCL_SHARE_GPU_FOR_TESTS=1 sets ") + key + " for every rank, but " +
                        *l + " is already in effect: remove it");
    setenv(key, value.c_str(), 1);
    setup.ncclEnv.push_back(std::string(key) + "=" + value + " (MT_NCCL_SHARE_GPU_FOR_TESTS, rank " +
                            std::to_string(self.rank) + ")");
  }
}

void orderConcurrentCommunicators(TopologySetup& setup, const std::string& why,
                                  const std::vector<std::string>& scopes, int smCount) {
  const char* kOrder = "NCCL_LAUNCH_ORDER_IMPLICIT";
  if (const std::string* l = findNcclEnv(setup.ncclEnv, kOrder)) {
    if (parseNcclEnvEntry(*l).value == "0")
      throw ConfigError(
          why +
          " runs kernels of several NCCL communicators at once, which can deadlock across ranks "
          "unless NCCL orders their launches, but " +
          *l + " turns that off: remove it");
  } else {
    setenv(kOrder, "1", 1);
    setup.ncclEnv.push_back(std::string(kOrder) + "=1 (" + why + ": concurrent communicators)");
  }
  if (!setup.profile) return;
  int total = 0;
  std::string parts;
  for (const auto& scope : scopes) {
    const int m = setup.profile->tuning(scope).minCtas;
    if (m <= 0) continue;
    total += m;
    parts += (parts.empty() ? "" : " + ") + scope + " " + std::to_string(m);
  }
  if (total > smCount)
    throw ConfigError("profile " + setup.profile->path + ": " + why + " runs the " +
                      std::to_string(scopes.size()) +
                      " communicators' kernels at once, and their min_ctas (" + parts + " = " +
                      std::to_string(total) + ") exceed the GPU's " + std::to_string(smCount) + " SMs");
}

void bindRailNic(TopologySetup& setup, int rank) {
  if (!setup.topology) throw ConfigError("topo.bind_nic = true needs topo.file: the rails come from it");
  const RankPlacement& me = setup.layout.placements.at(static_cast<size_t>(rank));
  if (me.nicBinding.empty()) {
    if (rank != 0) return;
    std::string why = "no NIC near its GPU";
    if (!me.nics.empty())
      why = std::string("its NIC's fabric is ") + fabricName(setup.topology->nics()[static_cast<size_t>(me.nics[0])].fabric);
    MT_LOG_WARN << "topo.bind_nic: " << setup.topology->source() << " names no device for rank 0's rail (" << why
                << "): NCCL chooses the NICs itself";
    return;
  }
  const NcclEnvEntry e = parseNcclEnvEntry(me.nicBinding);
  if (const std::string* l = findNcclEnv(setup.ncclEnv, e.name))
    throw ConfigError("topo.bind_nic = true sets " + e.name + " to each rank's rail NIC(s), but " + *l +
                      " is already in effect: remove one of the two");
  setenv(e.name.c_str(), e.value.c_str(), 1);
  std::string nics;
  for (int n : me.nics) nics += (nics.empty() ? "nic" : ",nic") + std::to_string(n);
  setup.ncclEnv.push_back(me.nicBinding + " (topo.bind_nic: rank " + std::to_string(rank) + "'s rail " + nics + ")");
}

NodePlan nodePlanOf(const TopologySetup& setup, int rank) {
  const RankLayout& l = setup.layout;
  NodePlan p;
  const RankPlacement& me = l.placements.at(static_cast<size_t>(rank));
  p.node = me.node;
  p.slot = me.localRank;
  p.ranksPerNode = l.ranksPerNode;
  p.unusable = l.unequalNodes;
  if (setup.profile) {
    p.intra = setup.profile->tuning("intra");
    p.inter = setup.profile->tuning("inter");
  }
  return p;
}

void bindToGpuCpus(const Topology& topology, const RankPlacement& me) {
  // By bus id only (exchangeRankLayout refused a file without it): the index order bound ranks to
  // the wrong NUMA node's cores when the file described another machine.
  if (me.gpuFromFile || me.gpu < 0) return;
  const TopoGpu& g = topology.gpus()[static_cast<size_t>(me.gpu)];
  if (g.cpu < 0) return;
  const auto& cores = topology.cpus()[static_cast<size_t>(g.cpu)].cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  int usable = 0;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  for (int c : cores)
    if (c < hw && c < CPU_SETSIZE) CPU_SET(c, &set), ++usable;
  if (usable == 0) return;  // the file describes another machine
  if (sched_setaffinity(0, sizeof(set), &set) == 0) {
    MT_LOG_DEBUG << "bound to " << usable << " cores of NUMA node " << topology.cpus()[static_cast<size_t>(g.cpu)].numa
                 << " (GPU " << me.busid << ")";
  }
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
