#include "launch/Trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "comm/MpiCommunicator.h"
#include "core/Allocator.h"
#include "core/EnvParams.h"
#include "core/Files.h"
#include "core/Log.h"
#include "core/Threads.h"
#include "core/Timer.h"
#include "core/optim/LossScaler.h"
#include "launch/Failure.h"
#include "launch/Fp8Checkpoint.h"
#include "launch/NcclReport.h"
#include "launch/SetupAgreement.h"
#include "models/layers/SoftmaxCrossEntropy.h"
#include "models/quant/QuantizedModel.h"

#ifdef MT_WITH_CUDA
#include "comm/NcclCommunicator.h"
#include "core/cuda/CudaMemory.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"
#include "core/cuda/CudaStream.h"
#endif

namespace mt {

namespace fs = std::filesystem;

// GPU work is asynchronous: the compute time of a step is measured with events on the compute
// stream, for the last step of each log interval (read when the interval report synchronises anyway).
struct Trainer::GpuTimers {
#ifdef MT_WITH_CUDA
  CudaEvent start{true}, end{true};
  bool recorded = false;
#endif
};

double Trainer::lastGpuComputeSeconds() {
#ifdef MT_WITH_CUDA
  if (gpuTimers_ && gpuTimers_->recorded) {
    gpuTimers_->end.synchronize();
    return gpuTimers_->end.elapsedMs(gpuTimers_->start) / 1000.0;
  }
#endif
  return 0.0;
}

// Open MPI binds each of up to two ranks to one core by default: the CPU optimizer step of
// sharding.offload = cpu then runs on one core (d24 on the H200: 1.35 s a step instead of ~0.1 s).
void Trainer::warnIfBoundNarrowly() const {
  const int share = coresPerRank(mpi_.localSize()), bound = affinityCores();
  if (!s_.sharding.offloadCpu || bound <= 0 || bound >= share || mpi_.rank() != 0) return;
  MT_LOG_WARN << "sharding.offload = cpu: the launcher bound this rank to " << bound << " core(s) of the " << share
              << " that are its share of the node, and the CPU optimizer step runs on them; launch with "
                 "`mpirun --bind-to none` (or --map-by <unit>:PE=" << share << ", srun --cpus-per-task=" << share
              << ")";
}

// Settings the schema admits that this run's device or strategy does not use: said once, so a
// comparison run is not believed to have measured them.
void Trainer::warnIfWithoutEffect() const {
  if (mpi_.rank() != 0) return;
  const bool sharded = s_.sharding.strategy != ShardStrategy::kNoShard;
  if (s_.sharding.delayedUpdate && device_.isCpu())
    MT_LOG_WARN << "sharding.delayed_update: on the CPU the optimizer steps the shards in place, with no CPU step to "
                   "overlap; this run's updates are not delayed";
  if (!sharded && cfg_.str("sharding.reduce_dtype") != "f32")
    MT_LOG_WARN << "sharding.reduce_dtype applies to the sharded strategies' reduce-scatter; no_shard all-reduces "
                   "in f32 (compression.method = bf16 or fp16 halves its traffic)";
  if (!sharded && cfg_.str("sharding.param_dtype") != "auto")
    MT_LOG_WARN << "sharding.param_dtype applies to the sharded strategies' gather copy; no_shard keeps f32 weights";
  // Keys of one precision or mode set away from their defaults in a run of another.
  const auto changed = [&](const std::string& prefix) {
    std::string keys;
    for (const ConfigKey& k : configSchema())
      if (k.key.rfind(prefix, 0) == 0 && cfg_.str(k.key) != k.defaultValue) keys += (keys.empty() ? "" : ", ") + k.key;
    return keys;
  };
  const std::string fp8Keys = changed("fp8."), scalerKeys = changed("train.loss_scale_");
  if (s_.precision != "fp8" && !fp8Keys.empty())
    MT_LOG_WARN << fp8Keys << ": set, but train.precision = " << s_.precision << " runs no FP8 layer";
  if (s_.precision != "f16" && !scalerKeys.empty())
    MT_LOG_WARN << scalerKeys << ": set, but only train.precision = f16 scales the loss (this run: "
                << s_.precision << ")";
  if (s_.gpt.checkpointing == ActivationCheckpointing::kNone && !changed("train.activation_checkpointing_").empty())
    MT_LOG_WARN << "train.activation_checkpointing_every: set, but train.activation_checkpointing = none";
}

Trainer::Trainer(const Config& cfg, MpiEnvironment& mpi, RunMetrics* metrics)
    : cfg_(cfg), s_(Settings::fromConfig(cfg)), mpi_(mpi), launch_(discoverLaunch(mpi)), metrics_(metrics) {
  if (mpi_.rank() == 0) MT_LOG_INFO << launch_.describe() << " on " << mpi_.numNodes() << " node(s)";
  for (const auto& name : unknownEnvParams()) {
    if (mpi_.rank() == 0) MT_LOG_WARN << "unknown environment variable " << name << " (see trainer --help-env)";
  }
  setNumThreads(defaultNumThreads(mpi_.localSize()));
  warnIfBoundNarrowly();
  runDir_ = s_.runDir;
  takeRunDirectory();
  topo_ = applyTopology(s_, mpi_.rank());
  setupDevice();
  warnIfWithoutEffect();
  setupComm();
  setupData();
  setupModel();
  resumeIfAny();
  writeRunFiles();
  if (metrics_)
    metrics_->identify({runDir_, s_.runName, model_->name(), parallelism_->strategyName(), device_.str(),
                        world_->size(), totalSteps_, startStep_, s_.globalBatch});
  // Collective (MPI_Comm_dup): only after every rank-local step of setup has been agreed on.
  if (mpi_.size() > 1) stop_ = std::make_unique<StopAgreement>(MPI_COMM_WORLD);
}

// Before anything is written into the run directory: rank 0 locks it (a second job into it exits 2
// naming the first) and, with checkpoint.resume = never, moves a previous run's files aside so
// the new run's checkpoints and metrics never mix with them. Every rank learns the outcome.
void Trainer::takeRunDirectory() {
  agreeOnStep(MPI_COMM_WORLD, [this] {
    if (mpi_.rank() != 0) return;
    lock_ = RunDirLock::acquire(runDir_, s_.lockStaleS);
    if (s_.resume != "never") return;
    const std::string moved = archivePreviousRun(runDir_, s_.checkpointDir);
    if (!moved.empty()) MT_LOG_WARN << moved;
  });
}

Trainer::~Trainer() {
  // Tear down in reverse dependency order: loader threads, GPU tensors, communicators, the device.
  evaluator_.reset();
  feed_.reset();
  loader_.reset();
  if (health_) health_->shutdown();
  parallelism_.reset();
  model_.reset();
  world_.reset();
}

void Trainer::setupDevice() {
  if (s_.device != "cuda") return;
#ifdef MT_WITH_CUDA
  const int n = cudaDeviceCountOrZero();
  if (n == 0) cfg_.fail("train.device", "no CUDA device is visible to rank " + std::to_string(mpi_.rank()));
  // By the place on the machine, not in an emulated node (MT_NODE_SPLIT): ranks 0 and 4 of two
  // emulated 4-rank nodes on one 8-GPU machine are local rank 0 both, but need GPUs 0 and 4.
  cuda_ = std::make_unique<CudaRuntime>(mpi_.machineLocalRank() % n);
  device_ = cuda_->dev();
  // fp8: the block Linears multiply in FP8 (models/layers/Fp8Linear.h), everything else in bf16.
  cuda_->setMatmulPrecision(s_.precision == "bf16" || s_.precision == "fp8" ? MatmulPrecision::kBF16
                            : s_.precision == "f16"                         ? MatmulPrecision::kF16
                                                                            : MatmulPrecision::kF32);
  if (s_.memoryCapMb > 0) cuda_->allocator().setMemoryCap(static_cast<size_t>(s_.memoryCapMb) << 20);
  if (s_.precision == "f16") {
    LossScalerOptions o;
    o.initScale = static_cast<float>(s_.lossScaleInit);
    o.growthInterval = s_.lossScaleGrowthInterval;
    scaler_ = std::make_unique<LossScaler>(o);
  }
  MT_LOG_DEBUG << "rank " << mpi_.rank() << " on GPU " << cuda_->device() << " (" << cuda_->deviceName() << ")";
#else
  cfg_.fail("train.device", "this trainer was built without CUDA");
#endif
}

// Every rank's (host, GPU, rail) before any communicator: the node groups, the CPU binding and the
// NIC binding come from it; then what NCCL must read at its first call (NCCL_IB_HCA, the test mode's
// host identities, the launch order of concurrent communicators), logged by rank 0.
void Trainer::placeRank(bool nccl) {
  RankSelf self;
  self.rank = mpi_.rank();
  self.hostname = mpi_.hostname();
  self.machine = mpi_.machineIndex();
  self.emulatedNodeRanks = s_.nodeRanks > 0 ? s_.nodeRanks : mpi_.emulatedNodeSize();
  self.localRank = self.emulatedNodeRanks > 0 ? mpi_.rank() % self.emulatedNodeRanks : mpi_.localRank();
  self.device = device_.isCuda() ? device_.index : -1;
  self.nccl = nccl;
  self.shareGpuForTests = nccl && envInt(EnvParam::kNcclShareGpu) != 0;
  const size_t listed = topo_.ncclEnv.size();
  exchangeRankLayout(MPI_COMM_WORLD, self, topo_);
  if (self.shareGpuForTests) shareGpuForTests(topo_, self);
#ifdef MT_WITH_CUDA
  if (nccl && (s_.hierarchical || s_.sharding.strategy == ShardStrategy::kHybridShard))
    orderConcurrentCommunicators(topo_,
                                 s_.hierarchical ? "topo.hierarchical" : "sharding.strategy = hybrid_shard",
                                 {"world", "intra", "inter"}, cuda_->smCount());
#endif
  if (device_.isCuda() && topo_.topology && s_.bindCpus)
    bindToGpuCpus(*topo_.topology, topo_.layout.placements.at(static_cast<size_t>(mpi_.rank())));
  if (s_.bindNic) bindRailNic(topo_, mpi_.rank());
  if (mpi_.rank() == 0)
    for (size_t i = listed; i < topo_.ncclEnv.size(); ++i)
      MT_LOG_INFO << "nccl env: " << topo_.ncclEnv[i];
}

void Trainer::setupComm() {
  CommOptions opts;
  opts.name = "world";
  opts.timeout = s_.timeout;
  opts.fingerprint = s_.fingerprint;
  std::string backend = s_.backend;
  if (backend == "nccl" && !device_.isCuda()) cfg_.fail("dist.backend", "nccl needs train.device = cuda");
  if (backend == "auto") backend = mpi_.size() > 1 ? (device_.isCuda() ? "nccl" : "mpi") : "local";
  if (backend == "local" && mpi_.size() > 1)
    cfg_.fail("dist.backend", "local works for one rank only; this job has " + std::to_string(mpi_.size()));
  placeRank(backend == "nccl");
  if (topo_.profile) opts.tuning = topo_.profile->tuning("world");
  if (backend == "local") {
    world_ = std::make_unique<LocalCommunicator>(opts);
  } else if (backend == "nccl") {
#ifdef MT_WITH_CUDA
    world_ = std::make_unique<NcclCommunicator>(MPI_COMM_WORLD, opts, [this](const std::string& why) {
      abortJob(why, ExitCode::kCommFailure, nullptr, health_.get());
    });
#endif
  } else {
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, opts);
  }
  if (world_->size() > 1 && s_.healthMonitor) {
    health_ = std::make_unique<HealthMonitor>(
        MPI_COMM_WORLD,
        [this](int lost, const std::string& why, int code) { onPeerLost(*world_, lost, why, code); },
        static_cast<int>(envInt(EnvParam::kHealthPort)), static_cast<int>(envInt(EnvParam::kHeartbeatS)));
  }
}

