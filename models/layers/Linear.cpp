#include "models/layers/Linear.h"

#include <cmath>

#include "core/Parallel.h"
#include "models/Init.h"
#include "models/kernels/Dispatch.h"
#include "models/layers/Activation.h"
#include "core/Gemm.h"
#include "models/layers/Precision.h"

namespace mt {

void linearForward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* residual) {
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  MT_CHECK(x.dim(-1) == I && y.numel() == N * O, "linear shapes x=", x.str(), " w=", w.str(), " y=", y.str());
  MT_DISPATCH_CUDA(x, linearForward(y, x, w, b, residual));
  float* yp = y.data<float>();
  const float* rp = residual ? residual->data<float>() : nullptr;
  if (b || rp) {
    const float* bp = b ? b->data<float>() : nullptr;
    parallelFor(N, 64, [&](int64_t lo, int64_t hi) {
      for (int64_t n = lo; n < hi; ++n)
        for (int64_t o = 0; o < O; ++o) yp[n * O + o] = (bp ? bp[o] : 0.f) + (rp ? rp[n * O + o] : 0.f);
    });
  }
  gemmCpu(Trans::kNo, Trans::kYes, N, O, I, 1.f, x.data<float>(), w.data<float>(), b || rp ? 1.f : 0.f, yp);
}

void linearBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Tensor* dyColSum) {
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  MT_DISPATCH_CUDA(x, linearBackward(dx, dw, db, dy, x, w, dyColSum));
  const float* dyp = dy.data<float>();
  if (dx) gemmCpu(Trans::kNo, Trans::kNo, N, I, O, 1.f, dyp, w.data<float>(), 0.f, dx->data<float>());
  gemmCpu(Trans::kYes, Trans::kNo, O, I, N, 1.f, dyp, x.data<float>(), 1.f, dw.data<float>());
  if (db && dyColSum) {
    MT_CHECK(dyColSum->numel() == O && dyColSum->dtype() == DType::kF32, "linear backward: column sums ",
             dyColSum->str(), " for ", O, " outputs");
    float* dbp = db->data<float>();
    const float* sp = dyColSum->data<float>();
    for (int64_t o = 0; o < O; ++o) dbp[o] += sp[o];
  } else if (db) {
    linearBiasGrad(*db, dy);
  }
}

void linearGeluForward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor* b) {
  MT_DISPATCH_CUDA(x, linearGeluForward(y, pre, x, w, b));
  linearForward(pre, x, w, b);
  geluForward(y, pre, GeluKind::kTanh);
}

void linearBackwardDGelu(Tensor& dpre, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         const Tensor& pre, Tensor* dpreColSum) {
  MT_DISPATCH_CUDA(x, linearBackwardDGelu(dpre, dw, db, dy, x, w, pre, dpreColSum));
  Tensor dg = Tensor::empty(dpre.shape(), DType::kF32, dpre.device());
  linearBackward(&dg, dw, db, dy, x, w);
  geluBackward(dpre, dg, pre, GeluKind::kTanh);
}

void Linear::registerParams(ParamTable& table, const std::string& prefix) {
  w_ = &table.add(prefix + "weight", {out_, in_}, true);
  if (hasBias_) b_ = &table.add(prefix + "bias", {out_}, false);
}

void Linear::initParams(Rng& rng) {
  // PyTorch default: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
  const float bound = 1.f / std::sqrt(static_cast<float>(in_));
  initUniform(w_->value, rng, -bound, bound);
  if (b_) initUniform(b_->value, rng, -bound, bound);
}

bool Linear::fp8For(int64_t rows, Device d) const { return fp8_ && Fp8Linear::supports(rows, in_, out_, d); }

int64_t Linear::cachedBytes() const {
  int64_t n = x_.defined() ? static_cast<int64_t>(x_.nbytes()) : 0;
  if (fp8_) n += fp8_->cachedBytes();
  if (wo_.defined() && !wo_.sharesStorageWith(w_->value)) n += static_cast<int64_t>(wo_.nbytes());
  return n;
}

// In reduced precision the input is cast once in forward and the cast is what backward reads
// (half the cached bytes, no second cast). The weight's cast is kept the same way when
// ctx.keepWeightCasts (2 bytes per parameter until backward); sharded training turns it off, as it
// frees the gathered weights between forward and backward.
Tensor Linear::weightOperand(const Context& ctx) {
  if (!ctx.training || !ctx.keepWeightCasts) return w_->value;
  wo_ = castTo(w_->value, matmulDType(w_->value.device()));
  return wo_;
}

