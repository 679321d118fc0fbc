#include "launch/Plan.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/Allocator.h"
#include "core/Error.h"
#include "data/H5File.h"
#include "data/ImageDataset.h"
#include "data/TokenDataset.h"
#include "launch/CommandArgs.h"
#include "launch/Config.h"
#include "launch/Settings.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"
#include "sharding/ShardUnit.h"

namespace mt {

const char* const kPlanUsage =
    "usage: trainer plan --config X.ini [--ranks N] [--gpu-memory GIB] [--gpus-per-node G] [--json]\n"
    "         [--section.key=value ...]\n"
    "  per-rank memory of the configuration before anything is allocated: parameters, gradients,\n"
    "  optimizer state, gathered units, activations by layer kind, backward transients, buffers;\n"
    "  with --gpu-memory (GiB, in (0, 1048576]), whether it fits. --ranks: the world size, 1..1048576\n"
    "  (default 1); --gpus-per-node: the shard group of hybrid_shard, 1..1024 (default 8).\n";

namespace {

constexpr int64_t kMaxRanks = 1 << 20, kMaxGpusPerNode = 1024;
constexpr double kMaxGpuMemoryGiB = 1 << 20;
// The most a plan counts per rank (an exbibyte): beyond any machine, and far enough below 2^63
// that the rows and their totals cannot overflow.
constexpr int64_t kMaxPlanBytes = int64_t{1} << 60;

struct PlanArgs {
  int64_t ranks = 1, gpusPerNode = 8;
  double gpuMemoryGiB = 0;  // 0: not given
  bool json = false;
  std::vector<std::string> cfgArgs;  // --config and --section.key=value
};

struct Row {
  std::string what;
  int64_t bytes;
  bool device;  // on the training device (else host memory: CPU offload)
};

// Each sharding unit's elements in its flat buffer (every parameter aligned, as ShardUnit lays it).
std::vector<int64_t> unitSizes(const ParamTable& t) {
  std::vector<int64_t> units;
  for (size_t i = 0; i < t.size(); ++i) {
    const int u = t[i].unit;
    if (u >= static_cast<int>(units.size())) units.resize(static_cast<size_t>(u) + 1, 0);
    units[static_cast<size_t>(u)] += alignParam(t[i].numel());
  }
  return units;
}

// no_shard's gradients. Per step (core/ParamTable's GradLifetime), a unit's buffer is made when
// backward reaches it: at the start of backward, where the activations peak, only the gradients
// forward wrote (GPT: the embedding unit's, the classifier's) and those of the first unit backward
// enters (the last; GPT: with the last block) exist; at the end of backward all of them do, with
// the activations freed. The row is what the gradients add to the larger of the two. With
// accumulation every gradient is there from the second micro-step on.
Row gradientRow(const Settings& s, const std::vector<int64_t>& units, int64_t activations, bool gpt,
                bool cuda, int64_t persistent) {
  if (s.gradLifetime != GradLifetime::kPerStep || units.empty()) return {"gradients", persistent, true};
  // Micro-steps after the first run forward and backward with every gradient kept.
  if (s.gradAccum > 1) return {"gradients (per step, kept over the micro-steps)", persistent, true};
  auto bytes = [&](size_t u) {
    const auto b = static_cast<size_t>(units[u] * 4);
    return static_cast<int64_t>(cuda ? roundAllocationSize(b) : b);
  };
  const size_t n = units.size();
  int64_t atStart = bytes(n - 1), all = 0;
  if (gpt && n >= 3) atStart += bytes(0) + bytes(n - 2);
  for (size_t u = 0; u < n; ++u)
    all += bytes(u);
  if (atStart >= all - activations) return {"gradients, per step: those at backward's start", atStart, true};
  return {"gradients, per step: all, less the activations freed", all - activations, true};
}

// The rows of the sharded engine's buffers (sharding/ShardUnit, ShardedEngine): per unit, as the
// engine allocates them, each rounded to the caching allocator's size class on a GPU.
struct ShardRows {
  const Settings& s;
  std::vector<int64_t> units;  // elements per unit
  int64_t S;                   // shard group size
  bool cuda;
  int64_t bytes(int64_t elements, int64_t perElement, bool onDevice) const {
    const int64_t b = elements * perElement;
    return cuda && onDevice ? static_cast<int64_t>(roundAllocationSize(static_cast<size_t>(b))) : b;
  }
  int64_t shard(int64_t unit) const { return ShardUnit::shardElements(unit, static_cast<int>(S)); }
  // Units [from, to) (to < 0: the last).
  int64_t perUnit(int64_t perElement, bool onDevice, size_t from = 0, int64_t to = -1) const {
    const size_t end = to < 0 ? units.size() : static_cast<size_t>(to);
    int64_t sum = 0;
    for (size_t u = from; u < end; ++u)
      sum += bytes(shard(units[u]), perElement, onDevice);
    return sum;
  }
};

// The sharded engine's persistent shards and its per-unit transients. With offload the device keeps
// the gather copy only: the master, the gradient shard's host copies (two with delayed_update) and
// the optimizer state are host memory, and a few units' gradient shards are on the device while
// they go down (ShardedEngine's kGradShardsInFlight). sharding.offload_fraction < 1 keeps the first
// units as without offload (firstOffloadedUnit: the engine's own choice).
void addShardedRows(const ShardRows& r, int64_t stateBytesPerParam, int64_t heldOpen,
                    std::vector<Row>& rows) {
  const ShardingOptions& o = r.s.sharding;
  const bool off = o.offloadCpu;
  const size_t n = r.units.size();
  const size_t k = off ? static_cast<size_t>(firstOffloadedUnit(r.units, o.offloadFraction)) : n;
  const auto K = static_cast<int64_t>(k);
  const std::string kept = k == 0 || k == n ? "" : " (units kept on the GPU)";
  const std::string moved = k == 0 || k == n ? "" : " (offloaded units)";
  const int64_t reduceBytes = static_cast<int64_t>(dtypeSize(o.reduceDtype));
  if (k > 0) rows.push_back({"parameters (f32 master, shard)" + kept, r.perUnit(4, true, 0, K), true});
  if (k < n) rows.push_back({"parameters (f32 master, shard)" + moved, r.perUnit(4, false, k), false});
  // The kept units' f32 gather copy is their master.
  if (off || o.paramDtype != DType::kF32)
    rows.push_back({"parameter shard in " + std::string(dtypeName(o.paramDtype)) + " for all-gathers",
                    r.perUnit(static_cast<int64_t>(dtypeSize(o.paramDtype)), true, o.paramDtype == DType::kF32 ? k : 0),
                    true});
  // The two largest of units [from, n).
  auto largestTwo = [&r](size_t from) {
    std::vector<int64_t> sorted(r.units.begin() + static_cast<std::ptrdiff_t>(from), r.units.end());
    std::sort(sorted.rbegin(), sorted.rend());
    return std::make_pair(sorted.empty() ? 0 : sorted[0], sorted.size() > 1 ? sorted[1] : int64_t{0});
  };
  const auto [largest, second] = largestTwo(0);
  if (k > 0) rows.push_back({"gradients (shard)" + kept, r.perUnit(reduceBytes, true, 0, K), true});
  if (k < n) {
    const DType hostGrad = r.cuda ? o.reduceDtype : DType::kF32;
    rows.push_back({"gradient shard on the host (" + std::string(dtypeName(hostGrad)) + ")" +
                        (o.delayedUpdate ? " x 2 (delayed update)" : ""),
                    r.perUnit(static_cast<int64_t>(dtypeSize(hostGrad)), false, k) * (o.delayedUpdate ? 2 : 1),
                    false});
    if (r.cuda && o.paramDtype != DType::kF32)  // ShardedOffload's pinned stage of the packed upload
      rows.push_back({"parameter upload stage in " + std::string(dtypeName(o.paramDtype)) + " (pinned)",
                      r.perUnit(static_cast<int64_t>(dtypeSize(o.paramDtype)), false, k), false});
    const auto [down1, down2] = largestTwo(k);  // only offloaded units' shards go down
    rows.push_back(
        {"gradient shards going down (2 units)",
         r.bytes(r.shard(down1), reduceBytes, true) + r.bytes(r.shard(down2), reduceBytes, true), true});
  }
  // The optimizer's state is not allocated unit by unit: no size classes.
  const std::string state = "optimizer state (" + r.s.optim.type + ")";
  if (k > 0) rows.push_back({state + kept, r.perUnit(stateBytesPerParam, false, 0, K), true});
  if (k < n) rows.push_back({state + moved, r.perUnit(stateBytesPerParam, false, k), false});
  // Units gathered at once in f32: the one computing and up to prefetch_limit - 1 all-gathers in
  // flight (GPT also holds its embeddings open around the pass), and one unit's full gradient in
  // backward (with its reduce_dtype cast); shard_grad_op keeps every unit gathered to its backward.
  int64_t live = r.bytes(largest, 4, true) + (o.prefetchLimit - 1 + heldOpen) * r.bytes(second, 4, true);
  // Never more than every unit at once (a prefetch limit above the unit count changes nothing).
  const int64_t all = r.perUnit(4 * r.S, true);
  if (o.strategy == ShardStrategy::kShardGradOp || live > all) live = all;
  rows.push_back({"gathered parameters (" + std::string(shardStrategyName(o.strategy)) + ")", live, true});
  rows.push_back({"unit gradient being reduce-scattered",
                  r.bytes(largest, 4, true) + (reduceBytes != 4 ? r.bytes(largest, reduceBytes, true) : 0),
                  true});
}

PlanArgs parsePlanArgs(const std::vector<std::string>& args) {
  PlanArgs p;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
      if (i + 1 < args.size()) return args[++i];
      throw ConfigError("plan: " + flag + " needs a value");
    };
    auto is = [&](const std::string& flag) { return a == flag || a.rfind(flag + "=", 0) == 0; };
    if (a == "--json")
      p.json = true;
    else if (is("--ranks"))
      p.ranks = integerOption("plan", "--ranks", value("--ranks"), 1, kMaxRanks);
    else if (is("--gpus-per-node"))
      p.gpusPerNode = integerOption("plan", "--gpus-per-node", value("--gpus-per-node"), 1, kMaxGpusPerNode);
    else if (is("--gpu-memory"))
      p.gpuMemoryGiB = numberOption("plan", "--gpu-memory", value("--gpu-memory"), 0, kMaxGpuMemoryGiB, true);
    else
      p.cfgArgs.push_back(a);
  }
  return p;
}

