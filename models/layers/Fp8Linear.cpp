#include "models/layers/Fp8Linear.h"

#include <optional>

#include "core/Check.h"
#include "core/EnvParams.h"
#include "core/Parallel.h"
#include "models/layers/Activation.h"

#ifdef MT_WITH_CUDA
#include "models/kernels/CudaLayers.h"
#endif

namespace mt {

namespace {

Tensor codes(const Shape& s, Device d) {
  return Tensor::empty(s, DType::kU8, d);
}

Fp8GemmArgs gemmArgs(int64_t M, int64_t N, int64_t K, const Tensor& A, Fp8Format fa, const Fp8State& sa,
                     const Tensor& B, Fp8Format fb, const Fp8State& sb, Tensor& D) {
  Fp8GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = &A, g.B = &B, g.fa = fa, g.fb = fb, g.sa = &sa, g.sb = &sb, g.D = &D;
  return g;
}

}  // namespace

void linearBiasGrad(Tensor& db, const Tensor& dy) {
  const int64_t O = db.numel(), N = dy.numel() / O;
  MT_CHECK(db.dtype() == DType::kF32 && dy.numel() == N * O, "bias gradient ", db.str(), " of ", dy.str());
#ifdef MT_WITH_CUDA
  if (dy.device().isCuda()) {
    cuda::linearBiasGrad(db, dy);
    return;
  }
#endif
  MT_CHECK(dy.dtype() == DType::kF32, "bias gradient of ", dy.str(), " on the CPU");
  const float* dyp = dy.data<float>();
  float* dbp = db.data<float>();
  parallelFor(O, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      double acc = 0.0;  // f64 so the column sum does not depend on the batch split
      for (int64_t n = 0; n < N; ++n)
        acc += dyp[n * O + o];
      dbp[o] += static_cast<float>(acc);
    }
  });
}

Fp8Linear::Fp8Linear(const Fp8Training& t)
    : cfg_(t),
      sx_(Fp8Format::kE4M3, t.options, Device::cpu()),
      sw_(Fp8Format::kE4M3, t.options, Device::cpu()),
      sdy_(t.gradFormat, t.options, Device::cpu()),
      geluMode_(static_cast<int>(envInt(EnvParam::kFp8Gelu))) {}

bool Fp8Linear::supports(int64_t rows, int64_t in, int64_t out, Device d) {
  return d.isCpu() || (rows % 16 == 0 && in % 16 == 0 && out % 16 == 0);
}

void Fp8Linear::onDevice(Device d) {
  sx_.moveTo(d);
  sw_.moveTo(d);
  sdy_.moveTo(d);
}

int64_t Fp8Linear::cachedBytes() const {
  return (xt_.defined() ? xt_.numel() : 0) + (wt_.defined() ? wt_.numel() : 0);
}

std::pair<const Fp8State*, const Fp8State*> Fp8Linear::castOperands(Tensor& qx, Tensor& qw, const Fp8CastInput& xin,
                                                                    const Tensor& w, Mode mode,
                                                                    std::optional<Fp8State>* scratch) {
  const Tensor& x = *xin.x;
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  const Device d = x.device();
  MT_CHECK(x.dim(-1) == I && supports(N, I, O, d), "fp8 linear shapes x=", x.str(), " w=", w.str());
  onDevice(d);
  const Tensor x2 = x.view({N, I});
  Fp8CastInput in = xin;
  in.x = &x2;
  qx = codes({N, I}, d);
  qw = codes({O, I}, d);
  if (mode == Mode::kEval) {  // scratch states with current scaling: the training state stays as it is
    Fp8Options o = cfg_.options;
    o.recipe = Fp8Recipe::kCurrent;
    scratch[0].emplace(Fp8Format::kE4M3, o, d);
    scratch[1].emplace(Fp8Format::kE4M3, o, d);
    fp8QuantizeFrom(qx, in, *scratch[0], nullptr);
    fp8Quantize(qw, w, *scratch[1], nullptr);
    return {&*scratch[0], &*scratch[1]};
  }
  xt_ = codes({I, N}, d);
  wt_ = codes({I, O}, d);
  if (mode == Mode::kReplay) {
    fp8QuantizeReplayFrom(qx, in, sx_, &xt_);
    fp8QuantizeReplay(qw, w, sw_, &wt_);
  } else {
    fp8QuantizeFrom(qx, in, sx_, &xt_);
    fp8Quantize(qw, w, sw_, &wt_);
  }
  return {&sx_, &sw_};
}

void Fp8Linear::forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* residual,
                        Mode mode) {
  forwardFrom(y, Fp8CastInput{&x}, w, b, residual, mode);
}

void Fp8Linear::forwardFromGelu(Tensor& y, const Tensor& pre, const Tensor& w, const Tensor* b,
                                const Tensor* residual, Mode mode) {
  forwardFrom(y, Fp8CastInput{&pre, Fp8CastOp::kGelu}, w, b, residual, mode);
}

