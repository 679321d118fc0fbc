// Gradient compression hooks on 4 ranks (and 1): exactness where it must be exact, error feedback
// bookkeeping, agreement of all replicas, the plain warm-up steps.

#include <gtest/gtest.h>

#include <cmath>

#include "comm/Compression.h"
#include "comm/CompressionOps.h"
#include "comm/MpiCommunicator.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

double maxAbs(const Tensor& x) {
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(x.data<float>()[i])));
  return m;
}

class CompressionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommOptions o;
    o.timeout = std::chrono::seconds(60);
    comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, o);
  }
  // Matrices of several shapes (one conv-like 4-d), a vector: one bucket over all of them.
  void makeTable(ParamTable& t) {
    t.add("w1", {12, 10});
    t.add("b1", {12});
    t.add("w2", {6, 3, 2, 2});
    t.add("w3", {40, 30});
    t.materialize(Device::cpu());
  }
  Bucket wholeBucket(ParamTable& t) {
    Bucket b;
    for (size_t i = 0; i < t.size(); ++i)
      b.params.push_back(static_cast<int>(i));
    b.numel = t.flatGrads().numel();
    return b;
  }
  // Rank-dependent gradients; returns their exact average (computed here, not by a reducer).
  Tensor fillGrads(ParamTable& t, uint64_t seed) {
    for (size_t i = 0; i < t.size(); ++i)
      t[i].grad.copyFrom(test::randomTensor(t[i].shape, seed * 1000 + 17 * comm_->rank() + i));
    Tensor avg = t.flatGrads().clone();
    comm_->allReduceSync(avg, ReduceOp::kAvg);
    return avg;
  }
  void reduce(BucketReducer& r, ParamTable& t, int64_t step) {
    Bucket b = wholeBucket(t);
    r.beginStep(step);
    r.launch(b, t.flatGrads());
    r.wait(b, t.flatGrads());
  }
  // Max |difference| of this rank's tensor to rank 0's.
  double spreadOverRanks(const Tensor& x) {
    Tensor mine = x.clone(), first = x.clone();
    comm_->broadcast(first, 0)->wait(comm_->timeout());
    double d = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
      d = std::max(d, std::fabs(static_cast<double>(mine.data<float>()[i]) - first.data<float>()[i]));
    return comm_->allReduceScalar(d, ReduceOp::kMax);
  }
  std::unique_ptr<MpiCommunicator> comm_;
};

TEST_F(CompressionTest, PowerSgdWithFullRankIsTheExactAverage) {
  ParamTable t;
  makeTable(t);
  CompressionOptions o;
  o.method = CompressionMethod::kPowerSgd;
  o.rank = 64;  // >= min(m, n) of every matrix (capped per matrix)
  o.startIter = 0;
  o.minCompressionRate = 0.0;  // compress every matrix, even where it saves nothing
  PowerSgdReducer r(*comm_, t, o);
  const auto plan = r.plan(wholeBucket(t));
  ASSERT_EQ(plan.matrices.size(), 3u);  // w1, w2 (as 6 x 12), w3; b1 goes uncompressed
  EXPECT_EQ(plan.matrices[1].rows, 6);
  EXPECT_EQ(plan.matrices[1].cols, 12);
  EXPECT_EQ(plan.matrices[1].rank, 6);
  for (int step = 0; step < 3; ++step) {
    Tensor avg = fillGrads(t, static_cast<uint64_t>(step) + 1);
    reduce(r, t, step);
    EXPECT_LT(test::relErr(t.flatGrads(), avg), 2e-5) << "step " << step;
    // The residual is the local gradient minus the (exact) average: it sums to zero over ranks,
    // so feeding it back never moves the average.
    for (int p : {0, 2, 3}) {
      Tensor sum = r.error(p).clone();
      comm_->allReduceSync(sum, ReduceOp::kSum);
      EXPECT_LT(maxAbs(sum), 1e-4) << t[static_cast<size_t>(p)].name;
    }
  }
}

