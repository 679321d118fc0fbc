#include "models/Model.h"

namespace mt {

Module& Sequential::add(std::unique_ptr<Module> module, const std::string& label) {
  params_.beginUnit(nextUnit_);
  module->registerParams(params_, label + ".");
  int unit = nextUnit_ > 0 ? nextUnit_ - 1 : 0;
  module->setNeedsInputGrad(nextUnit_ > 0);  // only when a parameter layer comes before it
  if (!module->params().empty()) unit = nextUnit_++;
  unitOf_.push_back(unit);
  modules_.push_back(std::move(module));
  return *modules_.back();
}

Tensor Sequential::logits(const Tensor& inputs, Context& ctx) {
  Tensor x = inputs;
  int current = -1;
  for (size_t i = 0; i < modules_.size(); ++i) {
    const int unit = unitOf_[i];
    if (unit != current) {
      if (hooks_ && current >= 0) hooks_->afterUnitForward(current);
      if (hooks_) hooks_->beforeUnitForward(unit);
      current = unit;
    }
    x = modules_[i]->forward(x, ctx);
  }
  if (hooks_ && current >= 0) hooks_->afterUnitForward(current);
  return x;
}

LossStats Sequential::forward(const Batch& batch, Context& ctx, int64_t validForMean) {
  Tensor z = logits(batch.inputs, ctx);
  if (!ctx.training) return softmaxCrossEntropy(z, batch.targets, nullptr, 1.f, validForMean);
  dlogits_ = Tensor::empty(z.shape(), DType::kF32, z.device());
  return softmaxCrossEntropy(z, batch.targets, &dlogits_, ctx.lossScale, validForMean);
}

void Sequential::backward(Context& ctx) {
  MT_CHECK(dlogits_.defined(), "backward() without a training forward()");
  Tensor d = dlogits_;
  dlogits_ = Tensor();
  int current = -1;
  for (size_t i = modules_.size(); i-- > 0;) {
    const int unit = unitOf_[i];
    if (unit != current) {
      if (hooks_ && current >= 0) hooks_->afterUnitBackward(current);
      if (hooks_) hooks_->beforeUnitBackward(unit);
      current = unit;
    }
    // Below the first parameter layer nothing needs a gradient.
    if (!d.defined() && modules_[i]->params().empty()) continue;
    d = modules_[i]->backward(d, ctx);
    if (hooks_)
      for (Param* p : modules_[i]->params()) hooks_->gradReady(*p);
  }
  if (hooks_ && current >= 0) hooks_->afterUnitBackward(current);
}

void Sequential::initParams(uint64_t seed) {
  Rng rng(seed, /*stream=*/0x1A17);
  for (auto& m : modules_) m->initParams(rng);
}

int64_t Sequential::activationBytes() const {
  int64_t b = dlogits_.defined() ? static_cast<int64_t>(dlogits_.nbytes()) : 0;
  for (const auto& m : modules_) b += m->cachedBytes();
  return b;
}

void Sequential::clearActivations() {
  for (auto& m : modules_) m->clearCache();
  dlogits_ = Tensor();
}

}  // namespace mt
