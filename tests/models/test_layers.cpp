#include <gtest/gtest.h>

#include <cmath>

#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"
#include "models/layers/Dropout.h"
#include "models/layers/LayerNorm.h"
#include "models/layers/Linear.h"
#include "core/Threads.h"
#include "tests/common/TestUtil.h"
#include "tests/models/GptTraining.h"

namespace mt {
namespace {

// Finite-difference check of Sequential's input-free gradient: d(loss)/d(param) for a few entries.
TEST(Layers, MlpGradientMatchesFiniteDifferences) {
  ModelConfig mc;
  mc.hidden = {16};
  mc.activation = "gelu";
  InputSpec in{4, 4, 1, 5};
  auto model = buildMlp(mc, in);
  model->params().materialize(Device::cpu());
  model->initParams(7);
  Batch b;
  b.inputs = Tensor::empty({6, 4, 4, 1}, DType::kU8);
  for (int64_t i = 0; i < b.inputs.numel(); ++i) b.inputs.data<uint8_t>()[i] = static_cast<uint8_t>((i * 37) % 256);
  b.targets = Tensor::empty({6}, DType::kI64);
  for (int64_t i = 0; i < 6; ++i) b.targets.data<int64_t>()[i] = i % 5;
  Context ctx;
  model->params().zeroGrads();
  model->forward(b, ctx);
  model->backward(ctx);
  Context eval;
  eval.training = false;
  for (size_t pi = 0; pi < model->params().size(); ++pi) {
    Param& p = model->params()[pi];
    for (int64_t e : {int64_t{0}, p.numel() / 2, p.numel() - 1}) {
      float* v = p.value.data<float>() + e;
      const float orig = *v, h = 1e-2f;
      *v = orig + h;
      const double up = model->forward(b, eval).meanLoss();
      *v = orig - h;
      const double down = model->forward(b, eval).meanLoss();
      *v = orig;
      const double numeric = (up - down) / (2 * h);
      const double analytic = p.grad.data<float>()[e];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << p.name << "[" << e << "]";
    }
  }
}

struct RecordingHooks : ModelHooks {
  std::vector<std::string> events;
  void beforeUnitForward(int u) override { events.push_back("F" + std::to_string(u)); }
  void afterUnitBackward(int u) override { events.push_back("B" + std::to_string(u)); }
  void gradReady(Param& p) override { events.push_back(p.name); }
};

TEST(Layers, SequentialHooksFollowUnitsInOrder) {
  ModelConfig mc;
  mc.hidden = {8, 8};
  auto model = buildMlp(mc, InputSpec{2, 2, 1, 3});
  model->params().materialize(Device::cpu());
  model->initParams(1);
  EXPECT_EQ(model->params().numUnits(), 3);
  RecordingHooks hooks;
  model->setHooks(&hooks);
  Batch b;
  b.inputs = Tensor::zeros({2, 2, 2, 1}, DType::kU8);
  b.targets = Tensor::zeros({2}, DType::kI64);
  Context ctx;
  model->forward(b, ctx);
  model->backward(ctx);
  std::vector<std::string> expect = {"F0",          "F1",          "F2",          "fc3.weight", "fc3.bias", "B2",
                                     "fc2.weight", "fc2.bias",    "B1",          "fc1.weight", "fc1.bias", "B0"};
  EXPECT_EQ(hooks.events, expect);
}

TEST(Layers, DropoutMaskIsDeterministicAndScaled) {
  Tensor x = test::randomTensor({1000}, 3);
  Tensor y1 = Tensor::empty({1000}, DType::kF32), y2 = Tensor::empty({1000}, DType::kF32);
  Tensor m1 = Tensor::empty({1000}, DType::kU8), m2 = Tensor::empty({1000}, DType::kU8);
  dropoutForward(y1, m1, x, 0.25f, 11, dropoutStream(3, 0));
  dropoutForward(y2, m2, x, 0.25f, 11, dropoutStream(3, 0));
  int kept = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(m1.data<uint8_t>()[i], m2.data<uint8_t>()[i]);
    kept += m1.data<uint8_t>()[i];
  }
  EXPECT_NEAR(kept, 750, 60);
  dropoutForward(y2, m2, x, 0.25f, 11, dropoutStream(4, 0));
  int same = 0;
  for (int i = 0; i < 1000; ++i) same += m1.data<uint8_t>()[i] == m2.data<uint8_t>()[i];
  EXPECT_LT(same, 900);  // another step draws another mask
}

TEST(Layers, LayerNormBackwardIsThreadCountInvariant) {
  Tensor x = test::randomTensor({1000, 33}, 5), dy = test::randomTensor({1000, 33}, 6);
  Tensor w = test::randomTensor({33}, 7), b = test::randomTensor({33}, 8);
  Tensor results[2];
  for (int t = 0; t < 2; ++t) {
    setNumThreads(t == 0 ? 1 : 2);
    Tensor y = Tensor::empty({1000, 33}, DType::kF32), dx = Tensor::empty({1000, 33}, DType::kF32);
    Tensor dw = Tensor::zeros({33}, DType::kF32), db = Tensor::zeros({33}, DType::kF32);
    Tensor mean = Tensor::empty({1000}, DType::kF32), rstd = Tensor::empty({1000}, DType::kF32);
    layerNormForward(y, &mean, &rstd, x, w, b, 1e-5f);
    layerNormBackward(dx, dw, db, dy, x, w, mean, rstd);
    results[t] = dw;
  }
  for (int i = 0; i < 33; ++i) EXPECT_EQ(results[0].data<float>()[i], results[1].data<float>()[i]);
}

// The fused residual forms equal the unfused layer plus the residual.
TEST(Layers, ResidualFusedIntoLinearAndLayerNorm) {
  Tensor x = test::randomTensor({37, 24}, 11), w = test::randomTensor({19, 24}, 12), b = test::randomTensor({19}, 13);
  Tensor res = test::randomTensor({37, 19}, 14);
  Tensor y = Tensor::empty({37, 19}, DType::kF32), yr = Tensor::empty({37, 19}, DType::kF32);
  linearForward(y, x, w, &b);
  linearForward(yr, x, w, &b, &res);
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_NEAR(yr.data<float>()[i], y.data<float>()[i] + res.data<float>()[i], 1e-5f);
  Tensor lx = test::randomTensor({37, 24}, 15), dy = test::randomTensor({37, 24}, 16), g = test::randomTensor({24}, 17);
  Tensor lres = test::randomTensor({37, 24}, 18);
  Tensor out = Tensor::empty({37, 24}, DType::kF32), mean = Tensor::empty({37}, DType::kF32),
         rstd = Tensor::empty({37}, DType::kF32);
  layerNormForward(out, &mean, &rstd, lx, g, g, 1e-5f);
  Tensor dx = Tensor::empty({37, 24}, DType::kF32), dxr = Tensor::empty({37, 24}, DType::kF32);
  Tensor dw = Tensor::zeros({24}, DType::kF32), db = Tensor::zeros({24}, DType::kF32);
  layerNormBackward(dx, dw, db, dy, lx, g, mean, rstd);
  layerNormBackward(dxr, dw, db, dy, lx, g, mean, rstd, &lres);
  for (int64_t i = 0; i < dx.numel(); ++i)
    EXPECT_NEAR(dxr.data<float>()[i], dx.data<float>()[i] + lres.data<float>()[i], 1e-5f);
}

TEST(Layers, CnnShapesAndUnits) {
  ModelConfig mc;
  mc.type = "cnn";
  auto model = buildImageModel(mc, InputSpec{28, 28, 1, 10});
  EXPECT_EQ(model->params().numUnits(), 4);  // conv1, conv2, fc1, fc2
  EXPECT_EQ(model->params().find("conv1.weight")->shape, (Shape{32, 3, 3, 1}));
  EXPECT_EQ(model->params().find("fc1.weight")->shape, (Shape{128, 64 * 7 * 7}));
  mc.type = "transformer";
  EXPECT_THROW(buildImageModel(mc, InputSpec{}), ConfigError);
}

// Activation checkpointing recomputes with the forward's own kernels: losses and parameters after
// three AdamW steps are bit-identical to none for every mode (pointwise, blocks on all blocks and on
// every 2nd, selective), with weight casts kept or not, and each mode keeps less than the one before.
TEST(Layers, GptActivationCheckpointingIsBitIdentical) {
  GptConfig c;
  c.vocab = 64, c.paddedVocab = 128, c.maxT = 16, c.layers = 3, c.heads = 2, c.channels = 32;
  c.classifierChunk = 24;
  const test::GptRun none = test::trainGpt(c, Device::cpu(), true, 3, 4);
  std::vector<int64_t> kept = {none.keptBytes};
  for (auto [mode, every] : {std::pair{ActivationCheckpointing::kPointwise, 1},
                             {ActivationCheckpointing::kBlocks, 2},
                             {ActivationCheckpointing::kSelective, 1},
                             {ActivationCheckpointing::kBlocks, 1}}) {
    c.checkpointing = mode;
    c.checkpointEvery = every;
    SCOPED_TRACE(std::string(enumName(activationCheckpointings(), mode)) + " every " + std::to_string(every));
    for (bool casts : {true, false}) {
      const test::GptRun r = test::trainGpt(c, Device::cpu(), casts, 3, 4);
      EXPECT_EQ(r.losses, none.losses);
      EXPECT_TRUE(r.values == none.values) << "parameters differ after 3 steps";
      if (casts) kept.push_back(r.keptBytes);
    }
  }
  for (size_t i = 1; i < kept.size(); ++i)
    EXPECT_LT(kept[i], kept[i - 1]) << "mode " << i;
}

// The loss scale (f16's dynamic loss scaling) reaches every gradient exactly once: with a power of
// two it scales every f32 rounding alike, so each gradient divided by it equals the unscaled one.
TEST(Layers, GptLossScaleReachesEveryGradientOnce) {
  GptConfig c;
  c.vocab = 64, c.paddedVocab = 128, c.maxT = 16, c.layers = 2, c.heads = 2, c.channels = 32;
  c.classifierChunk = 24;
  const test::GptGrads one = test::gptGrads(c, Device::cpu(), 1.f, 4);
  const test::GptGrads big = test::gptGrads(c, Device::cpu(), 65536.f, 4);
  EXPECT_EQ(big.loss, one.loss);
  ASSERT_EQ(big.grads.size(), one.grads.size());
  for (size_t i = 0; i < one.grads.size(); ++i)
    EXPECT_TRUE(big.grads[i].second == one.grads[i].second) << one.grads[i].first;
}

}  // namespace
}  // namespace mt
