#pragma once
// A trainable model: a ParamTable, a forward that ends in the loss, and a backward. Hooks let the
// parallel layers act at the right moments without the model knowing about them: data parallelism
// launches a bucket's all-reduce from gradReady(); sharding gathers a unit's parameters before
// its forward/backward and reduce-scatters its gradients after its backward.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/Batch.h"
#include "core/Fp8.h"
#include "core/ModelHooks.h"
#include "core/ParamTable.h"
#include "models/Module.h"
#include "models/layers/SoftmaxCrossEntropy.h"

namespace mt {

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  ParamTable& params() { return params_; }
  const ParamTable& params() const { return params_; }
  void setHooks(ModelHooks* hooks) { hooks_ = hooks; }

  // Runs forward and the loss. With ctx.training the activations and the loss gradient are kept
  // for backward(). validForMean: number of rows the loss mean is taken over (-1: this batch's).
  virtual LossStats forward(const Batch& batch, Context& ctx, int64_t validForMean = -1) = 0;
  // Backward of the loss of the last training forward; accumulates into Param::grad. Before each
  // unit's backward (and before a forward that writes a gradient) the model calls
  // params().needGrads(unit), which makes that unit's gradient buffers where they live per step.
  virtual void backward(Context& ctx) = 0;
  // Fills parameters from the seed (deterministic, identical on all ranks).
  virtual void initParams(uint64_t seed) = 0;
  virtual int64_t activationBytes() const = 0;
  virtual void clearActivations() = 0;
  // The FP8 scaling states of the layers that train in FP8 (train.precision = fp8), named uniquely
  // and in a fixed order (checkpoints save and restore them); none by default.
  virtual std::vector<std::pair<std::string, Fp8State*>> fp8States() { return {}; }

 protected:
  ParamTable params_;
  ModelHooks* hooks_ = nullptr;
};

// A memory plan's view of one training forward, made without allocating: the bytes kept for
// backward by layer kind (and the loss), plus the largest transient of backward (a layer's input
// gradient with its scratch) that the peak adds on top.
struct ActivationPlan {
  std::vector<std::pair<std::string, int64_t>> byKind;  // kind -> bytes, in first-seen order
  int64_t transientBytes = 0;
  int64_t total() const {
    int64_t t = 0;
    for (const auto& kv : byKind) t += kv.second;
    return t;
  }
  void add(const std::string& kind, int64_t bytes);
};

// Layers in a chain, ending in softmax cross-entropy over the last layer's output. A unit is a
// parameter-holding layer together with the parameter-free layers after it.
class Sequential : public Model {
 public:
  explicit Sequential(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  // Registers the module's parameters as "<label>.<param>".
  Module& add(std::unique_ptr<Module> module, const std::string& label);
  LossStats forward(const Batch& batch, Context& ctx, int64_t validForMean = -1) override;
  void backward(Context& ctx) override;
  void initParams(uint64_t seed) override;
  int64_t activationBytes() const override;
  void clearActivations() override;
  size_t numModules() const { return modules_.size(); }
  Module& module(size_t i) { return *modules_[i]; }
  const Module& module(size_t i) const { return *modules_[i]; }
  const std::string& label(size_t i) const { return labels_[i]; }  // its parameters' prefix
  // Replaces module i by wrap(module i) (a layer around it: int8 fake quantization). The wrapper
  // reports the wrapped layer's parameters, which stay registered as they were.
  void wrapModule(size_t i, const std::function<std::unique_ptr<Module>(std::unique_ptr<Module>)>& wrap) {
    modules_[i] = wrap(std::move(modules_[i]));
  }
  // Forward to the logits only (no loss), for inspection and tests.
  Tensor logits(const Tensor& inputs, Context& ctx);
  // What a training forward of inputs of shape `in` keeps (f32 activations; tensors shared by two
  // layers counted once), from each layer's cachePlan().
  ActivationPlan planActivations(const Shape& in, const PlanContext& pc) const;

 private:
  std::string name_;
  std::vector<std::unique_ptr<Module>> modules_;
  std::vector<std::string> labels_;
  std::vector<int> unitOf_;
  int nextUnit_ = 0;
  Tensor dlogits_;
};

}  // namespace mt
