// Rank layouts from every rank's (host, GPU bus id, rail): nodes by host, slots by rail, the rail
// groups a rail-optimised fabric wants, and what makes a layout unusable or misaligned.

#include <gtest/gtest.h>

#include <cstdlib>

#include "core/Error.h"
#include "topo/RankLayout.h"

namespace mt {
namespace {

Topology sample(const char* name) {
  return Topology::load(std::string(std::getenv("TOPO_SAMPLES")) + "/" + name);
}

const char* kOci = "oci-hpc-H100-topology.xml";

TEST(RankLayout, TwoNodesOfFourOnTheOciFile) {
  const Topology t = sample(kOci);
  const RankLayout l = layoutRanks(t, 8, 4);
  EXPECT_EQ(l.nodes, 2);
  EXPECT_EQ(l.ranksPerNode, 4);
  EXPECT_TRUE(l.uniform);
  EXPECT_TRUE(l.railAligned);
  EXPECT_EQ(l.intraNode, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.rails, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // GPU i's rail is NIC i behind the same PCI switch; both ports of that dual-port RoCE NIC.
  EXPECT_EQ(l.placements[5].nics, std::vector<int>{1});
  EXPECT_EQ(l.placements[5].nicBinding, "NCCL_IB_HCA==mlx5_3:1,mlx5_4:2");
  EXPECT_EQ(l.placements[5].railPath, PathType::kPXB);
  EXPECT_TRUE(l.problems.empty());
}

// The launcher numbered node 1's GPUs in reverse: grouping by host and ordering by rail still puts
// the GPUs of one rail in one inter-node group, so the slice that crosses the fabric stays on it.
TEST(RankLayout, SlotsFollowRailsNotTheLaunchersOrder) {
  const Topology t = sample(kOci);
  std::vector<RankIdentity> ids;
  for (int i = 0; i < 4; ++i)
    ids.push_back(identify(&t, "a", t.gpus()[static_cast<size_t>(i)].busid));
  for (int i = 3; i >= 0; --i)
    ids.push_back(identify(&t, "b", t.gpus()[static_cast<size_t>(i)].busid));
  const RankLayout l = groupRanks(ids, &t);
  EXPECT_EQ(l.nodes, 2);
  EXPECT_EQ(l.intraNode[1], (std::vector<int>{7, 6, 5, 4}));
  EXPECT_EQ(l.rails, (std::vector<std::vector<int>>{{0, 7}, {1, 6}, {2, 5}, {3, 4}}));
  EXPECT_EQ(l.placements[7].localRank, 0);
  EXPECT_EQ(l.placements[7].rail, 0);
  EXPECT_TRUE(l.railAligned);
  // Bus ids are compared in lower case, with CUDA's 8-digit domain too.
  std::string upper = "00000000:0F:00.0";
  EXPECT_EQ(identify(&t, "c", upper).rail, 0);
}

TEST(RankLayout, HostsInterleavedByTheLauncherFormNodes) {
  std::vector<RankIdentity> ids;
  for (int r = 0; r < 6; ++r)
    ids.push_back(identify(nullptr, r % 2 ? "odd" : "even", ""));
  const RankLayout l = groupRanks(ids, nullptr);
  EXPECT_EQ(l.intraNode, (std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}}));
  EXPECT_EQ(l.rails, (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(l.placements[3].node, 1);
  EXPECT_EQ(l.placements[3].localRank, 1);
}

TEST(RankLayout, UnequalNodesMisalignedRailsAndSharedGpus) {
  const Topology t = sample(kOci);
  auto gpu = [&](int i) { return t.gpus()[static_cast<size_t>(i)].busid; };
  // 3 ranks on a, 1 on b: no node groups.
  RankLayout l = groupRanks({identify(&t, "a", gpu(0)), identify(&t, "a", gpu(1)), identify(&t, "a", gpu(2)),
                             identify(&t, "b", gpu(0))},
                            &t);
  EXPECT_FALSE(l.uniform);
  EXPECT_TRUE(l.rails.empty());
  ASSERT_FALSE(l.problems.empty());
  EXPECT_NE(l.problems[0].find("node 0 (a) 3, node 1 (b) 1"), std::string::npos) << l.problems[0];
  // Node a uses rails 0 and 1, node b rails 0 and 2: slot 1 spans two rails.
  l = groupRanks({identify(&t, "a", gpu(0)), identify(&t, "a", gpu(1)), identify(&t, "b", gpu(0)),
                  identify(&t, "b", gpu(2))},
                 &t);
  EXPECT_TRUE(l.uniform);
  EXPECT_FALSE(l.railAligned);
  EXPECT_NE(l.summary().find("slot 1 is not one rail"), std::string::npos) << l.summary();
  // Two ranks on one GPU of one host (the MPI backend allows it; NCCL does not).
  l = groupRanks({identify(&t, "a", gpu(0)), identify(&t, "a", gpu(0))}, &t);
  ASSERT_EQ(l.sharedGpus.size(), 1u);
  EXPECT_EQ(l.sharedGpus[0], (std::vector<int>{0, 1}));
  // ...but CPU ranks standing in for the file's GPUs share nothing.
  l = groupRanks({identify(&t, "a", gpu(0), true), identify(&t, "a", gpu(0), true)}, &t);
  EXPECT_TRUE(l.sharedGpus.empty());
}

TEST(RankLayout, EmulatedNodesAreBlocksOfRanks) {
  std::vector<RankIdentity> ids(4, identify(nullptr, "one-host", ""));
  const RankLayout l = groupRanks(ids, nullptr, 2);
  EXPECT_EQ(l.intraNode, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(l.rails, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_THROW(layoutRanks(sample(kOci), 6, 4), ConfigError);
}

// MT_NODE_SPLIT on one real 8-GPU machine: ranks 0 and 4 were both "local rank 0" of their emulated
// node and took GPU 0. Emulated nodes are named apart, but their GPUs are the machine's, so the
// shared-GPU check (which NCCL needs) must group by machine, not by node.
TEST(RankLayout, EmulatedNodesOnOneMachineShareItsGpus) {
  const Topology t = sample(kOci);
  auto gpu = [&](int i) { return t.gpus()[static_cast<size_t>(i)].busid; };
  std::vector<RankIdentity> ids;
  for (int r = 0; r < 8; ++r) {
    ids.push_back(identify(&t, "box#" + std::to_string(r / 4), gpu(r % 4)));
    ids.back().machine = "box#0";
  }
  RankLayout l = groupRanks(ids, &t, 4);
  EXPECT_EQ(l.nodes, 2);
  ASSERT_EQ(l.sharedGpus.size(), 4u) << l.summary();
  EXPECT_EQ(l.sharedGpus[0].size(), 2u);
  // Each rank on its own GPU of the machine (by machine-local rank): nothing shared.
  for (int r = 0; r < 8; ++r)
    ids[static_cast<size_t>(r)].busid = gpu(r);
  l = groupRanks(ids, &t, 4);
  EXPECT_TRUE(l.sharedGpus.empty()) << l.summary();
}

}  // namespace
}  // namespace mt
