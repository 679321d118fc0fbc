// Causal flash attention on Hopper, warp-specialized (FlashAttention-3's structure), head dim 64,
// sm_90a: a producer warpgroup whose one thread issues every copy by TMA into a ring of stages that
// complete on mbarriers by byte count, and consumer warpgroups that wait on those barriers instead
// of per-tile __syncthreads and hand each stage back through an `empty` barrier.
//
// Forward (flashForwardSm90WsKernel): one block of 4 warpgroups per (192 queries, b*h): the
// producer (24 registers) streams k and v in 64-key tiles through 4 stages; 3 consumers (160
// registers) own 64 queries each and run flashForwardSm90Kernel's products (q in registers as the A
// operand of S = q k^T, the lazy online softmax, O += P v with P from registers). Query tiles are
// aligned to the end of the sequence, so the partial tile is the first rows (the cheapest), and the
// heaviest tiles start first.
// The `overlap` instantiation (a variant, not a default until measured) pipelines each consumer as
// FlashAttention-3 does within a warpgroup: S = q k^T of key tile j is issued before O += P v of tile
// j - 1, so the softmax of tile j runs while the tensor cores do that product; same output bitwise.
//
// Backward (flashBackwardSm90WsKernel): same math and outputs as flashBackwardSm90Q128Kernel
// (FlashAttentionSm90.cu):
//   S^T = k q^T, P^T = exp2(sl2 S^T - lse) (0 where key > query), dP^T = v dO^T,
//   dV += P^T dO, dS^T = P^T (dP^T - delta), dK += dS^T q, dQ += scale * dS k.
// dk, dv overwritten (one block owns 128 keys), dq accumulated (f32, every key block adds).
//
// One block of 3 warpgroups per (128 keys, b*h), against 128-query tiles:
//   warpgroup 0, the producer, gives its registers away (setmaxnreg 24) and one thread issues every
//     copy with the tensor memory accelerator: k and v once, then per query tile q and dO (tensor
//     maps, 128-byte swizzle, rows past T zero-filled) and lse, delta (bulk copies) into a 2-stage
//     ring, each stage completing on its `full` mbarrier by byte count; it refills a stage when the
//     consumers' `empty` arrivals say they are done with it.
//   warpgroups 1 and 2, the consumers (setmaxnreg 240), own 64 keys each and run the tile's
//     products as flashBackwardSm90Q128Kernel does, without cp.async and without __syncthreads: they
//     wait on `full`, hand the stage back on `empty`, and meet once per tile (a named barrier of the
//     two) after writing dS^T, whose buffer is double so that the next tile's write needs no second
//     meeting. dQ: each consumer warpgroup computes its 64 queries over the block's 128 keys, writes
//     them (times the scale) into a swizzled f32 staging tile and one thread adds the tile into the
//     global accumulator with two tensor reduce-adds (cp.reduce.async.bulk.tensor ... add.f32, the
//     tensor map clipping rows past T), instead of per-thread float4 atomics: the warps go on to
//     the next tile while the copy engine adds (measured: the kernel 9-11 % faster than with
//     the atomics, docs/performance.md).
// Registers: 128 x 24 + 256 x 240 = the 64 K of an SM at one block (launch: 384 x 168); the
// forward 128 x 24 + 384 x 160 (launch: 512 x 128).

#include <type_traits>

#include "core/Check.h"
#include "core/cuda/CudaCheck.h"
#include "models/kernels/FlashCommon.cuh"
#include "models/kernels/FlashSm90.cuh"
#include "models/kernels/TensorMap.h"
#include "models/kernels/Tma.cuh"
#include "models/kernels/Wgmma.cuh"

