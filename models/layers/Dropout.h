#pragma once
// Dropout (inverted): training  y = x · m / (1 - p),  m[i] = [u_c >= p],  u_c = philox(seed, stream, c)
//                     eval      y = x
// with counter c = id[n] * F + f for element f of row n (F features per row) when the rows' dataset
// indices id are given, else c = i. Backward: dx = dy · m / (1 - p)  (overwrites). The mask is a
// pure function of (seed, step, layer id, sample, feature): the same on CPU and GPU, after a
// resume, and for any world size or batch position; it is kept (1 byte/element), not recomputed.

#include "models/Module.h"

namespace mt {

// stream identifies (step, layer); mask receives 0/1 per element.
// rowIds (host, x.dim(0) entries) may be null.
void dropoutForward(Tensor& y, Tensor& mask, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                    const int64_t* rowIds = nullptr);
void dropoutBackward(Tensor& dx, const Tensor& dy, const Tensor& mask, float p);
uint64_t dropoutStream(int64_t step, int layerId);

class Dropout : public Module {
 public:
  Dropout(float p, int layerId) : p_(p), layerId_(layerId) {}
  std::string kind() const override { return "dropout"; }
  LayerAttributes attributes() const override { return {attrNumber("p", p_)}; }  // identity at inference
  CachePlan cachePlan(const Shape& in, const PlanContext&) const override {
    CachePlan p;
    p.extraBytes = shapeNumel(in);  // u8 mask
    return p;
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  Shape outputShape(const Shape& in) const override { return in; }
  void clearCache() override { mask_ = Tensor(); }
  int64_t cachedBytes() const override { return mask_.defined() ? static_cast<int64_t>(mask_.nbytes()) : 0; }
  const Tensor& lastMask() const { return mask_; }

 private:
  float p_;
  int layerId_;
  Tensor mask_;
};

}  // namespace mt
