#pragma once
// What a run tells its operator: the progress line and metrics.jsonl step record every log
// interval (the loss over the global batch, throughput, the straggler report, communication and
// memory figures), the memory record after the first step, evaluation, preemption and final
// records, and with run.trace each rank's per-step timestamps (trace.rank<r>.jsonl). Rank 0 writes
// metrics.jsonl; the figures that need every rank are gathered collectively, so step() and
// memory() are called by all ranks.

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "comm/DataParallel.h"
#include "launch/Metrics.h"
#include "launch/Parallelism.h"
#include "launch/RunMetrics.h"
#include "launch/Task.h"
#include "sharding/ShardedEngine.h"

namespace mt {

// One log interval as the trainer saw it on this rank.
struct IntervalReport {
  int64_t step = 0;               // the interval's last step, from 0
  int64_t totalSteps = 0, stepsPerEpoch = 1, globalBatch = 0;
  LoaderPosition position;         // of the step's first batch
  LossStats local;                 // this rank's loss statistics of that step
  double seconds = 0.0;            // wall time of the interval
  int64_t steps = 0;               // steps in it
  double waitSeconds = 0.0;        // data-wait time in it
  double computePerStep = 0.0;     // this rank's forward + backward seconds per step
  double commWaitPerStep = 0.0;    // this rank's seconds per step waiting for the gradient reduction
  double lr = 0.0;
  double lossScale = 0.0;    // f16's loss scale after the interval's last step (0: no loss scaler)
  int64_t skippedSteps = 0;  // steps the loss scaler skipped for inf/nan gradients, the run's so far
  Device device = Device::cpu();
};

class RunReporter {
 public:
  // Opens <runDir>/metrics.jsonl on rank 0 (appending when resumed) and the trace file with
  // run.trace. metrics: rank 0's Prometheus figures (run.metrics_port), fed at each report; null: none.
  RunReporter(const Task& task, Communicator& world, const std::string& runDir, bool resumed, bool trace,
              RunMetrics* metrics = nullptr);

  // The loss over the global batch, the progress line and the step record. Collective.
  void interval(const IntervalReport& r, Parallelism& parallelism);
  // Every rank's memory account (`m`, activation peak folded in). Collective.
  void memory(int64_t step, const MemoryAccount& m, const std::string& strategy, int64_t numParams);
  void evaluation(int64_t step, const EvalResult& e);  // rank 0 logs and records
  // Continuing a run from its checkpoint after `step` steps: metrics.jsonl loses its torn lines
  // and the records of later steps (trained again now), and gains a "resume" record. Rank 0.
  void resumed(int64_t step);
  void preempted(int64_t step, int64_t totalSteps, const std::string& runDir);
  // The run stopped after `step` steps because it diverged (`why`); the newest checkpoint in
  // checkpointDir is named as the one to resume from. Rank 0 logs and records.
  void diverged(int64_t step, const std::string& why, const std::string& checkpointDir);
  // Empty while the run's records were written, else why not (rank 0: metrics.jsonl, PREEMPTED).
  std::string recordsError() const { return metrics_.error().empty() ? markerError_ : metrics_.error(); }
  void finished(int64_t totalSteps, int64_t stepsTrained, double wallSeconds, const EvalResult& e);
  bool tracing() const { return trace_ != nullptr; }
  // This rank's trace line of a step: backward's span, the batch's samples, the buckets' times.
  void traceStep(int64_t step, int64_t backwardStartUs, const Parallelism& parallelism,
                 const std::vector<int64_t>& batchIndices);

 private:
  // Columns each rank contributes to the interval's all-gather (RunReporter.cpp).
  static constexpr int kRankColumns = 6;
  IntervalFigures prometheusFigures(const IntervalReport& r, const Progress& p, const nlohmann::json& record,
                                    const double* gathered, int slowest, double fastest) const;

  const Task& task_;
  Communicator& world_;
  MetricsWriter metrics_;
  RunMetrics* prometheus_ = nullptr;
  std::string markerError_;
  std::unique_ptr<std::ofstream> trace_;
};

}  // namespace mt
