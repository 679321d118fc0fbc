#include "launch/Trainer.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "comm/MpiCommunicator.h"
#include "core/EnvParams.h"
#include "core/Log.h"
#include "core/Threads.h"
#include "core/Timer.h"
#include "launch/Failure.h"
#include "models/ModelConfig.h"
#include "models/optim/GradClip.h"

namespace mt {

namespace fs = std::filesystem;

Trainer::Trainer(const Config& cfg, MpiEnvironment& mpi) : cfg_(cfg), mpi_(mpi) {
  LogLevel level;
  if (!parseLogLevel(cfg_.str("run.log_level"), &level)) cfg_.fail("run.log_level", "expected debug, info, warn or error");
  if (!std::getenv("MT_LOG_LEVEL")) setLogLevel(level);
  for (const auto& name : unknownEnvParams()) {
    if (mpi_.rank() == 0) MT_LOG_WARN << "unknown environment variable " << name << " (see trainer --help-env)";
  }
  seed_ = static_cast<uint64_t>(cfg_.i64("run.seed"));
  logInterval_ = cfg_.i64("run.log_interval");
  if (logInterval_ <= 0) cfg_.fail("run.log_interval", "must be positive");
  evalInterval_ = cfg_.i64("train.eval_interval");
  if (evalInterval_ < 0) cfg_.fail("train.eval_interval", "must be >= 0");
  gradClip_ = static_cast<float>(cfg_.f64("train.grad_clip"));
  if (gradClip_ < 0) cfg_.fail("train.grad_clip", "must be >= 0");
  const std::string dev = cfg_.choice("train.device", {"cpu", "cuda"});
  if (dev == "cuda") cfg_.fail("train.device", "the CUDA backend is not built into this trainer");
  setNumThreads(defaultNumThreads(mpi_.localSize()));

  runDir_ = (fs::path(cfg_.str("run.dir")) / cfg_.str("run.name")).string();
  setupComm();
  setupData();
  setupModel();
  setupOptimizer();

  if (world_->rank() == 0) {
    std::error_code ec;
    fs::create_directories(runDir_, ec);
    if (ec) throw IoError("cannot create run directory " + runDir_ + ": " + ec.message());
    std::ofstream ini(runDir_ + "/config.ini");
    ini << cfg_.toIni();
    if (!ini) throw IoError("cannot write " + runDir_ + "/config.ini");
    metrics_.open(runDir_ + "/metrics.jsonl", /*append=*/false);
  }
  if (cfg_.flag("run.trace")) {
    std::error_code ec;
    fs::create_directories(runDir_, ec);
    trace_ = std::make_unique<std::ofstream>(runDir_ + "/trace.rank" + std::to_string(world_->rank()) + ".jsonl");
  }
}

Trainer::~Trainer() {
  // Tear down in reverse dependency order: loader threads first, the communicator last.
  loader_.reset();
  if (health_) health_->shutdown();
}

void Trainer::setupComm() {
  CommOptions opts;
  opts.name = "world";
  int64_t timeoutS = envInt(EnvParam::kCommTimeoutS);
  if (timeoutS <= 0) timeoutS = cfg_.i64("dist.timeout_s");
  if (timeoutS <= 0) cfg_.fail("dist.timeout_s", "must be positive");
  opts.timeout = std::chrono::seconds(timeoutS);
  opts.fingerprint = cfg_.flag("dist.fingerprint") || envInt(EnvParam::kFingerprint) != 0;
  std::string backend = cfg_.choice("dist.backend", {"auto", "mpi", "local", "nccl"});
  if (backend == "nccl") cfg_.fail("dist.backend", "the NCCL backend needs a CUDA build and train.device = cuda");
  if (backend == "auto") backend = mpi_.size() > 1 ? "mpi" : "local";
  if (backend == "local" && mpi_.size() > 1)
    cfg_.fail("dist.backend", "local works for one rank only; this job has " + std::to_string(mpi_.size()));
  if (backend == "local") world_ = std::make_unique<LocalCommunicator>(opts);
  else world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, opts);
  if (world_->size() > 1 && cfg_.flag("dist.health_monitor")) {
    health_ = std::make_unique<HealthMonitor>(
        MPI_COMM_WORLD, [this](int lost, const std::string& why) { onPeerLost(*world_, lost, why); },
        static_cast<int>(envInt(EnvParam::kHealthPort)));
  }
}

