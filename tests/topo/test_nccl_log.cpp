// NCCL's debug output read back (topo/NcclLog): a synthetic two-communicator log in the shape of
// NCCL 2.28's INFO lines (the Init START/COMPLETE forms of ncclCommInitRankConfig and ncclCommSplit) (init of
// a 4-rank world and a 2-rank sub-communicator on one thread, another process's lines, noise), and what the
// report takes from it.

#include <gtest/gtest.h>

#include "topo/NcclLog.h"

namespace mt {
namespace {

const char* kLog =
    "nodeA:4242:4242 [0] NCCL INFO Bootstrap: Using ib0:10.1.0.1<0>\n"
    "nodeA:4242:4242 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\n"
    "nodeA:4242:4242 [0] NCCL INFO NCCL_IB_HCA set by environment to =mlx5_0:1\n"
    "nodeA:4242:4250 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ib0:10.1.0.1<0>\n"
    "nodeA:4242:4250 [0] NCCL INFO Using network IB\n"
    "nodeA:4242:4250 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ib0:10.1.0.1<0>\n"
    "nodeA:4242:4250 [0] NCCL INFO ncclCommInitRankConfig comm 0x55d0c1a0 rank 0 nranks 4 cudaDev 0 nvmlDev "
    "0 "
    "busId 18000 commId 0x9f3c2d1e5a7b6c4d - Init START\n"
    "nodeA:4242:4250 [0] NCCL INFO === System : maxBw 24.0 totalBw 24.0 ===\n"
    "nodeA:4242:4250 [0] NCCL INFO CPU/0-ffff (1/1/4)\n"
    "nodeA:4242:4250 [0] NCCL INFO + PCI[24.0] - GPU/0-18000 (0)\n"
    "nodeA:4242:4250 [0] NCCL INFO ==========================================\n"
    "nodeA:4242:4250 [0] NCCL INFO comm 0x55d0c1a0 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL "
    "0\n"
    "nodeA:4242:4250 [0] NCCL INFO Channel 00/02 :    0   1   2   3\n"
    "nodeA:4242:4250 [0] NCCL INFO Channel 01/02 :    0   3   2   1\n"
    "nodeA:4242:4250 [0] NCCL INFO Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2\n"
    "nodeA:4242:4250 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0\n"
    "nodeB:5151:5151 [1] NCCL INFO some other process's line is skipped by nothing, it is just INFO\n"
    "nodeA:4242:4250 [0] NCCL INFO comm 0x55d0c1a0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId "
    "0x9f3c2d1e5a7b6c4d - Init COMPLETE\n"
    "this line is not NCCL's\n"
    "nodeA:4242:4242 [0] NCCL INFO Comm config Blocking set to 0\n"
    "nodeA:4242:4242 [0] NCCL INFO Comm config Max CTAs set to 2\n"
    "nodeA:4242:4242 [0] NCCL INFO Comm config Comm name set to world.inter\n"
    "nodeA:4242:4250 [0] NCCL INFO ncclCommSplit comm 0x55d0c9f0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId "
    "18000 "
    "parent 0x55d0c1a0 splitCount 1 color 0 key 0- Init START\n"
    "nodeA:4242:4250 [0] NCCL INFO Channel 00/01 :    0   1\n"
    "nodeA:4242:4250 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1\n"
    "nodeA:4242:4250 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p "
    "channels per peer\n"
    "nodeA:4242:4250 [0] NCCL INFO ncclCommSplit comm 0x55d0c9f0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId "
    "18000 "
    "parent 0x55d0c1a0 splitCount 1 color 0 key 0 - Init COMPLETE\n";

TEST(NcclLog, ReadsVersionNetworkNicsAndPerCommunicatorGraphs) {
  const NcclLogSummary s = parseNcclDebugLog(kLog);
  EXPECT_EQ(s.version, "2.28.3+cuda13.0");
  EXPECT_EQ(s.network, "IB");
  ASSERT_EQ(s.nics.size(), 1u);  // logged twice, reported once
  EXPECT_EQ(s.nics[0], "NET/IB : [0]mlx5_0:1/IB [RO]; OOB ib0:10.1.0.1<0>");
  ASSERT_EQ(s.envSet.size(), 1u);
  EXPECT_EQ(s.envSet[0], "NCCL_IB_HCA set by environment to =mlx5_0:1");
  ASSERT_EQ(s.comms.size(), 2u);
  const NcclLogComm& w = s.comms[0];
  EXPECT_EQ(w.id, "0x55d0c1a0");
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.nranks, 4);
  EXPECT_EQ(w.busId, "18000");
  EXPECT_EQ(w.commHash, "0x9f3c2d1e5a7b6c4d");
  EXPECT_TRUE(w.complete);
  ASSERT_EQ(w.rings.size(), 2u);
  EXPECT_EQ(w.rings[0], "00/02 : 0 1 2 3");
  EXPECT_EQ(w.rings[1], "01/02 : 0 3 2 1");
  ASSERT_EQ(w.trees.size(), 1u);
  EXPECT_EQ(w.trees[0], "[0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2");
  ASSERT_EQ(w.p2p.size(), 1u);
  EXPECT_EQ(w.p2p[0], "00/0 : 3[1] -> 0[0] [receive] via NET/IB/0");
  // The second communicator's channels are its own, not the world's.
  const NcclLogComm& sub = s.comms[1];
  EXPECT_EQ(sub.nranks, 2);
  EXPECT_EQ(sub.parent, "0x55d0c1a0");
  EXPECT_TRUE(sub.complete);
  ASSERT_EQ(sub.rings.size(), 1u);
  EXPECT_EQ(sub.rings[0], "00/01 : 0 1");
  EXPECT_EQ(sub.trees.size(), 1u);
  // The config the creating thread logged before the split's START is the split's: its name (the
  // communicator meshtrain calls world.inter), the maxCTAs it asked for, and the channels NCCL took.
  EXPECT_EQ(sub.name, "world.inter");
  EXPECT_EQ(sub.config, std::vector<std::string>{"Max CTAs=2"});
  EXPECT_EQ(sub.collChannels, 2);
  EXPECT_TRUE(w.name.empty());
  EXPECT_EQ(w.collChannels, -1);
  EXPECT_EQ(s.infoLines, 26);
  ASSERT_EQ(s.system.size(), 3u);
  EXPECT_EQ(s.system[0], "=== System : maxBw 24.0 totalBw 24.0 ===");
  EXPECT_EQ(s.system[2], "+ PCI[24.0] - GPU/0-18000 (0)");
  const auto j = toJson(s);
  EXPECT_EQ(j["comms"].size(), 2u);
  EXPECT_EQ(j["comms"][0]["rings"][0], "00/02 : 0 1 2 3");
  EXPECT_EQ(j["comms"][1]["name"], "world.inter");
  EXPECT_EQ(j["comms"][1]["coll_channels"], 2);
}

TEST(NcclLog, EmptyAndForeignTextGiveNothing) {
  const NcclLogSummary s = parseNcclDebugLog("hello\nNCCL WARN nothing\n\n");
  EXPECT_TRUE(s.version.empty());
  EXPECT_TRUE(s.comms.empty());
  EXPECT_EQ(s.infoLines, 0);
  EXPECT_EQ(s.linesRead, 3);
}

}  // namespace
}  // namespace mt
