// Every op's forward and backward, and 20 training steps of mlp and cnn, against PyTorch
// (tests/models/torch_reference.py writes the reference file): f32 relative error < 1e-5.

#include <gtest/gtest.h>

#include <cmath>

#include "data/H5File.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"
#include "models/layers/Activation.h"
#include "models/layers/Conv2d.h"
#include "models/layers/Dropout.h"
#include "models/layers/Embedding.h"
#include "models/layers/LayerNorm.h"
#include "models/layers/Linear.h"
#include "models/layers/MaxPool2d.h"
#include "models/layers/SoftmaxCrossEntropy.h"
#include "core/optim/GradClip.h"
#include "core/optim/LrSchedule.h"
#include "core/optim/Optimizer.h"
#include "tests/common/TestUtil.h"

namespace mt {
namespace {

constexpr double kTol = 1e-5;
using test::relErr;

class Parity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::fixturePath("PARITY_REF");
    ASSERT_FALSE(path.empty()) << "PARITY_REF not set (run through ctest)";
    file_ = new H5File(H5File::open(path));
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  Tensor get(const std::string& name) { return file_->readTensor(name); }
  static H5File* file_;
};
H5File* Parity::file_ = nullptr;

Tensor like(const Tensor& t) { return Tensor::zeros(t.shape(), DType::kF32); }

TEST_F(Parity, Linear) {
  const std::string g = "/ops/linear/";
  Tensor x = get(g + "x"), w = get(g + "w"), b = get(g + "b"), dy = get(g + "dy");
  Tensor y = like(get(g + "y")), dx = like(x), dw = like(w), db = like(b);
  linearForward(y, x, w, &b);
  linearBackward(&dx, dw, &db, dy, x, w);
  EXPECT_LT(relErr(y, get(g + "y")), kTol);
  EXPECT_LT(relErr(dx, get(g + "dx")), kTol);
  EXPECT_LT(relErr(dw, get(g + "dw")), kTol);
  EXPECT_LT(relErr(db, get(g + "db")), kTol);
  // Parameter gradients accumulate.
  linearBackward(nullptr, dw, &db, dy, x, w);
  Tensor twice = get(g + "dw");
  for (int64_t i = 0; i < twice.numel(); ++i) twice.data<float>()[i] *= 2.f;
  EXPECT_LT(relErr(dw, twice), kTol);
}

class ConvParity : public Parity, public ::testing::WithParamInterface<std::string> {};

TEST_P(ConvParity, ForwardBackward) {
  const std::string tag = GetParam();
  const std::string g = "/ops/" + tag + "/";
  const Layout layout = tag.find("nhwc") != std::string::npos ? Layout::kNHWC : Layout::kNCHW;
  Tensor x = get(g + "x"), w = get(g + "w"), b = get(g + "b"), dy = get(g + "dy"), meta = get(g + "meta");
  const int64_t* m = meta.data<int64_t>();
  Conv2dGeometry geo = Conv2dGeometry::make(layout, x.shape(), m[0], m[1], m[2], m[3]);
  Tensor y = like(get(g + "y")), dx = like(x), dw = like(w), db = like(b);
  Tensor col = Tensor::empty({geo.positions() * geo.K()}, DType::kF32);
  conv2dForward(y, col, x, w, &b, geo);
  conv2dBackward(&dx, dw, &db, dy, x, col, w, geo);
  EXPECT_LT(relErr(y, get(g + "y")), kTol);
  EXPECT_LT(relErr(dx, get(g + "dx")), kTol);
  EXPECT_LT(relErr(dw, get(g + "dw")), kTol);
  EXPECT_LT(relErr(db, get(g + "db")), kTol);
}
INSTANTIATE_TEST_SUITE_P(Ops, ConvParity,
                         ::testing::Values("conv_s1p1_nchw", "conv_s1p1_nhwc", "conv_s2p0_nchw", "conv_s2p0_nhwc",
                                           "conv_k5p2_nchw", "conv_k5p2_nhwc"));

class PoolParity : public Parity, public ::testing::WithParamInterface<std::string> {};

TEST_P(PoolParity, ForwardBackward) {
  const std::string tag = GetParam();
  const std::string g = "/ops/" + tag + "/";
  const Layout layout = tag.find("nhwc") != std::string::npos ? Layout::kNHWC : Layout::kNCHW;
  Tensor x = get(g + "x"), dy = get(g + "dy"), meta = get(g + "meta");
  PoolGeometry geo = PoolGeometry::make(layout, x.shape(), meta.data<int64_t>()[0], meta.data<int64_t>()[1]);
  Tensor y = like(get(g + "y")), dx = like(x);
  Tensor arg = Tensor::empty(y.shape(), DType::kI32);
  maxPool2dForward(y, &arg, x, geo);
  maxPool2dBackward(dx, dy, arg, geo);
  EXPECT_LT(relErr(y, get(g + "y")), kTol);
  EXPECT_LT(relErr(dx, get(g + "dx")), kTol);
}
INSTANTIATE_TEST_SUITE_P(Ops, PoolParity,
                         ::testing::Values("pool_k2s2_nchw", "pool_k2s2_nhwc", "pool_k3s2_nchw", "pool_k3s2_nhwc"));

TEST_F(Parity, Activations) {
  for (const std::string tag : {"relu", "gelu_tanh", "gelu_erf"}) {
    const std::string g = "/ops/" + tag + "/";
    Tensor x = get(g + "x"), dy = get(g + "dy");
    Tensor y = like(x), dx = like(x);
    if (tag == "relu") {
      reluForward(y, x);
      reluBackward(dx, dy, y);
    } else {
      GeluKind k = tag == "gelu_tanh" ? GeluKind::kTanh : GeluKind::kErf;
      geluForward(y, x, k);
      geluBackward(dx, dy, x, k);
    }
    EXPECT_LT(relErr(y, get(g + "y")), kTol) << tag;
    EXPECT_LT(relErr(dx, get(g + "dx")), kTol) << tag;
  }
}

TEST_F(Parity, DropoutWithGivenMask) {
  const std::string g = "/ops/dropout/";
  Tensor x = get(g + "x"), mask = get(g + "mask"), dy = get(g + "dy");
  const float p = static_cast<float>(get(g + "p").data<double>()[0]);
  // Our forward draws its own mask; check it against the formula, then the backward with
  // PyTorch's mask.
  Tensor y = like(x), ownMask = Tensor::empty(x.shape(), DType::kU8);
  dropoutForward(y, ownMask, x, p, 5, 9);
  int64_t kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float expect = ownMask.data<uint8_t>()[i] ? x.data<float>()[i] / (1.f - p) : 0.f;
    EXPECT_FLOAT_EQ(y.data<float>()[i], expect);
    kept += ownMask.data<uint8_t>()[i];
  }
  EXPECT_GT(kept, x.numel() / 3);
  EXPECT_LT(kept, x.numel());
  Tensor dx = like(x);
  dropoutBackward(dx, dy, mask, p);
  EXPECT_LT(relErr(dx, get(g + "dx")), kTol);
}

