#include <gtest/gtest.h>

#include <cmath>

#include "core/optim/GradClip.h"
#include "core/optim/LrSchedule.h"
#include "core/optim/Optimizer.h"
#include "core/optim/SplitOptimizer.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

TEST(Schedule, CosineWithWarmup) {
  LrSchedule s;
  s.kind = "cosine";
  s.baseLr = 1.0f;
  s.minLr = 0.1f;
  s.warmupSteps = 10;
  s.totalSteps = 110;
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 1.0f);
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);
  EXPECT_NEAR(s.at(110), 0.1f, 1e-6);
  s.kind = "linear";
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);
  s.kind = "constant";
  s.warmupSteps = 0;
  EXPECT_FLOAT_EQ(s.at(1000), 1.0f);
}

TEST(Optim, AdamWMatchesTheFormula) {
  Tensor p = test::fromVector({1.f, -2.f}, {2}), g = test::fromVector({0.5f, -0.25f}, {2});
  auto opt = makeOptimizer({"adamw", 0.1f, 0.9f, false, 0.9f, 0.999f, 1e-8f}, {{p, g, true}});
  double m[2] = {0, 0}, v[2] = {0, 0}, ref[2] = {1.0, -2.0};
  const double lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    opt->step(static_cast<float>(lr));
    for (int i = 0; i < 2; ++i) {
      const double gi = g.data<float>()[i];
      ref[i] *= 1 - lr * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.999 * v[i] + 0.001 * gi * gi;
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      ref[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
      EXPECT_NEAR(p.data<float>()[i], ref[i], 1e-6);
    }
  }
  EXPECT_EQ(opt->stepCount(), 3);
  EXPECT_EQ(opt->state().size(), 2u);
}

TEST(Optim, SgdMomentumAndNoDecaySegments) {
  Tensor p = test::fromVector({1.f}, {1}), g = test::fromVector({1.f}, {1});
  Tensor q = test::fromVector({1.f}, {1}), h = test::fromVector({0.f}, {1});
  auto opt = makeOptimizer({"sgd", 0.5f, 0.9f}, {{p, g, true}, {q, h, false}});
  opt->step(0.1f);  // g' = 1 + 0.5 = 1.5, buf = 1.5
  EXPECT_NEAR(p.data<float>()[0], 1.f - 0.15f, 1e-7);
  opt->step(0.1f);  // g' = 1 + 0.5*0.85 = 1.425, buf = 0.9*1.5 + 1.425 = 2.775
  EXPECT_NEAR(p.data<float>()[0], 0.85f - 0.2775f, 1e-6);
  EXPECT_FLOAT_EQ(q.data<float>()[0], 1.f);  // zero gradient, no decay: unchanged
  EXPECT_THROW(makeOptimizer({"lion"}, {}), ConfigError);
}

// The step in pieces (sharding's offload steps unit by unit) is the same step: one count, every
// segment once, whatever the grouping and order.
TEST(Optim, StepInPiecesEqualsOneStep) {
  for (const char* type : {"adamw", "sgd"}) {
    std::vector<Tensor> pa, pb, g;
    std::vector<OptimSegment> sa, sb;
    for (int i = 0; i < 4; ++i) {
      std::vector<float> v(static_cast<size_t>(5 + i)), gv(v.size());
      for (size_t k = 0; k < v.size(); ++k)
        v[k] = 0.1f * static_cast<float>(k) - 0.3f * i, gv[k] = 0.05f * static_cast<float>(k + i) - 0.1f;
      pa.push_back(test::fromVector(v, {static_cast<int64_t>(v.size())}));
      pb.push_back(test::fromVector(v, {static_cast<int64_t>(v.size())}));
      g.push_back(test::fromVector(gv, {static_cast<int64_t>(gv.size())}));
      sa.push_back({pa.back(), g.back(), i % 2 == 0});
      sb.push_back({pb.back(), g.back(), i % 2 == 0});
    }
    OptimConfig c;
    c.type = type;
    c.weightDecay = 0.1f;
    auto whole = makeOptimizer(c, sa), pieces = makeOptimizer(c, sb);
    for (int step = 0; step < 3; ++step) {
      whole->step(0.01f);
      pieces->beginStep();
      pieces->stepSegments(0.01f, 2, 4);  // later units first, in two groups
      pieces->stepSegments(0.01f, 0, 1);
      pieces->stepSegments(0.01f, 1, 2);
    }
    EXPECT_EQ(pieces->stepCount(), whole->stepCount());
    for (size_t i = 0; i < pa.size(); ++i)
      for (int64_t k = 0; k < pa[i].numel(); ++k)
        EXPECT_EQ(pa[i].data<float>()[k], pb[i].data<float>()[k]) << type;
    EXPECT_THROW(pieces->stepSegments(0.01f, 3, 5), Error);  // past the last segment
  }
}

