#include "launch/Settings.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/EnvParams.h"
#include "core/Log.h"
#include "models/layers/Layout.h"

namespace mt {

GptConfig Settings::gptForData(int64_t dataVocab, const Config& c) const {
  GptConfig g = gpt;
  if (g.vocab == 0) g.vocab = dataVocab;
  if (dataVocab > g.vocab) c.fail("model.vocab_size", "the data holds token ids up to " + std::to_string(dataVocab - 1));
  if (g.paddedVocab == 0) g.paddedVocab = (g.vocab + 127) / 128 * 128;
  if (g.paddedVocab < g.vocab) c.fail("model.padded_vocab", "smaller than the vocabulary " + std::to_string(g.vocab));
  return g;
}

namespace {
// The widest model.hidden / model.conv_channels entry (the schema bounds model.fc and
// model.channels the same way, ConfigSchema.cpp: products of sizes stay inside int64).
constexpr int64_t kMaxModelWidth = int64_t{1} << 24;
// A choice key's value as its enum: validate() has checked it is one of the table's names.
template <typename E>
E enumOf(const Config& c, const std::string& key, const EnumTable<E>& table) {
  E v{};
  if (!parseEnum(table, c.str(key), &v)) c.fail(key, "not one of its names");
  return v;
}

// train.precision = fp8: the FP8 options of the GPT's block Linears (fp8.*).
void readFp8(const Config& c, const std::string& modelType, Settings& s) {
  Fp8Training& f = s.gpt.fp8;
  f.enabled = s.precision == "fp8";
  if (f.enabled && modelType != "gpt")
    c.fail("train.precision", "fp8 trains the GPT's block Linears: needs model.type = gpt");
  f.options.recipe = enumOf(c, "fp8.recipe", fp8Recipes());
  f.options.historyLength = static_cast<int>(c.i64("fp8.amax_history"));
  f.options.margin = static_cast<int>(c.i64("fp8.margin"));
  f.gradFormat = enumOf(c, "fp8.grad_format", fp8Formats());
  GptConfig::Fp8Layers& l = s.gpt.fp8Layers;
  l = {false, false, false, false};
  std::stringstream ss(c.str("fp8.layers"));
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name == "qkv")
      l.qkv = true;
    else if (name == "proj")
      l.proj = true;
    else if (name == "fc")
      l.fc = true;
    else if (name == "fcproj")
      l.fcProj = true;
    else if (!name.empty())
      c.fail("fp8.layers",
             "unknown layer '" + name + "' (expected a comma-separated list of qkv, proj, fc, fcproj)");
  }
  if (f.enabled && !(l.qkv || l.proj || l.fc || l.fcProj))
    c.fail("fp8.layers", "names no layer: train.precision = fp8 would multiply nothing in FP8 (bf16 is that run)");
}

void readRun(const Config& c, Settings& s) {
  s.runName = c.str("run.name");
  // The run directory must be a folder of its own inside run.dir: with "." (run.dir itself) or ".."
  // (its parent) the run's lock, files and checkpoints landed outside any run directory.
  if (s.runName.empty() || s.runName == "." || s.runName == ".." || s.runName.find('/') != std::string::npos)
    c.fail("run.name", "must be a plain name inside run.dir: not empty, '.' or '..', and without '/'");
  s.runDir = (std::filesystem::path(c.str("run.dir")) / s.runName).string();
  s.lockStaleS = static_cast<int>(std::min<int64_t>(c.i64("run.lock_stale_s"), 1 << 30));
  s.seed = static_cast<uint64_t>(c.i64("run.seed"));
  s.logInterval = c.i64("run.log_interval");
  s.profileFrom = c.i64("run.profile_from");
  s.profileSteps = c.i64("run.profile_steps");
  s.trace = c.flag("run.trace");
  // MT_LOG_LEVEL wins over run.log_level; an unknown name there is refused, not ignored.
  setLogLevel(envLogLevel(enumOf(c, "run.log_level", logLevels())));
}