void Trainer::setupData() {
  if (s_.globalBatch % world_->size() != 0)
    cfg_.fail("train.batch_size", "the global batch must divide evenly over the " + std::to_string(world_->size()) +
                                      " ranks");
  localBatch_ = s_.globalBatch / world_->size();
  if (localBatch_ % s_.gradAccum != 0)
    cfg_.fail("train.grad_accum_steps", "each rank's " + std::to_string(localBatch_) + " rows per step (train.batch_size " +
                                            std::to_string(s_.globalBatch) + " over " + std::to_string(world_->size()) +
                                            " ranks) must divide into " + std::to_string(s_.gradAccum) + " micro-batches");
  microBatch_ = localBatch_ / s_.gradAccum;
  task_ = Task::open(s_, world_->size(), world_->rank());
  LoaderOptions lo = s_.loader;
  lo.batchSize = microBatch_;  // the loader hands out micro-batches
  host_ = &loaderStaging_;
#ifdef MT_WITH_CUDA
  if (device_.isCuda()) {
    if (s_.feed == FeedMode::kPinned) host_ = &cuda_->pinned();
    if (s_.feed == FeedMode::kUvm) host_ = &cuda_->managed();
    if (s_.feed == FeedMode::kDevice) lo.numWorkers = 0;  // the GPU gathers; no host collation
    const int dev = cuda_->device();
    lo.workerInit = [dev] { bindThreadToDevice(dev); };
  }
#endif
  s_.loader = lo;  // the evaluator's loader works the same way
  loader_ = std::make_unique<Loader>(task_->trainSource(), lo, world_->rank(), world_->size(), *host_);
  if (device_.isCuda()) {
    feed_ = std::make_unique<DeviceFeed>(s_.feed, *loader_, device_, &task_->trainSplit());
    if (world_->rank() == 0)
      MT_LOG_INFO << "data feed " << feedModeName(s_.feed)
                  << (s_.feed == FeedMode::kDevice ? ", " + formatBytes(feed_->residentBytes()) + " resident on the GPU"
                                                    : std::string());
  }
  totalSteps_ = s_.maxSteps > 0 ? s_.maxSteps : s_.epochs * stepsPerEpoch();
}

