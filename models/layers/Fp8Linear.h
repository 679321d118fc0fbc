#pragma once
// The FP8 path of a Linear layer (train.precision = fp8; core/Fp8.h for the formats and scaling).
//   forward   y[N,O]  = sx^-1 sw^-1 · (q(x·sx)[N,I] · q(W·sw)[O,I]^T) + b (+ residual)   E4M3 x E4M3 -> y
//   backward  dx[N,I] = sdy^-1 sw^-1 · (q(dy·sdy)[N,O] · q(W·sw)^T[I,O]^T)            E5M2 x E4M3 -> dx
//             dW[O,I] += sdy^-1 sx^-1 · (q(dy·sdy)^T[O,N] · q(x·sx)^T[I,N]^T)          E5M2 x E4M3 -> f32
//             db[O]   += colsum(dy)  (the unquantized gradient, as Transformer Engine)
// q() rounds to FP8 (the gradient format is Fp8Training::gradFormat, E5M2 by default); each of x,
// W and dy has its own scaling state (recipe current or delayed). Every GEMM is "TN" (both operands
// K-contiguous, as cuBLASLt's FP8 kernels require), so the casts of x and W also write their
// transposes, which backward reads: what forward keeps is the 1-byte x^T and W^T instead of the
// bf16 x (half the activation bytes of the layer's input). The f32 master weight is cast once per
// forward, i.e. once per optimizer step (per micro-batch with gradient accumulation), so the FP8
// weight copy always follows the last step.
// Recomputation (activation checkpointing) replays the casts with the scales forward used, so the
// codes and the scaling state are those of a run without checkpointing. Evaluation (no training)
// casts with current scaling into scratch states, leaving the training state alone.
// Around a GELU (GPT's MLP, MT_FP8_GELU = 3) the casts take the GELU's place: the layer after it
// casts x = GELU(pre) from pre (forwardFromGelu), the layer before it casts its gradient
// dy = dg * GELU'(pre) from dg and pre and sums db in the same pass (backwardFromDGelu); the
// GELU's output and its gradient never go through memory. After a LayerNorm (GPT's ln_1 -> qkv and
// ln_2 -> fc; Linear::forwardFromLayerNorm) the LayerNorm kernel itself writes x's codes and x^T
// with this layer's x state where it can (forwardProduced: the GPU, delayed scaling), so the
// LayerNorm's output is never written either.
// On the GPU cuBLASLt needs N, I and O multiples of 16 (supports()); a call that is not runs the
// layer's bf16 path. The CPU emulation takes any shape.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/Fp8.h"
#include "core/Tensor.h"
#include "models/layers/KernelTypes.h"

