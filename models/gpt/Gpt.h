#pragma once
// GPT-2 (Radford et al. 2019), as in llm.c: learned positions, pre-LayerNorm blocks, tanh-GELU MLP,
// tied input/output embeddings, vocabulary padded (50257 -> 50304) so GEMMs are aligned; the padded
// rows take no part in the softmax.
//   x0 = wte[tokens] + wpe[:T]
//   block l:  h = x + proj(attn(qkv(ln1(x)))),   x' = h + fc2(gelu(fc1(ln2(h))))
//   logits = lnf(x_L) wte^T,   loss = mean cross-entropy over valid targets
// The classifier is fused with the loss and, in training, with its own backward: logits are made
// chunk by chunk into one chunk-sized buffer, turned in place into their gradient (softmax -
// onehot) / N (in the matmul dtype on the GPU in reduced precision), and that chunk's dx and wte
// gradient GEMMs run at once, still in forward (the loss gradient needs nothing from later), so the
// logits of one chunk exist at a time, not the whole batch's (6.6 GB at GPT-2 B=64). Loss
// statistics are summed on the GPU and read back once per forward, or left there under
// Context::deferLoss (the trainer reads them at log points). On the GPU, activations that feed a
// GEMM (LayerNorm, qkv, attention, fc and GELU outputs, and the gradients of every GEMM input) are
// in the matmul dtype as well; the residual stream and its gradient stay f32 (LayerNorm backward
// also writes the gradient's copy in the matmul dtype that the projection GEMMs read). The MLP's
// GELU is fused into the fc GEMM and its derivative into fcProj's input-gradient GEMM (cuBLASLt
// epilogues). Backward accumulates into Param::grad. With GptConfig::fp8 (train.precision = fp8) the
// block Linears chosen by fp8Layers multiply in FP8 instead (models/layers/Fp8Linear.h: E4M3
// activations and weights, E5M2 gradients, per-tensor scaling states named by fp8States()); the
// fc GELU then runs as its own kernel, and recomputation replays the forward's FP8 scales.
// Init (GPT-2): N(0, 0.02) weights, N(0, 0.01) positions, residual projections N(0, 0.02/sqrt(2L)),
// zero biases, unit LayerNorm gains.
//
// Sharding units: 0 = the embeddings (wte is needed again by the classifier, so unit 0 stays open
// around the whole pass), 1..L = the blocks, L+1 = the final LayerNorm.
//
// Activation checkpointing (GptConfig::checkpointing, train.activation_checkpointing) decides what a
// training forward keeps of a block for its backward:
//   none       everything backward reads (planActivations lists it by kind)
//   blocks     the block's input only; backward first runs the block's forward again from it
//   selective  the block's input, the qkv GEMM's output and the residual after attention (x1);
//              backward recomputes ln1, attention's forward (from qkv), ln2 and the fc GEMM with its
//              GELU, i.e. everything but the qkv, attention-projection and fcProj GEMMs
//   pointwise  every GEMM's output and attention's (qkv, attention output and statistics, fc's
//              pre-activation) and the residual stream, not what elementwise kernels make from them:
//              ln1's and ln2's outputs and the GELU output are made again from the kept input (and
//              the LayerNorm's statistics) and pre right before the GEMM backward that reads them.
//              Forward is none's, kernel for kernel; the LayerNorms rerun their forward kernel (the
//              same bits), the GELU runs as its own kernel where forward had it in cuBLASLt's fc
//              epilogue (bf16/f16 on the GPU), so there fcProj's weight gradient alone sees GELU
//              outputs a rounding apart (CPU and f32: the same kernel, bit-identical to none). No
//              GEMM runs twice: two LayerNorm passes and one GELU pass more per block (measured at
//              d48 B=16 on an H100: -6.9 % when forward also ran the GELU outside the epilogue) for
//              a third of what a block keeps (6 of 18 N x C x 2 bytes: the LayerNorm and GELU
//              outputs, which torch.compile's partitioner also recomputes)
// With checkpointEvery = k only blocks 0, k, 2k, ... are checkpointed; the others keep everything.
// The recomputation runs between the block's backward hooks (a sharded unit is gathered once for it
// and the backward) with the forward's own kernels on the same inputs, so every recomputed
// activation is bit-identical to the forward's: on the CPU gradients and losses are bit-identical
// to none; on the GPU they are as repeatable as without checkpointing (the atomics of flash
// attention's dq and of the embedding backward make no GPU run bitwise repeatable). Forward runs a
// checkpointed block as usual and then drops what it does not keep: one block's activations live
// at a time.

