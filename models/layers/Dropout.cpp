#include "models/layers/Dropout.h"

#include "core/Parallel.h"
#include "models/kernels/Dispatch.h"

namespace mt {

uint64_t dropoutStream(int64_t step, int layerId) {
  return (static_cast<uint64_t>(step) << 16) ^ static_cast<uint64_t>(layerId);
}

void dropoutForward(Tensor& y, Tensor& mask, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                    const int64_t* rowIds) {
  MT_CHECK(p >= 0.f && p < 1.f, "dropout p=", p);
  MT_DISPATCH_CUDA(x, dropoutForward(y, mask, x, p, seed, stream, rowIds));
  const int64_t F = x.numel() / std::max<int64_t>(1, x.dim(0));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  uint8_t* mp = mask.data<uint8_t>();
  const float scale = 1.f / (1.f - p);
  parallelFor(x.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t c = rowIds ? static_cast<uint64_t>(rowIds[i / F] * F + i % F) : static_cast<uint64_t>(i);
      const uint8_t keep = philoxUniform(seed, stream, c) >= p ? 1 : 0;
      mp[i] = keep;
      yp[i] = keep ? xp[i] * scale : 0.f;
    }
  });
}

void dropoutBackward(Tensor& dx, const Tensor& dy, const Tensor& mask, float p) {
  MT_DISPATCH_CUDA(dy, dropoutBackward(dx, dy, mask, p));
  const float* dyp = dy.data<float>();
  const uint8_t* mp = mask.data<uint8_t>();
  float* dxp = dx.data<float>();
  const float scale = 1.f / (1.f - p);
  parallelFor(dy.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dxp[i] = mp[i] ? dyp[i] * scale : 0.f;
  });
}

Tensor Dropout::forward(const Tensor& x, Context& ctx) {
  if (!ctx.training || p_ == 0.f) return x;
  Tensor y = Tensor::empty(x.shape(), DType::kF32, x.device());
  mask_ = Tensor::empty(x.shape(), DType::kU8, x.device());
  const bool perSample = ctx.sampleIds && static_cast<int64_t>(ctx.sampleIds->size()) == x.dim(0);
  dropoutForward(y, mask_, x, p_, ctx.seed, dropoutStream(ctx.step, layerId_),
                 perSample ? ctx.sampleIds->data() : nullptr);
  return y;
}

Tensor Dropout::backward(const Tensor& dy, Context& ctx) {
  if (p_ == 0.f) return dy;
  MT_CHECK(mask_.defined(), "Dropout::backward without a training forward");
  Tensor dx = Tensor::empty(dy.shape(), DType::kF32, dy.device());
  dropoutBackward(dx, dy, mask_, p_);
  mask_ = Tensor();
  return dx;
}

}  // namespace mt