// Optimizer steps per epoch: the loader's batches are micro-batches.
int64_t Trainer::stepsPerEpoch() const { return std::max<int64_t>(1, loader_->batchesPerEpoch() / s_.gradAccum); }

void Trainer::setupModel() {
  if (world_->rank() == 0)
    MT_LOG_INFO << "building the " << s_.model.type << " model on " << device_.str() << task_->modelDetail();
  model_ = task_->buildModel(s_, cfg_);
  if (s_.qat) {
    QuantOptions q;
    q.mode = QuantMode::kTrain;
    parseObserverKind(s_.qatObserver, &q.observer);  // (the schema admits minmax and ema only)
    q.freezeStep = s_.qatObserveSteps;
    qat_ = std::make_unique<QuantizedModel>(*model_, q);
    if (world_->rank() == 0)
      MT_LOG_INFO << "train.qat: int8 fake quantization at " << qat_->numSites() << " sites, " << s_.qatObserver
                  << " observers frozen after step " << s_.qatObserveSteps;
  }
  // A model too large for the machine is a configuration error (exit 2, saying what it needs),
  // not an allocation failure deep inside setup.
  // Values, gradients and the optimizer's state (AdamW: m and v; SGD: the momentum buffer).
  const int64_t numParams = model_->params().numel();
  const int64_t bytesPerParam = 8 + (s_.optim.type == "adamw" ? 8 : 4);
  const std::string needs = std::to_string(numParams) + " parameters" + task_->modelDetail() + " need " +
                            formatBytes(numParams * 4) + " (" + formatBytes(numParams * bytesPerParam) +
                            " with gradients and " + s_.optim.type + " state)";
  if (device_.isCpu()) {
    // All of it in this machine's memory: a process past it is killed by the kernel rather than
    // failing an allocation, so the check counts the whole, not the values alone.
    const int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
    if (phys > 0 && numParams * bytesPerParam > phys)
      cfg_.fail(task_->sizeKey(cfg_), "the model's " + needs + ", more than this machine's " + formatBytes(phys) +
                                      " of memory");
  }
  // Sharded: the engine copies this rank's shards out of host-staged values and hands out
  // gradient buffers per unit; the whole model on the GPU would only raise the setup peak.
  const bool sharded = s_.sharding.strategy != ShardStrategy::kNoShard;
  try {
    model_->params().materialize(device_, DType::kF32,
                                 sharded ? ParamStorage::kHostValuesOnly : ParamStorage::kDevice);
  } catch (const OutOfMemoryError& e) {
    cfg_.fail(task_->sizeKey(cfg_), "the model's " + needs + ": " + e.what());
  }
  model_->initParams(s_.seed);
  parallelism_ = makeParallelism(s_, cfg_, *model_, *world_, nodePlanOf(topo_, mpi_.rank()));
  if (world_->rank() == 0) {
    MT_LOG_INFO << "model " << model_->name() << ": " << model_->params().numel() << " parameters in "
                << model_->params().size() << " tensors; " << world_->size() << " rank(s) x batch " << localBatch_
                << " = global batch " << s_.globalBatch << "; " << numThreads() << " thread(s) per rank";
  }
  schedule_ = s_.schedule;
  schedule_.totalSteps = totalSteps_;
}

