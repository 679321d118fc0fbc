#include "models/gpt/Gpt.h"

#include <cmath>

#include "models/Init.h"
#include "models/layers/Attention.h"
#include "models/layers/Embedding.h"
#include "models/layers/Precision.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaRuntime.h"
#include "models/kernels/CudaLayers.h"
#endif

namespace mt {

const EnumTable<ActivationCheckpointing>& activationCheckpointings() {
  static const EnumTable<ActivationCheckpointing> kTable = {
      {ActivationCheckpointing::kNone, "none", "keep every activation backward reads"},
      {ActivationCheckpointing::kBlocks, "blocks",
       "keep each block's input, recompute its forward in backward (~1/3 more compute)"},
      {ActivationCheckpointing::kSelective, "selective",
       "keep each block's input, qkv and attention residual; recompute LayerNorms, attention and the fc "
       "GEMM"},
      {ActivationCheckpointing::kPointwise, "pointwise",
       "keep every GEMM's and attention's output; recompute the LayerNorm and GELU outputs in backward (no "
       "GEMM twice)"},
  };
  return kTable;
}

int64_t GptConfig::checkpointedBlocks() const {
  if (checkpointing == ActivationCheckpointing::kNone) return 0;
  return (layers + checkpointEvery - 1) / checkpointEvery;  // blocks 0, k, 2k, ... below L
}

GptConfig GptConfig::preset(const std::string& name) {
  GptConfig c;
  if (name == "d6") c.layers = 6, c.heads = 6, c.channels = 384;
  else if (name == "d12") c.layers = 12, c.heads = 12, c.channels = 768;
  else if (name == "d24") c.layers = 24, c.heads = 16, c.channels = 1024;
  else if (name == "d36") c.layers = 36, c.heads = 20, c.channels = 1280;
  else if (name == "d48") c.layers = 48, c.heads = 25, c.channels = 1600;
  // GPT-3's 2.7B and 6.7B shapes (Brown et al. 2020, table 2.1). 2.7B there has 32 heads of 80;
  // ours are 20 of 128, a head dim the attention kernels are built for, with the same parameters.
  else if (name == "gpt3-2.7b") c.layers = 32, c.heads = 20, c.channels = 2560;
  else if (name == "gpt3-6.7b") c.layers = 32, c.heads = 32, c.channels = 4096;
  else
    throw ConfigError("model.gpt_preset: unknown preset '" + name + "' (d6, d12, d24, d36, d48, gpt3-2.7b, gpt3-6.7b)");
  return c;
}

int64_t GptConfig::numParams() const {
  const int64_t C = channels, L = layers;
  const int64_t perBlock = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return paddedVocab * C + maxT * C + L * perBlock + 2 * C;
}

double GptConfig::numParamsEstimate() const {
  const double C = static_cast<double>(channels), L = static_cast<double>(layers);
  return (static_cast<double>(paddedVocab) + static_cast<double>(maxT)) * C + L * (12 * C * C + 13 * C) + 2 * C;
}

double GptConfig::flopsPerToken(int64_t T) const {
  return 6.0 * static_cast<double>(numParams()) + 6.0 * static_cast<double>(layers * channels * T);
}

Gpt::Gpt(const GptConfig& cfg) : cfg_(cfg) {
  MT_REQUIRE(cfg.channels % cfg.heads == 0, ConfigError, "model: channels (", cfg.channels,
             ") must be a multiple of heads (", cfg.heads, ")");
  MT_REQUIRE(cfg.paddedVocab >= cfg.vocab, ConfigError, "model: padded vocabulary smaller than the vocabulary");
  const int64_t C = cfg.channels;
  params_.beginUnit(0);
  wte_ = &params_.add("wte", {cfg.paddedVocab, C}, true);
  wpe_ = &params_.add("wpe", {cfg.maxT, C}, true);
  for (int64_t l = 0; l < cfg.layers; ++l) {
    params_.beginUnit(static_cast<int>(l) + 1);
    Block b;
    const std::string p = "h" + std::to_string(l) + ".";
    b.ln1 = std::make_unique<LayerNorm>(C);
    b.qkv = std::make_unique<Linear>(C, 3 * C);
    b.proj = std::make_unique<Linear>(C, C);
    b.ln2 = std::make_unique<LayerNorm>(C);
    b.fc = std::make_unique<Linear>(C, 4 * C);
    b.fcProj = std::make_unique<Linear>(4 * C, C);
    b.ln1->registerParams(params_, p + "ln_1.");
    b.qkv->registerParams(params_, p + "attn.c_attn.");
    b.proj->registerParams(params_, p + "attn.c_proj.");
    b.ln2->registerParams(params_, p + "ln_2.");
    b.fc->registerParams(params_, p + "mlp.c_fc.");
    b.fcProj->registerParams(params_, p + "mlp.c_proj.");
    if (cfg.fp8.enabled) {
      if (cfg.fp8Layers.qkv) b.qkv->enableFp8(cfg.fp8);
      if (cfg.fp8Layers.proj) b.proj->enableFp8(cfg.fp8);
      if (cfg.fp8Layers.fc) b.fc->enableFp8(cfg.fp8);
      if (cfg.fp8Layers.fcProj) b.fcProj->enableFp8(cfg.fp8);
    }
    blocks_.push_back(std::move(b));
  }
  params_.beginUnit(static_cast<int>(cfg.layers) + 1);
  lnf_ = std::make_unique<LayerNorm>(C);
  lnf_->registerParams(params_, "ln_f.");
}

void Gpt::initParams(uint64_t seed) {
  Rng rng(seed, 0x6B7);
  const float residualStd = 0.02f / std::sqrt(2.f * static_cast<float>(cfg_.layers));
  initNormal(wte_->value, rng, 0.f, 0.02f);
  initNormal(wpe_->value, rng, 0.f, 0.01f);
  auto linear = [&](Linear& l, float stddev) {
    initNormal(l.weight()->value, rng, 0.f, stddev);
    initConstant(l.bias()->value, 0.f);
  };
  for (auto& b : blocks_) {
    b.ln1->initParams(rng);
    linear(*b.qkv, 0.02f);
    linear(*b.proj, residualStd);
    b.ln2->initParams(rng);
    linear(*b.fc, 0.02f);
    linear(*b.fcProj, residualStd);
  }
  lnf_->initParams(rng);
}

void Gpt::hookBefore(int unit, bool backward) {
  if (backward) params_.needGrads(unit);  // per-step gradient buffers made as backward reaches them
  if (!hooks_) return;
  if (backward) hooks_->beforeUnitBackward(unit);
  else hooks_->beforeUnitForward(unit);
}

void Gpt::hookAfter(int unit, bool backward) {
  if (!hooks_) return;
  if (backward) hooks_->afterUnitBackward(unit);
  else hooks_->afterUnitForward(unit);
}

Tensor Gpt::blockForward(Block& b, const Tensor& x, Context& ctx, Tensor* qkvOut, Tensor* x1Out,
                         bool pointwise) {
  const int64_t B = x.dim(0), T = x.dim(1), C = cfg_.channels;
  // ln_1 -> qkv and ln_2 -> fc: in FP8 the LayerNorm kernels write the GEMMs' input codes themselves.
  Tensor qkv = b.qkv->forwardFromLayerNorm(*b.ln1, x, ctx);
  if (pointwise) b.qkv->releaseInput();  // h1 (or its codes) dies here: backward makes it again
  Tensor y = Tensor::empty({B, T, C}, matmulDType(x.device()), x.device());
  attentionForward(y, qkv, cfg_.heads, ctx.training ? &b.att : nullptr, cfg_.attention);
  Tensor x1 = b.proj->forwardAdd(y, x, ctx);  // residual added by the GEMM
  Tensor pre;  // fc's output before the GELU, for backward
  Tensor g;    // GELU(pre), unless fcProj's FP8 cast applies the GELU to pre itself
  if (geluInCasts(b, B * T, x.device())) pre = b.fc->forwardFromLayerNorm(*b.ln2, x1, ctx);
  else g = b.fc->forwardGelu(b.ln2->forward(x1, ctx), ctx, &pre);
  if (pointwise) b.fc->releaseInput();  // h2 dies here: backward makes it again
  if (ctx.training) b.pre = pre;
  if (qkvOut) *qkvOut = qkv;
  if (x1Out) *x1Out = x1;
  Tensor out = g.defined() ? b.fcProj->forwardAdd(g, x1, ctx) : b.fcProj->forwardAddGelu(pre, x1, ctx);
  if (pointwise) b.fcProj->releaseInput();
  return out;
}

void Gpt::clearBlock(Block& b) {
  for (Module* m : {static_cast<Module*>(b.ln1.get()), static_cast<Module*>(b.qkv.get()),
                    static_cast<Module*>(b.proj.get()), static_cast<Module*>(b.ln2.get()),
                    static_cast<Module*>(b.fc.get()), static_cast<Module*>(b.fcProj.get())})
    m->clearCache();
  b.att.clear();
  b.pre = Tensor();
  b.input = b.qkvOut = b.x1 = Tensor();
}

void Gpt::checkpoint(Block& b, const Tensor& x, const Tensor& qkvOut, const Tensor& x1) {
  clearBlock(b);
  b.input = x;
  if (cfg_.checkpointing == ActivationCheckpointing::kSelective) {
    b.qkvOut = qkvOut;
    b.x1 = x1;
  }
}

// The same layers on the same inputs as the block's forward (the same kernels, so the same bits):
// blocks reruns all of it but fcProj's GEMM (whose output backward never reads); selective reruns
// the LayerNorms, attention and the fc GEMM; both hand the GEMMs they do not rerun their recomputed
// inputs.
void Gpt::recompute(Block& b, Context& ctx) {
  MT_CHECK(b.input.defined(), "gpt: a checkpointed block's backward without its forward");
  // FP8 casts replay the forward's scales (the Linears' scaling states are not stepped again).
  struct Replay {
    Block& b;
    explicit Replay(Block& bl) : b(bl) { set(true); }
    ~Replay() { set(false); }
    void set(bool on) {
      for (Linear* l : {b.qkv.get(), b.proj.get(), b.fc.get(), b.fcProj.get()})
        l->setRecomputing(on);
    }
  } replay(b);
  const Tensor x = b.input;
  Tensor y = Tensor::empty({x.dim(0), x.dim(1), cfg_.channels}, matmulDType(x.device()), x.device());
  Tensor x1;
  if (cfg_.checkpointing == ActivationCheckpointing::kBlocks) {
    // The block's forward up to fcProj's input: fcProj's GEMM makes the next block's input, which
    // backward does not read, so it does not run again (its input is restored, as in selective).
    b.input = Tensor();
    Tensor qkv = b.qkv->forwardFromLayerNorm(*b.ln1, x, ctx);
    attentionForward(y, qkv, cfg_.heads, &b.att, cfg_.attention);
    x1 = b.proj->forwardAdd(y, x, ctx);
  } else {
    const Tensor qkv = b.qkvOut;
    x1 = b.x1;
    b.input = b.qkvOut = b.x1 = Tensor();
    b.qkv->restoreInputFromLayerNorm(*b.ln1, &x, ctx);
    attentionForward(y, qkv, cfg_.heads, &b.att, cfg_.attention);
    b.proj->restoreInput(y, ctx);
  }
  if (geluInCasts(b, x.dim(0) * x.dim(1), x.device())) {
    b.pre = b.fc->forwardFromLayerNorm(*b.ln2, x1, ctx);
    b.fcProj->restoreInputGelu(b.pre, ctx);
    return;
  }
  Tensor g = b.fc->forwardGelu(b.ln2->forward(x1, ctx), ctx, &b.pre);
  b.fcProj->restoreInput(g, ctx);
}

bool Gpt::geluInCasts(const Block& b, int64_t rows, Device d) const {
  return b.fc->fp8For(rows, d) && b.fcProj->fp8For(rows, d) && b.fc->fp8()->geluInCasts();
}

std::vector<std::pair<std::string, Fp8State*>> Gpt::fp8States() {
  std::vector<std::pair<std::string, Fp8State*>> out;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    const std::pair<const char*, Linear*> layers[] = {
        {"qkv", b.qkv.get()}, {"proj", b.proj.get()}, {"fc", b.fc.get()}, {"fcproj", b.fcProj.get()}};
    for (const auto& [name, lin] : layers)
      if (Fp8Linear* f = lin->fp8())
        for (const auto& [tensor, st] : f->states())
          out.emplace_back("h" + std::to_string(l) + "." + name + "." + tensor, st);
  }
  return out;
}

