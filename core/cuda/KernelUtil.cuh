#pragma once
// Small helpers shared by the .cu files: launch geometry and block/warp reductions with a fixed
// reduction tree (deterministic for a given launch shape).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaStream.h"

namespace mt::cuda {

inline int gridFor1d(int64_t n, int block = 256) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + block - 1) / block, 65535LL * 16)));
}

#define MT_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__device__ inline float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline double warpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ inline float blockSum(float v, float* shared32) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warpSum(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < warps ? shared32[lane] : 0.f;
  v = warpSum(v);
  return v;
}
__device__ inline float blockMax(float v, float* shared32) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < warps ? shared32[lane] : -INFINITY;
  v = warpMax(v);
  return v;
}

inline void checkLaunch() { CUDA_CHECK(cudaGetLastError()); }

}  // namespace mt::cuda