void readModel(const Config& c, Settings& s) {
  ModelConfig& m = s.model;
  m.type = c.str("model.type");
  m.hidden = c.i64List("model.hidden");
  for (int64_t h : m.hidden)
    if (h <= 0 || h > kMaxModelWidth) c.fail("model.hidden", "widths must be in [1, 2^24]");
  m.activation = c.str("model.activation");
  m.dropout = static_cast<float>(c.f64("model.dropout"));
  m.layout = enumOf(c, "model.layout", layouts());
  m.convChannels = c.i64List("model.conv_channels");
  if (m.convChannels.empty()) c.fail("model.conv_channels", "needs at least one stage");
  for (int64_t ch : m.convChannels)
    if (ch <= 0 || ch > kMaxModelWidth) c.fail("model.conv_channels", "channels must be in [1, 2^24]");
  m.kernel = c.i64("model.kernel");
  if (m.kernel % 2 == 0) c.fail("model.kernel", "must be a positive odd number");
  m.fc = c.i64("model.fc");
  m.inputMean = static_cast<float>(c.f64("model.input_mean"));
  m.inputStd = static_cast<float>(c.f64("model.input_std"));
  if (m.type == "gpt") {
    s.gpt = GptConfig::preset(c.str("model.gpt_preset"));
    if (c.i64("model.layers") > 0) s.gpt.layers = c.i64("model.layers");
    if (c.i64("model.heads") > 0) s.gpt.heads = c.i64("model.heads");
    if (c.i64("model.channels") > 0) s.gpt.channels = c.i64("model.channels");
    if (s.gpt.channels % s.gpt.heads != 0) c.fail("model.channels", "must be a multiple of model.heads");
    s.gpt.maxT = c.i64("model.seq_len");
    s.gpt.vocab = c.i64("model.vocab_size");  // 0: from the data file
    s.gpt.paddedVocab = c.i64("model.padded_vocab");
  }
}

void readData(const Config& c, Settings& s) {
  s.dataPath = c.str("data.path");
  s.trainSplit = c.str("data.train_split");
  s.testSplit = c.str("data.test_split");
  s.dataMode = c.str("data.mode");
  s.feed = enumOf(c, "data.feed", feedModes());
  if (s.feed == FeedMode::kDevice && s.dataMode != "memory")
    c.fail("data.feed", "device needs data.mode = memory (the split is loaded once, then copied to the GPU)");
  s.locking = enumOf(c, "data.file_locking", fileLockings());
  s.loader.numWorkers = static_cast<int>(c.i64("data.num_workers"));
  s.loader.prefetchFactor = static_cast<int>(c.i64("data.prefetch_factor"));
  s.loader.shuffle = c.flag("data.shuffle");
  s.loader.dropLast = true;
  s.loader.seed = s.seed;
}

