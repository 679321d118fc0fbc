// GPU against CPU: every op's forward and backward, the optimizers, and 20 training steps of the
// mlp and cnn. f32 (strict FP32 GEMMs and FMA convolutions): relative error < 1e-4; bf16 matmul
// precision: < 2e-2.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/EnvParams.h"
#include "core/Fp8.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "data/H5File.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"
#include "models/layers/Activation.h"
#include "models/layers/Attention.h"
#include "models/layers/Conv2d.h"
#include "models/layers/Dropout.h"
#include "models/layers/Embedding.h"
#include "models/layers/ImageInput.h"
#include "models/layers/LayerNorm.h"
#include "models/layers/Linear.h"
#include "models/layers/MaxPool2d.h"
#include "models/layers/Precision.h"
#include "models/layers/SoftmaxCrossEntropy.h"
#include "core/optim/GradClip.h"
#include "core/optim/LossScaler.h"
#include "core/optim/LrSchedule.h"
#include "core/optim/Optimizer.h"
#include "tests/common/TestUtil.h"
#include "tests/models/GptTraining.h"

namespace mt {
namespace {

using test::randomTensor;
using test::relErr;
constexpr double kF32 = 1e-4, kBF16 = 2e-2;
const Device kGpu = Device::cuda(0);

Tensor gpu(const Tensor& t) { return t.to(kGpu); }
Tensor zerosLike(const Tensor& t, Device d) { return Tensor::zeros(t.shape(), t.dtype(), d); }
// A GPU tensor full of NaN: elements a kernel fails to write fail the comparison.
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (dtype == DType::kU8) memset(t.rawData(), 0xA5, static_cast<size_t>(t.numel()));  // a code no test expects everywhere
  else t.fill_(std::nanf(""));
  return t.to(kGpu);
}

class PrecisionScope {
 public:
  explicit PrecisionScope(MatmulPrecision p) : prev_(CudaRuntime::require().matmulPrecision()) {
    CudaRuntime::require().setMatmulPrecision(p);
  }
  ~PrecisionScope() { CudaRuntime::require().setMatmulPrecision(prev_); }

 private:
  MatmulPrecision prev_;
};

void linearCase(MatmulPrecision p, double tol) {
  PrecisionScope scope(p);
  Tensor x = randomTensor({67, 130}, 1), w = randomTensor({45, 130}, 2, 0.1f), b = randomTensor({45}, 3);
  Tensor dy = randomTensor({67, 45}, 4);
  Tensor y = zerosLike(dy, Device::cpu()), dx = zerosLike(x, Device::cpu()), dw = zerosLike(w, Device::cpu()),
         db = zerosLike(b, Device::cpu());
  linearForward(y, x, w, &b);
  linearBackward(&dx, dw, &db, dy, x, w);
  Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b), gdy = gpu(dy);
  Tensor gy = zerosLike(y, kGpu), gdx = zerosLike(x, kGpu), gdw = zerosLike(w, kGpu), gdb = zerosLike(b, kGpu);
  linearForward(gy, gx, gw, &gb);
  linearBackward(&gdx, gdw, &gdb, gdy, gx, gw);
  EXPECT_LT(relErr(gy, y), tol);
  EXPECT_LT(relErr(gdx, dx), tol);
  EXPECT_LT(relErr(gdw, dw), tol);
  EXPECT_LT(relErr(gdb, db), tol);
}
TEST(GpuParity, LinearF32) { linearCase(MatmulPrecision::kF32, kF32); }
// Residual fused into the GEMM (C input, beta = 1); bf16 output with a bf16-cast bias; bf16
// input gradient.
TEST(GpuParity, LinearResidualAndReducedPrecisionIO) {
  PrecisionScope scope(MatmulPrecision::kBF16);
  Tensor x = randomTensor({67, 128}, 21), w = randomTensor({48, 128}, 22, 0.1f), b = randomTensor({48}, 23);
  Tensor res = randomTensor({67, 48}, 24), dy = randomTensor({67, 48}, 25);
  Tensor y = zerosLike(res, Device::cpu()), y0 = zerosLike(res, Device::cpu()), dx = zerosLike(x, Device::cpu()),
         dw = zerosLike(w, Device::cpu());
  linearForward(y, x, w, &b, &res);
  linearForward(y0, x, w, &b);
  linearBackward(&dx, dw, nullptr, dy, x, w);
  Tensor gb = gpu(b), gres = gpu(res);
  Tensor gy = zerosLike(res, kGpu), gdw = zerosLike(w, kGpu);
  linearForward(gy, gpu(x), gpu(w), &gb, &gres);
  EXPECT_LT(relErr(gy, y), kBF16);
  Tensor gy16 = Tensor::empty(res.shape(), DType::kBF16, kGpu);
  linearForward(gy16, gpu(x), gpu(w), &gb);
  EXPECT_LT(relErr(gy16, y0), kBF16);
  Tensor gdx16 = Tensor::empty(x.shape(), DType::kBF16, kGpu);
  linearBackward(&gdx16, gdw, nullptr, gpu(dy), gpu(x), gpu(w));
  EXPECT_LT(relErr(gdx16, dx), kBF16);
  EXPECT_LT(relErr(gdw, dw), kBF16);
}
TEST(GpuParity, LinearBF16) { linearCase(MatmulPrecision::kBF16, kBF16); }
TEST(GpuParity, LinearF16) { linearCase(MatmulPrecision::kF16, kBF16); }

// GPT-2's MLP: fc with the tanh GELU in cuBLASLt's GELU_AUX_BIAS epilogue, fcProj's input gradient
// with the DGELU epilogue (widths that are multiples of 8), and the separate-kernel fallback
// (width 44), against the CPU's GEMM-then-GELU.
TEST(GpuParity, LinearGeluEpilogues) {
  PrecisionScope scope(MatmulPrecision::kBF16);
  for (int64_t H : {256, 44}) {
    Tensor x = randomTensor({67, 128}, 71), w = randomTensor({H, 128}, 72, 0.1f), b = randomTensor({H}, 73);
    Tensor w2 = randomTensor({48, H}, 74, 0.1f), dy = randomTensor({67, 48}, 75);
    Tensor y = Tensor::zeros({67, H}, DType::kF32), pre = Tensor::zeros({67, H}, DType::kF32);
    linearGeluForward(y, pre, x, w, &b);
    Tensor dpre = Tensor::zeros({67, H}, DType::kF32), dw2 = zerosLike(w2, Device::cpu()),
           db2 = Tensor::zeros({48}, DType::kF32);
    linearBackwardDGelu(dpre, dw2, &db2, dy, y, w2, pre);
    Tensor gy = poisoned({67, H}, DType::kBF16), gpre = poisoned({67, H}, DType::kBF16);
    Tensor gb = gpu(b);
    linearGeluForward(gy, gpre, gpu(x), gpu(w), &gb);
    EXPECT_LT(relErr(gpre, pre), kBF16) << H;
    EXPECT_LT(relErr(gy, y), kBF16) << H;
    // Backward from the CPU's own activations (rounded to bf16 as the GPU keeps them).
    Tensor gdpre = poisoned({67, H}, DType::kBF16), gdw2 = zerosLike(w2, kGpu),
           gdb2 = Tensor::zeros({48}, DType::kF32, kGpu);
    Tensor gpre16 = castTo(gpu(pre), DType::kBF16), gy16 = castTo(gpu(y), DType::kBF16);
    linearBackwardDGelu(gdpre, gdw2, &gdb2, castTo(gpu(dy), DType::kBF16), gy16, gpu(w2), gpre16);
    EXPECT_LT(relErr(gdpre, dpre), kBF16) << H;
    EXPECT_LT(relErr(gdw2, dw2), kBF16) << H;
    EXPECT_LT(relErr(gdb2, db2), kBF16) << H;
  }
}