// Every byte count of an activation plan is a sum of products of positive sizes that grows at most
// linearly with the micro-batch: f(m) <= m * f(1) term by term. So when m * f(1), in double
// precision, stays under kMaxPlanBytes, no product made for m overflows int64 (a batch of 2^62
// planned "0 B" of activations, others negative totals).
void checkActivationScale(const ActivationPlan& one, int64_t micro, const Config& cfg) {
  const double perSample = static_cast<double>(one.total()) + static_cast<double>(one.transientBytes);
  if (perSample * static_cast<double>(micro) > static_cast<double>(kMaxPlanBytes))
    cfg.fail("train.batch_size",
             "a micro-batch of " + std::to_string(micro) +
                 " per rank needs more than 2^60 bytes of activations, beyond any machine");
}

// The same for the GPT's dimensions, whose products at one sample can overflow already: its
// parameters and the largest activation terms of one sample, in double precision.
void checkGptScale(const GptConfig& g) {
  const double C = static_cast<double>(g.channels), L = static_cast<double>(g.layers),
               T = static_cast<double>(g.maxT), H = static_cast<double>(g.heads),
               V = static_cast<double>(g.paddedVocab);
  const double params = g.numParamsEstimate();
  const double perSample = (L + 1) * T * (H * T + 64 * C) * 4 + T * V * 4 + V * C * 4;
  if (params * 16 > static_cast<double>(kMaxPlanBytes) || perSample > static_cast<double>(kMaxPlanBytes))
    throw ConfigError(
        "plan: a gpt of " + std::to_string(g.layers) + " layers x " + std::to_string(g.channels) +
        " channels, " + std::to_string(g.heads) + " heads, " + std::to_string(g.maxT) +
        " tokens and a vocabulary of " + std::to_string(g.paddedVocab) +
        " needs more than 2^60 bytes per rank, beyond any machine (model.layers, model.channels, "
        "model.heads, model.seq_len, model.vocab_size)");
}

