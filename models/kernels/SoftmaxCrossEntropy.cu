// Fused softmax + cross-entropy: one block per row computes max, log-sum-exp, the row's loss and
// whether argmax == target in one online pass, and writes dlogits = scale * (softmax - onehot) /
// valid in a second, in place over f32 or bf16/f16 logits, so the probabilities are never stored
// (rows that fit are held in shared memory between the passes: one read, one write). Per-row results
// are reduced on the device and three numbers
// (loss sum, correct, count) come back to the host.

#include <algorithm>
#include <climits>
#include <type_traits>

#include "core/cuda/ElementConvert.cuh"
#include "models/kernels/CudaLayers.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

// Running (max, sum of exp(z - max), first index of the max) of a row, merged across threads.
struct RowStat {
  float m, s;
  int a;
};
__device__ __forceinline__ RowStat mergeStat(RowStat x, RowStat y) {
  const float m = fmaxf(x.m, y.m);
  RowStat r;
  r.m = m;
  r.s = (x.m == -INFINITY ? 0.f : x.s * __expf(x.m - m)) + (y.m == -INFINITY ? 0.f : y.s * __expf(y.m - m));
  r.a = x.m > y.m ? x.a : y.m > x.m ? y.a : min(x.a, y.a);
  return r;
}

// The block's merged statistic, in every thread: a warp shuffle tree, then one over the warps'
// results through red[32] (one __syncthreads).
__device__ __forceinline__ RowStat blockMergeStat(RowStat st, RowStat* red) {
  for (int o = 16; o > 0; o >>= 1) {
    RowStat other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o),
                  __shfl_xor_sync(0xffffffffu, st.a, o)};
    st = mergeStat(st, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) red[warp] = st;
  __syncthreads();
  st = lane < warps ? red[lane] : RowStat{-INFINITY, 0.f, INT_MAX};
  for (int o = 16; o > 0; o >>= 1) {
    RowStat other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o),
                  __shfl_xor_sync(0xffffffffu, st.a, o)};
    st = mergeStat(st, other);
  }
  return st;
}

// One block per row, two passes: an online max / sum-exp / argmax, then the gradient written in
// place (dz may alias z). TZ: f32 or bf16/f16 logits (the classifier GEMM writes them in the
// matmul dtype; the math is f32); V elements per 16-byte load.
template <typename TZ, typename TT, int V>
__global__ void ceRows(const TZ* z, const TT* targets, TZ* dz, double* rowLoss, int* rowCorrect, int* rowValid,
                       int* badTarget, int64_t C, int64_t stride, float inv) {
  __shared__ RowStat red[32];
  __shared__ float ztShared;
  const int64_t r = blockIdx.x;
  const TZ* zr = z + r * stride;
  const int64_t t = static_cast<int64_t>(targets[r]);
  const bool valid = t != -100;
  if (valid && (t < 0 || t >= C)) {  // uniform over the block
    if (threadIdx.x == 0) atomicExch(badTarget, 1);
    return;
  }
  // z[t] is read before any thread may overwrite it with the gradient.
  if (threadIdx.x == 0) ztShared = valid ? toF32(zr[t]) : 0.f;
  RowStat st{-INFINITY, 0.f, INT_MAX};
  for (int64_t c0 = static_cast<int64_t>(threadIdx.x) * V; c0 < C; c0 += static_cast<int64_t>(blockDim.x) * V) {
    TZ buf[V];
    if constexpr (V > 1) *reinterpret_cast<uint4*>(buf) = *reinterpret_cast<const uint4*>(zr + c0);
    else buf[0] = zr[c0];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (c0 + i >= C) break;
      const float v = toF32(buf[i]);
      if (v > st.m) {
        st.s = st.s * __expf(st.m - v) + 1.f;
        st.m = v;
        st.a = static_cast<int>(c0 + i);
      } else {
        st.s += __expf(v - st.m);
      }
    }
  }
  st = blockMergeStat(st, red);
  const float lse = st.m + logf(st.s);
  if (dz) {
    TZ* dr = dz + r * stride;
    for (int64_t c0 = static_cast<int64_t>(threadIdx.x) * V; c0 < stride; c0 += static_cast<int64_t>(blockDim.x) * V) {
      TZ buf[V];
      if constexpr (V > 1) *reinterpret_cast<uint4*>(buf) = *reinterpret_cast<const uint4*>(zr + c0);
      else buf[0] = zr[c0];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int64_t c = c0 + i;
        const float p = c < C ? __expf(toF32(buf[i]) - lse) : 0.f;
        buf[i] = fromF32<TZ>(valid && c < C ? (p - (c == t ? 1.f : 0.f)) * inv : 0.f);
      }
      if constexpr (V > 1) *reinterpret_cast<uint4*>(dr + c0) = *reinterpret_cast<const uint4*>(buf);
      else dr[c0] = buf[0];
    }
  }
  if (threadIdx.x == 0) {
    rowLoss[r] = valid ? static_cast<double>(lse) - static_cast<double>(ztShared) : 0.0;
    rowCorrect[r] = valid && st.a == t ? 1 : 0;
    rowValid[r] = valid ? 1 : 0;
  }
}