void Gpt::setPrecisionRoles() {
  for (Block& b : blocks_)
    for (Module* m : {static_cast<Module*>(b.ln1.get()), static_cast<Module*>(b.qkv.get()),
                      static_cast<Module*>(b.ln2.get()), static_cast<Module*>(b.fc.get())})
      m->setLowPrecisionOutput(true);
  lnf_->setLowPrecisionOutput(true);
  for (Block& b : blocks_) {  // their input gradients go to attention backward, LayerNorm backward, fc's cast
    b.proj->setLowPrecisionInputGrad(true);
    b.qkv->setLowPrecisionInputGrad(true);
    b.fc->setLowPrecisionInputGrad(true);
    b.fcProj->setLowPrecisionInputGrad(true);  // read only where the GELU runs in the FP8 casts
  }
}

Tensor Gpt::trunk(const Tensor& tokens, Context& ctx) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = cfg_.channels;
  Tensor x = Tensor::empty({B, T, C}, DType::kF32, tokens.device());
  embeddingForward(x, tokens, wte_->value);
  addPositional(x, wpe_->value.narrow(0, 0, T));
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    hookBefore(static_cast<int>(l) + 1, false);
    const bool pointwise = ctx.training && cfg_.pointwise(static_cast<int64_t>(l));
    const bool ckpt = ctx.training && cfg_.checkpointed(static_cast<int64_t>(l)) && !pointwise;
    Tensor qkv, x1;
    Tensor out = blockForward(b, x, ctx, ckpt ? &qkv : nullptr, ckpt ? &x1 : nullptr, pointwise);
    if (ckpt) checkpoint(b, x, qkv, x1);
    x = out;
    hookAfter(static_cast<int>(l) + 1, false);
  }
  hookBefore(static_cast<int>(blocks_.size()) + 1, false);
  Tensor xf = lnf_->forward(x, ctx).view({B * T, C});
  hookAfter(static_cast<int>(blocks_.size()) + 1, false);
  return xf;
}

