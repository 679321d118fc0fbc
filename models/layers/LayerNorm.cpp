#include "models/layers/LayerNorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/EnvParams.h"
#include "core/Parallel.h"
#include "models/Init.h"
#include "models/kernels/Dispatch.h"
#include "models/layers/Precision.h"

namespace mt {

void layerNormForward(Tensor& y, Tensor* mean, Tensor* rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                      float eps) {
  MT_DISPATCH_CUDA(x, layerNormForward(y, mean, rstd, x, w, b, eps));
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* bp = b.data<float>();
  float* yp = y.data<float>();
  float* mp = mean ? mean->data<float>() : nullptr;
  float* rp = rstd ? rstd->data<float>() : nullptr;
  parallelFor(R, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = xp + r * C;
      double s = 0.0;
      for (int64_t c = 0; c < C; ++c) s += row[c];
      const float m = static_cast<float>(s / static_cast<double>(C));
      double v = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        const double d = row[c] - m;
        v += d * d;
      }
      const float rs = 1.f / std::sqrt(static_cast<float>(v / static_cast<double>(C)) + eps);
      float* out = yp + r * C;
      for (int64_t c = 0; c < C; ++c) out[c] = (row[c] - m) * rs * wp[c] + bp[c];
      if (mp) mp[r] = m;
      if (rp) rp[r] = rs;
    }
  });
}

bool layerNormForwardFp8(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* mean, Tensor* rstd, float eps,
                         DType yType, const LayerNormFp8Out& out) {
#ifdef MT_WITH_CUDA
  if (x.device().isCuda()) return cuda::layerNormForwardFp8(x, w, b, mean, rstd, eps, yType, out);
#endif
  (void)w, (void)b, (void)mean, (void)rstd, (void)eps, (void)yType, (void)out;
  return false;
}

void layerNormBackward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& mean, const Tensor& rstd, const Tensor* residual, Tensor* dxLow) {
  MT_DISPATCH_CUDA(x, layerNormBackward(dx, dw, db, dy, x, w, mean, rstd, residual, dxLow));
  MT_CHECK(!dxLow || !dxLow->defined(), "layernorm backward: a reduced-precision copy of dx exists only on CUDA");
  const float* resp = residual ? residual->data<float>() : nullptr;
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* dyp = dy.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  const int64_t blocks = (R + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partW(static_cast<size_t>(blocks * C), 0.0), partB(static_cast<size_t>(blocks * C), 0.0);
  parallelFor(blocks, 1, [&](int64_t blo, int64_t bhi) {
    for (int64_t blk = blo; blk < bhi; ++blk) {
      double* pw = partW.data() + blk * C;
      double* pb = partB.data() + blk * C;
      const int64_t r1 = std::min(R, (blk + 1) * kReduceBlock);
      for (int64_t r = blk * kReduceBlock; r < r1; ++r) {
        const float* row = xp + r * C;
        const float* g = dyp + r * C;
        const float m = mp[r], rs = rp[r];
        double sg = 0.0, sgn = 0.0;
        for (int64_t c = 0; c < C; ++c) {
          const float n = (row[c] - m) * rs;
          const float gw = g[c] * wp[c];
          sg += gw;
          sgn += gw * n;
          pw[c] += g[c] * n;
          pb[c] += g[c];
        }
        const float mg = static_cast<float>(sg / static_cast<double>(C));
        const float mgn = static_cast<float>(sgn / static_cast<double>(C));
        float* out = dxp + r * C;
        for (int64_t c = 0; c < C; ++c) {
          const float n = (row[c] - m) * rs;
          out[c] = rs * (g[c] * wp[c] - mg - n * mgn) + (resp ? resp[r * C + c] : 0.f);
        }
      }
    }
  });
  float* dwp = dw.data<float>();
  float* dbp = db.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    double sw = 0.0, sb = 0.0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += partW[static_cast<size_t>(blk * C + c)];
      sb += partB[static_cast<size_t>(blk * C + c)];
    }
    dwp[c] += static_cast<float>(sw);
    dbp[c] += static_cast<float>(sb);
  }
}

void LayerNorm::registerParams(ParamTable& table, const std::string& prefix) {
  w_ = &table.add(prefix + "weight", {c_}, false);
  b_ = &table.add(prefix + "bias", {c_}, false);
}