#include <memory>
#include <string>
#include <vector>

#include "core/EnumTable.h"
#include "models/Model.h"
#include "models/layers/Activation.h"
#include "models/layers/Attention.h"
#include "models/layers/LayerNorm.h"
#include "models/layers/Linear.h"

namespace mt {

enum class ActivationCheckpointing { kNone, kBlocks, kSelective, kPointwise };
const EnumTable<ActivationCheckpointing>& activationCheckpointings();

struct GptConfig {
  int64_t vocab = 50257, paddedVocab = 50304;
  int64_t maxT = 1024;
  int64_t layers = 12, heads = 12, channels = 768;
  int64_t classifierChunk = 8192;  // rows of logits made at once
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  int64_t checkpointEvery = 1;  // blocks 0, k, 2k, ... are checkpointed
  AttentionBackend attention = AttentionBackend::kAuto;  // the GPU's fused attention kernel (model.attention)
  // FP8 training of the block Linears (train.precision = fp8): which of them, and how. Embeddings,
  // LayerNorms, attention and the classifier stay in the matmul dtype (bf16 on the GPU, f32 on the CPU).
  Fp8Training fp8;
  struct Fp8Layers {
    bool qkv = true, proj = true, fc = true, fcProj = true;
  } fp8Layers;
  bool checkpointed(int64_t block) const {
    return checkpointing != ActivationCheckpointing::kNone && block % checkpointEvery == 0;
  }
  // A block whose LayerNorm and GELU outputs are recomputed (pointwise), not the whole block.
  bool pointwise(int64_t block) const {
    return checkpointing == ActivationCheckpointing::kPointwise && checkpointed(block);
  }
  int64_t checkpointedBlocks() const;
  // d6/d12/d24/d36/d48 (GPT-2 124M is d12, 350M d24, 774M d36, 1558M d48); gpt3-2.7b (32 x 2560,
  // 20 heads of 128) and gpt3-6.7b (32 x 4096, 32 heads of 128): GPT-3's shapes.
  static GptConfig preset(const std::string& name);
  int64_t numParams() const;
  // numParams in double precision: finite for any sizes, so a caller can refuse sizes whose
  // int64 counts would overflow before it asks numParams or builds the model.
  double numParamsEstimate() const;
  // Training FLOPs per token (llm.c): 6N + 6 L C T.
  double flopsPerToken(int64_t T) const;
};

class Gpt final : public Model {
 public:
  explicit Gpt(const GptConfig& cfg);
  std::string name() const override { return "gpt"; }
  const GptConfig& config() const { return cfg_; }
  // batch.inputs: tokens [B, T] (i32); batch.targets: next tokens [B, T] (i32/i64, -100 = ignore).
  LossStats forward(const Batch& batch, Context& ctx, int64_t validForMean = -1) override;
  void backward(Context& ctx) override;
  // Inference forward to the logits of the real vocabulary (the padded rows excluded): tokens [B, T]
  // (i32) -> [B, T, vocab], f32 (the classifier GEMM's output dtype; the layers as in forward()).
  // What `trainer logits` writes and the ONNX export is checked against. All B x T x vocab logits
  // exist at once, unlike forward()'s chunks.
  Tensor logits(const Tensor& tokens, Context& ctx);
  void initParams(uint64_t seed) override;
  int64_t activationBytes() const override;
  // What a training forward of B x T tokens keeps, without building or allocating anything: the
  // bf16 path on the GPU in reduced precision, the f32 path (reference attention's T x T
  // probabilities) otherwise; checkpointed blocks keep what cfg.checkpointing says, and the block
  // backward recomputes counts as a backward transient. sharded: the hooks hand out gradient
  // buffers in backward only (sharding): Linear weights' casts are not kept for backward, and wte's
  // classifier gradient waits in a buffer of its own from forward to backward.
  static ActivationPlan planActivations(const GptConfig& cfg, int64_t B, int64_t T, const PlanContext& pc,
                                        bool sharded);
  void clearActivations() override;
  // "h<l>.<qkv|proj|fc|fcproj>.<x|w|dy>" for the blocks' FP8 Linears.
  std::vector<std::pair<std::string, Fp8State*>> fp8States() override;

