// FlashAttention-2-style causal attention (math and layout in models/kernels/FlashAttention.h):
// the mma.sync kernels, the pre-pass and dq conversion, the variant tables and the entry points.
// The wgmma kernels for sm_90a are in FlashAttentionSm90.cu and FlashAttentionSm90Ws.cu (the
// warp-specialized ones) and listed first in the tables.
//
// Tensor-core fragments (PTX ISA, mma.m16n8k16 with .bf16/.f16 operands, f32 accumulators), for
// lane = 4 g + t (g = lane / 4, t = lane % 4):
//   A 16x16 (4 regs, 2 elements each): a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8  (2 regs):                  b0 (k 2t.., n g), b1 (k 2t+8.., n g)
//   C 16x8  (4 floats):                c0,c1 (g, 2t..), c2,c3 (g+8, 2t..)
// so an S accumulator pair (two 8-column tiles) is, packed to bf16, the A operand of P v directly.
// Shared-memory rows are padded by 16 bytes: the 8 rows one ldmatrix reads fall in 8 different
// 16-byte bank groups (no conflicts) for D = 32, 64, 128.
//
// Forward: one block per (tile of BR = 16 * WARPS queries, b*h), heaviest tiles (last queries)
// launched first. K tile j and V tile j are double-issued through cp.async so the V load overlaps
// S = q k^T and the next K load overlaps O += P v.
// Backward: one block per (tile of BC = 16 * WARPS keys, b*h); each warp owns 16 keys and computes
// S^T = k q^T (keys as rows), so P^T and dS^T are A operands of dV += P^T dO and dK += dS^T q from
// registers; dS^T goes to shared memory once for dQ += dS k, added to global f32 with float4
// atomics. Query tiles (q, dO, lse, D) are double-buffered.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/Check.h"
#include "core/cuda/CudaCheck.h"
#include "models/kernels/FlashAttention.h"
#include "models/kernels/FlashCommon.cuh"