Tensor Linear::forward(const Tensor& x, Context& ctx) {
  Shape outShape = x.shape();
  outShape.back() = out_;
  if (fp8For(x)) {
    Tensor y = Tensor::empty(outShape, outputDType(x.device()), x.device());
    fp8_->forward(y, x, w_->value, b_ ? &b_->value : nullptr, nullptr, fp8Mode(ctx));
    return y;
  }
  Tensor xo = castTo(x, matmulDType(x.device()));
  Tensor y = Tensor::empty(outShape, outputDType(x.device()), x.device());
  linearForward(y, xo, weightOperand(ctx), b_ ? &b_->value : nullptr);
  if (ctx.training) x_ = xo;
  return y;
}

Tensor Linear::forwardAdd(const Tensor& x, const Tensor& residual, Context& ctx) {
  Shape outShape = x.shape();
  outShape.back() = out_;
  MT_CHECK(shapeNumel(outShape) == residual.numel(), "linear residual ", residual.str(), " for output ",
           shapeStr(outShape));
  if (fp8For(x)) {
    Tensor y = Tensor::empty(outShape, residual.dtype(), x.device());
    fp8_->forward(y, x, w_->value, b_ ? &b_->value : nullptr, &residual, fp8Mode(ctx));
    return y;
  }
  Tensor xo = castTo(x, matmulDType(x.device()));
  Tensor y = Tensor::empty(outShape, residual.dtype(), x.device());
  linearForward(y, xo, weightOperand(ctx), b_ ? &b_->value : nullptr, &residual);
  if (ctx.training) x_ = xo;
  return y;
}

Tensor Linear::forwardGelu(const Tensor& x, Context& ctx, Tensor* pre) {
  Shape outShape = x.shape();
  outShape.back() = out_;
  if (fp8For(x)) {
    const DType t = outputDType(x.device());
    Tensor y = Tensor::empty(outShape, t, x.device());
    *pre = Tensor::empty(outShape, t, x.device());
    fp8_->forwardGelu(y, *pre, x, w_->value, b_ ? &b_->value : nullptr, fp8Mode(ctx));
    return y;
  }
  Tensor xo = castTo(x, matmulDType(x.device()));
  const DType t = outputDType(x.device());
  Tensor y = Tensor::empty(outShape, t, x.device());
  *pre = Tensor::empty(outShape, t, x.device());
  linearGeluForward(y, *pre, xo, weightOperand(ctx), b_ ? &b_->value : nullptr);
  if (ctx.training) x_ = xo;
  return y;
}

void Linear::restoreInput(const Tensor& x, Context& ctx) {
  MT_CHECK(ctx.training && x.dim(-1) == in_, "linear: restoring input ", x.str(), " outside training or for ",
           in_, " inputs");
  if (fp8For(x)) {
    fp8_->restore(x, w_->value);
    return;
  }
  x_ = castTo(x, matmulDType(x.device()));
  if (!wo_.defined()) weightOperand(ctx);
}

Tensor Linear::forwardFromLayerNorm(LayerNorm& ln, const Tensor& x, Context& ctx) {
  const int64_t rows = x.numel() / x.dim(-1);
  if (fp8For(rows, x.device())) {
    Shape outShape = x.shape();
    outShape.back() = out_;
    Tensor y = Tensor::empty(outShape, outputDType(x.device()), x.device());
    const auto produce = [&](const LayerNormFp8Out& o) { return ln.forwardFp8(x, ctx, o); };
    if (fp8_->forwardProduced(y, rows, produce, w_->value, b_ ? &b_->value : nullptr, fp8Mode(ctx))) return y;
  }
  return forward(ln.forward(x, ctx), ctx);
}

void Linear::restoreInputFromLayerNorm(LayerNorm& ln, const Tensor* x, Context& ctx) {
  const Tensor& in = x ? *x : ln.keptInput();
  MT_CHECK(in.defined(), "linear: restoring a LayerNorm's output without its training forward");
  const int64_t rows = in.numel() / in.dim(-1);
  if (ctx.training && fp8For(rows, in.device())) {
    const auto produce = [&](const LayerNormFp8Out& o) { return x ? ln.forwardFp8(*x, ctx, o) : ln.recomputeFp8(o); };
    if (fp8_->restoreProduced(rows, produce, w_->value)) return;
  }
  restoreInput(x ? ln.forward(*x, ctx) : ln.recomputeOutput(), ctx);
}