// O = 10: the scalar NHWC bias-gradient kernel; O = 32 with N = 40 (7 800 output positions: 121
// blocks of 32 rows per pass, so every block strides twice or more): the float4 one.
void convCase(Layout layout, int64_t k, int64_t s, int64_t pad, MatmulPrecision p, double tol, int64_t O = 10,
              int64_t N = 4, int64_t C = 6, bool relu = false) {
  PrecisionScope scope(p);
  Shape xs = layout == Layout::kNCHW ? Shape{N, C, 15, 13} : Shape{N, 15, 13, C};
  Tensor x = randomTensor(xs, 11);
  Conv2dGeometry g = Conv2dGeometry::make(layout, xs, O, k, s, pad);
  Shape ws = layout == Layout::kNCHW ? Shape{O, C, k, k} : Shape{O, k, k, C};
  Shape ys = layout == Layout::kNCHW ? Shape{N, O, g.OH, g.OW} : Shape{N, g.OH, g.OW, O};
  Tensor w = randomTensor(ws, 12, 0.2f), b = randomTensor({O}, 13), dy = randomTensor(ys, 14);
  Tensor col = Tensor::empty({g.positions() * g.K()}, DType::kF32);
  Tensor y = Tensor::zeros(ys, DType::kF32), dx = zerosLike(x, Device::cpu()), dw = zerosLike(w, Device::cpu()),
         db = randomTensor({O}, 15);  // the bias gradient accumulates
  conv2dForward(y, col, x, w, &b, g, relu);
  conv2dBackward(&dx, dw, &db, dy, x, col, w, g);
  Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b), gdy = gpu(dy), none;
  Tensor gy = zerosLike(y, kGpu), gdx = zerosLike(x, kGpu), gdw = zerosLike(w, kGpu), gdb = gpu(randomTensor({O}, 15));
  conv2dForward(gy, none, gx, gw, &gb, g, relu);
  conv2dBackward(&gdx, gdw, &gdb, gdy, gx, none, gw, g);
  EXPECT_LT(relErr(gy, y), tol) << layoutName(layout);
  EXPECT_LT(relErr(gdx, dx), tol) << layoutName(layout);
  EXPECT_LT(relErr(gdw, dw), tol) << layoutName(layout);
  EXPECT_LT(relErr(gdb, db), tol) << layoutName(layout);
}
TEST(GpuParity, ConvF32) {
  for (Layout l : {Layout::kNCHW, Layout::kNHWC}) {
    convCase(l, 3, 1, 1, MatmulPrecision::kF32, kF32);
    convCase(l, 3, 2, 0, MatmulPrecision::kF32, kF32);
    convCase(l, 5, 1, 2, MatmulPrecision::kF32, kF32);
    convCase(l, 3, 1, 1, MatmulPrecision::kF32, kF32, /*O=*/32, /*N=*/40, /*C=*/1);
    // The fused ReLU (cudnnConvolutionBiasActivationForward) against the CPU's conv then ReLU.
    convCase(l, 3, 1, 1, MatmulPrecision::kF32, kF32, /*O=*/32, /*N=*/6, /*C=*/8, /*relu=*/true);
    // Single-channel stems (NHWC: our kernels for forward and the weight/bias gradients).
    convCase(l, 3, 1, 1, MatmulPrecision::kF32, kF32, /*O=*/32, /*N=*/40, /*C=*/1, /*relu=*/true);
    convCase(l, 5, 1, 2, MatmulPrecision::kF32, kF32, /*O=*/16, /*N=*/9, /*C=*/1);
  }
}
TEST(GpuParity, ConvBF16) {
  for (Layout l : {Layout::kNCHW, Layout::kNHWC}) {
    convCase(l, 3, 1, 1, MatmulPrecision::kBF16, kBF16);
    convCase(l, 3, 1, 1, MatmulPrecision::kBF16, kBF16, /*O=*/32, /*N=*/6, /*C=*/8, /*relu=*/true);
  }
}

// Shapes for both kernel pairs: the generic one (NCHW, overlapping windows k = 3, C = 5) and the
// vectorised NHWC one (k = stride = 2, C a multiple of 4), with H, W odd (inputs in no window) and
// even; the GPU outputs start poisoned so an unwritten element fails.
TEST(GpuParity, MaxPool) {
  for (Layout l : {Layout::kNCHW, Layout::kNHWC})
    for (int64_t C : {5, 8, 32})
      for (int64_t H : {11, 12})
        for (int64_t k : {2, 3}) {
          const int64_t W = H - 2;
          Shape xs = l == Layout::kNCHW ? Shape{3, C, H, W} : Shape{3, H, W, C};
          Tensor x = randomTensor(xs, 21);
          PoolGeometry g = PoolGeometry::make(l, xs, k, 2);
          Shape ys = l == Layout::kNCHW ? Shape{3, C, g.OH, g.OW} : Shape{3, g.OH, g.OW, C};
          Tensor dy = randomTensor(ys, 22);
          Tensor y = Tensor::zeros(ys, DType::kF32), arg = Tensor::empty(ys, DType::kI32),
                 dx = zerosLike(x, Device::cpu());
          maxPool2dForward(y, &arg, x, g);
          maxPool2dBackward(dx, dy, arg, g);
          Tensor gy = poisoned(ys, DType::kF32), garg = Tensor::empty(ys, DType::kI32, kGpu),
                 gdx = poisoned(xs, DType::kF32);
          Tensor gx = gpu(x);
          maxPool2dForward(gy, &garg, gx, g);
          maxPool2dBackward(gdx, gpu(dy), garg, g);
          EXPECT_EQ(relErr(gy, y), 0.0) << layoutName(l) << " C=" << C << " H=" << H << " k=" << k;
          EXPECT_LT(relErr(gdx, dx), 1e-6) << layoutName(l) << " C=" << C << " H=" << H << " k=" << k;
        }
}

TEST(GpuParity, Elementwise) {
  Tensor x = randomTensor({33, 77}, 31, 4.f), dy = randomTensor({33, 77}, 32);
  Tensor gx = gpu(x), gdy = gpu(dy);
  Tensor y = zerosLike(x, Device::cpu()), dx = zerosLike(x, Device::cpu());
  Tensor gy = zerosLike(x, kGpu), gdx = zerosLike(x, kGpu);
  reluForward(y, x);
  reluBackward(dx, dy, y);
  reluForward(gy, gx);
  reluBackward(gdx, gdy, gy);
  EXPECT_EQ(relErr(gy, y), 0.0);
  EXPECT_EQ(relErr(gdx, dx), 0.0);
  for (GeluKind k : {GeluKind::kTanh, GeluKind::kErf}) {
    geluForward(y, x, k);
    geluBackward(dx, dy, x, k);
    geluForward(gy, gx, k);
    geluBackward(gdx, gdy, gx, k);
    EXPECT_LT(relErr(gy, y), 1e-6);
    EXPECT_LT(relErr(gdx, dx), 1e-6);
  }
  // Dropout: the same Philox mask on both devices.
  Tensor m = Tensor::empty(x.shape(), DType::kU8), gm = Tensor::empty(x.shape(), DType::kU8, kGpu);
  dropoutForward(y, m, x, 0.3f, 99, dropoutStream(7, 2));
  dropoutForward(gy, gm, gx, 0.3f, 99, dropoutStream(7, 2));
  EXPECT_EQ(std::memcmp(gm.to(Device::cpu()).rawData(), m.rawData(), m.nbytes()), 0);
  EXPECT_LT(relErr(gy, y), 1e-7);
  dropoutBackward(dx, dy, m, 0.3f);
  dropoutBackward(gdx, gdy, gm, 0.3f);
  EXPECT_LT(relErr(gdx, dx), 1e-7);
}

