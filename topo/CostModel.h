#pragma once
// An alpha-beta model of NCCL all-reduce and of a data-parallel training step, with NCCL's own
// tuning constants (src/graph/tuning.cc): per-algorithm/protocol base latencies, per-hop
// latencies for NVLink, PCIe and network, the LL/LL128 bandwidth factors and the tree caps.
//   time(bytes) = latency + bytes / algbw,   ring: algbw = busbw * n / (2(n-1)),  tree: busbw / 2
//   busbw = intra-node bandwidth per GPU (NVLink count x per-link rate, else PCIe) on one node;
//           min(intra, NICs used x NIC bandwidth x efficiency) across nodes
// Calibrated against published nccl-tests figures (docs/performance.md, tests/topo).

#include <string>
#include <vector>

#include "topo/Profile.h"
#include "topo/Topology.h"

namespace mt {

enum class NcclAlgo { kTree = 0, kRing = 1 };
enum class NcclProto { kLL = 0, kLL128 = 1, kSimple = 2 };
const char* algoName(NcclAlgo a);
const char* protoName(NcclProto p);

struct MachineSpec {
  int gpusPerNode = 8;
  double intraGBs = 370.8;   // per GPU, per direction
  bool nvlink = true;
  int nicsPerNode = 8;
  double nicGbps = 400;      // per NIC (all ports)
  double nicEfficiency = 0.94;
  Fabric fabric = Fabric::kInfiniBand;
  std::string str() const;
};

struct CollectiveEstimate {
  NcclAlgo algo = NcclAlgo::kRing;
  NcclProto proto = NcclProto::kSimple;
  double us = 0;       // time of one all-reduce
  double busGBs = 0;   // as nccl-tests reports it
  double algGBs = 0;
};

struct StepEstimate {
  double computeMs = 0, commMs = 0, exposedMs = 0, stepMs = 0, efficiency = 0;
  double busGBs = 0;
};

class CostModel {
 public:
  explicit CostModel(MachineSpec m) : m_(m) {}
  // From a topology file and an optional profile (NIC speed and fabric hints fill what the file lacks).
  static MachineSpec specFrom(const Topology& t, const Profile* profile);
  const MachineSpec& spec() const { return m_; }

  CollectiveEstimate allReduce(double bytes, int nodes, NcclAlgo a, NcclProto p) const;
  // The fastest algorithm/protocol, as NCCL's tuner would pick.
  CollectiveEstimate allReduce(double bytes, int nodes) const;
  // The rail-aligned hierarchical all-reduce of comm/Hierarchy, phases in sequence: a ring
  // reduce-scatter in the node, an all-reduce of 1/G of the bytes across nodes among the GPUs of
  // one rail (each over its own NIC, or a share of one when NICs are fewer than GPUs; NCCL's tuner
  // picks its algorithm), a ring all-gather in the node.
  CollectiveEstimate hierarchicalAllReduce(double bytes, int nodes) const;
  // Data parallelism: gradients of gradBytes in buckets of bucketBytes, all-reduced while the
  // backward (backwardFraction of computeMs) runs; what does not fit under it is exposed.
  StepEstimate step(double gradBytes, double bucketBytes, double computeMs, double backwardFraction, int nodes) const;

 private:
  double busBw(int nodes) const;
  MachineSpec m_;
};

}  // namespace mt
