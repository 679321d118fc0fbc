// LayerNorm over the last dimension (math in models/layers/LayerNorm.h).
// Two kernel families, chosen by MT_LN_KERNEL (core/EnvParams.cpp):
// - vectorised (default, C % 8 == 0 and C <= 32 * 8 * kMaxVec = 2048): one warp per row, the row
//   held in registers (16-byte loads, lane l owning channels 8 (l + 32 k) ..+8), mean/variance and
//   the backward's two row means by warp shuffles only — no block barrier per row. Backward: each
//   warp walks a fixed set of rows and keeps dw/db of its channels in registers; the block's warps
//   add theirs in warp order into one partial per block, summed in block order by lnBwdReduce. Up
//   to C = 1024 the normalised row stays in registers between the backward's two halves; above, it
//   is made again from x (an L1 hit) so that dw and db still fit.
// - generic (any C): forward one warp per row with scalar loads; backward one block per 32 rows,
//   block-wide reductions per row.
// Both are deterministic for a given shape (fixed trees, fixed row-to-warp assignment).

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/EnvParams.h"
#include "core/cuda/ElementConvert.cuh"
#include "core/cuda/Fp8Cast.cuh"
#include "models/kernels/CudaLayers.h"
#include "core/cuda/KernelUtil.cuh"

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


// ---- vectorised kernels ---------------------------------------------------------------------

constexpr int kMaxVec = 8;  // 8-element chunks per lane: C <= 2048 (GPT-2 up to 1.5B)

// 8 consecutive elements (16-byte aligned) as floats, and back.
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = toF32(e[i]);
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = fromF32<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

constexpr int kVecWarps = 8;

// A row of the warp-per-row forwards: lane l's chunks l + 32 k of x's row into v (zeros past C),
// then the row's mean m and rstd rs by shuffles. One function, so that every forward kernel makes
// the same row bit for bit (lnFwdVec's y and lnFwdFp8's codes of it).
template <int NV>
__device__ __forceinline__ void lnRowStats(const float* xr, int lane, int C8, int64_t C, float eps, float (&v)[NV][8],
                                           float& m, float& rs) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c8 = lane + 32 * k;
    if (c8 < C8) load8(xr + 8 * c8, v[k]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (c8 >= C8) v[k][i] = 0.f;
      s += v[k][i];
    }
  }
  m = warpSum(s) / static_cast<float>(C);
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (lane + 32 * k < C8)
#pragma unroll
      for (int i = 0; i < 8; ++i) q += (v[k][i] - m) * (v[k][i] - m);
  rs = rsqrtf(warpSum(q) / static_cast<float>(C) + eps);
}

// Chunk c8 of a row's output in f32, (v - m) rs w + b: lnFwdVec's y before it is stored.
__device__ __forceinline__ void lnChunkOut(const float* w, const float* b, int c8, const float (&v)[8], float m,
                                           float rs, float (&o)[8]) {
  float wv[8], bv[8];
  load8(w + 8 * c8, wv);
  load8(b + 8 * c8, bv);
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = (v[i] - m) * rs * wv[i] + bv[i];
}

