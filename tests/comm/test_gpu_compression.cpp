// Compression on the GPU gives what the CPU gives: the primitives (cast, Gram-Schmidt, top-k,
// scatters) and the PowerSGD / top-k / fp16 reducers over device gradients, one rank.

#include <gtest/gtest.h>

#include "comm/Compression.h"
#include "comm/CompressionOps.h"
#include "core/cuda/CudaRuntime.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

Device gpu() { return CudaRuntime::require().dev(); }

Tensor host(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  CudaRuntime::require().synchronize();
  return h;
}

TEST(GpuCompressionOps, TopKMatchesTheCpuExactly) {
  Tensor x = test::randomTensor({100000}, 3);
  x.data<float>()[17] = x.data<float>()[99] = 5.f;  // ties are broken by position on both
  const int64_t k = 1000;
  Tensor ci = Tensor::empty({k}, DType::kI32), cv = Tensor::empty({k}, DType::kF32);
  topkByMagnitude(x, k, ci, cv, 7);
  Tensor xg = x.to(gpu());
  Tensor gi = Tensor::empty({k}, DType::kI32, gpu()), gv = Tensor::empty({k}, DType::kF32, gpu());
  topkByMagnitude(xg, k, gi, gv, 7);
  Tensor hi = host(gi), hv = host(gv);
  for (int64_t j = 0; j < k; ++j) {
    ASSERT_EQ(hi.data<int32_t>()[j], ci.data<int32_t>()[j]) << j;
    ASSERT_EQ(hv.data<float>()[j], cv.data<float>()[j]) << j;
  }
  // Scatter back: zeroing and adding land on the same entries.
  Tensor yc = x.clone(), yg = x.to(gpu());
  Tensor ciBase = ci.clone();
  for (int64_t j = 0; j < k; ++j) ciBase.data<int32_t>()[j] -= 7;
  Tensor giBase = ciBase.to(gpu());
  scatterZero(yc, ciBase);
  scatterZero(yg, giBase);
  scatterAdd(yc, ciBase, cv, 0.5f);
  scatterAdd(yg, giBase, gv, 0.5f);
  EXPECT_EQ(test::relErr(host(yg), yc), 0.0);
}

TEST(GpuCompressionOps, GramSchmidtAndCastsMatchTheCpu) {
  Tensor p = test::randomTensor({3000, 8}, 5);
  Tensor pg = p.to(gpu());
  orthonormalizeColumns(p.data<float>(), 3000, 8, Device::cpu());
  orthonormalizeColumns(pg.data<float>(), 3000, 8, gpu());
  EXPECT_LT(test::relErr(host(pg), p), 1e-4);
  for (DType d : {DType::kF16, DType::kBF16}) {
    Tensor lc = Tensor::empty({3000 * 8}, d), lg = Tensor::empty({3000 * 8}, d, gpu());
    convertInto(lc, p.flat());
    convertInto(lg, pg.flat());
    Tensor back = Tensor::empty({3000 * 8}, DType::kF32, gpu());
    convertInto(back, lg);
    EXPECT_LT(test::relErr(host(back), lc.toDType(DType::kF32)), 1e-2);
  }
}

// The same table on CPU and GPU, the same gradients, one rank: the reducers agree.
void makeTable(ParamTable& t, Device d) {
  t.add("w1", {96, 80});
  t.add("b1", {96});
  t.add("w2", {16, 8, 3, 3});
  t.materialize(d);
  for (size_t i = 0; i < t.size(); ++i) t[i].grad.copyFrom(test::randomTensor(t[i].shape, 40 + i).to(d));
}

Bucket whole(ParamTable& t) {
  Bucket b;
  for (size_t i = 0; i < t.size(); ++i) b.params.push_back(static_cast<int>(i));
  b.numel = t.flatGrads().numel();
  return b;
}

TEST(GpuCompression, ReducersMatchTheCpu) {
  for (CompressionMethod m : {CompressionMethod::kPowerSgd, CompressionMethod::kTopK, CompressionMethod::kFp16}) {
    CompressionOptions o;
    o.method = m;
    o.startIter = 0;
    o.rank = 4;
    o.topkFraction = 0.05;
    LocalCommunicator comm;
    ParamTable tc, tg;
    makeTable(tc, Device::cpu());
    makeTable(tg, gpu());
    auto rc = makeBucketReducer(o, comm, tc);
    auto rg = makeBucketReducer(o, comm, tg);
    for (int64_t step = 0; step < 3; ++step) {  // warm start and error feedback carry over
      Bucket b = whole(tc);
      rc->beginStep(step);
      rg->beginStep(step);
      rc->launch(b, tc.flatGrads());
      rc->wait(b, tc.flatGrads());
      rg->launch(b, tg.flatGrads());
      rg->wait(b, tg.flatGrads());
      EXPECT_LT(test::relErr(host(tg.flatGrads()), tc.flatGrads()), 2e-4) << rc->name() << " step " << step;
    }
  }
}

}  // namespace
}  // namespace mt