// The model: parameters, sharding units and what a forward of one micro-batch keeps.
struct ModelPlan {
  int64_t params = 0;
  std::vector<int64_t> units;
  ActivationPlan act;
  std::string name, transients = "backward transients (largest layer)";
};

ModelPlan planModel(const Settings& s, Config& cfg, const PlanContext& pc, int64_t micro, bool sharded) {
  H5File file = H5File::open(s.dataPath, FileLocking::kAuto);
  ModelPlan mp;
  if (s.model.type == "gpt") {
    TokenDataset train(file, s.trainSplit, s.gpt.maxT, 1);
    const GptConfig g = s.gptForData(train.vocabSize(), cfg);
    checkGptScale(g);
    mp.params = g.numParams();
    mp.units = unitSizes(Gpt(g).params());  // the table's shapes only: nothing is materialized
    checkActivationScale(Gpt::planActivations(g, 1, g.maxT, pc, sharded), micro, cfg);
    mp.act = Gpt::planActivations(g, micro, g.maxT, pc, sharded);
    if (g.checkpointedBlocks() > 0)
      mp.transients = g.checkpointing == ActivationCheckpointing::kPointwise
                          ? "backward transients (largest layer + the GELU output recomputed)"
                          : "backward transients (largest layer + the block recomputed)";
    mp.name = "gpt (" + std::to_string(g.layers) + " x " + std::to_string(g.channels) + ", vocabulary " +
              std::to_string(g.vocab) + ")";
    return mp;
  }
  ImageDataset train(file, s.trainSplit, 1);
  const InputSpec in = train.spec();
  std::unique_ptr<Model> m = buildImageModel(s.model, in);
  mp.params = m->params().numel();
  mp.units = unitSizes(m->params());
  const Sequential& seq = static_cast<Sequential&>(*m);
  checkActivationScale(seq.planActivations({1, in.height, in.width, in.channels}, pc), micro, cfg);
  mp.act = seq.planActivations({micro, in.height, in.width, in.channels}, pc);
  if (pc.device.isCuda() && pc.matmul != DType::kF32)
    mp.act.add("weight casts", mp.params * static_cast<int64_t>(dtypeSize(pc.matmul)));
  mp.name = s.model.type;
  return mp;
}