void readTrain(const Config& c, Settings& s) {
  s.epochs = c.i64("train.epochs");
  s.maxSteps = c.i64("train.max_steps");
  if (s.maxSteps == 0 && s.epochs <= 0) c.fail("train.epochs", "must be positive when train.max_steps = 0");
  s.globalBatch = c.i64("train.batch_size");
  s.gradAccum = c.i64("train.grad_accum_steps");
  s.evalBatch = c.i64("train.eval_batch_size");
  s.evalInterval = c.i64("train.eval_interval");
  s.device = c.str("train.device");
  // auto: per step on a GPU, where memory is what limits; persistent on the host, where a buffer
  // this large goes back to the OS when freed and would be faulted in again every step.
  const std::string gradBuffers = c.str("train.gradient_buffers");
  s.gradLifetime = gradBuffers == "per_step" || (gradBuffers == "auto" && s.device == "cuda")
                       ? GradLifetime::kPerStep
                       : GradLifetime::kPersistent;
  s.precision = c.str("train.precision");
  if (s.precision != "f32" && s.precision != "fp8" && s.device != "cuda")
    c.fail("train.precision", "bf16 and f16 need train.device = cuda");
  readFp8(c, s.model.type, s);
  s.lossScaleInit = c.f64("train.loss_scale_init");
  s.lossScaleGrowthInterval = c.i64("train.loss_scale_growth_interval");
  s.memoryCapMb = c.i64("train.memory_cap_mb");
  s.gradClip = static_cast<float>(c.f64("train.grad_clip"));
  s.divergenceSteps = c.i64("train.divergence_steps");
  s.evalBatches = c.i64("train.eval_batches");
  s.gpt.checkpointing = enumOf(c, "train.activation_checkpointing", activationCheckpointings());
  s.gpt.checkpointEvery = c.i64("train.activation_checkpointing_every");
  s.gpt.attention = enumOf(c, "model.attention", attentionBackends());
  s.qat = c.flag("train.qat");
  s.qatObserver = c.str("train.qat_observer");
  s.qatObserveSteps = c.i64("train.qat_observe_steps");
  if (s.qat && s.model.type == "gpt")
    c.fail("train.qat", "int8 quantization-aware training supports model.type mlp and cnn");
  if (s.qat && s.precision != "f32") c.fail("train.qat", "fake quantization runs on f32 activations: needs train.precision = f32");
  if (s.gpt.checkpointing != ActivationCheckpointing::kNone && s.model.type != "gpt")
    c.fail("train.activation_checkpointing", "recomputes transformer blocks: needs model.type = gpt");
  s.peakFlops = c.f64("train.peak_flops");
}

void readOptim(const Config& c, Settings& s) {
  OptimConfig& o = s.optim;
  o.type = c.str("optim.type");
  o.weightDecay = static_cast<float>(c.f64("optim.weight_decay"));
  o.momentum = static_cast<float>(c.f64("optim.momentum"));
  o.nesterov = c.flag("optim.nesterov");
  o.beta1 = static_cast<float>(c.f64("optim.beta1"));
  o.beta2 = static_cast<float>(c.f64("optim.beta2"));
  o.eps = static_cast<float>(c.f64("optim.eps"));
  if (o.nesterov && o.momentum <= 0) c.fail("optim.nesterov", "needs optim.momentum > 0");
  s.schedule.kind = c.str("schedule.kind");
  s.schedule.baseLr = static_cast<float>(c.f64("optim.lr"));
  s.schedule.minLr = static_cast<float>(c.f64("schedule.min_lr"));
  s.schedule.warmupSteps = c.i64("schedule.warmup_steps");
}

void readDist(const Config& c, Settings& s) {
  s.backend = c.str("dist.backend");
  s.dp.bucketCapMb = c.f64("dist.bucket_cap_mb");
  s.dp.firstBucketMb = c.f64("dist.first_bucket_mb");
  s.dp.rebuildBuckets = c.flag("dist.rebuild_buckets");
  const int64_t envTimeout = envInt(EnvParam::kCommTimeoutS);
  s.timeout = std::chrono::seconds(envTimeout > 0 ? envTimeout : c.i64("dist.timeout_s"));
  s.fingerprint = c.flag("dist.fingerprint") || envInt(EnvParam::kFingerprint) != 0;
  s.healthMonitor = c.flag("dist.health_monitor");
  CompressionOptions& co = s.compression;
  co.method = enumOf(c, "compression.method", compressionMethods());
  co.rank = static_cast<int>(c.i64("compression.rank"));
  co.startIter = c.i64("compression.start_iter");
  co.minCompressionRate = c.f64("compression.min_compression_rate");
  co.warmStart = c.flag("compression.warm_start");
  co.errorFeedback = c.flag("compression.error_feedback");
  co.topkFraction = c.f64("compression.topk_fraction");
  co.topkWarmupSteps = c.i64("compression.topk_warmup_steps");
  co.seed = s.seed;
}

