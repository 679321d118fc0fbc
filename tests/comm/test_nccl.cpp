// The NCCL backend on one GPU (a 1-rank communicator: every op runs through NCCL and the
// stream/event machinery; several GPUs are the multi-GPU issue's).

#include <gtest/gtest.h>

#include "comm/DataParallel.h"
#include "comm/NcclCommunicator.h"
#include "core/cuda/CudaRuntime.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

const Device kGpu = Device::cuda(0);

TEST(Nccl, CollectivesOnOneRank) {
  CommOptions o;
  o.name = "nccl1";
  NcclCommunicator c(MPI_COMM_WORLD, o);
  EXPECT_EQ(c.size(), 1);
  Tensor h = test::randomTensor({4096}, 1);
  Tensor d = h.to(kGpu);
  c.allReduce(d, ReduceOp::kAvg)->wait(c.timeout());
  EXPECT_EQ(test::relErr(d, h), 0.0);
  Tensor out = Tensor::zeros({4096}, DType::kF32, kGpu);
  c.allGather(d, out)->wait(c.timeout());
  EXPECT_EQ(test::relErr(out, h), 0.0);
  Tensor rs = Tensor::zeros({4096}, DType::kF32, kGpu);
  c.reduceScatter(d, rs, ReduceOp::kSum)->wait(c.timeout());
  EXPECT_EQ(test::relErr(rs, h), 0.0);
  c.broadcast(d, 0)->wait(c.timeout());
  // Host buffers (metadata) are staged.
  EXPECT_DOUBLE_EQ(c.allReduceScalar(2.5, ReduceOp::kSum), 2.5);
  c.barrierSync();
  auto recent = c.recentOps();
  ASSERT_GE(recent.size(), 5u);
  CudaRuntime::require().synchronize();
}

TEST(Nccl, DataParallelBucketsThroughNccl) {
  CommOptions o;
  NcclCommunicator c(MPI_COMM_WORLD, o);
  ParamTable t;
  for (int i = 0; i < 4; ++i) t.add("p" + std::to_string(i), {100000});
  t.materialize(kGpu);
  DataParallelOptions dpo;
  dpo.firstBucketMb = 0.2;
  dpo.bucketCapMb = 0.5;
  DataParallel dp(t, c, dpo);
  EXPECT_GE(dp.buckets().size(), 2u);
  Tensor h = test::randomTensor({100000}, 3);
  dp.beginBackward();
  for (int i = 3; i >= 0; --i) {
    t[static_cast<size_t>(i)].grad.view({100000}).copyFrom(h.to(kGpu));
    dp.gradReady(t[static_cast<size_t>(i)]);
  }
  dp.finishBackward();
  EXPECT_EQ(test::relErr(t[2].grad.view({100000}), h), 0.0);
}

}  // namespace
}  // namespace mt