Tensor Gpt::logits(const Tensor& tokens, Context& ctx) {
  MT_REQUIRE(tokens.ndim() == 2, DataError, "gpt: tokens must be [B, T], got ", tokens.str());
  MT_CHECK(!ctx.training, "gpt: logits() is an inference forward");
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  MT_REQUIRE(T <= cfg_.maxT, ConfigError, "gpt: sequence length ", T, " exceeds model.max_seq_len ", cfg_.maxT);
  setPrecisionRoles();
  hookBefore(0, false);
  Tensor xf = trunk(tokens, ctx);
  // The classifier of forward() on the real vocabulary's rows of wte (the first `vocab`).
  Tensor wteOp = castTo(wte_->value.narrow(0, 0, cfg_.vocab), matmulDType(tokens.device()));
  Tensor z = Tensor::empty({B * T, cfg_.vocab}, DType::kF32, tokens.device());
  linearForward(z, xf, wteOp, nullptr);
  hookAfter(0, false);
  return z.view({B, T, cfg_.vocab});
}

LossStats Gpt::forward(const Batch& batch, Context& ctx, int64_t validForMean) {
  const Tensor& tokens = batch.inputs;
  MT_REQUIRE(tokens.ndim() == 2, DataError, "gpt: tokens must be [B, T], got ", tokens.str());
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = cfg_.channels, N = B * T;
  MT_REQUIRE(T <= cfg_.maxT, ConfigError, "gpt: sequence length ", T, " exceeds model.max_seq_len ", cfg_.maxT);
  const Device dev = tokens.device();
  const int64_t valid = validForMean >= 0         ? validForMean
                        : batch.validTargets >= 0 ? batch.validTargets
                                                  : countValidTargets(batch.targets.device().isCpu()
                                                                          ? batch.targets
                                                                          : batch.targets.to(Device::cpu()));
  // Activations between a layer and the GEMM that reads it (LayerNorm, qkv, attention and fc
  // outputs, GELU) take the matmul dtype on the GPU in reduced precision; the residual stream and
  // every gradient stay f32.
  const DType act = matmulDType(dev);
  setPrecisionRoles();
  hookBefore(0, false);
  Tensor xf = trunk(tokens, ctx);

  // Classifier + loss (+ in training its backward), chunk by chunk through one logits buffer in
  // the matmul dtype: the GEMM writes the chunk's logits, the fused softmax-cross-entropy turns
  // them into their gradient in place, the two backward GEMMs read it before the next chunk
  // overwrites it (stream order); f32 logits never exist on the GPU.
  Tensor targets = batch.targets.device() == dev ? batch.targets : batch.targets.to(dev);
  Tensor flatTargets = targets.view({N});
  Tensor wteOp = castTo(wte_->value, act);  // once for every chunk
  const int64_t chunk = std::min(cfg_.classifierChunk, N);
  Tensor logits = Tensor::empty({chunk, cfg_.paddedVocab}, act, dev);
  Tensor wteGrad;
  if (ctx.training) {
    dxf_ = Tensor::empty({N, C}, act, dev);
    params_.needGrads(wte_->unit);  // the classifier's wte gradient is written now, in forward
    const bool direct = wte_->grad.defined() && (!hooks_ || hooks_->gradsKeptAcrossForward());
    wteGradEarly_ = direct ? Tensor() : Tensor::zeros(wte_->value.shape(), DType::kF32, dev);
    wteGrad = direct ? wte_->grad : wteGradEarly_;
  }
  if (!dev.isCpu() && (!badTarget_.defined() || badTarget_.device() != dev))
    badTarget_ = Tensor::zeros({1}, DType::kI32, dev);
  auto sink = std::make_shared<LossSink>(dev, dev.isCpu() ? Tensor() : badTarget_);
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    Tensor z = logits.narrow(0, 0, rows);
    Tensor xfChunk = xf.narrow(0, r0, rows);
    linearForward(z, xfChunk, wteOp, nullptr);
    softmaxCrossEntropy(z, flatTargets.narrow(0, r0, rows), ctx.training ? &z : nullptr, ctx.lossScale, valid,
                        cfg_.vocab, sink.get());
    if (ctx.training) {
      Tensor dxChunk = dxf_.narrow(0, r0, rows);
      linearBackward(&dxChunk, wteGrad, nullptr, z, xfChunk, wteOp);
    }
  }
  if (ctx.training) {
    tokens_ = tokens;
    B_ = B;
    T_ = T;
  }
  hookAfter(0, false);
  if (ctx.deferLoss && !dev.isCpu()) {  // read back at the trainer's next log point
    LossStats s;
    s.pending.push_back(sink);
    return s;
  }
  return sink->finish();
}

