#include "models/layers/Embedding.h"

#include <cstring>

#include "core/Parallel.h"
#include "models/Init.h"
#include "models/kernels/Dispatch.h"

namespace mt {

namespace {
inline int64_t indexAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI64 ? t.data<int64_t>()[i] : static_cast<int64_t>(t.data<int32_t>()[i]);
}
void checkIndices(const Tensor& idx, int64_t V) {
  for (int64_t n = 0; n < idx.numel(); ++n) {
    const int64_t i = indexAt(idx, n);
    if (i < 0 || i >= V)
      throw DataError("embedding index " + std::to_string(i) + " out of range for vocabulary " + std::to_string(V));
  }
}
}  // namespace

void embeddingForward(Tensor& y, const Tensor& idx, const Tensor& w) {
  MT_DISPATCH_CUDA(w, embeddingForward(y, idx, w));
  const int64_t V = w.dim(0), D = w.dim(1), N = idx.numel();
  checkIndices(idx, V);
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  parallelFor(N, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n)
      std::memcpy(yp + n * D, wp + indexAt(idx, n) * D, sizeof(float) * static_cast<size_t>(D));
  });
}

void embeddingBackward(Tensor& dw, const Tensor& dy, const Tensor& idx) {
  MT_DISPATCH_CUDA(dw, embeddingBackward(dw, dy, idx));
  const int64_t D = dw.dim(1), N = idx.numel();
  const float* dyp = dy.data<float>();
  float* dwp = dw.data<float>();
  parallelFor(D, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t n = 0; n < N; ++n) {
      float* dst = dwp + indexAt(idx, n) * D;
      const float* src = dyp + n * D;
      for (int64_t d = lo; d < hi; ++d) dst[d] += src[d];
    }
  });
}

void Embedding::registerParams(ParamTable& table, const std::string& prefix) {
  w_ = &table.add(prefix + "weight", {v_, d_}, true);
}

void Embedding::initParams(Rng& rng) { initNormal(w_->value, rng, 0.f, 1.f); }

Shape Embedding::outputShape(const Shape& in) const {
  Shape s = in;
  s.push_back(d_);
  return s;
}

Tensor Embedding::forward(const Tensor& idx, Context& ctx) {
  Tensor y = Tensor::empty(outputShape(idx.shape()), DType::kF32, w_->value.device());
  embeddingForward(y, idx, w_->value);
  if (ctx.training) idx_ = idx;
  return y;
}

Tensor Embedding::backward(const Tensor& dy, Context& ctx) {
  MT_CHECK(idx_.defined(), "Embedding::backward without a training forward");
  embeddingBackward(w_->grad, dy, idx_);
  idx_ = Tensor();
  return Tensor();
}

}  // namespace mt