void Fp8Linear::forwardFrom(Tensor& y, const Fp8CastInput& xin, const Tensor& w, const Tensor* b,
                            const Tensor* residual, Mode mode) {
  const int64_t O = w.dim(0), N = xin.x->numel() / w.dim(1);
  MT_CHECK(y.numel() == N * O, "fp8 linear output ", y.str(), " for x=", xin.x->str(), " w=", w.str());
  Tensor qx, qw;
  std::optional<Fp8State> scratch[2];
  const auto [sx, sw] = castOperands(qx, qw, xin, w, mode, scratch);
  gemmForward(y, qx, *sx, qw, *sw, b, residual);
}

void Fp8Linear::gemmForward(Tensor& y, const Tensor& qx, const Fp8State& sx, const Tensor& qw, const Fp8State& sw,
                            const Tensor* b, const Tensor* residual) {
  const int64_t N = qx.dim(0), I = qx.dim(1), O = qw.dim(0);
  Tensor y2 = y.view({N, O});
  Tensor r2;
  Fp8GemmArgs g = gemmArgs(N, O, I, qx, Fp8Format::kE4M3, sx, qw, Fp8Format::kE4M3, sw, y2);
  if (residual) {  // read as the GEMM's C (beta = 1)
    MT_CHECK(residual->dtype() == y.dtype() && residual->numel() == y.numel(), "fp8 linear residual ",
             residual->str(), " for ", y.str());
    r2 = residual->view({N, O});
    g.C = &r2;
    g.beta = 1.f;
  }
  g.bias = b;
  g.fastAccum = true;  // forward only, as Transformer Engine: gradients keep the promoted sums
  fp8Gemm(g);
}

bool Fp8Linear::produceOperands(Tensor& qx, Tensor& qw, int64_t rows, const Producer& produce, const Tensor& w,
                                bool replay) {
  const int64_t O = w.dim(0), I = w.dim(1);
  const Device d = w.device();
  if (!supports(rows, I, O, d)) return false;
  onDevice(d);
  qx = codes({rows, I}, d);
  Tensor xt = codes({I, rows}, d);
  if (!produce(LayerNormFp8Out{&qx, &xt, &sx_, replay})) return false;
  xt_ = xt;
  qw = codes({O, I}, d);
  wt_ = codes({I, O}, d);
  if (replay) fp8QuantizeReplay(qw, w, sw_, &wt_);
  else fp8Quantize(qw, w, sw_, &wt_);
  return true;
}

bool Fp8Linear::forwardProduced(Tensor& y, int64_t rows, const Producer& produce, const Tensor& w, const Tensor* b,
                                Mode mode) {
  MT_CHECK(y.numel() == rows * w.dim(0), "fp8 linear output ", y.str(), " for ", rows, " rows, w=", w.str());
  Tensor qx, qw;
  if (mode == Mode::kEval || !produceOperands(qx, qw, rows, produce, w, mode == Mode::kReplay)) return false;
  gemmForward(y, qx, sx_, qw, sw_, b, nullptr);
  return true;
}

bool Fp8Linear::restoreProduced(int64_t rows, const Producer& produce, const Tensor& w) {
  Tensor qx, qw;
  return produceOperands(qx, qw, rows, produce, w, true);
}

void Fp8Linear::forwardGelu(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor* b,
                            Mode mode) {
  const int64_t O = w.dim(0), N = x.numel() / w.dim(1);
  MT_CHECK(y.numel() == N * O && pre.numel() == y.numel() && pre.dtype() == y.dtype(),
           "fp8 linear+GELU output ", y.str(), " and pre-activation ", pre.str(), " for x=", x.str(),
           " w=", w.str());
  Tensor qx, qw;
  std::optional<Fp8State> scratch[2];
  const auto [sx, sw] = castOperands(qx, qw, Fp8CastInput{&x}, w, mode, scratch);
  Tensor y2 = y.view({N, O}), pre2 = pre.view({N, O});
  Fp8GemmArgs g = gemmArgs(N, O, w.dim(1), qx, Fp8Format::kE4M3, *sx, qw, Fp8Format::kE4M3, *sw, y2);
  g.bias = b;
  g.fastAccum = true;
  g.geluPre = &pre2;
  if ((geluMode_ == 1 || geluMode_ == 2) && fp8GemmGelu(g)) return;
  g.geluPre = nullptr;  // no FP8 GELU epilogue: the GEMM into pre, then the GELU kernel
  g.D = &pre2;
  fp8Gemm(g);
  geluForward(y, pre, GeluKind::kTanh);
}

void Fp8Linear::restore(const Tensor& x, const Tensor& w) { restoreFrom(Fp8CastInput{&x}, w); }

