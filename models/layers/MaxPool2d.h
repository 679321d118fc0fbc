#pragma once
// MaxPool2d (kernel k, stride s, no padding):
//   y[n,c,oh,ow] = max_{kh,kw < k} x[n,c,oh*s+kh, ow*s+kw]
// The first maximum in (kh, kw) order wins, as in PyTorch; NaN propagates. argmax (the flat H·W
// index inside the plane) is kept for backward:
//   dx = 0; dx[argmax] += dy     (overwrites dx; windows may overlap when s < k)
// NCHW or NHWC like the convolutions.

#include "models/Module.h"
#include "models/layers/KernelTypes.h"
#include "models/layers/Layout.h"

namespace mt {

void maxPool2dForward(Tensor& y, Tensor* argmax, const Tensor& x, const PoolGeometry& g);
void maxPool2dBackward(Tensor& dx, const Tensor& dy, const Tensor& argmax, const PoolGeometry& g);

class MaxPool2d : public Module {
 public:
  MaxPool2d(Layout layout, int64_t k, int64_t stride = 0) : layout_(layout), k_(k), stride_(stride ? stride : k) {}
  std::string kind() const override { return "maxpool2d"; }
  CachePlan cachePlan(const Shape& in, const PlanContext&) const override {
    CachePlan p;
    p.extraBytes = shapeNumel(outputShape(in)) * 4;  // i32 argmax
    return p;
  }
  LayerAttributes attributes() const override {
    return {attrNumber("kernel", static_cast<double>(k_)), attrNumber("stride", static_cast<double>(stride_)),
            attrWord("layout", layout_ == Layout::kNCHW ? "nchw" : "nhwc")};
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  Shape outputShape(const Shape& in) const override;
  void clearCache() override { argmax_ = Tensor(); }
  int64_t cachedBytes() const override { return argmax_.defined() ? static_cast<int64_t>(argmax_.nbytes()) : 0; }

 private:
  Layout layout_;
  int64_t k_, stride_;
  Tensor argmax_;
  Shape inShape_;
  PoolGeometry geom_;
};

}  // namespace mt
