#include "core/cuda/CudaStream.h"

#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"

namespace mt {

namespace {
thread_local cudaStream_t tCurrent = nullptr;
thread_local bool tCurrentSet = false;
cudaStream_t gDefault = nullptr;  // the active runtime's compute stream (set by CudaRuntime)
}  // namespace

void setDefaultComputeStream(cudaStream_t s) { gDefault = s; }

cudaStream_t currentStream() { return tCurrentSet ? tCurrent : gDefault; }

void setCurrentStream(cudaStream_t s) {
  tCurrent = s;
  tCurrentSet = true;
}

CudaStream::CudaStream() {
  requireThreadDevice(-1, "creating a CUDA stream");
  CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}

CudaStream::CudaStream(int priority) {
  requireThreadDevice(-1, "creating a CUDA stream");
  CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
}

// Before a stream goes, its queued work is finished and the allocator forgets it: blocks that
// recorded it (recordStream) would otherwise record events on a dead handle when they are freed —
// undefined behaviour that crashed test_nccl in cuEventRecord. A thread whose current stream it
// was falls back to the default compute stream.
void CudaStream::release() noexcept {
  if (!s_) return;
  cudaStreamSynchronize(s_);
  if (CudaRuntime* rt = CudaRuntime::active()) rt->allocator().forgetStream(s_);
  if (tCurrentSet && tCurrent == s_) tCurrentSet = false;
  cudaStreamDestroy(s_);
  s_ = nullptr;
}

CudaStream::~CudaStream() { release(); }

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    release();
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

void CudaStream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

CudaEvent::CudaEvent(bool timing) {
  requireThreadDevice(-1, "creating a CUDA event");
  CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (e_) cudaEventDestroy(e_);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (e_) cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

void CudaEvent::record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }

bool CudaEvent::query() const {
  cudaError_t e = cudaEventQuery(e_);
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return true;
}

void CudaEvent::synchronize() const { CUDA_CHECK(cudaEventSynchronize(e_)); }

float CudaEvent::elapsedMs(const CudaEvent& start) const {
  float ms = 0.f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

void streamWaitStream(cudaStream_t waiter, cudaStream_t producer) {
  if (waiter == producer) return;
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(e, producer));
  CUDA_CHECK(cudaStreamWaitEvent(waiter, e, 0));
  CUDA_CHECK(cudaEventDestroy(e));  // safe: destruction is deferred until the event completes
}

}  // namespace mt