TEST(GpuParity, LayerNormSoftmaxEmbeddingImageInput) {
  // (rows, C): 17 and 3000 take the generic kernels; 768, 1024 and 264 (C/8 not a multiple of 32)
  // the warp-per-row ones with the normalised row kept in registers, 1032 (C/8 = 129: one lane with
  // a fifth chunk), 1600 (GPT-2 XL) and 2048 the ones that make it again from x; with rows enough
  // that every warp of the backward walks several and several blocks add partials (2600 rows: 82
  // blocks of 4 rows a warp).
  for (auto [N, C] : std::vector<std::pair<int64_t, int64_t>>{{41, 17}, {41, 768}, {41, 3000}, {2600, 768},
                                                               {300, 1024}, {517, 264}, {300, 1032},
                                                               {2600, 1600}, {300, 2048}}) {
    Tensor x = randomTensor({N, C}, 41, 3.f), w = randomTensor({C}, 42), b = randomTensor({C}, 43);
    Tensor dy = randomTensor({N, C}, 44);
    Tensor y = zerosLike(x, Device::cpu()), dx = zerosLike(x, Device::cpu()), dw = zerosLike(w, Device::cpu()),
           db = zerosLike(b, Device::cpu()), mean = Tensor::empty({N}, DType::kF32), rstd = Tensor::empty({N}, DType::kF32);
    layerNormForward(y, &mean, &rstd, x, w, b, 1e-5f);
    layerNormBackward(dx, dw, db, dy, x, w, mean, rstd);
    Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b);
    Tensor gy = poisoned(x.shape(), DType::kF32), gdx = poisoned(x.shape(), DType::kF32), gdw = zerosLike(w, kGpu),
           gdb = zerosLike(b, kGpu), gmean = Tensor::empty({N}, DType::kF32, kGpu),
           grstd = Tensor::empty({N}, DType::kF32, kGpu);
    layerNormForward(gy, &gmean, &grstd, gx, gw, gb, 1e-5f);
    layerNormBackward(gdx, gdw, gdb, gpu(dy), gx, gw, gmean, grstd);
    // The residual form: dx + r in one pass.
    Tensor r = randomTensor({N, C}, 45), dxr = zerosLike(x, Device::cpu()), gdxr = zerosLike(x, kGpu);
    Tensor scratchW = zerosLike(w, kGpu), scratchB = zerosLike(b, kGpu), gr = gpu(r);
    layerNormBackward(gdxr, scratchW, scratchB, gpu(dy), gx, gw, gmean, grstd, &gr);
    for (int64_t i = 0; i < dx.numel(); ++i) dxr.data<float>()[i] = dx.data<float>()[i] + r.data<float>()[i];
    EXPECT_LT(relErr(gdxr, dxr), kF32) << N << "x" << C;
    // bf16 output (the next GEMM's input in reduced precision).
    Tensor gy16 = Tensor::empty(x.shape(), DType::kBF16, kGpu);
    layerNormForward(gy16, nullptr, nullptr, gx, gw, gb, 1e-5f);
    EXPECT_LT(relErr(gy16, y), kBF16) << N << "x" << C;
    EXPECT_LT(relErr(gy, y), kF32) << N << "x" << C;
    EXPECT_LT(relErr(gdx, dx), kF32) << N << "x" << C;
    EXPECT_LT(relErr(gdw, dw), kF32) << N << "x" << C;
    EXPECT_LT(relErr(gdb, db), kF32) << N << "x" << C;
  }
  {
    // LayerNorm backward from a bf16 gradient (a GEMM's input gradient), also writing dx in bf16.
    const int64_t C = 768;
    Tensor x = randomTensor({41, C}, 46, 3.f), w = randomTensor({C}, 47), b = randomTensor({C}, 48);
    Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b), gmean = Tensor::empty({41}, DType::kF32, kGpu),
           grstd = Tensor::empty({41}, DType::kF32, kGpu), gy = zerosLike(x, kGpu);
    layerNormForward(gy, &gmean, &grstd, gx, gw, gb, 1e-5f);
    Tensor dy16 = castTo(gpu(randomTensor({41, C}, 49)), DType::kBF16);
    Tensor dyRounded = castTo(dy16, DType::kF32).to(Device::cpu());
    Tensor mean = gmean.to(Device::cpu()), rstd = grstd.to(Device::cpu());
    Tensor r = randomTensor({41, C}, 50);
    Tensor dx = zerosLike(x, Device::cpu()), dw = zerosLike(w, Device::cpu()), db = zerosLike(b, Device::cpu());
    layerNormBackward(dx, dw, db, dyRounded, x, w, mean, rstd, &r);
    Tensor gdx = zerosLike(x, kGpu), gdw = zerosLike(w, kGpu), gdb = zerosLike(b, kGpu),
           gdxLow = poisoned(x.shape(), DType::kBF16), gr = gpu(r);
    layerNormBackward(gdx, gdw, gdb, dy16, gx, gw, gmean, grstd, &gr, &gdxLow);
    EXPECT_LT(relErr(gdx, dx), kF32);
    EXPECT_LT(relErr(gdw, dw), kF32);
    EXPECT_LT(relErr(gdb, db), kF32);
    EXPECT_LT(relErr(gdxLow, dx), 1e-2);
  }
  // bf16 logits in place, padded rows, through the shared-memory kernel: (rows, stride, classes);
  // GPT-2's row (50,304 padded, 50,257 classes) takes all eight cp.async loads of each thread.
  for (auto [N, S, K] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{37, 1024, 1003}, {9, 50304, 50257}}) {
    Tensor z = randomTensor({N, S}, 52, 5.f), t = Tensor::empty({N}, DType::kI64);
    for (int i = 0; i < N; ++i) t.data<int64_t>()[i] = i == 7 ? kIgnoreIndex : (i * 173 + 11) % K;
    Tensor gz16 = castTo(gpu(z), DType::kBF16);
    Tensor zr = castTo(gz16, DType::kF32).to(Device::cpu());
    Tensor zc = Tensor::empty({N, K}, DType::kF32);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < K; ++j) zc.data<float>()[i * K + j] = zr.data<float>()[i * S + j];
    Tensor dzc = zerosLike(zc, Device::cpu());
    LossStats c = softmaxCrossEntropy(zc, t, &dzc, 1.f);
    LossStats g = softmaxCrossEntropy(gz16, t, &gz16, 1.f, -1, K);
    EXPECT_EQ(g.count, c.count) << S;
    EXPECT_EQ(g.correct, c.correct) << S;
    EXPECT_NEAR(g.lossSum, c.lossSum, 1e-4 * std::fabs(c.lossSum)) << S;
    Tensor gd = castTo(gz16, DType::kF32).to(Device::cpu()), gdc = zerosLike(zc, Device::cpu());
    double padAbs = 0;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < K; ++j) gdc.data<float>()[i * K + j] = gd.data<float>()[i * S + j];
      for (int64_t j = K; j < S; ++j) padAbs += std::fabs(gd.data<float>()[i * S + j]);
    }
    EXPECT_LT(relErr(gdc, dzc), kBF16) << S;
    EXPECT_EQ(padAbs, 0.0) << S;  // padded columns get a zero gradient
  }
  Tensor z = randomTensor({37, 1003}, 51, 5.f), t = Tensor::empty({37}, DType::kI64);
  for (int i = 0; i < 37; ++i) t.data<int64_t>()[i] = i == 5 ? kIgnoreIndex : (i * 131) % 1003;
  Tensor dz = zerosLike(z, Device::cpu()), gdz = zerosLike(z, kGpu);
  LossStats c = softmaxCrossEntropy(z, t, &dz, 1.f);
  LossStats g = softmaxCrossEntropy(gpu(z), t, &gdz, 1.f);
  EXPECT_EQ(g.count, c.count);
  EXPECT_EQ(g.correct, c.correct);
  EXPECT_NEAR(g.lossSum, c.lossSum, 1e-5 * std::fabs(c.lossSum));
  EXPECT_LT(relErr(gdz, dz), kF32);
  Tensor bad = t.clone();
  bad.data<int64_t>()[3] = 5000;
  EXPECT_THROW(softmaxCrossEntropy(gpu(z), bad, nullptr, 1.f), DataError);

  Tensor ew = randomTensor({50, 24}, 61), idx = Tensor::empty({3, 7}, DType::kI32);
  for (int i = 0; i < 21; ++i) idx.data<int32_t>()[i] = (i * 7) % 13;  // repeats
  Tensor ey = Tensor::zeros({3, 7, 24}, DType::kF32), edy = randomTensor({3, 7, 24}, 62), edw = zerosLike(ew, Device::cpu());
  embeddingForward(ey, idx, ew);
  embeddingBackward(edw, edy, idx);
  Tensor gey = zerosLike(ey, kGpu), gedw = zerosLike(ew, kGpu);
  Tensor gew = gpu(ew), gidx = gpu(idx);
  embeddingForward(gey, gidx, gew);
  embeddingBackward(gedw, gpu(edy), gidx);
  EXPECT_EQ(relErr(gey, ey), 0.0);
  EXPECT_LT(relErr(gedw, edw), 1e-6);

  Tensor img = Tensor::empty({5, 9, 7, 3}, DType::kU8);
  for (int64_t i = 0; i < img.numel(); ++i) img.data<uint8_t>()[i] = static_cast<uint8_t>(i * 37);
  for (ImageOutput o : {ImageOutput::kNHWC, ImageOutput::kNCHW, ImageOutput::kFlat}) {
    Tensor a = Tensor::empty({5 * 9 * 7 * 3}, DType::kF32), ga = Tensor::empty({5 * 9 * 7 * 3}, DType::kF32, kGpu);
    imageInputForward(a, img, 0.3f, 0.4f, o);
    imageInputForward(ga, gpu(img), 0.3f, 0.4f, o);
    EXPECT_LT(relErr(ga, a), 1e-6);
  }
}

