#pragma once
// CUDA kernels of models/quant/Quantizer (the same arithmetic as its CPU code, documented there).
// Compiled only with CUDA (models/kernels/FakeQuant.cu); every call runs on currentStream().

#include <cstdint>
#include <utility>

#include "core/Tensor.h"

namespace mt::cuda {

void fakeQuantWeight(Tensor& out, const Tensor& w);  // per row of w viewed [dim(0), numel/dim(0)]
void fakeQuantActivation(Tensor& out, const Tensor& x, float scale, int32_t zeroPoint);
void clipGradient(Tensor& dx, const Tensor& x, float lowest, float highest);
std::pair<float, float> tensorRange(const Tensor& x);  // synchronises: the range is read to the host

}  // namespace mt::cuda