template <int NV, typename Tout>
__global__ void __launch_bounds__(kVecWarps * 32) lnFwdVec(const float* x, const float* w, const float* b, Tout* y,
                                                           float* mean, float* rstd, int64_t R, int64_t C, float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kVecWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, C8 = static_cast<int>(C / 8);
  if (row >= R) return;
  float v[NV][8], m, rs;
  lnRowStats<NV>(x + row * C, lane, C8, C, eps, v, m, rs);
  Tout* yr = y + row * C;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c8 = lane + 32 * k;
    if (c8 >= C8) continue;
    float o[8];
    lnChunkOut(w, b, c8, v[k], m, rs, o);
    store8(yr + 8 * c8, o);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

// lnFwdVec whose output goes only to an FP8 GEMM (the GPT blocks' ln_1 -> qkv, ln_2 -> fc): each
// row made as lnFwdVec makes it (the same operations, rounded to Tout as y would be), then cast
// with cs's scale (core/cuda/Fp8Cast.cuh) into q[r, :] and, through a byte tile of the block's 32
// rows in shared memory, into the transposed codes qt[:, r] the weight-gradient GEMM reads; the
// amax is that of the rounded values. So the codes, scale and amax are bit for bit lnFwdVec's y
// cast by castKernelVec, without y written and read again (2 + 2 bytes an element of 10) and
// without y in memory. A block: 8 warps, 32 rows (4 a warp). Transposed write: lanes 2j and 2j+1
// take the same 4 columns, rows 0-15 and 16-31, so each 16-byte store instruction fills whole
// 32-byte sectors of qt; rows 16-31 of the tile start 64 bytes further, so those two lanes' reads
// (16 rows apart, 16 C bytes: the same bank) fall in different banks.
constexpr int kFp8LnRows = 32, kFp8LnShift = 64;
__host__ __device__ constexpr int64_t fp8LnTileBytes(int64_t C) { return kFp8LnRows * C + kFp8LnShift; }
__device__ __forceinline__ int64_t fp8LnTileRow(int j, int64_t C) { return j * C + (j >= 16 ? kFp8LnShift : 0); }

// The four columns of four rows' 32-bit words (a byte a column), as four words of four rows each.
__device__ __forceinline__ void transpose4x4(const uint32_t (&r)[4], uint32_t (&c)[4]) {
  const uint32_t lo01 = __byte_perm(r[0], r[1], 0x5140), lo23 = __byte_perm(r[2], r[3], 0x5140);
  const uint32_t hi01 = __byte_perm(r[0], r[1], 0x7362), hi23 = __byte_perm(r[2], r[3], 0x7362);
  c[0] = __byte_perm(lo01, lo23, 0x5410);
  c[1] = __byte_perm(lo01, lo23, 0x7632);
  c[2] = __byte_perm(hi01, hi23, 0x5410);
  c[3] = __byte_perm(hi01, hi23, 0x7632);
}

template <int NV, typename Tout>
__global__ void __launch_bounds__(kVecWarps * 32)
    lnFwdFp8(const float* x, const float* w, const float* b, uint8_t* q, uint8_t* qt, float* mean, float* rstd,
             int64_t R, int64_t C, float eps, CastScaling cs) {
  extern __shared__ __align__(16) uint8_t tile[];  // fp8LnTileBytes(C)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, C8 = static_cast<int>(C / 8);
  const float scale = castScale(cs);
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kFp8LnRows);  // R % 32 == 0: all 32 rows exist
  float amax = 0.f;
  for (int j = warp; j < kFp8LnRows; j += kVecWarps) {
    const int64_t row = r0 + j;
    float v[NV][8], m, rs;
    lnRowStats<NV>(x + row * C, lane, C8, C, eps, v, m, rs);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c8 = lane + 32 * k;
      if (c8 >= C8) continue;
      float o[8];
      lnChunkOut(w, b, c8, v[k], m, rs, o);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        o[i] = toF32(fromF32<Tout>(o[i]));  // y as lnFwdVec stores it
        amax = absMaxBits(amax, o[i]);
      }
      const uint2 p = castEight(o, scale, cs.f);
      *reinterpret_cast<uint2*>(q + row * C + 8 * c8) = p;
      *reinterpret_cast<uint2*>(tile + fp8LnTileRow(j, C) + 8 * c8) = p;
    }
    if (lane == 0) {
      if (mean) mean[row] = m;
      if (rstd) rstd[row] = rs;
    }
  }
  castAmax(cs, amax, scale);  // every thread; its barriers also order the tile's writes before the reads
  __syncthreads();
  const int half = threadIdx.x % 2;
  for (int64_t c4 = threadIdx.x / 2; c4 < C / 4; c4 += blockDim.x / 2) {
    uint32_t out[4][4];  // out[k][g]: column 4 c4 + k, rows 16 half + 4 g ..+4
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t rw[4], cw[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        rw[i] = *reinterpret_cast<const uint32_t*>(tile + fp8LnTileRow(16 * half + 4 * g + i, C) + 4 * c4);
      transpose4x4(rw, cw);
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k][g] = cw[k];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
      *reinterpret_cast<uint4*>(qt + (4 * c4 + k) * R + r0 + 16 * half) =
          make_uint4(out[k][0], out[k][1], out[k][2], out[k][3]);
  }
}

// Rows a warp walks in the vectorised backward: 32, or fewer (down to 4) so that the grid has at
// least 256 blocks (d48's 16 x 1024 rows made 64 blocks of 32 rows a warp: half the SMs idle). The
// grid is sized from R alone, not from the device, so the summation order is the same on every GPU.
constexpr int kVecRowsPerWarp = 32, kVecMinRowsPerWarp = 4, kVecMinBlocks = 256;
int64_t vecRowsPerBlock(int64_t R) {
  const int64_t perWarp = R / (int64_t{kVecWarps} * kVecMinBlocks);
  return kVecWarps * std::min<int64_t>(kVecRowsPerWarp, std::max<int64_t>(kVecMinRowsPerWarp, perWarp));
}