void Fp8Linear::restoreFromGelu(const Tensor& pre, const Tensor& w) {
  restoreFrom(Fp8CastInput{&pre, Fp8CastOp::kGelu}, w);
}

void Fp8Linear::restoreFrom(const Fp8CastInput& xin, const Tensor& w) {
  const int64_t O = w.dim(0), I = w.dim(1), N = xin.x->numel() / I;
  const Device d = xin.x->device();
  onDevice(d);
  const Tensor x2 = xin.x->view({N, I});
  Fp8CastInput in = xin;
  in.x = &x2;
  Tensor qx = codes({N, I}, d), qw = codes({O, I}, d);
  xt_ = codes({I, N}, d);
  wt_ = codes({I, O}, d);
  fp8QuantizeReplayFrom(qx, in, sx_, &xt_);
  fp8QuantizeReplay(qw, w, sw_, &wt_);
}

void Fp8Linear::backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& w,
                         const Tensor* dyColSum) {
  backwardGemms(dx, nullptr, dw, db, Fp8CastInput{&dy}, w, dyColSum);
}

void Fp8Linear::backwardFromDGelu(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dg, const Tensor& pre,
                                  const Tensor& w) {
  MT_CHECK(pre.numel() == dg.numel(), "fp8 linear: the GELU's output gradient ", dg.str(), " for pre-activation ",
           pre.str());
  backwardGemms(dx, nullptr, dw, db, Fp8CastInput{&dg, Fp8CastOp::kDGelu, &pre}, w, nullptr);
}

void Fp8Linear::backwardDGelu(Tensor& dpre, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& w,
                              const Tensor& pre) {
  MT_CHECK(pre.numel() == dpre.numel() && pre.dtype() == dpre.dtype(), "fp8 linear+dGELU: pre-activation ",
           pre.str(), ", its gradient ", dpre.str());
  backwardGemms(&dpre, &pre, dw, db, Fp8CastInput{&dy}, w, nullptr);
}

void Fp8Linear::backwardGemms(Tensor* dx, const Tensor* xPre, Tensor& dw, Tensor* db, const Fp8CastInput& dyIn,
                              const Tensor& w, const Tensor* dyColSum) {
  MT_CHECK(xt_.defined() && wt_.defined(), "fp8 linear backward without a training forward");
  const int64_t O = w.dim(0), I = w.dim(1), N = xt_.dim(1);
  const Tensor& dy = *dyIn.x;
  const Device d = dy.device();
  MT_CHECK(dy.numel() == N * O, "fp8 linear backward: dy ", dy.str(), " for ", N, " x ", O);
  Tensor qdy = codes({N, O}, d), qdyt = codes({O, N}, d);
  const Tensor dy2 = dy.view({N, O});
  Fp8CastInput in = dyIn;
  in.x = &dy2;
  Tensor colSum;  // a dGELU cast's column sums: the bias gradient from the same pass
  if (in.op == Fp8CastOp::kDGelu && db) {
    colSum = Tensor::empty({O}, DType::kF32, d);
    in.colSum = &colSum;
    dyColSum = &colSum;
  }
  fp8QuantizeFrom(qdy, in, sdy_, &qdyt);
  if (dx) {
    Tensor dx2 = dx->view({N, I});
    Fp8GemmArgs g = gemmArgs(N, I, O, qdy, cfg_.gradFormat, sdy_, wt_, Fp8Format::kE4M3, sw_, dx2);
    if (xPre) {  // dx = (dy W) * GELU'(xPre): the DGELU epilogue, else the GEMM then the GELU kernel
      const Tensor pre2 = xPre->view({N, I});
      g.dgeluPre = &pre2;
      if (geluMode_ != 2 || !fp8GemmGelu(g)) {
        Tensor dg = Tensor::empty({N, I}, DType::kF32, d);  // f32: the path measured and tested on the GPU
        g.dgeluPre = nullptr;
        g.D = &dg;
        fp8Gemm(g);
        geluBackward(dx2, dg, pre2, GeluKind::kTanh);
      }
    } else {
      fp8Gemm(g);
    }
  }
  Fp8GemmArgs g = gemmArgs(O, I, N, qdyt, cfg_.gradFormat, sdy_, xt_, Fp8Format::kE4M3, sx_, dw);
  g.beta = 1.f;
  fp8Gemm(g);
  if (db && dyColSum) {
    MT_CHECK(dyColSum->numel() == O && dyColSum->dtype() == DType::kF32, "fp8 linear: column sums ",
             dyColSum->str(), " for ", O, " outputs");
    linearBiasGrad(*db, dyColSum->view({1, O}));  // a sum over one row: db += colsum
  } else if (db) {
    linearBiasGrad(*db, dy);
  }
  clear();
}

}  // namespace mt
