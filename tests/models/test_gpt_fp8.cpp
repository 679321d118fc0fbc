// FP8 training on the CPU emulation (models/layers/Fp8Linear.h): the Linear's three GEMMs against
// f32 (a wrong transpose or scale would be off by O(1), FP8 rounding is a few percent), a tiny GPT
// trained in FP8 with both recipes staying close to f32, activation checkpointing bit-identical to
// none (recomputation replays the forward's scales), evaluation leaving the scaling state alone, and
// the GELU inside the casts (MT_FP8_GELU = 3) giving the bits of the GELU kernels around them.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "models/layers/Activation.h"
#include "models/layers/Linear.h"
#include "tests/models/GptTraining.h"

namespace mt {
namespace {

// Uniform in [-amp, amp) from a fixed LCG (structured data such as sine waves makes GEMMs cancel,
// which magnifies any rounding far beyond what training data sees).
Tensor wave(const Shape& s, float amp, int seed) {
  Tensor t = Tensor::empty(s, DType::kF32);
  uint32_t x = 2654435761u * static_cast<uint32_t>(seed + 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.data<float>()[i] = amp * (static_cast<float>(x >> 8) / 8388608.f - 1.f);
  }
  return t;
}

// Relative error in the Frobenius norm.
double relErr(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = static_cast<double>(got.data<float>()[i]) - want.data<float>()[i];
    num += d * d;
    den += static_cast<double>(want.data<float>()[i]) * want.data<float>()[i];
  }
  return std::sqrt(num / den);
}

// Two Linear layers [in, out] on the CPU with the same weights and bias and zeroed gradients: b in
// FP8 with this recipe, a too when bothFp8 (else f32).
struct LinearPair {
  ParamTable ta, tb;
  Linear a, b;
  LinearPair(int64_t in, int64_t out, Fp8Recipe recipe, bool bothFp8) : a(in, out), b(in, out) {
    a.registerParams(ta, "");
    b.registerParams(tb, "");
    ta.materialize(Device::cpu());
    tb.materialize(Device::cpu());
    Fp8Training f;
    f.enabled = true;
    f.options.recipe = recipe;
    b.enableFp8(f);
    if (bothFp8) a.enableFp8(f);
    for (Linear* l : {&a, &b}) {
      l->weight()->value.copyFrom(wave({out, in}, 0.2f, 1));
      l->bias()->value.copyFrom(wave({out}, 0.1f, 2));
    }
    ta.zeroGrads();
    tb.zeroGrads();
  }
};

// One Linear layer in f32 and in FP8: y, dx, dW and db on uniform random data. E4M3 keeps 3
// mantissa bits (relative rounding error up to 2^-4, about 2.3% RMS on uniform data), E5M2 2 bits
// (4.5%); a GEMM's relative error in norm is about its operands' RMS errors combined, and db is
// exact (it sums the unquantized gradient).
TEST(GptFp8, LinearGemmsAreCloseToF32) {
  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kDelayed}) {
    SCOPED_TRACE(enumName(fp8Recipes(), recipe));
    const int64_t N = 48, I = 40, O = 24;
    LinearPair pair(I, O, recipe, false);
    Linear &l32 = pair.a, &l8 = pair.b;
    Context ctx;
    for (int step = 0; step < 3; ++step) {  // delayed: the later steps cast with the history's scale
      const Tensor x = wave({N, I}, 1.5f, 3 + step), dy = wave({N, O}, 1e-3f, 5 + step);
      Tensor y32 = l32.forward(x, ctx), y8 = l8.forward(x, ctx);
      Tensor dx32 = l32.backward(dy, ctx), dx8 = l8.backward(dy, ctx);
      const double ey = relErr(y8, y32), edx = relErr(dx8, dx32);
      const double edw = relErr(l8.weight()->grad, l32.weight()->grad),
                   edb = relErr(l8.bias()->grad, l32.bias()->grad);
      std::printf("%s step %d: relative errors y %.4f dx %.4f dW %.4f db %.2g\n",
                  enumName(fp8Recipes(), recipe), step, ey, edx, edw, edb);
      // Measured 3.8% / 5.9% / 5.7% (y / dx / dW): E4M3 x E4M3 about sqrt(2) x 2.3% RMS, E5M2 x E4M3
      // about 4.5% (+) 2.3%. A wrong operand, transpose or scale is off by O(1).
      EXPECT_LT(ey, 0.05);
      EXPECT_LT(edx, 0.08);
      EXPECT_LT(edw, 0.08);
      EXPECT_GT(ey, 0.01);  // FP8 did run
      EXPECT_EQ(edb, 0.0);
    }
  }
}

