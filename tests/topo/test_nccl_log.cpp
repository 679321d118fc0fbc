// NCCL's debug output read back (topo/NcclLog): a synthetic two-communicator log in the shape of
// NCCL 2.28's INFO lines (the Init START/COMPLETE forms of ncclCommInitRankConfig and ncclCommSplit) (init of
// a 4-rank world and a 2-rank sub-communicator on one thread, another process's lines, noise), and what the
// report takes from it.

#include <gtest/gtest.h>

#include <chrono>
#include <string>

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

// Real rings are one line per channel with every rank of the communicator: a 16,384-rank job's
// is 87 KB. std::regex matched "(?:\s+\d+)+" by recursion per rank and overflowed the stack
// (trainer topo --nccl-log and topo.report died with SIGSEGV); the scanner is linear and stackless.
const char* kInfoHead = "nodeA:4242:4250 [0] NCCL INFO ";

std::string ringLine(int ranks, std::string* ring) {
  std::string line = std::string(kInfoHead) + "Channel 00/02 :";
  *ring = "00/02 :";
  for (int r = 0; r < ranks; ++r) {
    line += " " + std::to_string(r);
    *ring += " " + std::to_string(r);
  }
  return line + "\n";
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(NcclLog, RingOf16384RanksIsParsedWhole) {
  std::string ring;
  const std::string log = std::string(kInfoHead) + "comm 0x1 rank 0 nRanks 16384 nNodes 2048\n" +
                          ringLine(16384, &ring) + std::string(kInfoHead) + "Trees [0] 1/-1/-1->0->-1\n";
  const auto t0 = std::chrono::steady_clock::now();
  const NcclLogSummary s = parseNcclDebugLog(log);
  EXPECT_LT(secondsSince(t0), 2.0);  // milliseconds; 2 s leaves room for a loaded CI machine
  ASSERT_EQ(s.comms.size(), 1u);
  EXPECT_EQ(s.comms[0].nranks, 16384);
  ASSERT_EQ(s.comms[0].rings.size(), 1u);
  EXPECT_EQ(s.comms[0].rings[0], ring);
  EXPECT_EQ(s.comms[0].trees.size(), 1u);
}

TEST(NcclLog, HundredThousandCharacterLinesParseInLinearTime) {
  // Each of the long line's shapes: plain text, a ring that turns out not to be one at its very
  // end, a P2P line, digits and blanks without an INFO prefix, and a Trees line.
  const std::string digits = [] {
    std::string d;
    while (d.size() < 100000)
      d += " 1";
    return d;
  }();
  const std::string log = std::string(kInfoHead) + std::string(100000, 'x') + "\n" + kInfoHead +
                          "Channel 00/02 :" + digits + " x\n" + kInfoHead + "Channel 00/0 : 3[1] -> 0[0]" +
                          digits + "\n" + digits + "\n" + kInfoHead + "Trees" + digits + "\n" + kInfoHead +
                          "comm 0x1 rank 0 nranks 4 cudaDev 0" + std::string(100000, '-') + "\n";
  const auto t0 = std::chrono::steady_clock::now();
  const NcclLogSummary s = parseNcclDebugLog(log);
  EXPECT_LT(secondsSince(t0), 2.0);
  EXPECT_EQ(s.linesRead, 6);
  EXPECT_EQ(s.infoLines, 5);
  ASSERT_EQ(s.comms.size(), 1u);  // the anonymous one: no communicator was seen starting
  EXPECT_TRUE(s.comms[0].rings.empty());
  ASSERT_EQ(s.comms[0].p2p.size(), 1u);
  EXPECT_EQ(s.comms[0].p2p[0].size(), std::string("00/0 : 3[1] -> 0[0]").size() + digits.size());
  ASSERT_EQ(s.comms[0].trees.size(), 1u);
  EXPECT_EQ(s.comms[0].trees[0].size(), digits.size() - 1);
}

TEST(NcclLog, LinesOverTheBoundAreCountedNotKept) {
  // A million-rank ring (7.2 MB on one line) is skipped with a warning naming the line; a
  // 131,072-rank ring, the most that fits the bound, is kept.
  std::string big, kept;
  const std::string log = std::string(kInfoHead) + "comm 0x1 rank 0 nRanks 4 nNodes 1\n" +
                          ringLine(1 << 20, &big) + ringLine(131072, &kept);
  ASSERT_LT(ringLine(131072, &kept).size(), kNcclLogMaxLineBytes);
  const auto t0 = std::chrono::steady_clock::now();
  const NcclLogSummary s = parseNcclDebugLog(log);
  EXPECT_LT(secondsSince(t0), 2.0);
  EXPECT_EQ(s.linesRead, 3);
  EXPECT_EQ(s.longLinesSkipped, 1);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0].rfind("line 2: ", 0), 0u) << s.warnings[0];
  ASSERT_EQ(s.comms.size(), 1u);
  ASSERT_EQ(s.comms[0].rings.size(), 1u);
  EXPECT_EQ(s.comms[0].rings[0], kept);
  const auto j = toJson(s);
  EXPECT_EQ(j["long_lines_skipped"], 1);
}

}  // namespace
}  // namespace mt
