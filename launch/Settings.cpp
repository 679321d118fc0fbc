#include "launch/Settings.h"

#include <filesystem>

#include "core/EnvParams.h"
#include "core/Log.h"

namespace mt {

GptConfig Settings::gptForData(int64_t dataVocab, const Config& c) const {
  GptConfig g = gpt;
  if (g.vocab == 0) g.vocab = dataVocab;
  if (dataVocab > g.vocab) c.fail("model.vocab_size", "the data holds token ids up to " + std::to_string(dataVocab - 1));
  if (g.paddedVocab == 0) g.paddedVocab = (g.vocab + 127) / 128 * 128;
  if (g.paddedVocab < g.vocab) c.fail("model.padded_vocab", "smaller than the vocabulary " + std::to_string(g.vocab));
  return g;
}

Settings Settings::fromConfig(const Config& c) {
  Settings s;
  // run
  s.runName = c.str("run.name");
  if (s.runName.empty() || s.runName.find('/') != std::string::npos) c.fail("run.name", "must be a plain name");
  s.runDir = (std::filesystem::path(c.str("run.dir")) / s.runName).string();
  s.seed = static_cast<uint64_t>(c.i64("run.seed"));
  s.logInterval = c.i64("run.log_interval");
  if (s.logInterval <= 0) c.fail("run.log_interval", "must be positive");
  s.trace = c.flag("run.trace");
  LogLevel level;
  if (!parseLogLevel(c.str("run.log_level"), &level)) c.fail("run.log_level", "expected debug, info, warn or error");
  if (!std::getenv("MT_LOG_LEVEL")) setLogLevel(level);

  // model
  ModelConfig& m = s.model;
  m.type = c.choice("model.type", {"mlp", "cnn", "gpt"});
  m.hidden = c.i64List("model.hidden");
  for (int64_t h : m.hidden)
    if (h <= 0) c.fail("model.hidden", "widths must be positive");
  m.activation = c.choice("model.activation", {"relu", "gelu"});
  m.dropout = static_cast<float>(c.f64("model.dropout"));
  if (m.dropout < 0.f || m.dropout >= 1.f) c.fail("model.dropout", "must be in [0, 1)");
  if (!parseLayout(c.str("model.layout"), &m.layout)) c.fail("model.layout", "expected nhwc or nchw");
  m.convChannels = c.i64List("model.conv_channels");
  if (m.convChannels.empty()) c.fail("model.conv_channels", "needs at least one stage");
  for (int64_t ch : m.convChannels)
    if (ch <= 0) c.fail("model.conv_channels", "channels must be positive");
  m.kernel = c.i64("model.kernel");
  if (m.kernel <= 0 || m.kernel % 2 == 0) c.fail("model.kernel", "must be a positive odd number");
  m.fc = c.i64("model.fc");
  if (m.fc <= 0) c.fail("model.fc", "must be positive");
  m.inputMean = static_cast<float>(c.f64("model.input_mean"));
  m.inputStd = static_cast<float>(c.f64("model.input_std"));
  if (m.inputStd <= 0.f) c.fail("model.input_std", "must be positive");
  if (m.type == "gpt") {
    try {
      s.gpt = GptConfig::preset(c.str("model.gpt_preset"));
    } catch (const ConfigError&) {
      c.fail("model.gpt_preset", "expected d6, d12, d24, d36 or d48");
    }
    for (const char* k : {"model.layers", "model.heads", "model.channels"})
      if (c.i64(k) < 0) c.fail(k, "must be >= 0");
    if (c.i64("model.layers") > 0) s.gpt.layers = c.i64("model.layers");
    if (c.i64("model.heads") > 0) s.gpt.heads = c.i64("model.heads");
    if (c.i64("model.channels") > 0) s.gpt.channels = c.i64("model.channels");
    if (s.gpt.channels % s.gpt.heads != 0) c.fail("model.channels", "must be a multiple of model.heads");
    s.gpt.maxT = c.i64("model.seq_len");
    if (s.gpt.maxT <= 0) c.fail("model.seq_len", "must be positive");
    s.gpt.vocab = c.i64("model.vocab_size");  // 0: from the data file
    s.gpt.paddedVocab = c.i64("model.padded_vocab");
    if (s.gpt.vocab < 0) c.fail("model.vocab_size", "must be >= 0");
    if (s.gpt.paddedVocab < 0) c.fail("model.padded_vocab", "must be >= 0");
  }

  // data
  s.dataPath = c.str("data.path");
  s.trainSplit = c.str("data.train_split");
  s.testSplit = c.str("data.test_split");
  s.dataMode = c.choice("data.mode", {"memory", "stream"});
  parseFeedMode(c.choice("data.feed", {"pinned", "uvm", "device"}), &s.feed);
  if (s.feed == FeedMode::kDevice && s.dataMode != "memory")
    c.fail("data.feed", "device needs data.mode = memory (the split is loaded once, then copied to the GPU)");
  const std::string lock = c.choice("data.file_locking", {"auto", "on", "off"});
  s.locking = lock == "on" ? FileLocking::kOn : lock == "off" ? FileLocking::kOff : FileLocking::kAuto;
  s.loader.numWorkers = static_cast<int>(c.i64("data.num_workers"));
  if (s.loader.numWorkers < 0) c.fail("data.num_workers", "must be >= 0");
  s.loader.prefetchFactor = static_cast<int>(c.i64("data.prefetch_factor"));
  if (s.loader.prefetchFactor < 1) c.fail("data.prefetch_factor", "must be >= 1");
  s.loader.shuffle = c.flag("data.shuffle");
  s.loader.dropLast = true;
  s.loader.seed = s.seed;

  // train
  s.epochs = c.i64("train.epochs");
  s.maxSteps = c.i64("train.max_steps");
  if (s.maxSteps < 0) c.fail("train.max_steps", "must be >= 0");
  if (s.maxSteps == 0 && s.epochs <= 0) c.fail("train.epochs", "must be positive when train.max_steps = 0");
  s.globalBatch = c.i64("train.batch_size");
  if (s.globalBatch <= 0) c.fail("train.batch_size", "must be positive");
  s.gradAccum = c.i64("train.grad_accum_steps");
  if (s.gradAccum < 1) c.fail("train.grad_accum_steps", "must be >= 1");
  s.evalBatch = c.i64("train.eval_batch_size");
  if (s.evalBatch <= 0) c.fail("train.eval_batch_size", "must be positive");
  s.evalInterval = c.i64("train.eval_interval");
  if (s.evalInterval < 0) c.fail("train.eval_interval", "must be >= 0");
  s.device = c.choice("train.device", {"cpu", "cuda"});
  s.precision = c.choice("train.precision", {"f32", "bf16", "f16"});
  if (s.precision != "f32" && s.device != "cuda") c.fail("train.precision", "bf16 and f16 need train.device = cuda");
  s.memoryCapMb = c.i64("train.memory_cap_mb");
  if (s.memoryCapMb < 0) c.fail("train.memory_cap_mb", "must be >= 0");
  s.gradClip = static_cast<float>(c.f64("train.grad_clip"));
  s.evalBatches = c.i64("train.eval_batches");
  if (s.evalBatches <= 0) c.fail("train.eval_batches", "must be positive");
  s.peakFlops = c.f64("train.peak_flops");
  if (!(s.peakFlops > 0)) c.fail("train.peak_flops", "must be positive");
  if (s.gradClip < 0) c.fail("train.grad_clip", "must be >= 0");

  // optim
  OptimConfig& o = s.optim;
  o.type = c.choice("optim.type", {"sgd", "adamw"});
  o.weightDecay = static_cast<float>(c.f64("optim.weight_decay"));
  o.momentum = static_cast<float>(c.f64("optim.momentum"));
  o.nesterov = c.flag("optim.nesterov");
  o.beta1 = static_cast<float>(c.f64("optim.beta1"));
  o.beta2 = static_cast<float>(c.f64("optim.beta2"));
  o.eps = static_cast<float>(c.f64("optim.eps"));
  if (o.weightDecay < 0) c.fail("optim.weight_decay", "must be >= 0");
  if (o.momentum < 0 || o.momentum >= 1) c.fail("optim.momentum", "must be in [0, 1)");
  if (o.beta1 < 0 || o.beta1 >= 1) c.fail("optim.beta1", "must be in [0, 1)");
  if (o.beta2 < 0 || o.beta2 >= 1) c.fail("optim.beta2", "must be in [0, 1)");
  if (!(o.eps > 0)) c.fail("optim.eps", "must be positive");
  if (o.nesterov && o.momentum <= 0) c.fail("optim.nesterov", "needs optim.momentum > 0");
  s.schedule.kind = c.choice("schedule.kind", {"constant", "cosine", "linear"});
  s.schedule.baseLr = static_cast<float>(c.f64("optim.lr"));
  if (!(s.schedule.baseLr > 0)) c.fail("optim.lr", "must be positive");
  s.schedule.minLr = static_cast<float>(c.f64("schedule.min_lr"));
  if (s.schedule.minLr < 0) c.fail("schedule.min_lr", "must be >= 0");
  s.schedule.warmupSteps = c.i64("schedule.warmup_steps");
  if (s.schedule.warmupSteps < 0) c.fail("schedule.warmup_steps", "must be >= 0");

  // dist
  s.backend = c.choice("dist.backend", {"auto", "mpi", "local", "nccl"});
  s.dp.bucketCapMb = c.f64("dist.bucket_cap_mb");
  if (!(s.dp.bucketCapMb > 0)) c.fail("dist.bucket_cap_mb", "must be positive");
  s.dp.firstBucketMb = c.f64("dist.first_bucket_mb");
  if (!(s.dp.firstBucketMb > 0)) c.fail("dist.first_bucket_mb", "must be positive");
  s.dp.rebuildBuckets = c.flag("dist.rebuild_buckets");
  int64_t timeout = envInt(EnvParam::kCommTimeoutS);
  if (timeout <= 0) {
    timeout = c.i64("dist.timeout_s");
    // Deadlines are steady_clock time points: 1e10 s overflowed and every collective timed out.
    if (timeout <= 0 || timeout > 604800) c.fail("dist.timeout_s", "must be in [1, 604800] (one week)");
  }
  s.timeout = std::chrono::seconds(timeout);
  s.fingerprint = c.flag("dist.fingerprint") || envInt(EnvParam::kFingerprint) != 0;
  s.healthMonitor = c.flag("dist.health_monitor");
  CompressionOptions& co = s.compression;
  co.method = parseCompressionMethod(c.choice("compression.method", {"none", "fp16", "bf16", "powersgd", "topk"}));
  co.rank = static_cast<int>(c.i64("compression.rank"));
  if (co.rank < 1) c.fail("compression.rank", "must be >= 1");
  co.startIter = c.i64("compression.start_iter");
  if (co.startIter < 0) c.fail("compression.start_iter", "must be >= 0");
  co.minCompressionRate = c.f64("compression.min_compression_rate");
  if (!(co.minCompressionRate >= 1.0)) c.fail("compression.min_compression_rate", "must be >= 1");
  co.warmStart = c.flag("compression.warm_start");
  co.errorFeedback = c.flag("compression.error_feedback");
  co.topkFraction = c.f64("compression.topk_fraction");
  if (!(co.topkFraction > 0.0 && co.topkFraction <= 1.0)) c.fail("compression.topk_fraction", "must be in (0, 1]");
  co.topkWarmupSteps = c.i64("compression.topk_warmup_steps");
  if (co.topkWarmupSteps < 0) c.fail("compression.topk_warmup_steps", "must be >= 0");
  co.seed = s.seed;
  if (!parseShardStrategy(c.choice("sharding.strategy", {"no_shard", "full_shard", "shard_grad_op", "hybrid_shard"}),
                          &s.sharding.strategy))
    c.fail("sharding.strategy", "unknown strategy");
  s.sharding.offloadCpu = c.choice("sharding.offload", {"none", "cpu"}) == "cpu";
  s.sharding.prefetchLimit = static_cast<int>(c.i64("sharding.prefetch_limit"));
  if (s.sharding.prefetchLimit < 1) c.fail("sharding.prefetch_limit", "must be >= 1");
  parseDType(c.choice("sharding.param_dtype", {"f32", "bf16"}), &s.sharding.paramDtype);
  parseDType(c.choice("sharding.reduce_dtype", {"f32", "bf16"}), &s.sharding.reduceDtype);
  if (s.sharding.offloadCpu && s.sharding.strategy == ShardStrategy::kNoShard)
    c.fail("sharding.offload", "needs a sharded strategy (full_shard, shard_grad_op or hybrid_shard)");
  if (co.method != CompressionMethod::kNone && s.sharding.strategy != ShardStrategy::kNoShard)
    c.fail("compression.method", "compresses the data-parallel all-reduce; sharded strategies reduce-scatter "
                                 "uncompressed (use sharding.reduce_dtype = bf16 to halve their traffic)");
  s.checkpointDir = c.str("checkpoint.dir");
  if (s.checkpointDir.empty()) s.checkpointDir = s.runDir + "/checkpoints";
  s.checkpointInterval = c.i64("checkpoint.interval");
  if (s.checkpointInterval < 0) c.fail("checkpoint.interval", "must be >= 0");
  s.checkpointKeep = c.i64("checkpoint.keep");
  if (s.checkpointKeep < 1) c.fail("checkpoint.keep", "must be >= 1");
  s.resume = c.str("checkpoint.resume");
  if (s.resume.empty()) c.fail("checkpoint.resume", "expected auto, never or a checkpoint directory");
  s.checkpointAtExit = c.flag("checkpoint.at_exit");
  s.topoFile = c.str("topo.file");
  s.profile = c.str("topo.profile");
  s.hierarchical = c.flag("topo.hierarchical");
  s.bindCpus = c.flag("topo.bind_cpus");
  s.nodeRanks = static_cast<int>(c.i64("topo.node_ranks"));
  if (s.nodeRanks < 0) c.fail("topo.node_ranks", "must be >= 0");
  if (s.hierarchical && co.method != CompressionMethod::kNone)
    c.fail("compression.method", "cannot be combined with topo.hierarchical (choose one)");
  return s;
}

}  // namespace mt