Tensor Linear::forwardAddGelu(const Tensor& pre, const Tensor& residual, Context& ctx) {
  if (fp8For(pre)) {
    Shape outShape = pre.shape();
    outShape.back() = out_;
    MT_CHECK(shapeNumel(outShape) == residual.numel(), "linear residual ", residual.str(), " for output ",
             shapeStr(outShape));
    Tensor y = Tensor::empty(outShape, residual.dtype(), pre.device());
    fp8_->forwardFromGelu(y, pre, w_->value, b_ ? &b_->value : nullptr, &residual, fp8Mode(ctx));
    return y;
  }
  Tensor g = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
  geluForward(g, pre, GeluKind::kTanh);
  return forwardAdd(g, residual, ctx);
}

void Linear::restoreInputGelu(const Tensor& pre, Context& ctx) {
  if (fp8For(pre)) {
    MT_CHECK(ctx.training && pre.dim(-1) == in_, "linear: restoring input GELU(", pre.str(),
             ") outside training or for ", in_, " inputs");
    fp8_->restoreFromGelu(pre, w_->value);
    return;
  }
  Tensor g = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
  geluForward(g, pre, GeluKind::kTanh);
  restoreInput(g, ctx);
}

Tensor Linear::backwardThroughGelu(const Tensor& dg, const Tensor& pre, Context& ctx) {
  if (fp8_ && fp8_->holdsCache()) {
    Shape inShape = dg.shape();
    inShape.back() = in_;
    const DType dxType = lowInputGrad_ ? matmulDType(dg.device()) : DType::kF32;
    Tensor dx = needsInputGrad_ ? Tensor::empty(inShape, dxType, dg.device()) : Tensor();
    fp8_->backwardFromDGelu(dx.defined() ? &dx : nullptr, w_->grad, b_ ? &b_->grad : nullptr, dg, pre, w_->value);
    return dx;
  }
  Tensor dpre = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
  geluBackward(dpre, dg, pre, GeluKind::kTanh);
  return backward(dpre, ctx);
}

Tensor Linear::backwardDGelu(const Tensor& dy, const Tensor& pre, Context&, Tensor* preColSum) {
  if (fp8_ && fp8_->holdsCache()) {  // dpre = (dy W) * GELU'(pre)
    Tensor dpre = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
    fp8_->backwardDGelu(dpre, w_->grad, b_ ? &b_->grad : nullptr, dy, w_->value, pre);
    return dpre;  // *preColSum stays undefined: the caller sums the columns itself
  }
  MT_CHECK(x_.defined(), "Linear::backward without a training forward");
  MT_CHECK(pre.numel() == x_.numel(), "linear+dGELU: pre-activation ", pre.str(), " for input ", x_.str());
  // In the matmul dtype when pre is (the gradient feeds the previous layer's GEMMs).
  Tensor dpre = Tensor::empty(x_.shape(), pre.dtype(), x_.device());
  linearBackwardDGelu(dpre, w_->grad, b_ ? &b_->grad : nullptr, dy, x_, wo_.defined() ? wo_ : w_->value, pre,
                      preColSum);
  x_ = Tensor();
  wo_ = Tensor();
  return dpre;
}

Tensor Linear::backward(const Tensor& dy, Context& ctx) { return backward(dy, ctx, Tensor()); }

Tensor Linear::backward(const Tensor& dy, Context&, const Tensor& dyColSum) {
  const DType dxType = lowInputGrad_ ? matmulDType(dy.device()) : DType::kF32;
  if (fp8_ && fp8_->holdsCache()) {
    Shape inShape = dy.shape();
    inShape.back() = in_;
    Tensor dx = needsInputGrad_ ? Tensor::empty(inShape, dxType, dy.device()) : Tensor();
    fp8_->backward(dx.defined() ? &dx : nullptr, w_->grad, b_ ? &b_->grad : nullptr, dy, w_->value,
                   dyColSum.defined() ? &dyColSum : nullptr);
    return dx;
  }
  MT_CHECK(x_.defined(), "Linear::backward without a training forward");
  Tensor dx = needsInputGrad_ ? Tensor::empty(x_.shape(), dxType, x_.device()) : Tensor();
  linearBackward(dx.defined() ? &dx : nullptr, w_->grad, b_ ? &b_->grad : nullptr, dy, x_,
                 wo_.defined() ? wo_ : w_->value, dyColSum.defined() ? &dyColSum : nullptr);
  x_ = Tensor();
  wo_ = Tensor();
  return dx;
}

std::vector<Param*> Linear::params() {
  if (b_) return {w_, b_};
  return {w_};
}

Shape Linear::outputShape(const Shape& in) const {
  Shape s = in;
  s.back() = out_;
  return s;
}

}  // namespace mt