namespace mt::cuda {

namespace {

using namespace flash;

int outCode(DType d) {
  switch (d) {
    case DType::kF32: return kOutF32;
    case DType::kBF16: return kOutBF16;
    case DType::kF16: return kOutF16;
    default: MT_CHECK(false, "flash attention: unsupported dtype ", dtypeName(d));
  }
  return 0;
}

// ---- forward --------------------------------------------------------------------------------

// Q tile (BR rows) plus two stages of K and V tiles.
template <int D, int WARPS, int BC, int MW>
constexpr size_t fwdSmemBytes() {
  return static_cast<size_t>(WARPS * 16 * MW + 4 * BC) * (D + 8) * 2;
}

// MW: 16-row blocks per warp (2 halves the shared-memory reads of K and V per FLOP).
// MINB: blocks per multiprocessor the register allocation must allow (__launch_bounds__).
template <int D, int WARPS, int BC, int MW, int MINB, typename T>
__global__ void __launch_bounds__(WARPS * 32, MINB) flashForwardKernel(const FwdArgs a) {
  constexpr int kThreads = WARPS * 32, BR = WARPS * 16 * MW, LD = D + 8, KC = D / 16, NT = BC / 8, DT = D / 8;
  static_assert(D % 16 == 0 && BC % 16 == 0 && DT % 2 == 0, "tile shape");
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sQ = reinterpret_cast<T*>(smemRaw);
  T* sK = sQ + BR * LD;       // [2][BC][LD]
  T* sV = sK + 2 * BC * LD;   // [2][BC][LD]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int nQ = (a.T + BR - 1) / BR;
  // grid (b*h, query tiles): every head's last (heaviest) query tile is dispatched first.
  const int qTile = nQ - 1 - static_cast<int>(blockIdx.y);
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int qBase = qTile * BR;
  const T* Q = static_cast<const T*>(a.q) + b * a.qsb + h * a.qsh;
  const T* K = static_cast<const T*>(a.k) + b * a.ksb + h * a.ksh;
  const T* V = static_cast<const T*>(a.v) + b * a.vsb + h * a.vsh;

  loadTile<BR, D, LD, kThreads>(sQ, Q, a.qst, qBase, a.T, tid);
  loadTile<BC, D, LD, kThreads>(sK, K, a.kst, 0, a.T, tid);
  loadTile<BC, D, LD, kThreads>(sV, V, a.vst, 0, a.T, tid);
  cpAsyncCommit();

  const int qw = qBase + warp * 16 * MW, qLast = qw + 16 * MW - 1;  // the warp's rows
  float o[MW][DT][4], m[MW][2], l[MW][2];
#pragma unroll
  for (int mb = 0; mb < MW; ++mb) {
    m[mb][0] = m[mb][1] = -INFINITY;
    l[mb][0] = l[mb][1] = 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[mb][dt][0] = o[mb][dt][1] = o[mb][dt][2] = o[mb][dt][3] = 0.f;
  }
  const float sl2 = a.scale * kLog2e;
  const int kvEnd = min(a.T, qBase + BR);
  const int nKV = (kvEnd + BC - 1) / BC;
  uint32_t qf[MW][KC][4];

  for (int j = 0; j < nKV; ++j) {
    const int kBase = j * BC, stage = j & 1;
    cpAsyncWait<0>();
    __syncthreads();  // tile j in; every warp is done with tile j-1, whose stage is reloaded next
    if (j == 0) {
#pragma unroll
      for (int mb = 0; mb < MW; ++mb)
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
          ldsm4(qf[mb][kc],
                sQ + (warp * 16 * MW + mb * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kc * 16 + (lane >> 4) * 8);
    }
    if (j + 1 < nKV) {
      loadTile<BC, D, LD, kThreads>(sK + (stage ^ 1) * BC * LD, K, a.kst, kBase + BC, a.T, tid);
      loadTile<BC, D, LD, kThreads>(sV + (stage ^ 1) * BC * LD, V, a.vst, kBase + BC, a.T, tid);
      cpAsyncCommit();
    }
    if (kBase > qLast) continue;  // warp-uniform: every key of the tile is after the warp's rows
    const T* k = sK + stage * BC * LD;
    const T* v = sV + stage * BC * LD;
    float s[MW][NT][4];
#pragma unroll
    for (int mb = 0; mb < MW; ++mb)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[mb][nt][0] = s[mb][nt][1] = s[mb][nt][2] = s[mb][nt][3] = 0.f;
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      if (kBase + np * 16 > qLast) continue;  // above the diagonal for every row of the warp
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        uint32_t kb[4];
        ldsm4(kb, k + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kc * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mb = 0; mb < MW; ++mb) {
          Mma<T>::run(s[mb][2 * np], qf[mb][kc], kb[0], kb[1]);
          Mma<T>::run(s[mb][2 * np + 1], qf[mb][kc], kb[2], kb[3]);
        }
      }
    }
#pragma unroll
    for (int mb = 0; mb < MW; ++mb)
      softmaxTile(s[mb], o[mb], m[mb][0], m[mb][1], l[mb][0], l[mb][1], kBase, qw + mb * 16, g, t4, sl2);
#pragma unroll
    for (int kc2 = 0; kc2 < BC / 16; ++kc2) {
      if (kBase + kc2 * 16 > qLast) continue;
      uint32_t pa[MW][4];
#pragma unroll
      for (int mb = 0; mb < MW; ++mb) {
        pa[mb][0] = Mma<T>::pack(s[mb][2 * kc2][0], s[mb][2 * kc2][1]);
        pa[mb][1] = Mma<T>::pack(s[mb][2 * kc2][2], s[mb][2 * kc2][3]);
        pa[mb][2] = Mma<T>::pack(s[mb][2 * kc2 + 1][0], s[mb][2 * kc2 + 1][1]);
        pa[mb][3] = Mma<T>::pack(s[mb][2 * kc2 + 1][2], s[mb][2 * kc2 + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t vb[4];
        ldsm4t(vb, v + (kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mb = 0; mb < MW; ++mb) {
          Mma<T>::run(o[mb][2 * dp], pa[mb], vb[0], vb[1]);
          Mma<T>::run(o[mb][2 * dp + 1], pa[mb], vb[2], vb[3]);
        }
      }
    }
  }

#pragma unroll
  for (int mb = 0; mb < MW; ++mb) storeRows(a, b, h, qw + mb * 16 + g, t4, o[mb], m[mb][0], m[mb][1], l[mb][0], l[mb][1]);
}

// ---- backward -------------------------------------------------------------------------------

// delta[bh][t] = sum_j dO * O, dO copied into the input dtype when it arrives in another one, and
// the f32 dq accumulator zeroed. One thread per 8 elements, D / 8 threads per (b, t, h) row.
struct PrepArgs {
  const void *o, *dO;
  int64_t osb, ost, osh, gsb, gst, gsh;
  int oCode, gCode;
  bool oVec, gVec, qVec;
  void* dOc;  // null: dO is used as it is
  int cCode;
  float* dqAcc;
  int64_t dsb, dst, dsh;
  float* delta;
  int B, T, H, D, Tp;
};

__global__ void flashPrepKernel(const PrepArgs a) {
  const int cpr = a.D / 8;  // 4, 8 or 16: groups of lanes within one warp
  const int64_t total = static_cast<int64_t>(a.B) * a.T * a.H * cpr;
  const int lane = threadIdx.x % 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Warp-uniform trip count (shuffles below need the whole warp).
  for (int64_t base = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) - lane; base < total;
       base += stride) {
    const int64_t c = base + lane;
    const bool valid = c < total;
    const int64_t r = valid ? c / cpr : 0;
    const int j = static_cast<int>(c % cpr) * 8;
    const int h = static_cast<int>(r % a.H), t = static_cast<int>((r / a.H) % a.T),
              b = static_cast<int>(r / (a.H * static_cast<int64_t>(a.T)));
    float acc = 0.f;
    if (valid) {
      float g[8], o[8];
      load8(a.dO, b * a.gsb + t * a.gst + h * a.gsh + j, a.gCode, a.gVec, g);
      load8(a.o, b * a.osb + t * a.ost + h * a.osh + j, a.oCode, a.oVec, o);
      // delta from dO rounded as the tensor cores see it, so that dS = P (dP - delta) is
      // consistent (exactly 0 at T = 1) instead of carrying dO's rounding error into every entry.
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        g[i] = roundTo(g[i], a.cCode);
        acc += g[i] * o[i];
      }
      if (a.dOc) store8(a.dOc, r * a.D + j, a.cCode, true, g);  // dOc: [B, T, H, D]
      const float zero[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      store8(a.dqAcc, b * a.dsb + t * a.dst + h * a.dsh + j, kOutF32, a.qVec, zero);
    }
    for (int off = cpr / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (valid && j == 0) a.delta[(static_cast<int64_t>(b) * a.H + h) * a.Tp + t] = acc;
  }
}

// dq = dqAcc ([B, T, H, D] f32) in dq's dtype (when dq is not f32-aligned), 8 elements a thread.
__global__ void flashDqConvertKernel(const float* acc, void* dq, int64_t sb, int64_t st, int64_t sh, int code,
                                     bool vec, int B, int T, int H, int D) {
  const int64_t chunks = static_cast<int64_t>(B) * T * H * D / 8;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = 8 * c, row = e / D;
    const int j = static_cast<int>(e % D);
    const int h = static_cast<int>(row % H), t = static_cast<int>((row / H) % T),
              b = static_cast<int>(row / (static_cast<int64_t>(H) * T));
    float x[8];
    load8(acc, e, kOutF32, true, x);
    store8(dq, b * sb + t * st + h * sh + j, code, vec, x);
  }
}


template <int D, int WARPS, int BRQ>
constexpr size_t bwdSmemBytes() {
  return static_cast<size_t>(2 * WARPS * 16 + 4 * BRQ) * (D + 8) * 2 + static_cast<size_t>(WARPS * 16) * (BRQ + 8) * 2 +
         4 * BRQ * sizeof(float);
}

// KEEPKV: the warp's k/v fragments stay in registers across query tiles (else re-read from
// shared memory for every query tile: fewer registers, more shared-memory reads).
template <int D, int WARPS, int BRQ, bool KEEPKV, int MINB, typename T>
__global__ void __launch_bounds__(WARPS * 32, MINB) flashBackwardKernel(const BwdArgs a) {
  constexpr int kThreads = WARPS * 32, BC = WARPS * 16, LD = D + 8, LDS = BRQ + 8, KC = D / 16, NT = BRQ / 8,
                DT = D / 8;
  constexpr int RB = BRQ / 16, DSPLIT = WARPS / RB, DTW = DT / DSPLIT;  // dQ work split over warps
  constexpr bool kKeepKV = KEEPKV;
  static_assert(WARPS % RB == 0 && DTW % 2 == 0 && NT % 2 == 0, "tile shape");
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sK = reinterpret_cast<T*>(smemRaw);
  T* sV = sK + BC * LD;
  T* sQ = sV + BC * LD;        // [2][BRQ][LD]
  T* sG = sQ + 2 * BRQ * LD;   // dO, [2][BRQ][LD]
  T* sS = sG + 2 * BRQ * LD;   // dS^T, [BC][LDS]
  float* sL = reinterpret_cast<float*>(sS + BC * LDS);  // lse, [2][BRQ]
  float* sD = sL + 2 * BRQ;                             // delta, [2][BRQ]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  // grid (b*h, key tiles): low key tiles have the most query tiles and are dispatched first.
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int kBase = blockIdx.y * BC;
  const int kw = kBase + warp * 16, key0 = kw + g, key1 = key0 + 8;
  const T* Q = static_cast<const T*>(a.q) + b * a.qsb + h * a.qsh;
  const T* K = static_cast<const T*>(a.k) + b * a.ksb + h * a.ksh;
  const T* V = static_cast<const T*>(a.v) + b * a.vsb + h * a.vsh;
  const T* G = static_cast<const T*>(a.dO) + b * a.gsb + h * a.gsh;
  const float* L = a.lse + static_cast<int64_t>(bh) * a.Tp;
  const float* Dl = a.delta + static_cast<int64_t>(bh) * a.Tp;
  const float sl2 = a.scale * kLog2e;
  const int iStart = kBase / BRQ, nQ = (a.T + BRQ - 1) / BRQ;

  auto loadQueries = [&](int i, int buf) {
    loadTile<BRQ, D, LD, kThreads>(sQ + buf * BRQ * LD, Q, a.qst, i * BRQ, a.T, tid);
    loadTile<BRQ, D, LD, kThreads>(sG + buf * BRQ * LD, G, a.gst, i * BRQ, a.T, tid);
    loadFloats<BRQ, kThreads>(sL + buf * BRQ, L, i * BRQ, a.T, tid);
    loadFloats<BRQ, kThreads>(sD + buf * BRQ, Dl, i * BRQ, a.T, tid);
  };
  loadTile<BC, D, LD, kThreads>(sK, K, a.kst, kBase, a.T, tid);
  loadTile<BC, D, LD, kThreads>(sV, V, a.vst, kBase, a.T, tid);
  loadQueries(iStart, 0);
  cpAsyncCommit();
  cpAsyncWait<0>();
  __syncthreads();

  // A fragments of the warp's 16 keys (rows of k and v).
  uint32_t kf[kKeepKV ? KC : 1][4], vf[kKeepKV ? KC : 1][4];
  auto aFrag = [&](uint32_t(&r)[4], const T* s, int kc) {
    ldsm4(r, s + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kc * 16 + (lane >> 4) * 8);
  };
  if constexpr (kKeepKV) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) aFrag(kf[kc], sK, kc), aFrag(vf[kc], sV, kc);
  }

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;