void Gpt::backward(Context& ctx) {
  MT_CHECK(dxf_.defined(), "gpt backward() without a training forward()");
  const int64_t C = cfg_.channels;
  hookBefore(0, true);
  hookBefore(static_cast<int>(blocks_.size()) + 1, true);
  // Gradients that only GEMMs or LayerNorm backward read are in the matmul dtype; the residual
  // stream's gradient dx is f32, with a copy dxLow in the matmul dtype made by the LayerNorm
  // backward that produced it, for the projection GEMMs.
  if (wteGradEarly_.defined()) {  // the classifier's wte gradient, made in forward
    addInPlace(wte_->grad, wteGradEarly_);
    wteGradEarly_ = Tensor();
  }
  Tensor dxf = dxf_;
  dxf_ = Tensor();
  Tensor dxLow;
  Tensor dx = lnf_->backwardBoth(dxf.view({B_, T_, C}), nullptr, ctx, &dxLow);
  if (hooks_)
    for (Param* p : lnf_->params()) hooks_->gradReady(*p);
  hookAfter(static_cast<int>(blocks_.size()) + 1, true);
  for (size_t li = blocks_.size(); li-- > 0;) {
    hookBefore(static_cast<int>(li) + 1, true);
    dx = blockBackward(static_cast<int64_t>(li), dx, dxLow, ctx);
    hookAfter(static_cast<int>(li) + 1, true);
  }
  embeddingBackward(wte_->grad, dx, tokens_);
  Tensor dwpe = wpe_->grad.narrow(0, 0, T_);
  positionalBackward(dwpe, dx);
  tokens_ = Tensor();
  if (hooks_) {
    hooks_->gradReady(*wpe_);
    hooks_->gradReady(*wte_);
  }
  hookAfter(0, true);
}

