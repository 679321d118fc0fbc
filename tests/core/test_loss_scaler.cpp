// Dynamic loss scaling agrees across ranks: an inf gradient on one rank makes every rank skip the
// step and halve the scale (2 MPI ranks, CPU gradients; tests/models/test_gpu_parity.cpp covers
// device gradients).

#include <gtest/gtest.h>

#include "comm/MpiCommunicator.h"
#include "core/optim/LossScaler.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

TEST(LossScaler, InfOnOneRankSkipsTheStepEverywhere) {
  MpiCommunicator comm(MPI_COMM_WORLD, CommOptions());
  LossScalerOptions o;
  o.growthInterval = 3;
  LossScaler scaler(o);
  Tensor p = Tensor::zeros({64}, DType::kF32), g = test::randomTensor({64}, 9);
  std::vector<OptimSegment> segs = {{p, g, true}};
  auto anyRank = [&](bool found) { return comm.allReduceScalar(found ? 1.0 : 0.0, ReduceOp::kMax) > 0.0; };
  // Three clean steps grow the scale.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(scaler.unscaleAndCheck(segs, anyRank));
    scaler.update();
  }
  EXPECT_EQ(scaler.scale(), 131072.f);
  if (comm.rank() == 1) g.data<float>()[5] = INFINITY;
  EXPECT_FALSE(scaler.unscaleAndCheck(segs, anyRank));  // on every rank
  EXPECT_EQ(scaler.scale(), 65536.f);
  EXPECT_EQ(scaler.cleanSteps(), 0);
  g.data<float>()[5] = NAN;
  if (comm.rank() != 1) g.data<float>()[5] = 1.f;
  EXPECT_FALSE(scaler.unscaleAndCheck(segs, anyRank));
  EXPECT_EQ(scaler.scale(), 32768.f);
  EXPECT_EQ(scaler.skippedSteps(), 2);
}

// A resumed run's scaler continues the checkpoint's scale, clean run and skipped-step count.
TEST(LossScaler, SetStateRestoresTheSkippedCount) {
  LossScaler scaler(LossScalerOptions{1024.f, 2.f, 0.5f, 2});
  scaler.setState(256.f, 1, 7);
  Tensor p = Tensor::zeros({8}, DType::kF32), g = Tensor::zeros({8}, DType::kF32);
  g.data<float>()[3] = 512.f;
  std::vector<OptimSegment> segs = {{p, g, true}};
  ASSERT_TRUE(scaler.unscaleAndCheck(segs, nullptr));
  EXPECT_EQ(g.data<float>()[3], 2.f);  // unscaled by the restored scale
  scaler.update();                     // the second clean step in a row: growth
  EXPECT_EQ(scaler.scale(), 512.f);
  g.data<float>()[0] = NAN;
  EXPECT_FALSE(scaler.unscaleAndCheck(segs, nullptr));
  EXPECT_EQ(scaler.skippedSteps(), 8);
  EXPECT_EQ(scaler.scale(), 256.f);
}

}  // namespace
}  // namespace mt