  for (int i = iStart; i < nQ; ++i) {
    const int buf = (i - iStart) & 1, qBase = i * BRQ;
    if (i + 1 < nQ) {
      loadQueries(i + 1, buf ^ 1);
      cpAsyncCommit();
    }
    const T* q = sQ + buf * BRQ * LD;
    const T* gq = sG + buf * BRQ * LD;
    const float* lq = sL + buf * BRQ;
    const float* dq = sD + buf * BRQ;

    // S^T = k q^T and dP^T = v dO^T (16 keys x BRQ queries per warp); pairs of query columns that
    // lie entirely before the warp's first key are masked out and skipped.
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      if (qBase + np * 16 + 15 < kw) continue;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        uint32_t qb[4], gb[4];
        const int off = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kc * 16 + ((lane >> 3) & 1) * 8;
        ldsm4(qb, q + off);
        ldsm4(gb, gq + off);
        if constexpr (kKeepKV) {
          Mma<T>::run(s[2 * np], kf[kc], qb[0], qb[1]);
          Mma<T>::run(s[2 * np + 1], kf[kc], qb[2], qb[3]);
          Mma<T>::run(dp[2 * np], vf[kc], gb[0], gb[1]);
          Mma<T>::run(dp[2 * np + 1], vf[kc], gb[2], gb[3]);
        } else {
          uint32_t kr[4], vr[4];
          aFrag(kr, sK, kc);
          aFrag(vr, sV, kc);
          Mma<T>::run(s[2 * np], kr, qb[0], qb[1]);
          Mma<T>::run(s[2 * np + 1], kr, qb[2], qb[3]);
          Mma<T>::run(dp[2 * np], vr, gb[0], gb[1]);
          Mma<T>::run(dp[2 * np + 1], vr, gb[2], gb[3]);
        }
      }
    }
    // P^T = exp2(sl2 S - lse) and dS^T = P^T (dP^T - delta), zero where key > query or query >= T
    // (selected, not multiplied: the padding of lse/delta is never read as a number). Tiles wholly
    // below the diagonal and inside T (most of them) take the branch without masks.
    if (qBase >= kBase + BC - 1 && qBase + BRQ <= a.T) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 lv = *reinterpret_cast<const float2*>(lq + nt * 8 + 2 * t4);
        const float2 dl = *reinterpret_cast<const float2*>(dq + nt * 8 + 2 * t4);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = fastExp2(fmaf(s[nt][e], sl2, -((e & 1) ? lv.y : lv.x)));
          dp[nt][e] = p * (dp[nt][e] - ((e & 1) ? dl.y : dl.x));
          s[nt][e] = p;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = nt * 8 + 2 * t4 + (e & 1), qg = qBase + ql, key = e < 2 ? key0 : key1;
          const bool on = key <= qg && qg < a.T;
          const float p = on ? fastExp2(fmaf(s[nt][e], sl2, -lq[ql])) : 0.f;
          dp[nt][e] = on ? p * (dp[nt][e] - dq[ql]) : 0.f;
          s[nt][e] = p;
        }
      }
    }
    // dV += P^T dO, dK += dS^T q (B operands: rows of dO / q, transposed on load).
