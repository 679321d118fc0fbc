#include "topo/CostModel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace mt {

namespace {
// NCCL tuning constants (microseconds). [algo: tree, ring][proto: LL, LL128, Simple]
constexpr double kBaseLat[2][3] = {{4.4, 4.4, 0.0}, {3.6, 10.0, 8.4}};
// [hw: NVLink, PCIe, network][algo][proto]
constexpr double kHwLat[3][2][3] = {
    {{0.52, 1.2, 28.0}, {0.47, 1.9, 3.4}},
    {{1.0, 1.9, 28.0}, {1.0, 2.5, 5.7}},
    {{5.0, 8.5, 50.0}, {2.7, 4.0, 9.6}},
};
constexpr double kLl128MaxBwPerChannel = 16.7;  // all-reduce
}  // namespace

const char* algoName(NcclAlgo a) { return a == NcclAlgo::kTree ? "tree" : "ring"; }
const char* protoName(NcclProto p) { return p == NcclProto::kLL ? "LL" : p == NcclProto::kLL128 ? "LL128" : "Simple"; }

std::string MachineSpec::str() const {
  std::ostringstream os;
  os << gpusPerNode << " GPU/node, intra " << intraGBs << " GB/s (" << (nvlink ? "NVLink" : "PCIe") << "), "
     << nicsPerNode << " x " << nicGbps << " Gb/s " << fabricName(fabric) << " (efficiency " << nicEfficiency << ")";
  return os.str();
}

MachineSpec CostModel::specFrom(const Topology& t, const Profile* profile) {
  MachineSpec m;
  m.gpusPerNode = std::max<int>(1, static_cast<int>(t.gpus().size()));
  const double nv = t.nvlinkGBsPerGpu();
  m.nvlink = nv > 0;
  if (m.nvlink) {
    m.intraGBs = nv;
  } else {
    double pcie = 0;
    for (const auto& g : t.gpus())
      if (g.pci >= 0) pcie = std::max(pcie, t.pcis()[static_cast<size_t>(g.pci)].bandwidthGBs);
    // GPUs on a PCIe switch move data through it at about 80% of the link rate.
    m.intraGBs = pcie > 0 ? 0.8 * pcie : 24.0;
  }
  // The NICs the GPUs' rails use: one that no GPU is nearest to carries no collective traffic.
  std::vector<int> used = t.railNics();
  if (used.empty())
    for (const auto& n : t.nics()) used.push_back(n.index);
  m.nicsPerNode = std::max<int>(1, static_cast<int>(used.size()));
  double speed = 0;
  for (int i : used) speed = std::max(speed, t.nics()[static_cast<size_t>(i)].speedGbps());
  m.nicGbps = speed > 0 ? speed : 100.0;
  m.fabric = t.primaryFabric();
  m.nicEfficiency = m.fabric == Fabric::kInfiniBand ? 0.94 : m.fabric == Fabric::kRoCE ? 0.90 : 0.6;
  if (profile) {
    auto it = profile->hints.find("fabric");
    if (it != profile->hints.end()) parseFabric(it->second, &m.fabric);
    it = profile->hints.find("nic_gbps");
    if (it != profile->hints.end() && speed == 0) m.nicGbps = std::atof(it->second.c_str());
    it = profile->hints.find("nic_efficiency");
    if (it != profile->hints.end()) m.nicEfficiency = std::atof(it->second.c_str());
  }
  return m;
}

double CostModel::busBw(int nodes) const {
  if (nodes <= 1) return m_.intraGBs;
  // Rings leave each node through as many NICs as there are GPUs to drive them.
  const int used = std::min(m_.gpusPerNode, m_.nicsPerNode);
  const double net = used * m_.nicGbps / 8.0 * m_.nicEfficiency;
  return m_.gpusPerNode == 1 ? net : std::min(m_.intraGBs, net);
}

