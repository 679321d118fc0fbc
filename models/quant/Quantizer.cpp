#include "models/quant/Quantizer.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/Check.h"
#include "core/Parallel.h"

#ifdef MT_WITH_CUDA
#include "models/kernels/FakeQuant.h"
#endif

namespace mt {

namespace {

void requireF32(const Tensor& t, const char* what) {
  MT_CHECK(t.dtype() == DType::kF32 && t.isContiguous(), what, ": expected a contiguous f32 tensor, got ",
           t.str());
#ifndef MT_WITH_CUDA
  if (t.device().isCuda()) throw InternalError(std::string(what) + " on CUDA in a build without CUDA");
#endif
}

}  // namespace

void fakeQuantWeight(Tensor& out, const Tensor& w) {
  requireF32(w, "fakeQuantWeight");
  MT_CHECK(out.numel() == w.numel() && out.device() == w.device(), "fakeQuantWeight: out ", out.str(),
           " for ", w.str());
#ifdef MT_WITH_CUDA
  if (w.device().isCuda()) return cuda::fakeQuantWeight(out, w);
#endif
  const int64_t rows = w.dim(0), cols = w.numel() / rows;
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  parallelFor(rows, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = src + r * cols;
      float m = 0.f;
      for (int64_t i = 0; i < cols; ++i)
        m = std::max(m, std::fabs(row[i]));
      const float s = weightScale(m);
      for (int64_t i = 0; i < cols; ++i)
        dst[r * cols + i] = quantizeWeightValue(row[i], s) * s;
    }
  });
}

void fakeQuantActivation(Tensor& out, const Tensor& x, ActivationQParams p) {
  requireF32(x, "fakeQuantActivation");
  MT_CHECK(out.numel() == x.numel() && out.device() == x.device(), "fakeQuantActivation: out ", out.str(),
           " for ", x.str());
#ifdef MT_WITH_CUDA
  if (x.device().isCuda()) return cuda::fakeQuantActivation(out, x, p.scale, p.zeroPoint);
#endif
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  const float z = static_cast<float>(p.zeroPoint), s = p.scale;
  parallelFor(x.numel(), 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float q = quantizeActivationValue(src[i], p);
      dst[i] = (q - z) * s;
    }
  });
}

void clipGradient(Tensor& dx, const Tensor& x, ActivationQParams p) {
  requireF32(dx, "clipGradient");
  MT_CHECK(dx.numel() == x.numel() && dx.device() == x.device(), "clipGradient: ", dx.str(), " for ",
           x.str());
  const float lo = p.lowest(), hi = p.highest();
#ifdef MT_WITH_CUDA
  if (x.device().isCuda()) return cuda::clipGradient(dx, x, lo, hi);
#endif
  const float* xp = x.data<float>();
  float* g = dx.data<float>();
  parallelFor(x.numel(), 4096, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i)
      if (!(xp[i] >= lo && xp[i] <= hi)) g[i] = 0.f;
  });
}

std::pair<float, float> tensorRange(const Tensor& x) {
  requireF32(x, "tensorRange");
#ifdef MT_WITH_CUDA
  if (x.device().isCuda()) return cuda::tensorRange(x);
#endif
  const float* p = x.data<float>();
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, p[i]);  // (std::min with a NaN second argument keeps the first)
    hi = std::max(hi, p[i]);
  }
  return {lo, hi};
}

}  // namespace mt