TEST(GpuParity, OptimizersAndGradUtilities) {
  for (const char* type : {"adamw", "sgd"}) {
    std::vector<OptimSegment> cpu, dev;
    std::vector<Tensor> keep;
    for (int i = 0; i < 60; ++i) {  // more segments than one multi-tensor launch holds
      const int64_t n = 1 + (i * 977) % 9000;
      Tensor p = randomTensor({n}, 100 + i), g = randomTensor({n}, 200 + i);
      cpu.push_back({p, g, i % 3 != 0});
      dev.push_back({gpu(p), gpu(g), i % 3 != 0});
    }
    OptimConfig oc;
    oc.type = type;
    oc.weightDecay = 0.1f;
    auto oc1 = makeOptimizer(oc, cpu), oc2 = makeOptimizer(oc, dev);
    for (int s = 0; s < 3; ++s) {
      oc1->step(1e-2f);
      oc2->step(1e-2f);
    }
    for (size_t i = 0; i < cpu.size(); ++i) ASSERT_LT(relErr(dev[i].value, cpu[i].value), 1e-6) << type << " " << i;
    EXPECT_NEAR(sumOfSquares(dev), sumOfSquares(cpu), 1e-9 * sumOfSquares(cpu));
    EXPECT_NEAR(clipGradNorm(dev, 1.f), clipGradNorm(cpu, 1.f), 1e-6);
    EXPECT_LT(relErr(dev[7].grad, cpu[7].grad), 1e-6);
    EXPECT_LT(relErr(dev[55].grad, cpu[55].grad), 1e-6);  // in the second launch table
  }
}

// The sync-free clip (factor computed on the device) scales exactly as the host path does, and
// leaves gradients whose norm is under the bound alone.
TEST(GpuParity, ClipInPlaceMatchesHostClip) {
  for (float maxNorm : {1.f, 1e6f}) {
    std::vector<OptimSegment> host, dev;
    for (int i = 0; i < 60; ++i) {  // two launch tables
      const int64_t n = 1 + (i * 611) % 7000;
      Tensor p = randomTensor({n}, 300 + i), g = randomTensor({n}, 400 + i);
      host.push_back({gpu(p), gpu(g), true});
      dev.push_back({gpu(p), gpu(g), true});
    }
    Tensor before = dev[55].grad.to(Device::cpu());
    clipGradNorm(host, maxNorm);  // reads the norm back, scales on the host's factor
    clipGradNormInPlace(dev, maxNorm);
    for (size_t i = 0; i < dev.size(); ++i) {
      Tensor a = dev[i].grad.to(Device::cpu()), b = host[i].grad.to(Device::cpu());
      ASSERT_EQ(0, std::memcmp(a.rawData(), b.rawData(), a.nbytes())) << "segment " << i << " max " << maxNorm;
    }
    Tensor after = dev[55].grad.to(Device::cpu());
    if (maxNorm > 1e5f) EXPECT_EQ(0, std::memcmp(before.rawData(), after.rawData(), before.nbytes()));
    else EXPECT_GT(relErr(after, before), 0.5);  // the norm of ~190k uniform values is far above 1
  }
}

TEST(GpuParity, LossScalerSkipsInfSteps) {
  Tensor g = gpu(randomTensor({1000}, 5));
  std::vector<OptimSegment> segs = {{gpu(randomTensor({1000}, 6)), g, true}};
  LossScaler scaler;
  EXPECT_TRUE(scaler.unscaleAndCheck(segs, nullptr));
  EXPECT_EQ(scaler.scale(), 65536.f);
  float inf = INFINITY;
  CUDA_CHECK(cudaMemcpy(static_cast<float*>(g.rawData()) + 17, &inf, sizeof(float), cudaMemcpyHostToDevice));
  EXPECT_FALSE(scaler.unscaleAndCheck(segs, nullptr));
  EXPECT_EQ(scaler.scale(), 32768.f);
  EXPECT_EQ(scaler.skippedSteps(), 1);
}

