// Kernels of the gradient compression hooks: axpy, PowerSGD's Gram-Schmidt and top-k selection
// with a scatter. None uses atomics, so every rank computes bit-identical results from identical
// inputs (data-parallel replicas must not drift apart).

#include <cub/device/device_radix_sort.cuh>

#include "comm/kernels/CudaCompression.h"
#include "core/Tensor.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

__global__ void axpyKernel(float* y, const float* x, float a, int64_t n) {
  MT_GRID_STRIDE(i, n) y[i] += a * x[i];
}

// One block walks the r columns in order (modified Gram-Schmidt, as PyTorch's PowerSGD hook):
// normalise column i, then remove it from columns i+1..r-1. r is small (the PowerSGD rank).
__global__ void gramSchmidtKernel(float* P, int64_t m, int64_t r) {
  __shared__ float shared[32];
  for (int64_t i = 0; i < r; ++i) {
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) ss += P[k * r + i] * P[k * r + i];
    ss = blockSum(ss, shared);
    const float norm = sqrtf(ss);
    const float inv = norm > 1e-30f ? 1.f / norm : 0.f;
    __syncthreads();
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) P[k * r + i] *= inv;
    __syncthreads();
    for (int64_t j = i + 1; j < r; ++j) {
      float dot = 0.f;
      for (int64_t k = threadIdx.x; k < m; k += blockDim.x) dot += P[k * r + i] * P[k * r + j];
      dot = blockSum(dot, shared);
      __syncthreads();
      for (int64_t k = threadIdx.x; k < m; k += blockDim.x) P[k * r + j] -= dot * P[k * r + i];
      __syncthreads();
    }
  }
}

__global__ void magnitudeKernel(const float* x, float* mag, int32_t* iota, int64_t n) {
  MT_GRID_STRIDE(i, n) {
    mag[i] = fabsf(x[i]);
    iota[i] = static_cast<int32_t>(i);
  }
}

__global__ void gatherKernel(const float* x, int32_t* idx, float* val, int64_t k, int32_t base) {
  MT_GRID_STRIDE(j, k) {
    val[j] = x[idx[j]];
    idx[j] += base;
  }
}

__global__ void scatterAddKernel(float* y, const int32_t* idx, const float* val, int64_t k, float scale) {
  MT_GRID_STRIDE(j, k) y[idx[j]] += scale * val[j];
}

__global__ void scatterZeroKernel(float* y, const int32_t* idx, int64_t k) {
  MT_GRID_STRIDE(j, k) y[idx[j]] = 0.f;
}

// From the caching pool, freed (stream-ordered) when the tensor goes.
Tensor scratch(int64_t bytes) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::kU8, Device::cuda(device));
}

}  // namespace

void axpy(float* y, const float* x, float a, int64_t n) {
  if (n == 0) return;
  axpyKernel<<<gridFor1d(n), 256, 0, currentStream()>>>(y, x, a, n);
  checkLaunch();
}

void orthonormalizeColumns(float* P, int64_t m, int64_t r) {
  if (m == 0 || r == 0) return;
  gramSchmidtKernel<<<1, 512, 0, currentStream()>>>(P, m, r);
  checkLaunch();
}

void topkByMagnitude(const float* x, int64_t n, int64_t k, int32_t* idx, float* val, int64_t indexBase) {
  cudaStream_t s = currentStream();
  const int nn = static_cast<int>(n), kk = static_cast<int>(k);
  Tensor mag = scratch(n * 4), magSorted = scratch(n * 4), iota = scratch(n * 4), order = scratch(n * 4);
  float* pm = static_cast<float*>(mag.rawData());
  float* pms = static_cast<float*>(magSorted.rawData());
  int32_t* pi = static_cast<int32_t*>(iota.rawData());
  int32_t* po = static_cast<int32_t*>(order.rawData());
  magnitudeKernel<<<gridFor1d(n), 256, 0, s>>>(x, pm, pi, n);
  checkLaunch();
  // Radix sort is stable: equal magnitudes stay in index order, as on the CPU.
  size_t tempBytes = 0, tempBytes2 = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, tempBytes, pm, pms, pi, po, nn, 0, 32, s));
  CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, tempBytes2, po, idx, kk, 0, 32, s));
  Tensor temp = scratch(static_cast<int64_t>(std::max(tempBytes, tempBytes2)));
  CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp.rawData(), tempBytes, pm, pms, pi, po, nn, 0, 32, s));
  // The k chosen indices in ascending order (cache-friendly scatters; same output as the CPU).
  CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.rawData(), tempBytes2, po, idx, kk, 0, 32, s));
  gatherKernel<<<gridFor1d(k), 256, 0, s>>>(x, idx, val, k, static_cast<int32_t>(indexBase));
  checkLaunch();
}

void scatterAdd(float* y, const int32_t* idx, const float* val, int64_t k, float scale) {
  if (k == 0) return;
  scatterAddKernel<<<gridFor1d(k), 256, 0, currentStream()>>>(y, idx, val, k, scale);
  checkLaunch();
}

void scatterZero(float* y, const int32_t* idx, int64_t k) {
  if (k == 0) return;
  scatterZeroKernel<<<gridFor1d(k), 256, 0, currentStream()>>>(y, idx, k);
  checkLaunch();
}

}  // namespace mt::cuda
