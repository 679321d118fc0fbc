#pragma once
// The int8 quantization arithmetic, one definition for the trainer's fake quantization
// (models/quant) and the quantized ONNX export (export/OnnxQuantize), so the trainer's
// fake-quantized forward and ONNX Runtime's QuantizeLinear / DequantizeLinear give the same values.
//
// Weights: symmetric int8 per output channel c (zero point 0; ONNX DequantizeLinear with `axis`):
//   s_c = max_i |w_c,i| / 127   (1 when the channel is all zero)
//   q   = clamp(round_half_even(w / s_c), -127, 127)        w~ = q · s_c
// Activations: asymmetric uint8 per tensor from an observed range [lo, hi], widened to hold 0 (so
// zero padding and ReLU's zeros are exact):
//   lo' = min(lo, 0), hi' = max(hi, 0), s = (hi' - lo') / 255 (1 when hi' = lo'),
//   z = clamp(round_half_even(-lo' / s), 0, 255)
//   q = clamp(round_half_even(x / s) + z, 0, 255)          x~ = (q - z) · s
// Division by s, not multiplication by 1/s, and round-half-to-even: what the ONNX specification
// and ONNX Runtime's CPU kernels (MLAS) compute, so a fake-quantized value equals the exported
// Q/DQ pair's bit for bit.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/Tensor.h"

namespace mt {

constexpr int32_t kWeightQMax = 127;  // int8 weights use [-127, 127] (symmetric, no -128)
constexpr int32_t kActivationQMax = 255;

struct ActivationQParams {
  float scale = 1.f;
  int32_t zeroPoint = 0;
  // The representable range: values outside it saturate.
  float lowest() const { return static_cast<float>(0 - zeroPoint) * scale; }
  float highest() const { return static_cast<float>(kActivationQMax - zeroPoint) * scale; }
};

// From an observed range (finite, lo <= hi; a CHECK otherwise).
ActivationQParams activationQParams(float lo, float hi);

// s_c from max |w_c|.
inline float weightScale(float absMax) {
  const float s = absMax / static_cast<float>(kWeightQMax);
  return s > FLT_MIN ? s : 1.f;
}
// nearbyint rounds half to even in the default rounding mode (std::round would not).
inline float quantizeWeightValue(float w, float s) {
  return std::min(std::max(std::nearbyint(w / s), -static_cast<float>(kWeightQMax)),
                  static_cast<float>(kWeightQMax));
}
inline float quantizeActivationValue(float x, ActivationQParams p) {
  return std::min(std::max(std::nearbyint(x / p.scale) + static_cast<float>(p.zeroPoint), 0.f),
                  static_cast<float>(kActivationQMax));
}

// Per-channel symmetric int8 of a host f32 tensor along `axis`: scales [dim(axis)], q in w's layout.
struct QuantizedWeight {
  std::vector<float> scales;
  std::vector<int8_t> q;
};
QuantizedWeight quantizeWeight(const Tensor& w, int axis);

}  // namespace mt
