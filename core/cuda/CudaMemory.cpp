#include "core/cuda/CudaMemory.h"

#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaStream.h"

namespace mt {

void cudaCopyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes) {
  cudaStream_t s = currentStream();
  const bool touchesHost = dstDevice.isCpu() || srcDevice.isCpu();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  if (touchesHost) CUDA_CHECK(cudaStreamSynchronize(s));
}

void cudaZeroBytes(void* dst, Device, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, currentStream())); }

int cudaDeviceCountOrZero() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace mt