namespace mt {

struct Fp8Training {
  bool enabled = false;
  Fp8Options options;
  Fp8Format gradFormat = Fp8Format::kE5M2;
};

class Fp8Linear {
 public:
  enum class Mode { kTrain, kReplay, kEval };
  explicit Fp8Linear(const Fp8Training& t);
  static bool supports(int64_t rows, int64_t in, int64_t out, Device d);
  // y = x W^T + b (+ residual, y's shape and dtype; y may be f32 or bf16). kTrain and kReplay keep
  // x^T and W^T for backward.
  void forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* residual,
               Mode mode);
  // y = GELU(x W^T + b) (tanh form) with pre = x W^T + b kept for backwardDGelu (y's shape and
  // dtype): the GEMM into pre, then the GELU kernel; with MT_FP8_GELU = 1 or 2 one GEMM
  // where cuBLASLt has the FP8 GELU_AUX_BIAS epilogue (slower on the H100, so not the default).
  void forwardGelu(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor* b, Mode mode);
  // forward with x = GELU(pre) (tanh form): the cast reads pre and applies the GELU on the way to
  // the codes (fp8QuantizeFrom, kGelu), so GELU(pre) is never written (the GPT MLP's fcProj).
  void forwardFromGelu(Tensor& y, const Tensor& pre, const Tensor& w, const Tensor* b, const Tensor* residual,
                       Mode mode);
  // The input's codes made by the kernel that produces the input (LayerNorm::forwardFp8 or
  // recomputeFp8): produce(out) writes x's codes and x^T into out with this layer's x state (replayed
  // for kReplay) and says whether it did. forwardProduced: forward with those codes (no residual);
  // restoreProduced: restore with them, replayed. False, with nothing done, where produce made none,
  // and for kEval (evaluation casts with scratch states): the caller then makes x and calls forward.
  using Producer = std::function<bool(const LayerNormFp8Out&)>;
  bool forwardProduced(Tensor& y, int64_t rows, const Producer& produce, const Tensor& w, const Tensor* b, Mode mode);
  bool restoreProduced(int64_t rows, const Producer& produce, const Tensor& w);
  // What forward(kReplay) keeps, without the GEMM (the layer's output was kept); FromGelu: of
  // forwardFromGelu.
  void restore(const Tensor& x, const Tensor& w);
  void restoreFromGelu(const Tensor& pre, const Tensor& w);
  // dx (optional, f32 or bf16) overwritten; dw, db accumulate. dyColSum: colsum(dy) already made.
  void backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& w,
                const Tensor* dyColSum);
  // For a layer whose input was GELU(pre): dpre = (dy W) * GELU'(pre) (overwritten; pre's dtype):
  // the input-gradient GEMM in f32, then the GELU kernel; with MT_FP8_GELU = 2
  // its DGELU epilogue where cuBLASLt has it. dw, db as in backward.
  void backwardDGelu(Tensor& dpre, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& w,
                     const Tensor& pre);
  // backward for a layer whose output went through a GELU: dy = dg * GELU'(pre), with dg the
  // gradient at the GELU's output and pre this layer's output before it, cast in one pass that
  // also sums dy's columns into db (fp8QuantizeFrom, kDGelu): the GPT MLP's fc, so that dy is never
  // written. dx (optional) overwritten; dw, db accumulate.
  void backwardFromDGelu(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dg, const Tensor& pre, const Tensor& w);
  bool holdsCache() const { return xt_.defined(); }
  static constexpr int kGeluInCasts = 3;
  bool geluInCasts() const { return geluMode_ == kGeluInCasts; }
  void clear() {
    xt_ = Tensor();
    wt_ = Tensor();
  }
  int64_t cachedBytes() const;
  // x, w, dy: the layer's scaling states (checkpointed; moved to the tensors' device at first use).
  std::vector<std::pair<std::string, Fp8State*>> states() {
    return {{"x", &sx_}, {"w", &sw_}, {"dy", &sdy_}};
  }

 private:
  void onDevice(Device d);
  // The casts of x and W (kTrain / kReplay also keep x^T and W^T); the scaling states they used:
  // the layer's, or for kEval the two scratch states made in scratch[0..1].
  std::pair<const Fp8State*, const Fp8State*> castOperands(Tensor& qx, Tensor& qw, const Fp8CastInput& xin,
                                                           const Tensor& w, Mode mode,
                                                           std::optional<Fp8State>* scratch);
  // produce's x codes into qx (x^T kept), then W cast (its transpose kept); false where produce made none.
  bool produceOperands(Tensor& qx, Tensor& qw, int64_t rows, const Producer& produce, const Tensor& w, bool replay);
  // y = sx^-1 sw^-1 (qx qw^T) + b (+ residual): the forward GEMM.
  void gemmForward(Tensor& y, const Tensor& qx, const Fp8State& sx, const Tensor& qw, const Fp8State& sw,
                   const Tensor* b, const Tensor* residual);
  void forwardFrom(Tensor& y, const Fp8CastInput& xin, const Tensor& w, const Tensor* b, const Tensor* residual,
                   Mode mode);
  void restoreFrom(const Fp8CastInput& xin, const Tensor& w);
  // xPre: this layer's input was GELU(*xPre) (backwardDGelu: dx becomes the gradient at xPre);
  // dyIn: what the gradient cast reads (dy itself, or a dGELU for backwardFromDGelu).
  void backwardGemms(Tensor* dx, const Tensor* xPre, Tensor& dw, Tensor* db, const Fp8CastInput& dyIn,
                     const Tensor& w, const Tensor* dyColSum);
  Fp8Training cfg_;
  Fp8State sx_, sw_, sdy_;
  Tensor xt_, wt_;     // codes of x^T [I,N] and W^T [I,O], kept from forward for backward
  // MT_FP8_GELU, read once (a bad value fails at model setup): 1 and 2 pick the GELU epilogues of
  // forwardGelu / backwardDGelu; 3 (kGeluInCasts) asks the model for forwardFromGelu and
  // backwardFromDGelu, and forwardGelu / backwardDGelu then run as with 0.
  int geluMode_;
};

// db[O] += colsum(dy [N,O]) (f32 db; dy f32 or, on the GPU, bf16/f16): the bias gradient of a
// linear layer (f64 sums on the CPU, the deterministic column-sum kernels on the GPU).
void linearBiasGrad(Tensor& db, const Tensor& dy);

}  // namespace mt