// The MLP's backward, x2 = x1 + fcProj(gelu(fc(ln2(x1)))): the gradient at fc's input (ln2's
// output) from dxLow, the gradient at the block's output in the matmul dtype.
Tensor Gpt::mlpBackward(Block& b, const Tensor& dxLow, bool pointwise, Context& ctx) {
  const Device dev = dxLow.device();
  // fcProj's input GELU(pre) made again (pointwise): by the GELU kernel (forward's, or its
  // epilogue's twin), or inside fcProj's cast.
  const bool inCasts = geluInCasts(b, B_ * T_, dev);
  if (pointwise && inCasts) b.fcProj->restoreInputGelu(b.pre, ctx);
  if (pointwise && !inCasts) {
    Tensor g = Tensor::empty(b.pre.shape(), b.pre.dtype(), b.pre.device());
    geluForward(g, b.pre, GeluKind::kTanh);
    b.fcProj->restoreInput(g, ctx);
  }
  Tensor dh2;
  if (inCasts) {  // the gradient at the GELU's output; fc's cast makes the one at its input
    Tensor dg = b.fcProj->backward(dxLow, ctx);
    if (pointwise) b.fc->restoreInputFromLayerNorm(*b.ln2, nullptr, ctx);
    dh2 = b.fc->backwardThroughGelu(dg, b.pre, ctx);
    b.pre = Tensor();
  } else {
    Tensor dfSum;  // colsum(df), fc's bias gradient, where the DGELU GEMM's epilogue made it
    Tensor df = b.fcProj->backwardDGelu(dxLow, b.pre, ctx, &dfSum);  // the gradient at the GELU's input
    b.pre = Tensor();
    if (pointwise) b.fc->restoreInput(b.ln2->recomputeOutput(), ctx);
    dh2 = b.fc->backward(df, ctx, dfSum);
  }
  return dh2;
}

