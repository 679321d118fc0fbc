#include "launch/RunMetrics.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>

#include "core/Files.h"
#include "core/Log.h"
#include "core/Timer.h"
#include "launch/Signals.h"

namespace mt {

namespace {

constexpr int kCauses = 6;
const char* const kCauseNames[kCauses] = {"finished",  "preempted",    "failure",
                                          "bad_input", "comm_failure", "diverged"};

std::atomic<RunMetrics*> gActive{nullptr};

double unixSeconds() {
  return static_cast<double>(wallMicros()) / 1e6;
}

}  // namespace

const char* exitCauseName(ExitCause c) {
  return kCauseNames[static_cast<int>(c)];
}

ExitCause exitCauseOf(int exitCode, bool preempted) {
  switch (exitCode) {
    case 0:
      return preempted ? ExitCause::kPreempted : ExitCause::kFinished;
    case static_cast<int>(ExitCode::kBadInput):
      return ExitCause::kBadInput;
    case static_cast<int>(ExitCode::kCommFailure):
      return ExitCause::kCommFailure;
    case static_cast<int>(ExitCode::kDiverged):
      return ExitCause::kDiverged;
    default:
      return ExitCause::kFailure;
  }
}

MetricsExportOptions metricsExportOptions(const Config& cfg) {
  MetricsExportOptions o;
  o.port = static_cast<int>(cfg.i64("run.metrics_port"));
  o.bind = cfg.str("run.metrics_bind");
  o.lingerS = cfg.f64("run.metrics_linger_s");
  unsigned char addr[16];
  const bool v4 = inet_pton(AF_INET, o.bind.c_str(), addr) == 1;
  const bool v6 = !v4 && inet_pton(AF_INET6, o.bind.c_str(), addr) == 1;
  if (v6 && !MetricsServer::supportsIpv6())
    cfg.fail("run.metrics_bind", "'" + o.bind +
                                     "' is an IPv6 address, and this build's libmicrohttpd serves IPv4 only "
                                     "(built without IPv6): use 0.0.0.0 or 127.0.0.1");
  if (!v4 && !v6)
    cfg.fail("run.metrics_bind", "'" + o.bind +
                                     "' is not an IP address (0.0.0.0: every interface, 127.0.0.1: this "
                                     "host only; a host name is not taken)");
  return o;
}

struct RunMetrics::Figures {
  MetricsRunInfo id;
  double startTime = unixSeconds();
  bool haveInterval = false;
  IntervalFigures last;
  double lastReportTime = 0.0;
  double tokensTotal = 0.0;
  bool haveEval = false;
  int64_t evalStep = 0;
  double evalLoss = 0.0, evalAccuracy = 0.0;
  int64_t checkpoints = 0, checkpointStep = 0;
  double checkpointSeconds = 0.0, lastCheckpointSeconds = 0.0, lastCheckpointTime = 0.0;
  int64_t resumes = 0, timeouts = 0;
  std::array<int64_t, kCauses> exits{};
};

// Builds the family list: one call per family, samples added as figures are known.
class RunMetrics::FamilyList {
 public:
  MetricFamily& add(const char* name, MetricType type, const char* help) {
    out_.push_back({name, help, type, {}});
    return out_.back();
  }
  void gauge(const char* name, const char* help, double v) {
    add(name, MetricType::kGauge, help).samples.push_back({{}, v});
  }
  void counter(const char* name, const char* help, double v) {
    add(name, MetricType::kCounter, help).samples.push_back({{}, v});
  }
  // A gauge per rank (label rank) from one member of RankFigures.
  void perRank(const char* name, const char* help, const std::vector<RankFigures>& ranks,
               double RankFigures::*member) {
    MetricFamily& f = add(name, MetricType::kGauge, help);
    for (size_t r = 0; r < ranks.size(); ++r)
      f.samples.push_back({{{"rank", std::to_string(r)}}, ranks[r].*member});
  }
  std::vector<MetricFamily> take() { return std::move(out_); }

