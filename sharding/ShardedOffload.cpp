// ZeRO-Offload's data path on a GPU (sharding.offload = cpu, device cuda): the pieces of
// ShardedEngine that move gradient shards down, step on the CPU and move parameters back up.
//
//   backward    unit u's reduce-scatter done -> its device gradient shard (a buffer of its own,
//               ShardUnit's kReduced) copied to pinned host memory on the copy stream and handed
//               back to the caching allocator behind the copy: the GPU holds no gradient shard
//               between steps. Later micro-steps of gradient accumulation land in a pinned stage
//               and are added to the host copy on the training thread (it waits for that copy).
//   step(lr)    returns at once; a worker thread, per unit in forward order: waits for the
//               unit's copy, AdamW/SGD over the unit's segments (core/optim/CpuAdam: OpenMP and
//               AVX-512/AVX2; when gathered in bf16 the same pass writes the bf16 upload stage,
//               the segments' copies), and uploads the unit's parameter shard on the copy stream
//   forward     unit u's all-gather waits for unit u's upload only: the CPU steps the later units
//               while the GPU already runs the first ones
// With sharding.delayed_update (DeepSpeed's DPU) the step's CPU work runs during the whole next
// iteration, whose forward and backward use the parameters one update older: at the next step(),
// the finished update is uploaded and the next one starts. Two host gradient buffers alternate so
// the next iteration's copies never land under the running update.
// The gradient clip's norm: each unit's final gradient shard is summed (squares, f64) on the GPU
// right before its copy down, so clipGradNorm reads n doubles back instead of a pass over the host
// copies, and its factor goes to the CPU step, which multiplies each gradient as it reads it (no
// scaling pass either): ~12 of ~40 bytes a parameter of host traffic less, and the worker starts on
// unit 0 as soon as its copy lands. With accumulation (later micro-steps are added on the host) the
// norm is the host copies' (core/optim), still applied by the step.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "core/Convert.h"
#include "core/Log.h"
#include "core/Threads.h"
#include "core/Timer.h"
#include "core/optim/GradClip.h"
#include "sharding/OffloadQueue.h"
#include "sharding/ShardedEngine.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaOptim.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/CudaStream.h"
#include "core/cuda/DeviceBinding.h"
#endif

namespace mt {

#ifdef MT_WITH_CUDA

struct ShardedEngine::Offload {
  int device = 0;
  CudaStream copy;
  std::vector<CudaEvent> gradDown, paramsUp;
  std::vector<char> gradIssued;     // this iteration's gradient copy issued, per unit
  std::vector<char> paramsSent;     // paramsUp recorded at least once, per unit
  std::vector<Tensor> paramHost;    // pinned paramDtype staging of the upload (bf16 gathers only)
  std::vector<Tensor> gradHost[2];  // pinned host gradient shards (the second only with DPU)
  std::vector<std::pair<size_t, size_t>> unitSegments;  // optimizer segments [first, last) per unit
  CudaEvent gathersDone;  // the current stream after this iteration's gathers: uploads wait for it
  int target = 0;         // the host buffer this iteration's gradient copies land in
  Tensor unitSq;                // device f64 per unit: sum of squares of its final gradient shard
  std::vector<char> sqOnDevice;  // unitSq holds this iteration's final gradient, per unit
  float gradScale = 1.f;         // clipOffloaded's factor for the next job
  // takeOffloadTimes(): written by the worker (atomics), and by the training thread (trainWaitUs).
  std::atomic<int64_t> jobsDone{0}, jobUs{0}, copyWaitUs{0};
  int64_t trainWaitUs = 0;
  // The compute stream's stall on each unit's upload: timing events around its wait, read once
  // they completed (at the interval's report or the unit's next wait; a pair still running then
  // is dropped, which the clip's sync before step() makes rare).
  std::vector<CudaEvent> stallStart, stallEnd;
  std::vector<char> stallPending;
  double gpuWaitMs = 0.0;