// Block li's backward: dx (f32) and dxLow (its copy in the matmul dtype) are the gradient at the
// block's output; returns the one at its input, with dxLow overwritten by its copy.
Tensor Gpt::blockBackward(int64_t li, const Tensor& dx, Tensor& dxLow, Context& ctx) {
  Block& b = blocks_[static_cast<size_t>(li)];
  const int64_t C = cfg_.channels;
  const Device dev = dx.device();
  const bool pointwise = cfg_.pointwise(li);
  if (cfg_.checkpointed(li) && !pointwise) recompute(b, ctx);
  Tensor dh2 = mlpBackward(b, dxLow, pointwise, ctx);
  Tensor dx1Low;
  Tensor dx1 = b.ln2->backwardBoth(dh2, &dx, ctx, &dx1Low);  // + the residual branch's gradient, one pass
  // x1 = x + proj(attn(qkv(ln1(x))))
  Tensor dy = b.proj->backward(dx1Low, ctx);
  // In the matmul dtype: the qkv GEMMs read it without a cast.
  Tensor dqkv = Tensor::empty({B_, T_, 3 * C}, matmulDType(dev), dev);
  attentionBackward(dqkv, dy, b.att, cfg_.heads);
  b.att.clear();
  if (pointwise) b.qkv->restoreInputFromLayerNorm(*b.ln1, nullptr, ctx);
  Tensor dh1 = b.qkv->backward(dqkv, ctx);
  Tensor dxIn = b.ln1->backwardBoth(dh1, &dx1, ctx, &dxLow);
  if (hooks_) {
    for (Module* m : {static_cast<Module*>(b.fcProj.get()), static_cast<Module*>(b.fc.get()),
                      static_cast<Module*>(b.ln2.get()), static_cast<Module*>(b.proj.get()),
                      static_cast<Module*>(b.qkv.get()), static_cast<Module*>(b.ln1.get())})
      for (Param* p : m->params())
        hooks_->gradReady(*p);
  }
  return dxIn;
}

