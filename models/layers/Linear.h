#pragma once
// Linear: y[N,O] = x[N,I] · W[O,I]^T + b[O]   (W in PyTorch's [out, in] layout)
// Backward:
//   dx[N,I] = dy[N,O] · W                 (overwrites)
//   dW[O,I] += dy^T · x                   (accumulates)
//   db[O]   += sum_n dy[n,:]              (accumulates)
// Leading dimensions of x other than the last are flattened into N.
// CUDA: x and W may be bf16/f16 (read as they are; f32 ones are cast), y f32 or bf16/f16.
// FP8 (enableFp8; models/layers/Fp8Linear.h): the three GEMMs in FP8 with per-tensor scaling, on
// the GPU through cuBLASLt, on the CPU emulated with the same rounding.

#include <memory>

#include "models/Module.h"
#include "models/layers/Fp8Linear.h"
#include "models/layers/LayerNorm.h"

namespace mt {

// residual (optional, y's shape and dtype): y = x W^T + b + residual, in the same pass.
void linearForward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* residual = nullptr);
// dyColSum (optional, f32 [out]): colsum(dy) already computed elsewhere (a GEMM epilogue); db += it.
void linearBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Tensor* dyColSum = nullptr);
// A linear layer followed by the tanh GELU (GPT-2's MLP): y = GELU(x W^T + b), with the
// pre-activation pre = x W^T + b (y's shape and dtype) kept for backward. On CUDA in reduced
// precision one GEMM (cuBLASLt GELU_AUX_BIAS epilogue); elsewhere the GEMM then the GELU kernel.
void linearGeluForward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor* b);
// The backward of a linear layer whose input was GELU(pre): dpre = (dy W) * GELU'(pre) (overwrites;
// the gradient at the GELU's input), dW and db accumulate as in linearBackward. On CUDA in reduced
// precision the DGELU epilogue of the input-gradient GEMM. dpreColSum (optional): where that GEMM can
// also reduce colsum(dpre) (the bias gradient of the layer that produced pre; DGELU_BGRAD), it is
// set to that f32 [in] vector; left undefined otherwise (the caller computes it as usual).
void linearBackwardDGelu(Tensor& dpre, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         const Tensor& pre, Tensor* dpreColSum = nullptr);

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true) : in_(in), out_(out), hasBias_(bias) {}
  std::string kind() const override { return "linear"; }
  // The input as the GEMM reads it: the f32 input itself, or its cast into the matmul dtype.
  CachePlan cachePlan(const Shape& in, const PlanContext& pc) const override {
    CachePlan p;
    if (pc.matmul == DType::kF32) p.input = true;
    else p.extraBytes = shapeNumel(in) * static_cast<int64_t>(dtypeSize(pc.matmul));
    return p;
  }
  LayerAttributes attributes() const override {
    return {attrNumber("in_features", static_cast<double>(in_)), attrNumber("out_features", static_cast<double>(out_)),
            attrNumber("bias", hasBias_ ? 1 : 0)};
  }
  void registerParams(ParamTable& table, const std::string& prefix) override;
  void initParams(Rng& rng) override;
  Tensor forward(const Tensor& x, Context& ctx) override;
  // forward(x) + residual (a residual connection fused into the GEMM); output in residual's dtype.
  Tensor forwardAdd(const Tensor& x, const Tensor& residual, Context& ctx);
  // GELU(forward(x)) with the pre-activation returned in *pre (kept by the caller for the next
  // layer's backwardDGelu); output and pre in the layer's output dtype.
  Tensor forwardGelu(const Tensor& x, Context& ctx, Tensor* pre);
  // backward(dy) for a layer whose input was GELU(pre): returns the gradient at pre, and in
  // *preColSum (when given and a fused epilogue computed it) colsum of that gradient, f32.
  Tensor backwardDGelu(const Tensor& dy, const Tensor& pre, Context& ctx, Tensor* preColSum = nullptr);
  // forwardAdd(GELU(pre), residual) (tanh GELU): in FP8 the input cast reads pre and applies the
  // GELU itself (Fp8Linear::forwardFromGelu), so GELU(pre) is never written; otherwise the GELU
  // kernel, then forwardAdd. The layer after GPT's fc.
  Tensor forwardAddGelu(const Tensor& pre, const Tensor& residual, Context& ctx);
  // restoreInput(GELU(pre)), the same way.
  void restoreInputGelu(const Tensor& pre, Context& ctx);
  // backward(dg * GELU'(pre)) for a layer whose output pre went through a GELU (GPT's fc), dg the
  // gradient at the GELU's output: in FP8 one cast pass computes the product, its codes and the
  // bias gradient (Fp8Linear::backwardFromDGelu); otherwise the GELU backward kernel, then backward.
  Tensor backwardThroughGelu(const Tensor& dg, const Tensor& pre, Context& ctx);
  // Whether a forward of x (of `rows` rows) takes the FP8 path (enabled and a shape cuBLASLt's FP8
  // kernels take).
  bool fp8For(const Tensor& x) const { return fp8For(x.numel() / in_, x.device()); }
  bool fp8For(int64_t rows, Device d) const;
  // What forward(x) keeps for backward (the input as the GEMM reads it, the weight's cast where
  // kept), without the GEMM: activation checkpointing kept the output and recomputed the input.
  // A weight cast kept from forward is used as it is.
  void restoreInput(const Tensor& x, Context& ctx);
  // forward(ln.forward(x)) (GPT's ln_1 -> qkv and ln_2 -> fc): in FP8 training the LayerNorm kernel
  // writes this layer's input codes itself (LayerNorm::forwardFp8), so its output is never written.
  Tensor forwardFromLayerNorm(LayerNorm& ln, const Tensor& x, Context& ctx);
  // restoreInput(ln.forward(*x)), or restoreInput(ln.recomputeOutput()) when x is null, the same way.
  void restoreInputFromLayerNorm(LayerNorm& ln, const Tensor* x, Context& ctx);
  // Drops the input forward kept (not the weight's cast; FP8: both operands' codes, which
  // restoreInput's replay cast makes again bit for bit): restoreInput gives it back before backward.
  void releaseInput() {
    x_ = Tensor();
    if (fp8_) fp8_->clear();
  }
  // dx in the matmul dtype (its consumer is a GEMM or a kernel that reads reduced precision).
  void setLowPrecisionInputGrad(bool low) { lowInputGrad_ = low; }
  // FP8 GEMMs from now on (train.precision = fp8): the scaling states start afresh.
  void enableFp8(const Fp8Training& t) { fp8_ = std::make_unique<Fp8Linear>(t); }
  Fp8Linear* fp8() const { return fp8_.get(); }
  // While set, FP8 casts replay the scales of the forward being recomputed (activation
  // checkpointing): the codes and the scaling state are those of a run that kept everything.
  void setRecomputing(bool on) { recomputing_ = on; }
  Tensor backward(const Tensor& dy, Context& ctx) override;
  // backward(dy) with colsum(dy) given (f32 [out], or undefined: computed here) for the bias.
  Tensor backward(const Tensor& dy, Context& ctx, const Tensor& dyColSum);
  std::vector<Param*> params() override;
  Shape outputShape(const Shape& in) const override;
  void clearCache() override {
    x_ = Tensor();
    wo_ = Tensor();
    if (fp8_) fp8_->clear();
  }
  int64_t cachedBytes() const override;

  Param* weight() const { return w_; }
  Param* bias() const { return b_; }

 private:
  int64_t in_, out_;
  bool hasBias_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  bool lowInputGrad_ = false;
  Tensor x_;  // the input as the GEMM read it (bf16/f16 in reduced precision)
  // The weight as the forward GEMM read it, kept for backward when ctx.keepWeightCasts (one
  // cast per step instead of two); undefined otherwise (backward casts again).
  Tensor wo_;
  Tensor weightOperand(const Context& ctx);
  std::unique_ptr<Fp8Linear> fp8_;
  bool recomputing_ = false;
  Fp8Linear::Mode fp8Mode(const Context& ctx) const {
    return !ctx.training  ? Fp8Linear::Mode::kEval
           : recomputing_ ? Fp8Linear::Mode::kReplay
                          : Fp8Linear::Mode::kTrain;
  }
};

}  // namespace mt
