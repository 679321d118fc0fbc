#pragma once
// Shared by the flash-attention kernels (models/kernels/FlashAttention.cu, mma.sync on sm_80+, and
// models/kernels/FlashAttentionSm90.cu, wgmma on sm_90a): PTX wrappers, the mma.sync fragment
// helpers, tile loaders and the kernels' argument blocks. Internal to those two files.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/CudaCheck.h"
#include "models/kernels/CpAsync.cuh"

namespace mt::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;

// ---- PTX wrappers ---------------------------------------------------------------------------

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(smem)));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(smem)));
}
__device__ __forceinline__ float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// Dtype codes passed to kernels (uniform branches in epilogues, not template parameters, so the
// output dtype does not multiply the number of kernels).
enum : int { kOutF32 = 0, kOutBF16 = 1, kOutF16 = 2 };

__device__ __forceinline__ void storePair(void* base, int64_t idx, int code, float a, float b) {
  if (code == kOutF32) *reinterpret_cast<float2*>(static_cast<float*>(base) + idx) = make_float2(a, b);
  else if (code == kOutBF16)
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + idx) = __floats2bfloat162_rn(a, b);
  else *reinterpret_cast<__half2*>(static_cast<__half*>(base) + idx) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ float loadAs(const void* base, int64_t idx, int code) {
  if (code == kOutF32) return static_cast<const float*>(base)[idx];
  if (code == kOutBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
  return __half2float(static_cast<const __half*>(base)[idx]);
}

// 8 consecutive elements as floats / from floats; vec: 16-byte aligned (else element by element).
__device__ __forceinline__ void load8(const void* base, int64_t idx, int code, bool vec, float (&x)[8]) {
  if (vec && code == kOutF32) {
    const float4 u = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + idx);
    const float4 w = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + idx + 4);
    x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = w.x, x[5] = w.y, x[6] = w.z, x[7] = w.w;
  } else if (vec) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + idx);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (code == kOutBF16) {
        const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&words[i]);
        x[2 * i] = __low2float(v), x[2 * i + 1] = __high2float(v);
      } else {
        const __half2 v = *reinterpret_cast<const __half2*>(&words[i]);
        x[2 * i] = __low2float(v), x[2 * i + 1] = __high2float(v);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = loadAs(base, idx + i, code);
  }
}
__device__ __forceinline__ void store8(void* base, int64_t idx, int code, bool vec, const float (&x)[8]) {
  if (vec && code == kOutF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + idx) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(static_cast<float*>(base) + idx + 4) = make_float4(x[4], x[5], x[6], x[7]);
  } else if (vec) {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (code == kOutBF16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
        words[i] = *reinterpret_cast<const uint32_t*>(&v);
      } else {
        const __half2 v = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
        words[i] = *reinterpret_cast<const uint32_t*>(&v);
      }
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + idx) = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; i += 2) storePair(base, idx + i, code, x[i], x[i + 1]);
  }
}

__device__ __forceinline__ float roundTo(float x, int code) {
  if (code == kOutBF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (code == kOutF16) return __half2float(__float2half_rn(x));
  return x;
}

// ROWS x D tile starting at row `row0` of a [T, D] slice with row stride st, into shared memory
// with row stride LD; rows >= T are zero-filled.
template <int ROWS, int D, int LD, int NTHREADS, typename T>
__device__ __forceinline__ void loadTile(T* s, const T* g, int64_t st, int row0, int rows, int tid) {
  // A fixed number of passes, each thread on one chunk column (a loop starting at tid compiles to
  // a generic loop with remainder handling).
  constexpr int kChunksPerRow = D / 8, kTotal = ROWS * kChunksPerRow, kPasses = (kTotal + NTHREADS - 1) / NTHREADS;
  static_assert(NTHREADS % kChunksPerRow == 0, "a pass must keep each thread on one chunk column");
  constexpr int kStep = NTHREADS / kChunksPerRow;
  const int r = tid / kChunksPerRow, c = tid % kChunksPerRow;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    if (kTotal % NTHREADS != 0 && r + p * kStep >= ROWS) break;
    const int row = row0 + r + p * kStep;
    const bool ok = row < rows;
    cpAsync16(s + (r + p * kStep) * LD + c * 8, g + static_cast<int64_t>(ok ? row : 0) * st + c * 8, ok);
  }
}
// N floats (N % 4 == 0) starting at element i0 of a row padded to a multiple of 4; chunks starting
// at or past `valid` are zero-filled.
template <int N, int NTHREADS>
__device__ __forceinline__ void loadFloats(float* s, const float* g, int i0, int valid, int tid) {
  // A fixed number of passes (see loadSwizzled in FlashAttentionSm90.cu for why).
  constexpr int kPasses = (N / 4 + NTHREADS - 1) / NTHREADS;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int c = tid + p * NTHREADS;
    if ((N / 4) % NTHREADS != 0 && c >= N / 4) break;
    const bool ok = i0 + 4 * c < valid;
    cpAsync16(s + 4 * c, g + (ok ? i0 + 4 * c : 0), ok);
  }
}

