// Int8 quantization: the arithmetic (core/Int8), the observers, the fake-quantized layer's forward
// and straight-through backward, and the observers' checkpoint state (models/quant).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/Int8.h"
#include "models/ModelConfig.h"
#include "models/layers/Linear.h"
#include "models/quant/QuantizedModel.h"
#include "models/quant/Quantizer.h"

namespace mt {
namespace {

Tensor tensorOf(const Shape& s, std::vector<float> v) {
  Tensor t = Tensor::empty(s, DType::kF32);
  std::memcpy(t.data<float>(), v.data(), v.size() * 4);
  return t;
}

TEST(Int8, ActivationParamsHoldZeroAndSaturate) {
  const ActivationQParams p = activationQParams(-1.f, 3.f);
  EXPECT_FLOAT_EQ(p.scale, 4.f / 255.f);
  EXPECT_EQ(p.zeroPoint, 64);                                  // round(1 / (4/255)) = round(63.75)
  const ActivationQParams pos = activationQParams(0.5f, 2.f);  // widened to [0, 2]: zero point 0
  EXPECT_EQ(pos.zeroPoint, 0);
  EXPECT_FLOAT_EQ(pos.scale, 2.f / 255.f);
  const ActivationQParams zero = activationQParams(0.f, 0.f);
  EXPECT_EQ(zero.scale, 1.f);
  Tensor x = tensorOf({6}, {0.f, -5.f, 7.f, 1.f, -0.3f, 2.5f * p.scale});
  Tensor y = Tensor::empty({6}, DType::kF32);
  fakeQuantActivation(y, x, p);
  const float* q = y.data<float>();
  EXPECT_EQ(q[0], 0.f);                 // zero is exact
  EXPECT_FLOAT_EQ(q[1], p.lowest());    // saturates below
  EXPECT_FLOAT_EQ(q[2], p.highest());   // and above
  EXPECT_NEAR(q[3], 1.f, p.scale / 2);  // within half a step inside
  EXPECT_NEAR(q[4], -0.3f, p.scale / 2);
  EXPECT_FLOAT_EQ(q[5], 2.f * p.scale);  // 2.5 rounds half to even (2), as ONNX's QuantizeLinear
}

TEST(Int8, WeightsPerChannelAlongTheAxisAsked) {
  // Rows of very different magnitude: per-row scales differ from per-column ones.
  Tensor w = tensorOf({2, 3}, {0.1f, -0.2f, 0.05f, 10.f, 3.f, -7.f});
  const QuantizedWeight rows = quantizeWeight(w, 0), cols = quantizeWeight(w, 1);
  ASSERT_EQ(rows.scales.size(), 2u);
  ASSERT_EQ(cols.scales.size(), 3u);
  EXPECT_FLOAT_EQ(rows.scales[0], 0.2f / 127.f);
  EXPECT_FLOAT_EQ(rows.scales[1], 10.f / 127.f);
  EXPECT_FLOAT_EQ(cols.scales[2], 7.f / 127.f);
  EXPECT_EQ(rows.q[1], -127);  // each channel's largest magnitude maps to +-127
  EXPECT_EQ(rows.q[3], 127);
  for (int i = 0; i < 6; ++i) {
    const float s = rows.scales[i / 3];
    EXPECT_NEAR(rows.q[i] * s, w.data<float>()[i], s / 2) << i;
  }
  // The trainer's fake quantization (axis 0) is exactly q · s of the export's.
  Tensor fq = Tensor::empty({2, 3}, DType::kF32);
  fakeQuantWeight(fq, w);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(fq.data<float>()[i], rows.q[i] * rows.scales[i / 3]) << i;
  Tensor zeros = Tensor::zeros({2, 2}, DType::kF32);
  EXPECT_EQ(quantizeWeight(zeros, 0).scales[0], 1.f);  // an all-zero channel: scale 1, q 0
}

TEST(Int8, Observers) {
  Tensor a = tensorOf({4}, {-1.f, 0.f, 2.f, 1.f}), b = tensorOf({3}, {-3.f, 0.5f, 1.f});
  ActivationObserver mm(ObserverKind::kMinMax), ema(ObserverKind::kEma);
  for (auto* o : {&mm, &ema}) {
    EXPECT_FALSE(o->seen());
    o->observe(a);
    o->observe(b);
  }
  EXPECT_EQ(mm.state().lo, -3.f);
  EXPECT_EQ(mm.state().hi, 2.f);
  EXPECT_FLOAT_EQ(ema.state().lo, -1.f + 0.01f * (-3.f + 1.f));
  EXPECT_FLOAT_EQ(ema.state().hi, 2.f + 0.01f * (1.f - 2.f));
  EXPECT_EQ(mm.state().batches, 2);
  // Percentile: an outlier beyond the 99th percentile is clipped.
  Tensor c = Tensor::empty({1001}, DType::kF32);
  for (int i = 0; i <= 1000; ++i)
    c.data<float>()[i] = static_cast<float>(i) / 1000.f;
  c.data<float>()[1000] = 1000.f;
  ActivationObserver pct(ObserverKind::kPercentile, 99.0);
  pct.observe(c);
  EXPECT_NEAR(pct.state().hi, 0.99f, 1e-6);
  EXPECT_NEAR(pct.state().lo, 0.01f, 1e-6);
}

// A one-layer model y = x W^T + b wrapped for QAT: forward equals the f32 layer on x~ and W~,
// dW is the f32 layer's gradient at (x~, W~) (straight through), dx is zero where x clipped.
TEST(Int8, FakeQuantizedLinearForwardAndStraightThroughBackward) {
  ModelConfig mc;
  mc.hidden = {3};
  auto model = buildMlp(mc, InputSpec{1, 4, 1, 2});
  QuantOptions o;
  o.freezeStep = 1;
  QuantizedModel qm(*model, o);
  ASSERT_EQ(qm.numSites(), 2u);  // fc1, fc2 inputs
  model->params().materialize(Device::cpu());
  model->initParams(3);
  auto& seq = static_cast<Sequential&>(*model);
  size_t fcIndex = 0;
  while (seq.label(fcIndex) != "fc2")
    ++fcIndex;
  auto& fq = static_cast<FakeQuantized&>(seq.module(fcIndex));
  // Freeze a narrow input range by hand: values beyond it clip.
  fq.inputObserver().setState({true, -0.5f, 0.5f, 1});
  const ActivationQParams p = fq.inputObserver().qparams();
  Tensor x = tensorOf({2, 3}, {0.2f, -0.9f, 0.4f, 0.7f, 0.f, -0.1f});
  Context ctx;
  ctx.training = true;
  ctx.step = 5;  // past freezeStep: the observer must not move
  auto& lin = static_cast<Linear&>(fq.inner());
  Tensor w = lin.weight()->value.clone();
  lin.weight()->grad.fill_(0.f);
  Tensor y = fq.forward(x, ctx);
  EXPECT_EQ(fq.inputObserver().state().lo, -0.5f);
  Tensor xq = Tensor::empty({2, 3}, DType::kF32), wq = Tensor::empty(w.shape(), DType::kF32);
  fakeQuantActivation(xq, x, p);
  fakeQuantWeight(wq, w);
  Tensor ref = Tensor::empty(y.shape(), DType::kF32);
  linearForward(ref, xq, wq, &lin.bias()->value);
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_EQ(y.data<float>()[i], ref.data<float>()[i]) << i;
  for (int64_t i = 0; i < w.numel(); ++i)  // the f32 weight is bound back
    EXPECT_EQ(lin.weight()->value.data<float>()[i], w.data<float>()[i]);
  Tensor dy = Tensor::empty(y.shape(), DType::kF32);
  dy.fill_(1.f);
  Tensor dx = fq.backward(dy, ctx);
  Tensor dxRef = Tensor::empty({2, 3}, DType::kF32), dwRef = Tensor::zeros(w.shape(), DType::kF32);
  Tensor dyRef = Tensor::empty(y.shape(), DType::kF32);
  dyRef.fill_(1.f);
  linearBackward(&dxRef, dwRef, nullptr, dyRef, xq, wq);
  for (int64_t i = 0; i < w.numel(); ++i)
    EXPECT_FLOAT_EQ(lin.weight()->grad.data<float>()[i], dwRef.data<float>()[i]);
  for (int64_t i = 0; i < 6; ++i) {
    const float xi = x.data<float>()[i];
    const bool inside = xi >= p.lowest() && xi <= p.highest();
    EXPECT_EQ(dx.data<float>()[i], inside ? dxRef.data<float>()[i] : 0.f) << i;
  }
  EXPECT_EQ(dx.data<float>()[1], 0.f);  // -0.9 and 0.7 clipped
  EXPECT_EQ(dx.data<float>()[3], 0.f);
}

TEST(Int8, ObserverStateRoundTripsBitExactlyAndChecksTheModel) {
  ModelConfig mc;
  mc.hidden = {3};
  auto model = buildMlp(mc, InputSpec{1, 4, 1, 2});
  QuantizedModel qm(*model, QuantOptions{});
  model->params().materialize(Device::cpu());
  model->initParams(3);
  Tensor lows = tensorOf({2}, {-0.1234567f, std::nextafter(0.f, 1.f)}),
         highs = tensorOf({2}, {1.f / 3.f, 7.f});
  qm.setPacked(lows, highs);
  const std::string json = qm.stateJson();
  auto other = buildMlp(mc, InputSpec{1, 4, 1, 2});
  QuantizedModel back(*other, QuantOptions{});
  back.loadState(json, "test");
  EXPECT_EQ(back.stateJson(), json);
  EXPECT_EQ(std::memcmp(back.packedLows().data<float>(), lows.data<float>(), 8), 0);
  mc.hidden = {3, 3};
  auto bigger = buildMlp(mc, InputSpec{1, 4, 1, 2});
  QuantizedModel mismatch(*bigger, QuantOptions{});
  EXPECT_THROW(mismatch.loadState(json, "test"), CheckpointError);
  EXPECT_THROW(back.loadState("{\"sites\": 3}", "test"), CheckpointError);
}

}  // namespace
}  // namespace mt
