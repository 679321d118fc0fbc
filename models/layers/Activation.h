#pragma once
// Element-wise activations.
//   ReLU:  y = max(x, 0);                      dx = dy · [y > 0]
//   GELU (tanh, GPT-2):  y = 0.5x(1 + tanh(u)), u = sqrt(2/pi)(x + 0.044715x^3)
//          dx = dy · (0.5(1 + tanh u) + 0.5x(1 - tanh^2 u) · sqrt(2/pi)(1 + 3·0.044715x^2))
//   GELU (erf, exact):   y = 0.5x(1 + erf(x/sqrt2));  dx = dy · (Phi(x) + x·phi(x))
// dx is overwritten; there are no parameters.

#include "models/Module.h"
#include "models/layers/KernelTypes.h"

namespace mt {

void reluForward(Tensor& y, const Tensor& x);
void reluBackward(Tensor& dx, const Tensor& dy, const Tensor& y);
void geluForward(Tensor& y, const Tensor& x, GeluKind kind);
void geluBackward(Tensor& dx, const Tensor& dy, const Tensor& x, GeluKind kind);

// inputRectified: the layer before already applied the ReLU (a Conv2d with fuseRelu()); forward
// then returns its input itself and keeps it for the backward mask.
class ReLU : public Module {
 public:
  explicit ReLU(bool inputRectified = false) : inputRectified_(inputRectified) {}
  std::string kind() const override { return "relu"; }
  CachePlan cachePlan(const Shape&, const PlanContext&) const override {
    CachePlan p;
    p.output = true;
    p.outputAliasesInput = inputRectified_;
    return p;
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  Shape outputShape(const Shape& in) const override { return in; }
  void clearCache() override { y_ = Tensor(); }
  int64_t cachedBytes() const override { return y_.defined() ? static_cast<int64_t>(y_.nbytes()) : 0; }

 private:
  bool inputRectified_;
  Tensor y_;
};

class GELU : public Module {
 public:
  explicit GELU(GeluKind kind = GeluKind::kTanh) : kind_(kind) {}
  std::string kind() const override { return "gelu"; }
  CachePlan cachePlan(const Shape&, const PlanContext&) const override {
    CachePlan p;
    p.input = true;
    return p;
  }
  LayerAttributes attributes() const override {  // torch.nn.GELU(approximate=...)
    return {attrWord("approximate", kind_ == GeluKind::kTanh ? "tanh" : "none")};
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  Shape outputShape(const Shape& in) const override { return in; }
  void clearCache() override { x_ = Tensor(); }
  int64_t cachedBytes() const override { return x_.defined() ? static_cast<int64_t>(x_.nbytes()) : 0; }

 private:
  GeluKind kind_;
  Tensor x_;
};

}  // namespace mt
