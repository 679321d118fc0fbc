// Multi-tensor optimizer kernels: one launch updates up to kMaxSegs segments (parameters or shard
// pieces), each block taking a fixed chunk of one segment, so a model of hundreds of tensors costs
// a few launches instead of hundreds. Math identical to the CPU (core/optim/Optimizer.h).
// Gradient utilities: deterministic sum of squares (fixed two-level tree, f64), scaling, and an
// inf/nan check for loss scaling.

#include <cuda_bf16.h>

#include <cmath>

#include "core/cuda/CudaOptim.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

constexpr int kMaxSegs = 48;
constexpr int kChunk = 4096;  // elements per block

struct SegTable {
  float* p[kMaxSegs];
  const void* g[kMaxSegs];  // f32, or bf16 when gBf16
  bool gBf16[kMaxSegs];
  float* s1[kMaxSegs];
  float* s2[kMaxSegs];
  int64_t n[kMaxSegs];
  float wd[kMaxSegs];
  int blockStart[kMaxSegs + 1];  // first block of each segment
  int count;
};

__device__ inline float gradAt(const SegTable& t, int s, int64_t i) {
  return t.gBf16[s] ? __bfloat162float(static_cast<const __nv_bfloat16*>(t.g[s])[i]) : static_cast<const float*>(t.g[s])[i];
}

__device__ int segmentOf(const SegTable& t, int block) {
  int s = 0;
  while (s + 1 < t.count && t.blockStart[s + 1] <= block) ++s;
  return s;
}

__global__ void adamwKernel(SegTable t, float lr, float beta1, float beta2, float eps, float stepSize,
                            float bc2Sqrt) {
  const int s = segmentOf(t, blockIdx.x);
  const int64_t base = static_cast<int64_t>(blockIdx.x - t.blockStart[s]) * kChunk;
  const int64_t end = min(t.n[s], base + kChunk);
  float* p = t.p[s];
  float* m = t.s1[s];
  float* v = t.s2[s];
  const float decay = 1.f - lr * t.wd[s];
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    float pi = p[i] * decay;
    const float gi = gradAt(t, s, i);
    const float mi = beta1 * m[i] + (1.f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    pi -= stepSize * (mi / (sqrtf(vi) / bc2Sqrt + eps));
    p[i] = pi;
  }
}

__global__ void sgdKernel(SegTable t, float lr, float momentum, bool nesterov, bool first) {
  const int s = segmentOf(t, blockIdx.x);
  const int64_t base = static_cast<int64_t>(blockIdx.x - t.blockStart[s]) * kChunk;
  const int64_t end = min(t.n[s], base + kChunk);
  float* p = t.p[s];
  float* buf = t.s1[s];
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    float gi = gradAt(t, s, i) + t.wd[s] * p[i];
    if (momentum != 0.f) {
      const float b = first ? gi : momentum * buf[i] + gi;
      buf[i] = b;
      gi = nesterov ? gi + momentum * b : b;
    }
    p[i] -= lr * gi;
  }
}

template <typename Launch>
void forEachTable(const std::vector<OptimSegment>& segs, const std::vector<int64_t>& offsets, float* s1, float* s2,
                  float weightDecay, Launch&& launch) {
  size_t i = 0;
  while (i < segs.size()) {
    SegTable t{};
    int blocks = 0;
    t.count = 0;
    for (; i < segs.size() && t.count < kMaxSegs; ++i) {
      const int64_t n = segs[i].value.numel();
      if (n == 0) continue;
      const int k = t.count++;
      t.p[k] = segs[i].value.data<float>();
      t.g[k] = segs[i].grad.rawData();
      t.gBf16[k] = segs[i].grad.dtype() == DType::kBF16;
      t.s1[k] = s1 ? s1 + offsets[i] : nullptr;
      t.s2[k] = s2 ? s2 + offsets[i] : nullptr;
      t.n[k] = n;
      t.wd[k] = segs[i].decay ? weightDecay : 0.f;
      t.blockStart[k] = blocks;
      blocks += static_cast<int>((n + kChunk - 1) / kChunk);
    }
    t.blockStart[t.count] = blocks;
    if (blocks > 0) launch(t, blocks);
  }
}

__device__ inline float asFloat(float v) { return v; }
__device__ inline float asFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// red[0] = the sum of v over the block (256 threads), by a fixed tree: deterministic.
__device__ inline void blockSumInto(double v, double* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
}

template <typename T>
__global__ void sumSqPartial(const T* x, int64_t n, double* part) {
  __shared__ double red[256];
  double acc = 0.0;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(n, base + kChunk);
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    const double v = asFloat(x[i]);
    acc += v * v;
  }
  blockSumInto(acc, red);
  if (threadIdx.x == 0) part[blockIdx.x] = red[0];
}

__global__ void sumFinal(const double* part, int64_t n, double* out) {
  __shared__ double red[256];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
  blockSumInto(acc, red);
  if (threadIdx.x == 0) *out = red[0];
}