void Trainer::resumeIfAny() {
  ckpt_ = std::make_unique<CheckpointManager>(s_.checkpointDir, static_cast<int>(s_.checkpointKeep), *world_,
                                              s_.checkpointTimeout);
  ckpt_->setIdentity({task_->architecture(*model_), s_.dataPath, s_.trainSplit, s_.globalBatch, runDir_});
  ckpt_->prepare();
  if (s_.resume == "never") return;
  const std::string path = s_.resume == "auto" ? ckpt_->findLatestValid() : s_.resume;
  if (path.empty()) return;
  TrainState st = ckpt_->load(path, *parallelism_, model_->params());
  parallelism_->afterLoad();
  if (st.seed != s_.seed && world_->rank() == 0)
    MT_LOG_WARN << "checkpoint " << path << " was written with run.seed " << st.seed << ", this run uses " << s_.seed
                << ": the data order will differ from the original run";
  // A finished run is never "resumed" into negative work: past this config's end it is refused
  // (the user asked for fewer steps than were done), at its end nothing is trained.
  const std::string howTo = "; raise train.epochs or train.max_steps to extend it, or start afresh with "
                            "--checkpoint.resume=never or another --run.name";
  if (st.step > totalSteps_)
    throw ConfigError("run directory " + runDir_ + " holds a run at step " + std::to_string(st.step) + " (" + path +
                      "), past this configuration's " + std::to_string(totalSteps_) + " steps" + howTo);
  if (st.step == totalSteps_ && world_->rank() == 0)
    MT_LOG_INFO << "run directory " << runDir_ << " holds a finished run (" << totalSteps_ << " steps, " << path
                << "): nothing to train, evaluating it" << howTo;
  startStep_ = st.step;
  // loader_seq counts global batches of train.batch_size rows (any grad_accum_steps).
  loader_->seek(st.loaderSeq * s_.gradAccum);
  if (scaler_ && st.lossScale > 0) scaler_->setState(st.lossScale, st.scalerClean, st.scalerSkipped);
  if (qat_ && !st.qat.empty()) qat_->loadState(st.qat, "checkpoint " + path);
  if (qat_ && st.qat.empty() && st.step > 0 && world_->rank() == 0)
    MT_LOG_WARN << "checkpoint " << path << " holds no quantization state (trained without train.qat): the observers "
                << (st.step < s_.qatObserveSteps ? "start afresh" : "are past train.qat_observe_steps and see nothing");
  restoreFp8States(*model_, st, world_->rank() == 0, path);
  resumed_ = true;
  if (world_->rank() == 0)
    MT_LOG_INFO << "resumed from " << path << " at step " << startStep_ << " (written by " << st.strategy << " training)";
}