struct FwdArgs {
  const void *q, *k, *v;
  void* o;
  float* lse;
  int64_t qsb, qst, qsh, ksb, kst, ksh, vsb, vst, vsh, osb, ost, osh;
  int T, H, Tp, oCode;
  float scale;
  int tileMajor;  // wgmma kernels: grid of B*H*tiles blocks, tile index fastest (see blockTile)
};

struct BwdArgs {
  const void *q, *k, *v, *dO;
  const float *lse, *delta;
  float* dq;  // f32 accumulator
  void *dk, *dv;
  int64_t qsb, qst, qsh, ksb, kst, ksh, vsb, vst, vsh, gsb, gst, gsh;
  int64_t dqsb, dqst, dqsh, dksb, dkst, dksh, dvsb, dvst, dvsh;
  int T, H, Tp, dkCode, dvCode;
  float scale;
  int tileMajor;  // as in FwdArgs
};

// The block's tile index and b*H + h. Tile-major (a 1-D grid, tile fastest): the blocks of one
// (b, h) run side by side, so the q / k / v / dO rows they all read and the dQ rows they all add to
// stay in L2 (FlashAttention-2's grid order). Otherwise (B*H, tiles) with b*h fastest.
__device__ __forceinline__ void blockTile(int tileMajor, int nTiles, int& tile, int& bh) {
  if (tileMajor) {
    tile = static_cast<int>(blockIdx.x % nTiles), bh = static_cast<int>(blockIdx.x / nTiles);
  } else {
    tile = static_cast<int>(blockIdx.y), bh = static_cast<int>(blockIdx.x);
  }
}
inline dim3 tileGrid(int tileMajor, int BH, int nTiles) {
  return tileMajor ? dim3(static_cast<unsigned>(BH) * static_cast<unsigned>(nTiles)) : dim3(BH, nTiles);
}

