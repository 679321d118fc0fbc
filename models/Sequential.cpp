#include "models/Model.h"

#include <algorithm>

namespace mt {

Module& Sequential::add(std::unique_ptr<Module> module, const std::string& label) {
  params_.beginUnit(nextUnit_);
  module->registerParams(params_, label + ".");
  int unit = nextUnit_ > 0 ? nextUnit_ - 1 : 0;
  module->setNeedsInputGrad(nextUnit_ > 0);  // only when a parameter layer comes before it
  if (!module->params().empty()) unit = nextUnit_++;
  unitOf_.push_back(unit);
  labels_.push_back(label);
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
      params_.needGrads(unit);  // per-step gradient buffers made as backward reaches them
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

void ActivationPlan::add(const std::string& kind, int64_t bytes) {
  for (auto& kv : byKind)
    if (kv.first == kind) {
      kv.second += bytes;
      return;
    }
  byKind.emplace_back(kind, bytes);
}

ActivationPlan Sequential::planActivations(const Shape& in, const PlanContext& pc) const {
  // act[i]: the tensor between module i-1 and module i (act[0] the batch, owned by the loader).
  const size_t n = modules_.size();
  std::vector<Shape> shape(n + 1);
  std::vector<size_t> storage(n + 1);  // the act index whose storage act[i] is
  std::vector<int64_t> firstKeeper(n + 1, -1);  // freed after that module's backward
  std::vector<CachePlan> cache(n);
  shape[0] = in;
  storage[0] = 0;
  ActivationPlan plan;
  auto keep = [&](size_t j, size_t by) {
    if (firstKeeper[j] < 0 || static_cast<int64_t>(by) < firstKeeper[j]) firstKeeper[j] = static_cast<int64_t>(by);
  };
  for (size_t i = 0; i < n; ++i) {
    cache[i] = modules_[i]->cachePlan(shape[i], pc);
    shape[i + 1] = modules_[i]->outputShape(shape[i]);
    storage[i + 1] = cache[i].outputAliasesInput ? storage[i] : i + 1;
    if (cache[i].input) keep(storage[i], i);
    if (cache[i].output) keep(storage[i + 1], i);
    if (cache[i].extraBytes) plan.add(modules_[i]->kind(), cache[i].extraBytes);
  }
  auto bytesOf = [&](size_t j) { return shapeNumel(shape[j]) * 4; };
  for (size_t j = 1; j <= n; ++j)
    if (firstKeeper[j] >= 0 && storage[j] == j) plan.add(modules_[j - 1]->kind(), bytesOf(j));
  const int64_t dlogits = bytesOf(n);
  plan.add("loss", dlogits);  // the logits' gradient, made in forward
  // Backward, module by module in reverse: what is still kept (tensors whose first keeper has not
  // run backward yet, extras of modules not yet run), the output gradient arriving, the input
  // gradient made (layers after the first parameter layer), and a CPU convolution's im2col
  // gradient (as large as its im2col buffer).
  int64_t peak = plan.total(), firstParam = -1;
  for (size_t i = 0; i < n && firstParam < 0; ++i)
    if (!const_cast<Module&>(*modules_[i]).params().empty()) firstParam = static_cast<int64_t>(i);
  for (size_t i = n; i-- > 0;) {
    int64_t live = 0;
    for (size_t j = 1; j <= n; ++j)
      if (firstKeeper[j] >= 0 && storage[j] == j && firstKeeper[j] <= static_cast<int64_t>(i)) live += bytesOf(j);
    for (size_t k = 0; k <= i; ++k) live += cache[k].extraBytes;
    const bool dx = static_cast<int64_t>(i) > firstParam && !cache[i].outputAliasesInput;
    const bool conv = modules_[i]->kind() == "conv2d" && pc.device.isCpu();
    const int64_t now = live + bytesOf(i + 1) + (dx ? bytesOf(i) : 0) + (dx && conv ? cache[i].extraBytes : 0);
    peak = std::max(peak, now);
  }
  plan.transientBytes = peak - plan.total();
  return plan;
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