// Rank 0 writes most of these files alone: its failure (a directory named config.ini, a read-only
// or full disk) is agreed on before the next collective, so every rank exits 2 with its message.
void Trainer::writeRunFiles() {
  agreeOnStep(MPI_COMM_WORLD, [this] {
    try {
      writeOwnRunFiles();
    } catch (const IoError& e) {
      throw ConfigError("run directory " + runDir_ + " is not usable: " + e.what());
    }
  });
  // Collective; rank 0 writes the report at its end.
  if (s_.topoReport)
    agreeOnStep(MPI_COMM_WORLD, [this] {
      writeNcclReport(runDir_, *world_, world_->rank(), parallelism_->groupCommunicators(), topo_);
    });
}

void Trainer::writeOwnRunFiles() {
  std::error_code ec;
  fs::create_directories(runDir_, ec);
  if (ec) throw IoError("cannot create run directory " + runDir_ + ": " + ec.message());
  // Which process is which rank, for operators (and the fault tests) that signal one rank.
  writeFileAtomically(runDir_ + "/rank" + std::to_string(world_->rank()) + ".pid",
                      std::to_string(::getpid()) + "\n");
  if (world_->rank() == 0) {
    // The preemption marker of a previous attempt is stale now (scripts/slurm requeue on it).
    fs::remove(runDir_ + "/PREEMPTED", ec);
    if (!topo_.ncclEnv.empty() || topo_.profile) writeNcclEnv(runDir_ + "/nccl.env", topo_);
    writeFileAtomically(runDir_ + "/config.ini", cfg_.toIni());
  }
  reporter_ = std::make_unique<RunReporter>(*task_, *world_, runDir_, resumed_, s_.trace, metrics_);
}

void Trainer::adviseResume() const {
  if (world_->rank() != 0 || s_.resume == "auto") return;
  const std::string again =
      s_.resume == "never" ? "start afresh again (moving this run aside)" : "load " + s_.resume + " again";
  MT_LOG_WARN << "this run was started with checkpoint.resume = " << s_.resume
              << ", so the same command would " << again
              << ": to continue it from its newest checkpoint, run the same command with "
              << "--checkpoint.resume=auto";
}

void Trainer::saveCheckpoint(int64_t stepsDone) {
  TrainState st;
  st.step = stepsDone;
  st.loaderSeq = loader_->position() / s_.gradAccum;  // saved at step ends: a whole number
  st.seed = s_.seed;
  if (scaler_) {
    st.lossScale = scaler_->scale();
    st.scalerClean = scaler_->cleanSteps();
    st.scalerSkipped = scaler_->skippedSteps();
  }
  st.strategy = parallelism_->strategyName();
  if (qat_) st.qat = qat_->stateJson();
  packFp8States(*model_, st);
  Stopwatch took;
  ckpt_->save(st, *parallelism_, model_->params());
  if (metrics_) metrics_->checkpointWritten(stepsDone, took.elapsed());
}

namespace {

// With micro-batches every pass takes the mean over all of the step's rows on this rank, so the
// accumulated gradient is the one batch's (a mean of means would weigh rows unequally where
// targets are ignored); -1 (each pass its own mean) with one.
int64_t stepRowsOf(const std::vector<Batch>& micro) {
  if (micro.size() <= 1) return -1;
  int64_t rows = 0;
  for (const Batch& b : micro)
    rows += b.validTargets >= 0          ? b.validTargets
            : b.targets.device().isCpu() ? countValidTargets(b.targets)
                                         : countValidTargets(b.targets.to(Device::cpu()));
  return rows;
}

}  // namespace

Context Trainer::stepContext(int64_t step) const {
  Context ctx;
  ctx.training = true;
  ctx.device = device_;
  ctx.seed = s_.seed;  // per-sample streams (ctx.sampleIds): no rank in the seed
  ctx.step = step;
  ctx.lossScale = scaler_ ? scaler_->scale() : 1.f;
  ctx.keepWeightCasts = parallelism_->keepsWeightCasts();
  // The loss is read back at log points only (run()): no host synchronisation inside the step.
  ctx.deferLoss = true;
  return ctx;
}

LossStats Trainer::trainStep(const std::vector<Batch>& micro, int64_t step) {
  const int K = static_cast<int>(micro.size());
  Parallelism& par = *parallelism_;
  Context ctx = stepContext(step);
  model_->params().zeroGrads();
  par.beginStep(step);
  const int64_t stepRows = stepRowsOf(micro);
  Stopwatch compute;
#ifdef MT_WITH_CUDA
  if (device_.isCuda()) {
    if (!gpuTimers_) gpuTimers_ = std::make_unique<GpuTimers>();
    gpuTimers_->start.record(currentStream());
  }
#endif
  LossStats stats;
  int64_t backwardStartUs = 0;
  for (int k = 0; k < K; ++k) {
    const Batch& b = micro[static_cast<size_t>(k)];
    ctx.sampleIds = b.sampleIds.empty() ? nullptr : &b.sampleIds;
    stats += model_->forward(b, ctx, stepRows);
    activationPeak_ = std::max(activationPeak_, model_->activationBytes());
    backwardStartUs = wallMicros();
    par.beforeBackward(k, K, step);
    model_->backward(ctx);
    Stopwatch commWait;
    par.finishBackward();
    intervalCommWait_ += commWait.elapsed();
  }
  intervalCompute_ += compute.elapsed();
#ifdef MT_WITH_CUDA
  if (gpuTimers_) {
    gpuTimers_->end.record(currentStream());
    gpuTimers_->recorded = true;
  }
#endif
  if (reporter_->tracing()) reporter_->traceStep(step, backwardStartUs, par, loader_->batchIndices(step));
  applyStep(step);
  if (qat_ && step < s_.qatObserveSteps) syncObservers();
  return stats;
}

