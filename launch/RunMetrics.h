#pragma once
// A run's figures for Prometheus (run.metrics_port): rank 0 serves them on
// http://<run.metrics_bind>:<run.metrics_port>/metrics (launch/MetricsServer.h) in the text
// exposition format (launch/Exposition.h). The other ranks report through rank 0: their figures
// (compute, communication and data wait, allocator bytes) ride on the all-gather the interval
// report makes anyway (launch/RunReporter.h), so there is no port per rank and no extra collective.
// The names, types and labels are listed in docs/metrics.md.
//
// The trainer updates the figures under one short lock; a scrape copies them under that lock and
// formats the copy on the server's thread, so training never waits for a scrape.
//
// How the end of a run is seen: finish() counts the exit cause (meshtrain_exits_total{cause}),
// writes the page to <run_dir>/metrics.prom (whole, by rename; node_exporter's textfile collector
// reads that format) and keeps serving until a scrape that started after it has been answered, or
// run.metrics_linger_s has passed. The abort paths (launch/Failure.h) call it as well, through
// finishActiveRunMetrics(); there a launcher that kills the job early may cut the wait short, and
// the file is what remains.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/Error.h"
#include "launch/Config.h"
#include "launch/Exposition.h"
#include "launch/MetricsServer.h"

namespace mt {

// Why the process ends, for meshtrain_exits_total{cause}: the exit codes of docs/failures.md, with
// 0 split into a finished and a preempted run.
enum class ExitCause { kFinished, kPreempted, kFailure, kBadInput, kCommFailure, kDiverged };
const char* exitCauseName(ExitCause c);  // "finished", "preempted", "failure", ...
ExitCause exitCauseOf(int exitCode, bool preempted);

struct MetricsExportOptions {
  int port = 0;  // 0: off
  std::string bind = "0.0.0.0";
  double lingerS = 15.0;
};
// run.metrics_port, run.metrics_bind (checked: an IP address the server can listen on, IPv6 only
// where libmicrohttpd was built with it; ConfigError naming the key otherwise), run.metrics_linger_s.
MetricsExportOptions metricsExportOptions(const Config& cfg);

// One rank's figures of a log interval.
struct RankFigures {
  double computeS = 0.0;       // forward + backward seconds per step
  double commWaitS = 0.0;      // seconds per step waiting for the gradient reduction after backward
  double dataWaitRatio = 0.0;  // share of the interval's wall time spent waiting for batches
  double allocatedBytes = 0.0, reservedBytes = 0.0, peakBytes = 0.0;  // the device's allocator
};

// A log interval as rank 0 reports it (launch/RunReporter.cpp).
struct IntervalFigures {
  int64_t step = 0, totalSteps = 0, epoch = 0;  // step: steps done
  double seconds = 0.0;                         // the interval's wall time
  double loss = 0.0, accuracy = 0.0, lr = 0.0, samplesPerS = 0.0, stepSeconds = 0.0;
  double tokensPerS = -1.0, mfu = -1.0;  // < 0: not computed by this task (GPT computes them)
  double lossScale = -1.0;               // f16's loss scale (< 0: no loss scaler)
  int64_t skippedSteps = 0;              // steps the loss scaler skipped, the run's so far
  int stragglerRank = 0;
  double stragglerLagS = 0.0, stragglerLagRatio = 0.0;  // slowest rank's compute over the fastest's
  std::vector<RankFigures> ranks;
};

struct MetricsRunInfo {
  std::string runDir, runName, model, strategy, device;
  int worldSize = 1;
  int64_t totalSteps = 0, startStep = 0, globalBatch = 0;
};

class RunMetrics {
 public:
  // Rank 0 with a port: the figures and their server (null elsewhere). A port that cannot be
  // listened on is a warning naming it; the run goes on and still writes metrics.prom.
  static std::unique_ptr<RunMetrics> start(const MetricsExportOptions& options, int rank);
  // The one a process has, for the abort paths; null when none.
  static RunMetrics* active();
  explicit RunMetrics(const MetricsExportOptions& options);  // no server until serve()
  ~RunMetrics();
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  // Starts the server; false (and a warning) when it cannot listen.
  bool serve();
  int port() const { return server_ ? server_->port() : 0; }

  void identify(const MetricsRunInfo& id);
  // After every optimizer step: the steps done. Lock-free (one atomic store), so the step and the
  // step and sample counters are live between log intervals.
  void stepDone(int64_t steps) { step_.store(steps, std::memory_order_relaxed); }
  void interval(const IntervalFigures& f);
  void evaluation(int64_t step, double loss, double accuracy);
  void checkpointWritten(int64_t step, double seconds);
  // This run continued from a checkpoint after `step` steps; `resumes`: how many times the run
  // directory's history says it was resumed, this time included.
  void resumed(int64_t step, int64_t resumes);
  void collectiveTimeout();
  // Once: counts `cause` and writes <run_dir>/metrics.prom (a warning if it cannot).
  void finish(ExitCause cause);
  // After finish(): serves until a scrape that started after it was answered, at most
  // run.metrics_linger_s.
  void linger();

  std::vector<MetricFamily> families() const;  // a snapshot, under the lock
  std::string render() const { return formatExposition(families()); }

 private:
  struct Figures;
  class FamilyList;  // builds families() (RunMetrics.cpp)
  static void addProgress(FamilyList& fs, const Figures& x, int64_t step);
  static void addInterval(FamilyList& fs, const Figures& x);
  static void addEventCounts(FamilyList& fs, const Figures& x);
  MetricsExportOptions options_;
  mutable std::mutex mutex_;  // figures_
  std::unique_ptr<Figures> figures_;
  std::unique_ptr<MetricsServer> server_;
  std::atomic<int64_t> step_{-1};  // -1: no step yet (the run's start step then)
  std::atomic<bool> finished_{false};
  ExitCause cause_ = ExitCause::kFinished;  // set once by finish()
  int signalsAtFinish_ = 0;                  // stopSignalCount() then: a later signal ends linger()
};

// finish() and linger() on the process's RunMetrics, if any (the abort paths of launch/Failure.h).
void finishActiveRunMetrics(ExitCause cause);

}  // namespace mt