// Partial offload's optimizer: parts over runs of segments (here all on the CPU; on a GPU the first
// part's state is device memory) step bitwise as one optimizer, in pieces that straddle a cut;
// the step count, the state views and a resumed step count reach every part.
TEST(Optim, SplitOptimizerEqualsOneOptimizer) {
  for (const char* type : {"adamw", "sgd"}) {
    std::vector<Tensor> pa, pb, g;
    std::vector<OptimSegment> sa, sb;
    for (int i = 0; i < 5; ++i) {
      std::vector<float> v(static_cast<size_t>(3 + 2 * i)), gv(v.size());
      for (size_t k = 0; k < v.size(); ++k)
        v[k] = 0.07f * static_cast<float>(k) - 0.2f * i, gv[k] = 0.03f * static_cast<float>(k * i) - 0.05f;
      pa.push_back(test::fromVector(v, {static_cast<int64_t>(v.size())}));
      pb.push_back(test::fromVector(v, {static_cast<int64_t>(v.size())}));
      g.push_back(test::fromVector(gv, {static_cast<int64_t>(gv.size())}));
      sa.push_back({pa.back(), g.back(), i != 1, 100 * i});
      sb.push_back({pb.back(), g.back(), i != 1, 100 * i});
    }
    OptimConfig c;
    c.type = type;
    c.weightDecay = 0.1f;
    auto whole = makeOptimizer(c, sa);
    EXPECT_EQ(dynamic_cast<SplitOptimizer*>(whole.get()), nullptr) << "one device: one optimizer";
    SplitOptimizer split(c, sb, {2, 3});
    ASSERT_EQ(split.parts(), 3u);
    EXPECT_EQ(split.partBegin(1), 2u);
    EXPECT_EQ(split.partBegin(3), 5u);
    for (int step = 0; step < 3; ++step) {
      whole->beginStep();
      whole->stepSegments(0.01f, 0, 5, 0.5f);  // a clip's factor, read as the step reads g
      split.beginStep();
      split.stepSegments(0.01f, 3, 5, 0.5f);  // the host part first, as offload's worker does
      split.stepSegments(0.01f, 1, 3, 0.5f);  // straddles the cut at 2
      split.stepSegments(0.01f, 0, 1, 0.5f);
    }
    EXPECT_EQ(split.stepCount(), 3);
    for (size_t i = 0; i < pa.size(); ++i)
      for (int64_t k = 0; k < pa[i].numel(); ++k) ASSERT_EQ(pa[i].data<float>()[k], pb[i].data<float>()[k]) << type;
    ASSERT_EQ(split.stateNames(), whole->stateNames());
    const auto state = split.state(), ref = whole->state();
    for (size_t q = 0; q < ref.size(); ++q) {
      for (int64_t k = 0; k < ref[q].second.numel(); ++k)
        ASSERT_EQ(state[q].second.data<float>()[k], ref[q].second.data<float>()[k]) << type << " " << ref[q].first;
      for (size_t i = 0; i < sa.size(); ++i) {
        const Tensor a = split.stateSlice(q, i), b = whole->stateSlice(q, i);
        ASSERT_EQ(a.numel(), b.numel());
        for (int64_t k = 0; k < a.numel(); ++k) ASSERT_EQ(a.data<float>()[k], b.data<float>()[k]);
      }
    }
    EXPECT_EQ(split.stateBytes(), whole->stateBytes());
    // A resumed step count reaches the parts: the next step's bias correction is the same.
    split.setStepCount(10);
    whole->setStepCount(10);
    whole->step(0.01f);
    split.step(0.01f);
    for (size_t i = 0; i < pa.size(); ++i)
      for (int64_t k = 0; k < pa[i].numel(); ++k) ASSERT_EQ(pa[i].data<float>()[k], pb[i].data<float>()[k]) << type;
    EXPECT_THROW(SplitOptimizer(c, sb, {3, 3}), Error);  // cuts must increase
    EXPECT_THROW(SplitOptimizer(c, sb, {5}), Error);     // and lie inside
  }
}

TEST(Optim, ClipGradNorm) {
  Tensor p = Tensor::zeros({2}, DType::kF32), g = test::fromVector({3.f, 4.f}, {2});
  std::vector<OptimSegment> segs = {{p, g, true}};
  EXPECT_NEAR(clipGradNorm(segs, 10.f), 5.0, 1e-6);
  EXPECT_FLOAT_EQ(g.data<float>()[0], 3.f);
  EXPECT_NEAR(clipGradNorm(segs, 1.f), 5.0, 1e-6);
  EXPECT_NEAR(g.data<float>()[0], 0.6f, 1e-6);
  EXPECT_NEAR(g.data<float>()[1], 0.8f, 1e-6);
  // A sharded norm: the partial sums of squares are added across ranks.
  g.data<float>()[0] = 3.f, g.data<float>()[1] = 4.f;
  EXPECT_NEAR(clipGradNorm(segs, 0.f, [](double s) { return 4 * s; }), 10.0, 1e-6);
}

}  // namespace
}  // namespace mt
