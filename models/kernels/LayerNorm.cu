// LayerNorm over the last dimension (math in models/layers/LayerNorm.h).
// Forward: one warp per row; mean and rstd in f32 (two passes over the row in registers/L1).
// Backward: one block per group of rows, the block reduces each row's mean(g) and mean(g*n) with a
// fixed tree; each thread owns a fixed set of channels and accumulates their dw/db over the
// block's rows; per-block partials are summed in block order by a second kernel — deterministic.

#include "models/kernels/Convert.cuh"
#include "models/kernels/CudaLayers.h"
#include "models/kernels/KernelUtil.cuh"

namespace mt::cuda {

namespace {

// y in f32, bf16 or f16 (the input of the next GEMM in reduced precision).
template <typename Tout>
__global__ void lnFwd(const float* x, const float* w, const float* b, Tout* y, float* mean, float* rstd, int64_t R,
                      int64_t C, float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= R) return;
  const float* xr = x + row * C;
  float s = 0.f;
  for (int64_t c = lane; c < C; c += 32) s += xr[c];
  const float m = warpSum(s) / static_cast<float>(C);
  float v = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = xr[c] - m;
    v += d * d;
  }
  const float rs = rsqrtf(warpSum(v) / static_cast<float>(C) + eps);
  Tout* yr = y + row * C;
  for (int64_t c = lane; c < C; c += 32) yr[c] = fromF32<Tout>((xr[c] - m) * rs * w[c] + b[c]);
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

constexpr int kLnBwdThreads = 256;
constexpr int kLnRowsPerBlock = 32;

// dy in f32 or the matmul dtype (a GEMM's input gradient); dx in f32 (the residual stream), and
// optionally a copy dxLow in the matmul dtype for the GEMMs that read it next (no separate cast).
template <typename Tdy, typename Tlow>
__global__ void lnBwd(const Tdy* dy, const float* x, const float* w, const float* mean, const float* rstd,
                      const float* residual, float* dx, Tlow* dxLow, float* partW, float* partB, int64_t R,
                      int64_t C) {
  extern __shared__ float acc[];  // [2*C]: this block's dw and db partials, each channel owned by one thread
  __shared__ float red[32];
  for (int64_t c = threadIdx.x; c < 2 * C; c += blockDim.x) acc[c] = 0.f;
  __syncthreads();
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kLnRowsPerBlock), r1 = min(R, r0 + kLnRowsPerBlock);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    const Tdy* gr = dy + r * C;
    const float m = mean[r], rs = rstd[r];
    float sg = 0.f, sgn = 0.f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float n = (xr[c] - m) * rs;
      const float g = toF32(gr[c]);
      const float gw = g * w[c];
      sg += gw;
      sgn += gw * n;
      acc[c] += g * n;
      acc[C + c] += g;
    }
    const float mg = blockSum(sg, red) / static_cast<float>(C);
    const float mgn = blockSum(sgn, red) / static_cast<float>(C);
    float* dxr = dx + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float n = (xr[c] - m) * rs;
      const float d = rs * (toF32(gr[c]) * w[c] - mg - n * mgn) + (residual ? residual[r * C + c] : 0.f);
      dxr[c] = d;
      if (dxLow) dxLow[r * C + c] = fromF32<Tlow>(d);
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    partW[blockIdx.x * C + c] = acc[c];
    partB[blockIdx.x * C + c] = acc[C + c];
  }
}

// Sums the per-block partials: a block of 32 x 32 threads per 32 channels, thread (x, y) adding
// partials y, y + 32, ... of channel x, then a fixed tree over y (deterministic; one thread per
// channel looping over every partial was 0.4 ms per call at GPT-2 size).
constexpr int kReduceRows = 32;
__global__ void lnBwdReduce(const float* partW, const float* partB, float* dw, float* db, int64_t blocks, int64_t C) {
  __shared__ float sw[kReduceRows][33], sb[kReduceRows][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = blockIdx.x * 32 + tx;
  float aw = 0.f, ab = 0.f;
  if (c < C)
    for (int64_t k = ty; k < blocks; k += kReduceRows) {
      aw += partW[k * C + c];
      ab += partB[k * C + c];
    }
  sw[ty][tx] = aw, sb[ty][tx] = ab;
  __syncthreads();
  for (int s = kReduceRows / 2; s > 0; s >>= 1) {
    if (ty < s) sw[ty][tx] += sw[ty + s][tx], sb[ty][tx] += sb[ty + s][tx];
    __syncthreads();
  }
  if (ty == 0 && c < C) {
    dw[c] += sw[0][tx];
    db[c] += sb[0][tx];
  }
}

}  // namespace

void layerNormForward(Tensor& y, Tensor* mean, Tensor* rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                      float eps) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const int warpsPerBlock = 8;
  const int blocks = static_cast<int>((R + warpsPerBlock - 1) / warpsPerBlock);
  dispatchFloat(y.dtype(), [&](auto tout) {
    using Tout = decltype(tout);
    lnFwd<<<blocks, warpsPerBlock * 32, 0, currentStream()>>>(x.data<float>(), w.data<float>(), b.data<float>(),
                                                               static_cast<Tout*>(y.rawData()),
                                                               mean ? mean->data<float>() : nullptr,
                                                               rstd ? rstd->data<float>() : nullptr, R, C, eps);
  });
  checkLaunch();
}

void layerNormBackward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& mean, const Tensor& rstd, const Tensor* residual, Tensor* dxLow) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const int64_t blocks = (R + kLnRowsPerBlock - 1) / kLnRowsPerBlock;
  Tensor partW = Tensor::empty({blocks, C}, DType::kF32, x.device());
  Tensor partB = Tensor::empty({blocks, C}, DType::kF32, x.device());
  const size_t smem = static_cast<size_t>(2 * C) * sizeof(float);
  const DType lowType = dxLow && dxLow->defined() ? dxLow->dtype() : DType::kF32;
  dispatchFloat(dy.dtype(), [&](auto tdy) {
    using Tdy = decltype(tdy);
    dispatchFloat(lowType, [&](auto tlow) {
      using Tlow = decltype(tlow);
      Tlow* low = dxLow && dxLow->defined() ? static_cast<Tlow*>(dxLow->rawData()) : nullptr;
      const Tdy* dyp = static_cast<const Tdy*>(dy.rawData());
      const float* res = residual ? residual->data<float>() : nullptr;
      auto* kernel = lnBwd<Tdy, Tlow>;
      if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<static_cast<unsigned>(blocks), kLnBwdThreads, smem, currentStream()>>>(
          dyp, x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), res, dx.data<float>(), low,
          partW.data<float>(), partB.data<float>(), R, C);
    });
  });
  lnBwdReduce<<<static_cast<unsigned>((C + 31) / 32), 32 * kReduceRows, 0, currentStream()>>>(
      partW.data<float>(), partB.data<float>(), dw.data<float>(), db.data<float>(), blocks, C);
  checkLaunch();
}

}  // namespace mt::cuda
