#pragma once
// Move-only owners of CUDA streams and events, and the per-thread "current stream" that kernels
// launch on (like PyTorch's). The current stream defaults to the active CudaRuntime's compute
// stream; StreamGuard switches it for a scope (the loader's copy stream, a comm stream).

#include <cuda_runtime.h>

namespace mt {

class CudaStream {
 public:
  CudaStream();  // non-blocking w.r.t. the legacy default stream
  explicit CudaStream(int priority);
  ~CudaStream();
  CudaStream(CudaStream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  void release() noexcept;
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(CudaEvent&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s);
  bool query() const;  // completed?
  void synchronize() const;
  float elapsedMs(const CudaEvent& start) const;  // this - start, both timing events

 private:
  cudaEvent_t e_ = nullptr;
};

cudaStream_t currentStream();
// The stream kernels use on threads that set none (the runtime's compute stream).
void setDefaultComputeStream(cudaStream_t s);
void setCurrentStream(cudaStream_t s);

class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t s) : prev_(currentStream()) { setCurrentStream(s); }
  ~StreamGuard() { setCurrentStream(prev_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t prev_;
};

// Makes `waiter` wait (on the device, no host sync) for everything issued to `producer` so far.
void streamWaitStream(cudaStream_t waiter, cudaStream_t producer);

}  // namespace mt