// Two blocks (16 warps) per SM up to C = 768: enough loads in flight for the bandwidth. KEEP_N
// (NV <= 4): the normalised row stays in registers between the two halves; otherwise it is made
// again from x, so that dw and db (16 NV floats a lane) fit beside the loads without spilling.
template <int NV, typename Tdy, typename Tlow, bool KEEP_N = (NV <= 4)>
__global__ void __launch_bounds__(kVecWarps * 32, NV <= 3 ? 2 : 1) lnBwdVec(const Tdy* dy, const float* x, const float* w,
                                                           const float* mean, const float* rstd,
                                                           const float* residual, float* dx, Tlow* dxLow,
                                                           float* partW, float* partB, int64_t R, int64_t C) {
  extern __shared__ float acc[];  // [2*C]: the block's dw and db partials
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, C8 = static_cast<int>(C / 8);
  float dw[NV][8], db[NV][8];
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int i = 0; i < 8; ++i) dw[k][i] = db[k][i] = 0.f;
  const float invC = 1.f / static_cast<float>(C);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kVecWarps) + warp; r < R;
       r += static_cast<int64_t>(gridDim.x) * kVecWarps) {
    const float m = mean[r], rs = rstd[r];
    // n stays in registers between the two halves (KEEP_N); dy and w are read again in the second
    // (L1 hits: the warp read them a moment ago), which keeps two blocks per SM without spilling.
    float n[KEEP_N ? NV : 1][8];
    float sg = 0.f, sgn = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c8 = lane + 32 * k;
      if (c8 >= C8) continue;
      float g[8], wv[8];
      float(&nk)[8] = n[KEEP_N ? k : 0];
      load8(x + r * C + 8 * c8, nk);
      load8(dy + r * C + 8 * c8, g);
      load8(w + 8 * c8, wv);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        nk[i] = (nk[i] - m) * rs;
        const float gw = g[i] * wv[i];
        sg += gw;
        sgn += gw * nk[i];
        dw[k][i] += g[i] * nk[i];
        db[k][i] += g[i];
      }
    }
    const float mg = warpSum(sg) * invC, mgn = warpSum(sgn) * invC;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c8 = lane + 32 * k;
      if (c8 >= C8) continue;
      float d[8], res[8], g[8], wv[8];
      float(&nk)[8] = n[KEEP_N ? k : 0];
      if constexpr (!KEEP_N) {
        load8(x + r * C + 8 * c8, nk);
#pragma unroll
        for (int i = 0; i < 8; ++i) nk[i] = (nk[i] - m) * rs;  // the same operations as the first half
      }
      load8(dy + r * C + 8 * c8, g);
      load8(w + 8 * c8, wv);
      if (residual) load8(residual + r * C + 8 * c8, res);
#pragma unroll
      for (int i = 0; i < 8; ++i) d[i] = rs * (g[i] * wv[i] - mg - nk[i] * mgn) + (residual ? res[i] : 0.f);
      store8(dx + r * C + 8 * c8, d);
      if (dxLow) store8(dxLow + r * C + 8 * c8, d);
    }
  }
  // The warps' partials into acc in warp order (deterministic), then out as the block's partial.
  for (int turn = 0; turn < kVecWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c8 = lane + 32 * k;
        if (c8 >= C8) continue;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int c = 8 * c8 + i;
          acc[c] = turn == 0 ? dw[k][i] : acc[c] + dw[k][i];
          acc[C + c] = turn == 0 ? db[k][i] : acc[C + c] + db[k][i];
        }
      }
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    partW[blockIdx.x * C + c] = acc[c];
    partB[blockIdx.x * C + c] = acc[C + c];
  }
}

// The vectorised kernels apply: C a multiple of 8 that fits kMaxVec chunks per lane, every
// pointer 16-byte aligned (rows then are too, C being a multiple of 8), and MT_LN_KERNEL=1.
bool useVec(int64_t C, std::initializer_list<const void*> ptrs) {
  static const bool enabled = envInt(EnvParam::kLnKernel) == 1;
  if (!enabled || C % 8 != 0 || C > 32 * 8 * kMaxVec) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
// Calls f(std::integral_constant<int, NV>) with NV = the chunks per lane C needs.
template <typename F>
void dispatchVec(int64_t C, F&& f) {
  const int64_t nv = (C / 8 + 31) / 32;
  if (nv <= 1) f(std::integral_constant<int, 1>{});
  else if (nv == 2) f(std::integral_constant<int, 2>{});
  else if (nv == 3) f(std::integral_constant<int, 3>{});
  else if (nv == 4) f(std::integral_constant<int, 4>{});
  else if (nv == 5) f(std::integral_constant<int, 5>{});
  else if (nv == 6) f(std::integral_constant<int, 6>{});
  else if (nv == 7) f(std::integral_constant<int, 7>{});
  else f(std::integral_constant<int, 8>{});
}

}  // namespace