  // The worker and its one job at a time.
  OffloadQueue jobs;
  std::thread worker;

  // Also where the engine's constructor throws after starting the worker: a joinable thread must
  // not be destroyed (std::terminate).
  ~Offload() {
    jobs.stop();
    if (worker.joinable()) worker.join();
  }
};

void ShardedEngine::OffloadDeleter::operator()(Offload* o) const noexcept {
  delete o;
}

void ShardedEngine::startOffload() {
  off_.reset(new Offload());
  Offload& o = *off_;
  o.device = CudaRuntime::require().device();
  const size_t n = units_.size();
  o.gradDown = std::vector<CudaEvent>(n);
  o.paramsUp = std::vector<CudaEvent>(n);
  o.gradIssued.assign(n, 0);
  o.paramsSent.assign(n, 0);
  o.sqOnDevice.assign(n, 0);
  for (size_t ui = 0; ui < n; ++ui) {
    o.stallStart.emplace_back(true);
    o.stallEnd.emplace_back(true);
  }
  o.stallPending.assign(n, 0);
  o.unitSq = Tensor::zeros({static_cast<int64_t>(std::max<size_t>(n, 1))}, DType::kF64, device_);
  Allocator& pinned = CudaRuntime::require().pinned();
  for (const auto& u : units_) {
    o.gradHost[0].push_back(u.gradShardHost());  // undefined for a unit kept on the GPU
    if (!u.offload()) {
      if (opt_.delayedUpdate) o.gradHost[1].emplace_back();
      o.paramHost.emplace_back();
      continue;
    }
    if (opt_.delayedUpdate) {
      Tensor t = Tensor::empty({u.shard()}, u.gradShardHost().dtype(), pinned);
      t.zero_();
      o.gradHost[1].push_back(t);
    }
    o.paramHost.push_back(
        opt_.paramDtype == DType::kF32 ? Tensor() : Tensor::empty({u.shard()}, opt_.paramDtype, pinned));
    // The step writes the segments only: the padding stays bf16(0), as in the master.
    if (o.paramHost.back().defined()) o.paramHost.back().zero_();
  }
  shardSegments(o.gradHost[0], &o.unitSegments);  // the optimizer's segments, grouped by unit
  o.worker = std::thread([this] { offloadWorker(); });
}

void ShardedEngine::stopOffload() noexcept {
  if (!off_) return;
  off_->jobs.stop();
  if (off_->worker.joinable()) off_->worker.join();  // finishes a job in flight first
}

void ShardedEngine::uploadParams(int ui) {
  packParams(ui);
  sendParams(ui);
}

void ShardedEngine::packParams(int ui) {
  Offload& o = *off_;
  const ShardUnit& u = units_[static_cast<size_t>(ui)];
  if (u.gatherCopy().dtype() == DType::kF32) return;  // sent from the master shard itself
  if (o.paramsSent[static_cast<size_t>(ui)])
    o.paramsUp[static_cast<size_t>(ui)].synchronize();            // the last upload has read the stage
  convertInto(o.paramHost[static_cast<size_t>(ui)], u.master());  // on the host: half the bytes cross the bus
}

void ShardedEngine::sendParams(int ui) {
  Offload& o = *off_;
  const ShardUnit& u = units_[static_cast<size_t>(ui)];
  const Tensor dst = u.gatherCopy();
  const Tensor src = dst.dtype() == DType::kF32 ? u.master() : o.paramHost[static_cast<size_t>(ui)];
  CUDA_CHECK(
      cudaMemcpyAsync(dst.rawData(), src.rawData(), src.nbytes(), cudaMemcpyHostToDevice, o.copy.get()));
  o.paramsUp[static_cast<size_t>(ui)].record(o.copy.get());
  o.paramsSent[static_cast<size_t>(ui)] = 1;
}

void ShardedEngine::offloadWorker() {
  Offload& o = *off_;
  try {
    bindThreadToDevice(o.device);
  } catch (const Error&) {
    // The first CUDA call of a job reports it.
  }
  // OpenMP's thread count is per thread: the rank's budget, less one core for the training thread,
  // which launches the GPU's kernels meanwhile (with all cores busy here it was descheduled and the
  // GPU idled: the delayed update hid only a third of the CPU step, H200 2026-12-04).
  setNumThreads(std::max(1, numThreads() - 1));
  OffloadJob job;
  while (o.jobs.take(&job)) {
    std::exception_ptr error;
    const int64_t start = wallMicros();
    int64_t copyWait = 0;
    try {
      CUDA_CHECK(cudaStreamWaitEvent(o.copy.get(), o.gathersDone.get(), 0));
      // The step was counted by stepOffloaded (the kept units stepped on the GPU already).
      for (size_t ui = static_cast<size_t>(firstOffloaded_); ui < units_.size(); ++ui) {
        const int64_t t0 = wallMicros();
        o.gradDown[ui].synchronize();
        copyWait += wallMicros() - t0;
        // The unit's last upload has read the master shard (with DPU it was enqueued just before).
        if (o.paramsSent[ui]) o.paramsUp[ui].synchronize();
        const auto [first, last] = o.unitSegments[ui];
        // bf16 gathers: packs the stage in the same pass; the clip factor applied as g is read.
        optimizer_->stepSegments(job.lr, first, last, job.gradScale);
        // Delayed update: sent at the next step() (the training thread only enqueues).
        if (job.upload) sendParams(static_cast<int>(ui));
        o.jobs.unitsDone(ui + 1);
      }
    } catch (...) {
      error = std::current_exception();
    }
    // Before finish(): a settle() that returns sees this job's times.
    o.jobUs.fetch_add(wallMicros() - start, std::memory_order_relaxed);
    o.copyWaitUs.fetch_add(copyWait, std::memory_order_relaxed);
    o.jobsDone.fetch_add(1, std::memory_order_release);
    o.jobs.finish(error);
  }
}

void ShardedEngine::settle() {
  if (off_) off_->jobs.settle();
}

void ShardedEngine::awaitParams(int ui) {
  if (!off_ || ui < firstOffloaded_) return;  // a kept unit's update is on the compute stream
  Offload& o = *off_;
  const int64_t t0 = wallMicros();
  o.jobs.awaitUnit(static_cast<size_t>(ui));
  o.trainWaitUs += wallMicros() - t0;
  const size_t u = static_cast<size_t>(ui);
  if (!o.paramsSent[u]) return;
  foldStall(u);
  o.stallStart[u].record(currentStream());
  CUDA_CHECK(cudaStreamWaitEvent(currentStream(), o.paramsUp[u].get(), 0));
  o.stallEnd[u].record(currentStream());
  o.stallPending[u] = 1;
}

void ShardedEngine::foldStall(size_t u) {
  Offload& o = *off_;
  if (!o.stallPending[u] || !o.stallEnd[u].query()) return;  // not recorded, or (rarely) still running: dropped
  o.gpuWaitMs += static_cast<double>(o.stallEnd[u].elapsedMs(o.stallStart[u]));
  o.stallPending[u] = 0;
}

Tensor& ShardedEngine::gradTarget(int ui) {
  return off_->gradHost[off_->target][static_cast<size_t>(ui)];
}

ShardUnit::GradSink ShardedEngine::gradSink(int ui) {
  if (!off_) return hostGradSink(ui);
  return [this, ui](const Tensor& shard, bool accumulate) {
    Offload& o = *off_;
    const size_t u = static_cast<size_t>(ui);
    // The shard is final on the current stream (its reduction and replica all-reduce waited for
    // there): the copy stream starts after it.
    streamWaitStream(o.copy.get(), currentStream());
    Tensor& dst = gradTarget(ui);
    if (!accumulate) {
      CUDA_CHECK(cudaMemcpyAsync(dst.rawData(), shard.rawData(), shard.nbytes(), cudaMemcpyDeviceToHost,
                                 o.copy.get()));
      o.gradDown[u].record(o.copy.get());
      o.gradIssued[u] = 1;
      if (opt_.deviceNorms) {
        cuda::sumOfSquaresInto(shard, o.unitSq.data<double>() + u);  // the clip's norm, on the GPU
        o.sqOnDevice[u] = 1;
      }
    } else {
      o.sqOnDevice[u] = 0;  // the host adds this micro-step: the norm is the host copy's
      // A later micro-step: down into a pinned stage, then added on the host (the copy stream is
      // in order, so the first micro-step's copy into dst is done too).
      Tensor stage = Tensor::empty({shard.numel()}, shard.dtype(), CudaRuntime::require().pinned());
      CUDA_CHECK(cudaMemcpyAsync(stage.rawData(), shard.rawData(), shard.nbytes(), cudaMemcpyDeviceToHost,
                                 o.copy.get()));
      o.copy.synchronize();
      addShardInto(dst, stage);
    }
    // The unit drops the shard now: its block is not reused before the copy stream is past it.
    CudaRuntime::require().allocator().recordStream(shard.rawData(), o.copy.get());
  };
}

void ShardedEngine::settleHostGrads() {
  settle();
  if (!off_) return;
  for (size_t ui = 0; ui < units_.size(); ++ui)
    if (off_->gradIssued[ui]) off_->gradDown[ui].synchronize();
  bindHostGrads(off_->target);
}

void ShardedEngine::bindHostGrads(int buffer) {
  std::vector<OptimSegment> segs = shardSegments(off_->gradHost[buffer]);
  // bf16 gathers: each segment's copy is its place in the unit's upload stage, so the CPU step
  // packs the stage in its own pass (no second pass over the master shard).
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    const Tensor& stage = off_->paramHost[ui];
    if (!stage.defined()) continue;
    const float* master = units_[ui].master().data<float>();
    for (size_t k = off_->unitSegments[ui].first; k < off_->unitSegments[ui].second; ++k)
      segs[k].copy = stage.flatSlice(segs[k].value.data<float>() - master, segs[k].value.numel());
  }
  optimizer_->rebind(std::move(segs));
}