TEST_F(Parity, LayerNorm) {
  const std::string g = "/ops/layernorm/";
  Tensor x = get(g + "x"), w = get(g + "w"), b = get(g + "b"), dy = get(g + "dy");
  Tensor y = like(x), dx = like(x), dw = like(w), db = like(b);
  Tensor mean = Tensor::empty({x.dim(0)}, DType::kF32), rstd = Tensor::empty({x.dim(0)}, DType::kF32);
  layerNormForward(y, &mean, &rstd, x, w, b, 1e-5f);
  layerNormBackward(dx, dw, db, dy, x, w, mean, rstd);
  EXPECT_LT(relErr(y, get(g + "y")), kTol);
  EXPECT_LT(relErr(dx, get(g + "dx")), kTol);
  EXPECT_LT(relErr(dw, get(g + "dw")), kTol);
  EXPECT_LT(relErr(db, get(g + "db")), kTol);
}

TEST_F(Parity, CrossEntropy) {
  const std::string g = "/ops/cross_entropy/";
  Tensor z = get(g + "z"), t = get(g + "t");
  Tensor dz = like(z);
  LossStats s = softmaxCrossEntropy(z, t, &dz, 1.f);
  EXPECT_EQ(s.count, 8);
  EXPECT_NEAR(s.meanLoss(), get(g + "loss").data<float>()[0], kTol * std::fabs(get(g + "loss").data<float>()[0]));
  EXPECT_LT(relErr(dz, get(g + "dz")), kTol);
}

TEST_F(Parity, Embedding) {
  const std::string g = "/ops/embedding/";
  Tensor w = get(g + "w"), idx = get(g + "idx"), dy = get(g + "dy");
  Tensor y = like(get(g + "y")), dw = like(w);
  embeddingForward(y, idx, w);
  embeddingBackward(dw, dy, idx);
  EXPECT_LT(relErr(y, get(g + "y")), kTol);
  EXPECT_LT(relErr(dw, get(g + "dw")), kTol);
}

// 20 steps of training from PyTorch's initial weights on PyTorch's batches.
class TrainParity : public Parity, public ::testing::WithParamInterface<std::string> {};

