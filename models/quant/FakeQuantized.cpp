#include "models/quant/FakeQuantized.h"

#include "core/Check.h"

namespace mt {

namespace {

// Binds `q` as the parameter's value for its lifetime; the value view in place before comes back
// on destruction (sharding may have rebound it between forward and backward: whatever it was now).
class WeightSwap {
 public:
  WeightSwap(Param& p, const Tensor& q) : p_(p), saved_(p.value) { p_.value = q; }
  ~WeightSwap() { p_.value = saved_; }
  WeightSwap(const WeightSwap&) = delete;
  WeightSwap& operator=(const WeightSwap&) = delete;

 private:
  Param& p_;
  Tensor saved_;
};

Tensor fakeQuantized(const Tensor& x, ActivationQParams p) {
  Tensor out = Tensor::empty(x.shape(), DType::kF32, x.device());
  fakeQuantActivation(out, x, p);
  return out;
}

}  // namespace

FakeQuantized::FakeQuantized(std::unique_ptr<Module> inner, Param* weight, bool observeOutput,
                             const QuantOptions& options)
    : inner_(std::move(inner)),
      weight_(weight),
      hasOutput_(observeOutput),
      options_(options),
      in_(options.observer, options.percentile),
      out_(options.observer, options.percentile) {
  MT_CHECK(inner_ && weight_, "FakeQuantized: a layer and its weight are required");
  needsInputGrad_ = inner_->needsInputGrad();
}

bool FakeQuantized::observing(const Context& ctx) const {
  if (options_.mode == QuantMode::kCalibrate) return true;
  return ctx.training && ctx.step < options_.freezeStep;
}

CachePlan FakeQuantized::cachePlan(const Shape& in, const PlanContext& pc) const {
  CachePlan p = inner_->cachePlan(in, pc);
  if (options_.mode == QuantMode::kTrain) {  // x~ (the layer keeps it) besides x, and W~
    p.input = true;
    p.extraBytes += shapeNumel(in) * 4 + weight_->numel() * 4;
    if (hasOutput_) p.extraBytes += shapeNumel(inner_->outputShape(in)) * 4;
  }
  return p;
}

Tensor FakeQuantized::forward(const Tensor& x, Context& ctx) {
  MT_CHECK(x.dtype() == DType::kF32, "fake quantization of a ", x.str(), " input (f32 activations only)");
  const bool observe = observing(ctx), quantize = options_.mode == QuantMode::kTrain;
  if (observe) in_.observe(x);
  inQuantized_ = quantize && in_.seen();
  if (inQuantized_) inQ_ = in_.qparams();
  const Tensor xin = inQuantized_ ? fakeQuantized(x, inQ_) : x;
  Tensor y;
  if (quantize) {
    Tensor wq = Tensor::empty(weight_->value.shape(), DType::kF32, weight_->value.device());
    fakeQuantWeight(wq, weight_->value);
    WeightSwap swap(*weight_, wq);
    y = inner_->forward(xin, ctx);
    wq_ = ctx.training ? wq : Tensor();
  } else {
    y = inner_->forward(xin, ctx);
  }
  x_ = ctx.training && inQuantized_ ? x : Tensor();
  y_ = Tensor();
  outQuantized_ = false;
  if (!hasOutput_) return y;
  if (observe) out_.observe(y);
  outQuantized_ = quantize && out_.seen();
  if (!outQuantized_) return y;
  outQ_ = out_.qparams();
  if (ctx.training) y_ = y;
  return fakeQuantized(y, outQ_);
}

Tensor FakeQuantized::backward(const Tensor& dy, Context& ctx) {
  Tensor d = dy;
  if (outQuantized_) {
    MT_CHECK(y_.defined(), "FakeQuantized::backward without a training forward");
    clipGradient(d, y_, outQ_);
  }
  Tensor dx;
  if (wq_.defined()) {
    WeightSwap swap(*weight_, wq_);
    dx = inner_->backward(d, ctx);
  } else {
    dx = inner_->backward(d, ctx);
  }
  if (dx.defined() && inQuantized_) {
    MT_CHECK(x_.defined(), "FakeQuantized::backward without a training forward");
    clipGradient(dx, x_, inQ_);
  }
  x_ = y_ = wq_ = Tensor();
  return dx;
}

void FakeQuantized::clearCache() {
  inner_->clearCache();
  x_ = y_ = wq_ = Tensor();
}

int64_t FakeQuantized::cachedBytes() const {
  int64_t n = inner_->cachedBytes();
  for (const Tensor* t : {&x_, &y_, &wq_})
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  return n;
}

}  // namespace mt
