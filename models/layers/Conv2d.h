#pragma once
// Conv2d (cross-correlation, square stride and zero padding, no dilation/groups):
//   y[n,o,oh,ow] = b[o] + sum_{c,kh,kw} W[o,c,kh,kw] · x[n,c,oh*s-p+kh, ow*s-p+kw]
// CPU: im2col over the whole batch, then one GEMM (col[K=C·KH·KW] per output position).
// Backward:
//   dW += dy ⊗ col                (accumulates)
//   db += sum over n,oh,ow of dy  (accumulates)
//   dx  = col2im(W^T · dy)        (overwrites)
// With a fused ReLU (fuseRelu(), set by the CNN builder when a ReLU follows) forward returns
// relu(y) — the ReLU module after it then passes its input through (ReLU(inputRectified)) and does
// the backward mask as before, so backward here still receives d(y). On cuDNN the bias and the
// ReLU run in the convolution call (cudnnConvolutionBiasActivationForward): two passes over the
// output fewer.
// Layout NCHW: x [N,C,H,W], W [O,C,KH,KW], y [N,O,OH,OW].
// Layout NHWC: x [N,H,W,C], W [O,KH,KW,C], y [N,OH,OW,O].

#include "models/Module.h"
#include "models/layers/KernelTypes.h"
#include "models/layers/Layout.h"

namespace mt {

// col must hold g.positions() * g.K() floats; it is an output of forward and an input of backward.
void conv2dForward(Tensor& y, Tensor& col, const Tensor& x, const Tensor& w, const Tensor* b,
                   const Conv2dGeometry& g, bool relu = false);
void conv2dBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& col,
                    const Tensor& w, const Conv2dGeometry& g);

class Conv2d : public Module {
 public:
  Conv2d(Layout layout, int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t pad = 0,
         bool bias = true)
      : layout_(layout), in_(in), out_(out), k_(kernel), stride_(stride), pad_(pad), hasBias_(bias) {}
  std::string kind() const override { return "conv2d"; }
  CachePlan cachePlan(const Shape& in, const PlanContext& pc) const override {
    CachePlan p;
    p.input = true;
    if (pc.device.isCpu()) {  // the im2col buffer (cuDNN needs none)
      const Conv2dGeometry g = Conv2dGeometry::make(layout_, in, out_, k_, stride_, pad_);
      p.extraBytes = g.positions() * g.K() * 4;
    }
    return p;
  }
  // weight [out, kernel, kernel, in] in NHWC, [out, in, kernel, kernel] in NCHW.
  LayerAttributes attributes() const override {
    return {attrNumber("in_channels", static_cast<double>(in_)), attrNumber("out_channels", static_cast<double>(out_)),
            attrNumber("kernel", static_cast<double>(k_)),     attrNumber("stride", static_cast<double>(stride_)),
            attrNumber("padding", static_cast<double>(pad_)),  attrNumber("bias", hasBias_ ? 1 : 0),
            attrWord("layout", layout_ == Layout::kNCHW ? "nchw" : "nhwc")};
  }
  void registerParams(ParamTable& table, const std::string& prefix) override;
  void initParams(Rng& rng) override;
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::vector<Param*> params() override;
  Shape outputShape(const Shape& in) const override;
  void clearCache() override;
  int64_t cachedBytes() const override;
  Param* weight() const { return w_; }
  Param* bias() const { return b_; }
  void fuseRelu() { fusedRelu_ = true; }

 private:
  Layout layout_;
  int64_t in_, out_, k_, stride_, pad_;
  bool hasBias_;
  bool fusedRelu_ = false;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  Tensor x_, col_;
  Conv2dGeometry geom_;
};

}  // namespace mt
