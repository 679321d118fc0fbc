#include "topo/RankLayout.h"

#include <sstream>

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
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

}  // namespace

RankLayout layoutRanks(const Topology& t, int ranks, int ranksPerNode) {
  const int gpus = static_cast<int>(t.gpus().size());
  if (ranksPerNode <= 0) ranksPerNode = gpus;
  if (ranksPerNode <= 0) throw ConfigError("topo: " + t.source() + " lists no GPU to place ranks on");
  if (ranksPerNode > gpus)
    throw ConfigError("topo: " + std::to_string(ranksPerNode) + " ranks per node, but " + t.source() + " lists " +
                      std::to_string(gpus) + " GPU(s)");
  if (ranks <= 0 || ranks % ranksPerNode != 0)
    throw ConfigError("topo: --ranks " + std::to_string(ranks) + " is not a multiple of " +
                      std::to_string(ranksPerNode) + " ranks per node");
  RankLayout l;
  l.ranks = ranks;
  l.ranksPerNode = ranksPerNode;
  l.nodes = ranks / ranksPerNode;
  l.intraNode.assign(static_cast<size_t>(l.nodes), {});
  l.rails.assign(static_cast<size_t>(ranksPerNode), {});
  for (int r = 0; r < ranks; ++r) {
    RankPlacement p;
    p.rank = r;
    p.node = r / ranksPerNode;
    p.localRank = r % ranksPerNode;
    const TopoGpu& g = t.gpus()[static_cast<size_t>(p.localRank)];  // local rank i drives GPU i
    p.gpu = g.index;
    p.busid = g.busid;
    p.numa = g.cpu >= 0 ? t.cpus()[static_cast<size_t>(g.cpu)].numa : -1;
    p.nics = t.rail(g.index);
    p.railPath = t.railPath(g.index);
    p.nicBinding = bindingFor(t, p.nics);
    l.intraNode[static_cast<size_t>(p.node)].push_back(r);
    l.rails[static_cast<size_t>(p.localRank)].push_back(r);
    l.placements.push_back(p);
  }
  return l;
}

std::string RankLayout::summary() const {
  std::ostringstream os;
  os << "ranks " << ranks << " = " << nodes << " node(s) x " << ranksPerNode << " rank(s)\n";
  for (const auto& p : placements) {
    os << "  rank " << p.rank << ": node " << p.node << " local " << p.localRank << " gpu" << p.gpu << " " << p.busid
       << " numa " << p.numa << " rail";
    if (p.nics.empty()) os << " none";
    for (size_t i = 0; i < p.nics.size(); ++i) os << (i ? "," : " ") << "nic" << p.nics[i];
    if (!p.nics.empty()) os << " (" << pathTypeName(p.railPath) << ")";
    os << " " << (p.nicBinding.empty() ? "(no NIC binding: the file names no device for this rail)" : p.nicBinding)
       << "\n";
  }
  os << "  intra-node groups:";
  for (size_t n = 0; n < intraNode.size(); ++n) os << " node" << n << " " << list(intraNode[n]);
  os << "\n  inter-node groups (one per rail):";
  for (size_t r = 0; r < rails.size(); ++r) os << " rail" << r << " " << list(rails[r]);
  os << "\n";
  return os.str();
}

}  // namespace mt