__global__ void scaleKernel(float* x, int64_t n, float f) {
  MT_GRID_STRIDE(i, n) { x[i] *= f; }
}
__global__ void scaleKernelBf16(__nv_bfloat16* x, int64_t n, float f) {
  MT_GRID_STRIDE(i, n) { x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * f); }
}

// Multi-tensor forms of the two above: one partial per block over its chunk of one segment, and
// the scaling of every segment's gradient in place.
__global__ void sumSqMulti(SegTable t, double* part) {
  __shared__ double red[256];
  const int s = segmentOf(t, blockIdx.x);
  const int64_t base = static_cast<int64_t>(blockIdx.x - t.blockStart[s]) * kChunk;
  const int64_t end = min(t.n[s], base + kChunk);
  double acc = 0.0;
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    const double v = gradAt(t, s, i);
    acc += v * v;
  }
  blockSumInto(acc, red);
  if (threadIdx.x == 0) part[blockIdx.x] = red[0];
}
// This block's chunk of its segment's gradient *= f.
__device__ inline void scaleBlockChunk(const SegTable& t, float f) {
  const int s = segmentOf(t, blockIdx.x);
  const int64_t base = static_cast<int64_t>(blockIdx.x - t.blockStart[s]) * kChunk;
  const int64_t end = min(t.n[s], base + kChunk);
  for (int64_t i = base + threadIdx.x; i < end; i += blockDim.x) {
    if (t.gBf16[s]) {
      __nv_bfloat16* g = static_cast<__nv_bfloat16*>(const_cast<void*>(t.g[s]));
      g[i] = __float2bfloat16_rn(__bfloat162float(g[i]) * f);
    } else {
      static_cast<float*>(const_cast<void*>(t.g[s]))[i] *= f;
    }
  }
}
__global__ void scaleMulti(SegTable t, float f) { scaleBlockChunk(t, f); }

// The clip factor computed on the device from the total sum of squares (as clipGradNorm does on
// the host: coef = maxNorm / (sqrt(sq) + 1e-6) in double, applied in float when below 1).
__global__ void clipScaleMulti(SegTable t, const double* sq, float maxNorm) {
  const double coef = static_cast<double>(maxNorm) / (sqrt(*sq) + 1e-6);
  if (coef < 1.0) scaleBlockChunk(t, static_cast<float>(coef));
}

template <typename T>
__global__ void nonFiniteKernel(const T* x, int64_t n, int* flag) {
  MT_GRID_STRIDE(i, n) {
    if (!isfinite(asFloat(x[i]))) *flag = 1;
  }
}

}  // namespace

void adamwMultiTensor(const std::vector<OptimSegment>& segs, const std::vector<int64_t>& offsets, Tensor& m, Tensor& v,
                      float lr, float wd, float beta1, float beta2, float eps, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const float stepSize = static_cast<float>(static_cast<double>(lr) / bc1);
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  forEachTable(segs, offsets, m.data<float>(), v.data<float>(), wd, [&](const SegTable& t, int blocks) {
    adamwKernel<<<blocks, 256, 0, currentStream()>>>(t, lr, beta1, beta2, eps, stepSize, bc2Sqrt);
    checkLaunch();
  });
}

void sgdMultiTensor(const std::vector<OptimSegment>& segs, const std::vector<int64_t>& offsets, Tensor& buf, float lr,
                    float wd, float momentum, bool nesterov, bool firstStep) {
  float* b = buf.numel() ? buf.data<float>() : nullptr;
  forEachTable(segs, offsets, b, nullptr, wd, [&](const SegTable& t, int blocks) {
    sgdKernel<<<blocks, 256, 0, currentStream()>>>(t, lr, momentum, nesterov, firstStep);
    checkLaunch();
  });
}

void sumOfSquaresInto(const Tensor& t, double* out) {
  const int64_t n = t.numel();
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), currentStream()));
    return;
  }
  const int64_t blocks = (n + kChunk - 1) / kChunk;
  // Released at once: a later allocation on this stream runs after these kernels (stream order).
  Tensor part = Tensor::empty({blocks}, DType::kF64, t.device());
  if (t.dtype() == DType::kBF16)
    sumSqPartial<<<static_cast<unsigned>(blocks), 256, 0, currentStream()>>>(
        static_cast<const __nv_bfloat16*>(t.rawData()), n, part.data<double>());
  else
    sumSqPartial<<<static_cast<unsigned>(blocks), 256, 0, currentStream()>>>(t.data<float>(), n, part.data<double>());
  sumFinal<<<1, 256, 0, currentStream()>>>(part.data<double>(), blocks, out);
  checkLaunch();
}

