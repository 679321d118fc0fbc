// ZeRO-Offload's data path on a GPU (sharding.offload = cpu, device cuda): the pieces of
// ShardedEngine that move gradient shards down, step on the CPU and move parameters back up.
//
//   backward    unit u's reduce-scatter done -> its gradient shard copied to pinned host memory
//               on the copy stream (during backward when nothing changes the shard afterwards:
//               one micro-step, no replica all-reduce; else right after finishBackward)
//   step(lr)    returns at once; a worker thread, per unit in forward order: waits for the
//               unit's copy, scales by the clip factor, AdamW/SGD over the unit's segments
//               (OpenMP and SIMD inside), and uploads the unit's parameter shard (packed to bf16
//               on the host when gathered in bf16) on the copy stream
//   forward     unit u's all-gather waits for unit u's upload only: the CPU steps the later units
//               while the GPU already runs the first ones
// With sharding.delayed_update (DeepSpeed's DPU) the step's CPU work runs during the whole next
// iteration, whose forward and backward use the parameters one update older: at the next step(),
// the finished update is uploaded and the next one starts. Two host gradient buffers alternate so
// the next iteration's copies never land under the running update.
// The gradient clip's norm comes from the device shards (no host pass) unless something read the
// host gradients first (the f16 loss scaler's unscale), then the host path of core/optim.

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/Convert.h"
#include "core/Log.h"
#include "core/Threads.h"
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
  CudaEvent gathersDone;     // the current stream after this iteration's gathers: uploads wait for it
  int target = 0;            // the host buffer this iteration's gradient copies land in
  bool hostTouched = false;  // host gradients read or changed since backward (loss scaler)
  float clip = 1.f;          // deferred clip factor for the next job

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
  Allocator& pinned = CudaRuntime::require().pinned();
  for (const auto& u : units_) {
    o.gradHost[0].push_back(u.gradShardHost());
    if (opt_.delayedUpdate) {
      Tensor t = Tensor::empty({u.shard()}, u.gradShardHost().dtype(), pinned);
      t.zero_();
      o.gradHost[1].push_back(t);
    }
    o.paramHost.push_back(
        opt_.paramDtype == DType::kF32 ? Tensor() : Tensor::empty({u.shard()}, opt_.paramDtype, pinned));
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
    o.paramsUp[static_cast<size_t>(ui)].synchronize();  // the last upload has read the stage
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
    try {
      CUDA_CHECK(cudaStreamWaitEvent(o.copy.get(), o.gathersDone.get(), 0));
      optimizer_->beginStep();
      const auto& segs = optimizer_->segments();
      for (size_t ui = 0; ui < units_.size(); ++ui) {
        o.gradDown[ui].synchronize();
        // The unit's last upload has read the master shard (with DPU it was enqueued just before).
        if (o.paramsSent[ui]) o.paramsUp[ui].synchronize();
        const auto [first, last] = o.unitSegments[ui];
        if (job.clip != 1.f && first < last)
          scaleGrads(std::vector<OptimSegment>(segs.begin() + static_cast<std::ptrdiff_t>(first),
                                               segs.begin() + static_cast<std::ptrdiff_t>(last)),
                     job.clip);
        optimizer_->stepSegments(job.lr, first, last);
        // Delayed update: packed now, sent at the next step() (the training thread only enqueues).
        if (job.upload)
          uploadParams(static_cast<int>(ui));
        else
          packParams(static_cast<int>(ui));
        o.jobs.unitsDone(ui + 1);
      }
    } catch (...) {
      error = std::current_exception();
    }
    o.jobs.finish(error);
  }
}

void ShardedEngine::settle() {
  if (off_) off_->jobs.settle();
}

void ShardedEngine::awaitParams(int ui) {
  if (!off_) return;
  Offload& o = *off_;
  o.jobs.awaitUnit(static_cast<size_t>(ui));
  if (o.paramsSent[static_cast<size_t>(ui)])
    CUDA_CHECK(cudaStreamWaitEvent(currentStream(), o.paramsUp[static_cast<size_t>(ui)].get(), 0));
}

Tensor& ShardedEngine::gradTarget(int ui) {
  return off_->gradHost[off_->target][static_cast<size_t>(ui)];
}

