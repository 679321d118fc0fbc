#pragma once
// A few training steps of a GPT from a fixed initialisation on fixed tokens, for tests that compare
// two configurations of the same model (activation checkpointing against none, CPU and GPU).

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/optim/Optimizer.h"
#include "models/gpt/Gpt.h"

namespace mt::test {

struct GptRun {
  std::vector<double> losses;  // per step
  std::vector<float> values;   // every parameter after the last step (flat, host)
  int64_t keptBytes = 0;       // the most activation bytes held between a forward and its backward
};

// Step s's tokens [B, maxT] and targets, on `device`.
inline Batch fixedBatch(const GptConfig& cfg, Device device, int64_t B, int s) {
  const int64_t T = cfg.maxT;
  Tensor in = Tensor::empty({B, T}, DType::kI32), tg = Tensor::empty({B, T}, DType::kI64);
  for (int64_t i = 0; i < B * T; ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>((i * 31 + s * 13) % cfg.vocab);
    tg.data<int64_t>()[i] = (i * 31 + s * 13 + 5) % cfg.vocab;
  }
  Batch b;
  b.inputs = in.to(device);
  b.targets = tg.to(device);
  return b;
}

inline GptRun trainGpt(const GptConfig& cfg, Device device, bool keepWeightCasts, int steps, int64_t B) {
  Gpt model(cfg);
  ParamTable& params = model.params();
  params.materialize(device);
  model.initParams(7);
  OptimConfig oc;
  oc.weightDecay = 0.1f;
  auto opt = makeOptimizer(oc, segmentsOf(params));
  GptRun r;
  for (int s = 0; s < steps; ++s) {
    Batch b = fixedBatch(cfg, device, B, s);
    Context ctx;
    ctx.device = device;
    ctx.keepWeightCasts = keepWeightCasts;
    params.zeroGrads();
    r.losses.push_back(model.forward(b, ctx).meanLoss());
    r.keptBytes = std::max(r.keptBytes, model.activationBytes());
    model.backward(ctx);
    opt->step(1e-3f);
  }
  Tensor v = params.flatValues().to(Device::cpu());
  r.values.assign(v.data<float>(), v.data<float>() + v.numel());
  return r;
}

// One forward and backward of the same fixed model and tokens with the loss scaled by `lossScale`:
// every parameter's gradient divided by it (host f32, by name), and the loss.
struct GptGrads {
  double loss = 0;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
};

// values: the flat parameter values (ParamTable::flatValues' layout, e.g. GptRun::values) to take
// instead of the initialisation.
inline GptGrads gptGrads(const GptConfig& cfg, Device device, float lossScale, int64_t B,
                         const std::vector<float>* values = nullptr) {
  Gpt model(cfg);
  ParamTable& params = model.params();
  params.materialize(device);
  model.initParams(7);
  if (values) {
    Tensor host = Tensor::empty({static_cast<int64_t>(values->size())}, DType::kF32);
    std::copy(values->begin(), values->end(), host.data<float>());
    MT_CHECK(host.numel() == params.flatValues().numel(), "gptGrads: values of another model");
    params.flatValues().copyFrom(host);
  }
  Batch b = fixedBatch(cfg, device, B, 0);
  Context ctx;
  ctx.device = device;
  ctx.lossScale = lossScale;
  params.zeroGrads();
  GptGrads r;
  r.loss = model.forward(b, ctx).meanLoss();
  model.backward(ctx);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad.to(Device::cpu());
    std::vector<float> v(g.data<float>(), g.data<float>() + g.numel());
    for (float& x : v) x /= lossScale;
    r.grads.emplace_back(params[i].name, std::move(v));
  }
  return r;
}

}  // namespace mt::test