double sumOfSquares(const Tensor& t) {
  if (t.numel() == 0) return 0.0;
  Tensor total = Tensor::empty({1}, DType::kF64, t.device());
  sumOfSquaresInto(t, total.data<double>());
  double out = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&out, total.data<double>(), sizeof(double), cudaMemcpyDeviceToHost, currentStream()));
  CUDA_CHECK(cudaStreamSynchronize(currentStream()));
  return out;
}

namespace {
// The sum of squares of every segment's gradient into the device double it returns (multi-tensor
// partials, one sum per launch table, then the total); `part` keeps the scratch alive.
const double* sumOfSquaresOnDevice(const std::vector<OptimSegment>& segs, Tensor& part) {
  int64_t blocks = 0;
  for (const auto& sg : segs) blocks += (sg.grad.numel() + kChunk - 1) / kChunk;
  // [blocks partials | one sum per launch table | the total]; all zero when there is nothing to sum.
  const int64_t tables = (static_cast<int64_t>(segs.size()) + kMaxSegs - 1) / kMaxSegs;
  const Shape shape = {blocks + tables + 1};
  part = blocks == 0 ? Tensor::zeros(shape, DType::kF64, segs[0].grad.device())
                     : Tensor::empty(shape, DType::kF64, segs[0].grad.device());
  double* pp = part.data<double>();
  if (blocks == 0) return pp + blocks + tables;
  const std::vector<int64_t> offsets(segs.size(), 0);
  int64_t first = 0, table = 0;
  forEachTable(segs, offsets, nullptr, nullptr, 0.f, [&](const SegTable& t, int tableBlocks) {
    sumSqMulti<<<tableBlocks, 256, 0, currentStream()>>>(t, pp + first);
    sumFinal<<<1, 256, 0, currentStream()>>>(pp + first, tableBlocks, pp + blocks + table);
    first += tableBlocks;
    ++table;
  });
  sumFinal<<<1, 256, 0, currentStream()>>>(pp + blocks, table, pp + blocks + tables);
  checkLaunch();
  return pp + blocks + tables;
}
}  // namespace

void clipGradNormOnDevice(const std::vector<OptimSegment>& segs, float maxNorm) {
  if (segs.empty()) return;
  Tensor part;
  const double* total = sumOfSquaresOnDevice(segs, part);
  const std::vector<int64_t> offsets(segs.size(), 0);
  forEachTable(segs, offsets, nullptr, nullptr, 0.f, [&](const SegTable& t, int blocks) {
    clipScaleMulti<<<blocks, 256, 0, currentStream()>>>(t, total, maxNorm);
    checkLaunch();
  });
}

double sumOfSquares(const std::vector<OptimSegment>& segs) {
  int64_t blocks = 0;
  for (const auto& sg : segs) blocks += (sg.grad.numel() + kChunk - 1) / kChunk;
  if (blocks == 0) return 0.0;
  Tensor part;
  const double* total = sumOfSquaresOnDevice(segs, part);
  double out = 0.0;  // the one host synchronisation of the whole sum
  CUDA_CHECK(cudaMemcpyAsync(&out, total, sizeof(double), cudaMemcpyDeviceToHost, currentStream()));
  CUDA_CHECK(cudaStreamSynchronize(currentStream()));
  return out;
}

void scaleGrads(const std::vector<OptimSegment>& segs, float factor) {
  const std::vector<int64_t> offsets(segs.size(), 0);
  forEachTable(segs, offsets, nullptr, nullptr, 0.f, [&](const SegTable& t, int blocks) {
    scaleMulti<<<blocks, 256, 0, currentStream()>>>(t, factor);
    checkLaunch();
  });
}

void scaleInPlace(const Tensor& t, float factor) {
  if (t.dtype() == DType::kBF16)
    scaleKernelBf16<<<gridFor1d(t.numel()), 256, 0, currentStream()>>>(static_cast<__nv_bfloat16*>(t.rawData()),
                                                                        t.numel(), factor);
  else
    scaleKernel<<<gridFor1d(t.numel()), 256, 0, currentStream()>>>(static_cast<float*>(t.rawData()), t.numel(), factor);
  checkLaunch();
}

bool anyNonFinite(const std::vector<Tensor>& ts) {
  if (ts.empty()) return false;
  Tensor flag = Tensor::zeros({1}, DType::kI32, ts[0].device());
  for (const Tensor& t : ts) {
    if (t.dtype() == DType::kBF16)
      nonFiniteKernel<<<gridFor1d(t.numel()), 256, 0, currentStream()>>>(
          static_cast<const __nv_bfloat16*>(t.rawData()), t.numel(), flag.data<int32_t>());
    else
      nonFiniteKernel<<<gridFor1d(t.numel()), 256, 0, currentStream()>>>(t.data<float>(), t.numel(),
                                                                          flag.data<int32_t>());
  }
  checkLaunch();
  int host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, flag.data<int32_t>(), sizeof(int), cudaMemcpyDeviceToHost, currentStream()));
  CUDA_CHECK(cudaStreamSynchronize(currentStream()));
  return host != 0;
}

}  // namespace mt::cuda