 private:
  std::vector<MetricFamily> out_;
};

RunMetrics::RunMetrics(const MetricsExportOptions& options)
    : options_(options), figures_(std::make_unique<Figures>()) {}

RunMetrics::~RunMetrics() {
  RunMetrics* self = this;
  gActive.compare_exchange_strong(self, nullptr);
  server_.reset();  // before the figures it renders
}

std::unique_ptr<RunMetrics> RunMetrics::start(const MetricsExportOptions& options, int rank) {
  if (options.port == 0 || rank != 0) return nullptr;
  auto m = std::make_unique<RunMetrics>(options);
  m->serve();
  gActive.store(m.get());
  return m;
}

RunMetrics* RunMetrics::active() {
  return gActive.load();
}

bool RunMetrics::serve() {
  try {
    server_ = std::make_unique<MetricsServer>(options_.bind, options_.port, [this] { return render(); });
  } catch (const IoError& e) {
    MT_LOG_WARN << "run.metrics_port " << options_.port << ": " << e.what()
                << "; training goes on without the metrics endpoint (the final figures still go to "
                   "<run_dir>/metrics.prom)";
    return false;
  }
  MT_LOG_INFO << "serving Prometheus metrics on http://" << server_->address() << "/metrics";
  return true;
}

void RunMetrics::identify(const MetricsRunInfo& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  figures_->id = id;
}

void RunMetrics::interval(const IntervalFigures& f) {
  std::lock_guard<std::mutex> lock(mutex_);
  Figures& x = *figures_;
  x.haveInterval = true;
  x.last = f;
  x.lastReportTime = unixSeconds();
  if (f.tokensPerS >= 0) x.tokensTotal += f.tokensPerS * f.seconds;
}

void RunMetrics::evaluation(int64_t step, double loss, double accuracy) {
  std::lock_guard<std::mutex> lock(mutex_);
  figures_->haveEval = true;
  figures_->evalStep = step;
  figures_->evalLoss = loss;
  figures_->evalAccuracy = accuracy;
}

void RunMetrics::checkpointWritten(int64_t step, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  Figures& x = *figures_;
  ++x.checkpoints;
  x.checkpointStep = step;
  x.checkpointSeconds += seconds;
  x.lastCheckpointSeconds = seconds;
  x.lastCheckpointTime = unixSeconds();
}

void RunMetrics::resumed(int64_t step, int64_t resumes) {
  std::lock_guard<std::mutex> lock(mutex_);
  figures_->id.startStep = step;
  figures_->resumes = resumes;
}

void RunMetrics::collectiveTimeout() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++figures_->timeouts;
}

// The run's identity and progress: what is known from the first step on.
void RunMetrics::addProgress(FamilyList& fs, const Figures& x, int64_t step) {
  const IntervalFigures& f = x.last;
  fs.add("meshtrain_run_info", MetricType::kGauge,
         "1, labelled with the run's name, model, strategy and device")
      .samples.push_back({{{"run", x.id.runName},
                           {"model", x.id.model},
                           {"strategy", x.id.strategy},
                           {"device", x.id.device}},
                          1.0});
  fs.gauge("meshtrain_world_size", "ranks in the job", x.id.worldSize);
  fs.gauge("meshtrain_start_time_seconds", "when this process started, in seconds since the Unix epoch",
           x.startTime);
  const int64_t trained = step - x.id.startStep;
  fs.gauge("meshtrain_step", "optimizer steps done (the run's, across resumes)", static_cast<double>(step));
  fs.gauge("meshtrain_steps_planned", "optimizer steps the run trains to (train.epochs or train.max_steps)",
           static_cast<double>(x.id.totalSteps));
  fs.counter("meshtrain_steps_total", "optimizer steps trained by this process",
             static_cast<double>(trained));
  fs.counter("meshtrain_samples_total", "samples trained by this process (train.batch_size a step)",
             static_cast<double>(trained * x.id.globalBatch));
  if (f.tokensPerS >= 0)
    fs.counter("meshtrain_tokens_total", "tokens trained by this process, counted at each log interval",
               x.tokensTotal);
}

