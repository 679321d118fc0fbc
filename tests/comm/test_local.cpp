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

}  // namespace
}  // namespace mt