double ShardedEngine::clipOffloaded(float maxNorm) {
  Offload& o = *off_;
  double sq = 0.0;
  const auto first = o.sqOnDevice.begin() + firstOffloaded_;
  const std::vector<OptimSegment> kept = keptSegments();
  if (std::all_of(first, o.sqOnDevice.end(), [](char c) { return c != 0; })) {
    // The kept units' gradient shards are on the device: summed there (partial offload).
    if (!kept.empty()) sq += sumOfSquares(kept);
    std::vector<double> perUnit(units_.size());
    CUDA_CHECK(cudaMemcpyAsync(perUnit.data(), o.unitSq.rawData(), perUnit.size() * sizeof(double),
                               cudaMemcpyDeviceToHost, currentStream()));
    CUDA_CHECK(cudaStreamSynchronize(currentStream()));
    for (size_t u = static_cast<size_t>(firstOffloaded_); u < perUnit.size(); ++u)
      sq += perUnit[u];  // unit order: the same sum on every run
  } else {
    settleHostGrads();  // accumulated on the host: the norm is the host copies'
    sq = sumOfSquares(optimizer_->segments());
  }
  // Shards are disjoint over the shard group; replicas hold copies, so they are not added.
  sq = shardComm_.allReduceScalar(sq, ReduceOp::kSum);
  const double norm = std::sqrt(sq);
  o.gradScale = clipFactor(norm, maxNorm);  // applied by the CPU step (stepOffloaded), not in place
  // The device optimizer takes no scale: the kept units' gradients are scaled where they are.
  if (o.gradScale != 1.f && !kept.empty()) scaleGrads(kept, o.gradScale);
  return norm;
}