// The last log interval: loss, speed, the per-rank figures and the straggler.
void RunMetrics::addInterval(FamilyList& fs, const Figures& x) {
  const IntervalFigures& f = x.last;
  fs.gauge("meshtrain_logged_step", "the step of the last log interval, which the figures below describe",
           static_cast<double>(f.step));
  fs.gauge("meshtrain_epoch", "the epoch of the last logged step, from 0", static_cast<double>(f.epoch));
  fs.gauge("meshtrain_loss", "training loss over the global batch at the last logged step", f.loss);
  fs.gauge("meshtrain_accuracy", "training accuracy over the global batch at the last logged step",
           f.accuracy);
  fs.gauge("meshtrain_learning_rate", "learning rate at the last logged step", f.lr);
  fs.gauge("meshtrain_samples_per_second", "samples trained per second over the last log interval",
           f.samplesPerS);
  if (f.tokensPerS >= 0)
    fs.gauge("meshtrain_tokens_per_second", "tokens trained per second over the last log interval",
             f.tokensPerS);
  if (f.mfu >= 0)
    fs.gauge("meshtrain_mfu_ratio", "model FLOP utilisation over the last log interval (train.peak_flops)",
             f.mfu);
  if (f.lossScale >= 0) {
    fs.gauge("meshtrain_loss_scale", "f16 loss scale after the last logged step", f.lossScale);
    fs.counter(
        "meshtrain_skipped_steps_total",
        "optimizer steps the f16 loss scaler skipped for inf/nan gradients (the run's, across resumes)",
        static_cast<double>(f.skippedSteps));
  }
  fs.gauge("meshtrain_step_seconds", "wall time of a step, mean over the last log interval", f.stepSeconds);
  fs.perRank("meshtrain_data_wait_ratio", "share of the last log interval the rank waited for batches",
             f.ranks, &RankFigures::dataWaitRatio);
  fs.perRank("meshtrain_compute_seconds",
             "forward + backward seconds per step on the rank (last log interval)", f.ranks,
             &RankFigures::computeS);
  fs.perRank("meshtrain_comm_wait_seconds",
             "seconds per step the rank waited for the gradient reduction after backward (last log interval)",
             f.ranks, &RankFigures::commWaitS);
  fs.perRank("meshtrain_allocator_allocated_bytes", "bytes allocated by the rank's device allocator", f.ranks,
             &RankFigures::allocatedBytes);
  fs.perRank("meshtrain_allocator_reserved_bytes",
             "bytes the rank's device allocator holds (cached included)", f.ranks,
             &RankFigures::reservedBytes);
  fs.perRank("meshtrain_allocator_peak_bytes", "peak bytes allocated by the rank's device allocator", f.ranks,
             &RankFigures::peakBytes);
  fs.gauge("meshtrain_straggler_rank", "the rank with the longest compute time per step", f.stragglerRank);
  fs.gauge("meshtrain_straggler_lag_seconds",
           "the straggler's compute seconds per step beyond the fastest rank's", f.stragglerLagS);
  fs.gauge("meshtrain_straggler_lag_ratio", "the straggler's compute time over the fastest rank's, minus 1",
           f.stragglerLagRatio);
  fs.gauge("meshtrain_last_report_timestamp_seconds",
           "when rank 0 last reported a log interval (Unix seconds)", x.lastReportTime);
}