namespace mt::cuda::flash {

namespace {

using namespace sm90;  // NOLINT: the pieces shared with FlashAttentionSm90.cu

constexpr int kWsThreads = 384, kBC = 128, kBRQ = 128;
constexpr int kTile128 = kBRQ * kD * 2;  // bytes of a 128 x 64 16-bit tile
// Shared memory from the 1024-aligned base (every tile 1024-aligned for the 128-byte swizzle).
constexpr int kOffK = 0, kOffV = kOffK + kTile128;
constexpr int kOffQ = kOffV + kTile128;         // [2 stages][128][64]
constexpr int kOffG = kOffQ + 2 * kTile128;     // dO, [2 stages][128][64]
constexpr int kOffS = kOffG + 2 * kTile128;     // dS^T, [2 buffers][2 query halves][128 keys][64]
constexpr int kOffDq = kOffS + 4 * kTile128;    // dQ staging, [2 warpgroups][2 column halves][64][32] f32
constexpr int kDqHalf = 64 * 32 * 4;            // one [64][32] f32 box
constexpr int kOffL = kOffDq + 4 * kDqHalf;     // lse, [2 stages][128] f32
constexpr int kOffDl = kOffL + 2 * kBRQ * 4;    // delta, [2 stages][128] f32
constexpr int kOffBar = kOffDl + 2 * kBRQ * 4;  // kvFull, full[2], empty[2]
constexpr size_t kWsSmemBytes = kOffBar + 5 * sizeof(uint64_t) + 1024;

struct WsMaps {
  CUtensorMap q, k, v, g, dq;
};

#if MT_WGMMA
// dQ rows (rl0 = 16 wl + g and rl0 + 8 of the warpgroup's 64) times scale into the staging tile:
// two [64][32] f32 boxes, 128-byte rows, 16-byte chunk c of row r at c ^ (r % 8) (the tensor map's
// swizzle); a warp's float2 stores then cover all 32 banks twice, the least two wavefronts allow.
template <int DT>
__device__ __forceinline__ void stageDq(unsigned char* sDq, const float (&acc)[DT][4], int rl0, int t4,
                                        float scale) {
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int chunk = 2 * (j % 4) + t4 / 2, half = j / 4;
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      const int r = rl0 + 8 * r2;
      unsigned char* p = sDq + half * kDqHalf + r * 128 + ((chunk ^ (r % 8)) * 16) + (t4 & 1) * 8;
      *reinterpret_cast<float2*>(p) = make_float2(acc[j][2 * r2] * scale, acc[j][2 * r2 + 1] * scale);
    }
  }
}
#endif

