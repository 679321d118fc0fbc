#pragma once
// Everything one process needs to compute on one GPU, owned in one place: the caching device
// allocator, pinned and managed host allocators, the compute stream, the cuBLASLt and cuDNN
// handles and their workspace, and the library plan caches of the code above (components()). Constructing it selects the device, registers its allocator for
// Tensor::empty(..., Device::cuda(i)) and makes its compute stream the default current stream;
// destroying it undoes that. One per process, created by launch/ (or a test), passed or found
// through active() — a non-owning pointer, not a singleton that owns GPU state.

#include <cublasLt.h>
#include <cudnn.h>

#include <memory>
#include <string>

#include "core/ComponentSet.h"
#include "core/Tensor.h"
#include "core/cuda/CudaAllocator.h"
#include "core/cuda/CudaStream.h"

namespace mt {

enum class MatmulPrecision { kF32, kBF16, kF16 };

class CudaRuntime {
 public:
  explicit CudaRuntime(int device);
  ~CudaRuntime();
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;

  static CudaRuntime* active();  // the live runtime, or nullptr
  static CudaRuntime& require();  // throws when there is none

  int device() const { return device_; }
  Device dev() const { return Device::cuda(device_); }
  const std::string& deviceName() const { return name_; }
  int smCount() const { return smCount_; }
  CachingDeviceAllocator& allocator() { return *deviceAlloc_; }
  PinnedHostAllocator& pinned() { return *pinned_; }
  ManagedAllocator& managed() { return *managed_; }
  cudaStream_t computeStream() const { return compute_.get(); }
  cublasLtHandle_t cublasLt() const { return lt_; }
  cudnnHandle_t cudnn();  // bound to the current stream on every call
  // A scratch buffer for library workspaces, grown on demand (stream-ordered reuse).
  void* workspace(size_t bytes);
  size_t workspaceBytes() const { return workspaceBytes_; }

  // Per-runtime state of higher layers (models/kernels' GEMM and convolution plans), destroyed
  // first when the runtime goes, while its handles still exist.
  ComponentSet& components() { return components_; }

  // Precision of GEMM/convolution inputs: f32 (exact FP32), bf16 or f16 (f32 accumulate).
  void setMatmulPrecision(MatmulPrecision p) { precision_ = p; }
  MatmulPrecision matmulPrecision() const { return precision_; }
  void synchronize();
  // The CUDA profiler's capture range (cudaProfilerStart / Stop): what `nsys profile
  // --capture-range=cudaProfilerApi` and `ncu --profile-from-start off` record. Stop synchronizes
  // first, so the range holds the work launched inside it.
  void profilerRange(bool on);

 private:
  int device_;
  std::string name_;
  int smCount_ = 0;
  std::unique_ptr<CachingDeviceAllocator> deviceAlloc_;
  std::unique_ptr<PinnedHostAllocator> pinned_;
  std::unique_ptr<ManagedAllocator> managed_;
  CudaStream compute_;
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  Tensor workspace_;
  size_t workspaceBytes_ = 0;
  MatmulPrecision precision_ = MatmulPrecision::kF32;
  ComponentSet components_;
};

}  // namespace mt