// Parameters, gradients, optimizer state (replicated, or 1/S of them per rank in a shard group),
// activations, transients and the GEMM workspace.
std::vector<Row> planRows(const Settings& s, const PlanArgs& pa, const ModelPlan& mp) {
  const ShardStrategy strat = s.sharding.strategy;
  const bool sharded = strat != ShardStrategy::kNoShard, cuda = s.device == "cuda";
  const int64_t ranks = pa.ranks;
  // hybrid_shard's shard group is a node: training refuses nodes of different sizes (the topology
  // check at setup), so the plan does too.
  if (sharded && strat == ShardStrategy::kHybridShard && ranks > pa.gpusPerNode && ranks % pa.gpusPerNode != 0)
    throw ConfigError(
        "plan: --ranks " + std::to_string(ranks) + " over nodes of --gpus-per-node " +
        std::to_string(pa.gpusPerNode) +
        ": hybrid_shard needs every node to hold the same number of ranks (ranks a multiple of it)");
  const int64_t S = !sharded                               ? 1
                    : strat == ShardStrategy::kHybridShard ? std::min(ranks, pa.gpusPerNode)
                                                           : ranks;
  const int64_t stateBytesPerParam = s.optim.type == "adamw" ? 8 : (s.optim.momentum > 0 ? 4 : 0);
  std::vector<Row> rows;
  if (sharded) {
    addShardedRows(ShardRows{s, mp.units, S, cuda}, stateBytesPerParam, s.model.type == "gpt" ? 1 : 0, rows);
  } else {
    rows.push_back({"parameters (f32 master)", mp.params * 4, true});
    rows.push_back(gradientRow(s, mp.units, mp.act.total(), s.model.type == "gpt", cuda, mp.params * 4));
    rows.push_back({"optimizer state (" + s.optim.type + ")", mp.params * stateBytesPerParam, true});
  }
  for (const auto& kv : mp.act.byKind)
    rows.push_back({"activations: " + kv.first, kv.second, true});
  rows.push_back({mp.transients, mp.act.transientBytes, true});
  if (cuda) rows.push_back({"cuBLASLt workspace", int64_t{32} << 20, true});
  return rows;
}

