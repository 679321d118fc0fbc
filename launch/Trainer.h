#pragma once
// The training program: builds the communicator, data, model, parallelism and optimizer from the
// configuration, then runs the loop (docs/architecture.md follows one step through it).
// Construction does all validation, so a bad config or data file fails before any training and
// the same way on every rank.

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/Communicator.h"
#include "comm/DataParallel.h"
#include "comm/HealthMonitor.h"
#include "comm/MpiEnvironment.h"
#include "data/ImageDataset.h"
#include "data/DeviceFeed.h"
#include "data/ImageSource.h"
#include "data/Loader.h"
#include "data/TokenDataset.h"
#include "launch/Checkpoint.h"
#include "launch/Config.h"
#include "launch/Signals.h"
#include "launch/Settings.h"
#include "comm/Hierarchy.h"
#include "topo/Profile.h"
#include "topo/Topology.h"
#include "launch/Metrics.h"
#include "launch/RankDiscovery.h"
#include "models/Model.h"
#include "models/optim/LossScaler.h"
#include "models/optim/LrSchedule.h"
#include "models/optim/Optimizer.h"

namespace mt {

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t count = 0;
};

class Trainer {
 public:
  Trainer(const Config& cfg, MpiEnvironment& mpi);
  ~Trainer();
  // Trains to the configured end; returns the process exit code.
  int run();
  Communicator& world() { return *world_; }
  HealthMonitor* health() { return health_.get(); }
  const std::string& runDir() const { return runDir_; }

 private:
  void setupTopology();
  void setupDevice();
  void bindToGpuCpus();
  void setupComm();
  void setupData();
  void setupModel();
  void setupOptimizer();
  void resumeIfAny();
  void saveCheckpoint(int64_t stepsDone);
  // One optimizer step on one global batch; returns this rank's loss statistics.
  // One optimizer step over train.grad_accum_steps micro-batches (their gradients accumulate).
  LossStats trainStep(const std::vector<Batch>& micro, int64_t step);
  EvalResult evaluate();
  void logStep(int64_t step, const LossStats& local, double intervalSeconds, int64_t intervalSteps,
               double waitSeconds);
  void writeTrace(int64_t step, int64_t backwardStartUs);
  Batch toDevice(const Batch& b) const;

  Config cfg_;
  Settings s_;
  MpiEnvironment& mpi_;
  LaunchInfo launch_;
  std::string runDir_;
  Device device_ = Device::cpu();
  int64_t localBatch_ = 0;  // this rank's rows per optimizer step
  int64_t microBatch_ = 0;  // rows per forward/backward pass: localBatch_ / train.grad_accum_steps
  int64_t stepsPerEpoch() const;
  int64_t totalSteps_ = 0;

#ifdef MT_WITH_CUDA
  std::unique_ptr<class CudaRuntime> cuda_;
#endif
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<HealthMonitor> health_;
  std::unique_ptr<Topology> topology_;
  std::unique_ptr<Profile> profile_;
  std::vector<std::string> ncclEnv_;
  std::unique_ptr<NodeGroups> groups_;
  std::unique_ptr<H5File> file_;
  std::unique_ptr<ImageDataset> train_, test_;
  std::unique_ptr<TokenDataset> trainTokens_, testTokens_;
  std::unique_ptr<BatchSource> trainSource_;
  bool tokens() const { return s_.model.type == "gpt"; }
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<DeviceFeed> feed_;  // cuda: how batches reach the GPU
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<Optimizer> optimizer_;  // no_shard; sharded runs use the engine's
  std::unique_ptr<ShardedEngine> engine_;
  Optimizer& optimizer() { return engine_ ? engine_->optimizer() : *optimizer_; }
  void logMemory(int64_t step);
  LrSchedule schedule_;
  MetricsWriter metrics_;
  std::unique_ptr<CheckpointManager> ckpt_;
  std::unique_ptr<StopAgreement> stop_;
  int64_t startStep_ = 0;
  int64_t activationPeak_ = 0;
  bool resumed_ = false;
  std::unique_ptr<std::ofstream> trace_;
  // Per-rank compute time (forward + backward, not waiting for gradients): the straggler report.
  double intervalCompute_ = 0.0;
  struct GpuTimers;
  std::unique_ptr<GpuTimers> gpuTimers_;
  double lastGpuComputeSeconds();
};

}  // namespace mt
