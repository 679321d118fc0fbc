#pragma once
// A layer with an explicit forward and backward. forward() caches what backward() needs when
// ctx.training is set; backward() returns the gradient of the input (overwritten, a fresh tensor)
// and ACCUMULATES parameter gradients (+=) into Param::grad, so gradient accumulation over
// micro-batches needs no extra code and the caller zeroes gradients once per step.

#include <memory>
#include <string>
#include <vector>

#include "core/ParamTable.h"
#include "core/Random.h"
#include "core/Tensor.h"

namespace mt {

struct Context {
  bool training = true;
  Device device = Device::cpu();
  uint64_t seed = 0;  // dropout streams derive from (seed, step, layer)
  int64_t step = 0;
  float lossScale = 1.f;  // the loss gradient is multiplied by this (mixed-precision loss scaling)
  // Dataset index of each row of the batch (host, may be null): dropout masks are a function of
  // (seed, step, layer, sample index, feature), so any world size gives the same losses.
  const std::vector<int64_t>* sampleIds = nullptr;
  // Layers keep their weights' reduced-precision casts from forward to backward (one cast per
  // step); off under sharding, which frees the gathered weights in between.
  bool keepWeightCasts = true;
  // A model may return loss statistics still on the device (LossStats::pending) instead of
  // reading them back at the end of forward: the trainer resolves them at log points only.
  bool deferLoss = false;
};

// One hyper-parameter of a layer, as `trainer export` records it for a reader that rebuilds the
// model (a number, or a word when `word` is not empty).
struct LayerAttribute {
  std::string key;
  double number = 0.0;
  std::string word;
};
using LayerAttributes = std::vector<LayerAttribute>;
inline LayerAttribute attrNumber(std::string key, double v) { return {std::move(key), v, {}}; }
inline LayerAttribute attrWord(std::string key, std::string v) { return {std::move(key), 0.0, std::move(v)}; }

// What a layer keeps from forward for backward, for a memory plan made before anything is
// allocated (`trainer plan`): whether it keeps its input or its output tensor (shared with the
// neighbour that keeps the same one), and the bytes of anything else it keeps (masks, im2col).
struct CachePlan {
  bool input = false, output = false;
  bool outputAliasesInput = false;  // a view (flatten): keeping the output keeps the input
  int64_t extraBytes = 0;
};
struct PlanContext {
  Device device = Device::cpu();
  DType matmul = DType::kF32;  // the matmul dtype (bf16/f16 on the GPU in reduced precision)
};

class Module {
 public:
  virtual ~Module() = default;
  // For an input of shape `in` (f32 activations, as the sequential models pass them).
  virtual CachePlan cachePlan(const Shape& in, const PlanContext& pc) const { return {}; }
  virtual std::string kind() const = 0;
  // Everything besides kind() and the parameters that decides what forward computes.
  virtual LayerAttributes attributes() const { return {}; }
  // Registers this module's parameters under `prefix` (e.g. "fc1.weight"); called once.
  virtual void registerParams(ParamTable& table, const std::string& prefix) {}
  // Fills the registered parameters (PyTorch's default initialisation unless a model overrides).
  virtual void initParams(Rng& rng) {}
  virtual Tensor forward(const Tensor& x, Context& ctx) = 0;
  virtual Tensor backward(const Tensor& dy, Context& ctx) = 0;
  virtual std::vector<Param*> params() { return {}; }
  // Shape of the output for an input shape (batch dimension included), used to build models.
  virtual Shape outputShape(const Shape& in) const = 0;
  // Drops cached activations (after backward, or before evaluation).
  virtual void clearCache() {}
  // Bytes of cached activations held right now (memory accounting).
  virtual int64_t cachedBytes() const { return 0; }
  // The first parameter layer of a model need not compute its input gradient.
  void setNeedsInputGrad(bool needed) { needsInputGrad_ = needed; }
  bool needsInputGrad() const { return needsInputGrad_; }
  // Activation dtype of the output where the layer supports reduced precision (LayerNorm, Linear,
  // GELU on CUDA in bf16/f16 matmul precision: the next GEMM reads it without a cast, and it is
  // cached at half the bytes). Honoured only where activationDType(device) is not f32.
  void setLowPrecisionOutput(bool low) { lowOutput_ = low; }

 protected:
  // f32, or the matmul dtype when this layer was asked for reduced-precision output and the device
  // computes in it.
  DType outputDType(Device d) const;
  bool needsInputGrad_ = true;
  bool lowOutput_ = false;
};

}  // namespace mt