void printPlan(const Settings& s, const PlanArgs& pa, const ModelPlan& mp, int64_t micro,
               const std::vector<Row>& rows) {
  int64_t device = 0, host = 0;
  for (const Row& r : rows)
    (r.device ? device : host) += r.bytes;
  const double deviceGiB = static_cast<double>(device) / static_cast<double>(int64_t{1} << 30);
  const char* strategy = shardStrategyName(s.sharding.strategy);
  if (pa.json) {
    nlohmann::json j = {{"model", mp.name},
                        {"parameters", mp.params},
                        {"ranks", pa.ranks},
                        {"strategy", strategy},
                        {"device", s.device},
                        {"precision", s.precision},
                        {"micro_batch", micro},
                        {"grad_accum_steps", s.gradAccum},
                        {"activation_bytes", mp.act.total()},
                        {"device_bytes", device},
                        {"host_bytes", host}};
    nlohmann::json items = nlohmann::json::array();
    for (const Row& r : rows) items.push_back({{"what", r.what}, {"bytes", r.bytes}, {"device", r.device}});
    j["items"] = items;
    if (pa.gpuMemoryGiB > 0) j["fits"] = deviceGiB <= pa.gpuMemoryGiB;
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("memory plan per rank: %s, %lld parameters; %lld rank(s), %s, %s %s, micro-batch %lld x %lld\n",
              mp.name.c_str(), static_cast<long long>(mp.params), static_cast<long long>(pa.ranks), strategy,
              s.device.c_str(), s.precision.c_str(), static_cast<long long>(micro),
              static_cast<long long>(s.gradAccum));
  for (const Row& r : rows)
    std::printf("  %-52s %12s%s\n", r.what.c_str(), formatBytes(r.bytes).c_str(), r.device ? "" : "  (host)");
  std::printf("  %-52s %12s\n", s.device == "cuda" ? "total on the GPU" : "total",
              formatBytes(device).c_str());
  if (host) std::printf("  %-52s %12s\n", "total on the host (offload)", formatBytes(host).c_str());
  if (pa.gpuMemoryGiB > 0)
    std::printf("%s a %.1f GiB GPU (%.1f GiB planned, %.0f %%)\n",
                deviceGiB <= pa.gpuMemoryGiB ? "fits" : "does NOT fit", pa.gpuMemoryGiB, deviceGiB,
                100.0 * deviceGiB / pa.gpuMemoryGiB);
}

}  // namespace

int planCommand(const std::vector<std::string>& args) {
  const PlanArgs pa = parsePlanArgs(args);
  const int64_t ranks = pa.ranks;
  Config cfg = Config::fromArgs(pa.cfgArgs);
  Settings s = Settings::fromConfig(cfg);
  const bool cuda = s.device == "cuda";
  PlanContext pc;
  pc.device = cuda ? Device::cuda(0) : Device::cpu();
  // fp8: the layers outside the FP8 Linears run in bf16 (their own caches: Gpt::planActivations).
  pc.matmul = cuda && (s.precision == "bf16" || s.precision == "fp8") ? DType::kBF16
              : cuda && s.precision == "f16"                          ? DType::kF16
                                                                      : DType::kF32;
  if (s.globalBatch % ranks != 0 || (s.globalBatch / ranks) % s.gradAccum != 0)
    cfg.fail("train.batch_size", "the global batch " + std::to_string(s.globalBatch) +
                                     " does not split over " + std::to_string(ranks) + " ranks x " +
                                     std::to_string(s.gradAccum) + " micro-batches");
  const int64_t micro = s.globalBatch / ranks / s.gradAccum;
  const ModelPlan mp = planModel(s, cfg, pc, micro, s.sharding.strategy != ShardStrategy::kNoShard);
  printPlan(s, pa, mp, micro, planRows(s, pa, mp));
  return 0;
}

}  // namespace mt