#pragma unroll
    for (int c = 0; c < BRQ / 16; ++c) {
      if (qBase + c * 16 + 15 < kw) continue;
      const uint32_t pa[4] = {Mma<T>::pack(s[2 * c][0], s[2 * c][1]), Mma<T>::pack(s[2 * c][2], s[2 * c][3]),
                              Mma<T>::pack(s[2 * c + 1][0], s[2 * c + 1][1]),
                              Mma<T>::pack(s[2 * c + 1][2], s[2 * c + 1][3])};
      const uint32_t sa[4] = {Mma<T>::pack(dp[2 * c][0], dp[2 * c][1]), Mma<T>::pack(dp[2 * c][2], dp[2 * c][3]),
                              Mma<T>::pack(dp[2 * c + 1][0], dp[2 * c + 1][1]),
                              Mma<T>::pack(dp[2 * c + 1][2], dp[2 * c + 1][3])};
#pragma unroll
      for (int d2 = 0; d2 < DT / 2; ++d2) {
        uint32_t gb[4], qb[4];
        const int off = (c * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d2 * 16 + (lane >> 4) * 8;
        ldsm4t(gb, gq + off);
        ldsm4t(qb, q + off);
        Mma<T>::run(dv[2 * d2], pa, gb[0], gb[1]);
        Mma<T>::run(dv[2 * d2 + 1], pa, gb[2], gb[3]);
        Mma<T>::run(dk[2 * d2], sa, qb[0], qb[1]);
        Mma<T>::run(dk[2 * d2 + 1], sa, qb[2], qb[3]);
      }
    }
    // dS^T -> shared memory for dQ.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      *reinterpret_cast<uint32_t*>(sS + (warp * 16 + g) * LDS + nt * 8 + 2 * t4) = Mma<T>::pack(dp[nt][0], dp[nt][1]);
      *reinterpret_cast<uint32_t*>(sS + (warp * 16 + g + 8) * LDS + nt * 8 + 2 * t4) =
          Mma<T>::pack(dp[nt][2], dp[nt][3]);
    }
    __syncthreads();

    // dQ[q rows rb*16.., d cols dBase..] += dS k over the block's BC keys.
    {
      const int rb = warp % RB, dBase = (warp / RB) * DTW * 8;
      float acc[DTW][4];
#pragma unroll
      for (int dt = 0; dt < DTW; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
      bool any = false;
#pragma unroll
      for (int kc2 = 0; kc2 < BC / 16; ++kc2) {
        if (kBase + kc2 * 16 > qBase + rb * 16 + 15) continue;  // keys after every query of the rows
        any = true;
        uint32_t af[4];
        ldsm4t(af, sS + (kc2 * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + rb * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int d2 = 0; d2 < DTW / 2; ++d2) {
          uint32_t kb[4];
          ldsm4t(kb, sK + (kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dBase + d2 * 16 + (lane >> 4) * 8);
          Mma<T>::run(acc[2 * d2], af, kb[0], kb[1]);
          Mma<T>::run(acc[2 * d2 + 1], af, kb[2], kb[3]);
        }
      }
      // Pairs of lanes swap halves so each lane adds 4 consecutive floats of one row (float4).
      const int qr0 = qBase + rb * 16 + g, qr1 = qr0 + 8;
      const bool even = (t4 & 1) == 0;
      const int row = even ? qr0 : qr1;
      float* dQ = a.dq + b * a.dqsb + h * a.dqsh + static_cast<int64_t>(row) * a.dqst;
      if (any) {
#pragma unroll
        for (int dt = 0; dt < DTW; ++dt) {
          const float sx = even ? acc[dt][2] : acc[dt][0], sy = even ? acc[dt][3] : acc[dt][1];
          const float rx = __shfl_xor_sync(0xffffffffu, sx, 1), ry = __shfl_xor_sync(0xffffffffu, sy, 1);
          const float4 val = even ? make_float4(acc[dt][0] * a.scale, acc[dt][1] * a.scale, rx * a.scale, ry * a.scale)
                                  : make_float4(rx * a.scale, ry * a.scale, acc[dt][2] * a.scale, acc[dt][3] * a.scale);
          const int col = dBase + dt * 8 + 2 * (t4 & 2);
          if (row < a.T) atomicAdd(reinterpret_cast<float4*>(dQ + col), val);
        }
      }
    }
    cpAsyncWait<0>();
    __syncthreads();  // next query tile in; dS^T and this tile's buffers free
  }

  storeKeyGrads(a, b, h, key0, t4, dk, dv);
}

// ---- variants and launchers -----------------------------------------------------------------

using FwdLaunch = void (*)(const FwdArgs&, int B, cudaStream_t);
using BwdLaunch = void (*)(const BwdArgs&, int B, cudaStream_t);

template <int D, int WARPS, int BC, int MW, int MINB, typename T>
void launchForward(const FwdArgs& a, int B, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(B * a.H), (a.T + WARPS * 16 * MW - 1) / (WARPS * 16 * MW));
  launchWithSmem(flashForwardKernel<D, WARPS, BC, MW, MINB, T>, grid, WARPS * 32, fwdSmemBytes<D, WARPS, BC, MW>(),
                 true, s, a);
}
template <int D, int WARPS, int BRQ, bool KEEPKV, int MINB, typename T>
void launchBackward(const BwdArgs& a, int B, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(B * a.H), (a.T + WARPS * 16 - 1) / (WARPS * 16));
  launchWithSmem(flashBackwardKernel<D, WARPS, BRQ, KEEPKV, MINB, T>, grid, WARPS * 32, bwdSmemBytes<D, WARPS, BRQ>(),
                 true, s, a);
}