GptConfig tinyGpt() {
  GptConfig c;
  c.vocab = 64, c.paddedVocab = 128, c.maxT = 16, c.layers = 2, c.heads = 2, c.channels = 32;
  c.classifierChunk = 24;
  return c;
}

// A tiny GPT trained 12 AdamW steps (lr 1e-3) in FP8 against f32 on the same tokens. The losses
// start at ln(64) = 4.16 and fall by about 0.5 over these steps; FP8's per-GEMM error of a few
// percent moves each step's loss by much less than that. Bound: 2e-2 absolute (0.5% of the loss,
// a twentieth of what training moves it; measured 1.4e-3 current, 1.7e-3 delayed).
TEST(GptFp8, TinyGptTrainsCloseToF32) {
  GptConfig c = tinyGpt();
  const test::GptRun f32 = test::trainGpt(c, Device::cpu(), true, 12, 4);
  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kDelayed}) {
    c.fp8.enabled = true;
    c.fp8.options.recipe = recipe;
    const test::GptRun f8 = test::trainGpt(c, Device::cpu(), true, 12, 4);
    double worst = 0;
    for (size_t i = 0; i < f32.losses.size(); ++i)
      worst = std::max(worst, std::fabs(f8.losses[i] - f32.losses[i]));
    std::printf("%s: losses f32 %.4f -> %.4f, fp8 %.4f -> %.4f, worst step difference %.2e\n",
                enumName(fp8Recipes(), recipe), f32.losses.front(), f32.losses.back(), f8.losses.front(),
                f8.losses.back(), worst);
    EXPECT_LT(worst, 2e-2);
    EXPECT_NE(f8.losses, f32.losses);  // FP8 did run
    EXPECT_LT(f8.losses.back(), f8.losses.front() - 0.2);
  }
}

// Recomputation replays the forward's casts: bit-identical losses and parameters for every mode,
// with the delayed recipe (whose state a second cast would step) and weight casts kept or not.
TEST(GptFp8, ActivationCheckpointingIsBitIdentical) {
  GptConfig c = tinyGpt();
  c.layers = 3;
  c.fp8.enabled = true;
  c.fp8.options.recipe = Fp8Recipe::kDelayed;
  c.fp8.options.historyLength = 4;
  const test::GptRun none = test::trainGpt(c, Device::cpu(), true, 4, 4);
  for (auto [mode, every] : {std::pair{ActivationCheckpointing::kPointwise, 1},
                             {ActivationCheckpointing::kBlocks, 2},
                             {ActivationCheckpointing::kSelective, 1},
                             {ActivationCheckpointing::kBlocks, 1}}) {
    c.checkpointing = mode;
    c.checkpointEvery = every;
    SCOPED_TRACE(std::string(enumName(activationCheckpointings(), mode)) + " every " + std::to_string(every));
    for (bool casts : {true, false}) {
      const test::GptRun r = test::trainGpt(c, Device::cpu(), casts, 4, 4);
      EXPECT_EQ(r.losses, none.losses);
      EXPECT_TRUE(r.values == none.values) << "parameters differ after 4 steps";
    }
  }
}

TEST(GptFp8, StatesAreNamedAndEvaluationLeavesThemAlone) {
  GptConfig c = tinyGpt();
  c.fp8.enabled = true;
  c.fp8Layers.proj = false;
  Gpt model(c);
  model.params().materialize(Device::cpu());
  model.initParams(3);
  auto states = model.fp8States();
  ASSERT_EQ(states.size(), 2u * 3 * 3);  // 2 blocks x (qkv, fc, fcproj) x (x, w, dy)
  EXPECT_EQ(states[0].first, "h0.qkv.x");
  EXPECT_EQ(states[5].first, "h0.fc.dy");
  EXPECT_EQ(states[17].first, "h1.fcproj.dy");
  Tensor in = Tensor::empty({2, 16}, DType::kI32), tg = Tensor::empty({2, 16}, DType::kI64);
  for (int64_t i = 0; i < 32; ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>(i % 64);
    tg.data<int64_t>()[i] = (i + 1) % 64;
  }
  Batch b;
  b.inputs = in;
  b.targets = tg;
  Context train;
  model.forward(b, train);
  model.backward(train);
  std::vector<std::vector<float>> before;
  for (auto& [name, st] : states)
    before.push_back(st->read());
  EXPECT_EQ(states[0].second->casts(), 1);
  EXPECT_EQ(states[2].second->casts(), 1);  // dy: cast in backward
  Context eval;
  eval.training = false;
  model.forward(b, eval);
  for (size_t i = 0; i < states.size(); ++i) {
    EXPECT_EQ(states[i].second->read(), before[i]) << states[i].first;
    EXPECT_EQ(states[i].second->casts(), 1) << states[i].first;
  }
}