 private:
  struct Block {
    std::unique_ptr<LayerNorm> ln1, ln2;
    std::unique_ptr<Linear> qkv, proj, fc, fcProj;  // fc is followed by the tanh GELU (Linear::forwardGelu)
    AttentionSaved att;  // what attention backward needs (training)
    Tensor pre;          // fc's output before the GELU (training)
    // Checkpointed blocks, between forward and the recomputation: the block's input (the residual
    // stream), and with selective checkpointing qkv's output and the residual after attention.
    Tensor input, qkvOut, x1;
  };
  // Which layers write their outputs (and input gradients) in the matmul dtype: forward's roles.
  void setPrecisionRoles();
  // Whether the block's GELU runs inside fcProj's and fc's FP8 casts (MT_FP8_GELU = 3, both in
  // FP8 for this many rows): fc's forward writes only pre, fcProj's input cast applies the GELU,
  // fc's gradient cast its derivative (Linear::forwardAddGelu, backwardThroughGelu).
  bool geluInCasts(const Block& b, int64_t rows, Device d) const;
  // Embeddings, blocks and the final LayerNorm of forward(): xf [B*T, C] in the matmul dtype.
  Tensor trunk(const Tensor& tokens, Context& ctx);
  void hookBefore(int unit, bool backward);
  void hookAfter(int unit, bool backward);
  // One block's forward: every layer keeps what its backward reads when ctx.training. Returns the
  // block's output; *qkvOut and *x1 (optional) get qkv's output and the residual after attention.
  // pointwise: the LayerNorm and GELU outputs are not kept (GptConfig::pointwise).
  Tensor blockForward(Block& b, const Tensor& x, Context& ctx, Tensor* qkvOut = nullptr,
                      Tensor* x1 = nullptr, bool pointwise = false);
  // A checkpointed block after its forward: drops what the layers kept but what checkpointing keeps.
  void checkpoint(Block& b, const Tensor& x, const Tensor& qkvOut, const Tensor& x1);
  // Before a checkpointed block's backward: the layers' saved state made again from what was kept.
  void recompute(Block& b, Context& ctx);
  // Block li's backward (dx, dxLow: the gradient at its output, f32 and in the matmul dtype):
  // the gradient at its input, dxLow overwritten with its copy; mlpBackward: the MLP's part.
  Tensor blockBackward(int64_t li, const Tensor& dx, Tensor& dxLow, Context& ctx);
  Tensor mlpBackward(Block& b, const Tensor& dxLow, bool pointwise, Context& ctx);
  static void clearBlock(Block& b);

  GptConfig cfg_;
  Param* wte_ = nullptr;
  Param* wpe_ = nullptr;
  std::vector<Block> blocks_;
  std::unique_ptr<LayerNorm> lnf_;
  // Training state between forward and backward.
  Tensor tokens_;
  Tensor dxf_;        // the classifier's input gradient, made in forward
  Tensor wteGradEarly_;  // wte's classifier gradient, where it cannot go into wte->grad in forward
  Tensor badTarget_;     // i32 [1] on the GPU, set by any batch's out-of-range target (sticky)
  int64_t B_ = 0, T_ = 0;
};

}  // namespace mt