void ShardedEngine::forgetDeviceNorms() {
  std::fill(off_->sqOnDevice.begin(), off_->sqOnDevice.end(), 0);
}

void ShardedEngine::stepOffloaded(float lr) {
  Offload& o = *off_;
  const int64_t t0 = wallMicros();
  settle();  // the previous update is done (with DPU: it ran during this iteration)
  o.trainWaitUs += wallMicros() - t0;
  o.gathersDone.record(currentStream());
  if (opt_.delayedUpdate) {
    CUDA_CHECK(cudaStreamWaitEvent(o.copy.get(), o.gathersDone.get(), 0));
    if (optimizer_->stepCount() > 0)
      for (size_t ui = static_cast<size_t>(firstOffloaded_); ui < units_.size(); ++ui)
        sendParams(static_cast<int>(ui));  // packed by the worker after its update
  }
  bindHostGrads(o.target);
  // The step is counted here, with the worker idle; the units kept on the GPU step now, on the
  // compute stream, ahead of the next forward that reads them (never delayed: it is milliseconds).
  optimizer_->beginStep();
  if (keptSegments_ > 0) {
    optimizer_->stepSegments(lr, 0, keptSegments_);
    for (int u = 0; u < firstOffloaded_; ++u) units_[static_cast<size_t>(u)].refreshGatherCopy();
  }
  OffloadJob job;
  job.lr = lr;
  job.upload = !opt_.delayedUpdate;
  job.gradScale = o.gradScale;
  o.gradScale = 1.f;
  o.jobs.submit(job);
  std::fill(o.gradIssued.begin(), o.gradIssued.end(), 0);
  std::fill(o.sqOnDevice.begin(), o.sqOnDevice.end(), 0);
  if (opt_.delayedUpdate) o.target ^= 1;  // the next iteration's copies go to the other buffer
}