void Trainer::applyStep(int64_t step) {
  Parallelism& par = *parallelism_;
  bool apply = true;
  if (scaler_) {
    // Every rank skips the same steps: the found-inf flag is or-ed over the world.
    apply = scaler_->unscaleAndCheck(par.optimizer().segments(), [this](bool found) {
      return world_->allReduceScalar(found ? 1.0 : 0.0, ReduceOp::kMax) > 0.0;
    });
    if (!apply && world_->rank() == 0)
      MT_LOG_WARN << "step " << step + 1 << ": inf/nan gradients, step skipped, loss scale now " << scaler_->scale();
  }
  if (apply) {
    if (s_.gradClip > 0.f) par.clipGradNorm(s_.gradClip);
    par.step(schedule_.at(step));
    if (scaler_) scaler_->update();
  }
  par.afterStep();
}

// Every rank observed its own batches: the ranges are reduced over the world (minmax: min and max,
// ema: the mean) so every rank quantizes alike and a checkpoint's state is every rank's.
void Trainer::syncObservers() {
  if (world_->size() == 1) return;
  Tensor lo = qat_->packedLows().to(device_), hi = qat_->packedHighs().to(device_);  // (NCCL: device memory)
  const bool minmax = qat_->options().observer == ObserverKind::kMinMax;
  world_->allReduceSync(lo, minmax ? ReduceOp::kMin : ReduceOp::kAvg);
  world_->allReduceSync(hi, minmax ? ReduceOp::kMax : ReduceOp::kAvg);
  qat_->setPacked(lo.to(Device::cpu()), hi.to(Device::cpu()));
}

void Trainer::reportMemory(int64_t step) {
  MemoryAccount m = parallelism_->measureMemory();
  m.activationPeakBytes = std::max(m.activationPeakBytes, activationPeak_);
  reporter_->memory(step, m, parallelism_->strategyName(), model_->params().numel());
}

void Trainer::reportInterval(int64_t step, const LossStats& local, double seconds, int64_t steps, double waitSeconds) {
  IntervalReport r;
  r.step = step;
  r.totalSteps = totalSteps_;
  r.stepsPerEpoch = stepsPerEpoch();
  r.globalBatch = s_.globalBatch;
  r.position = loader_->positionOf(step * s_.gradAccum);
  r.local = local;
  r.seconds = seconds;
  r.steps = steps;
  r.waitSeconds = waitSeconds;
  r.computePerStep = steps > 0 ? intervalCompute_ / static_cast<double>(steps) : 0.0;
  if (device_.isCuda()) r.computePerStep = lastGpuComputeSeconds();
  intervalCompute_ = 0.0;
  r.commWaitPerStep = steps > 0 ? intervalCommWait_ / static_cast<double>(steps) : 0.0;
  intervalCommWait_ = 0.0;
  r.lr = static_cast<double>(schedule_.at(step));
  if (scaler_) {
    r.lossScale = scaler_->scale();
    r.skippedSteps = scaler_->skippedSteps();
  }
  r.device = device_;
  reporter_->interval(r, *parallelism_);
}

EvalResult Trainer::evaluate() {
  if (!evaluator_)
    evaluator_ = std::make_unique<Evaluator>(*task_, s_.loader, *host_, device_, s_.feed, world_->rank(),
                                             world_->size(), localBatch_, microBatch_);
  return evaluator_->run(*model_, *parallelism_, *world_, [this] { return stopAgreed(); });
}

// On the GPU the divergence check reads a step's loss one step late, once the next step is queued
// behind it: the host waits for that step alone (an event) and copies on a stream of its own, so
// nothing queued after the step is waited for (reading it at once would drain the queue every
// step, the stall the deferred loss exists to avoid).
struct Trainer::LaggedLoss {
  int64_t step = -1;  // -1: none waiting
  LossStats stats;
#ifdef MT_WITH_CUDA
  CudaEvent done;
  CudaStream reader;
#endif
};

void Trainer::watchLoss(int64_t step, const LossStats& stats) {
  if (lagged_ && lagged_->step >= 0) submitLaggedLoss();
  if (!device_.isCuda() || stats.pending.empty()) {
    guard_->submit(step, !std::isfinite(stats.resolved().lossSum), !reporter_->recordsError().empty());
    return;
  }
#ifdef MT_WITH_CUDA
  if (!lagged_) lagged_ = std::make_unique<LaggedLoss>();
  lagged_->step = step;
  lagged_->stats = stats;
  lagged_->done.record(currentStream());
#endif
}