template <typename L>
struct Variant {
  int D;
  DType dtype;
  const char* name;
  L launch;
  bool sm90 = false;  // wgmma (FlashAttentionSm90*.cu): listed only where sm90KernelsUsable()
  int64_t defaultFromT = 0;  // the default from this sequence length on, where it comes first
};
// The default for (D, dtype, T) is the first usable entry whose defaultFromT <= T.
// The warp-specialized forward's 192-query tiles beat v8's 128 from T = 2048 (H100, 2026-12-07:
// 1.211 against 1.311 ms at 2048; 0.421 against 0.415 at 1024; bf16 and f16 alike).
constexpr int64_t kWsForwardFromT = 2048;
// A variant not yet measured: never the default (FA3's intra-warpgroup overlap, not run on a GPU yet).
constexpr int64_t kNeverDefault = std::numeric_limits<int64_t>::max();
const Variant<FwdLaunch> kFwd[] = {
    {64, DType::kBF16, "fwd wgmma ws tma", launchForwardSm90Ws<__nv_bfloat16, false>, true, kWsForwardFromT},
    {64, DType::kBF16, "fwd wgmma bc64 qreg lazy tree", launchForwardSm90<64, 2, 2, 1, 7, __nv_bfloat16>,
     true},
    {64, DType::kBF16, "fwd wgmma bc64 qreg lazy", launchForwardSm90<64, 2, 2, 1, 3, __nv_bfloat16>, true},
    {64, DType::kBF16, "fwd wgmma1 bc64 qreg lazy tree", launchForwardSm90<64, 1, 4, 1, 7, __nv_bfloat16>,
     true},
    {64, DType::kBF16, "fwd wgmma bc64 (v7)", launchForwardSm90<64, 2, 2, 1, 0, __nv_bfloat16>, true},
    {64, DType::kBF16, "fwd wgmma ws tma overlap", launchForwardSm90Ws<__nv_bfloat16, true>, true,
     kNeverDefault},
    {64, DType::kF16, "fwd wgmma ws tma", launchForwardSm90Ws<__half, false>, true, kWsForwardFromT},
    {64, DType::kF16, "fwd wgmma bc64 qreg lazy tree", launchForwardSm90<64, 2, 2, 1, 7, __half>, true},
    {64, DType::kF16, "fwd wgmma ws tma overlap", launchForwardSm90Ws<__half, true>, true, kNeverDefault},
    // Default without wgmma: fastest at T = 1024 and 2048 on the H200 (attention_bench, 2026-12-02).
    {64, DType::kBF16, "fwd w4 bc64 m2", launchForward<64, 4, 64, 2, 1, __nv_bfloat16>},
    {64, DType::kBF16, "fwd w8 bc64 lb2", launchForward<64, 8, 64, 1, 2, __nv_bfloat16>},
    {64, DType::kBF16, "fwd w8 bc64 m2", launchForward<64, 8, 64, 2, 1, __nv_bfloat16>},
    {64, DType::kBF16, "fwd w4 bc64", launchForward<64, 4, 64, 1, 1, __nv_bfloat16>},
    {64, DType::kF16, "fwd w8 bc64 lb2", launchForward<64, 8, 64, 1, 2, __half>},
    {128, DType::kBF16, "fwd w8 bc64", launchForward<128, 8, 64, 1, 1, __nv_bfloat16>},
    {128, DType::kBF16, "fwd w4 bc64", launchForward<128, 4, 64, 1, 1, __nv_bfloat16>},
    {128, DType::kF16, "fwd w8 bc64", launchForward<128, 8, 64, 1, 1, __half>},
    {32, DType::kBF16, "fwd w4 bc64", launchForward<32, 4, 64, 1, 1, __nv_bfloat16>},
    {32, DType::kF16, "fwd w4 bc64", launchForward<32, 4, 64, 1, 1, __half>},
};
const Variant<BwdLaunch> kBwd[] = {
    {64, DType::kBF16, "bwd wgmma ws tma", launchBackwardSm90Ws<__nv_bfloat16>, true},
    {64, DType::kBF16, "bwd wgmma q128", launchBackwardSm90Q128<1, __nv_bfloat16>, true},
    {64, DType::kBF16, "bwd wgmma q128 bh-major", launchBackwardSm90Q128<0, __nv_bfloat16>, true},
    {64, DType::kF16, "bwd wgmma ws tma", launchBackwardSm90Ws<__half>, true},
    {64, DType::kF16, "bwd wgmma q128", launchBackwardSm90Q128<1, __half>, true},
    {64, DType::kBF16, "bwd w8 brq64", launchBackward<64, 8, 64, true, 1, __nv_bfloat16>},
    {64, DType::kBF16, "bwd w4 brq64", launchBackward<64, 4, 64, true, 1, __nv_bfloat16>},
    {64, DType::kBF16, "bwd w4 brq32 lb3", launchBackward<64, 4, 32, true, 3, __nv_bfloat16>},
    {64, DType::kBF16, "bwd w8 brq32", launchBackward<64, 8, 32, true, 1, __nv_bfloat16>},
    {64, DType::kF16, "bwd w8 brq64", launchBackward<64, 8, 64, true, 1, __half>},
    {128, DType::kBF16, "bwd w4 brq32", launchBackward<128, 4, 32, false, 1, __nv_bfloat16>},
    {128, DType::kBF16, "bwd w8 brq32", launchBackward<128, 8, 32, false, 1, __nv_bfloat16>},
    {128, DType::kF16, "bwd w4 brq32", launchBackward<128, 4, 32, false, 1, __half>},
    {32, DType::kBF16, "bwd w4 brq64", launchBackward<32, 4, 64, true, 1, __nv_bfloat16>},
    {32, DType::kF16, "bwd w4 brq64", launchBackward<32, 4, 64, true, 1, __half>},
};

