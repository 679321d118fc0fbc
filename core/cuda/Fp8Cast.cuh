#pragma once
// Device pieces of the FP8 cast (core/Fp8.h) shared by the kernels that cast: core/cuda/Fp8.cu's
// cast kernels and the kernels that write FP8 as they produce a tensor (the GPT blocks' LayerNorm,
// models/kernels/LayerNorm.cu). One quantization's sequences are in core/cuda/Fp8.cu's top comment;
// CastScaling says which one a kernel runs.

#include <cuda_fp8.h>

#include <cstdint>

#include "core/Fp8.h"

namespace mt::cuda {

__device__ inline __nv_fp8_interpretation_t interpretation(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
}

// max(m, |v|) on the float bits (both non-negative, so they order as unsigned integers; a NaN's
// bits exceed infinity's and win, as in amaxAtomic and on the CPU).
__device__ inline float absMaxBits(float m, float v) {
  return __uint_as_float(max(__float_as_uint(m), __float_as_uint(fabsf(v))));
}

__device__ inline void amaxAtomic(float* amax, float blockAmax) {
  atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(blockAmax));
}

// Block-wide max of non-negative values (NaN bits win as in amaxAtomic), then one atomic per block.
__device__ inline void blockAmaxAtomic(float v, float* amax) {
  __shared__ unsigned int sh;
  if (threadIdx.x == 0 && threadIdx.y == 0) sh = 0;
  __syncthreads();
  unsigned int b = __float_as_uint(v);
  for (int o = 16; o > 0; o >>= 1)
    b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
  if ((threadIdx.x % 32) == 0) atomicMax(&sh, b);
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) amaxAtomic(amax, __uint_as_float(sh));
}

// Where a cast kernel takes its scale and puts its amax (the top comment's sequences).
struct CastScaling {
  float* state = nullptr;      // Fp8State::values()
  Fp8Format f = Fp8Format::kE4M3;
  bool withAmax = false;       // the amax into state[kAmax] (delayed, L > 32)
  unsigned* fused = nullptr;   // delayed, L <= 32: Fp8State::deviceScratch (amax bits, blocks done)
  int L = 0, margin = 0;       // fused: the history length and margin of the scale
};
constexpr int kFusedMaxHistory = 32;

// fp8HistoryMax(h, L) for L <= 32 in every warp: lane i holds h_i (or 0), then a butterfly max in
// which a NaN wins, as it does on the CPU. Values that cannot win there (<= 0) start as 0.
__device__ inline float historyMaxWarp(const float* h, int L) {
  const int lane = static_cast<int>((threadIdx.y * blockDim.x + threadIdx.x) % 32);
  float m = 0.f;
  if (lane < L && !(h[lane] <= 0.f)) m = h[lane];
  for (int o = 16; o > 0; o >>= 1) {
    const float b = __shfl_xor_sync(0xffffffffu, m, o);
    m = m != m ? m : (b != b ? b : fmaxf(m, b));
  }
  return m;
}

// The scale a cast multiplies by: the state's, or (fused) scaleFrom of the history's max.
__device__ inline float castScale(const CastScaling& cs) {
  if (!cs.fused) return cs.state[Fp8State::kScale];
  const float h = historyMaxWarp(cs.state + Fp8State::kHistory, cs.L);
  return fp8ScaleFrom(h, cs.state[Fp8State::kScale], cs.f, cs.margin);
}

// The block's amax m (all threads call this, after every read of the state): into the state, or
// (fused) into the scratch, the last block then finishing the state as pushKernel and scaleKernel
// would. Its fences order the other blocks' amax atomics before its read of the scratch.
__device__ inline void castAmax(const CastScaling& cs, float m, float scale) {
  if (cs.withAmax) blockAmaxAtomic(m, cs.state + Fp8State::kAmax);
  if (!cs.fused) return;
  blockAmaxAtomic(m, reinterpret_cast<float*>(cs.fused));
  if (threadIdx.x != 0 || threadIdx.y != 0) return;
  __threadfence();
  if (atomicAdd(cs.fused + 1, 1u) != gridDim.x * gridDim.y - 1) return;
  __threadfence();
  const float amax = __uint_as_float(atomicExch(cs.fused, 0u));
  atomicExch(cs.fused + 1, 0u);
  fp8PushAmax(cs.state, cs.L, amax);
  fp8SetScale(cs.state, scale);
}

// Two codes from one convert (cvt.rn.satfinite.e4m3x2 / e5m2x2 on sm_89+; the same rounding per
// element as castIntrinsic), a in the low byte.
__device__ inline uint16_t castPair(float a, float b, Fp8Format f) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, interpretation(f)));
}

// The codes of eight values times scale (one f32 multiply each), element i in byte i.
__device__ inline uint2 castEight(const float (&v)[8], float scale, Fp8Format f) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    w[h] = castPair(v[4 * h] * scale, v[4 * h + 1] * scale, f) |
           (static_cast<uint32_t>(castPair(v[4 * h + 2] * scale, v[4 * h + 3] * scale, f)) << 16);
  return make_uint2(w[0], w[1]);
}

// The scaling of a cast made by a kernel that produces the tensor as it casts (so its scale must
// be known before the kernel starts): replay, the state's scale as it is (no update); otherwise
// the delayed recipe's one-kernel update (CastScaling::fused), which needs a history of at most
// kFusedMaxHistory and a cast before this one. False where neither applies (the current recipe,
// the first cast, a longer history): the caller then produces the tensor and casts it apart.
// After the launch, a non-replay cast counts itself with st.setCasts(st.casts() + 1).
bool producerScaling(Fp8State& st, bool replay, CastScaling* cs);

}  // namespace mt::cuda
