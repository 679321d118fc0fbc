#include <gtest/gtest.h>

#include "comm/Communicator.h"

namespace mt {
namespace {

TEST(LocalCommunicator, WorldOfOne) {
  LocalCommunicator c;
  EXPECT_EQ(c.size(), 1);
  Tensor t = Tensor::empty({3}, DType::kF32);
  t.fill_(2.f);
  c.allReduce(t, ReduceOp::kAvg)->wait(c.timeout());
  EXPECT_EQ(t.data<float>()[2], 2.f);
  Tensor out = Tensor::zeros({3}, DType::kF32);
  c.allGather(t, out)->wait(c.timeout());
  EXPECT_EQ(out.data<float>()[1], 2.f);
  EXPECT_EQ(c.allReduceScalar(1.5, ReduceOp::kSum), 1.5);
  EXPECT_TRUE(c.split(0, 0, "sub"));
  EXPECT_FALSE(c.split(-1, 0, "none"));
  EXPECT_EQ(c.opsIssued(), 2);
}

// MT_TEST_FAULT's grammar: a typo must be an error naming the variable, never a test that silently
// injects nothing.
TEST(FaultPlan, ParsesAndRefuses) {
  FaultPlan p = FaultPlan::parse("skip:1:world:40");
  EXPECT_EQ(p.at("world", 1, 40), InjectedFault::kSkip);
  EXPECT_EQ(p.at("world", 0, 40), InjectedFault::kNone);
  EXPECT_EQ(p.at("world", 1, 41), InjectedFault::kNone);
  EXPECT_EQ(p.at("world.intra", 1, 40), InjectedFault::kNone);
  EXPECT_EQ(FaultPlan::parse("resize:0:world.inter:3").at("world.inter", 0, 3), InjectedFault::kResize);
  EXPECT_EQ(FaultPlan::parse("").at("world", 0, 0), InjectedFault::kNone);
  for (const char* bad :
       {"skip", "drop:1:world:4", "skip:x:world:4", "skip:1::4", "skip:1:world:-4", "skip:1:w:4:5"}) {
    try {
      FaultPlan::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("MT_TEST_FAULT"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mt
