#pragma once
// LayerNorm over the last dimension C (biased variance, eps inside the square root):
//   mean = sum_c x / C,  rstd = 1 / sqrt(sum_c (x - mean)^2 / C + eps),  n = (x - mean) · rstd
//   y = n · w + b
// Backward (per row), with g = dy · w:
//   dx = rstd · (g - mean_c(g) - n · mean_c(g · n))   (overwrites)
//   dw += sum_rows dy · n,  db += sum_rows dy          (accumulate; fixed-size row blocks summed in
//                                                       order, so results do not depend on threads)
// mean and rstd per row are kept for backward.

#include "models/Module.h"
#include "models/layers/KernelTypes.h"

namespace mt {

void layerNormForward(Tensor& y, Tensor* mean, Tensor* rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                      float eps);
// residual (optional, f32 like dx): dx = LayerNorm'(dy) + residual (a residual branch's gradient
// added in the same pass). dy: f32, or bf16/f16 on CUDA. dxLow (CUDA only, optional, allocated
// bf16/f16): a copy of dx in that dtype, written by the same pass, for the GEMMs that read it.
// layerNormForward whose y (of dtype yType) is not written but cast to FP8 by the same kernel (the GPU's
// vectorised one): out.q and out.qt get y's codes and their transpose, with out.st's scale, bit for
// bit the codes fp8Quantize makes of layerNormForward's y (and out.st updated as MT_FP8_FUSED >= 1
// updates it). False, with nothing done, where that kernel does not apply: the CPU (whose cast is
// the emulation of this one), the current recipe or a state's first cast (the scale needs y's amax),
// a history over 32, rows not a multiple of 32, C not a multiple of 8 or over 2048. The caller then
// runs layerNormForward and casts y.
bool layerNormForwardFp8(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* mean, Tensor* rstd, float eps,
                         DType yType, const LayerNormFp8Out& out);
void layerNormBackward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& mean, const Tensor& rstd, const Tensor* residual = nullptr,
                       Tensor* dxLow = nullptr);

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t channels, float eps = 1e-5f) : c_(channels), eps_(eps) {}
  std::string kind() const override { return "layernorm"; }
  void registerParams(ParamTable& table, const std::string& prefix) override;
  void initParams(Rng& rng) override;
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  // backward(dy) + residual, in one pass.
  Tensor backwardAdd(const Tensor& dy, const Tensor& residual, Context& ctx);
  // Either of the above (residual optional) that also returns dx in the matmul dtype in *dxLow
  // (dx itself where that is f32), for the GEMMs that read the gradient next.
  Tensor backwardBoth(const Tensor& dy, const Tensor* residual, Context& ctx, Tensor* dxLow);
  // The output of the training forward again, from its kept input (the same kernel on the same
  // input and parameters: the same bits; the statistics are not rewritten). For the GEMM backward
  // that reads it when it was not kept (pointwise recomputation).
  Tensor recomputeOutput() const;
  // forward(x) and recomputeOutput() for an FP8 GEMM's input: the output not written but cast into
  // out by the same kernel (layerNormForwardFp8; forward keeps x, mean and rstd as forward does).
  // False, with nothing done, below MT_FP8_FUSED=2 or where that kernel does not apply.
  bool forwardFp8(const Tensor& x, Context& ctx, const LayerNormFp8Out& out);
  bool recomputeFp8(const LayerNormFp8Out& out) const;
  // The input the last training forward kept (undefined before one, or after clearCache).
  const Tensor& keptInput() const { return x_; }
  std::vector<Param*> params() override { return {w_, b_}; }
  Shape outputShape(const Shape& in) const override { return in; }
  void clearCache() override;
  int64_t cachedBytes() const override;

 private:
  int64_t c_;
  float eps_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  Tensor x_, mean_, rstd_;
};

}  // namespace mt