ActivationPlan Gpt::planActivations(const GptConfig& cfg, int64_t B, int64_t T, const PlanContext& pc,
                                    bool sharded) {
  const int64_t C = cfg.channels, N = B * T, H = cfg.heads;
  const bool low = pc.matmul != DType::kF32;
  const int64_t a = low ? static_cast<int64_t>(dtypeSize(pc.matmul)) : 4;  // activations a GEMM reads
  const bool pointwise = cfg.checkpointing == ActivationCheckpointing::kPointwise;
  const int64_t pw = pointwise ? cfg.checkpointedBlocks() : 0;                // recompute LN and GELU outputs
  const int64_t ck = pointwise ? 0 : cfg.checkpointedBlocks(), L = cfg.layers - ck - pw;  // L: keep everything
  const bool selective = cfg.checkpointing == ActivationCheckpointing::kSelective;
  ActivationPlan p;
  // Per block, as forward() keeps them: the f32 residual stream into ln1 and ln2 (with mean and
  // rstd), the LayerNorm outputs the qkv and fc GEMMs read, qkv (attention's input), attention's
  // output (the projection's input), fc's pre-activation and the GELU output fcProj reads.
  const int64_t residual = 2 * N * C * 4 + 2 * 2 * N * 4, qkv = 3 * N * C * a;
  int64_t lnOut = 2 * N * C * a;
  // Attention keeps one f32 log-sum-exp per row (our flash kernels round T up to 4 per (b, h);
  // cuDNN's statistics are [B, H, T]; auto may run either: the larger), or f32 P [B,H,T,T].
  const int64_t lseRow = cfg.attention == AttentionBackend::kCudnn ? T : (T + 3) / 4 * 4;
  const int64_t att = low ? B * H * lseRow * 4 : B * H * T * T * 4;
  int64_t attention = N * C * a + att, mlp = 2 * 4 * N * C * a, casts = low && !sharded ? 12 * C * C * a : 0;
  if (cfg.fp8.enabled) {
    // An FP8 Linear keeps its input and weight as 1-byte transposed codes instead (even sharded):
    // the LayerNorm outputs and the GELU output are then not kept, attention's output still is
    // (attention backward reads it), plus its 1-byte copy.
    const GptConfig::Fp8Layers& f = cfg.fp8Layers;
    lnOut -= (f.qkv ? N * C * (a - 1) : 0) + (f.fc ? N * C * (a - 1) : 0);
    attention += f.proj ? N * C : 0;
    mlp -= f.fcProj ? 4 * N * C * (a - 1) : 0;
    casts = 0;
    for (const auto& [on, params] :
         {std::pair{f.qkv, 3 * C * C}, {f.proj, C * C}, {f.fc, 4 * C * C}, {f.fcProj, 4 * C * C}})
      casts += on ? params : (low && !sharded ? params * a : 0);
  }
  if (L > 0) {
    p.add("residual (layernorm inputs)", L * residual);
    p.add("layernorm outputs", L * lnOut);
    p.add("qkv", L * qkv);
    p.add("attention", L * attention);
    p.add("mlp (pre-activation, GELU output)", L * mlp);
    if (casts) p.add("weight casts", L * casts);
  }
  // A pointwise block keeps all of the above but the LayerNorm outputs and the GELU output.
  if (pw)
    p.add("pointwise-recomputed blocks (all but LayerNorm and GELU outputs)",
          pw * (residual + qkv + attention + mlp / 2 + casts));
  // A checkpointed block keeps its input (the f32 residual stream); selective also qkv and the
  // residual after attention.
  const int64_t kept = N * C * 4 + (selective ? qkv + N * C * 4 : 0);
  if (ck)
    p.add(
        std::string("checkpointed blocks (") + enumName(activationCheckpointings(), cfg.checkpointing) + ")",
        ck * kept);
  // lnf's input and statistics, the classifier's input gradient; sharded, wte's classifier gradient.
  p.add("final layernorm + classifier gradient",
        N * C * 4 + 2 * N * 4 + N * C * a + (sharded ? cfg.paddedVocab * C * 4 : 0));
  // Backward: the classifier's logits chunk exists in forward only; backward's largest
  // temporaries are fc's input gradient, dpre and the dqkv / attention workspace of one block (an
  // f32 dq accumulator in both fused kernels' workspaces, N * C * 4), on top
  // of the block being recomputed (all of its activations but what it kept) where one is.
  const int64_t chunk = std::min(cfg.classifierChunk, N);
  // (pointwise: the GELU output made again for fcProj's backward, the largest it makes.)
  const int64_t recomputed = ck ? residual + lnOut + qkv + attention + mlp + casts - kept : pw ? mlp / 2 : 0;
  p.transientBytes = std::max(chunk * cfg.paddedVocab * a + cfg.paddedVocab * C * a,
                              recomputed + N * 4 * C * a * 2 + N * 3 * C * a + (low ? N * C * 4 : 0));
  return p;
}