template <typename T>
__global__ void __launch_bounds__(kWsThreads, 1)
    flashBackwardSm90WsKernel(const BwdArgs a, const __grid_constant__ WsMaps m) {
#if MT_WGMMA
  constexpr int NT = kBRQ / 8, DT = kD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  unsigned char* sm = alignedSmem(smemRaw);
  T* sK = reinterpret_cast<T*>(sm + kOffK);
  T* sV = reinterpret_cast<T*>(sm + kOffV);
  T* sQ = reinterpret_cast<T*>(sm + kOffQ);
  T* sG = reinterpret_cast<T*>(sm + kOffG);
  T* sS = reinterpret_cast<T*>(sm + kOffS);
  float* sL = reinterpret_cast<float*>(sm + kOffL);
  float* sD = reinterpret_cast<float*>(sm + kOffDl);
  uint64_t* kvFull = reinterpret_cast<uint64_t*>(sm + kOffBar);
  uint64_t* full = kvFull + 1;   // [2]
  uint64_t* empty = kvFull + 3;  // [2]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int tile, bh;
  blockTile(a.tileMajor, (a.T + kBC - 1) / kBC, tile, bh);
  const int b = bh / a.H, h = bh % a.H;
  const int kBase = tile * kBC;
  const int iStart = kBase / kBRQ, nQ = (a.T + kBRQ - 1) / kBRQ;
  if (tid == 0) {
    tma::barrierInit(kvFull, 1);
    for (int s = 0; s < 2; ++s) {
      tma::barrierInit(full + s, 1);
      tma::barrierInit(empty + s, 8);  // lane 0 of each consumer warp
    }
    tma::fenceBarrierInit();
  }
  __syncthreads();  // the last block-wide barrier: the producer's other warps leave below

  if (warp < 4) {
    tma::decreaseRegisters<24>();
    if (tid != 0) return;
    tma::prefetchMap(&m.q);
    tma::prefetchMap(&m.g);
    tma::arriveExpectTx(kvFull, 2 * kTile128);
    tma::loadTile4d(sK, &m.k, 0, kBase, h, b, kvFull);
    tma::loadTile4d(sV, &m.v, 0, kBase, h, b, kvFull);
    const float* L = a.lse + static_cast<int64_t>(bh) * a.Tp;
    const float* Dl = a.delta + static_cast<int64_t>(bh) * a.Tp;
    for (int i = iStart; i < nQ; ++i) {
      const int n = i - iStart, st = n & 1;
      if (n >= 2) tma::wait(empty + st, ((n >> 1) - 1) & 1);
      // lse and delta rows are padded to Tp (a multiple of 4): whole 16-byte chunks, none past it.
      const uint32_t lb = static_cast<uint32_t>(min(kBRQ, a.Tp - i * kBRQ)) * 4u;
      tma::arriveExpectTx(full + st, 2 * kTile128 + 2 * lb);
      tma::loadTile4d(sQ + st * kBRQ * kD, &m.q, 0, i * kBRQ, h, b, full + st);
      tma::loadTile4d(sG + st * kBRQ * kD, &m.g, 0, i * kBRQ, h, b, full + st);
      tma::loadBytes(sL + st * kBRQ, L + i * kBRQ, lb, full + st);
      tma::loadBytes(sD + st * kBRQ, Dl + i * kBRQ, lb, full + st);
    }
    return;
  }

  tma::increaseRegisters<240>();
  const int cw = warp - 4, grp = cw / 4, wl = cw % 4, g = lane / 4, t4 = lane % 4;
  const bool elected = wl == 0 && lane == 0;  // issues this warpgroup's dQ reduce-adds
  const int kw = kBase + grp * 64;
  const int key0 = kw + wl * 16 + g;  // accumulator rows key0, key0 + 8
  const float sl2 = a.scale * kLog2e;
  unsigned char* sDq = sm + kOffDq + grp * 2 * kDqHalf;

  float dk[DT][4], dv[DT][4], s[NT][4], dp[NT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[i][e] = dv[i][e] = 0.f;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[i][e] = dp[i][e] = 0.f;
  const T* kg = sK + grp * 64 * kD;
  const T* vg = sV + grp * 64 * kD;
  tma::wait(kvFull, 0);

  for (int i = iStart; i < nQ; ++i) {
    const int n = i - iStart, st = n & 1, qBase = i * kBRQ;
    const T* q = sQ + st * kBRQ * kD;
    const T* gq = sG + st * kBRQ * kD;
    const float* lq = sL + st * kBRQ;
    const float* dlq = sD + st * kBRQ;
    tma::wait(full + st, (n >> 1) & 1);
    // dS^T into this tile's buffer: its last readers, the dQ products of tile n-2, were waited
    // for before the meeting of tile n-1.
    T* sSb = sS + (n & 1) * 2 * kBC * 64;
    bwdTileProducts<T>(kg, vg, q, gq, lq, dlq, sSb, s, dp, dv, dk, qBase, kw, a.T, key0,
                       grp * 64 + wl * 16 + g, t4, sl2);
    wg::fenceProxyAsync();
    if (elected) tma::bulkWaitRead<0>();  // the last reduce-add has read the staging tile
    tma::namedBarrier(1, 256);            // both warpgroups' dS^T rows written
    float acc[DT][4];
    dqProducts<T>(acc, sSb + grp * kBC * 64, sK);
    wg::wait<0>();  // dV, dK and dQ of this tile: q, dO, lse and delta of the stage are done with
    wg::fenceOperand(acc);
    wg::fenceOperand(dv);
    wg::fenceOperand(dk);
    __syncwarp();
    if (lane == 0) tma::arrive(empty + st);
    stageDq(sDq, acc, wl * 16 + g, t4, a.scale);
    wg::fenceProxyAsync();
    tma::namedBarrier(2 + grp, 128);  // the warpgroup's staging tile written
    if (elected) {
      tma::reduceAddTile4d(&m.dq, sDq, 0, qBase + grp * 64, h, b);
      tma::reduceAddTile4d(&m.dq, sDq + kDqHalf, 32, qBase + grp * 64, h, b);
      tma::bulkCommit();
    }
  }
  if (elected) tma::bulkWait<0>();
  storeKeyGrads(a, b, h, key0, t4, dk, dv);
#else
  __trap();  // launched only where sm90KernelsUsable()
#endif
}

// ---- forward ----------------------------------------------------------------------------------
constexpr int kFwdThreads = 512, kFwdRows = 192, kFwdKeys = 64, kFwdStages = 4;
constexpr int kKvTile = kFwdKeys * kD * 2;            // bytes of one 64-key k or v tile
constexpr int kFwdOffBar = kFwdStages * 2 * kKvTile;  // [stage][k, v], then full[4], empty[4]
constexpr size_t kFwdSmemBytes = kFwdOffBar + 2 * kFwdStages * sizeof(uint64_t) + 1024;

struct FwdMaps {
  CUtensorMap k, v;
};

#if MT_WGMMA
// A consumer warp's side of the k / v ring: stage j's tiles, waiting for them, handing them back.
// Every consumer warp waits for and hands back every stage, in order, also those its rows skip: an
// arrival must not run ahead into the barrier's next phase.
struct FwdRing {
  const unsigned char* sm;
  uint64_t *full, *empty;
  int nKV, lane;
  __device__ const unsigned char* stage(int j) const { return sm + (j % kFwdStages) * 2 * kKvTile; }
  __device__ void waitFull(int j) const { tma::wait(full + j % kFwdStages, (j / kFwdStages) & 1); }
  __device__ void release(int j) const {
    __syncwarp();
    if (lane == 0) tma::arrive(empty + j % kFwdStages);
  }
};

// A consumer warp's 16 rows (rowBase + g and + 8 in this lane): where they are, and the online
// softmax's running max m and sum l.
struct FwdRows {
  int rowBase, g, t4;
  float sl2;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
};

// S = q k^T for key tile k (q from registers), committed, not waited for.
template <typename T>
__device__ __forceinline__ void issueScores(float (&s)[kFwdKeys / 8][4], const uint32_t (&qa)[kD / 16][4],
                                            const T* k) {
  wg::fenceOperand(s);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    wg::Wgmma<kFwdKeys, T>::template rs<0>(s, qa[kk], wg::kmajor(k + kk * 16), kk);
  wg::commit();
}

// The consumer's key loop, serial: S = q k^T, wait, the softmax, O += P v, wait, per tile; tiles
// after gLast (the warpgroup's last row) are only waited for and handed back.
template <typename T>
__device__ __forceinline__ void fwdSerialLoop(const uint32_t (&qa)[kD / 16][4], float (&o)[kD / 8][4],
                                              float (&s)[kFwdKeys / 8][4], FwdRows& r, const FwdRing& ring,
                                              int gLast) {
  for (int j = 0; j < ring.nKV; ++j) {
    const int kBase = j * kFwdKeys;
    ring.waitFull(j);
    if (kBase <= gLast) {  // warpgroup-uniform: some key of the tile is at or before a row of the group
      const T* k = reinterpret_cast<const T*>(ring.stage(j));
      issueScores<T>(s, qa, k);
      wg::wait<0>();
      wg::fenceOperand(s);
      softmaxThenPv<true, true, kFwdKeys, T>(s, o, r.m0, r.m1, r.l0, r.l1, k + kFwdKeys * kD, kBase,
                                             r.rowBase, r.g, r.t4, r.sl2);
      wg::wait<0>();  // before the stage goes back
      wg::fenceOperand(o);
    }
    ring.release(j);
  }
}

// The consumer's key loop with FlashAttention-3's intra-warpgroup overlap (the `overlap` variant):
// S = q k^T of tile j is issued before O += P v of tile j - 1, and tile j's softmax runs while that
// product is in flight; O's rescale for tile j waits for it, then P_j is packed for the next
// iteration. O sees the same operations in the same order as the serial loop (O += P_{j-1} v_{j-1},
// then O x alpha_j), so the output is bitwise the serial kernel's. nMine: the tiles the warpgroup's
// rows reach (a prefix). Tile 0 is peeled off the loop: a wgmma wait in a branch of the loop body
// made ptxas serialise every wgmma of the kernel (C7518).
template <typename T>
__device__ __forceinline__ void fwdOverlapLoop(const uint32_t (&qa)[kD / 16][4], float (&o)[kD / 8][4],
                                               float (&s)[kFwdKeys / 8][4], FwdRows& r, const FwdRing& ring,
                                               int nMine) {
  uint32_t pa[kFwdKeys / 16][4];
  const auto pvOfTile = [&](int j) {
    issuePv<kFwdKeys, T>(o, pa, reinterpret_cast<const T*>(ring.stage(j)) + kFwdKeys * kD);
  };
  // Tile j's softmax; O x alpha_j once the product before it has landed (waitPv); P_j packed.
  const auto softmaxStep = [&](int j, auto waitPv) {
    wg::fenceOperand(s);
    float alpha0, alpha1, u0, u1;
    const bool rescale = softmaxRescale<true, true>(s, r.m0, r.m1, r.l0, r.l1, j * kFwdKeys, r.rowBase, r.g,
                                                    r.t4, r.sl2, alpha0, alpha1, u0, u1);
    softmaxExp<true>(s, r.l0, r.l1, u0, u1, r.sl2);
    waitPv();
    if (rescale) scaleRows(o, alpha0, alpha1);
    packP<kFwdKeys, T>(s, pa);
  };
  if (nMine > 0) {  // tile 0: nothing in flight before it
    ring.waitFull(0);
    issueScores<T>(s, qa, reinterpret_cast<const T*>(ring.stage(0)));
    wg::wait<0>();
    softmaxStep(0, [] {});
  }
  for (int j = 1; j < nMine; ++j) {
    ring.waitFull(j);
    issueScores<T>(s, qa, reinterpret_cast<const T*>(ring.stage(j)));
    pvOfTile(j - 1);
    wg::wait<1>();  // S of tile j; O += P v of tile j - 1 stays in flight through the softmax
    softmaxStep(j, [&] {
      wg::wait<0>();
      wg::fenceOperand(o);
      ring.release(j - 1);
    });
  }
  if (nMine > 0) {
    pvOfTile(nMine - 1);
    wg::wait<0>();
    wg::fenceOperand(o);
    ring.release(nMine - 1);
  }
  for (int j = nMine; j < ring.nKV; ++j) {  // tiles wholly after the warpgroup's rows
    ring.waitFull(j);
    ring.release(j);
  }
}
#endif

template <typename T, bool OVERLAP>
__global__ void __launch_bounds__(kFwdThreads, 1)
    flashForwardSm90WsKernel(const FwdArgs a, const __grid_constant__ FwdMaps m) {
#if MT_WGMMA
  constexpr int NT = kFwdKeys / 8, DT = kD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  unsigned char* sm = alignedSmem(smemRaw);
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + kFwdOffBar);
  uint64_t* empty = full + kFwdStages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int tile, bh;
  blockTile(a.tileMajor, (a.T + kFwdRows - 1) / kFwdRows, tile, bh);
  const int b = bh / a.H, h = bh % a.H;
  const int qEnd = a.T - tile * kFwdRows, qBase = qEnd - kFwdRows;  // qBase < 0 in the partial tile
  const int nKV = (qEnd + kFwdKeys - 1) / kFwdKeys;
  if (tid == 0) {
    for (int s = 0; s < kFwdStages; ++s) {
      tma::barrierInit(full + s, 1);
      tma::barrierInit(empty + s, 12);  // lane 0 of each consumer warp
    }
    tma::fenceBarrierInit();
  }
  __syncthreads();

  if (warp < 4) {
    tma::decreaseRegisters<24>();
    if (tid != 0) return;
    for (int j = 0; j < nKV; ++j) {
      const int st = j % kFwdStages;
      if (j >= kFwdStages) tma::wait(empty + st, ((j / kFwdStages) - 1) & 1);
      tma::arriveExpectTx(full + st, 2 * kKvTile);
      tma::loadTile4d(sm + st * 2 * kKvTile, &m.k, 0, j * kFwdKeys, h, b, full + st);
      tma::loadTile4d(sm + st * 2 * kKvTile + kKvTile, &m.v, 0, j * kFwdKeys, h, b, full + st);
    }
    return;
  }

  tma::increaseRegisters<160>();
  const int cw = warp - 4, grp = cw / 4, wl = cw % 4, g = lane / 4, t4 = lane % 4;
  const int gFirst = qBase + grp * 64, gLast = gFirst + 63;  // the warpgroup's rows (some may be < 0)
  const int row0 = gFirst + wl * 16 + g;
  const T* Q = static_cast<const T*>(a.q) + b * a.qsb + h * a.qsh;
  // q in the A layout of the 16-column steps (rows row0 and row0 + 8; rows outside [0, T) are 0).
  uint32_t qa[kD / 16][4];
  loadQRegisters(qa, Q, a.qst, row0, a.T, t4);
  float o[DT][4], s[NT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
    o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  FwdRows r{gFirst + wl * 16, g, t4, a.scale * kLog2e};
  const FwdRing ring{sm, full, empty, nKV, lane};
  if constexpr (OVERLAP) {
    fwdOverlapLoop<T>(qa, o, s, r, ring, gLast < 0 ? 0 : gLast / kFwdKeys + 1);  // tiles with kBase <= gLast
  } else {
    fwdSerialLoop<T>(qa, o, s, r, ring, gLast);
  }
  if (gLast >= 0) storeRows(a, b, h, row0, t4, o, r.m0, r.m1, r.l0, r.l1);  // rows < 0 are skipped there too
#else
  __trap();  // launched only where sm90KernelsUsable()
#endif
}

template <typename T>
CUtensorMapDataType mapType() {
  return std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// [B, T, H, 64] 16-bit rows with the given strides (elements), boxes of boxRows rows.
template <typename T>
CUtensorMap rowsMap(const void* p, int64_t sb, int64_t st, int64_t sh, int B, int rows, int H,
                    uint32_t boxRows, const char* what) {
  TensorMapShape s;
  s.base = p;
  s.type = mapType<T>();
  s.elementBytes = 2;
  const uint64_t dims[4] = {static_cast<uint64_t>(kD), static_cast<uint64_t>(rows), static_cast<uint64_t>(H),
                            static_cast<uint64_t>(B)};
  const uint64_t strides[3] = {static_cast<uint64_t>(st), static_cast<uint64_t>(sh),
                               static_cast<uint64_t>(sb)};
  for (int i = 0; i < 4; ++i)
    s.dims[i] = dims[i];
  for (int i = 0; i < 3; ++i)
    s.strides[i] = strides[i];
  s.box[0] = kD, s.box[1] = boxRows;
  return encodeTensorMap(s, what);
}

}  // namespace

template <typename T, bool OVERLAP>
void launchForwardSm90Ws(const FwdArgs& args, int B, cudaStream_t s) {
  FwdMaps m;
  m.k = rowsMap<T>(args.k, args.ksb, args.kst, args.ksh, B, args.T, args.H, kFwdKeys, "k");
  m.v = rowsMap<T>(args.v, args.vsb, args.vst, args.vsh, B, args.T, args.H, kFwdKeys, "v");
  FwdArgs a = args;
  a.tileMajor = 1;
  launchWithSmem(flashForwardSm90WsKernel<T, OVERLAP>, tileGrid(1, B * a.H, (a.T + kFwdRows - 1) / kFwdRows),
                 kFwdThreads, kFwdSmemBytes, false, s, a, m);
}

template <typename T>
void launchBackwardSm90Ws(const BwdArgs& args, int B, cudaStream_t s) {
  MT_CHECK(
      reinterpret_cast<uintptr_t>(args.lse) % 16 == 0 && reinterpret_cast<uintptr_t>(args.delta) % 16 == 0,
      "flash backward (ws): lse and delta must be 16-byte aligned");
  WsMaps m;
  m.q = rowsMap<T>(args.q, args.qsb, args.qst, args.qsh, B, args.T, args.H, kBRQ, "q");
  m.k = rowsMap<T>(args.k, args.ksb, args.kst, args.ksh, B, args.T, args.H, kBRQ, "k");
  m.v = rowsMap<T>(args.v, args.vsb, args.vst, args.vsh, B, args.T, args.H, kBRQ, "v");
  m.g = rowsMap<T>(args.dO, args.gsb, args.gst, args.gsh, B, args.T, args.H, kBRQ, "dO");
  TensorMapShape d;
  d.base = args.dq;
  d.type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  d.elementBytes = 4;
  d.dims[0] = kD, d.dims[1] = static_cast<uint64_t>(args.T), d.dims[2] = static_cast<uint64_t>(args.H);
  d.dims[3] = static_cast<uint64_t>(B);
  d.strides[0] = static_cast<uint64_t>(args.dqst), d.strides[1] = static_cast<uint64_t>(args.dqsh);
  d.strides[2] = static_cast<uint64_t>(args.dqsb);
  d.box[0] = 32, d.box[1] = 64;
  m.dq = encodeTensorMap(d, "dq accumulator");
  BwdArgs a = args;
  a.tileMajor = 1;
  launchWithSmem(flashBackwardSm90WsKernel<T>, tileGrid(1, B * a.H, (a.T + kBC - 1) / kBC), kWsThreads, kWsSmemBytes,
                 false, s, a, m);
}

template void launchForwardSm90Ws<__nv_bfloat16, false>(const FwdArgs&, int, cudaStream_t);
template void launchForwardSm90Ws<__nv_bfloat16, true>(const FwdArgs&, int, cudaStream_t);
template void launchBackwardSm90Ws<__nv_bfloat16>(const BwdArgs&, int, cudaStream_t);
template void launchForwardSm90Ws<__half, false>(const FwdArgs&, int, cudaStream_t);
template void launchForwardSm90Ws<__half, true>(const FwdArgs&, int, cudaStream_t);
template void launchBackwardSm90Ws<__half>(const BwdArgs&, int, cudaStream_t);

}  // namespace mt::cuda::flash
