#include "topo/RankLayout.h"

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <tuple>

#include "core/Error.h"

namespace mt {

namespace {

// The variable that keeps NCCL on these NICs, in NCCL's exact-match form ("=" prefix).
std::string bindingFor(const Topology& t, const std::vector<int>& nics) {
  std::string devices;
  Fabric fabric = Fabric::kUnknown;
  for (int i : nics) {
    const TopoNic& n = t.nics()[static_cast<size_t>(i)];
    fabric = n.fabric;
    for (const auto& net : n.nets) {
      if (net.name.empty()) continue;
      const bool ib = n.fabric == Fabric::kInfiniBand || n.fabric == Fabric::kRoCE;
      devices += (devices.empty() ? "" : ",") + net.name + (ib ? ":" + std::to_string(net.port) : "");
    }
  }
  if (devices.empty() || fabric == Fabric::kEFA || fabric == Fabric::kUnknown) return "";
  if (fabric == Fabric::kSocket) return "NCCL_SOCKET_IFNAME==" + devices;
  return "NCCL_IB_HCA==" + devices;
}

std::string list(const std::vector<int>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

RankIdentity identify(const Topology* t, const std::string& host, const std::string& busid,
                      bool gpuFromFile) {
  RankIdentity id;
  id.host = host;
  id.busid = lower(busid);
  id.gpuFromFile = gpuFromFile;
  if (t && !id.busid.empty()) {
    if (const TopoGpu* g = t->gpuByBusId(id.busid)) {
      const auto nics = t->rail(g->index);
      if (!nics.empty()) id.rail = nics.front();
    }
  }
  return id;
}

namespace {

// Nodes by host in order of first appearance (or blocks of ranksPerNode, emulated nodes); within a
// node, slots by rail, then bus id, then rank (ranks without a rail after those with one).
void groupNodes(const std::vector<RankIdentity>& ids, int ranksPerNode, RankLayout& l) {
  std::vector<int> nodeOf(ids.size());
  std::map<std::string, int> hostNode;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (ranksPerNode > 0) {
      nodeOf[r] = static_cast<int>(r) / ranksPerNode;
    } else {
      auto it = hostNode.emplace(ids[r].host, static_cast<int>(hostNode.size())).first;
      nodeOf[r] = it->second;
    }
    l.nodes = std::max(l.nodes, nodeOf[r] + 1);
  }
  l.intraNode.assign(static_cast<size_t>(l.nodes), {});
  for (size_t r = 0; r < ids.size(); ++r)
    l.intraNode[static_cast<size_t>(nodeOf[r])].push_back(static_cast<int>(r));
  for (auto& members : l.intraNode) {
    std::sort(members.begin(), members.end(), [&](int a, int b) {
      const auto& x = ids[static_cast<size_t>(a)];
      const auto& y = ids[static_cast<size_t>(b)];
      return std::make_tuple(x.rail < 0 ? INT_MAX : x.rail, x.busid, a) <
             std::make_tuple(y.rail < 0 ? INT_MAX : y.rail, y.busid, b);
    });
  }
}

// Where rank `rank` sits: its node and slot, and from the topology (when its GPU is in it) the
// GPU, NUMA node, rail NICs and the path to them.
RankPlacement placementOf(const RankIdentity& id, int rank, int node, int localRank, const Topology* t) {
  RankPlacement p;
  p.rank = rank;
  p.node = node;
  p.localRank = localRank;
  p.host = id.host;
  p.busid = id.busid;
  p.gpuFromFile = id.gpuFromFile;
  p.rail = id.rail;
  const TopoGpu* g = t && !id.busid.empty() ? t->gpuByBusId(id.busid) : nullptr;
  if (!g) return p;
  p.gpu = g->index;
  p.numa = g->cpu >= 0 ? t->cpus()[static_cast<size_t>(g->cpu)].numa : -1;
  p.nics = t->rail(g->index);
  p.railPath = t->railPath(g->index);
  p.nicBinding = bindingFor(*t, p.nics);
  return p;
}

// Every rank's placement; whether every node holds the same number of ranks (node groups need it).
void placeRanks(const std::vector<RankIdentity>& ids, const Topology* t, RankLayout& l) {
  l.placements.resize(ids.size());
  for (size_t n = 0; n < l.intraNode.size(); ++n) {
    const auto& members = l.intraNode[n];
    l.ranksPerNode = std::max(l.ranksPerNode, static_cast<int>(members.size()));
    for (size_t k = 0; k < members.size(); ++k)
      l.placements[static_cast<size_t>(members[k])] = placementOf(
          ids[static_cast<size_t>(members[k])], members[k], static_cast<int>(n), static_cast<int>(k), t);
  }
  for (const auto& members : l.intraNode)
    l.uniform = l.uniform && static_cast<int>(members.size()) == l.ranksPerNode;
  if (l.uniform) return;
  std::string desc;
  for (size_t n = 0; n < l.intraNode.size(); ++n)
    desc += (n ? ", " : "") + std::string("node ") + std::to_string(n) + " (" +
            l.placements[static_cast<size_t>(l.intraNode[n].front())].host + ") " +
            std::to_string(l.intraNode[n].size());
  l.unequalNodes =
      "nodes have different numbers of ranks (" + desc + "): node groups need the same number on every node";
  l.problems.push_back(l.unequalNodes);
}

// Ranks driving one GPU (possible with the MPI backend; NCCL refuses it). By machine, not by
// node: emulated nodes (MT_NODE_SPLIT) are blocks of ranks on one machine and share its GPUs.
void findSharedGpus(const std::vector<RankIdentity>& ids, RankLayout& l) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> byGpu;
  for (size_t r = 0; r < ids.size(); ++r)
    if (!ids[r].busid.empty() && !ids[r].gpuFromFile)
      byGpu[{ids[r].machine.empty() ? ids[r].host : ids[r].machine, ids[r].busid}].push_back(
          static_cast<int>(r));
  for (auto& kv : byGpu) {
    if (kv.second.size() < 2) continue;
    l.sharedGpus.push_back(kv.second);
    l.problems.push_back("ranks " + list(kv.second) + " share GPU " + kv.first.second + " of machine " +
                         kv.first.first);
  }
}

// Slot k of every node forms rail group k; it is rail-aligned when all its ranks use one NIC rail.
void groupRails(RankLayout& l) {
  l.rails.assign(static_cast<size_t>(l.ranksPerNode), {});
  for (const auto& members : l.intraNode)
    for (size_t k = 0; k < members.size(); ++k)
      l.rails[k].push_back(members[k]);
  for (size_t k = 0; k < l.rails.size(); ++k) {
    const int first = l.placements[static_cast<size_t>(l.rails[k].front())].rail;
    for (int r : l.rails[k]) {
      if (l.placements[static_cast<size_t>(r)].rail == first) continue;
      l.railAligned = false;
      l.problems.push_back("slot " + std::to_string(k) + " is not one rail: rank " +
                           std::to_string(l.rails[k].front()) + " uses nic" + std::to_string(first) +
                           ", rank " + std::to_string(r) + " nic" +
                           std::to_string(l.placements[static_cast<size_t>(r)].rail) +
                           " (nodes built differently?): the inter-node phase crosses rails");
      break;
    }
  }
}

}  // namespace

RankLayout groupRanks(const std::vector<RankIdentity>& ids, const Topology* t, int ranksPerNode) {
  RankLayout l;
  l.ranks = static_cast<int>(ids.size());
  groupNodes(ids, ranksPerNode, l);
  placeRanks(ids, t, l);
  findSharedGpus(ids, l);
  if (l.uniform) groupRails(l);
  return l;
}

RankLayout layoutRanks(const Topology& t, int ranks, int ranksPerNode) {
  const int gpus = static_cast<int>(t.gpus().size());
  if (ranksPerNode <= 0) ranksPerNode = gpus;
  if (ranksPerNode <= 0) throw ConfigError("topo: " + t.source() + " lists no GPU to place ranks on");
  if (ranksPerNode > gpus)
    throw ConfigError("topo: " + std::to_string(ranksPerNode) + " ranks per node, but " + t.source() +
                      " lists " + std::to_string(gpus) + " GPU(s)");
  if (ranks <= 0 || ranks % ranksPerNode != 0)
    throw ConfigError("topo: --ranks " + std::to_string(ranks) + " is not a multiple of " +
                      std::to_string(ranksPerNode) + " ranks per node");
  std::vector<RankIdentity> ids;
  for (int r = 0; r < ranks; ++r) {
    const TopoGpu& g = t.gpus()[static_cast<size_t>(r % ranksPerNode)];  // local rank i drives GPU i
    ids.push_back(identify(&t, "node" + std::to_string(r / ranksPerNode), g.busid));
  }
  return groupRanks(ids, &t, ranksPerNode);
}

std::string RankLayout::summary() const {
  std::ostringstream os;
  os << "ranks " << ranks << " = " << nodes << " node(s) x " << ranksPerNode << " rank(s)"
     << (uniform ? "" : " (at most; nodes differ)") << "\n";
  for (const auto& p : placements) {
    os << "  rank " << p.rank << ": node " << p.node << " local " << p.localRank;
    if (p.gpu >= 0) os << " gpu" << p.gpu;
    os << " " << (p.busid.empty() ? "(no GPU)" : p.busid) << (p.gpuFromFile ? " (emulated)" : "");
    os << " numa " << p.numa << " rail";
    if (p.nics.empty()) os << " none";
    for (size_t i = 0; i < p.nics.size(); ++i)
      os << (i ? "," : " ") << "nic" << p.nics[i];
    if (!p.nics.empty()) os << " (" << pathTypeName(p.railPath) << ")";
    os << " "
       << (p.nicBinding.empty() ? "(no NIC binding: the file names no device for this rail)" : p.nicBinding)
       << "\n";
  }
  os << "  intra-node groups:";
  for (size_t n = 0; n < intraNode.size(); ++n)
    os << " node" << n << " " << list(intraNode[n]);
  os << "\n  inter-node groups (one per rail):";
  for (size_t r = 0; r < rails.size(); ++r)
    os << " rail" << r << " " << list(rails[r]);
  os << "\n";
  for (const auto& p : problems)
    os << "  warning: " << p << "\n";
  return os.str();
}

}  // namespace mt