OffloadTimes ShardedEngine::takeOffloadTimes() {
  OffloadTimes t;
  if (!off_) return t;
  Offload& o = *off_;
  t.jobs = o.jobsDone.exchange(0, std::memory_order_acquire);
  t.jobS = 1e-6 * static_cast<double>(o.jobUs.exchange(0, std::memory_order_relaxed));
  t.copyWaitS = 1e-6 * static_cast<double>(o.copyWaitUs.exchange(0, std::memory_order_relaxed));
  t.trainWaitS = 1e-6 * static_cast<double>(o.trainWaitUs);
  o.trainWaitUs = 0;
  for (size_t u = 0; u < units_.size(); ++u) foldStall(u);
  t.gpuWaitS = 1e-3 * o.gpuWaitMs;
  o.gpuWaitMs = 0.0;
  return t;
}

void ShardedEngine::uploadAllParams() {
  settle();
  for (size_t ui = static_cast<size_t>(firstOffloaded_); ui < units_.size(); ++ui)
    uploadParams(static_cast<int>(ui));
  off_->copy.synchronize();
}

#else  // no CUDA: offload keeps the synchronous host path of ShardedEngine.cpp

struct ShardedEngine::Offload {};
void ShardedEngine::OffloadDeleter::operator()(Offload* o) const noexcept {
  delete o;
}
void ShardedEngine::startOffload() {}
void ShardedEngine::stopOffload() noexcept {}
void ShardedEngine::settle() {}
void ShardedEngine::awaitParams(int) {}
ShardUnit::GradSink ShardedEngine::gradSink(int ui) {
  return hostGradSink(ui);
}
void ShardedEngine::settleHostGrads() {}
void ShardedEngine::forgetDeviceNorms() {}
double ShardedEngine::clipOffloaded(float) {
  return 0.0;
}
void ShardedEngine::stepOffloaded(float) {}
void ShardedEngine::uploadAllParams() {}
OffloadTimes ShardedEngine::takeOffloadTimes() {
  return {};
}

#endif

}  // namespace mt
