#include "launch/RunReporter.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/Allocator.h"
#include "core/Log.h"
#include "core/Timer.h"
#include "launch/Evaluator.h"

namespace mt {

namespace fs = std::filesystem;

RunReporter::RunReporter(const Task& task, Communicator& world, const std::string& runDir, bool resumed, bool trace,
                         RunMetrics* metrics)
    : task_(task), world_(world), prometheus_(metrics) {
  if (world_.rank() == 0) metrics_.open(runDir + "/metrics.jsonl", /*append=*/resumed);
  if (trace)
    trace_ = std::make_unique<std::ofstream>(runDir + "/trace.rank" + std::to_string(world_.rank()) + ".jsonl",
                                             resumed ? std::ios::app : std::ios::trunc);
}

namespace {

// The progress figures of an interval from its report and the loss summed over the ranks.
Progress progressOf(const IntervalReport& r, const LossStats& global, int ranks) {
  const double count = static_cast<double>(global.count);
  Progress p;
  p.step = r.step + 1;
  p.totalSteps = r.totalSteps;
  p.epoch = r.position.epoch + 1;
  p.epochs = (r.totalSteps + r.stepsPerEpoch - 1) / r.stepsPerEpoch;
  p.loss = count > 0 ? global.lossSum / count : 0.0;
  p.accuracy = count > 0 ? static_cast<double>(global.correct) / count : 0.0;
  p.lr = r.lr;
  p.samplesPerS = r.seconds > 0 ? static_cast<double>(r.steps * r.globalBatch) / r.seconds : 0.0;
  p.stepSeconds = r.steps > 0 ? r.seconds / static_cast<double>(r.steps) : 0.0;
  p.etaSeconds = p.stepSeconds * static_cast<double>(r.totalSteps - r.step - 1);
  p.waitPercent = r.seconds > 0 ? 100.0 * r.waitSeconds / r.seconds : 0.0;
  p.gpus = r.device.isCuda() ? ranks : 0;
  return p;
}

// What the progress line adds after the task's own figures: the straggler, the loss scaler,
// compression and ZeRO-Offload's times, each only where it applies.
std::string progressExtras(const IntervalReport& r, const CommReport& comm, int ranks, int slowest, double spread) {
  std::string extra;
  char buf[160];
  if (ranks > 1) {
    std::snprintf(buf, sizeof(buf), " straggler rank %d +%.0f%%", slowest, 100.0 * spread);
    extra += buf;
  }
  if (r.lossScale > 0) {  // f16: what the loss scaler did (a falling scale, skipped steps)
    std::snprintf(buf, sizeof(buf), " loss-scale %g skipped %lld", r.lossScale, static_cast<long long>(r.skippedSteps));
    extra += buf;
  }
  const double perStep = r.steps > 0 ? 1.0 / static_cast<double>(r.steps) : 0.0;
  const CompressionStats& cs = comm.stats;
  if (comm.present && cs.bytesAfter > 0 && cs.bytesAfter != cs.bytesBefore) {
    std::snprintf(buf, sizeof(buf), " comm %s/step (%.1fx less)",
                  formatBytes(static_cast<int64_t>(static_cast<double>(cs.bytesAfter) * perStep)).c_str(),
                  static_cast<double>(cs.bytesBefore) / static_cast<double>(cs.bytesAfter));
    extra += buf;
  }
  const OffloadTimes& ot = comm.offload;
  if (ot.jobs > 0) {  // ZeRO-Offload: the CPU step per step, and how much of it the GPU waited for
    std::snprintf(buf, sizeof(buf), " offload cpu %.1f ms (copy wait %.1f) train wait %.1f ms gpu wait %.1f ms",
                  1e3 * ot.jobS / static_cast<double>(ot.jobs), 1e3 * ot.copyWaitS / static_cast<double>(ot.jobs),
                  1e3 * ot.trainWaitS * perStep, 1e3 * ot.gpuWaitS * perStep);
    extra += buf;
  }
  return extra;
}

// The step record's fields beyond the task's own: memory, stragglers, the loss scaler,
// ZeRO-Offload and compression (the last three only where they apply).
void addStepRecordFields(nlohmann::json& j, const IntervalReport& r, const CommReport& comm, const AllocatorStats& as,
                         const std::vector<double>& computePerRank, int slowest, double spread) {
  // this rank's device memory (rank 0 writes the record): the curve the plots draw
  j["allocated_bytes"] = as.allocatedBytes;
  j["reserved_bytes"] = as.reservedBytes;
  j["allocator_peak_bytes"] = as.peakAllocatedBytes;
  j["compute_s_per_rank"] = computePerRank;
  j["straggler_rank"] = slowest;
  j["straggler_spread"] = spread;
  if (r.lossScale > 0) {
    j["loss_scale"] = r.lossScale;
    j["skipped_steps"] = r.skippedSteps;
  }
  const double perStep = r.steps > 0 ? 1.0 / static_cast<double>(r.steps) : 0.0;
  const OffloadTimes& ot = comm.offload;
  if (ot.jobs > 0) {
    j["offload_cpu_s"] = ot.jobS / static_cast<double>(ot.jobs);
    j["offload_copy_wait_s"] = ot.copyWaitS / static_cast<double>(ot.jobs);
    j["offload_train_wait_s"] = ot.trainWaitS * perStep;
    j["offload_gpu_wait_s"] = ot.gpuWaitS * perStep;
  }
  if (comm.present) {
    const CompressionStats& cs = comm.stats;
    j["compression"] = comm.reducer;
    j["comm_bytes_before"] = static_cast<double>(cs.bytesBefore) * perStep;
    j["comm_bytes_after"] = static_cast<double>(cs.bytesAfter) * perStep;
    j["compression_s"] = cs.seconds * perStep;
  }
}

}  // namespace

void RunReporter::interval(const IntervalReport& r, Parallelism& parallelism) {
  // The step's loss over the global batch (every rank's rows), as a single process would report.
  const LossStats global = sumOverRanks(world_, r.local);
  // Every rank's figures in one all-gather: compute time per step (the straggler report), and for
  // the Prometheus endpoint the gradient wait, data wait and device allocator bytes.
  const int W = world_.size();
  const AllocatorStats as = allocatorFor(r.device).stats();
  const double figures[kRankColumns] = {r.computePerStep,
                                        r.commWaitPerStep,
                                        r.seconds > 0 ? r.waitSeconds / r.seconds : 0.0,
                                        static_cast<double>(as.allocatedBytes),
                                        static_cast<double>(as.reservedBytes),
                                        static_cast<double>(as.peakAllocatedBytes)};
  Tensor mine = Tensor::empty({kRankColumns}, DType::kF64), all = Tensor::empty({kRankColumns * W}, DType::kF64);
  std::copy(figures, figures + kRankColumns, mine.data<double>());
  world_.allGather(mine, all)->wait(world_.timeout());
  const CommReport comm = parallelism.takeCommReport();
  if (world_.rank() != 0) return;
  std::vector<double> ct(static_cast<size_t>(W));
  for (int k = 0; k < W; ++k) ct[static_cast<size_t>(k)] = all.data<double>()[kRankColumns * k];
  const int slowest = static_cast<int>(std::max_element(ct.begin(), ct.end()) - ct.begin());
  const double fastest = *std::min_element(ct.begin(), ct.end());
  const double spread = fastest > 0 ? ct[static_cast<size_t>(slowest)] / fastest - 1.0 : 0.0;
  const Progress p = progressOf(r, global, W);
  MT_LOG_INFO << task_.progressLine(p) << progressExtras(r, comm, W, slowest, spread);
  nlohmann::json j = {{"type", "step"},
                      {"step", p.step},
                      {"epoch", r.position.epoch},
                      {"loss", p.loss},
                      {"accuracy", p.accuracy},
                      {"lr", p.lr},
                      {"samples_per_s", p.samplesPerS},
                      {"step_time_s", p.stepSeconds},
                      {"data_wait_s", r.steps > 0 ? r.waitSeconds / static_cast<double>(r.steps) : 0.0},
                      {"time", wallMicros() / 1e6}};
  task_.addStepFields(p, j);
  addStepRecordFields(j, r, comm, as, ct, slowest, spread);
  metrics_.write(j);
  if (prometheus_) prometheus_->interval(prometheusFigures(r, p, j, all.data<double>(), slowest, fastest));
}

// What the Prometheus endpoint shows of an interval: the progress figures, the task's own (tokens,
// MFU) from the step record, and every rank's gathered columns.
IntervalFigures RunReporter::prometheusFigures(const IntervalReport& r, const Progress& p, const nlohmann::json& j,
                                               const double* gathered, int slowest, double fastest) const {
  IntervalFigures f;
  f.step = p.step;
  f.totalSteps = r.totalSteps;
  f.epoch = r.position.epoch;
  f.seconds = r.seconds;
  f.loss = p.loss;
  f.accuracy = p.accuracy;
  f.lr = p.lr;
  f.samplesPerS = p.samplesPerS;
  f.lossScale = r.lossScale > 0 ? r.lossScale : -1.0;
  f.skippedSteps = r.skippedSteps;
  f.stepSeconds = p.stepSeconds;
  if (j.contains("tokens_per_s")) f.tokensPerS = j["tokens_per_s"].get<double>();
  if (j.contains("mfu")) f.mfu = j["mfu"].get<double>();
  for (int k = 0; k < world_.size(); ++k) {
    const double* c = gathered + kRankColumns * k;
    f.ranks.push_back({c[0], c[1], c[2], c[3], c[4], c[5]});
  }
  f.stragglerRank = slowest;
  f.stragglerLagS = f.ranks[static_cast<size_t>(slowest)].computeS - fastest;
  f.stragglerLagRatio = fastest > 0 ? f.ranks[static_cast<size_t>(slowest)].computeS / fastest - 1.0 : 0.0;
  return f;
}

void RunReporter::memory(int64_t step, const MemoryAccount& m, const std::string& strategy, int64_t numParams) {
  const int W = world_.size();
  constexpr int kCols = 7;
  Tensor mine = Tensor::empty({kCols}, DType::kI64), all = Tensor::empty({kCols * W}, DType::kI64);
  const int64_t v[kCols] = {m.paramBytes,          m.gradBytes,         m.optimizerBytes, m.gatheredPeakBytes,
                            m.activationPeakBytes, m.devicePeakBytes, m.hostBytes};
  std::copy(v, v + kCols, mine.data<int64_t>());
  world_.allGather(mine, all)->wait(world_.timeout());
  if (world_.rank() != 0) return;
  nlohmann::json j = {{"type", "memory"}, {"step", step}, {"strategy", strategy}, {"parameters", numParams}};
  // host_bytes: the part of param/grad/optimizer bytes in host memory (sharding.offload = cpu).
  const char* names[kCols] = {"param_bytes",           "grad_bytes",           "optimizer_bytes", "gathered_peak_bytes",
                              "activation_peak_bytes", "allocator_peak_bytes", "host_bytes"};
  for (int k = 0; k < kCols; ++k) {
    nlohmann::json col = nlohmann::json::array();
    for (int r = 0; r < W; ++r) col.push_back(all.data<int64_t>()[kCols * r + k]);
    j[names[k]] = col;
  }
  metrics_.write(j);
  MT_LOG_INFO << "memory per rank (rank 0, " << strategy << "): params " << formatBytes(m.paramBytes) << ", grads "
              << formatBytes(m.gradBytes) << ", optimizer " << formatBytes(m.optimizerBytes) << " (persistent "
              << formatBytes(m.persistent()) << " = "
              << static_cast<double>(m.persistent()) / static_cast<double>(numParams) << " bytes/parameter"
              << (m.hostBytes > 0 ? ", " + formatBytes(m.hostBytes) + " of it in host memory" : std::string())
              << "), gathered peak " << formatBytes(m.gatheredPeakBytes) << ", activations peak "
              << formatBytes(m.activationPeakBytes) << ", allocator peak " << formatBytes(m.devicePeakBytes);
}

void RunReporter::evaluation(int64_t step, const EvalResult& e) {
  if (world_.rank() != 0) return;
  MT_LOG_INFO << "eval step " << step << ": test_loss " << e.loss << " test_accuracy " << e.accuracy << " ("
              << e.count << " examples)";
  metrics_.write({{"type", "eval"}, {"step", step}, {"test_loss", e.loss}, {"test_accuracy", e.accuracy},
                  {"count", e.count}});
  if (prometheus_) prometheus_->evaluation(step, e.loss, e.accuracy);
}

void RunReporter::resumed(int64_t step) {
  if (world_.rank() != 0) return;
  const MetricsRepair rep = metrics_.repairForResume(step);
  if (rep.tornLines > 0)
    MT_LOG_WARN << "metrics.jsonl: dropped " << rep.tornLines
                << " torn line(s) (a write cut short by a kill)";
  if (rep.redoneRecords > 0)
    MT_LOG_INFO << "metrics.jsonl: dropped " << rep.redoneRecords << " record(s) of steps after " << step
                << ", trained again now";
  metrics_.write({{"type", "resume"},
                  {"step", step},
                  {"dropped_records", rep.redoneRecords},
                  {"torn_lines", rep.tornLines},
                  {"time", wallMicros() / 1e6}});
  if (prometheus_) prometheus_->resumed(step, rep.resumeRecords + 1);
}

void RunReporter::preempted(int64_t step, int64_t totalSteps, const std::string& runDir) {
  if (world_.rank() != 0) return;
  std::printf("preempted at step %lld of %lld; resume with the same command\n", static_cast<long long>(step),
              static_cast<long long>(totalSteps));
  std::fflush(stdout);
  metrics_.write({{"type", "preempted"}, {"step", step}});
  // For job scripts: this run stopped early on a signal and can be resumed (requeued).
  std::ofstream marker(runDir + "/PREEMPTED");
  marker << step << "\n";
  marker.close();
  if (!marker) markerError_ = "writing " + runDir + "/PREEMPTED failed (job scripts requeue on it)";
}

void RunReporter::diverged(int64_t step, const std::string& why, const std::string& checkpointDir) {
  if (world_.rank() != 0) return;
  // Checkpoint directories are step_<zero-padded step>: the greatest name is the newest.
  std::string newest;
  std::error_code ec;
  for (fs::directory_iterator it(checkpointDir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind("step_", 0) == 0 && n.find(".tmp-") == std::string::npos && n > newest) newest = n;
  }
  MT_LOG_ERROR
      << "error: training diverged: " << why << "; stopped after step " << step
      << " without checkpointing these weights; "
      << (newest.empty() ? "no checkpoint was written before it"
                         : "the newest checkpoint is " + checkpointDir + "/" + newest)
      << " (exit " << static_cast<int>(ExitCode::kDiverged)
      << "). Lower optim.lr, set train.grad_clip or warm up longer (schedule.warmup_steps), then resume";
  metrics_.write(
      {{"type", "diverged"},
       {"step", step},
       {"reason", why},
       {"checkpoint", newest.empty() ? nlohmann::json() : nlohmann::json(checkpointDir + "/" + newest)}});
}

void RunReporter::finished(int64_t totalSteps, int64_t stepsTrained, double wallSeconds, const EvalResult& e) {
  if (world_.rank() != 0) return;
  MT_LOG_INFO << "trained " << stepsTrained << " steps in " << formatDuration(wallSeconds);
  if (e.stopped) {  // the model is trained and saved; its test figures were not finished
    std::printf("final evaluation stopped by a signal: training finished, its test figures were not computed\n");
    std::fflush(stdout);
    metrics_.write({{"type", "final"}, {"steps", totalSteps}, {"evaluation", "stopped"}, {"wall_s", wallSeconds}});
    return;
  }
  // Unprefixed, for scripts: the one line a run ends with.
  std::printf("%s\n", task_.finalLine(e).c_str());
  std::fflush(stdout);
  metrics_.write({{"type", "final"}, {"steps", totalSteps}, {"test_loss", e.loss}, {"test_accuracy", e.accuracy},
                  {"wall_s", wallSeconds}});
}

void RunReporter::traceStep(int64_t step, int64_t backwardStartUs, const Parallelism& parallelism,
                            const std::vector<int64_t>& batchIndices) {
  if (!trace_) return;
  nlohmann::json j;
  j["step"] = step;
  j["rank"] = world_.rank();
  j["backward_start_us"] = backwardStartUs;
  j["backward_end_us"] = parallelism.backwardEndUs();
  // Which samples this step trained on (resume tests compare it with an uninterrupted run).
  uint64_t h = 1469598103934665603ull;
  for (int64_t i : batchIndices) h = (h ^ static_cast<uint64_t>(i)) * 1099511628211ull;
  j["batch_hash"] = std::to_string(h);
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : parallelism.bucketTrace())
    buckets.push_back({{"bucket", b.bucket}, {"bytes", b.bytes}, {"ready_us", b.readyUs}, {"started_us", b.startedUs},
                       {"done_us", b.doneUs}, {"inter_started_us", b.interStartedUs},
                       {"inter_done_us", b.interDoneUs}});
  j["buckets"] = buckets;
  *trace_ << j.dump() << '\n';
}

}  // namespace mt