void Trainer::submitLaggedLoss() {
  LossStats loss;
#ifdef MT_WITH_CUDA
  lagged_->done.synchronize();
  StreamGuard onReader(lagged_->reader.get());
  loss = lagged_->stats.resolved();
#endif
  guard_->submit(lagged_->step, !std::isfinite(loss.lossSum), !reporter_->recordsError().empty());
  lagged_->step = -1;
  lagged_->stats = LossStats();
}

void Trainer::agreeOnLosses() {
  if (lagged_ && lagged_->step >= 0) submitLaggedLoss();
  guard_->flush();
}

bool Trainer::weightsFinite() {
  std::vector<Tensor> values;
  for (const OptimSegment& seg : parallelism_->optimizer().segments())
    values.push_back(seg.value);
  // Each rank checks the weights it owns (its shards when sharded); any rank's verdict counts.
  return world_->allReduceScalar(anyNonFinite(values) ? 1.0 : 0.0, ReduceOp::kMax) == 0.0;
}

Trainer::SaveOutcome Trainer::guardedSave(int64_t stepsDone) {
  agreeOnLosses();
  if (guard_->diverged()) return SaveOutcome::kDiverged;
  if (guard_->streak() > 0) {
    if (world_->rank() == 0)
      MT_LOG_WARN << "step " << stepsDone << ": the loss of the last " << guard_->streak()
                  << " step(s) was not finite: no checkpoint of these weights (the older ones stay)";
    return SaveOutcome::kSkipped;
  }
  if (!weightsFinite()) {
    weightsDiverged_ = true;
    return SaveOutcome::kDiverged;
  }
  saveCheckpoint(stepsDone);
  return SaveOutcome::kSaved;
}

std::string Trainer::divergenceReason() const {
  if (weightsDiverged_) return "the weights are not finite";
  return "the loss was not finite for " + std::to_string(guard_->streak()) + " consecutive steps (steps " +
         std::to_string(guard_->streakStart() + 1) + " to " + std::to_string(guard_->lastAgreedStep() + 1) +
         "; train.divergence_steps = " + std::to_string(guard_->limit()) + ")";
}

// The checkpoint at the end (checkpoint.at_exit). The end state is checked whether or not it is
// saved: a run never ends "done" on weights that are not finite. False: it diverged.
bool Trainer::finalSave() {
  if (s_.checkpointAtExit && startStep_ < totalSteps_)
    return guardedSave(totalSteps_) != SaveOutcome::kDiverged;
  agreeOnLosses();
  weightsDiverged_ = !guard_->diverged() && !weightsFinite();
  return !guard_->diverged() && !weightsDiverged_;
}

// After a failed write of the run's records: a checkpoint first (checkpoint.dir may well be on a
// healthy disk), then the run ends with the error.
int Trainer::endOnRecordsFailure(int64_t stepsDone) {
  const SaveOutcome saved = guardedSave(stepsDone);
  if (saved == SaveOutcome::kDiverged) {
    reporter_->diverged(stepsDone, divergenceReason(), ckpt_->dir());
    return static_cast<int>(ExitCode::kDiverged);
  }
  if (world_->rank() == 0)
    MT_LOG_ERROR << "error: " << reporter_->recordsError() << "; "
                 << (saved == SaveOutcome::kSaved
                         ? "saved a checkpoint of step " + std::to_string(stepsDone) + " to " + ckpt_->dir() +
                               ": resume from it once " + runDir_ + " can be written again"
                         : std::string("no checkpoint saved: the loss of the last steps was not finite"))
                 << " (exit " << static_cast<int>(ExitCode::kFailure) << ")";
  return static_cast<int>(ExitCode::kFailure);
}

// Every rank ends with the same code: the worst of the ranks', where a record rank 0 could not
// write (metrics.jsonl, PREEMPTED) makes a success 1.
int Trainer::agreedExitCode(int code) {
  const std::string failed = reporter_->recordsError();
  if (!failed.empty() && code == 0) {
    MT_LOG_ERROR << "error: " << failed;
    code = static_cast<int>(ExitCode::kFailure);
  }
  return static_cast<int>(world_->allReduceScalar(code, ReduceOp::kMax));
}

// What ends the run after step `step` (from 0), the same on every rank: divergence or a failed
// record write (agreed by the guard), non-finite weights at a save point, a stop signal (after its
// checkpoint). kRunning: nothing.
Trainer::RunEnd Trainer::endAfter(int64_t step) {
  if (guard_->diverged()) return RunEnd::kDiverged;
  if (guard_->recordsFailed()) return RunEnd::kRecordsFailed;
  if (s_.checkpointInterval > 0 && (step + 1) % s_.checkpointInterval == 0 && step + 1 < totalSteps_ &&
      guardedSave(step + 1) == SaveOutcome::kDiverged)
    return RunEnd::kDiverged;
  if (!stopAgreed()) return RunEnd::kRunning;
  return stopAfter(step);
}

// Whether some rank got a stop signal: the same answer on every rank (one call late).
bool Trainer::stopAgreed() { return stop_ ? stop_->poll() : stopSignalled(); }

