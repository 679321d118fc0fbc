// Causal flash attention on Hopper's warpgroup MMA (wgmma, sm_90a), head dim 64: the same math and
// outputs as the mma.sync kernels in models/kernels/FlashAttention.cu (see FlashAttention.h), with
// the matrix products issued per warpgroup of 4 warps from shared memory (models/kernels/Wgmma.cuh)
// instead of per warp through ldmatrix: one 64-row product reads its shared operand once for the
// four warps, and it runs asynchronously while the warps issue other work.
//
// Forward: one block per (NWG x 64 queries, b*h); warpgroup w owns 64 query rows. Per K/V tile of BC
// keys (double-buffered through cp.async): S = q k^T (default: A = q from registers, loaded once;
// B = k, K-major in shared memory), masked and exponentiated in registers (online softmax; the max
// kept until a tile raises it by more than 2^8, row max and sum reduced as trees), O += P v with P
// from registers (B = v, MN-major: v's rows are the reduction index).
// Backward, default (flashBackwardSm90Q128Kernel): one block of 2 warpgroups per (128 keys, b*h),
// warpgroup w owning 64 keys, against 128-query tiles (q, dO, lse, delta double-buffered): S^T and
// dP^T as m64n128 products, P^T packed in registers while dP^T runs, dV += P^T dO from registers,
// dS^T = P^T (dP^T - delta), dK += dS^T q, dS^T to shared memory, and after a barrier of both groups
// dQ for query half w over all 128 keys, added with float4 atomics. Tiles below the diagonal skip
// the per-element mask. dk, dv overwritten, dq accumulated. (Its predecessor, 64-query tiles with
// dQ per warpgroup over its own 64 keys, is in git history and docs/performance.md, v6.)
// Grids are tile-major by default (blockTile in FlashCommon.cuh): the blocks of one b*h run side by
// side and share its rows in L2.
// Measured against the mma.sync kernels and SDPA: docs/performance.md (attention table, v6 and v7).

#include "core/cuda/CudaCheck.h"
#include "models/kernels/FlashCommon.cuh"
#include "models/kernels/FlashSm90.cuh"
#include "models/kernels/Wgmma.cuh"