TEST_P(TrainParity, TwentySteps) {
  const std::string name = GetParam();
  const std::string g = "/train/" + name + "/";
  ModelConfig mc;
  InputSpec in;
  std::unique_ptr<Sequential> model;
  if (name.rfind("mlp", 0) == 0) {
    mc.hidden = {64, 32};
    model = buildMlp(mc, in);
  } else {
    mc.convChannels = {8, 16};
    mc.fc = 32;
    mc.layout = name.find("nchw") != std::string::npos ? Layout::kNCHW : Layout::kNHWC;
    model = buildCnn(mc, in);
  }
  ParamTable& params = model->params();
  params.materialize(Device::cpu());
  for (size_t i = 0; i < params.size(); ++i) params[i].value.copyFrom(get(g + "init/" + params[i].name));

  OptimConfig oc;
  oc.type = file_->readStringAttribute(g, "optimizer");
  oc.weightDecay = oc.type == "adamw" ? 0.01f : 1e-4f;
  oc.momentum = 0.9f;
  auto opt = makeOptimizer(oc, segmentsOf(params));
  LrSchedule sched;
  sched.kind = "cosine";
  Tensor x = get(g + "x"), y = get(g + "y"), losses = get(g + "losses");
  const int64_t steps = x.dim(0), batch = x.dim(1);
  sched.totalSteps = steps;
  sched.baseLr = oc.type == "adamw" ? 1e-3f : 0.05f;
  sched.warmupSteps = oc.type == "adamw" ? 5 : 3;
  sched.minLr = oc.type == "adamw" ? 1e-4f : 0.005f;
  const float clip = name == "mlp_adamw" ? 1.0f : name == "cnn_nchw_adamw" ? 0.5f : 0.f;
  double worst = 0.0;
  for (int64_t s = 0; s < steps; ++s) {
    Batch b;
    b.inputs = x.narrow(0, s, 1).view({batch, 28, 28, 1});
    b.targets = y.narrow(0, s, 1).view({batch});
    Context ctx;
    ctx.step = s;
    params.zeroGrads();
    LossStats st = model->forward(b, ctx);
    model->backward(ctx);
    if (clip > 0) clipGradNorm(opt->segments(), clip);
    opt->step(sched.at(s));
    const double ref = losses.data<double>()[s];
    const double err = std::fabs(st.meanLoss() - ref) / std::fabs(ref);
    worst = std::max(worst, err);
    EXPECT_LT(err, kTol) << name << " step " << s;
  }
  std::printf("%s: worst loss relative error over %lld steps %.2e\n", name.c_str(), static_cast<long long>(steps),
              worst);
  // Weights after 20 steps: Adam turns the last-bit differences of near-zero gradients into
  // +-lr steps (m/sqrt(v) is their sign), so weights are held to 1e-4 while the losses hold 1e-5.
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LT(relErr(params[i].value, get(g + "final/" + params[i].name)), 10 * kTol) << name << " " << params[i].name;
}
INSTANTIATE_TEST_SUITE_P(Models, TrainParity,
                         ::testing::Values("mlp_adamw", "mlp_sgd", "cnn_nhwc_sgd", "cnn_nchw_adamw"));

// GPT-2 (2 layers, 4 heads, 32 channels, vocabulary 65 padded to 128): 10 AdamW steps.
TEST_F(Parity, GptTenSteps) {
  Tensor cfgT = get("/gpt/losses");  // presence
  GptConfig c;
  c.vocab = 65, c.paddedVocab = 128, c.maxT = 16, c.layers = 2, c.heads = 4, c.channels = 32;
  c.classifierChunk = 24;  // several chunks, one partial
  Gpt model(c);
  ParamTable& params = model.params();
  params.materialize(Device::cpu());
  for (size_t i = 0; i < params.size(); ++i) params[i].value.copyFrom(get("/gpt/init/" + params[i].name));
  OptimConfig oc;
  oc.weightDecay = 0.1f;
  oc.beta2 = 0.95f;
  auto opt = makeOptimizer(oc, segmentsOf(params));
  Tensor tokens = get("/gpt/tokens"), losses = get("/gpt/losses");
  const int64_t steps = tokens.dim(0), B = tokens.dim(1), T = tokens.dim(2) - 1;
  double worst = 0;
  for (int64_t s = 0; s < steps; ++s) {
    Batch b;
    b.inputs = Tensor::empty({B, T}, DType::kI32);
    b.targets = Tensor::empty({B, T}, DType::kI64);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t t = 0; t < T; ++t) {
        b.inputs.data<int32_t>()[i * T + t] = tokens.data<int32_t>()[(s * B + i) * (T + 1) + t];
        b.targets.data<int64_t>()[i * T + t] = tokens.data<int32_t>()[(s * B + i) * (T + 1) + t + 1];
      }
    Context ctx;
    params.zeroGrads();
    LossStats st = model.forward(b, ctx);
    model.backward(ctx);
    opt->step(1e-3f);
    const double ref = losses.data<double>()[s];
    const double err = std::fabs(st.meanLoss() - ref) / ref;
    worst = std::max(worst, err);
    EXPECT_LT(err, kTol) << "step " << s;
  }
  std::printf("gpt: worst loss relative error over %lld steps %.2e\n", static_cast<long long>(steps), worst);
}

}  // namespace
}  // namespace mt