// 20 steps on CPU and GPU from the same weights and batches.
void trainCase(const std::string& type, Layout layout, MatmulPrecision p, double tol) {
  PrecisionScope scope(p);
  ModelConfig mc;
  mc.type = type;
  mc.hidden = {128, 64};
  mc.convChannels = {8, 16};
  mc.fc = 32;
  mc.layout = layout;
  mc.dropout = 0.1f;
  InputSpec in;
  auto cpuModel = buildImageModel(mc, in), gpuModel = buildImageModel(mc, in);
  cpuModel->params().materialize(Device::cpu());
  gpuModel->params().materialize(kGpu);
  cpuModel->initParams(3);
  gpuModel->initParams(3);
  OptimConfig oc;
  auto o1 = makeOptimizer(oc, segmentsOf(cpuModel->params())), o2 = makeOptimizer(oc, segmentsOf(gpuModel->params()));
  Rng rng(8);
  double worst = 0;
  for (int s = 0; s < 20; ++s) {
    Batch b;
    // Class-dependent smooth patterns plus noise: learnable, so gradients are signal rather than
    // cancellation noise (which Adam would amplify into sign flips on either device).
    b.inputs = Tensor::empty({32, 28, 28, 1}, DType::kU8);
    b.targets = Tensor::empty({32}, DType::kI64);
    for (int n = 0; n < 32; ++n) {
      const int64_t cls = static_cast<int64_t>(rng.below(10));
      b.targets.data<int64_t>()[n] = cls;
      for (int yy = 0; yy < 28; ++yy)
        for (int xx = 0; xx < 28; ++xx) {
          const float v = 128.f + 60.f * std::sin(0.3f * (cls + 1) * xx + 0.2f * yy) + rng.uniform(-60.f, 60.f);
          b.inputs.data<uint8_t>()[(n * 28 + yy) * 28 + xx] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, v)));
        }
    }
    Batch g;
    g.inputs = gpu(b.inputs);
    g.targets = gpu(b.targets);
    Context ctx;
    ctx.step = s;
    ctx.seed = 17;
    cpuModel->params().zeroGrads();
    gpuModel->params().zeroGrads();
    const double lc = cpuModel->forward(b, ctx).meanLoss();
    const double lg = gpuModel->forward(g, ctx).meanLoss();
    cpuModel->backward(ctx);
    gpuModel->backward(ctx);
    o1->step(5e-4f);
    o2->step(5e-4f);
    worst = std::max(worst, std::fabs(lg - lc) / std::fabs(lc));
    if (s % 5 == 4) std::printf("  step %d: cpu loss %.5f gpu loss %.5f\n", s + 1, lc, lg);
  }
  std::printf("%s %s precision %d: worst loss relative difference CPU vs GPU over 20 steps %.2e\n", type.c_str(),
              layoutName(layout), static_cast<int>(p), worst);
  EXPECT_LT(worst, tol);
}
TEST(GpuParity, TrainMlpF32) { trainCase("mlp", Layout::kNHWC, MatmulPrecision::kF32, kF32); }
TEST(GpuParity, TrainCnnNhwcF32) { trainCase("cnn", Layout::kNHWC, MatmulPrecision::kF32, kF32); }
TEST(GpuParity, TrainCnnNchwF32) { trainCase("cnn", Layout::kNCHW, MatmulPrecision::kF32, kF32); }
TEST(GpuParity, TrainMlpBF16) { trainCase("mlp", Layout::kNHWC, MatmulPrecision::kBF16, kBF16); }
TEST(GpuParity, TrainCnnBF16) { trainCase("cnn", Layout::kNHWC, MatmulPrecision::kBF16, kBF16); }

// GPT-2 on the GPU against PyTorch (tests/models/torch_reference.py, f32 on the CPU): the first 10
// training losses from the same weights, f32 < 1e-4 and bf16 < 2e-2.
// group "gpt": head dim 8 (the reference attention path; under auto cuDNN where it runs head dim 8);
// "gpt_d64": head dim 64 (in bf16 the fused kernel `attention` names).
void gptCase(MatmulPrecision p, double tol, const std::string& group = "gpt",
             AttentionBackend attention = AttentionBackend::kAuto) {
  const char* ref = std::getenv("PARITY_REF");
  if (!ref) GTEST_SKIP() << "PARITY_REF not set";
  PrecisionScope scope(p);
  H5File f = H5File::open(ref);
  Tensor cfg = f.readTensor("/" + group + "/config_values");
  const int64_t* cv = cfg.data<int64_t>();  // V, Vp, T, L, H, C, B
  GptConfig c;
  c.vocab = cv[0], c.paddedVocab = cv[1], c.maxT = cv[2], c.layers = cv[3], c.heads = cv[4], c.channels = cv[5];
  c.classifierChunk = 24;
  c.attention = attention;
  Gpt model(c);
  ParamTable& params = model.params();
  params.materialize(kGpu);
  for (size_t i = 0; i < params.size(); ++i)
    params[i].value.copyFrom(f.readTensor("/" + group + "/init/" + params[i].name).to(kGpu));
  OptimConfig oc;
  oc.weightDecay = 0.1f;
  oc.beta2 = 0.95f;
  auto opt = makeOptimizer(oc, segmentsOf(params));
  Tensor tokens = f.readTensor("/" + group + "/tokens"), losses = f.readTensor("/" + group + "/losses");
  const int64_t steps = tokens.dim(0), B = tokens.dim(1), T = tokens.dim(2) - 1;
  double worst = 0;
  for (int64_t s = 0; s < steps; ++s) {
    Batch b;
    Tensor in = Tensor::empty({B, T}, DType::kI32), tg = Tensor::empty({B, T}, DType::kI64);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t t = 0; t < T; ++t) {
        in.data<int32_t>()[i * T + t] = tokens.data<int32_t>()[(s * B + i) * (T + 1) + t];
        tg.data<int64_t>()[i * T + t] = tokens.data<int32_t>()[(s * B + i) * (T + 1) + t + 1];
      }
    b.inputs = gpu(in);
    b.targets = gpu(tg);
    Context ctx;
    params.zeroGrads();
    const double l = model.forward(b, ctx).meanLoss();
    model.backward(ctx);
    opt->step(1e-3f);
    worst = std::max(worst, std::fabs(l - losses.data<double>()[s]) / losses.data<double>()[s]);
  }
  std::printf("%s precision %d, model.attention=%s: worst loss relative difference to PyTorch over 10 steps %.2e\n",
              group.c_str(), static_cast<int>(p), enumName(attentionBackends(), attention), worst);
  EXPECT_LT(worst, tol);
}
TEST(GpuParity, GptF32MatchesPyTorch) { gptCase(MatmulPrecision::kF32, kF32); }
TEST(GpuParity, GptBF16MatchesPyTorch) { gptCase(MatmulPrecision::kBF16, kBF16); }
TEST(GpuParity, GptD64F32MatchesPyTorch) { gptCase(MatmulPrecision::kF32, kF32, "gpt_d64"); }
TEST(GpuParity, GptD64BF16FlashMatchesPyTorch) {
  gptCase(MatmulPrecision::kBF16, kBF16, "gpt_d64", AttentionBackend::kFlash);
}
TEST(GpuParity, GptD64BF16CudnnMatchesPyTorch) {
  gptCase(MatmulPrecision::kBF16, kBF16, "gpt_d64", AttentionBackend::kCudnn);
}

// Flash attention (bf16 operands) against the CPU reference (f32) on fresh random inputs each run,
// GPU outputs poisoned with NaN first: relative L2 error of y and of each of dq, dk, dv < 1e-2.
// Relative L2 error of one of `parts` column blocks; the denominator is at least `floor` (a
// gradient that is exactly zero, as dq and dk at T = 1, is judged against the scale of dy).
double partErr(const Tensor& gpuT, const Tensor& cpuT, int64_t parts, int64_t part, double floor = 0) {
  Tensor g = gpuT.to(Device::cpu());
  const float* a = g.data<float>();
  const float* b = cpuT.data<float>();
  const int64_t row = cpuT.dim(-1), w = row / parts, rows = cpuT.numel() / row;
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = part * w; j < (part + 1) * w; ++j) {
      const double x = a[r * row + j], y = b[r * row + j];
      if (!std::isfinite(x)) return INFINITY;
      num += (x - y) * (x - y);
      den += y * y;
    }
  return std::sqrt(num / std::max(den, std::max(floor * floor, 1e-300)));
}