// The same, with the row held in shared memory between the passes: the logits are read from
// global memory once instead of twice (one read, one write per element: the byte floor), and the
// exponentials of each 16-byte load are taken against one running max. Dynamic shared memory of
// one row (GPT-2: 50,304 bf16 = 98 KiB, two blocks per SM). Keeping the row in registers instead
// (8 x 16 bytes per thread) spilled at 1024 threads and was slower than the two-pass kernel; issuing
// all of a thread's loads at once by cp.async (eight groups, consumed as each lands) was slower too:
// 0.74 against 0.66 ms per 8192-row GPT-2 chunk on the H200 (2026-12-03).
template <typename TZ, typename TT>
__global__ void __launch_bounds__(1024) ceRowsSmem(const TZ* z, const TT* targets, TZ* dz, double* rowLoss,
                                                   int* rowCorrect, int* rowValid, int* badTarget, int C,
                                                   int stride, float inv) {
  constexpr int V = 16 / sizeof(TZ);
  extern __shared__ uint4 rowBuf[];  // stride / V entries
  __shared__ RowStat red[32];
  __shared__ float ztShared;
  const int64_t r = blockIdx.x;
  const TZ* zr = z + r * static_cast<int64_t>(stride);
  const int64_t t = static_cast<int64_t>(targets[r]);
  const bool valid = t != -100;
  if (valid && (t < 0 || t >= C)) {
    if (threadIdx.x == 0) atomicExch(badTarget, 1);
    return;
  }
  if (threadIdx.x == 0) ztShared = valid ? toF32(zr[t]) : 0.f;
  const int loads = stride / V;
  RowStat st{-INFINITY, 0.f, INT_MAX};
  auto consume = [&](const uint4& u, int k) {
    rowBuf[k] = u;
    const TZ* e = reinterpret_cast<const TZ*>(&u);
    const int c0 = k * V;
    float lm = -INFINITY;
    int la = INT_MAX;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float v = c0 + i < C ? toF32(e[i]) : -INFINITY;
      if (v > lm) lm = v, la = c0 + i;
    }
    if (lm == -INFINITY) return;
    float ls = 0.f;
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (c0 + i < C) ls += __expf(toF32(e[i]) - lm);
    st = mergeStat(st, RowStat{lm, ls, la});
  };
  // Two loads in flight per thread before their use.
  int k = threadIdx.x;
  for (; k + static_cast<int>(blockDim.x) < loads; k += 2 * blockDim.x) {
    const uint4 u0 = reinterpret_cast<const uint4*>(zr)[k];
    const uint4 u1 = reinterpret_cast<const uint4*>(zr)[k + blockDim.x];
    consume(u0, k);
    consume(u1, k + blockDim.x);
  }
  if (k < loads) consume(reinterpret_cast<const uint4*>(zr)[k], k);
  st = blockMergeStat(st, red);  // its barrier also orders thread 0's read of z[t] and every rowBuf write
  const float lse = st.m + logf(st.s);
  if (dz) {
    uint4* dr = reinterpret_cast<uint4*>(dz + r * static_cast<int64_t>(stride));
    for (int k2 = threadIdx.x; k2 < loads; k2 += blockDim.x) {
      uint4 u = rowBuf[k2];
      TZ* e = reinterpret_cast<TZ*>(&u);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int c = k2 * V + i;
        const float p = c < C ? __expf(toF32(e[i]) - lse) : 0.f;
        e[i] = fromF32<TZ>(valid && c < C ? (p - (c == t ? 1.f : 0.f)) * inv : 0.f);
      }
      dr[k2] = u;
    }
  }
  if (threadIdx.x == 0) {
    rowLoss[r] = valid ? static_cast<double>(lse) - static_cast<double>(ztShared) : 0.0;
    rowCorrect[r] = valid && st.a == t ? 1 : 0;
    rowValid[r] = valid ? 1 : 0;
  }
}
// Rows up to this many bytes go through shared memory (two blocks per SM on Hopper's 227 KiB).
constexpr int64_t kCeSmemMaxBytes = 110 * 1024;

// out = the sums, or out += them (accumulate: a LossSink over chunks).
__global__ void ceReduce(const double* rowLoss, const int* rowCorrect, const int* rowValid, int64_t N, double* out,
                         bool accumulate) {
  __shared__ double sl[256];
  __shared__ double sc[256], sv[256];
  double l = 0, c = 0, v = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    l += rowLoss[i];
    c += rowCorrect[i];
    v += rowValid[i];
  }
  sl[threadIdx.x] = l, sc[threadIdx.x] = c, sv[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sl[threadIdx.x] += sl[threadIdx.x + s];
      sc[threadIdx.x] += sc[threadIdx.x + s];
      sv[threadIdx.x] += sv[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (accumulate) out[0] += sl[0], out[1] += sc[0], out[2] += sv[0];
    else out[0] = sl[0], out[1] = sc[0], out[2] = sv[0];
  }
}

