#include "models/layers/Activation.h"

#include <cmath>

#include "core/GeluMath.h"
#include "core/Parallel.h"
#include "models/kernels/Dispatch.h"

namespace mt {

namespace {
constexpr int64_t kGrain = 1 << 14;
}  // namespace

void reluForward(Tensor& y, const Tensor& x) {
  MT_DISPATCH_CUDA(x, reluForward(y, x));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  parallelFor(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) yp[i] = xp[i] > 0.f ? xp[i] : (std::isnan(xp[i]) ? xp[i] : 0.f);
  });
}

void reluBackward(Tensor& dx, const Tensor& dy, const Tensor& y) {
  MT_DISPATCH_CUDA(dy, reluBackward(dx, dy, y));
  const float* dyp = dy.data<float>();
  const float* yp = y.data<float>();
  float* dxp = dx.data<float>();
  parallelFor(dy.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dxp[i] = yp[i] > 0.f ? dyp[i] : 0.f;
  });
}

void geluForward(Tensor& y, const Tensor& x, GeluKind kind) {
  MT_DISPATCH_CUDA(x, geluForward(y, x, kind));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  parallelFor(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = xp[i];
      if (kind == GeluKind::kTanh) {
        yp[i] = geluFromTanh(v, std::tanh(geluTanhArg(v)));
      } else {
        yp[i] = 0.5f * v * (1.f + std::erf(v * static_cast<float>(M_SQRT1_2)));
      }
    }
  });
}

void geluBackward(Tensor& dx, const Tensor& dy, const Tensor& x, GeluKind kind) {
  MT_DISPATCH_CUDA(x, geluBackward(dx, dy, x, kind));
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  parallelFor(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = xp[i];
      float g;
      if (kind == GeluKind::kTanh) {
        g = geluGradFromTanh(v, std::tanh(geluTanhArg(v)));
      } else {
        const float cdf = 0.5f * (1.f + std::erf(v * static_cast<float>(M_SQRT1_2)));
        const float pdf = std::exp(-0.5f * v * v) * 0.3989422804014327f;
        g = cdf + v * pdf;
      }
      dxp[i] = dyp[i] * g;
    }
  });
}

Tensor ReLU::forward(const Tensor& x, Context& ctx) {
  if (inputRectified_) {
    if (ctx.training) y_ = x;
    return x;
  }
  Tensor y = Tensor::empty(x.shape(), DType::kF32, x.device());
  reluForward(y, x);
  if (ctx.training) y_ = y;
  return y;
}

Tensor ReLU::backward(const Tensor& dy, Context& ctx) {
  MT_CHECK(y_.defined(), "ReLU::backward without a training forward");
  Tensor dx = Tensor::empty(dy.shape(), DType::kF32, dy.device());
  reluBackward(dx, dy, y_);
  y_ = Tensor();
  return dx;
}

Tensor GELU::forward(const Tensor& x, Context& ctx) {
  Tensor y = Tensor::empty(x.shape(), outputDType(x.device()), x.device());
  geluForward(y, x, kind_);
  if (ctx.training) x_ = x;
  return y;
}

Tensor GELU::backward(const Tensor& dy, Context& ctx) {
  MT_CHECK(x_.defined(), "GELU::backward without a training forward");
  // The gradient goes to a GEMM (the layer before): in the matmul dtype when the output was.
  Tensor dx = Tensor::empty(dy.shape(), outputDType(dy.device()), dy.device());
  geluBackward(dx, dy, x_, kind_);
  x_ = Tensor();
  return dx;
}

}  // namespace mt