template <typename L>
bool usable(const Variant<L>& v, int64_t D, DType t) {
  return v.D == D && v.dtype == t && (!v.sm90 || sm90KernelsUsable());
}
template <typename L, size_t N>
const Variant<L>* findVariant(const Variant<L> (&table)[N], int64_t D, DType t, int variant) {
  int seen = 0;
  for (const auto& v : table)
    if (usable(v, D, t) && seen++ == variant) return &v;
  return nullptr;
}
template <typename L, size_t N>
int defaultVariant(const Variant<L> (&table)[N], int64_t D, DType t, int64_t T) {
  int seen = 0;
  for (const auto& v : table) {
    if (!usable(v, D, t)) continue;
    if (v.defaultFromT <= T) return seen;
    ++seen;
  }
  return 0;
}
// The entry a problem's variant names (kFlashDefaultVariant: the default for its T).
template <typename L, size_t N>
const Variant<L>* chooseVariant(const Variant<L> (&table)[N], const FlashProblem& p, DType t, int variant) {
  return findVariant(table, p.D, t, variant == kFlashDefaultVariant ? defaultVariant(table, p.D, t, p.T) : variant);
}
template <typename L, size_t N>
int countVariants(const Variant<L> (&table)[N], int64_t D, DType t) {
  int n = 0;
  for (const auto& v : table) n += usable(v, D, t);
  return n;
}

// 8-element runs of the view can be read/written as 16-byte vectors.
bool vectorizable(const FlashView& v) {
  const int64_t m = v.dtype == DType::kF32 ? 4 : 8;
  return reinterpret_cast<uintptr_t>(v.ptr) % 16 == 0 && v.sb % m == 0 && v.st % m == 0 && v.sh % m == 0;
}