namespace mt::cuda::flash {

namespace {

using namespace sm90;  // NOLINT: the pieces shared with FlashAttentionSm90Ws.cu

constexpr int kTileBytes64 = 8192;  // a 64 x 64 16-bit tile

// ROWS rows of 64 elements from row `row0` of a [T, 64] slice (row stride st) into a swizzled tile;
// rows >= rows are zero-filled. Thread tid copies chunk tid % 8 of rows tid / 8 + p * NTHREADS / 8:
// a fixed number of passes whose swizzle (row % 8) does not change, so the destination steps by a
// constant and the loop unrolls to a few instructions per 16 bytes (a loop starting at tid with
// stride NTHREADS compiled to a generic loop with remainder handling: ~60 % of the forward's
// instructions, ncu 2026-12-04).
template <int ROWS, int NTHREADS, typename T>
__device__ __forceinline__ void loadSwizzled(T* s, const T* g, int64_t st, int row0, int rows, int tid) {
  constexpr int kStep = NTHREADS / 8, kPasses = (ROWS + kStep - 1) / kStep;
  static_assert(kStep % 8 == 0, "a pass must cover whole 8-row swizzle groups");
  const int r = tid / 8, c = tid % 8;
  T* d = s + wg::swz(r, c);
  const T* src = g + static_cast<int64_t>(row0 + r) * st + c * 8;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    if (ROWS % kStep != 0 && r + p * kStep >= ROWS) break;
    const bool ok = row0 + r + p * kStep < rows;
    cpAsync16(d + p * kStep * 64, ok ? src + static_cast<int64_t>(p * kStep) * st : g, ok);
  }
}

// Forward options (OPT bits): kFwdQReg keeps the warpgroup's q rows in registers as the A operand
// of S = q k^T (register-A wgmma reads only k from shared memory: half the operand bytes of that
// product); kFwdLazyRescale keeps a row's running max until a tile raises it by more than 8 (log2
// domain), so O is rescaled only then (FlashAttention-4's rule: P stays below 2^8, exact after the
// final division by l).
// kFwdTree reduces the tile's row max and sum as trees (softmaxTile).
constexpr int kFwdQReg = 1, kFwdLazyRescale = 2, kFwdTree = 4;

template <int BC, int NWG, int OPT>
constexpr size_t fwdSm90SmemBytes() {
  return static_cast<size_t>(((OPT & kFwdQReg) ? 0 : NWG * 64) + 4 * BC) * kD * 2 + 1024;
}

template <int BC, int NWG, int MINB, int OPT, typename T>
__global__ void __launch_bounds__(NWG * 128, MINB) flashForwardSm90Kernel(const FwdArgs a) {
#if MT_WGMMA
  constexpr int kThreads = NWG * 128, BR = NWG * 64, NT = BC / 8, DT = kD / 8;
  constexpr bool kQReg = (OPT & kFwdQReg) != 0, kLazy = (OPT & kFwdLazyRescale) != 0, kTree = (OPT & kFwdTree) != 0;
  using W = wg::Wgmma<BC, T>;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sQ = reinterpret_cast<T*>(alignedSmem(smemRaw));
  T* sK = sQ + (kQReg ? 0 : BR * kD);  // [2][BC][64]
  T* sV = sK + 2 * BC * kD;  // [2][BC][64]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int grp = warp / 4, wl = warp % 4;
  const int nQ = (a.T + BR - 1) / BR;
  int tile, bh;
  blockTile(a.tileMajor, nQ, tile, bh);
  const int qTile = nQ - 1 - tile;  // heaviest tiles first
  const int b = bh / a.H, h = bh % a.H;
  const int qBase = qTile * BR;
  const T* Q = static_cast<const T*>(a.q) + b * a.qsb + h * a.qsh;
  const T* K = static_cast<const T*>(a.k) + b * a.ksb + h * a.ksh;
  const T* V = static_cast<const T*>(a.v) + b * a.vsb + h * a.vsh;

  if constexpr (!kQReg) loadSwizzled<BR, kThreads>(sQ, Q, a.qst, qBase, a.T, tid);
  loadSwizzled<BC, kThreads>(sK, K, a.kst, 0, a.T, tid);
  loadSwizzled<BC, kThreads>(sV, V, a.vst, 0, a.T, tid);
  cpAsyncCommit();

  const int gFirst = qBase + grp * 64, gLast = gFirst + 63;  // the warpgroup's rows
  const int row0 = gFirst + wl * 16 + g;
  // q in the A layout of the 16-column steps (rows row0 and row0 + 8; rows at or past T are 0).
  uint32_t qa[kQReg ? kD / 16 : 1][4];
  if constexpr (kQReg) loadQRegisters(qa, Q, a.qst, row0, a.T, t4);
  float o[DT][4], s[NT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = a.scale * kLog2e;
  const int kvEnd = min(a.T, qBase + BR);
  const int nKV = (kvEnd + BC - 1) / BC;
  const T* qg = sQ + grp * 64 * kD;

  for (int j = 0; j < nKV; ++j) {
    const int kBase = j * BC, stage = j & 1;
    cpAsyncWait<0>();
    wg::fenceProxyAsync();
    __syncthreads();  // tile j in; every warpgroup is done with tile j-1 (its products waited on)
    if (j + 1 < nKV) {
      loadSwizzled<BC, kThreads>(sK + (stage ^ 1) * BC * kD, K, a.kst, kBase + BC, a.T, tid);
      loadSwizzled<BC, kThreads>(sV + (stage ^ 1) * BC * kD, V, a.vst, kBase + BC, a.T, tid);
      cpAsyncCommit();
    }
    if (kBase > gLast) continue;  // warpgroup-uniform: the whole tile is after the group's rows
    const T* k = sK + stage * BC * kD;
    const T* v = sV + stage * BC * kD;

    wg::fenceOperand(s);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if constexpr (kQReg)
        W::template rs<0>(s, qa[kk], wg::kmajor(k + kk * 16), kk);
      else
        W::template ss<0, 0>(s, wg::kmajor(qg + kk * 16), wg::kmajor(k + kk * 16), kk);
    }
    wg::commit();
    wg::wait<0>();
    wg::fenceOperand(s);

    softmaxThenPv<kLazy, kTree, BC, T>(s, o, m0, m1, l0, l1, v, kBase, gFirst + wl * 16, g, t4, sl2);
    wg::wait<0>();  // before the barrier that lets this stage be reloaded
    wg::fenceOperand(o);
  }

  storeRows(a, b, h, row0, t4, o, m0, m1, l0, l1);
#else
  __trap();  // launched only where sm90KernelsUsable()
#endif
}

#if MT_WGMMA  // sm_90a device code only
// dQ rows rowBase + g and + 8, columns 8 n + 2 t (an mma-layout accumulator) += acc *
// scale: pairs of lanes swap halves so each lane adds 4 consecutive floats of one row (float4).
// Every lane of the warp calls it (shuffles); rows at or past T add nothing. The mma.sync backward
// (FlashAttention.cu) does the same inline: through this helper ptxas spilled more there.
template <int NC>
__device__ __forceinline__ void addDqRows(const BwdArgs& a, int b, int h, int rowBase, int g, int t4,
                                          const float (&acc)[NC][4]) {
  const bool even = (t4 & 1) == 0;
  const int row = rowBase + g + (even ? 0 : 8);
  float* dQ = a.dq + b * a.dqsb + h * a.dqsh + static_cast<int64_t>(row) * a.dqst;
#pragma unroll
  for (int n = 0; n < NC; ++n) {
    const float sx = even ? acc[n][2] : acc[n][0], sy = even ? acc[n][3] : acc[n][1];
    const float rx = __shfl_xor_sync(0xffffffffu, sx, 1), ry = __shfl_xor_sync(0xffffffffu, sy, 1);
    const float4 val = even ? make_float4(acc[n][0] * a.scale, acc[n][1] * a.scale, rx * a.scale, ry * a.scale)
                            : make_float4(rx * a.scale, ry * a.scale, acc[n][2] * a.scale, acc[n][3] * a.scale);
    if (row < a.T) atomicAdd(reinterpret_cast<float4*>(dQ + n * 8 + 2 * (t4 & 2)), val);
  }
}
#endif

constexpr size_t bwdSm90Q128SmemBytes() {
  // k, v (128 rows each), q and dO double-buffered (128 rows each), dS^T as two 128-row tiles, lse
  // and delta double-buffered (128 floats each).
  return static_cast<size_t>(2 + 2 + 4 + 4 + 4) * kTileBytes64 + 4 * 128 * sizeof(float) + 1024;
}

// FA3's tile shape at head dim 64: 128 keys per block (64 per warpgroup) against 128-query tiles.
// Per query tile each warpgroup issues S^T and dP^T as m64n128 products (the shared operand read
// per 128 queries, not per 64: 3/4 of the shared-memory bytes per FLOP of the 64-query kernel),
// then P^T in registers (16-bit, the A operand of dV += P^T dO) while dP^T runs, dS^T =
// P^T (dP^T - delta) from that same 16-bit P^T (f32 S^T is dead by then: 64 registers fewer),
// dK += dS^T q, and dS^T to shared memory. After a barrier of both warpgroups, warpgroup w computes
// dQ for the tile's queries 64 w.. over all 128 keys (K = 128), so each dQ element gets one f32
// atomic add per 128 keys instead of per 64 (v6's kernel): half the atomic traffic.
template <typename T>
__global__ void __launch_bounds__(256, 1) flashBackwardSm90Q128Kernel(const BwdArgs a) {
#if MT_WGMMA
  constexpr int kThreads = 256, BC = 128, BRQ = 128, NT = BRQ / 8, DT = kD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sK = reinterpret_cast<T*>(alignedSmem(smemRaw));  // [128][64]
  T* sV = sK + BC * kD;                                 // [128][64]
  T* sQ = sV + BC * kD;                                 // [2][128][64]
  T* sG = sQ + 2 * BRQ * kD;                            // dO, [2][128][64]
  T* sS = sG + 2 * BRQ * kD;  // dS^T, [2 query halves][128 keys][64 queries]
  float* sL = reinterpret_cast<float*>(sS + 2 * BC * 64);  // lse, [2][128]
  float* sD = sL + 2 * BRQ;                                // delta, [2][128]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int grp = warp / 4, wl = warp % 4;
  int tile, bh;
  blockTile(a.tileMajor, (a.T + BC - 1) / BC, tile, bh);
  const int b = bh / a.H, h = bh % a.H;
  const int kBase = tile * BC;
  const int kw = kBase + grp * 64;                     // the warpgroup's first key
  const int key0 = kw + wl * 16 + g;  // this thread's accumulator rows: key0, key0 + 8
  const T* Q = static_cast<const T*>(a.q) + b * a.qsb + h * a.qsh;
  const T* K = static_cast<const T*>(a.k) + b * a.ksb + h * a.ksh;
  const T* V = static_cast<const T*>(a.v) + b * a.vsb + h * a.vsh;
  const T* G = static_cast<const T*>(a.dO) + b * a.gsb + h * a.gsh;
  const float* L = a.lse + static_cast<int64_t>(bh) * a.Tp;
  const float* Dl = a.delta + static_cast<int64_t>(bh) * a.Tp;
  const float sl2 = a.scale * kLog2e;
  const int iStart = kBase / BRQ, nQ = (a.T + BRQ - 1) / BRQ;

  auto loadQueries = [&](int i, int buf) {
    loadSwizzled<BRQ, kThreads>(sQ + buf * BRQ * kD, Q, a.qst, i * BRQ, a.T, tid);
    loadSwizzled<BRQ, kThreads>(sG + buf * BRQ * kD, G, a.gst, i * BRQ, a.T, tid);
    loadFloats<BRQ, kThreads>(sL + buf * BRQ, L, i * BRQ, a.T, tid);
    loadFloats<BRQ, kThreads>(sD + buf * BRQ, Dl, i * BRQ, a.T, tid);
  };
  loadSwizzled<BC, kThreads>(sK, K, a.kst, kBase, a.T, tid);
  loadSwizzled<BC, kThreads>(sV, V, a.vst, kBase, a.T, tid);
  loadQueries(iStart, 0);
  cpAsyncCommit();
  cpAsyncWait<0>();
  wg::fenceProxyAsync();
  __syncthreads();

  float dk[DT][4], dv[DT][4], s[NT][4], dp[NT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
  const T* kg = sK + grp * 64 * kD;
  const T* vg = sV + grp * 64 * kD;

  for (int i = iStart; i < nQ; ++i) {
    const int buf = (i - iStart) & 1, qBase = i * BRQ;
    if (i + 1 < nQ) {
      loadQueries(i + 1, buf ^ 1);
      cpAsyncCommit();
    }
    const T* q = sQ + buf * BRQ * kD;
    const T* gq = sG + buf * BRQ * kD;
    const float* lq = sL + buf * BRQ;
    const float* dlq = sD + buf * BRQ;
    bwdTileProducts<T>(kg, vg, q, gq, lq, dlq, sS, s, dp, dv, dk, qBase, kw, a.T, key0, grp * 64 + wl * 16 + g, t4, sl2);
    wg::fenceProxyAsync();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // both warpgroups' dS^T rows written
    // dQ for queries qBase + 64 grp.. = dS k over the block's 128 keys (A = dS^T read M-major,
    // B = k MN-major). Not initialised: the first product overwrites it, and a definition by
    // ordinary instructions would make ptxas serialise the products in flight (C7515).
    float acc[DT][4];
    dqProducts<T>(acc, sS + grp * BC * 64, sK);
    wg::wait<0>();
    wg::fenceOperand(acc);
    wg::fenceOperand(dv);
    wg::fenceOperand(dk);
    addDqRows(a, b, h, qBase + grp * 64 + wl * 16, g, t4, acc);
    cpAsyncWait<0>();
    wg::fenceProxyAsync();
    __syncthreads();  // next query tile in; this tile's buffers and dS^T free
  }

  storeKeyGrads(a, b, h, key0, t4, dk, dv);
#else
  __trap();  // launched only where sm90KernelsUsable()
#endif
}

// 1 in code built for sm_90a, 0 in any other device code: what the loaded module says.
__device__ int gWgmmaBuilt = MT_WGMMA;

}  // namespace

template <int BC, int NWG, int MINB, int ORDER, int OPT, typename T>
void launchForwardSm90(const FwdArgs& args, int B, cudaStream_t s) {
  FwdArgs a = args;
  a.tileMajor = ORDER;
  launchWithSmem(flashForwardSm90Kernel<BC, NWG, MINB, OPT, T>,
                 tileGrid(ORDER, B * a.H, (a.T + NWG * 64 - 1) / (NWG * 64)), NWG * 128,
                 fwdSm90SmemBytes<BC, NWG, OPT>(), true, s, a);
}

template <int ORDER, typename T>
void launchBackwardSm90Q128(const BwdArgs& args, int B, cudaStream_t s) {
  BwdArgs a = args;
  a.tileMajor = ORDER;
  launchWithSmem(flashBackwardSm90Q128Kernel<T>, tileGrid(ORDER, B * a.H, (a.T + 127) / 128), 256,
                 bwdSm90Q128SmemBytes(), true, s, a);
}

bool sm90KernelsUsable() {
  // Per process: the build and the device kind do not change under a running job.
  static const bool usable = [] {
    int dev = 0, major = 0, minor = 0, built = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      return false;
    if (major != 9 || minor != 0) return false;
    if (cudaMemcpyFromSymbol(&built, gWgmmaBuilt, sizeof(int)) != cudaSuccess) {
      cudaGetLastError();  // no loadable image for this device: clear the error, use mma.sync
      return false;
    }
    return built == 1;
  }();
  return usable;
}

// What the variant tables in FlashAttention.cu list: every shape in bf16 (the lab compares them),
// the defaults in f16.
#define MT_FLASH_SM90_DEFAULTS(T)                                                       \
  template void launchForwardSm90<64, 2, 2, 1, 7, T>(const FwdArgs&, int, cudaStream_t);  \
  template void launchBackwardSm90Q128<1, T>(const BwdArgs&, int, cudaStream_t);
MT_FLASH_SM90_DEFAULTS(__nv_bfloat16)
MT_FLASH_SM90_DEFAULTS(__half)
#undef MT_FLASH_SM90_DEFAULTS
template void launchForwardSm90<64, 2, 2, 1, 3, __nv_bfloat16>(const FwdArgs&, int, cudaStream_t);
template void launchForwardSm90<64, 1, 4, 1, 7, __nv_bfloat16>(const FwdArgs&, int, cudaStream_t);
template void launchForwardSm90<64, 2, 2, 1, 0, __nv_bfloat16>(const FwdArgs&, int, cudaStream_t);
template void launchBackwardSm90Q128<0, __nv_bfloat16>(const BwdArgs&, int, cudaStream_t);

}  // namespace mt::cuda::flash
