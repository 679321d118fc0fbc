// What launch/TopologySetup exports for NCCL before its first call, for the multi-rank cases that
// only a GPU run exercises end to end: ranks that share one GPU in tests (each its own NCCL host
// identity over sockets), and communicators whose kernels run at once (an ordered launch, and a
// budget for their profile's min_ctas).

#include <gtest/gtest.h>

#include <cstdlib>

#include "launch/TopologySetup.h"

namespace mt {
namespace {

struct CleanNcclEnv {
  CleanNcclEnv() { clear(); }
  ~CleanNcclEnv() { clear(); }
  static void clear() {
    for (const char* v : {"NCCL_HOSTID", "NCCL_IB_DISABLE", "NCCL_LAUNCH_ORDER_IMPLICIT"})
      unsetenv(v);
  }
};

TEST(TopologySetup, SharedGpuForTestsGivesEachRankItsOwnNcclHost) {
  CleanNcclEnv clean;
  RankSelf self;
  self.hostname = "box";
  self.rank = 3;
  TopologySetup setup;
  shareGpuForTests(setup, self);
  ASSERT_NE(std::getenv("NCCL_HOSTID"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_HOSTID"), "box-mt-rank3");
  EXPECT_STREQ(std::getenv("NCCL_IB_DISABLE"), "1");
  ASSERT_EQ(setup.ncclEnv.size(), 2u);
  EXPECT_EQ(setup.ncclEnv[0], "NCCL_HOSTID=box-mt-rank3 (MT_NCCL_SHARE_GPU_FOR_TESTS, rank 3)");
  // One host identity for every rank (set by hand or a profile) would make NCCL see one host again.
  TopologySetup preset;
  preset.ncclEnv.push_back("NCCL_HOSTID=same (environment)");
  EXPECT_THROW(shareGpuForTests(preset, self), ConfigError);
}

TEST(TopologySetup, ConcurrentCommunicatorsAreLaunchedInOrder) {
  CleanNcclEnv clean;
  TopologySetup setup;
  orderConcurrentCommunicators(setup, "topo.hierarchical", {"world", "intra", "inter"}, 132);
  ASSERT_NE(std::getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), "1");
  ASSERT_EQ(setup.ncclEnv.size(), 1u);
  EXPECT_EQ(setup.ncclEnv[0], "NCCL_LAUNCH_ORDER_IMPLICIT=1 (topo.hierarchical: concurrent communicators)");
  // The user's 1 stays; a 0 is refused, naming where it came from.
  TopologySetup on;
  on.ncclEnv.push_back("NCCL_LAUNCH_ORDER_IMPLICIT=1 (profile ib-ndr)");
  orderConcurrentCommunicators(on, "topo.hierarchical", {"world"}, 132);
  EXPECT_EQ(on.ncclEnv.size(), 1u);
  TopologySetup off;
  off.ncclEnv.push_back("NCCL_LAUNCH_ORDER_IMPLICIT=0 (environment)");
  try {
    orderConcurrentCommunicators(off, "sharding.strategy = hybrid_shard", {"world", "intra", "inter"}, 132);
    ADD_FAILURE() << "NCCL_LAUNCH_ORDER_IMPLICIT=0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL_LAUNCH_ORDER_IMPLICIT=0 (environment)"), std::string::npos)
        << e.what();
  }
}

TEST(TopologySetup, ConcurrentCommunicatorsMinCtasMustFitTheGpu) {
  CleanNcclEnv clean;
  TopologySetup setup;
  setup.profile = std::make_unique<Profile>(Profile::parse(
      "comm.all.min_ctas = 32\ncomm.inter.min_ctas = 64\ncomm.inter.max_ctas = 64\n", "busy.env"));
  // world 32 + intra 32 + inter 64 = 128 of 132 SMs: accepted.
  orderConcurrentCommunicators(setup, "topo.hierarchical", {"world", "intra", "inter"}, 132);
  try {
    orderConcurrentCommunicators(setup, "topo.hierarchical", {"world", "intra", "inter"}, 114);
    ADD_FAILURE() << "128 CTAs accepted on 114 SMs";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("busy.env"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("world 32 + intra 32 + inter 64 = 128"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt
