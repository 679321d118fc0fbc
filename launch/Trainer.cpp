#include "launch/Trainer.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "comm/Compression.h"
#include "launch/Architecture.h"
#include "comm/MpiCommunicator.h"
#include "core/Allocator.h"
#include "core/EnvParams.h"
#include "core/Log.h"
#include "core/Threads.h"
#include "core/Timer.h"
#include "launch/Failure.h"
#include "models/ModelConfig.h"
#include "models/layers/SoftmaxCrossEntropy.h"
#include "models/optim/GradClip.h"

#ifdef MT_WITH_CUDA
#include "comm/NcclCommunicator.h"
#include "core/cuda/CudaMemory.h"
#include "core/cuda/CudaRuntime.h"
#endif

namespace mt {

namespace fs = std::filesystem;

namespace {

// "NAME=value (origin)" -> "export NAME='value'  # origin" (single-quoted, so any value survives).
std::string shellExportLine(const std::string& entry) {
  const size_t eq = entry.find('=');
  if (eq == std::string::npos) return "# " + entry;
  std::string value = entry.substr(eq + 1), origin;
  const size_t paren = value.rfind(" (");
  if (!value.empty() && value.back() == ')' && paren != std::string::npos) {
    origin = value.substr(paren + 2, value.size() - paren - 3);
    value.resize(paren);
  }
  std::string quoted = "'";
  for (char c : value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  return "export " + entry.substr(0, eq) + "=" + quoted + (origin.empty() ? "" : "  # " + origin);
}

// (loss sum, correct, count) summed over the ranks: the figures one process would compute over the
// global batch or the whole test set. Counts travel as doubles, exact below 2^53.
LossStats sumOverRanks(Communicator& comm, const LossStats& local) {
  Tensor t = Tensor::empty({3}, DType::kF64);
  t.data<double>()[0] = local.lossSum;
  t.data<double>()[1] = static_cast<double>(local.correct);
  t.data<double>()[2] = static_cast<double>(local.count);
  comm.allReduceSync(t, ReduceOp::kSum);
  LossStats g;
  g.lossSum = t.data<double>()[0];
  g.correct = static_cast<int64_t>(t.data<double>()[1]);
  g.count = static_cast<int64_t>(t.data<double>()[2]);
  return g;
}

EvalResult evalResult(const LossStats& g) {
  EvalResult e;
  e.count = g.count;
  e.loss = g.count ? g.lossSum / static_cast<double>(g.count) : 0.0;
  e.accuracy = g.count ? static_cast<double>(g.correct) / static_cast<double>(g.count) : 0.0;
  return e;
}

}  // namespace

// GPU work is asynchronous: the compute time of a step is measured with events on the compute
// stream, for the last step of each log interval (read when logStep synchronises anyway).
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

Trainer::Trainer(const Config& cfg, MpiEnvironment& mpi)
    : cfg_(cfg), s_(Settings::fromConfig(cfg)), mpi_(mpi), launch_(discoverLaunch(mpi)) {
  if (mpi_.rank() == 0) MT_LOG_INFO << launch_.describe() << " on " << mpi_.numNodes() << " node(s)";
  for (const auto& name : unknownEnvParams()) {
    if (mpi_.rank() == 0) MT_LOG_WARN << "unknown environment variable " << name << " (see trainer --help-env)";
  }
  setNumThreads(defaultNumThreads(mpi_.localSize()));
  runDir_ = s_.runDir;
  setupTopology();
  setupDevice();
  setupComm();
  setupData();
  setupModel();
  setupOptimizer();
  resumeIfAny();

  std::error_code ec;
  fs::create_directories(runDir_, ec);
  if (ec) throw IoError("cannot create run directory " + runDir_ + ": " + ec.message());
  {
    // Which process is which rank, for operators (and the fault tests) that signal one rank.
    std::ofstream pid(runDir_ + "/rank" + std::to_string(world_->rank()) + ".pid");
    pid << ::getpid() << "\n";
  }
  // The preemption marker of a previous attempt is stale now (scripts/slurm requeue on it).
  if (world_->rank() == 0) fs::remove(runDir_ + "/PREEMPTED", ec);
  if (world_->rank() == 0 && (!ncclEnv_.empty() || profile_)) {
    // A file `source` accepts (to rerun a case by hand with the same NCCL settings): each entry
    // "NAME=value (origin)" becomes "export NAME='value'  # origin".
    std::ofstream env(runDir_ + "/nccl.env");
    env << "# NCCL environment in effect (profile " << (profile_ ? profile_->name : "none") << ")\n";
    for (const auto& l : ncclEnv_) env << shellExportLine(l) << "\n";
  }
  if (world_->rank() == 0) {
    std::ofstream ini(runDir_ + "/config.ini");
    ini << cfg_.toIni();
    if (!ini) throw IoError("cannot write " + runDir_ + "/config.ini");
    metrics_.open(runDir_ + "/metrics.jsonl", /*append=*/resumed_);
  }
  if (s_.trace) {
    trace_ = std::make_unique<std::ofstream>(runDir_ + "/trace.rank" + std::to_string(world_->rank()) + ".jsonl",
                                             resumed_ ? std::ios::app : std::ios::trunc);
  }
  if (mpi_.size() > 1) stop_ = std::make_unique<StopAgreement>(MPI_COMM_WORLD);
}

Trainer::~Trainer() {
  // Tear down in reverse dependency order: loader threads, GPU tensors, communicators, the device.
  loader_.reset();
  if (health_) health_->shutdown();
  optimizer_.reset();
  engine_.reset();
  dp_.reset();
  model_.reset();
  groups_.reset();
  world_.reset();
}

void Trainer::setupTopology() {
  if (!s_.topoFile.empty()) topology_ = std::make_unique<Topology>(Topology::load(s_.topoFile));
  if (!s_.profile.empty()) {
    std::string dir = envString(EnvParam::kProfileDir);
    if (dir.empty()) dir = MT_DEFAULT_PROFILE_DIR;
    profile_ = std::make_unique<Profile>(Profile::load(s_.profile, dir));
    auto it = profile_->hints.find("fabric");
    Fabric f;
    if (topology_ && it != profile_->hints.end() && parseFabric(it->second, &f)) topology_->setFabric(f);
  }
  // NCCL reads its environment at the first call: everything is exported here, before any.
  if (profile_) ncclEnv_ = profile_->apply();
  if (!s_.topoFile.empty()) {
    if (std::getenv("NCCL_TOPO_FILE")) {
      ncclEnv_.push_back(std::string("NCCL_TOPO_FILE=") + std::getenv("NCCL_TOPO_FILE") + " (environment)");
    } else {
      setenv("NCCL_TOPO_FILE", s_.topoFile.c_str(), 0);
      ncclEnv_.push_back("NCCL_TOPO_FILE=" + s_.topoFile + " (topo.file)");
    }
  }
  if (mpi_.rank() == 0) {
    for (const auto& l : ncclEnv_) MT_LOG_INFO << "nccl env: " << l;
    if (topology_) MT_LOG_INFO << topology_->summary();
  }
}

void Trainer::setupDevice() {
  if (s_.device != "cuda") return;
#ifdef MT_WITH_CUDA
  const int n = cudaDeviceCountOrZero();
  if (n == 0) cfg_.fail("train.device", "no CUDA device is visible to rank " + std::to_string(mpi_.rank()));
  cuda_ = std::make_unique<CudaRuntime>(mpi_.localRank() % n);
  device_ = cuda_->dev();
  if (topology_ && s_.bindCpus) bindToGpuCpus();
  cuda_->setMatmulPrecision(s_.precision == "bf16"   ? MatmulPrecision::kBF16
                            : s_.precision == "f16" ? MatmulPrecision::kF16
                                                    : MatmulPrecision::kF32);
  if (s_.memoryCapMb > 0) cuda_->allocator().setMemoryCap(static_cast<size_t>(s_.memoryCapMb) << 20);
  if (s_.precision == "f16") scaler_ = std::make_unique<LossScaler>();
  MT_LOG_DEBUG << "rank " << mpi_.rank() << " on GPU " << cuda_->device() << " (" << cuda_->deviceName() << ")";
#else
  cfg_.fail("train.device", "this trainer was built without CUDA");
#endif
}

void Trainer::bindToGpuCpus() {
#ifdef MT_WITH_CUDA
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_->device()) != cudaSuccess) return;
  std::string id = bus;
  for (auto& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const TopoGpu* match = nullptr;
  for (const auto& g : topology_->gpus())
    if (g.busid == id) match = &g;
  if (!match && cuda_->device() < static_cast<int>(topology_->gpus().size()))
    match = &topology_->gpus()[static_cast<size_t>(cuda_->device())];
  if (!match || match->cpu < 0) return;
  const auto& cores = topology_->cpus()[static_cast<size_t>(match->cpu)].cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  int usable = 0;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  for (int c : cores)
    if (c < hw && c < CPU_SETSIZE) CPU_SET(c, &set), ++usable;
  if (usable == 0) return;  // the file describes another machine
  if (sched_setaffinity(0, sizeof(set), &set) == 0) {
    MT_LOG_DEBUG << "bound to " << usable << " cores of NUMA node " << topology_->cpus()[static_cast<size_t>(match->cpu)].numa
                 << " (GPU " << id << ")";
  }
#endif
}

Batch Trainer::toDevice(const Batch& b) const {
  if (device_.isCpu() || b.inputs.device() == device_) return b;
  Batch d;
  d.inputs = b.inputs.to(device_);
  d.targets = b.targets.to(device_);
  d.sampleIds = b.sampleIds;
  // Counted on the host copy: the model need not read the targets back (a host sync) for it.
  d.validTargets = b.validTargets >= 0 ? b.validTargets : countValidTargets(b.targets);
  return d;
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
  if (s_.hierarchical) {
    const int L = s_.nodeRanks > 0 ? s_.nodeRanks : mpi_.localSize();
    if (world_->size() % L != 0)
      cfg_.fail("topo.node_ranks", std::to_string(L) + " ranks per node do not divide the " +
                                       std::to_string(world_->size()) + " ranks");
    groups_ = std::make_unique<NodeGroups>(*world_, L);
  }
  if (world_->size() > 1 && s_.healthMonitor) {
    health_ = std::make_unique<HealthMonitor>(
        MPI_COMM_WORLD, [this](int lost, const std::string& why) { onPeerLost(*world_, lost, why); },
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
  file_ = std::make_unique<H5File>(H5File::open(s_.dataPath, s_.locking));
  if (tokens()) {
    trainTokens_ = std::make_unique<TokenDataset>(*file_, s_.trainSplit, s_.gpt.maxT, world_->size());
    testTokens_ = std::make_unique<TokenDataset>(*file_, s_.testSplit, s_.gpt.maxT, world_->size());
    if (world_->rank() == 0)
      MT_LOG_INFO << "data " << s_.dataPath << ": " << trainTokens_->numTokens() << " train tokens ("
                  << trainTokens_->size() << " windows of " << s_.gpt.maxT << "), " << testTokens_->numTokens()
                  << " test tokens, vocabulary " << trainTokens_->vocabSize()
                  << (s_.dataMode == "memory" ? "; loading both splits into memory" : "; read from the file");
    if (s_.dataMode == "memory") {
      Stopwatch load;
      trainTokens_->loadIntoMemory();
      testTokens_->loadIntoMemory();
      if (world_->rank() == 0) MT_LOG_INFO << "data in memory after " << load.elapsed() << " s";
    }
    trainSource_ = std::make_unique<TokenSource>(*trainTokens_);
  } else {
    train_ = std::make_unique<ImageDataset>(*file_, s_.trainSplit, world_->size());
    test_ = std::make_unique<ImageDataset>(*file_, s_.testSplit, world_->size());
    // The two splits feed one model: their images must have one shape and the test labels fit
    // the classes the model is built for (else the first evaluation fails, at the end of an epoch).
    const InputSpec& a = train_->spec();
    const InputSpec& b = test_->spec();
    if (a.height != b.height || a.width != b.width || a.channels != b.channels)
      throw DataError("data file " + s_.dataPath + ": split " + s_.testSplit + " has " + std::to_string(b.height) +
                      "x" + std::to_string(b.width) + "x" + std::to_string(b.channels) + " images, split " +
                      s_.trainSplit + " " + std::to_string(a.height) + "x" + std::to_string(a.width) + "x" +
                      std::to_string(a.channels));
    if (b.numClasses > a.numClasses)
      throw DataError("data file " + s_.dataPath + ": split " + s_.testSplit + " has labels up to " +
                      std::to_string(b.numClasses - 1) + ", split " + s_.trainSplit + " only " +
                      std::to_string(a.numClasses) + " classes");
    if (world_->rank() == 0) {
      const int64_t bytes = (train_->size() + test_->size()) * static_cast<int64_t>(train_->imageBytes());
      MT_LOG_INFO << "data " << s_.dataPath << ": " << train_->size() << " train and " << test_->size() << " test "
                  << a.height << "x" << a.width << "x" << a.channels << " images, " << a.numClasses << " classes"
                  << (s_.dataMode == "memory" ? "; loading " + formatBytes(bytes) + " into memory"
                                              : std::string("; read from the file"));
    }
    if (s_.dataMode == "memory") {
      Stopwatch load;
      train_->loadIntoMemory();
      test_->loadIntoMemory();
      if (world_->rank() == 0) MT_LOG_INFO << "data in memory after " << load.elapsed() << " s";
    }
    trainSource_ = std::make_unique<ImageSource>(*train_);
  }
  LoaderOptions lo = s_.loader;
  lo.batchSize = microBatch_;  // the loader hands out micro-batches
  Allocator* host = &cpuAllocator();
#ifdef MT_WITH_CUDA
  if (device_.isCuda()) {
    if (s_.feed == FeedMode::kPinned) host = &cuda_->pinned();
    if (s_.feed == FeedMode::kUvm) host = &cuda_->managed();
    if (s_.feed == FeedMode::kDevice) lo.numWorkers = 0;  // the GPU gathers; no host collation
    const int dev = cuda_->device();
    lo.workerInit = [dev] { cudaSetDevice(dev); };
  }
#endif
  loader_ = std::make_unique<Loader>(*trainSource_, lo, world_->rank(), world_->size(), *host);
  if (device_.isCuda()) {
    feed_ = std::make_unique<DeviceFeed>(s_.feed, *loader_, device_, train_.get(), trainTokens_.get());
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
  const ModelConfig& mc = s_.model;
  if (world_->rank() == 0)
    MT_LOG_INFO << "building the " << (tokens() ? std::string("gpt") : mc.type) << " model on " << device_.str()
                << (tokens() ? " (" + std::to_string(s_.gpt.layers) + " blocks x " + std::to_string(s_.gpt.channels) +
                                   " channels)"
                             : std::string());
  if (tokens()) {
    const GptConfig g = s_.gptForData(trainTokens_->vocabSize(), cfg_);
    s_.gpt = g;
    model_ = std::make_unique<Gpt>(g);
  }
  InputSpec in = tokens() ? InputSpec{} : train_->spec();
  if (mc.type == "cnn") {
    int64_t h = in.height, w = in.width;
    for (size_t i = 0; i < mc.convChannels.size(); ++i) h /= 2, w /= 2;
    if (h <= 0 || w <= 0)
      cfg_.fail("model.conv_channels", std::to_string(mc.convChannels.size()) + " pooling stages shrink a " +
                                           std::to_string(in.height) + "x" + std::to_string(in.width) +
                                           " image to nothing");
  }
  if (!tokens()) model_ = buildImageModel(mc, in);
  // A model too large for the machine is a configuration error (exit 2, saying what it needs),
  // not an allocation failure deep inside setup.
  const int64_t numParams = model_->params().numel();
  const std::string sizeKey = tokens() ? "model.gpt_preset" : "model.hidden";
  const std::string needs = std::to_string(numParams) + " parameters need " + formatBytes(numParams * 4) +
                            " (" + formatBytes(numParams * 16) + " with gradients and AdamW state)";
  if (device_.isCpu()) {
    const int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
    if (phys > 0 && numParams * 4 > phys)
      cfg_.fail(sizeKey, "the model's " + needs + ", more than this machine's " + formatBytes(phys) + " of memory");
  }
  try {
    model_->params().materialize(device_);
  } catch (const OutOfMemoryError& e) {
    cfg_.fail(sizeKey, "the model's " + needs + ": " + e.what());
  }
  model_->initParams(s_.seed);
  if (s_.sharding.strategy != ShardStrategy::kNoShard) {
    Communicator* shardComm = world_.get();
    Communicator* replicaComm = nullptr;
    if (s_.sharding.strategy == ShardStrategy::kHybridShard) {
      if (!groups_) {
        const int L = s_.nodeRanks > 0 ? s_.nodeRanks : mpi_.localSize();
        if (world_->size() % L != 0)
          cfg_.fail("topo.node_ranks", std::to_string(L) + " ranks per node do not divide the " +
                                           std::to_string(world_->size()) + " ranks");
        groups_ = std::make_unique<NodeGroups>(*world_, L);
      }
      shardComm = &groups_->intra();
      replicaComm = &groups_->inter();
    }
    engine_ = std::make_unique<ShardedEngine>(*model_, *shardComm, replicaComm, s_.sharding, s_.optim);
    model_->setHooks(engine_.get());
  } else if (world_->size() > 1 || std::string(world_->backend()) != "local") {
    // An explicitly chosen backend is used even by a single rank (so a 1-rank NCCL run exercises it).
    dp_ = std::make_unique<DataParallel>(model_->params(), *world_, s_.dp);
    if (groups_) dp_->setReducer(std::make_unique<HierarchicalReducer>(*groups_));
    else dp_->setReducer(makeBucketReducer(s_.compression, *world_, model_->params()));
    dp_->broadcastParameters(0);
    model_->setHooks(dp_.get());
  }
  if (world_->rank() == 0) {
    MT_LOG_INFO << "model " << model_->name() << ": " << model_->params().numel() << " parameters in "
                << model_->params().size() << " tensors; " << world_->size() << " rank(s) x batch " << localBatch_
                << " = global batch " << s_.globalBatch << "; " << numThreads() << " thread(s) per rank";
  }
}

void Trainer::setupOptimizer() {
  if (!engine_) optimizer_ = makeOptimizer(s_.optim, segmentsOf(model_->params()));
  schedule_ = s_.schedule;
  schedule_.totalSteps = totalSteps_;
}

void Trainer::resumeIfAny() {
  ckpt_ = std::make_unique<CheckpointManager>(s_.checkpointDir, static_cast<int>(s_.checkpointKeep), *world_);
  {
    const InputSpec images = tokens() ? InputSpec{} : train_->spec();
    const GptConfig gpt = s_.gpt;
    ckpt_->setArchitecture(describeArchitecture(*model_, tokens() ? nullptr : &images, tokens() ? &gpt : nullptr));
  }
  ckpt_->prepare();
  if (s_.resume == "never") return;
  const std::string path = s_.resume == "auto" ? ckpt_->findLatestValid() : s_.resume;
  if (path.empty()) return;
  TrainState st = ckpt_->load(path, optimizer(), model_->params().numel());
  if (engine_) engine_->refreshGatherCopies();
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
  if (scaler_ && st.lossScale > 0) scaler_->setState(st.lossScale, st.scalerClean);
  resumed_ = true;
  if (world_->rank() == 0)
    MT_LOG_INFO << "resumed from " << path << " at step " << startStep_ << " (written by " << st.strategy << " training)";
}

void Trainer::saveCheckpoint(int64_t stepsDone) {
  TrainState st;
  st.step = stepsDone;
  st.loaderSeq = loader_->position() / s_.gradAccum;  // saved at step ends: a whole number
  st.seed = s_.seed;
  if (scaler_) {
    st.lossScale = scaler_->scale();
    st.scalerClean = scaler_->cleanSteps();
  }
  st.strategy = engine_ ? engine_->strategyName() : "no_shard";
  ckpt_->save(st, optimizer(), model_->params(), /*replicated=*/!engine_,
              /*writes=*/!engine_ || engine_->isReplicaWriter());
}

LossStats Trainer::trainStep(const std::vector<Batch>& micro, int64_t step) {
  const int K = static_cast<int>(micro.size());
  Context ctx;
  ctx.training = true;
  ctx.device = device_;
  ctx.seed = s_.seed;  // per-sample streams (ctx.sampleIds): no rank in the seed
  ctx.step = step;
  ctx.lossScale = scaler_ ? scaler_->scale() : 1.f;
  ctx.keepWeightCasts = !engine_;  // sharding frees gathered weights between forward and backward
  // The loss is read back at log points only (run()): no host synchronisation inside the step.
  ctx.deferLoss = true;
  model_->params().zeroGrads();
  if (engine_) engine_->beginStep();
  // With micro-batches every pass takes the mean over all of the step's rows on this rank, so the
  // accumulated gradient is the one batch's (a mean of means would weigh rows unequally where
  // targets are ignored).
  std::vector<Batch> onDevice;
  for (const Batch& b : micro) onDevice.push_back(toDevice(b));  // counts valid targets on the host
  int64_t stepRows = -1;
  if (K > 1) {
    stepRows = 0;
    for (const Batch& b : onDevice)
      stepRows += b.validTargets >= 0        ? b.validTargets
                  : b.targets.device().isCpu() ? countValidTargets(b.targets)
                                               : countValidTargets(b.targets.to(Device::cpu()));
  }
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
    const bool last = k + 1 == K;
    const Batch& b = onDevice[static_cast<size_t>(k)];
    ctx.sampleIds = b.sampleIds.empty() ? nullptr : &b.sampleIds;
    stats += model_->forward(b, ctx, stepRows);
    activationPeak_ = std::max(activationPeak_, model_->activationBytes());
    backwardStartUs = wallMicros();
    if (dp_) {
      if (last) dp_->reducer().beginStep(step);
      dp_->beginBackward(/*sync=*/last);  // earlier micro-steps only accumulate: no bucket launches
    }
    if (engine_) engine_->setMicroStep(k, K);
    model_->backward(ctx);
    if (dp_) dp_->finishBackward();
    if (engine_) engine_->finishBackward();
  }
  intervalCompute_ += compute.elapsed();
#ifdef MT_WITH_CUDA
  if (gpuTimers_) {
    gpuTimers_->end.record(currentStream());
    gpuTimers_->recorded = true;
  }
#endif
  if (trace_) writeTrace(step, backwardStartUs);
  bool apply = true;
  if (scaler_) {
    // Every rank skips the same steps: the found-inf flag is or-ed over the world.
    apply = scaler_->unscaleAndCheck(optimizer().segments(), [this](bool found) {
      return world_->allReduceScalar(found ? 1.0 : 0.0, ReduceOp::kMax) > 0.0;
    });
    if (!apply && world_->rank() == 0)
      MT_LOG_WARN << "step " << step + 1 << ": inf/nan gradients, step skipped, loss scale now " << scaler_->scale();
  }
  if (apply) {
    if (s_.gradClip > 0.f) {
      if (engine_) engine_->clipGradNorm(s_.gradClip);
      else clipGradNormInPlace(optimizer_->segments(), s_.gradClip);
    }
    if (engine_) engine_->step(schedule_.at(step));
    else optimizer_->step(schedule_.at(step));
    if (scaler_) scaler_->update();
  }
  if (dp_ && dp_->afterStep()) optimizer_->rebind(segmentsOf(model_->params()));
  return stats;
}

void Trainer::logMemory(int64_t step) {
  MemoryAccount m;
  if (engine_) {
    m = engine_->measureMemory();
  } else {
    m.paramBytes = static_cast<int64_t>(model_->params().flatValues().nbytes());
    m.gradBytes = static_cast<int64_t>(model_->params().flatGrads().nbytes());
    m.optimizerBytes = optimizer_->stateBytes();
    m.devicePeakBytes = allocatorFor(device_).stats().peakAllocatedBytes;
  }
  m.activationPeakBytes = std::max(m.activationPeakBytes, activationPeak_);
  const int W = world_->size();
  Tensor mine = Tensor::empty({6}, DType::kI64), all = Tensor::empty({6 * W}, DType::kI64);
  const int64_t v[6] = {m.paramBytes, m.gradBytes, m.optimizerBytes, m.gatheredPeakBytes, m.activationPeakBytes,
                        m.devicePeakBytes};
  std::copy(v, v + 6, mine.data<int64_t>());
  world_->allGather(mine, all)->wait(world_->timeout());
  if (world_->rank() != 0) return;
  nlohmann::json j = {{"type", "memory"}, {"step", step}, {"strategy", engine_ ? engine_->strategyName() : "no_shard"},
                      {"parameters", model_->params().numel()}};
  const char* names[6] = {"param_bytes", "grad_bytes", "optimizer_bytes", "gathered_peak_bytes",
                          "activation_peak_bytes", "allocator_peak_bytes"};
  for (int k = 0; k < 6; ++k) {
    nlohmann::json col = nlohmann::json::array();
    for (int r = 0; r < W; ++r) col.push_back(all.data<int64_t>()[6 * r + k]);
    j[names[k]] = col;
  }
  metrics_.write(j);
  MT_LOG_INFO << "memory per rank (rank 0, " << j["strategy"].get<std::string>() << "): params "
              << formatBytes(m.paramBytes) << ", grads " << formatBytes(m.gradBytes) << ", optimizer "
              << formatBytes(m.optimizerBytes) << " (persistent " << formatBytes(m.persistent()) << " = "
              << static_cast<double>(m.persistent()) / static_cast<double>(model_->params().numel())
              << " bytes/parameter), gathered peak " << formatBytes(m.gatheredPeakBytes) << ", activations peak "
              << formatBytes(m.activationPeakBytes) << ", allocator peak " << formatBytes(m.devicePeakBytes);
}

void Trainer::writeTrace(int64_t step, int64_t backwardStartUs) {
  nlohmann::json j;
  j["step"] = step;
  j["rank"] = world_->rank();
  j["backward_start_us"] = backwardStartUs;
  j["backward_end_us"] = dp_ ? dp_->backwardEndUs() : wallMicros();
  // Which samples this step trained on (resume tests compare it with an uninterrupted run).
  uint64_t h = 1469598103934665603ull;
  for (int64_t i : loader_->batchIndices(step)) h = (h ^ static_cast<uint64_t>(i)) * 1099511628211ull;
  j["batch_hash"] = std::to_string(h);
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
  if (tokens()) {
    // A fixed prefix of the test split: the same batches every evaluation.
    TokenSource src(*testTokens_);
    ChunkCache cache;
    LossStats total;
    Context ctx;
    ctx.training = false;
    ctx.device = device_;
    const int64_t perRank = std::max<int64_t>(1, testTokens_->size() / W);
    // train.eval_batches of this rank's step rows, in micro-batches (the activation memory of one).
    const int64_t batches = std::min<int64_t>(s_.evalBatches, std::max<int64_t>(1, perRank / localBatch_)) * s_.gradAccum;
    for (int64_t k = 0; k < batches; ++k) {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < microBatch_; ++i) idx.push_back((r + W * (k * microBatch_ + i)) % testTokens_->size());
      LossStats s = model_->forward(toDevice(src.collate(idx, &cache, cpuAllocator())), ctx);
      if (engine_) engine_->releaseAll();
      total.lossSum += s.lossSum;
      total.correct += s.correct;
      total.count += s.count;
    }
    return evalResult(sumOverRanks(*world_, total));
  }
  const int64_t localEval = std::max<int64_t>(1, s_.evalBatch / W);
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
    LossStats s = model_->forward(toDevice(b), ctx);
    if (engine_) engine_->releaseAll();
    total.lossSum += s.lossSum;
    total.correct += s.correct;
    total.count += s.count;
  }
  return evalResult(sumOverRanks(*world_, total));
}

void Trainer::logStep(int64_t step, const LossStats& local, double intervalSeconds, int64_t intervalSteps,
                      double waitSeconds) {
  // The step's loss over the global batch (every rank's rows), as a single process would report.
  const LossStats global = sumOverRanks(*world_, local);
  // Straggler report: every rank's compute time per step (forward + backward, no gradient wait).
  const int W = world_->size();
  double computePerStep = intervalSteps > 0 ? intervalCompute_ / static_cast<double>(intervalSteps) : 0.0;
  if (device_.isCuda()) computePerStep = lastGpuComputeSeconds();
  intervalCompute_ = 0.0;
  Tensor mine = Tensor::empty({1}, DType::kF64), all = Tensor::empty({W}, DType::kF64);
  mine.data<double>()[0] = computePerStep;
  world_->allGather(mine, all)->wait(world_->timeout());
  const CompressionStats cs = dp_ ? dp_->reducer().takeStats() : CompressionStats{};
  if (world_->rank() != 0) return;
  const double* ct = all.data<double>();
  const int slowest = static_cast<int>(std::max_element(ct, ct + W) - ct);
  const double fastest = *std::min_element(ct, ct + W);
  const double spread = fastest > 0 ? ct[slowest] / fastest - 1.0 : 0.0;
  const double count = static_cast<double>(global.count);
  const double loss = count > 0 ? global.lossSum / count : 0.0;
  const double acc = count > 0 ? static_cast<double>(global.correct) / count : 0.0;
  const double sps = intervalSeconds > 0 ? static_cast<double>(intervalSteps * s_.globalBatch) / intervalSeconds : 0.0;
  const double stepTime = intervalSteps > 0 ? intervalSeconds / static_cast<double>(intervalSteps) : 0.0;
  const double eta = stepTime * static_cast<double>(totalSteps_ - step - 1);
  const LoaderPosition pos = loader_->positionOf(step * s_.gradAccum);
  const int64_t epochs = (totalSteps_ + stepsPerEpoch() - 1) / stepsPerEpoch();
  const double waitPct = intervalSeconds > 0 ? 100.0 * waitSeconds / intervalSeconds : 0.0;
  char line[320];
  double tps = 0, mfu = 0;
  if (tokens()) {
    const int64_t T = s_.gpt.maxT;
    tps = sps * static_cast<double>(T);
    const double gpus = device_.isCuda() ? static_cast<double>(world_->size()) : 1.0;
    mfu = tps * static_cast<GptConfig>(s_.gpt).flopsPerToken(T) / (s_.peakFlops * gpus);
    std::snprintf(line, sizeof(line),
                  "step %lld/%lld epoch %lld/%lld loss %.4f lr %.3e tokens/s %.0f MFU %.1f%% step %.1f ms data-wait "
                  "%.1f%% ETA %s",
                  static_cast<long long>(step + 1), static_cast<long long>(totalSteps_),
                  static_cast<long long>(pos.epoch + 1), static_cast<long long>(epochs), loss,
                  static_cast<double>(schedule_.at(step)), tps, 100.0 * mfu, 1000.0 * stepTime, waitPct,
                  formatDuration(eta).c_str());
  } else {
    std::snprintf(line, sizeof(line),
                  "step %lld/%lld epoch %lld/%lld loss %.4f acc %.3f lr %.3e samples/s %.0f data-wait %.1f%% ETA %s",
                  static_cast<long long>(step + 1), static_cast<long long>(totalSteps_),
                  static_cast<long long>(pos.epoch + 1), static_cast<long long>(epochs), loss, acc,
                  static_cast<double>(schedule_.at(step)), sps, waitPct, formatDuration(eta).c_str());
  }
  std::string extra;
  if (W > 1) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), " straggler rank %d +%.0f%%", slowest, 100.0 * spread);
    extra += buf;
  }
  const double perStep = intervalSteps > 0 ? 1.0 / static_cast<double>(intervalSteps) : 0.0;
  if (dp_ && cs.bytesAfter > 0 && cs.bytesAfter != cs.bytesBefore) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), " comm %s/step (%.1fx less)",
                  formatBytes(static_cast<int64_t>(static_cast<double>(cs.bytesAfter) * perStep)).c_str(),
                  static_cast<double>(cs.bytesBefore) / static_cast<double>(cs.bytesAfter));
    extra += buf;
  }
  MT_LOG_INFO << line << extra;
  nlohmann::json j = {{"type", "step"},        {"step", step + 1},
                      {"epoch", pos.epoch},    {"loss", loss},
                      {"accuracy", acc},       {"lr", schedule_.at(step)},
                      {"samples_per_s", sps},  {"step_time_s", stepTime},
                      {"data_wait_s", intervalSteps > 0 ? waitSeconds / static_cast<double>(intervalSteps) : 0.0},
                      {"time", wallMicros() / 1e6}};
  if (tokens()) {
    j["tokens_per_s"] = tps;
    j["mfu"] = mfu;
  }
  {  // this rank's device memory (rank 0 writes the record): the curve the plots draw
    const AllocatorStats as = allocatorFor(device_).stats();
    j["allocated_bytes"] = as.allocatedBytes;
    j["reserved_bytes"] = as.reservedBytes;
    j["allocator_peak_bytes"] = as.peakAllocatedBytes;
  }
  j["compute_s_per_rank"] = std::vector<double>(ct, ct + W);
  j["straggler_rank"] = slowest;
  j["straggler_spread"] = spread;
  if (dp_) {
    j["compression"] = dp_->reducer().name();
    j["comm_bytes_before"] = static_cast<double>(cs.bytesBefore) * perStep;
    j["comm_bytes_after"] = static_cast<double>(cs.bytesAfter) * perStep;
    j["compression_s"] = cs.seconds * perStep;
  }
  metrics_.write(j);
}