TEST_F(CompressionTest, PowerSgdErrorFeedbackKeepsWhatWasNotSent) {
  ParamTable t;
  makeTable(t);
  CompressionOptions o;
  o.method = CompressionMethod::kPowerSgd;
  o.rank = 1;
  o.startIter = 0;
  PowerSgdReducer r(*comm_, t, o);
  const auto plan = r.plan(wholeBucket(t));
  ASSERT_EQ(plan.matrices.size(), 3u);  // at rank 1 every matrix saves more than 2x
  Tensor avg = fillGrads(t, 7);
  std::vector<Tensor> before;
  for (size_t i = 0; i < t.size(); ++i)
    before.push_back(t[i].grad.clone());
  reduce(r, t, 0);
  for (const auto& m : plan.matrices) {
    const Param& p = t[static_cast<size_t>(m.param)];
    Tensor e = r.error(m.param);
    ASSERT_TRUE(e.defined());
    // e = M - P Q^T: the local gradient is exactly the sent approximation plus the residual.
    Tensor sum = p.grad.clone().flat();
    addInto(sum, e);
    EXPECT_LT(test::relErr(sum, before[static_cast<size_t>(m.param)].flat()), 1e-5) << p.name;
    // A rank-1 approximation of a random matrix leaves a real residual.
    EXPECT_GT(test::relErr(p.grad.flat(), before[static_cast<size_t>(m.param)].flat()), 0.1) << p.name;
  }
  // The uncompressed vector is the exact average.
  EXPECT_LT(test::relErr(t[1].grad, avg.flatSlice(t[1].storageOffset, 12)), 1e-6);
  // Next step with zero gradients: what is reduced now is the residual itself (M = 0 + e).
  std::vector<Tensor> residual;
  for (const auto& m : plan.matrices)
    residual.push_back(r.error(m.param).clone());
  t.zeroGrads();
  reduce(r, t, 1);
  for (size_t k = 0; k < plan.matrices.size(); ++k) {
    const int pi = plan.matrices[k].param;
    Tensor sum = t[static_cast<size_t>(pi)].grad.clone().flat();
    addInto(sum, r.error(pi));
    EXPECT_LT(test::relErr(sum, residual[k]), 1e-5);
  }
  // Every replica holds the same averaged gradient.
  EXPECT_EQ(spreadOverRanks(t.flatGrads()), 0.0);
}

// Checkpoints (launch/Checkpoint) keep checkpointState(): a reducer restored from it reduces the
// next step exactly as the one it was taken from; what does not fit (another rank) is refused.
TEST_F(CompressionTest, CheckpointStateRestoresTheNextStepExactly) {
  for (auto method : {CompressionMethod::kPowerSgd, CompressionMethod::kTopK}) {
    ParamTable a, b;
    makeTable(a);
    makeTable(b);
    CompressionOptions o;
    o.method = method;
    o.rank = 2;
    o.startIter = 0;
    o.topkFraction = 0.1;
    auto first = makeBucketReducer(o, *comm_, a), second = makeBucketReducer(o, *comm_, b);
    for (int step = 0; step < 3; ++step) {
      fillGrads(a, static_cast<uint64_t>(step) + 1);
      reduce(*first, a, step);
    }
    const auto state = first->checkpointState();
    ASSERT_FALSE(state.empty());
    for (const auto& kv : state)
      EXPECT_TRUE(second->restoreCheckpointState(kv.first, kv.second)) << kv.first;
    fillGrads(a, 9);
    fillGrads(b, 9);
    reduce(*first, a, 3);
    reduce(*second, b, 3);
    EXPECT_EQ(test::relErr(b.flatGrads(), a.flatGrads()), 0.0) << compressionMethodName(method);
    EXPECT_FALSE(second->restoreCheckpointState("error/no_such_param", state[0].second));
  }
  ParamTable t;
  makeTable(t);
  CompressionOptions o;
  o.method = CompressionMethod::kPowerSgd;
  o.rank = 3;
  PowerSgdReducer other(*comm_, t, o);
  EXPECT_FALSE(other.restoreCheckpointState("q/w3", Tensor::zeros({30, 2}, DType::kF32)));  // Q of rank 2
  EXPECT_TRUE(other.restoreCheckpointState("q/w3", Tensor::zeros({30, 3}, DType::kF32)));
}

TEST_F(CompressionTest, PowerSgdBytesShrink) {
  ParamTable t;
  t.add("big", {256, 512});
  t.add("bias", {256});
  t.materialize(Device::cpu());
  CompressionOptions o;
  o.method = CompressionMethod::kPowerSgd;
  o.rank = 4;
  o.startIter = 0;
  PowerSgdReducer r(*comm_, t, o);
  fillGrads(t, 3);
  reduce(r, t, 0);
  CompressionStats s = r.takeStats();
  EXPECT_EQ(s.bytesBefore, t.flatGrads().nbytes());
  EXPECT_EQ(s.bytesAfter, (256 * 4 + 512 * 4 + 256) * 4);
  EXPECT_GT(static_cast<double>(s.bytesBefore) / s.bytesAfter, 10.0);
}

TEST_F(CompressionTest, PlainAllReduceBeforeStartIter) {
  ParamTable t;
  makeTable(t);
  CompressionOptions o;
  o.method = CompressionMethod::kPowerSgd;
  o.rank = 1;
  o.startIter = 2;
  PowerSgdReducer r(*comm_, t, o);
  for (int step = 0; step < 2; ++step) {
    Tensor avg = fillGrads(t, 11 + static_cast<uint64_t>(step));
    reduce(r, t, step);
    EXPECT_LT(test::relErr(t.flatGrads(), avg), 1e-6);
    EXPECT_FALSE(r.error(0).defined());
  }
  Tensor avg = fillGrads(t, 20);
  reduce(r, t, 2);
  EXPECT_GT(test::relErr(t.flatGrads(), avg), 1e-3);  // now compressed
  EXPECT_TRUE(r.error(0).defined());
}