void ShardedEngine::copyGradDown(int ui) {
  Offload& o = *off_;
  if (o.gradIssued[static_cast<size_t>(ui)]) return;
  const Tensor shard = units_[static_cast<size_t>(ui)].gradShard();
  // The shard is final on the current stream (its reduction waited, accumulation and replica
  // all-reduce enqueued there): the copy stream starts after it.
  streamWaitStream(o.copy.get(), currentStream());
  Tensor& dst = gradTarget(ui);
  CUDA_CHECK(
      cudaMemcpyAsync(dst.rawData(), shard.rawData(), shard.nbytes(), cudaMemcpyDeviceToHost, o.copy.get()));
  o.gradDown[static_cast<size_t>(ui)].record(o.copy.get());
  o.gradIssued[static_cast<size_t>(ui)] = 1;
}

void ShardedEngine::copyReadyGradsDown() {
  // During backward only where nothing changes a shard after its reduce-scatter.
  if (!off_ || microSteps_ > 1 || replicaComm_) return;
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    ShardUnit& u = units_[ui];
    if (off_->gradIssued[ui] || !u.reduceCompleted()) continue;
    // Done: the wait returns at once (and orders the stream on NCCL); one micro-step, no replica.
    u.finishReduce(shardComm_, nullptr, false, true);
    copyGradDown(static_cast<int>(ui));
  }
}

void ShardedEngine::finishOffloadBackward() {
  for (size_t ui = 0; ui < units_.size(); ++ui)
    copyGradDown(static_cast<int>(ui));
  off_->hostTouched = false;
  off_->clip = 1.f;
}

void ShardedEngine::settleHostGrads() {
  settle();
  if (!off_) return;
  for (size_t ui = 0; ui < units_.size(); ++ui)
    if (off_->gradIssued[ui]) off_->gradDown[ui].synchronize();
  bindHostGrads(off_->target);
  off_->hostTouched = true;
}

void ShardedEngine::bindHostGrads(int buffer) { optimizer_->rebind(shardSegments(off_->gradHost[buffer])); }

double ShardedEngine::clipOffloaded(float maxNorm) {
  if (off_->hostTouched) {  // the host gradients are the ones to clip (unscaled there)
    settleHostGrads();
    return mt::clipGradNorm(optimizer_->segments(), maxNorm,
                            [this](double s) { return shardComm_.allReduceScalar(s, ReduceOp::kSum); });
  }
  double local = 0.0;
  for (const auto& u : units_)
    local += cuda::sumOfSquares(u.gradShard());  // padding is zero
  const double norm = std::sqrt(shardComm_.allReduceScalar(local, ReduceOp::kSum));
  off_->clip = clipFactor(norm, maxNorm);
  return norm;
}

void ShardedEngine::stepOffloaded(float lr) {
  Offload& o = *off_;
  settle();  // the previous update is done (with DPU: it ran during this iteration)
  o.gathersDone.record(currentStream());
  if (opt_.delayedUpdate) {
    CUDA_CHECK(cudaStreamWaitEvent(o.copy.get(), o.gathersDone.get(), 0));
    if (optimizer_->stepCount() > 0)
      for (size_t ui = 0; ui < units_.size(); ++ui)
        sendParams(static_cast<int>(ui));  // packed by the worker after its update
  }
  bindHostGrads(o.target);
  OffloadJob job;
  job.lr = lr;
  job.clip = o.clip;
  job.upload = !opt_.delayedUpdate;
  o.jobs.submit(job);
  std::fill(o.gradIssued.begin(), o.gradIssued.end(), 0);
  if (opt_.delayedUpdate) o.target ^= 1;  // the next iteration's copies go to the other buffer
}

void ShardedEngine::uploadAllParams() {
  settle();
  for (size_t ui = 0; ui < units_.size(); ++ui)
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
void ShardedEngine::copyReadyGradsDown() {}
void ShardedEngine::finishOffloadBackward() {}
void ShardedEngine::settleHostGrads() {}
double ShardedEngine::clipOffloaded(float) {
  return 0.0;
}
void ShardedEngine::stepOffloaded(float) {}
void ShardedEngine::uploadAllParams() {}

#endif

}  // namespace mt
