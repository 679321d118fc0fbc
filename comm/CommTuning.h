#pragma once
// Per-communicator settings of the NCCL backend (ncclConfig_t), so that e.g. the inter-node rail
// communicator of a hierarchical all-reduce, which runs while backward computes, takes fewer SMs
// (maxCTAs) than the world one. Backend-neutral fields: the MPI and local backends ignore them.
// Unset (-1 / empty) leaves NCCL's default, which its NCCL_* environment variables may change.
// Values come from an environment profile's comm.<scope>.<field> lines, checked against
// topo/NcclParams.cpp's table.

#include <string>

namespace mt {

struct CommTuning {
  int cgaClusterSize = -1;  // 0..8, thread-block cluster size of NCCL's kernels (sm90+)
  int minCtas = -1;         // 1..64, CTAs (channels) NCCL uses at least
  int maxCtas = -1;         // 1..64, at most: fewer leave SMs to overlapped compute
  std::string netName;      // the network plugin / transport ("IB", "Socket", "AWS Libfabric")
  int splitShare = -1;      // 0/1: communicators split from this one share its resources
  int trafficClass = -1;    // 0..255, the network traffic class (QoS) of this communicator

  // Fields of `over` that are set replace those of this one.
  CommTuning overriddenBy(const CommTuning& over) const {
    CommTuning t = *this;
    if (over.cgaClusterSize >= 0) t.cgaClusterSize = over.cgaClusterSize;
    if (over.minCtas >= 0) t.minCtas = over.minCtas;
    if (over.maxCtas >= 0) t.maxCtas = over.maxCtas;
    if (!over.netName.empty()) t.netName = over.netName;
    if (over.splitShare >= 0) t.splitShare = over.splitShare;
    if (over.trafficClass >= 0) t.trafficClass = over.trafficClass;
    return t;
  }
  // "max_ctas=4 split_share=1", the profile's field names; "default" when empty.
  std::string describe() const {
    std::string s;
    auto add = [&s](const char* k, const std::string& v) {
      s += (s.empty() ? "" : " ") + std::string(k) + "=" + v;
    };
    if (cgaClusterSize >= 0) add("cga_cluster_size", std::to_string(cgaClusterSize));
    if (minCtas >= 0) add("min_ctas", std::to_string(minCtas));
    if (maxCtas >= 0) add("max_ctas", std::to_string(maxCtas));
    if (!netName.empty()) add("net_name", netName);
    if (splitShare >= 0) add("split_share", std::to_string(splitShare));
    if (trafficClass >= 0) add("traffic_class", std::to_string(trafficClass));
    return s.empty() ? "default" : s;
  }
};

}  // namespace mt