TEST(GpuParity, FlashAttentionMatchesCpu) {
  PrecisionScope scope(MatmulPrecision::kBF16);
  const uint64_t seed = std::random_device{}();
  std::printf("flash attention: seed %llu\n", static_cast<unsigned long long>(seed));
  for (int64_t T : {1, 17, 1000, 1024, 2048}) {
    for (int64_t D : {64, 128}) {
      const int64_t B = T > 1024 ? 1 : 2, H = 2, C = H * D;
      Tensor qkv = randomTensor({B, T, 3 * C}, seed + T + D, 2.f), dy = randomTensor({B, T, C}, seed + T + D + 1);
      Tensor y = Tensor::empty({B, T, C}, DType::kF32), dqkv = Tensor::empty({B, T, 3 * C}, DType::kF32);
      AttentionSaved saved;
      attentionForward(y, qkv, H, &saved);
      attentionBackward(dqkv, dy, saved, H);
      Tensor poisonY = Tensor::empty(y.shape(), DType::kF32), poisonG = Tensor::empty(dqkv.shape(), DType::kF32);
      poisonY.fill_(NAN);
      poisonG.fill_(NAN);
      Tensor gy = gpu(poisonY), gdqkv = gpu(poisonG);
      AttentionSaved gs;
      attentionForward(gy, gpu(qkv), H, &gs, AttentionBackend::kFlash);
      ASSERT_TRUE(gs.flash()) << "bf16 attention with head dim " << D << " did not take the flash path";
      EXPECT_FALSE(gs.probs.defined());
      attentionBackward(gdqkv, gpu(dy), gs, H);
      double dyNorm = 0;
      for (int64_t i = 0; i < dy.numel(); ++i) dyNorm += static_cast<double>(dy.data<float>()[i]) * dy.data<float>()[i];
      const double floor = 1e-4 * std::sqrt(dyNorm);
      const double ey = partErr(gy, y, 1, 0), eq = partErr(gdqkv, dqkv, 3, 0, floor),
                   ek = partErr(gdqkv, dqkv, 3, 1, floor), ev = partErr(gdqkv, dqkv, 3, 2, floor);
      std::printf("flash attention T=%lld D=%lld: y %.2e dq %.2e dk %.2e dv %.2e\n", static_cast<long long>(T),
                  static_cast<long long>(D), ey, eq, ek, ev);
      EXPECT_LT(ey, 1e-2) << "T=" << T << " D=" << D;
      EXPECT_LT(eq, 1e-2) << "T=" << T << " D=" << D;
      EXPECT_LT(ek, 1e-2) << "T=" << T << " D=" << D;
      EXPECT_LT(ev, 1e-2) << "T=" << T << " D=" << D;
    }
  }
}

// Activation checkpointing on the GPU (f32 reference attention; bf16 and f16 with flash attention at
// head dim 64), weight casts kept (no_shard) or not (sharding): three AdamW steps per mode. The
// recomputed activations are the forward's own bits, but a GPU run is not bitwise repeatable even
// without checkpointing (atomics in flash attention's dq, the embedding backward and the loss
// sum), so the losses and parameters of each mode are held to what two runs without checkpointing
// differ by (x10), at least 1e-5 (f32) or 1e-4 (bf16, f16) relative; each mode keeps less.
// One exception, by design: in bf16/f16 with cuBLASLt's GELU epilogues (MT_GEMM_EPILOGUES >= 1,
// the default) the fc GEMM makes GELU(pre) in its epilogue, and pointwise's backward makes it again
// with the GELU kernel, a bf16 rounding apart, so fcProj's weight gradients differ by that much:
// pointwise's losses are then held to 1e-4 relative and its parameters are not compared (Adam's
// normalised steps magnify a rounding in a near-zero gradient). With MT_GEMM_EPILOGUES=0 both run
// the same kernels and pointwise meets the general bound (H100, 2026-12-05: 2.4e-7 against none
// twice 2.1e-7, when pointwise's forward also ran the GELU kernel).
TEST(GpuParity, GptActivationCheckpointingMatchesNone) {
  auto worstLoss = [](const test::GptRun& a, const test::GptRun& b) {
    double w = 0;
    for (size_t i = 0; i < a.losses.size(); ++i) w = std::max(w, std::fabs(a.losses[i] - b.losses[i]) / b.losses[i]);
    return w;
  };
  auto worst = [&](const test::GptRun& a, const test::GptRun& b) {
    double w = worstLoss(a, b);
    for (size_t i = 0; i < a.values.size(); ++i)
      w = std::max(w, std::fabs(static_cast<double>(a.values[i]) - b.values[i]) / (std::fabs(b.values[i]) + 1e-3));
    return w;
  };
  const bool epilogues = envInt(EnvParam::kGemmEpilogues) >= 1;
  for (MatmulPrecision p : {MatmulPrecision::kF32, MatmulPrecision::kBF16, MatmulPrecision::kF16}) {
    PrecisionScope scope(p);
    GptConfig c;
    c.vocab = 200, c.paddedVocab = 256, c.maxT = 64, c.layers = 3, c.heads = 2, c.channels = 128;
    for (bool casts : {true, false}) {
      c.checkpointing = ActivationCheckpointing::kNone;
      const test::GptRun none = test::trainGpt(c, kGpu, casts, 3, 4), again = test::trainGpt(c, kGpu, casts, 3, 4);
      const double bound = std::max(p == MatmulPrecision::kF32 ? 1e-5 : 1e-4, 10 * worst(again, none));
      for (auto mode : {ActivationCheckpointing::kBlocks, ActivationCheckpointing::kSelective,
                        ActivationCheckpointing::kPointwise}) {
        c.checkpointing = mode;
        const test::GptRun r = test::trainGpt(c, kGpu, casts, 3, 4);
        const bool otherGelu =
            mode == ActivationCheckpointing::kPointwise && p != MatmulPrecision::kF32 && epilogues;
        const double w = otherGelu ? worstLoss(r, none) : worst(r, none);
        std::printf("checkpointing %s, precision %d%s: worst relative difference to none %.2e%s (none twice: %.2e)\n",
                    enumName(activationCheckpointings(), mode), static_cast<int>(p), casts ? ", casts kept" : "", w,
                    otherGelu ? " (losses; GELU kernel vs epilogue)" : "", worst(again, none));
        EXPECT_LE(w, otherGelu ? 1e-4 : bound) << enumName(activationCheckpointings(), mode);
        EXPECT_LT(r.keptBytes, none.keptBytes);
      }
    }
  }
}

// L2 norm of a host vector, and the relative L2 distance of a from b.
double vecNorm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}
double vecRel(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s) / (vecNorm(b) + 1e-30);
}

// Each checkpointing mode's gradients after one forward and backward, parameter by parameter,
// against none's in bf16: a wrong recomputed input shows up as the parameters it feeds, where the
// three-step test above only sees a loss. Every mode's forward is none's, so the losses are equal,
// and the gradients are held to 10x none's run-to-run spread (at least 1e-3 relative L2) but for
// pointwise's fcProj weights under the GELU epilogues, which see the GELU kernel's rounding of what
// the epilogue made (see above): held to 2e-2 (whole-model gradients were within 1e-2 of none on
// the H100 when pointwise's forward ran the GELU kernel too).
TEST(GpuParity, GptCheckpointingGradientsMatchNone) {
  PrecisionScope scope(MatmulPrecision::kBF16);
  GptConfig c;
  c.vocab = 200, c.paddedVocab = 256, c.maxT = 64, c.layers = 2, c.heads = 2, c.channels = 128;
  const test::GptGrads none = test::gptGrads(c, kGpu, 1.f, 4), again = test::gptGrads(c, kGpu, 1.f, 4);
  const bool epilogues = envInt(EnvParam::kGemmEpilogues) >= 1;
  for (auto mode : {ActivationCheckpointing::kBlocks, ActivationCheckpointing::kSelective,
                    ActivationCheckpointing::kPointwise}) {
    c.checkpointing = mode;
    const test::GptGrads g = test::gptGrads(c, kGpu, 1.f, 4);
    EXPECT_EQ(g.loss, none.loss) << enumName(activationCheckpointings(), mode);
    double worstRel = 0;
    for (size_t i = 0; i < g.grads.size(); ++i) {
      const std::string& name = g.grads[i].first;
      const bool otherGelu = mode == ActivationCheckpointing::kPointwise && epilogues &&
                             name.find("mlp.c_proj.weight") != std::string::npos;
      const double e = vecRel(g.grads[i].second, none.grads[i].second),
                   noise = vecRel(again.grads[i].second, none.grads[i].second);
      const double bound = otherGelu ? 2e-2 : std::max(1e-3, 10 * noise);
      worstRel = std::max(worstRel, e);
      EXPECT_LE(e, bound) << enumName(activationCheckpointings(), mode) << " " << g.grads[i].first
                          << " (none twice " << noise << ")";
    }
    std::printf("checkpointing %s: worst gradient relative L2 to none %.2e\n",
                enumName(activationCheckpointings(), mode), worstRel);
  }
}

