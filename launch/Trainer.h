#pragma once
// The training program: builds the device, communicator, task (data), model, parallelism and
// optimizer from the configuration, then runs the loop (docs/architecture.md follows one step
// through it). Construction does all validation, so a bad config or data file fails before any
// training and the same way on every rank.

#include <memory>
#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "comm/HealthMonitor.h"
#include "comm/MpiEnvironment.h"
#include "data/DeviceFeed.h"
#include "data/Loader.h"
#include "launch/Checkpoint.h"
#include "launch/Config.h"
#include "launch/Evaluator.h"
#include "launch/Parallelism.h"
#include "launch/RankDiscovery.h"
#include "launch/RunDirectory.h"
#include "launch/RunGuard.h"
#include "launch/RunMetrics.h"
#include "launch/RunReporter.h"
#include "launch/Settings.h"
#include "launch/Signals.h"
#include "launch/Task.h"
#include "launch/TopologySetup.h"
#include "models/Model.h"
#include "core/optim/LossScaler.h"
#include "core/optim/LrSchedule.h"

namespace mt {

class Trainer {
 public:
  // metrics: rank 0's Prometheus figures (run.metrics_port), else null.
  Trainer(const Config& cfg, MpiEnvironment& mpi, RunMetrics* metrics = nullptr);
  ~Trainer();
  // Trains to the configured end; returns the process exit code.
  int run();
  bool preempted() const { return preempted_; }  // run() ended on a stop signal
  Communicator& world() { return *world_; }
  HealthMonitor* health() { return health_.get(); }
  const std::string& runDir() const { return runDir_; }

 private:
  void warnIfBoundNarrowly() const;
  void warnIfWithoutEffect() const;
  void takeRunDirectory();
  void setupDevice();
  void setupComm();
  void placeRank(bool nccl);
  void setupData();
  void setupModel();
  void resumeIfAny();
  void writeRunFiles();
  void writeOwnRunFiles();
  // After a preemption: how to resume when the same command would not (checkpoint.resume != auto).
  void adviseResume() const;
  void saveCheckpoint(int64_t stepsDone);
  // How the training loop ends: endAfter() decides after each step, endRun() acts on it once.
  enum class RunEnd { kRunning, kFinished, kPreempted, kDiverged, kRecordsFailed };
  enum class SaveOutcome { kSaved, kSkipped, kDiverged };
  // Hands the step's loss to the divergence check (on the GPU one step late: LaggedLoss).
  void watchLoss(int64_t step, const LossStats& stats);
  void submitLaggedLoss();
  // Every rank agrees on the loss of every step so far (a save point: the step is synchronous there).
  void agreeOnLosses();
  bool weightsFinite();  // collective
  // A checkpoint after `stepsDone` steps unless the loss of the last steps or the weights are not
  // finite (kSkipped / kDiverged): a diverged run never replaces the good checkpoints. Collective.
  SaveOutcome guardedSave(int64_t stepsDone);
  bool finalSave();
  std::string divergenceReason() const;
  int endOnRecordsFailure(int64_t stepsDone);
  int agreedExitCode(int code);
  RunEnd endAfter(int64_t step);
  bool stopAgreed();
  RunEnd stopAfter(int64_t step);
  int endRun(RunEnd end, int64_t stepsDone, EvalResult last, bool evaluatedAtEnd, double wallSeconds);
  // One optimizer step over train.grad_accum_steps micro-batches (their gradients accumulate);
  // returns this rank's loss statistics.
  LossStats trainStep(const std::vector<Batch>& micro, int64_t step);
  // The training Context of a step; the optimizer's part of it (the loss scaler's check, the clip,
  // the step) after the micro-batches' backward.
  Context stepContext(int64_t step) const;
  void applyStep(int64_t step);
  EvalResult evaluate();
  void reportInterval(int64_t step, const LossStats& local, double seconds, int64_t steps, double waitSeconds);
  void syncObservers();
  void reportMemory(int64_t step);
  void profilerRange(int64_t step, bool before);  // run.profile_from: the CUDA profiler capture range
  int64_t stepsPerEpoch() const;
  double lastGpuComputeSeconds();

  Config cfg_;
  Settings s_;
  MpiEnvironment& mpi_;
  LaunchInfo launch_;
  std::string runDir_;
  std::unique_ptr<RunDirLock> lock_;  // rank 0; released last, after everything that writes the directory
  Device device_ = Device::cpu();
  int64_t localBatch_ = 0;  // this rank's rows per optimizer step
  int64_t microBatch_ = 0;  // rows per forward/backward pass: localBatch_ / train.grad_accum_steps
  int64_t totalSteps_ = 0;

#ifdef MT_WITH_CUDA
  std::unique_ptr<class CudaRuntime> cuda_;
#endif
  // On a CPU run the loader's batches get their own allocator: the device allocator's peak (the
  // memory record, `trainer plan`'s comparison) then counts what training holds, not however many
  // batches the workers happen to have collated ahead at that instant, as on a GPU, where they
  // wait in pinned memory. Declared before everything that can hold a batch.
  CpuAllocator loaderStaging_;
  Allocator* host_ = nullptr;  // where loader workers collate (pinned or managed memory for a GPU)
  std::unique_ptr<LossScaler> scaler_;
  TopologySetup topo_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<HealthMonitor> health_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<DeviceFeed> feed_;  // cuda: how batches reach the GPU
  std::unique_ptr<Model> model_;
  // train.qat: the model's layers wrapped in fake quantization, and their observers (after model_:
  // destroyed first, it points into the model's layers).
  std::unique_ptr<class QuantizedModel> qat_;
  std::unique_ptr<Parallelism> parallelism_;
  std::unique_ptr<Evaluator> evaluator_;  // made at the first evaluation
  std::unique_ptr<RunReporter> reporter_;
  LrSchedule schedule_;
  std::unique_ptr<CheckpointManager> ckpt_;
  std::unique_ptr<StopAgreement> stop_;
  std::unique_ptr<RunGuard> guard_;  // made by run(): every rank is past setup there
  struct LaggedLoss;
  std::unique_ptr<LaggedLoss> lagged_;
  bool weightsDiverged_ = false;  // a save point found non-finite weights
  int64_t startStep_ = 0;
  int64_t activationPeak_ = 0;
  bool resumed_ = false;
  bool preempted_ = false;
  RunMetrics* metrics_ = nullptr;
  // Per-rank compute time (forward + backward, not waiting for gradients): the straggler report.
  double intervalCompute_ = 0.0;
  double intervalCommWait_ = 0.0;  // host seconds in finishBackward(): waiting for the reduction
  struct GpuTimers;
  std::unique_ptr<GpuTimers> gpuTimers_;
};

}  // namespace mt
