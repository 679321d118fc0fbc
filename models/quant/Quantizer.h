#pragma once
// The int8 fake quantization of quantization-aware training, on the tensor's device (CPU or CUDA:
// models/kernels/FakeQuant.cu), with core/Int8.h's arithmetic (documented there).
// Clipped straight-through estimator (backward of x~): dx = dy where (0 - z) s <= x <= (255 - z) s,
// 0 outside; for weights the plain STE (dw = dw~): per-channel min-max scales never clip a weight.

#include <cstdint>
#include <utility>
#include <vector>

#include "core/Int8.h"
#include "core/Tensor.h"

namespace mt {

// On w's device (CPU or CUDA, f32, contiguous): out = w~ per channel along axis 0 (the output
// channel of Linear [out, in] and Conv2d [O, ...] in both layouts). out may be a fresh tensor of
// w's shape.
void fakeQuantWeight(Tensor& out, const Tensor& w);
// out = x~ (f32, x's shape and device).
void fakeQuantActivation(Tensor& out, const Tensor& x, ActivationQParams p);
// The clipped STE: dx[i] = 0 where x[i] is outside [p.lowest(), p.highest()], in place.
void clipGradient(Tensor& dx, const Tensor& x, ActivationQParams p);
// min and max of x's elements (any device), read to the host. NaN elements are ignored.
std::pair<float, float> tensorRange(const Tensor& x);

}  // namespace mt