__global__ void countValid(const int64_t* t64, const int32_t* t32, int64_t N, int* out) {
  int v = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) v += (t64 ? t64[i] : static_cast<int64_t>(t32[i])) != -100;
  atomicAdd(out, v);
}

}  // namespace

LossStats softmaxCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                              int64_t validForMean, int64_t validClasses, LossSink* sink) {
  const int64_t stride = logits.dim(-1), N = logits.numel() / stride;
  const int64_t C = validClasses > 0 ? validClasses : stride;
  Device d = logits.device();
  Tensor tgt = targets.device() == d ? targets : targets.to(d);
  const int64_t* t64 = tgt.dtype() == DType::kI64 ? tgt.data<int64_t>() : nullptr;
  const int32_t* t32 = tgt.dtype() == DType::kI32 ? tgt.data<int32_t>() : nullptr;
  cudaStream_t s = currentStream();
  Tensor ints = Tensor::zeros({2 * N + 2}, DType::kI32, d);  // correct[N], valid[N], bad, validCount
  int* correct = ints.data<int32_t>();
  int* valid = correct + N;
  int* bad = sink ? sink->bad.data<int32_t>() : valid + N;
  int* validCount = valid + N + 1;
  int64_t mean = validForMean;
  if (mean < 0) {
    countValid<<<1, 256, 0, s>>>(t64, t32, N, validCount);
    int hostCount = 0;
    CUDA_CHECK(cudaMemcpyAsync(&hostCount, validCount, sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    mean = hostCount;
  }
  const float inv = mean > 0 ? scale / static_cast<float>(mean) : 0.f;
  Tensor rowLoss = Tensor::empty({N}, DType::kF64, d);
  Tensor out = Tensor::empty({3}, DType::kF64, d);
  const int threads = C >= 1024 ? 1024 : C >= 256 ? 256 : 64;
  if (N > 0) {
    MT_CHECK(!dlogits || dlogits->dtype() == logits.dtype(), "softmax cross-entropy: logits ",
             dtypeName(logits.dtype()), ", dlogits ", dtypeName(dlogits->dtype()));
    dispatchFloat(logits.dtype(), [&](auto tz) {
      using TZ = decltype(tz);
      constexpr int V = 16 / sizeof(TZ);
      const bool vec = stride % V == 0 && reinterpret_cast<uintptr_t>(logits.rawData()) % 16 == 0 &&
                       (!dlogits || reinterpret_cast<uintptr_t>(dlogits->rawData()) % 16 == 0);
      const TZ* zp = static_cast<const TZ*>(logits.rawData());
      TZ* dp = dlogits ? static_cast<TZ*>(dlogits->rawData()) : nullptr;
      const bool inSmem = vec && stride * static_cast<int64_t>(sizeof(TZ)) <= kCeSmemMaxBytes;
      auto launch = [&](auto tt, auto vecTag) {
        using TT = std::remove_cv_t<std::remove_pointer_t<decltype(tt)>>;
        constexpr int kV = decltype(vecTag)::value;
        if constexpr (kV > 1) {
          if (inSmem) {
            const int smem = static_cast<int>(stride * static_cast<int64_t>(sizeof(TZ)));
            auto* kernel = ceRowsSmem<TZ, TT>;
            if (smem > 48 * 1024)
              CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            // Fewest whole warps up to 1024 that cover the row in about eight loads each.
            const int64_t loads = stride / V;
            const int nt = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (loads / 8 + 31) / 32 * 32)));
            kernel<<<static_cast<unsigned>(N), nt, smem, s>>>(zp, tt, dp, rowLoss.data<double>(), correct, valid, bad,
                                                             static_cast<int>(C), static_cast<int>(stride), inv);
            return;
          }
        }
        ceRows<TZ, TT, kV><<<static_cast<unsigned>(N), threads, 0, s>>>(zp, tt, dp, rowLoss.data<double>(), correct,
                                                                         valid, bad, C, stride, inv);
      };
      if (t64) {
        if (vec) launch(t64, std::integral_constant<int, V>{});
        else launch(t64, std::integral_constant<int, 1>{});
      } else {
        if (vec) launch(t32, std::integral_constant<int, V>{});
        else launch(t32, std::integral_constant<int, 1>{});
      }
    });
  }
  if (sink) {
    ceReduce<<<1, 256, 0, s>>>(rowLoss.data<double>(), correct, valid, N, sink->sums.data<double>(), true);
    checkLaunch();
    sink->classes = C;
    return LossStats{};
  }
  ceReduce<<<1, 256, 0, s>>>(rowLoss.data<double>(), correct, valid, N, out.data<double>(), false);
  checkLaunch();
  double host[3];
  int hostBad = 0;
  CUDA_CHECK(cudaMemcpyAsync(host, out.data<double>(), sizeof(host), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(&hostBad, bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (hostBad) throw DataError("a target is out of range for " + std::to_string(C) + " classes");
  LossStats st;
  st.lossSum = host[0];
  st.correct = static_cast<int64_t>(host[1]);
  st.count = static_cast<int64_t>(host[2]);
  return st;
}

}  // namespace mt::cuda