// MT_FP8_GELU for one scope (Fp8Linear reads it at construction).
struct GeluModeEnv {
  explicit GeluModeEnv(const char* v) { setenv("MT_FP8_GELU", v, 1); }
  ~GeluModeEnv() { unsetenv("MT_FP8_GELU"); }
};

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.rawData(), b.rawData(), a.nbytes()) == 0;
}

// The fused casts against the GELU kernels around the plain casts, on the CPU where both compute
// the GELU with the same expressions (core/GeluMath.h) and std::tanh: forwardAddGelu(pre) equals
// forwardAdd(GELU(pre)), backwardThroughGelu(dg, pre) equals backward(dg * GELU'(pre)) in dx, dW
// and db, bit for bit, over three steps of each recipe. A cast that skipped the GELU, used GELU
// instead of GELU', or summed the wrong values into db would differ by O(1).
TEST(GptFp8, GeluInsideTheCastsMatchesTheGeluKernels) {
  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kDelayed}) {
    SCOPED_TRACE(enumName(fp8Recipes(), recipe));
    const int64_t N = 48, I = 64, O = 32;
    LinearPair pair(I, O, recipe, true);
    Linear &la = pair.a, &lb = pair.b;
    Context ctx;
    for (int step = 0; step < 3; ++step) {
      const Tensor pre = wave({N, I}, 3.f, 3 + step), res = wave({N, O}, 1.f, 4 + step);
      Tensor g = Tensor::empty({N, I}, DType::kF32);
      geluForward(g, pre, GeluKind::kTanh);
      Tensor ya = la.forwardAdd(g, res, ctx), yb = lb.forwardAddGelu(pre, res, ctx);
      EXPECT_TRUE(sameBits(ya, yb)) << "forward, step " << step;
      // Backward as the layer before a GELU: lb's output taken as the pre-activation of width O.
      const Tensor dg = wave({N, O}, 1e-3f, 5 + step), opre = wave({N, O}, 3.f, 6 + step);
      Tensor dpre = Tensor::empty({N, O}, DType::kF32);
      geluBackward(dpre, dg, opre, GeluKind::kTanh);
      Tensor dxa = la.backward(dpre, ctx), dxb = lb.backwardThroughGelu(dg, opre, ctx);
      EXPECT_TRUE(sameBits(dxa, dxb)) << "dx, step " << step;
      EXPECT_TRUE(sameBits(la.weight()->grad, lb.weight()->grad)) << "dW, step " << step;
      EXPECT_TRUE(sameBits(la.bias()->grad, lb.bias()->grad)) << "db, step " << step;
    }
    EXPECT_GT(std::fabs(la.bias()->grad.data<float>()[0]), 0.f);
  }
}

// The same through a whole GPT: MT_FP8_GELU = 3 (the default) trains to the bits of 0, without and
// with pointwise recomputation (which makes fcProj's input again from pre inside its cast).
TEST(GptFp8, GptWithTheGeluInsideTheCastsIsBitIdentical) {
  GptConfig c = tinyGpt();
  c.fp8.enabled = true;
  c.fp8.options.recipe = Fp8Recipe::kDelayed;
  c.fp8.options.historyLength = 4;
  for (auto mode : {ActivationCheckpointing::kNone, ActivationCheckpointing::kPointwise,
                    ActivationCheckpointing::kSelective}) {
    SCOPED_TRACE(enumName(activationCheckpointings(), mode));
    c.checkpointing = mode;
    test::GptRun kernels, inCasts;
    {
      GeluModeEnv env("0");
      kernels = test::trainGpt(c, Device::cpu(), true, 4, 4);
    }
    {
      GeluModeEnv env("3");
      inCasts = test::trainGpt(c, Device::cpu(), true, 4, 4);
    }
    EXPECT_EQ(kernels.losses, inCasts.losses);
    EXPECT_TRUE(kernels.values == inCasts.values) << "parameters differ after 4 steps";
    EXPECT_LE(inCasts.keptBytes, kernels.keptBytes);
  }
}

}  // namespace
}  // namespace mt