void Trainer::setupData() {
  globalBatch_ = cfg_.i64("train.batch_size");
  if (globalBatch_ <= 0) cfg_.fail("train.batch_size", "must be positive");
  if (globalBatch_ % world_->size() != 0)
    cfg_.fail("train.batch_size", "the global batch must divide evenly over the " + std::to_string(world_->size()) +
                                      " ranks");
  localBatch_ = globalBatch_ / world_->size();
  const std::string lock = cfg_.choice("data.file_locking", {"auto", "on", "off"});
  FileLocking locking = lock == "on" ? FileLocking::kOn : lock == "off" ? FileLocking::kOff : FileLocking::kAuto;
  file_ = std::make_unique<H5File>(H5File::open(cfg_.str("data.path"), locking));
  train_ = std::make_unique<ImageDataset>(*file_, cfg_.str("data.train_split"), world_->size());
  test_ = std::make_unique<ImageDataset>(*file_, cfg_.str("data.test_split"), world_->size());
  const std::string mode = cfg_.choice("data.mode", {"memory", "stream"});
  if (mode == "memory") {
    train_->loadIntoMemory();
    test_->loadIntoMemory();
  }
  LoaderOptions lo;
  lo.batchSize = localBatch_;
  lo.numWorkers = static_cast<int>(cfg_.i64("data.num_workers"));
  if (lo.numWorkers < 0) cfg_.fail("data.num_workers", "must be >= 0");
  lo.prefetchFactor = static_cast<int>(cfg_.i64("data.prefetch_factor"));
  if (lo.prefetchFactor < 1) cfg_.fail("data.prefetch_factor", "must be >= 1");
  lo.shuffle = cfg_.flag("data.shuffle");
  lo.dropLast = true;
  lo.seed = seed_;
  trainSource_ = std::make_unique<ImageSource>(*train_);
  loader_ = std::make_unique<Loader>(*trainSource_, lo, world_->rank(), world_->size());
  const int64_t maxSteps = cfg_.i64("train.max_steps");
  if (maxSteps < 0) cfg_.fail("train.max_steps", "must be >= 0");
  const int64_t epochs = cfg_.i64("train.epochs");
  if (maxSteps == 0 && epochs <= 0) cfg_.fail("train.epochs", "must be positive when train.max_steps = 0");
  totalSteps_ = maxSteps > 0 ? maxSteps : epochs * loader_->batchesPerEpoch();
}