// The loss scale reaches every GPU gradient exactly once (a kernel that ignored it would return
// 1/S of its gradient after unscaling, one that applied it twice S times), and f16 at GradScaler's
// initial scale loses no more than bf16 against the CPU's f32 gradients. Per parameter: the norm
// ratio to the f32 gradient and the relative L2 error, in bf16 and in f16 at scales 2^16 and 1
// (the second shows what underflow costs when the scale has collapsed).
TEST(GpuParity, GptLossScaleReachesEveryGradientOnce) {
  GptConfig c;
  c.vocab = 200, c.paddedVocab = 256, c.maxT = 64, c.layers = 2, c.heads = 2, c.channels = 128;
  const test::GptGrads ref = test::gptGrads(c, Device::cpu(), 1.f, 4);
  for (auto [p, scale] : {std::pair{MatmulPrecision::kBF16, 65536.f}, {MatmulPrecision::kF16, 65536.f},
                          {MatmulPrecision::kF16, 1.f}}) {
    PrecisionScope scope(p);
    const test::GptGrads g = test::gptGrads(c, kGpu, scale, 4);
    ASSERT_EQ(g.grads.size(), ref.grads.size());
    double worst = 0;
    for (size_t i = 0; i < g.grads.size(); ++i) {
      const std::string& name = ref.grads[i].first;
      const double ratio = vecNorm(g.grads[i].second) / (vecNorm(ref.grads[i].second) + 1e-30);
      const double e = vecRel(g.grads[i].second, ref.grads[i].second);
      worst = std::max(worst, e);
      std::printf("loss scale %g, precision %d: %-22s norm ratio %.4f, relative L2 %.2e\n", scale,
                  static_cast<int>(p), name.c_str(), ratio, e);
      if (scale > 1.f) {
        EXPECT_NEAR(ratio, 1.0, 0.05) << name;
        EXPECT_LE(e, 0.05) << name;
      }
    }
    std::printf("loss scale %g, precision %d: loss %.6f (f32 CPU %.6f), worst relative L2 %.2e\n", scale,
                static_cast<int>(p), g.loss, ref.loss, worst);
  }
}

// Issue 35: f16 training ended 0.04-0.08 nats above bf16 with the loss scale at 65536 and no step
// skipped. f16 keeps 3 mantissa bits more than bf16 in every tensor the GPU stores in the matmul
// dtype, and under that scale GPT's gradients fit f16's range, so at GPT-2's width and sequence
// length (the shapes the small test above does not reach: T = 1024, head dim 64, K = 768 and 3072)
// f16's gradients must be closer to f32's than bf16's, parameter by parameter, with each fused
// attention backend, at the initialisation and after 40 f32 AdamW steps (grown activations). A
// tensor that loses range or precision in f16 only shows here by name.
TEST(GpuParity, GptF16GradientsCloserThanBf16AtGpt2Width) {
  GptConfig c;
  c.vocab = 256, c.paddedVocab = 256, c.maxT = 1024, c.layers = 2, c.heads = 12, c.channels = 768;
  const int64_t B = 4;
  std::vector<float> trained;
  {
    PrecisionScope scope(MatmulPrecision::kF32);
    trained = test::trainGpt(c, kGpu, true, 40, B).values;
  }
  const std::vector<float>* const weights[] = {nullptr, &trained};
  for (const std::vector<float>* values : weights) {
    const char* when = values ? "trained" : "init";
    test::GptGrads ref;
    {
      PrecisionScope scope(MatmulPrecision::kF32);
      ref = test::gptGrads(c, kGpu, 1.f, B, values);
    }
    for (AttentionBackend backend : {AttentionBackend::kFlash, AttentionBackend::kCudnn}) {
      c.attention = backend;
      const char* bname = enumName(attentionBackends(), backend);
      std::vector<double> err[2];
      double loss[2] = {0, 0};
      int k = 0;
      for (MatmulPrecision p : {MatmulPrecision::kBF16, MatmulPrecision::kF16}) {
        PrecisionScope scope(p);
        const test::GptGrads g = test::gptGrads(c, kGpu, 65536.f, B, values);
        ASSERT_EQ(g.grads.size(), ref.grads.size());
        loss[k] = g.loss;
        for (size_t i = 0; i < g.grads.size(); ++i) err[k].push_back(vecRel(g.grads[i].second, ref.grads[i].second));
        ++k;
      }
      std::printf("%s, attention %s: loss f32 %.6f bf16 %+.2e f16 %+.2e\n", when, bname, ref.loss, loss[0] - ref.loss,
                  loss[1] - ref.loss);
      for (size_t i = 0; i < ref.grads.size(); ++i) {
        std::printf("%s, attention %s: %-22s relative L2 bf16 %.2e f16 %.2e (f16/bf16 %.2f)\n", when, bname,
                    ref.grads[i].first.c_str(), err[0][i], err[1][i], err[1][i] / (err[0][i] + 1e-30));
        // cuDNN's f16 backward falls short on the gradients through attention (H100, 2026-12-06: the
        // reason `auto` runs ours in f16); printed above, held to 1.25x bf16's error instead.
        const double bound = backend == AttentionBackend::kCudnn ? 1.25 : 0.5;
        EXPECT_LT(err[1][i], bound * err[0][i]) << when << " " << bname << " " << ref.grads[i].first;
      }
      EXPECT_LT(std::fabs(loss[1] - ref.loss), std::fabs(loss[0] - ref.loss) + 1e-5) << when << " " << bname;
    }
  }
}