int64_t roundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
size_t align256(size_t x) { return (x + 255) / 256 * 256; }

void checkInputView(const FlashView& v, DType t, const char* what) {
  MT_CHECK(v.dtype == t, "flash attention: ", what, " is ", dtypeName(v.dtype), ", q is ", dtypeName(t));
  MT_CHECK(reinterpret_cast<uintptr_t>(v.ptr) % 16 == 0 && v.sb % 8 == 0 && v.st % 8 == 0 && v.sh % 8 == 0,
           "flash attention: ", what, " rows must be 16-byte aligned (strides ", v.sb, ",", v.st, ",", v.sh, ")");
}
void checkOutputView(const FlashView& v, const char* what) {
  MT_CHECK(reinterpret_cast<uintptr_t>(v.ptr) % 8 == 0 && v.sb % 2 == 0 && v.st % 2 == 0 && v.sh % 2 == 0,
           "flash attention: ", what, " needs even strides and 8-byte alignment");
  outCode(v.dtype);
}
void checkProblem(const FlashProblem& p, DType t) {
  MT_CHECK(flashSupported(p.D, t), "flash attention: head dim ", p.D, " / ", dtypeName(t), " not built");
  MT_CHECK(p.B > 0 && p.H > 0 && p.T > 0 && p.T < (1 << 30) && p.B * p.H < (int64_t{1} << 31) && p.T / 16 < 65535,
           "flash attention: bad problem B=", p.B, " T=", p.T, " H=", p.H);
  // The wgmma kernels' 1-D grids: B*H blocks per 64-row tile.
  MT_CHECK(p.B * p.H * ((p.T + 63) / 64) < (int64_t{1} << 31), "flash attention: B*H*T/64 = ",
           p.B * p.H * ((p.T + 63) / 64), " blocks exceed the grid (B=", p.B, " T=", p.T, " H=", p.H, ")");
}

}  // namespace

bool flashSupported(int64_t headDim, DType t) { return countVariants(kFwd, headDim, t) > 0; }

int flashVariantCount(int64_t headDim, DType t, bool backward) {
  return backward ? countVariants(kBwd, headDim, t) : countVariants(kFwd, headDim, t);
}
int flashDefaultVariant(int64_t headDim, DType t, bool backward, int64_t T) {
  return backward ? defaultVariant(kBwd, headDim, t, T) : defaultVariant(kFwd, headDim, t, T);
}
const char* flashVariantName(int64_t headDim, DType t, bool backward, int variant) {
  if (backward) {
    const auto* v = findVariant(kBwd, headDim, t, variant);
    return v ? v->name : nullptr;
  }
  const auto* v = findVariant(kFwd, headDim, t, variant);
  return v ? v->name : nullptr;
}

int64_t flashLseElements(const FlashProblem& p) { return p.B * p.H * roundUp(p.T, 4); }

namespace {
bool dOUsable(const FlashView& dO, DType in) {
  return dO.dtype == in && reinterpret_cast<uintptr_t>(dO.ptr) % 16 == 0 && dO.sb % 8 == 0 && dO.st % 8 == 0 &&
         dO.sh % 8 == 0;
}
struct WorkspaceLayout {
  size_t delta = 0, dOc = 0, dqAcc = 0, total = 0;
  bool convertDO = false, accumulateDq = false;
};
WorkspaceLayout layoutOf(const FlashProblem& p, DType in, const FlashView& dO, const FlashView& dq) {
  WorkspaceLayout w;
  const size_t n = static_cast<size_t>(p.B * p.T * p.H * p.D);
  w.convertDO = !dOUsable(dO, in);
  // float4 atomics: f32, 16-byte aligned rows.
  w.accumulateDq = dq.dtype != DType::kF32 || reinterpret_cast<uintptr_t>(dq.ptr) % 16 != 0 || dq.sb % 4 != 0 ||
                   dq.st % 4 != 0 || dq.sh % 4 != 0;
  w.delta = 0;
  w.total = align256(static_cast<size_t>(flashLseElements(p)) * sizeof(float));
  if (w.convertDO) w.dOc = w.total, w.total += align256(n * dtypeSize(in));
  if (w.accumulateDq) w.dqAcc = w.total, w.total += align256(n * sizeof(float));
  return w;
}
}  // namespace

size_t flashBackwardWorkspaceBytes(const FlashProblem& p, DType in, const FlashView& dO, const FlashView& dq) {
  return layoutOf(p, in, dO, dq).total;
}

void flashAttentionForward(const FlashProblem& p, const FlashView& q, const FlashView& k, const FlashView& v,
                           const FlashView& o, float* lse, cudaStream_t stream) {
  checkProblem(p, q.dtype);
  checkInputView(q, q.dtype, "q");
  checkInputView(k, q.dtype, "k");
  checkInputView(v, q.dtype, "v");
  checkOutputView(o, "o");
  const auto* var = chooseVariant(kFwd, p, q.dtype, p.fwdVariant);
  MT_CHECK(var, "flash attention: no forward variant ", p.fwdVariant, " for D=", p.D);
  FwdArgs a{};
  a.q = q.ptr, a.k = k.ptr, a.v = v.ptr, a.o = o.ptr, a.lse = lse;
  a.qsb = q.sb, a.qst = q.st, a.qsh = q.sh, a.ksb = k.sb, a.kst = k.st, a.ksh = k.sh;
  a.vsb = v.sb, a.vst = v.st, a.vsh = v.sh, a.osb = o.sb, a.ost = o.st, a.osh = o.sh;
  a.T = static_cast<int>(p.T), a.H = static_cast<int>(p.H), a.Tp = static_cast<int>(roundUp(p.T, 4));
  a.oCode = outCode(o.dtype);
  a.scale = p.scale;
  var->launch(a, static_cast<int>(p.B), stream);
}