// The stop, agreed on, after step `step` (from 0): its checkpoint, then kPreempted.
Trainer::RunEnd Trainer::stopAfter(int64_t step) {
  if (world_->rank() == 0)
    MT_LOG_WARN << "stop signal received: " << (s_.checkpointAtExit ? "saving a checkpoint and " : "")
                << "leaving after step " << step + 1;
  if (s_.checkpointAtExit && guardedSave(step + 1) == SaveOutcome::kDiverged) return RunEnd::kDiverged;
  return RunEnd::kPreempted;
}

// The run's end after `stepsDone` steps: the records, the final checkpoint and evaluation of a
// finished run, and the exit code every rank agrees on.
int Trainer::endRun(RunEnd end, int64_t stepsDone, EvalResult last, bool evaluatedAtEnd, double wallSeconds) {
  if (end == RunEnd::kFinished && !finalSave()) end = RunEnd::kDiverged;
  switch (end) {
    case RunEnd::kDiverged:
      reporter_->diverged(stepsDone, divergenceReason(), ckpt_->dir());
      return agreedExitCode(static_cast<int>(ExitCode::kDiverged));
    case RunEnd::kRecordsFailed:
      return agreedExitCode(endOnRecordsFailure(stepsDone));
    case RunEnd::kPreempted:
      preempted_ = true;
      reporter_->preempted(stepsDone, totalSteps_, runDir_);
      adviseResume();
      return agreedExitCode(0);
    case RunEnd::kRunning:
    case RunEnd::kFinished:
      break;
  }
  if (!evaluatedAtEnd) last = evaluate();
  reporter_->finished(totalSteps_, totalSteps_ - startStep_, wallSeconds, last);
  return agreedExitCode(0);
}

// run.profile_from / run.profile_steps: the CUDA profiler's capture range around those steps.
void Trainer::profilerRange(int64_t step, bool before) {
  if (s_.profileFrom <= 0) return;
  const int64_t first = s_.profileFrom - 1, last = first + s_.profileSteps - 1;
  if (step != (before ? first : last)) return;
#ifdef MT_WITH_CUDA
  if (cuda_) {
    cuda_->profilerRange(before);
    if (world_->rank() == 0)
      MT_LOG_INFO << "CUDA profiler range " << (before ? "started before" : "stopped after") << " step " << step + 1;
    return;
  }
#endif
  if (before && world_->rank() == 0) MT_LOG_WARN << "run.profile_from: no CUDA device in this run, nothing to profile";
}

int Trainer::run() {
  // Rank 0 rewrites metrics.jsonl first (seconds for 100k records) while the others wait in the
  // guard's communicator duplication, which dist.timeout_s does not bound, not in the first step.
  if (resumed_) reporter_->resumed(startStep_);
  guard_ = std::make_unique<RunGuard>(mpi_.size() > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL, s_.divergenceSteps);
  Stopwatch total, interval;
  int64_t intervalSteps = 0;
  double intervalWait = 0.0;
  EvalResult last;
  bool evaluatedAtEnd = false;
  int64_t step = startStep_;
  RunEnd end = RunEnd::kRunning;
  for (; step < totalSteps_ && end == RunEnd::kRunning; ++step) {
    std::vector<Batch> micro;
    for (int64_t k = 0; k < s_.gradAccum; ++k) {
      micro.push_back(feed_ ? feed_->next() : loader_->next());
      intervalWait += feed_ ? feed_->lastWaitSeconds() : loader_->lastWaitSeconds();
    }
    const bool first = step == startStep_;
    if (first && world_->rank() == 0)
      MT_LOG_INFO << "step " << step + 1 << " of " << totalSteps_ << " (the first also makes the allocations and kernel plans)";
    Stopwatch firstStep;
    profilerRange(step, true);
    LossStats stats = trainStep(micro, step);
    profilerRange(step, false);
    const bool logNow = (step + 1) % s_.logInterval == 0 || step + 1 == totalSteps_;
    if (first || logNow) stats = stats.resolved();  // (an out-of-range target is raised here)
    watchLoss(step, stats);
    if (metrics_) metrics_->stepDone(step + 1);
    if (first) {
      if (world_->rank() == 0) MT_LOG_INFO << "first step done in " << firstStep.elapsed() << " s";
      reportMemory(step + 1);
    }
    ++intervalSteps;
    if (logNow) {
      reportInterval(step, stats, interval.elapsed(), intervalSteps, intervalWait);
      interval.reset();
      intervalSteps = 0;
      intervalWait = 0.0;
    }
    const bool epochEnd = (step + 1) % stepsPerEpoch() == 0;
    const bool evalNow = s_.evalInterval > 0 ? (step + 1) % s_.evalInterval == 0 : epochEnd;
    end = endAfter(step);
    if (evalNow && end == RunEnd::kRunning) {
      last = evaluate();
      if (last.stopped) {  // a stop signal during the evaluation: the stop, as after the step
        end = stopAfter(step);
        last = EvalResult();
      } else {
        evaluatedAtEnd = step + 1 == totalSteps_;
        reporter_->evaluation(step + 1, last);
      }
    }
  }
  return endRun(end == RunEnd::kRunning ? RunEnd::kFinished : end, step, last, evaluatedAtEnd,
                total.elapsed());
}

}  // namespace mt