void LayerNorm::initParams(Rng&) {
  initConstant(w_->value, 1.f);
  initConstant(b_->value, 0.f);
}

Tensor LayerNorm::forward(const Tensor& x, Context& ctx) {
  MT_CHECK(x.dim(-1) == c_, "layernorm over ", c_, " channels got ", x.str());
  Tensor y = Tensor::empty(x.shape(), outputDType(x.device()), x.device());
  const int64_t rows = x.numel() / c_;
  if (ctx.training) {
    x_ = x;
    mean_ = Tensor::empty({rows}, DType::kF32, x.device());
    rstd_ = Tensor::empty({rows}, DType::kF32, x.device());
    layerNormForward(y, &mean_, &rstd_, x, w_->value, b_->value, eps_);
  } else {
    layerNormForward(y, nullptr, nullptr, x, w_->value, b_->value, eps_);
  }
  return y;
}

namespace {
bool fusedIntoFp8() {
  static const bool on = envInt(EnvParam::kFp8Fused) >= 2;
  return on;
}
}  // namespace

bool LayerNorm::forwardFp8(const Tensor& x, Context& ctx, const LayerNormFp8Out& out) {
  MT_CHECK(x.dim(-1) == c_, "layernorm over ", c_, " channels got ", x.str());
  if (!fusedIntoFp8()) return false;
  const int64_t rows = x.numel() / c_;
  if (!ctx.training)
    return layerNormForwardFp8(x, w_->value, b_->value, nullptr, nullptr, eps_, outputDType(x.device()), out);
  Tensor mean = Tensor::empty({rows}, DType::kF32, x.device()), rstd = Tensor::empty({rows}, DType::kF32, x.device());
  if (!layerNormForwardFp8(x, w_->value, b_->value, &mean, &rstd, eps_, outputDType(x.device()), out)) return false;
  x_ = x;
  mean_ = mean;
  rstd_ = rstd;
  return true;
}

bool LayerNorm::recomputeFp8(const LayerNormFp8Out& out) const {
  MT_CHECK(x_.defined(), "LayerNorm: recomputing the output without a training forward");
  if (!fusedIntoFp8()) return false;
  return layerNormForwardFp8(x_, w_->value, b_->value, nullptr, nullptr, eps_, outputDType(x_.device()), out);
}

Tensor LayerNorm::recomputeOutput() const {
  MT_CHECK(x_.defined(), "LayerNorm: recomputing the output without a training forward");
  Tensor y = Tensor::empty(x_.shape(), outputDType(x_.device()), x_.device());
  layerNormForward(y, nullptr, nullptr, x_, w_->value, b_->value, eps_);
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, Context& ctx) { return backwardBoth(dy, nullptr, ctx, nullptr); }

Tensor LayerNorm::backwardAdd(const Tensor& dy, const Tensor& residual, Context& ctx) {
  return backwardBoth(dy, &residual, ctx, nullptr);
}

Tensor LayerNorm::backwardBoth(const Tensor& dy, const Tensor* residual, Context&, Tensor* dxLow) {
  MT_CHECK(x_.defined(), "LayerNorm::backward without a training forward");
  MT_CHECK(!residual || (residual->numel() == x_.numel() && residual->dtype() == DType::kF32),
           "layernorm residual gradient ", residual ? residual->str() : "", " for ", x_.str());
  Tensor dx = Tensor::empty(x_.shape(), DType::kF32, x_.device());
  const DType low = matmulDType(x_.device());
  if (dxLow && low != DType::kF32) *dxLow = Tensor::empty(x_.shape(), low, x_.device());
  layerNormBackward(dx, w_->grad, b_->grad, dy, x_, w_->value, mean_, rstd_, residual,
                    dxLow && low != DType::kF32 ? dxLow : nullptr);
  if (dxLow && low == DType::kF32) *dxLow = dx;
  clearCache();
  return dx;
}

void LayerNorm::clearCache() {
  x_ = Tensor();
  mean_ = Tensor();
  rstd_ = Tensor();
}

int64_t LayerNorm::cachedBytes() const {
  return x_.defined() ? static_cast<int64_t>(x_.nbytes() + mean_.nbytes() + rstd_.nbytes()) : 0;
}

}  // namespace mt