TEST_F(CompressionTest, TopKSendsTheLargestAndKeepsTheRest) {
  ParamTable t;
  makeTable(t);
  CompressionOptions o;
  o.method = CompressionMethod::kTopK;
  o.topkFraction = 0.05;
  o.startIter = 0;
  TopKReducer r(*comm_, t, o);
  const int W = comm_->size();
  fillGrads(t, 5);
  Tensor before = t.flatGrads().clone();
  reduce(r, t, 0);
  // sum over ranks of what each sent (M - e) equals W times the result.
  Tensor sent = before.clone();
  for (size_t i = 0; i < t.size(); ++i) {
    Tensor s = sent.flatSlice(t[i].storageOffset, t[i].numel());
    subtractFrom(s, r.error(static_cast<int>(i)));
  }
  const int64_t k = r.kFor(wholeBucket(t));
  int64_t nonzero = 0;
  for (int64_t i = 0; i < sent.numel(); ++i)
    nonzero += sent.data<float>()[i] != 0.f;
  EXPECT_EQ(nonzero, k);
  comm_->allReduceSync(sent, ReduceOp::kSum);
  Tensor result = t.flatGrads().clone();
  scaleTensor(result, static_cast<float>(W));
  EXPECT_LT(test::relErr(result, sent), 1e-6);
  EXPECT_EQ(spreadOverRanks(t.flatGrads()), 0.0);
  CompressionStats s = r.takeStats();
  EXPECT_EQ(s.bytesAfter, k * 8);
}

TEST_F(CompressionTest, TopKWarmUpShrinksTheFractionGeometrically) {
  ParamTable t;
  makeTable(t);
  CompressionOptions o;
  o.method = CompressionMethod::kTopK;
  o.topkFraction = 0.01;
  o.startIter = 10;
  o.topkWarmupSteps = 3;
  TopKReducer r(*comm_, t, o);
  const int64_t n = 10000;
  // Steps 10, 11, 12 send 0.01^(1/4), 0.01^(2/4), 0.01^(3/4) of the entries; from step 13 on, 1 %.
  const double expect[] = {std::pow(0.01, 0.25), 0.1, std::pow(0.01, 0.75), 0.01, 0.01};
  for (int i = 0; i < 5; ++i) {
    r.beginStep(10 + i);
    EXPECT_NEAR(r.fraction(), expect[i], 1e-12) << "step " << 10 + i;
    EXPECT_NEAR(static_cast<double>(r.kFor(n)), std::ceil(expect[i] * n), 1.0) << "step " << 10 + i;
  }
  // The bytes sent follow the warm-up: more at its first compressed step than at the target.
  fillGrads(t, 3);
  reduce(r, t, 10);
  const int64_t early = r.takeStats().bytesAfter;
  fillGrads(t, 4);
  reduce(r, t, 20);
  EXPECT_GT(early, 10 * r.takeStats().bytesAfter);
}

TEST(CompressionOps, TopKBreaksTiesByPosition) {
  Tensor x = test::fromVector({0.5f, -3.f, 2.f, -2.f, 2.f, 0.f, 3.f, 1.f}, {8});
  Tensor idx = Tensor::empty({4}, DType::kI32), val = Tensor::empty({4}, DType::kF32);
  topkByMagnitude(x, 4, idx, val);
  // |-3| and |3| first, then the first two of the three 2s: positions 1, 2, 3, 6.
  EXPECT_EQ(std::vector<int32_t>(idx.data<int32_t>(), idx.data<int32_t>() + 4),
            (std::vector<int32_t>{1, 2, 3, 6}));
  EXPECT_EQ(std::vector<float>(val.data<float>(), val.data<float>() + 4),
            (std::vector<float>{-3.f, 2.f, -2.f, 3.f}));
}

TEST(CompressionOps, GramSchmidtGivesOrthonormalColumns) {
  Tensor p = test::randomTensor({50, 4}, 9);
  orthonormalizeColumns(p.data<float>(), 50, 4, Device::cpu());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      double dot = 0;
      for (int k = 0; k < 50; ++k)
        dot += p.data<float>()[k * 4 + i] * p.data<float>()[k * 4 + j];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5);
    }
}

TEST_F(CompressionTest, HalfPrecisionCastsAreCloseToTheAverage) {
  for (DType wire : {DType::kF16, DType::kBF16}) {
    ParamTable t;
    makeTable(t);
    CastReducer r(*comm_, wire);
    Tensor avg = fillGrads(t, 13);
    reduce(r, t, 0);
    EXPECT_LT(test::relErr(t.flatGrads(), avg), wire == DType::kF16 ? 2e-3 : 2e-2) << dtypeName(wire);
    EXPECT_EQ(spreadOverRanks(t.flatGrads()), 0.0);
    CompressionStats s = r.takeStats();
    EXPECT_EQ(s.bytesAfter * 2, s.bytesBefore);
  }
}

}  // namespace
}  // namespace mt
