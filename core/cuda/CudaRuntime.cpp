#include "core/cuda/CudaRuntime.h"

#include <cuda_profiler_api.h>

#include <atomic>

#include "core/cuda/CudaCheck.h"
#include "core/cuda/DeviceBinding.h"

namespace mt {

namespace {
std::atomic<CudaRuntime*> gActive{nullptr};

// The constructing thread binds to the device before the members that allocate, so it runs in
// this helper.
int selectDevice(int device) {
  bindThreadToDevice(device);
  return device;
}
}  // namespace

CudaRuntime::CudaRuntime(int device)
    : device_(selectDevice(device)),
      deviceAlloc_(std::make_unique<CachingDeviceAllocator>(device)),
      pinned_(std::make_unique<PinnedHostAllocator>()),
      managed_(std::make_unique<ManagedAllocator>(ManagedBacking{device})) {
  MT_CHECK(gActive.load() == nullptr, "a CudaRuntime already exists in this process");
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  name_ = prop.name;
  smCount_ = prop.multiProcessorCount;
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUDNN_CHECK(cudnnCreate(&cudnn_));
  registerDeviceAllocator(device, deviceAlloc_.get());
  setDefaultComputeStream(compute_.get());
  gActive = this;
}

CudaRuntime::~CudaRuntime() {
  cudaStreamSynchronize(compute_.get());
  components_.clear();  // plans made with the handles below
  workspace_ = Tensor();
  gActive = nullptr;
  setDefaultComputeStream(nullptr);
  registerDeviceAllocator(device_, nullptr);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (lt_) cublasLtDestroy(lt_);
}

CudaRuntime* CudaRuntime::active() { return gActive.load(); }

CudaRuntime& CudaRuntime::require() {
  CudaRuntime* r = gActive.load();
  if (!r) throw InternalError("CUDA tensor operation without a CudaRuntime");
  return *r;
}

cudnnHandle_t CudaRuntime::cudnn() {
  CUDNN_CHECK(cudnnSetStream(cudnn_, currentStream()));
  return cudnn_;
}

void* CudaRuntime::workspace(size_t bytes) {
  if (bytes > workspaceBytes_) {
    // The old buffer returns to the pool in stream order, so kernels still using it are safe.
    workspace_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, *deviceAlloc_);
    workspaceBytes_ = bytes;
  }
  return workspace_.rawData();
}

void CudaRuntime::synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

void CudaRuntime::profilerRange(bool on) {
  if (on) {
    CUDA_CHECK(cudaProfilerStart());
    return;
  }
  synchronize();
  CUDA_CHECK(cudaProfilerStop());
}

}  // namespace mt
