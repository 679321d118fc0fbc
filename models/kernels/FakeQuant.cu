// Fake quantization on the GPU: the arithmetic of models/quant/Quantizer.h (division by the scale,
// round-half-even via rintf, the same clamps), so a CUDA QAT run quantizes as the CPU and the
// exported Q/DQ pairs do. Weights: one block per output channel (block max of |w|, then quantize).
// Range: per-block min/max, then one block over the partials; the two floats are read to the host
// (the observer's update is host code).

#include <cfloat>

#include "core/cuda/CudaRuntime.h"
#include "core/cuda/KernelUtil.cuh"
#include "models/kernels/FakeQuant.h"

namespace mt::cuda {

namespace {

constexpr int kBlock = 256;

__device__ inline float blockReduce(float v, bool isMax, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = isMax ? fmaxf(v, u) : fminf(v, u);
  }
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? shared[threadIdx.x] : (isMax ? -FLT_MAX : FLT_MAX);
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) {
      const float u = __shfl_xor_sync(0xffffffffu, v, o);
      v = isMax ? fmaxf(v, u) : fminf(v, u);
    }
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  return shared[0];
}

__global__ void weightRows(const float* w, float* out, int64_t cols) {
  __shared__ float shared[32];
  const float* row = w + blockIdx.x * cols;
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    m = fmaxf(m, fabsf(row[i]));
  m = blockReduce(m, true, shared);
  float s = m / 127.f;
  if (!(s > FLT_MIN)) s = 1.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float q = fminf(fmaxf(rintf(row[i] / s), -127.f), 127.f);
    out[blockIdx.x * cols + i] = q * s;
  }
}

__global__ void activation(const float* x, float* y, int64_t n, float s, float z) {
  MT_GRID_STRIDE(i, n) {
    const float q = fminf(fmaxf(rintf(x[i] / s) + z, 0.f), 255.f);
    y[i] = (q - z) * s;
  }
}

__global__ void clip(float* dx, const float* x, int64_t n, float lo, float hi) {
  MT_GRID_STRIDE(i, n) {
    if (!(x[i] >= lo && x[i] <= hi)) dx[i] = 0.f;
  }
}

// partial[2 * block] = min, partial[2 * block + 1] = max of this block's grid-stride share.
__global__ void rangePartials(const float* x, int64_t n, float* partial) {
  __shared__ float shared[32];
  float lo = FLT_MAX, hi = -FLT_MAX;
  MT_GRID_STRIDE(i, n) {
    lo = fminf(lo, x[i]);  // fminf/fmaxf ignore a NaN operand
    hi = fmaxf(hi, x[i]);
  }
  lo = blockReduce(lo, false, shared);
  hi = blockReduce(hi, true, shared);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = lo;
    partial[2 * blockIdx.x + 1] = hi;
  }
}

__global__ void rangeFinal(const float* partial, int blocks, float* out) {
  __shared__ float shared[32];
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    lo = fminf(lo, partial[2 * b]);
    hi = fmaxf(hi, partial[2 * b + 1]);
  }
  lo = blockReduce(lo, false, shared);
  hi = blockReduce(hi, true, shared);
  if (threadIdx.x == 0) {
    out[0] = lo;
    out[1] = hi;
  }
}

}  // namespace

void fakeQuantWeight(Tensor& out, const Tensor& w) {
  const int64_t rows = w.dim(0), cols = w.numel() / rows;
  if (rows == 0) return;
  weightRows<<<static_cast<unsigned>(rows), kBlock, 0, currentStream()>>>(w.data<float>(), out.data<float>(),
                                                                          cols);
  checkLaunch();
}

void fakeQuantActivation(Tensor& out, const Tensor& x, float scale, int32_t zeroPoint) {
  if (x.numel() == 0) return;
  activation<<<gridFor1d(x.numel()), kBlock, 0, currentStream()>>>(
      x.data<float>(), out.data<float>(), x.numel(), scale, static_cast<float>(zeroPoint));
  checkLaunch();
}

void clipGradient(Tensor& dx, const Tensor& x, float lowest, float highest) {
  if (x.numel() == 0) return;
  clip<<<gridFor1d(x.numel()), kBlock, 0, currentStream()>>>(dx.data<float>(), x.data<float>(), x.numel(),
                                                             lowest, highest);
  checkLaunch();
}

std::pair<float, float> tensorRange(const Tensor& x) {
  if (x.numel() == 0) return {FLT_MAX, -FLT_MAX};
  const int blocks = std::min(gridFor1d(x.numel()), 1024);
  Tensor partial = Tensor::empty({2 * static_cast<int64_t>(blocks) + 2}, DType::kF32, x.device());
  float* p = partial.data<float>();
  rangePartials<<<blocks, kBlock, 0, currentStream()>>>(x.data<float>(), x.numel(), p);
  rangeFinal<<<1, kBlock, 0, currentStream()>>>(p, blocks, p + 2 * blocks);
  checkLaunch();
  float host[2];
  CUDA_CHECK(cudaMemcpyAsync(host, p + 2 * blocks, sizeof(host), cudaMemcpyDeviceToHost, currentStream()));
  CUDA_CHECK(cudaStreamSynchronize(currentStream()));
  return {host[0], host[1]};
}

}  // namespace mt::cuda