void Trainer::setupModel() {
  ModelConfig mc;
  mc.type = cfg_.choice("model.type", {"mlp", "cnn", "gpt"});
  if (mc.type == "gpt") cfg_.fail("model.type", "gpt needs token data; use a gpt config (configs/gpt_tiny.ini)");
  mc.hidden = cfg_.i64List("model.hidden");
  for (int64_t h : mc.hidden)
    if (h <= 0) cfg_.fail("model.hidden", "widths must be positive");
  mc.activation = cfg_.choice("model.activation", {"relu", "gelu"});
  mc.dropout = static_cast<float>(cfg_.f64("model.dropout"));
  if (mc.dropout < 0.f || mc.dropout >= 1.f) cfg_.fail("model.dropout", "must be in [0, 1)");
  if (!parseLayout(cfg_.str("model.layout"), &mc.layout)) cfg_.fail("model.layout", "expected nhwc or nchw");
  mc.convChannels = cfg_.i64List("model.conv_channels");
  for (int64_t c : mc.convChannels)
    if (c <= 0) cfg_.fail("model.conv_channels", "channels must be positive");
  mc.kernel = cfg_.i64("model.kernel");
  if (mc.kernel <= 0 || mc.kernel % 2 == 0) cfg_.fail("model.kernel", "must be a positive odd number");
  mc.fc = cfg_.i64("model.fc");
  if (mc.fc <= 0) cfg_.fail("model.fc", "must be positive");
  mc.inputMean = static_cast<float>(cfg_.f64("model.input_mean"));
  mc.inputStd = static_cast<float>(cfg_.f64("model.input_std"));
  if (mc.inputStd <= 0.f) cfg_.fail("model.input_std", "must be positive");
  InputSpec in = train_->spec();
  if (mc.type == "cnn") {
    int64_t h = in.height, w = in.width;
    for (size_t i = 0; i < mc.convChannels.size(); ++i) h /= 2, w /= 2;
    if (h <= 0 || w <= 0)
      cfg_.fail("model.conv_channels", std::to_string(mc.convChannels.size()) + " pooling stages shrink a " +
                                           std::to_string(in.height) + "x" + std::to_string(in.width) +
                                           " image to nothing");
  }
  model_ = buildImageModel(mc, in);
  model_->params().materialize(device_);
  model_->initParams(seed_);
  if (world_->size() > 1) {
    DataParallelOptions o;
    o.bucketCapMb = cfg_.f64("dist.bucket_cap_mb");
    o.firstBucketMb = cfg_.f64("dist.first_bucket_mb");
    if (o.bucketCapMb <= 0) cfg_.fail("dist.bucket_cap_mb", "must be positive");
    if (o.firstBucketMb <= 0) cfg_.fail("dist.first_bucket_mb", "must be positive");
    o.rebuildBuckets = cfg_.flag("dist.rebuild_buckets");
    dp_ = std::make_unique<DataParallel>(model_->params(), *world_, o);
    dp_->broadcastParameters(0);
    model_->setHooks(dp_.get());
  }
  if (world_->rank() == 0) {
    MT_LOG_INFO << "model " << model_->name() << ": " << model_->params().numel() << " parameters in "
                << model_->params().size() << " tensors; " << world_->size() << " rank(s) x batch " << localBatch_
                << " = global batch " << globalBatch_ << "; " << numThreads() << " thread(s) per rank";
  }
}

void Trainer::setupOptimizer() {
  OptimConfig oc;
  oc.type = cfg_.choice("optim.type", {"sgd", "adamw"});
  oc.weightDecay = static_cast<float>(cfg_.f64("optim.weight_decay"));
  oc.momentum = static_cast<float>(cfg_.f64("optim.momentum"));
  oc.nesterov = cfg_.flag("optim.nesterov");
  oc.beta1 = static_cast<float>(cfg_.f64("optim.beta1"));
  oc.beta2 = static_cast<float>(cfg_.f64("optim.beta2"));
  oc.eps = static_cast<float>(cfg_.f64("optim.eps"));
  if (oc.weightDecay < 0) cfg_.fail("optim.weight_decay", "must be >= 0");
  if (oc.beta1 < 0 || oc.beta1 >= 1) cfg_.fail("optim.beta1", "must be in [0, 1)");
  if (oc.beta2 < 0 || oc.beta2 >= 1) cfg_.fail("optim.beta2", "must be in [0, 1)");
  if (oc.nesterov && oc.momentum <= 0) cfg_.fail("optim.nesterov", "needs optim.momentum > 0");
  optimizer_ = makeOptimizer(oc, segmentsOf(model_->params()));
  schedule_.kind = cfg_.choice("schedule.kind", {"constant", "cosine", "linear"});
  schedule_.baseLr = static_cast<float>(cfg_.f64("optim.lr"));
  if (!(schedule_.baseLr > 0)) cfg_.fail("optim.lr", "must be positive");
  schedule_.minLr = static_cast<float>(cfg_.f64("schedule.min_lr"));
  schedule_.warmupSteps = cfg_.i64("schedule.warmup_steps");
  if (schedule_.warmupSteps < 0) cfg_.fail("schedule.warmup_steps", "must be >= 0");
  schedule_.totalSteps = totalSteps_;
}

