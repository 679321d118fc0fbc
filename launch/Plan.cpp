#include "launch/Plan.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/Allocator.h"
#include "core/Error.h"
#include "data/H5File.h"
#include "data/ImageDataset.h"
#include "data/TokenDataset.h"
#include "launch/Config.h"
#include "launch/Settings.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"

namespace mt {

const char* const kPlanUsage =
    "usage: trainer plan --config X.ini [--ranks N] [--gpu-memory GIB] [--gpus-per-node G] [--json]\n"
    "         [--section.key=value ...]\n"
    "  per-rank memory of the configuration before anything is allocated: parameters, gradients,\n"
    "  optimizer state, gathered units, activations by layer kind, backward transients, buffers;\n"
    "  with --gpu-memory (GiB), whether it fits. --ranks: the world size (default 1); --gpus-per-node:\n"
    "  the shard group of hybrid_shard (default 8).\n";

namespace {

struct Row {
  std::string what;
  int64_t bytes;
  bool device;  // on the training device (else host memory: CPU offload)
};

// The two largest sharding units' sizes (a unit gathered while the next is prefetched).
std::pair<int64_t, int64_t> largestUnits(const ParamTable& t) {
  std::vector<int64_t> units;
  for (size_t i = 0; i < t.size(); ++i) {
    const int u = t[i].unit;
    if (u >= static_cast<int>(units.size())) units.resize(static_cast<size_t>(u) + 1, 0);
    units[static_cast<size_t>(u)] += t[i].numel();
  }
  std::sort(units.rbegin(), units.rend());
  return {units.empty() ? 0 : units[0], units.size() > 1 ? units[1] : 0};
}

}  // namespace

int planCommand(const std::vector<std::string>& args) {
  int64_t ranks = 1, gpusPerNode = 8;
  double gpuMemoryGiB = 0;
  bool json = false;
  std::vector<std::string> cfgArgs;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
      if (i + 1 < args.size()) return args[++i];
      throw ConfigError("plan: " + flag + " needs a value");
    };
    auto number = [&](const std::string& flag) {
      const std::string v = value(flag);
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(d > 0)) throw ConfigError("plan: " + flag + " " + v + ": expected a positive number");
      return d;
    };
    if (a == "--json") json = true;
    else if (a == "--ranks" || a.rfind("--ranks=", 0) == 0) ranks = static_cast<int64_t>(number("--ranks"));
    else if (a == "--gpus-per-node" || a.rfind("--gpus-per-node=", 0) == 0)
      gpusPerNode = static_cast<int64_t>(number("--gpus-per-node"));
    else if (a == "--gpu-memory" || a.rfind("--gpu-memory=", 0) == 0) gpuMemoryGiB = number("--gpu-memory");
    else cfgArgs.push_back(a);
  }
  Config cfg = Config::fromArgs(cfgArgs);
  Settings s = Settings::fromConfig(cfg);
  const bool cuda = s.device == "cuda";
  PlanContext pc;
  pc.device = cuda ? Device::cuda(0) : Device::cpu();
  pc.matmul = cuda && s.precision == "bf16" ? DType::kBF16 : cuda && s.precision == "f16" ? DType::kF16 : DType::kF32;
  if (s.globalBatch % ranks != 0 || (s.globalBatch / ranks) % s.gradAccum != 0)
    cfg.fail("train.batch_size", "the global batch " + std::to_string(s.globalBatch) + " does not split over " +
                                     std::to_string(ranks) + " ranks x " + std::to_string(s.gradAccum) +
                                     " micro-batches");
  const int64_t micro = s.globalBatch / ranks / s.gradAccum;
  const ShardStrategy strat = s.sharding.strategy;
  const bool sharded = strat != ShardStrategy::kNoShard;

  // The model: parameters and what a forward of one micro-batch keeps.
  H5File file = H5File::open(s.dataPath, FileLocking::kAuto);
  int64_t P = 0, largestUnit = 0, secondUnit = 0;
  ActivationPlan act;
  std::string modelName, transients = "backward transients (largest layer)";
  if (s.model.type == "gpt") {
    TokenDataset train(file, s.trainSplit, s.gpt.maxT, 1);
    const GptConfig g = s.gptForData(train.vocabSize(), cfg);
    P = g.numParams();
    const int64_t C = g.channels;
    largestUnit = std::max(g.paddedVocab * C + g.maxT * C, 12 * C * C + 13 * C);
    secondUnit = 12 * C * C + 13 * C;
    act = Gpt::planActivations(g, micro, g.maxT, pc, sharded);
    if (g.checkpointedBlocks() > 0) transients = "backward transients (largest layer + the block recomputed)";
    modelName = "gpt (" + std::to_string(g.layers) + " x " + std::to_string(C) + ", vocabulary " +
                std::to_string(g.vocab) + ")";
  } else {
    ImageDataset train(file, s.trainSplit, 1);
    const InputSpec in = train.spec();
    std::unique_ptr<Model> m = buildImageModel(s.model, in);
    P = m->params().numel();
    std::tie(largestUnit, secondUnit) = largestUnits(m->params());
    act = static_cast<Sequential&>(*m).planActivations({micro, in.height, in.width, in.channels}, pc);
    if (cuda && pc.matmul != DType::kF32) act.add("weight casts", P * static_cast<int64_t>(dtypeSize(pc.matmul)));
    modelName = s.model.type;
  }

  // Parameters, gradients, optimizer state: replicated, or 1/S of them per rank in a shard group.
  const int64_t S = !sharded ? 1 : strat == ShardStrategy::kHybridShard ? std::min(ranks, gpusPerNode) : ranks;
  const int64_t shard = (P + S - 1) / S;
  const int64_t stateBytesPerParam = s.optim.type == "adamw" ? 8 : (s.optim.momentum > 0 ? 4 : 0);
  const bool offload = s.sharding.offloadCpu;
  std::vector<Row> rows;
  rows.push_back({"parameters (f32 master" + std::string(sharded ? ", shard" : "") + ")", shard * 4, !offload});
  if (sharded && s.sharding.paramDtype != DType::kF32)
    rows.push_back({"parameter shard in " + std::string(dtypeName(s.sharding.paramDtype)) + " for all-gathers",
                    shard * static_cast<int64_t>(dtypeSize(s.sharding.paramDtype)), true});
  rows.push_back({"gradients" + std::string(sharded ? " (shard)" : ""),
                  shard * static_cast<int64_t>(sharded ? dtypeSize(s.sharding.reduceDtype) : 4), true});
  if (offload) rows.push_back({"gradient shard on the host (f32)", shard * 4, false});
  rows.push_back({"optimizer state (" + s.optim.type + ")", shard * stateBytesPerParam, !offload});
  if (sharded) {
    // Units gathered at once in f32: the one computing and up to prefetch_limit - 1 all-gathers in
    // flight (GPT also holds its embeddings open around the pass), and one unit's full gradient in
    // backward; shard_grad_op keeps every unit gathered from its forward to its backward.
    const int64_t heldOpen = s.model.type == "gpt" ? 1 : 0;
    const int64_t live = strat == ShardStrategy::kShardGradOp
                             ? P
                             : largestUnit + (s.sharding.prefetchLimit - 1 + heldOpen) * secondUnit;
    rows.push_back({"gathered parameters (" + std::string(shardStrategyName(strat)) + ")", live * 4, true});
    rows.push_back({"unit gradient being reduce-scattered", largestUnit * 4, true});
  }
  for (const auto& kv : act.byKind) rows.push_back({"activations: " + kv.first, kv.second, true});
  rows.push_back({transients, act.transientBytes, true});
  if (cuda) rows.push_back({"cuBLASLt workspace", int64_t{32} << 20, true});

  int64_t device = 0, host = 0;
  for (const Row& r : rows) (r.device ? device : host) += r.bytes;
  const int64_t activations = act.total();
  const double deviceGiB = static_cast<double>(device) / static_cast<double>(int64_t{1} << 30);
  if (json) {
    nlohmann::json j = {{"model", modelName},
                        {"parameters", P},
                        {"ranks", ranks},
                        {"strategy", shardStrategyName(strat)},
                        {"device", s.device},
                        {"precision", s.precision},
                        {"micro_batch", micro},
                        {"grad_accum_steps", s.gradAccum},
                        {"activation_bytes", activations},
                        {"device_bytes", device},
                        {"host_bytes", host}};
    nlohmann::json items = nlohmann::json::array();
    for (const Row& r : rows) items.push_back({{"what", r.what}, {"bytes", r.bytes}, {"device", r.device}});
    j["items"] = items;
    if (gpuMemoryGiB > 0) j["fits"] = deviceGiB <= gpuMemoryGiB;
    std::cout << j.dump() << "\n";
  } else {
    std::printf("memory plan per rank: %s, %lld parameters; %lld rank(s), %s, %s %s, micro-batch %lld x %lld\n",
                modelName.c_str(), static_cast<long long>(P), static_cast<long long>(ranks), shardStrategyName(strat),
                s.device.c_str(), s.precision.c_str(), static_cast<long long>(micro),
                static_cast<long long>(s.gradAccum));
    for (const Row& r : rows)
      std::printf("  %-52s %12s%s\n", r.what.c_str(), formatBytes(r.bytes).c_str(), r.device ? "" : "  (host)");
    std::printf("  %-52s %12s\n", cuda ? "total on the GPU" : "total", formatBytes(device).c_str());
    if (host) std::printf("  %-52s %12s\n", "total on the host (offload)", formatBytes(host).c_str());
    if (gpuMemoryGiB > 0)
      std::printf("%s a %.1f GiB GPU (%.1f GiB planned, %.0f %%)\n", deviceGiB <= gpuMemoryGiB ? "fits" : "does NOT fit",
                  gpuMemoryGiB, deviceGiB, 100.0 * deviceGiB / gpuMemoryGiB);
  }
  return 0;
}

}  // namespace mt
