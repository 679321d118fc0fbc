#include "core/Int8.h"

#include "core/Check.h"

namespace mt {

ActivationQParams activationQParams(float lo, float hi) {
  MT_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "activation range [", lo, ", ", hi, "]");
  lo = std::min(lo, 0.f);
  hi = std::max(hi, 0.f);
  ActivationQParams p;
  const float s = (hi - lo) / static_cast<float>(kActivationQMax);
  if (!(s > FLT_MIN)) return p;  // an all-zero range: scale 1, zero point 0 (zero stays exact)
  p.scale = s;
  p.zeroPoint = static_cast<int32_t>(std::min(std::max(std::nearbyint(-lo / s), 0.f), 255.f));
  return p;
}

QuantizedWeight quantizeWeight(const Tensor& w, int axis) {
  MT_CHECK(w.dtype() == DType::kF32 && w.isContiguous() && w.device().isCpu() && axis >= 0 && axis < w.ndim(),
           "quantizeWeight: axis ", axis, " of ", w.str());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d)
    outer *= w.dim(d);
  for (int d = axis + 1; d < w.ndim(); ++d)
    inner *= w.dim(d);
  const int64_t C = w.dim(axis);
  const float* p = w.data<float>();
  std::vector<float> absMax(static_cast<size_t>(C), 0.f);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i)
        absMax[c] = std::max(absMax[c], std::fabs(p[(o * C + c) * inner + i]));
  QuantizedWeight r;
  r.scales.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c)
    r.scales[c] = weightScale(absMax[c]);
  r.q.resize(static_cast<size_t>(w.numel()));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * C + c) * inner + i;
        r.q[k] = static_cast<int8_t>(quantizeWeightValue(p[k], r.scales[c]));
      }
  return r;
}

}  // namespace mt
