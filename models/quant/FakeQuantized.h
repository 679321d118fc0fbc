#pragma once
// A Linear or Conv2d layer with int8 fake quantization around it (quantization-aware training) or
// with observers only (post-training calibration). The arithmetic is models/quant/Quantizer.h's:
//   forward:  x~ = fq_u8(x; observer_in)     W~ = fq_s8_per_channel(W)     y = layer(x~, W~)
//             convolutions also y~ = fq_u8(y; observer_out) (the exported QLinearConv writes a
//             quantized output; after a fused ReLU y >= 0, so its zero point is 0 and Q/DQ of the
//             raw convolution output equals Q/DQ of the ReLU's)
//   backward: dW accumulates d layer/dW~ into W's gradient (straight-through, W~ never clips);
//             dx and dy are zeroed where x, y lie outside their representable range (clipped STE)
// The wrapped layer runs unchanged: W~ is bound in place of W's value during its forward and
// backward (a fresh tensor; W's value view is restored after, also when the layer throws).
// Observers update in calibration always, in training while ctx.training and ctx.step < freezeStep
// (then they are frozen: the scales stop moving and the network finishes training against fixed
// quantizers). An observer that has seen nothing yet leaves its tensor in f32.
// The layer describes itself as the wrapped one (kind, attributes, parameters): a QAT model's
// architecture record and parameters are the f32 model's.

#include <memory>

#include "models/Module.h"
#include "models/quant/Observer.h"

namespace mt {

enum class QuantMode { kCalibrate, kTrain };

struct QuantOptions {
  QuantMode mode = QuantMode::kTrain;
  ObserverKind observer = ObserverKind::kMinMax;
  double percentile = 99.99;  // ObserverKind::kPercentile
  int64_t freezeStep = 0;     // kTrain: observers update while ctx.step < freezeStep
};

class FakeQuantized : public Module {
 public:
  // `weight`: the wrapped layer's weight (output channel on axis 0). observeOutput: also quantize
  // the output (convolutions).
  FakeQuantized(std::unique_ptr<Module> inner, Param* weight, bool observeOutput,
                const QuantOptions& options);
  std::string kind() const override { return inner_->kind(); }
  LayerAttributes attributes() const override { return inner_->attributes(); }
  CachePlan cachePlan(const Shape& in, const PlanContext& pc) const override;
  void initParams(Rng& rng) override { inner_->initParams(rng); }
  Tensor forward(const Tensor& x, Context& ctx) override;
  // dy is consumed (its clipped elements are zeroed in place).
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::vector<Param*> params() override { return inner_->params(); }
  Shape outputShape(const Shape& in) const override { return inner_->outputShape(in); }
  void clearCache() override;
  int64_t cachedBytes() const override;

  ActivationObserver& inputObserver() { return in_; }
  const ActivationObserver& inputObserver() const { return in_; }
  // Null without an output observer.
  ActivationObserver* outputObserver() { return hasOutput_ ? &out_ : nullptr; }
  const ActivationObserver* outputObserver() const { return hasOutput_ ? &out_ : nullptr; }
  Module& inner() { return *inner_; }

 private:
  bool observing(const Context& ctx) const;
  std::unique_ptr<Module> inner_;
  Param* weight_;
  bool hasOutput_;
  QuantOptions options_;
  ActivationObserver in_, out_;
  // Kept from a training forward for backward: the f32 input and output (for the clip masks) and
  // the quantized weight, with the parameters the forward used.
  Tensor x_, y_, wq_;
  bool inQuantized_ = false, outQuantized_ = false;
  ActivationQParams inQ_, outQ_;
};

}  // namespace mt