// Every attention launcher: `kernel` on grid x threads with smem bytes of dynamic shared memory
// (its limit raised first) and, with maxShared, all of the unified L1 as shared memory (the default
// carveout caps blocks per SM below what registers allow), then the launch checked.
template <typename... Params, typename... Args>
void launchWithSmem(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, bool maxShared, cudaStream_t s,
                    const Args&... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  if (maxShared)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  kernel<<<grid, threads, smem, s>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

// One key tile of the forward's online softmax for a 16-row block (rows rowBase + g and + 8): S
// (mma-layout accumulator over the tile's keys kBase..) masked where key > row, the running row max
// m (log2 domain) and sum l updated, O rescaled, and S replaced by P = exp2(sl2 S - m).
// LAZY: a row keeps its max until this tile's exceeds it by more than kLazyMax (log2 domain), and
// the warp rescales O only when some row moved (FlashAttention-4's rule); P then stays below
// 2^kLazyMax and the result is the same after the final division by l.
constexpr float kLazyMax = 8.f;
// TREE: the row max and the row sum of the tile as pairwise trees (depth log2 of the terms) instead
// of one chain through all of them: the same max, sums in another order.
template <int N, typename F>
__device__ __forceinline__ float treeReduce(float (&v)[N], F op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2)
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) v[i] = op(v[i], v[i + w]);
  return v[0];
}
// softmaxTile in three pieces, for a caller that cannot touch O while a product into it is in
// flight (the overlapped forward of FlashAttentionSm90Ws.cu): softmaxRescale masks S, finds the new
// running max, multiplies l by its factor and says whether O must be multiplied too (by alpha0 /
// alpha1; u0 / u1 are the offsets the exponentials subtract); softmaxExp makes P and adds it to l;
// scaleRows multiplies O. softmaxTile runs them in its original order.
template <bool LAZY, bool TREE, int NT>
__device__ __forceinline__ bool softmaxRescale(float (&s)[NT][4], float& m0, float& m1, float& l0, float& l1,
                                               int kBase, int rowBase, int g, int t4, float sl2,
                                               float& alpha0, float& alpha1, float& u0, float& u1) {
  const int row0 = rowBase + g, row1 = row0 + 8;
  if (kBase + NT * 8 - 1 > rowBase) {  // the diagonal crosses this tile: mask key > row
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int key = kBase + nt * 8 + 2 * t4;
      if (key > row0) s[nt][0] = -INFINITY;
      if (key + 1 > row0) s[nt][1] = -INFINITY;
      if (key > row1) s[nt][2] = -INFINITY;
      if (key + 1 > row1) s[nt][3] = -INFINITY;
    }
  }
  float mx0 = -INFINITY, mx1 = -INFINITY;
  if constexpr (TREE) {
    float a[NT], b[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) a[nt] = fmaxf(s[nt][0], s[nt][1]), b[nt] = fmaxf(s[nt][2], s[nt][3]);
    const auto mx = [](float x, float y) { return fmaxf(x, y); };
    mx0 = treeReduce(a, mx), mx1 = treeReduce(b, mx);
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float n0 = fmaxf(m0, mx0 * sl2), n1 = fmaxf(m1, mx1 * sl2);
  // A row with nothing visible yet keeps -inf; use 0 so exp2 stays finite (all its p are 0).
  u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
  // m == -inf (nothing seen yet) compares as a jump of +inf: the first tile always sets the max.
  if (!LAZY || __any_sync(0xffffffffu, n0 - m0 > kLazyMax || n1 - m1 > kLazyMax)) {
    alpha0 = fastExp2(m0 - u0), alpha1 = fastExp2(m1 - u1);
    m0 = n0, m1 = n1;
    l0 *= alpha0, l1 *= alpha1;
    return true;
  }
  u0 = m0 == -INFINITY ? 0.f : m0, u1 = m1 == -INFINITY ? 0.f : m1;
  return false;
}
template <int DT>
__device__ __forceinline__ void scaleRows(float (&o)[DT][4], float alpha0, float alpha1) {
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    o[dt][0] *= alpha0, o[dt][1] *= alpha0;
    o[dt][2] *= alpha1, o[dt][3] *= alpha1;
  }
}
template <bool TREE, int NT>
__device__ __forceinline__ void softmaxExp(float (&s)[NT][4], float& l0, float& l1, float u0, float u1,
                                           float sl2) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][0] = fastExp2(fmaf(s[nt][0], sl2, -u0));
    s[nt][1] = fastExp2(fmaf(s[nt][1], sl2, -u0));
    s[nt][2] = fastExp2(fmaf(s[nt][2], sl2, -u1));
    s[nt][3] = fastExp2(fmaf(s[nt][3], sl2, -u1));
    if constexpr (!TREE) {
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
    }
  }
  if constexpr (TREE) {
    float a[NT], b[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) a[nt] = s[nt][0] + s[nt][1], b[nt] = s[nt][2] + s[nt][3];
    const auto add = [](float x, float y) { return x + y; };
    l0 += treeReduce(a, add), l1 += treeReduce(b, add);
  }
}
template <bool LAZY = false, bool TREE = false, int NT, int DT>
__device__ __forceinline__ void softmaxTile(float (&s)[NT][4], float (&o)[DT][4], float& m0, float& m1,
                                            float& l0, float& l1, int kBase, int rowBase, int g, int t4,
                                            float sl2) {
  float alpha0, alpha1, u0, u1;
  if (softmaxRescale<LAZY, TREE>(s, m0, m1, l0, l1, kBase, rowBase, g, t4, sl2, alpha0, alpha1, u0, u1))
    scaleRows(o, alpha0, alpha1);
  softmaxExp<TREE>(s, l0, l1, u0, u1, sl2);
}