// The LayerNorm kernel that writes the next GEMM's FP8 codes itself (layerNormForwardFp8, whatever
// MT_FP8_FUSED says: the model calls it from 2) against
// layerNormForward then fp8Quantize: codes, transposed codes, mean, rstd and the whole scaling state
// bitwise equal, step after step of the delayed recipe (the state's first cast, which needs the
// tensor's own amax, goes the unfused way: the kernel declines it), and the replay (recomputation)
// makes the same codes and leaves the state alone. Shapes: C = 200 (a partial lane set), 768, 1032
// (one lane with a fifth chunk), 1600 (GPT-2 XL: 51 KiB of tile, over the default shared memory);
// outputs rounded to bf16 (GPT's) and kept in f32; amplitudes that move the scale both ways.
TEST(GpuParity, LayerNormIntoFp8MatchesLayerNormThenCast) {
  for (auto [N, C] : std::vector<std::pair<int64_t, int64_t>>{{64, 200}, {256, 768}, {96, 1032}, {2048, 1600}})
    for (DType yType : {DType::kBF16, DType::kF32}) {
      const std::string what = std::to_string(N) + "x" + std::to_string(C) + " " + dtypeName(yType);
      Fp8Options o;
      o.historyLength = 4;
      Fp8State ref(Fp8Format::kE4M3, o, kGpu), fused(Fp8Format::kE4M3, o, kGpu);
      const Tensor w = gpu(randomTensor({C}, 52)), b = gpu(randomTensor({C}, 53));
      const float amps[] = {1.f, 8.f, 0.5f, 40.f, 2.f, 3.f};
      for (int step = 0; step < 6; ++step) {
        const Tensor x = gpu(randomTensor({N, C}, 60 + step, amps[step]));
        Tensor y = Tensor::empty({N, C}, yType, kGpu), mean = Tensor::empty({N}, DType::kF32, kGpu),
               rstd = Tensor::empty({N}, DType::kF32, kGpu);
        layerNormForward(y, &mean, &rstd, x, w, b, 1e-5f);
        Tensor q = Tensor::empty({N, C}, DType::kU8, kGpu), qt = Tensor::empty({C, N}, DType::kU8, kGpu);
        fp8Quantize(q, y, ref, &qt);
        Tensor fq = poisoned({N, C}, DType::kU8), fqt = poisoned({C, N}, DType::kU8);
        Tensor fmean = poisoned({N}, DType::kF32), frstd = poisoned({N}, DType::kF32);
        const bool took = layerNormForwardFp8(x, w, b, &fmean, &frstd, 1e-5f, yType, {&fq, &fqt, &fused, false});
        EXPECT_EQ(took, step > 0) << what << " step " << step;
        if (!took) {  // the first cast: as the model does, the LayerNorm then the cast
          layerNormForward(y, &fmean, &frstd, x, w, b, 1e-5f);
          fp8Quantize(fq, y, fused, &fqt);
        }
        auto same = [&](const Tensor& a, const Tensor& e, const char* name) {
          const Tensor ah = a.to(Device::cpu()), eh = e.to(Device::cpu());
          EXPECT_EQ(memcmp(ah.rawData(), eh.rawData(), ah.numel() * dtypeSize(ah.dtype())), 0)
              << what << " step " << step << " " << name;
        };
        same(fq, q, "codes");
        same(fqt, qt, "transposed codes");
        same(fmean, mean, "mean");
        same(frstd, rstd, "rstd");
        same(fused.values(), ref.values(), "scaling state");
        EXPECT_EQ(fused.casts(), ref.casts());
        Tensor rq = poisoned({N, C}, DType::kU8), rqt = poisoned({C, N}, DType::kU8);
        ASSERT_TRUE(layerNormForwardFp8(x, w, b, nullptr, nullptr, 1e-5f, yType, {&rq, &rqt, &fused, true})) << what;
        same(rq, q, "replayed codes");
        same(rqt, qt, "replayed transposed codes");
        same(fused.values(), ref.values(), "scaling state after the replay");
      }
    }
  // Where the kernel does not apply it does nothing: rows not a multiple of 32, the current recipe.
  Fp8Options o;
  Fp8State delayed(Fp8Format::kE4M3, o, kGpu);
  delayed.setCasts(1);
  o.recipe = Fp8Recipe::kCurrent;
  Fp8State current(Fp8Format::kE4M3, o, kGpu);
  current.setCasts(1);
  const Tensor w = gpu(randomTensor({768}, 54)), b = gpu(randomTensor({768}, 55));
  for (auto [rows, st] : std::vector<std::pair<int64_t, Fp8State*>>{{48, &delayed}, {64, &current}}) {
    const Tensor x = gpu(randomTensor({rows, 768}, 56));
    Tensor q = Tensor::empty({rows, 768}, DType::kU8, kGpu), qt = Tensor::empty({768, rows}, DType::kU8, kGpu);
    EXPECT_FALSE(layerNormForwardFp8(x, w, b, nullptr, nullptr, 1e-5f, DType::kBF16, {&q, &qt, st, false})) << rows;
    EXPECT_EQ(st->casts(), 1);
  }
}

// FP8 GPT with delayed scaling (the LayerNorms writing the qkv and fc codes, the casts updating
// their state in one kernel) under each activation checkpointing mode against none: the
// recomputation replays the forward's codes, so losses and parameters after three steps are held to
// what two runs without checkpointing differ by (x10, at least 1e-4 relative).
TEST(GpuParity, GptFp8CheckpointingMatchesNone) {
  PrecisionScope scope(MatmulPrecision::kBF16);
  GptConfig c;
  c.vocab = 200, c.paddedVocab = 256, c.maxT = 64, c.layers = 3, c.heads = 2, c.channels = 128;
  c.fp8.enabled = true;
  c.fp8.options.recipe = Fp8Recipe::kDelayed;
  auto worst = [](const test::GptRun& a, const test::GptRun& e) {
    double w = 0;
    for (size_t i = 0; i < a.losses.size(); ++i) w = std::max(w, std::fabs(a.losses[i] - e.losses[i]) / e.losses[i]);
    for (size_t i = 0; i < a.values.size(); ++i)
      w = std::max(w, std::fabs(static_cast<double>(a.values[i]) - e.values[i]) / (std::fabs(e.values[i]) + 1e-3));
    return w;
  };
  c.checkpointing = ActivationCheckpointing::kNone;
  const test::GptRun none = test::trainGpt(c, kGpu, true, 3, 4), again = test::trainGpt(c, kGpu, true, 3, 4);
  const double bound = std::max(1e-4, 10 * worst(again, none));
  for (auto mode : {ActivationCheckpointing::kBlocks, ActivationCheckpointing::kSelective,
                    ActivationCheckpointing::kPointwise}) {
    c.checkpointing = mode;
    const test::GptRun r = test::trainGpt(c, kGpu, true, 3, 4);
    const double w = worst(r, none);
    std::printf("fp8 checkpointing %s: worst relative difference to none %.2e (none twice: %.2e)\n",
                enumName(activationCheckpointings(), mode), w, worst(again, none));
    EXPECT_LE(w, bound) << enumName(activationCheckpointings(), mode);
    EXPECT_LT(r.keptBytes, none.keptBytes);
  }
}

// FP8 GPT (train.precision = fp8) on the GPU, cuBLASLt's FP8 GEMMs in the block Linears and bf16
// elsewhere, against the CPU emulation (the same FP8 rounding and scaling around f32): five AdamW
// steps with each recipe. The two differ by what bf16 differs from f32 in the other layers (and by
// FP8 codes that bf16 inputs tip across a rounding boundary, and forward's fast accumulation), so
// the losses are held to the bf16 tolerance of this file, and to 3x what bf16-vs-f32 training
// without FP8 differs by on the same model when that is larger; both are printed.
TEST(GpuParity, GptFp8MatchesCpuEmulation) {
  PrecisionScope scope(MatmulPrecision::kBF16);
  GptConfig c;
  c.vocab = 200, c.paddedVocab = 256, c.maxT = 64, c.layers = 2, c.heads = 2, c.channels = 128;
  auto worst = [](const test::GptRun& a, const test::GptRun& b) {
    double w = 0;
    for (size_t i = 0; i < a.losses.size(); ++i)
      w = std::max(w, std::fabs(a.losses[i] - b.losses[i]) / b.losses[i]);
    return w;
  };
  const double bf16 =
      worst(test::trainGpt(c, kGpu, true, 5, 4), test::trainGpt(c, Device::cpu(), true, 5, 4));
  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kDelayed}) {
    c.fp8.enabled = true;
    c.fp8.options.recipe = recipe;
    const test::GptRun g = test::trainGpt(c, kGpu, true, 5, 4),
                       h = test::trainGpt(c, Device::cpu(), true, 5, 4);
    const double w = worst(g, h);
    std::printf(
        "fp8 %s: losses gpu %.5f -> %.5f, cpu emulation %.5f -> %.5f, worst relative %.2e (bf16 vs f32 "
        "without fp8: %.2e)\n",
        enumName(fp8Recipes(), recipe), g.losses.front(), g.losses.back(), h.losses.front(), h.losses.back(),
        w, bf16);
    EXPECT_LE(w, std::max(kBF16, 3 * bf16)) << enumName(fp8Recipes(), recipe);
    EXPECT_LT(g.losses.back(), g.losses.front());
  }
}

}  // namespace
}  // namespace mt