void readSharding(const Config& c, Settings& s) {
  s.sharding.strategy = enumOf(c, "sharding.strategy", shardStrategies());
  if (s.qat && s.sharding.strategy != ShardStrategy::kNoShard)
    c.fail("train.qat", "fake quantization reads whole weights: needs sharding.strategy = no_shard");
  s.sharding.offloadCpu = c.str("sharding.offload") == "cpu";
  s.sharding.prefetchLimit = static_cast<int>(c.i64("sharding.prefetch_limit"));
  // auto: with offload the gather copy is all the GPU keeps of the parameters; under bf16/f16
  // compute the GEMMs read bf16-rounded weights anyway, so a bf16 copy halves it (FSDP's
  // MixedPrecision(param_dtype=bf16), DeepSpeed's fp16 parameters).
  const bool lowCompute = s.device == "cuda" && s.precision != "f32";
  s.sharding.paramDtype = c.str("sharding.param_dtype") == "auto"
                              ? (s.sharding.offloadCpu && lowCompute ? DType::kBF16 : DType::kF32)
                              : enumOf(c, "sharding.param_dtype", dtypes());
  s.sharding.reduceDtype = enumOf(c, "sharding.reduce_dtype", dtypes());
  s.sharding.deviceNorms = s.gradClip > 0.f;
  if (s.sharding.offloadCpu && s.sharding.strategy == ShardStrategy::kNoShard)
    c.fail("sharding.offload", "needs a sharded strategy (full_shard, shard_grad_op or hybrid_shard)");
  s.sharding.offloadFraction = c.f64("sharding.offload_fraction");
  if (s.sharding.offloadFraction != 1.0 && !s.sharding.offloadCpu)
    c.fail("sharding.offload_fraction", "needs sharding.offload = cpu (it splits the offloaded optimizer)");
  s.sharding.delayedUpdate = c.flag("sharding.delayed_update");
  if (s.sharding.delayedUpdate && !s.sharding.offloadCpu)
    c.fail("sharding.delayed_update", "needs sharding.offload = cpu (it overlaps the CPU step)");
  if (s.compression.method != CompressionMethod::kNone && s.sharding.strategy != ShardStrategy::kNoShard)
    c.fail("compression.method", "compresses the data-parallel all-reduce; sharded strategies reduce-scatter "
                                 "uncompressed (use sharding.reduce_dtype = bf16 to halve their traffic)");
}

void readCheckpoint(const Config& c, Settings& s) {
  s.checkpointDir = c.str("checkpoint.dir");
  if (s.checkpointDir.empty()) s.checkpointDir = s.runDir + "/checkpoints";
  s.checkpointInterval = c.i64("checkpoint.interval");
  s.checkpointKeep = c.i64("checkpoint.keep");
  s.resume = c.str("checkpoint.resume");
  if (s.resume.empty()) c.fail("checkpoint.resume", "expected auto, never or a checkpoint directory");
  s.checkpointAtExit = c.flag("checkpoint.at_exit");
  s.checkpointTimeout = std::chrono::seconds(c.i64("checkpoint.timeout_s"));
}

void readTopo(const Config& c, Settings& s) {
  s.topoFile = c.str("topo.file");
  s.profile = c.str("topo.profile");
  s.hierarchical = c.flag("topo.hierarchical");
  s.bindCpus = c.flag("topo.bind_cpus");
  s.bindNic = c.flag("topo.bind_nic");
  s.topoReport = c.flag("topo.report");
  s.nodeRanks = static_cast<int>(c.i64("topo.node_ranks"));
  if (s.hierarchical && s.compression.method != CompressionMethod::kNone)
    c.fail("compression.method", "cannot be combined with topo.hierarchical (choose one)");
}
}  // namespace

// Each key's kind, range and allowed names are checked by Config::validate() from the schema;
// what is left here are the checks that involve several keys or more than a range.
Settings Settings::fromConfig(const Config& c) {
  c.validate();
  Settings s;
  // In this order: a section's checks may read what an earlier one set (the model type, the
  // precision, the compression method), and the first failing key is the one reported.
  readRun(c, s);
  readModel(c, s);
  readData(c, s);
  readTrain(c, s);
  readOptim(c, s);
  readDist(c, s);
  readSharding(c, s);
  readCheckpoint(c, s);
  readTopo(c, s);
  return s;
}

}  // namespace mt