void flashAttentionBackward(const FlashProblem& p, const FlashView& q, const FlashView& k, const FlashView& v,
                            const FlashView& o, const FlashView& dO, const float* lse, const FlashView& dq,
                            const FlashView& dk, const FlashView& dv, void* workspace, size_t workspaceBytes,
                            cudaStream_t stream) {
  const DType in = q.dtype;
  checkProblem(p, in);
  checkInputView(q, in, "q");
  checkInputView(k, in, "k");
  checkInputView(v, in, "v");
  checkOutputView(dq, "dq");
  checkOutputView(dk, "dk");
  checkOutputView(dv, "dv");
  checkOutputView(o, "o");
  checkOutputView(dO, "dO");
  const WorkspaceLayout w = layoutOf(p, in, dO, dq);
  MT_CHECK(workspaceBytes >= w.total, "flash attention: workspace of ", workspaceBytes, " bytes, ", w.total, " needed");
  char* ws = static_cast<char*>(workspace);
  float* delta = reinterpret_cast<float*>(ws + w.delta);
  const int64_t HD = p.H * p.D, THD = p.T * HD;

  PrepArgs pa{};
  pa.o = o.ptr, pa.dO = dO.ptr;
  pa.osb = o.sb, pa.ost = o.st, pa.osh = o.sh, pa.gsb = dO.sb, pa.gst = dO.st, pa.gsh = dO.sh;
  pa.oCode = outCode(o.dtype), pa.gCode = outCode(dO.dtype);
  pa.oVec = vectorizable(o), pa.gVec = vectorizable(dO);
  pa.dOc = w.convertDO ? ws + w.dOc : nullptr;
  pa.cCode = outCode(in);
  if (w.accumulateDq) {
    pa.dqAcc = reinterpret_cast<float*>(ws + w.dqAcc);
    pa.dsb = THD, pa.dst = HD, pa.dsh = p.D;
  } else {
    pa.dqAcc = static_cast<float*>(dq.ptr);
    pa.dsb = dq.sb, pa.dst = dq.st, pa.dsh = dq.sh;
  }
  pa.qVec = w.accumulateDq || vectorizable(dq);
  pa.delta = delta;
  pa.B = static_cast<int>(p.B), pa.T = static_cast<int>(p.T), pa.H = static_cast<int>(p.H);
  pa.D = static_cast<int>(p.D), pa.Tp = static_cast<int>(roundUp(p.T, 4));
  const int64_t chunks = p.B * p.T * p.H * (p.D / 8);
  const int prepBlocks = static_cast<int>(std::min<int64_t>((chunks + 255) / 256, 65535LL * 8));
  flashPrepKernel<<<prepBlocks, 256, 0, stream>>>(pa);
  CUDA_CHECK(cudaGetLastError());

  const auto* var = chooseVariant(kBwd, p, in, p.bwdVariant);
  MT_CHECK(var, "flash attention: no backward variant ", p.bwdVariant, " for D=", p.D);
  BwdArgs a{};
  a.q = q.ptr, a.k = k.ptr, a.v = v.ptr;
  if (w.convertDO) {
    a.dO = ws + w.dOc;
    a.gsb = THD, a.gst = HD, a.gsh = p.D;
  } else {
    a.dO = dO.ptr;
    a.gsb = dO.sb, a.gst = dO.st, a.gsh = dO.sh;
  }
  a.lse = lse, a.delta = delta;
  a.dq = pa.dqAcc;
  a.dqsb = pa.dsb, a.dqst = pa.dst, a.dqsh = pa.dsh;
  a.dk = dk.ptr, a.dv = dv.ptr;
  a.qsb = q.sb, a.qst = q.st, a.qsh = q.sh, a.ksb = k.sb, a.kst = k.st, a.ksh = k.sh;
  a.vsb = v.sb, a.vst = v.st, a.vsh = v.sh;
  a.dksb = dk.sb, a.dkst = dk.st, a.dksh = dk.sh, a.dvsb = dv.sb, a.dvst = dv.st, a.dvsh = dv.sh;
  a.T = pa.T, a.H = pa.H, a.Tp = pa.Tp;
  a.dkCode = outCode(dk.dtype), a.dvCode = outCode(dv.dtype);
  a.scale = p.scale;
  var->launch(a, static_cast<int>(p.B), stream);

  if (w.accumulateDq) {
    const int64_t n = p.B * p.T * HD / 8;
    const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535LL * 16));
    flashDqConvertKernel<<<blocks, 256, 0, stream>>>(pa.dqAcc, dq.ptr, dq.sb, dq.st, dq.sh, outCode(dq.dtype),
                                                     vectorizable(dq), pa.B, pa.T, pa.H, pa.D);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace mt::cuda
