// Row and token-window gathers for the device-resident data feed.

#include "data/kernels/CudaGather.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

// One block per row; 4-byte words when the row allows it (784-byte MNIST rows do).
__global__ void gatherRowsKernel(char* dst, const char* src, const int64_t* idx, int64_t rowBytes) {
  const int64_t b = blockIdx.x;
  const char* s = src + idx[b] * rowBytes;
  char* d = dst + b * rowBytes;
  if (rowBytes % 4 == 0) {
    for (int64_t i = threadIdx.x; i < rowBytes / 4; i += blockDim.x)
      reinterpret_cast<uint32_t*>(d)[i] = reinterpret_cast<const uint32_t*>(s)[i];
  } else {
    for (int64_t i = threadIdx.x; i < rowBytes; i += blockDim.x) d[i] = s[i];
  }
}

__global__ void gatherWindowsKernel(int32_t* inputs, int64_t* targets, const int32_t* tokens, const int64_t* idx,
                                    int64_t T) {
  const int64_t b = blockIdx.x;
  const int32_t* w = tokens + idx[b] * T;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    inputs[b * T + t] = w[t];
    targets[b * T + t] = w[t + 1];
  }
}

}  // namespace

void gatherRows(void* dst, const void* src, const int64_t* idx, int64_t B, int64_t rowBytes) {
  if (B == 0) return;
  gatherRowsKernel<<<static_cast<unsigned>(B), 256, 0, currentStream()>>>(static_cast<char*>(dst),
                                                                         static_cast<const char*>(src), idx, rowBytes);
  checkLaunch();
}

void gatherTokenWindows(int32_t* inputs, int64_t* targets, const int32_t* tokens, const int64_t* idx, int64_t B,
                        int64_t T) {
  if (B == 0) return;
  gatherWindowsKernel<<<static_cast<unsigned>(B), 256, 0, currentStream()>>>(inputs, targets, tokens, idx, T);
  checkLaunch();
}

}  // namespace mt::cuda