LossStats Trainer::trainStep(const Batch& batch, int64_t step) {
  Context ctx;
  ctx.training = true;
  ctx.device = device_;
  ctx.seed = seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(world_->rank() + 1));
  ctx.step = step;
  model_->params().zeroGrads();
  LossStats stats = model_->forward(batch, ctx);
  const int64_t backwardStartUs = wallMicros();
  if (dp_) dp_->beginBackward(true);
  model_->backward(ctx);
  if (dp_) dp_->finishBackward();
  if (trace_) writeTrace(step, backwardStartUs);
  if (gradClip_ > 0.f) clipGradNorm(optimizer_->segments(), gradClip_);
  optimizer_->step(schedule_.at(step));
  if (dp_ && dp_->afterStep()) optimizer_->rebind(segmentsOf(model_->params()));
  return stats;
}

void Trainer::writeTrace(int64_t step, int64_t backwardStartUs) {
  nlohmann::json j;
  j["step"] = step;
  j["rank"] = world_->rank();
  j["backward_start_us"] = backwardStartUs;
  j["backward_end_us"] = dp_ ? dp_->backwardEndUs() : wallMicros();
  nlohmann::json buckets = nlohmann::json::array();
  if (dp_) {
    for (const auto& b : dp_->lastTrace())
      buckets.push_back({{"bucket", b.bucket}, {"bytes", b.bytes}, {"ready_us", b.readyUs}, {"started_us", b.startedUs},
                         {"done_us", b.doneUs}});
  }
  j["buckets"] = buckets;
  *trace_ << j.dump() << '\n';
}

EvalResult Trainer::evaluate() {
  const int W = world_->size(), r = world_->rank();
  const int64_t localEval = std::max<int64_t>(1, cfg_.i64("train.eval_batch_size") / W);
  // Rank r evaluates test examples r, r+W, ...: every example exactly once over all ranks.
  std::vector<int64_t> mine;
  for (int64_t i = r; i < test_->size(); i += W) mine.push_back(i);
  ImageSource src(*test_);
  ChunkCache cache;
  LossStats total;
  Context ctx;
  ctx.training = false;
  ctx.device = device_;
  for (size_t lo = 0; lo < mine.size(); lo += static_cast<size_t>(localEval)) {
    std::vector<int64_t> idx(mine.begin() + static_cast<std::ptrdiff_t>(lo),
                             mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), lo + localEval)));
    Batch b = src.collate(idx, &cache, cpuAllocator());
    LossStats s = model_->forward(b, ctx);
    total.lossSum += s.lossSum;
    total.correct += s.correct;
    total.count += s.count;
  }
  Tensor t = Tensor::empty({3}, DType::kF64);
  t.data<double>()[0] = total.lossSum;
  t.data<double>()[1] = static_cast<double>(total.correct);
  t.data<double>()[2] = static_cast<double>(total.count);
  world_->allReduceSync(t, ReduceOp::kSum);
  EvalResult e;
  e.count = static_cast<int64_t>(t.data<double>()[2]);
  e.loss = e.count ? t.data<double>()[0] / static_cast<double>(e.count) : 0.0;
  e.accuracy = e.count ? t.data<double>()[1] / static_cast<double>(e.count) : 0.0;
  return e;
}