int64_t Gpt::activationBytes() const {
  int64_t b = dxf_.defined() ? static_cast<int64_t>(dxf_.nbytes()) : 0;
  if (wteGradEarly_.defined()) b += static_cast<int64_t>(wteGradEarly_.nbytes());
  for (const auto& blk : blocks_) {
    b += blk.ln1->cachedBytes() + blk.qkv->cachedBytes() + blk.proj->cachedBytes() + blk.ln2->cachedBytes() +
         blk.fc->cachedBytes() + blk.fcProj->cachedBytes();
    for (const Tensor* t : {&blk.pre, &blk.input, &blk.qkvOut, &blk.x1})
      if (t->defined()) b += static_cast<int64_t>(t->nbytes());
    b += blk.att.bytes();
    // Attention's output is counted as the projection's input, unless an FP8 projection keeps its
    // 1-byte copy instead.
    if (blk.proj->fp8() && blk.proj->fp8()->holdsCache() && blk.att.y.defined())
      b += static_cast<int64_t>(blk.att.y.nbytes());
  }
  return b + lnf_->cachedBytes();
}

void Gpt::clearActivations() {
  for (auto& blk : blocks_)
    clearBlock(blk);
  lnf_->clearCache();
  dxf_ = Tensor();
  wteGradEarly_ = Tensor();
  tokens_ = Tensor();
}

}  // namespace mt