int Trainer::run() {
  Stopwatch total, interval;
  int64_t intervalSteps = 0;
  double intervalWait = 0.0;
  EvalResult last;
  bool evaluatedAtEnd = false;
  int64_t step = startStep_;
  bool preempted = false;
  for (; step < totalSteps_; ++step) {
    std::vector<Batch> micro;
    for (int64_t k = 0; k < s_.gradAccum; ++k) {
      micro.push_back(feed_ ? feed_->next() : loader_->next());
      intervalWait += feed_ ? feed_->lastWaitSeconds() : loader_->lastWaitSeconds();
    }
    const bool first = step == startStep_;
    if (first && world_->rank() == 0)
      MT_LOG_INFO << "step " << step + 1 << " of " << totalSteps_ << " (the first also makes the allocations and kernel plans)";
    Stopwatch firstStep;
    LossStats stats = trainStep(micro, step);
    const bool logNow = (step + 1) % s_.logInterval == 0 || step + 1 == totalSteps_;
    if (first || logNow) stats = stats.resolved();  // (an out-of-range target is raised here)
    if (first) {
      if (world_->rank() == 0) MT_LOG_INFO << "first step done in " << firstStep.elapsed() << " s";
      logMemory(step + 1);
    }
    ++intervalSteps;
    if (logNow) {
      logStep(step, stats, interval.elapsed(), intervalSteps, intervalWait);
      interval.reset();
      intervalSteps = 0;
      intervalWait = 0.0;
    }
    const bool epochEnd = (step + 1) % stepsPerEpoch() == 0;
    const bool evalNow = s_.evalInterval > 0 ? (step + 1) % s_.evalInterval == 0 : epochEnd;
    if (s_.checkpointInterval > 0 && (step + 1) % s_.checkpointInterval == 0 && step + 1 < totalSteps_)
      saveCheckpoint(step + 1);
    const bool stopNow = stop_ ? stop_->poll() : stopSignalled();
    if (stopNow) {
      if (world_->rank() == 0)
        MT_LOG_WARN << "stop signal received: " << (s_.checkpointAtExit ? "saving a checkpoint and " : "")
                    << "leaving after step " << step + 1;
      if (s_.checkpointAtExit) saveCheckpoint(step + 1);
      preempted = true;
      ++step;
      break;
    }
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
  if (preempted) {
    if (world_->rank() == 0) {
      std::printf("preempted at step %lld of %lld; resume with the same command\n", static_cast<long long>(step),
                  static_cast<long long>(totalSteps_));
      std::fflush(stdout);
      metrics_.write({{"type", "preempted"}, {"step", step}});
      // For job scripts: this run stopped early on a signal and can be resumed (requeued).
      std::ofstream marker(runDir_ + "/PREEMPTED");
      marker << step << "\n";
    }
    world_->barrierSync();
    return 0;
  }
  if (s_.checkpointAtExit && startStep_ < totalSteps_) saveCheckpoint(totalSteps_);
  if (!evaluatedAtEnd) last = evaluate();
  if (world_->rank() == 0) {
    MT_LOG_INFO << "trained " << totalSteps_ - startStep_ << " steps in " << formatDuration(total.elapsed());
    // Unprefixed, for scripts: the one line a run ends with.
    if (tokens()) std::printf("final test_loss=%.4f\n", last.loss);
    else std::printf("final test_accuracy=%.4f test_loss=%.4f\n", last.accuracy, last.loss);
    std::fflush(stdout);
    metrics_.write({{"type", "final"}, {"steps", totalSteps_}, {"test_loss", last.loss},
                    {"test_accuracy", last.accuracy}, {"wall_s", total.elapsed()}});
  }
  world_->barrierSync();
  return 0;
}

}  // namespace mt