// Evaluations, checkpoints, resumes, timeouts and exits.
void RunMetrics::addEventCounts(FamilyList& fs, const Figures& x) {
  if (x.haveEval) {
    fs.gauge("meshtrain_eval_step", "the step of the last evaluation", static_cast<double>(x.evalStep));
    fs.gauge("meshtrain_eval_loss", "test loss at the last evaluation", x.evalLoss);
    fs.gauge("meshtrain_eval_accuracy", "test accuracy at the last evaluation", x.evalAccuracy);
  }
  fs.counter("meshtrain_checkpoints_written_total", "checkpoints this process wrote",
             static_cast<double>(x.checkpoints));
  fs.counter("meshtrain_checkpoint_write_seconds_total", "seconds this process spent writing checkpoints",
             x.checkpointSeconds);
  if (x.checkpoints > 0) {
    fs.gauge("meshtrain_checkpoint_duration_seconds", "how long the last checkpoint took to write",
             x.lastCheckpointSeconds);
    fs.gauge("meshtrain_checkpoint_step", "the step of the last checkpoint written",
             static_cast<double>(x.checkpointStep));
    fs.gauge("meshtrain_checkpoint_timestamp_seconds", "when the last checkpoint was written (Unix seconds)",
             x.lastCheckpointTime);
  }
  fs.counter("meshtrain_resumes_total",
             "times the run continued from a checkpoint (its metrics.jsonl history)",
             static_cast<double>(x.resumes));
  fs.counter("meshtrain_collective_timeouts_total", "collectives on rank 0 that outlived their timeout",
             static_cast<double>(x.timeouts));
  MetricFamily& exits = fs.add(
      "meshtrain_exits_total", MetricType::kCounter,
      "process exits by cause (docs/failures.md): finished, preempted (exit 0), failure (1), bad_input (2), "
      "comm_failure (3), diverged (4)");
  for (int c = 0; c < kCauses; ++c)
    exits.samples.push_back(
        {{{"cause", kCauseNames[c]}}, static_cast<double>(x.exits[static_cast<size_t>(c)])});
}

std::vector<MetricFamily> RunMetrics::families() const {
  Figures x;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    x = *figures_;
  }
  FamilyList fs;
  addProgress(fs, x, std::max(x.id.startStep, step_.load(std::memory_order_relaxed)));
  if (x.haveInterval) addInterval(fs, x);
  addEventCounts(fs, x);
  return fs.take();
}

void RunMetrics::finish(ExitCause cause) {
  if (finished_.exchange(true)) return;
  std::string runDir;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cause_ = cause;
    signalsAtFinish_ = stopSignalCount();
    ++figures_->exits[static_cast<size_t>(cause)];
    runDir = figures_->id.runDir;
  }
  if (!runDir.empty()) {
    try {
      writeFileAtomically(runDir + "/metrics.prom", render());
    } catch (const std::exception& e) {
      MT_LOG_WARN << "run.metrics_port: the final figures were not saved: " << e.what();
    }
  }
}

void RunMetrics::linger() {
  if (!server_ || options_.lingerS <= 0 || !finished_.load()) return;
  std::string runDir;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    runDir = figures_->id.runDir;
  }
  // finish() saved the figures only where the run had a directory (a setup failure may come first).
  const std::string saved = runDir.empty() ? "; they were not saved (the run failed before it had a run directory)"
                                           : "; the final figures are in " + runDir + "/metrics.prom";
  const uint64_t generation = server_->advanceGeneration();
  MT_LOG_INFO << "exit cause " << exitCauseName(cause_)
              << ": serving the final metrics until a scrape reads them"
              << " (at most " << options_.lingerS << " s, run.metrics_linger_s)";
  // In slices, so that a stop signal that came after finish() (the run may have stopped for an
  // earlier one) ends the wait: a scheduler's SIGTERM is not held up for up to an hour.
  int signals = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    signals = signalsAtFinish_;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options_.lingerS * 1000.0));
  while (!server_->waitServed(generation, std::chrono::milliseconds(100))) {
    if (stopSignalCount() != signals) {
      MT_LOG_INFO << "stop signal: no longer waiting for a scrape" << saved;
      return;
    }
    if (std::chrono::steady_clock::now() >= until) {
      MT_LOG_INFO << "no scrape within run.metrics_linger_s" << saved;
      return;
    }
  }
}

void finishActiveRunMetrics(ExitCause cause) {
  if (RunMetrics* m = RunMetrics::active()) {
    m->finish(cause);
    m->linger();
  }
}

}  // namespace mt