CollectiveEstimate CostModel::allReduce(double bytes, int nodes, NcclAlgo a, NcclProto p) const {
  const int nRanks = nodes * m_.gpusPerNode;
  CollectiveEstimate e;
  e.algo = a;
  e.proto = p;
  if (nRanks <= 1) return e;
  const int ai = static_cast<int>(a), pi = static_cast<int>(p);
  const int intraHw = m_.nvlink ? 0 : 1;
  double bw = busBw(nodes);
  const int channels = nodes > 1 ? 2 * std::min(m_.gpusPerNode, m_.nicsPerNode) : 16;
  if (a == NcclAlgo::kRing) {
    if (p == NcclProto::kLL) bw /= 4.0;
    if (p == NcclProto::kLL128) bw = std::min(bw * (m_.gpusPerNode < 2 ? 0.7 : 0.92), kLl128MaxBwPerChannel * channels);
  } else {
    const double maxTree = nodes > 2 ? 80.0 : 110.0;
    bw = std::min(bw * 0.9, maxTree);
    if (p == NcclProto::kLL) bw /= 3.8;
    if (p == NcclProto::kLL128)
      bw = std::min(bw * (nodes == 1 ? 7.0 / 9.0 : 0.915), kLl128MaxBwPerChannel * channels * 7.0 / 9.0);
  }
  const int nsteps = 2 * (nRanks - 1), interSteps = 2 * (nodes - 1);
  e.busGBs = bw;
  e.algGBs = a == NcclAlgo::kRing ? bw * nRanks / nsteps : bw * 0.5;
  double intraLat = kHwLat[intraHw][ai][pi], interLat = kHwLat[2][ai][pi];
  if (nodes > 1 && p == NcclProto::kLL) intraLat *= 1.8;
  double lat = kBaseLat[ai][pi];
  if (a == NcclAlgo::kRing) {
    const int hw = nodes == 1 ? intraHw : 2;
    if (nodes == 1) lat += nsteps * kHwLat[hw][ai][pi];
    else lat += (nsteps - interSteps) * intraLat + interSteps * interLat;
    if (p == NcclProto::kSimple && nodes > 1 && bytes >= nRanks / 16.0 * 65536) lat *= 1.9;  // ring plateau
  } else {
    lat += 2 * ((m_.gpusPerNode - 1) * intraLat + std::log2(std::max(1, nodes)) * interLat);
  }
  e.us = lat + bytes / (1000.0 * e.algGBs);
  // Report busbw the way nccl-tests does: from the time, including latency.
  e.busGBs = bytes / (e.us * 1000.0) * (2.0 * (nRanks - 1) / nRanks);
  return e;
}

CollectiveEstimate CostModel::allReduce(double bytes, int nodes) const {
  CollectiveEstimate best;
  best.us = INFINITY;
  for (NcclAlgo a : {NcclAlgo::kRing, NcclAlgo::kTree})
    for (NcclProto p : {NcclProto::kLL, NcclProto::kLL128, NcclProto::kSimple}) {
      CollectiveEstimate e = allReduce(bytes, nodes, a, p);
      if (e.us < best.us) best = e;
    }
  if (!std::isfinite(best.us)) best.us = 0;
  return best;
}

CollectiveEstimate CostModel::hierarchicalAllReduce(double bytes, int nodes) const {
  const int G = m_.gpusPerNode, nRanks = nodes * G;
  CollectiveEstimate e;
  if (nRanks <= 1) return e;
  double us = 0;
  if (G > 1) {
    // Each node phase moves (G-1)/G of the bytes per GPU over G-1 ring steps; LL or Simple,
    // whichever is faster at this size.
    const int hw = m_.nvlink ? 0 : 1;
    const double moved = bytes * (G - 1) / G;
    const double simple = kBaseLat[1][2] + (G - 1) * kHwLat[hw][1][2] + moved / (1000.0 * m_.intraGBs);
    const double ll = kBaseLat[1][0] + (G - 1) * kHwLat[hw][1][0] + moved / (1000.0 * m_.intraGBs / 4.0);
    us += 2 * std::min(simple, ll);
  }
  if (nodes > 1) {
    MachineSpec rail = m_;
    rail.gpusPerNode = 1;
    rail.nicsPerNode = 1;
    rail.nicGbps = m_.nicGbps * std::min(1.0, static_cast<double>(m_.nicsPerNode) / G);
    us += CostModel(rail).allReduce(bytes / G, nodes).us;
  }
  e.us = us;
  e.algGBs = bytes / (us * 1000.0);
  e.busGBs = e.algGBs * 2.0 * (nRanks - 1) / nRanks;
  return e;
}

StepEstimate CostModel::step(double gradBytes, double bucketBytes, double computeMs, double backwardFraction,
                             int nodes) const {
  StepEstimate s;
  s.computeMs = computeMs;
  const int buckets = std::max(1, static_cast<int>(std::ceil(gradBytes / bucketBytes)));
  const double per = gradBytes / buckets;
  CollectiveEstimate e = allReduce(per, nodes);
  s.commMs = buckets * e.us / 1000.0;
  s.busGBs = e.busGBs;
  // Buckets become ready evenly through backward: all but the last can hide under it, the last
  // one always shows.
  const double lastMs = e.us / 1000.0;
  s.exposedMs = lastMs + std::max(0.0, (s.commMs - lastMs) - backwardFraction * computeMs);
  if (nodes * m_.gpusPerNode <= 1) s.commMs = s.exposedMs = 0;
  s.stepMs = computeMs + s.exposedMs;
  s.efficiency = computeMs / s.stepMs;
  return s;
}

}  // namespace mt