void Trainer::logStep(int64_t step, const LossStats& local, double intervalSeconds, int64_t intervalSteps,
                      double waitSeconds) {
  // The step's loss over the global batch (every rank's rows), as a single process would report.
  Tensor t = Tensor::empty({3}, DType::kF64);
  t.data<double>()[0] = local.lossSum;
  t.data<double>()[1] = static_cast<double>(local.correct);
  t.data<double>()[2] = static_cast<double>(local.count);
  world_->allReduceSync(t, ReduceOp::kSum);
  if (world_->rank() != 0) return;
  const double count = t.data<double>()[2];
  const double loss = count > 0 ? t.data<double>()[0] / count : 0.0;
  const double acc = count > 0 ? t.data<double>()[1] / count : 0.0;
  const double sps = intervalSeconds > 0 ? static_cast<double>(intervalSteps * globalBatch_) / intervalSeconds : 0.0;
  const double stepTime = intervalSteps > 0 ? intervalSeconds / static_cast<double>(intervalSteps) : 0.0;
  const double eta = stepTime * static_cast<double>(totalSteps_ - step - 1);
  const LoaderPosition pos = loader_->positionOf(step);
  const int64_t epochs = (totalSteps_ + loader_->batchesPerEpoch() - 1) / loader_->batchesPerEpoch();
  const double waitPct = intervalSeconds > 0 ? 100.0 * waitSeconds / intervalSeconds : 0.0;
  char line[256];
  std::snprintf(line, sizeof(line),
                "step %lld/%lld epoch %lld/%lld loss %.4f acc %.3f lr %.3e samples/s %.0f data-wait %.1f%% ETA %s",
                static_cast<long long>(step + 1), static_cast<long long>(totalSteps_),
                static_cast<long long>(pos.epoch + 1), static_cast<long long>(epochs), loss, acc,
                static_cast<double>(schedule_.at(step)), sps, waitPct, formatDuration(eta).c_str());
  MT_LOG_INFO << line;
  nlohmann::json j = {{"type", "step"},        {"step", step + 1},
                      {"epoch", pos.epoch},    {"loss", loss},
                      {"accuracy", acc},       {"lr", schedule_.at(step)},
                      {"samples_per_s", sps},  {"step_time_s", stepTime},
                      {"data_wait_s", intervalSteps > 0 ? waitSeconds / static_cast<double>(intervalSteps) : 0.0},
                      {"time", wallMicros() / 1e6}};
  metrics_.write(j);
}

int Trainer::run() {
  Stopwatch total, interval;
  int64_t intervalSteps = 0;
  double intervalWait = 0.0;
  EvalResult last;
  bool evaluatedAtEnd = false;
  for (int64_t step = 0; step < totalSteps_; ++step) {
    Batch batch = loader_->next();
    intervalWait += loader_->lastWaitSeconds();
    LossStats stats = trainStep(batch, step);
    ++intervalSteps;
    const bool logNow = (step + 1) % logInterval_ == 0 || step + 1 == totalSteps_;
    if (logNow) {
      logStep(step, stats, interval.elapsed(), intervalSteps, intervalWait);
      interval.reset();
      intervalSteps = 0;
      intervalWait = 0.0;
    }
    const bool epochEnd = (step + 1) % loader_->batchesPerEpoch() == 0;
    const bool evalNow = evalInterval_ > 0 ? (step + 1) % evalInterval_ == 0 : epochEnd;
    if (evalNow) {
      last = evaluate();
      evaluatedAtEnd = step + 1 == totalSteps_;
      if (world_->rank() == 0) {
        MT_LOG_INFO << "eval step " << step + 1 << ": test_loss " << last.loss << " test_accuracy " << last.accuracy
                    << " (" << last.count << " examples)";
        metrics_.write({{"type", "eval"}, {"step", step + 1}, {"test_loss", last.loss},
                        {"test_accuracy", last.accuracy}, {"count", last.count}});
      }
    }
  }
  if (!evaluatedAtEnd) last = evaluate();
  if (world_->rank() == 0) {
    MT_LOG_INFO << "trained " << totalSteps_ << " steps in " << formatDuration(total.elapsed());
    // Unprefixed, for scripts: the one line a run ends with.
    std::printf("final test_accuracy=%.4f test_loss=%.4f\n", last.accuracy, last.loss);
    std::fflush(stdout);
    metrics_.write({{"type", "final"}, {"steps", totalSteps_}, {"test_loss", last.loss},
                    {"test_accuracy", last.accuracy}, {"wall_s", total.elapsed()}});
  }
  world_->barrierSync();
  return 0;
}

}  // namespace mt