void layerNormForward(Tensor& y, Tensor* mean, Tensor* rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                      float eps) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  if (R == 0) return;
  // Both forward kernels: one warp per row, kVecWarps rows per block.
  const unsigned blocks = static_cast<unsigned>((R + kVecWarps - 1) / kVecWarps);
  const bool vec = useVec(C, {x.rawData(), w.rawData(), b.rawData(), y.rawData()});
  dispatchFloat(y.dtype(), [&](auto tout) {
    using Tout = decltype(tout);
    auto* kernel = lnFwd<Tout>;
    if (vec) dispatchVec(C, [&](auto nv) { kernel = lnFwdVec<decltype(nv)::value, Tout>; });
    kernel<<<blocks, kVecWarps * 32, 0, currentStream()>>>(x.data<float>(), w.data<float>(), b.data<float>(),
                                                           static_cast<Tout*>(y.rawData()),
                                                           mean ? mean->data<float>() : nullptr,
                                                           rstd ? rstd->data<float>() : nullptr, R, C, eps);
  });
  checkLaunch();
}

bool layerNormForwardFp8(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* mean, Tensor* rstd, float eps,
                        DType yType, const LayerNormFp8Out& out) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  Tensor& q = *out.q;
  Tensor& qt = *out.qt;
  if (R == 0 || R % kFp8LnRows != 0 || R / kFp8LnRows >= (int64_t{1} << 31) ||
      (yType != DType::kF32 && yType != DType::kBF16 && yType != DType::kF16) ||
      !useVec(C, {x.rawData(), w.rawData(), b.rawData(), q.rawData(), qt.rawData()}))
    return false;
  MT_CHECK(x.dtype() == DType::kF32 && x.isContiguous() && q.dtype() == DType::kU8 && q.numel() == x.numel() &&
               qt.dtype() == DType::kU8 && qt.numel() == x.numel(),
           "layernorm into fp8 codes: x ", x.str(), ", q ", q.str(), ", qt ", qt.str());
  CastScaling cs;
  if (!producerScaling(*out.st, out.replay, &cs)) return false;
  const size_t smem = static_cast<size_t>(fp8LnTileBytes(C));
  dispatchFloat(yType, [&](auto tout) {
    using Tout = decltype(tout);
    dispatchVec(C, [&](auto nv) {
      auto* kernel = lnFwdFp8<decltype(nv)::value, Tout>;
      if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<static_cast<unsigned>(R / kFp8LnRows), kVecWarps * 32, smem, currentStream()>>>(
          x.data<float>(), w.data<float>(), b.data<float>(), q.data<uint8_t>(), qt.data<uint8_t>(),
          mean ? mean->data<float>() : nullptr, rstd ? rstd->data<float>() : nullptr, R, C, eps, cs);
    });
  });
  checkLaunch();
  if (!out.replay) out.st->setCasts(out.st->casts() + 1);
  return true;
}

void layerNormBackward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& mean, const Tensor& rstd, const Tensor* residual, Tensor* dxLow) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  if (R == 0) return;
  const bool vec = useVec(C, {dy.rawData(), x.rawData(), w.rawData(), residual ? residual->rawData() : nullptr,
                              dx.rawData(), dxLow && dxLow->defined() ? dxLow->rawData() : nullptr});
  const int64_t rowsPerBlock = vec ? vecRowsPerBlock(R) : kLnRowsPerBlock;
  const int64_t blocks = (R + rowsPerBlock - 1) / rowsPerBlock;
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
      if (vec) dispatchVec(C, [&](auto nv) { kernel = lnBwdVec<decltype(nv)::value, Tdy, Tlow>; });
      if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<static_cast<unsigned>(blocks), vec ? kVecWarps * 32 : kLnBwdThreads, smem, currentStream()>>>(
          dyp, x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), res, dx.data<float>(), low,
          partW.data<float>(), partB.data<float>(), R, C);
    });
  });
  lnBwdReduce<<<static_cast<unsigned>((C + 31) / 32), 32 * kReduceRows, 0, currentStream()>>>(
      partW.data<float>(), partB.data<float>(), dw.data<float>(), db.data<float>(), blocks, C);
  checkLaunch();
}

}  // namespace mt::cuda