// Forward epilogue: rows row0 and row0 + 8 of O (an mma-layout accumulator, columns 8 dt + 2 t) divided
// by their softmax sums l (this lane's partials, summed over the 4 lanes of a row here), and lse =
// m + log2 l; rows outside [0, T) skipped.
template <int DT>
__device__ __forceinline__ void storeRows(const FwdArgs& a, int b, int h, int row0, int t4, const float (&o)[DT][4],
                                          float m0, float m1, float l0, float l1) {
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  const int64_t oBase = b * a.osb + h * a.osh, lBase = static_cast<int64_t>(b * a.H + h) * a.Tp;
  const int row1 = row0 + 8;
  if (row0 >= 0 && row0 < a.T) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      storePair(a.o, oBase + row0 * a.ost + dt * 8 + 2 * t4, a.oCode, o[dt][0] * inv0, o[dt][1] * inv0);
    if (t4 == 0) a.lse[lBase + row0] = m0 + log2f(l0);
  }
  if (row1 >= 0 && row1 < a.T) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      storePair(a.o, oBase + row1 * a.ost + dt * 8 + 2 * t4, a.oCode, o[dt][2] * inv1, o[dt][3] * inv1);
    if (t4 == 0) a.lse[lBase + row1] = m1 + log2f(l1);
  }
}

// Backward epilogue: the thread's dK (times the softmax scale) and dV rows key0 and key0 + 8 of an
// mma-layout accumulator pair (columns 8 dt + 2 t), rows at or past T skipped.
template <int DT>
__device__ __forceinline__ void storeKeyGrads(const BwdArgs& a, int b, int h, int key0, int t4, const float (&dk)[DT][4],
                                              const float (&dv)[DT][4]) {
  const int64_t kOff = b * a.dksb + h * a.dksh, vOff = b * a.dvsb + h * a.dvsh;
  const int key1 = key0 + 8;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int col = dt * 8 + 2 * t4;
    if (key0 < a.T) {
      storePair(a.dk, kOff + key0 * a.dkst + col, a.dkCode, dk[dt][0] * a.scale, dk[dt][1] * a.scale);
      storePair(a.dv, vOff + key0 * a.dvst + col, a.dvCode, dv[dt][0], dv[dt][1]);
    }
    if (key1 < a.T) {
      storePair(a.dk, kOff + key1 * a.dkst + col, a.dkCode, dk[dt][2] * a.scale, dk[dt][3] * a.scale);
      storePair(a.dv, vOff + key1 * a.dvst + col, a.dvCode, dv[dt][2], dv[dt][3]);
    }
  }
}

// wgmma kernels (FlashAttentionSm90.cu), head dim 64: explicitly instantiated there for bf16 and f16.
// Forward: NWG warpgroups of 64 queries per block, BC keys per tile.
// ORDER: 1 = tile-major grid (blockTile), 0 = b*h fastest.
// OPT: kFwdQReg (1) | kFwdLazyRescale (2), see FlashAttentionSm90.cu.
template <int BC, int NWG, int MINB, int ORDER, int OPT, typename T>
void launchForwardSm90(const FwdArgs& a, int B, cudaStream_t s);
// Backward with 2 warpgroups of 64 keys against 128-query tiles, dQ over the block's 128 keys.
template <int ORDER, typename T>
void launchBackwardSm90Q128(const BwdArgs& a, int B, cudaStream_t s);
// The same products warp-specialized: a producer warpgroup copying by TMA into a 2-stage ring,
// dQ added by tensor reduce-adds (FlashAttentionSm90Ws.cu).
// Warp-specialized forward: a TMA producer warpgroup and 3 consumers of 64 queries; OVERLAP: each
// consumer's softmax of key tile j under its O += P v of tile j - 1 (FlashAttention-3's
// intra-warpgroup pipelining), bitwise the same output.
template <typename T, bool OVERLAP>
void launchForwardSm90Ws(const FwdArgs& a, int B, cudaStream_t s);
template <typename T>
void launchBackwardSm90Ws(const BwdArgs& a, int B, cudaStream_t s);
// The device is compute capability 9.0 and its loaded code was built for sm_90a (wgmma present).
bool sm90KernelsUsable();

}  // namespace mt::cuda::flash
