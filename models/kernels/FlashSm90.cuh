#pragma once
// Pieces shared by the wgmma attention kernels for sm_90a (FlashAttentionSm90.cu: forward and the
// backward with per-tile barriers; FlashAttentionSm90Ws.cu: the warp-specialized kernels), head
// dim 64: the aligned dynamic shared memory, q in registers, the forward's softmax and P v after
// S = q k^T, and the backward's per-tile products (P^T and dS^T in registers, dV, dK, dQ).

#include "models/kernels/FlashCommon.cuh"
#include "models/kernels/Wgmma.cuh"

namespace mt::cuda::flash::sm90 {

constexpr int kD = 64;             // head dim: one 128-byte swizzled row per tile row

// The dynamic shared memory, rounded up to the 1024-byte alignment the swizzle needs.
__device__ __forceinline__ unsigned char* alignedSmem(unsigned char* raw) {
  const uint32_t a = smemAddr(raw);
  return raw + (((a + 1023u) & ~1023u) - a);
}

#if MT_WGMMA
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t u);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
#endif

#if MT_WGMMA
// P^T = exp2(sl2 S^T - lse) for a 64-key x NT*8-query accumulator (rows key0 / key1, query columns
// qBase + 8 nt + 2 t4), packed to 16 bits as the A operand of dV += P^T dO. MASKED: 0 where
// key > query or query >= T (selected, so lse's padding past T is never used as a number).
template <bool MASKED, int NT, typename T>
__device__ __forceinline__ void expTile(float (&s)[NT][4], uint32_t (&pa)[NT / 2][4], const float* lq, float sl2,
                                        int qBase, int key0, int key1, int t4, int seqLen) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 lv = *reinterpret_cast<const float2*>(lq + nt * 8 + 2 * t4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = fastExp2(fmaf(s[nt][e], sl2, -((e & 1) ? lv.y : lv.x)));
      if constexpr (MASKED) {
        const int qgl = qBase + nt * 8 + 2 * t4 + (e & 1), key = e < 2 ? key0 : key1;
        s[nt][e] = key <= qgl && qgl < seqLen ? v : 0.f;
      } else {
        s[nt][e] = v;
      }
    }
    pa[nt / 2][(nt & 1) * 2] = Mma<T>::pack(s[nt][0], s[nt][1]);
    pa[nt / 2][(nt & 1) * 2 + 1] = Mma<T>::pack(s[nt][2], s[nt][3]);
  }
}
// dS^T = P^T (dP^T - delta) with the 16-bit P^T that dV uses, packed as the A operand of
// dK += dS^T q. MASKED: 0 where P^T is 0 (selected: delta's padding past T is not a number to use).
template <bool MASKED, int NT, typename T>
__device__ __forceinline__ void dsTile(float (&dp)[NT][4], const uint32_t (&pa)[NT / 2][4], uint32_t (&sa)[NT / 2][4],
                                       const float* dlq, int t4) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 dl = *reinterpret_cast<const float2*>(dlq + nt * 8 + 2 * t4);
    const float2 p0 = unpack2<T>(pa[nt / 2][(nt & 1) * 2]), p1 = unpack2<T>(pa[nt / 2][(nt & 1) * 2 + 1]);
    const float p[4] = {p0.x, p0.y, p1.x, p1.y};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = p[e] * (dp[nt][e] - ((e & 1) ? dl.y : dl.x));
      dp[nt][e] = MASKED && p[e] == 0.f ? 0.f : v;
    }
    sa[nt / 2][(nt & 1) * 2] = Mma<T>::pack(dp[nt][0], dp[nt][1]);
    sa[nt / 2][(nt & 1) * 2 + 1] = Mma<T>::pack(dp[nt][2], dp[nt][3]);
  }
}
#endif

#if MT_WGMMA
// q rows row0 and row0 + 8 (row stride qst) in the A layout of S = q k^T's 16-column steps, read
// once into registers; rows outside [0, seqLen) are 0.
template <typename T>
__device__ __forceinline__ void loadQRegisters(uint32_t (&qa)[kD / 16][4], const T* Q, int64_t qst, int row0,
                                               int seqLen, int t4) {
  const bool ok0 = row0 >= 0 && row0 < seqLen, ok1 = row0 + 8 >= 0 && row0 + 8 < seqLen;
  const T* q0 = Q + static_cast<int64_t>(ok0 ? row0 : 0) * qst + 2 * t4;
  const T* q1 = Q + static_cast<int64_t>(ok1 ? row0 + 8 : 0) * qst + 2 * t4;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    qa[kk][0] = ok0 ? __ldg(reinterpret_cast<const unsigned int*>(q0 + kk * 16)) : 0u;
    qa[kk][1] = ok1 ? __ldg(reinterpret_cast<const unsigned int*>(q1 + kk * 16)) : 0u;
    qa[kk][2] = ok0 ? __ldg(reinterpret_cast<const unsigned int*>(q0 + kk * 16 + 8)) : 0u;
    qa[kk][3] = ok1 ? __ldg(reinterpret_cast<const unsigned int*>(q1 + kk * 16 + 8)) : 0u;
  }
}

// The forward's tile after S = q k^T for a warpgroup's 64 query rows (rowBase + 16 wl.. as
// softmaxTile's rows): the online softmax (masked where the tile crosses the diagonal), P packed
// to 16 bits in registers as the A operand, and O += P v issued (v MN-major: its rows are the
// reduction index); committed, not waited for. Shared by flashForwardSm90Kernel and the
// warp-specialized forward.
// P (S after the softmax) packed to 16 bits in registers as the A operand of O += P v.
template <int BC, typename T>
__device__ __forceinline__ void packP(const float (&s)[BC / 8][4], uint32_t (&pa)[BC / 16][4]) {
#pragma unroll
  for (int nt = 0; nt < BC / 8; ++nt) {
    pa[nt / 2][(nt & 1) * 2] = Mma<T>::pack(s[nt][0], s[nt][1]);
    pa[nt / 2][(nt & 1) * 2 + 1] = Mma<T>::pack(s[nt][2], s[nt][3]);
  }
}
// O += P v over BC keys (v MN-major: its rows are the reduction index), committed, not waited for.
template <int BC, typename T>
__device__ __forceinline__ void issuePv(float (&o)[kD / 8][4], const uint32_t (&pa)[BC / 16][4], const T* v) {
  wg::fenceOperand(o);
  wg::fence();
#pragma unroll
  for (int kc = 0; kc < BC / 16; ++kc) wg::Wgmma<kD, T>::template rs<1>(o, pa[kc], wg::mnmajor(v + kc * 16 * kD), 1);
  wg::commit();
}
template <bool LAZY, bool TREE, int BC, typename T>
__device__ __forceinline__ void softmaxThenPv(float (&s)[BC / 8][4], float (&o)[kD / 8][4], float& m0,
                                              float& m1, float& l0, float& l1, const T* v, int kBase,
                                              int rowBase, int g, int t4, float sl2) {
  softmaxTile<LAZY, TREE>(s, o, m0, m1, l0, l1, kBase, rowBase, g, t4, sl2);
  uint32_t pa[BC / 16][4];
  packP<BC, T>(s, pa);
  issuePv<BC, T>(o, pa, v);
}
#endif

#if MT_WGMMA
constexpr int kBwdRows = 128;  // the backward's tiles: 128 keys a block, 128 queries a step

// One 128-query tile of the backward for a warpgroup owning 64 keys (its accumulator rows key0 and
// key0 + 8; the rows of kg / vg): S^T and dP^T as m64n128 products (the shared operand read once
// per 128 queries), P^T packed in registers while dP^T runs, dV += P^T dO, dS^T = P^T (dP^T -
// delta) from that same 16-bit P^T while dV runs, dK += dS^T q (left in flight), and dS^T's rows
// (r0 and r0 + 8 of the block's 128 keys) into sS ([2 query halves][128 keys][64], swizzled), which
// the caller must have made free. Shared by the Q128 and the warp-specialized kernels.
template <typename T>
__device__ __forceinline__ void bwdTileProducts(const T* kg, const T* vg, const T* q, const T* gq, const float* lq,
                                                const float* dlq, T* sS, float (&s)[kBwdRows / 8][4],
                                                float (&dp)[kBwdRows / 8][4], float (&dv)[kD / 8][4],
                                                float (&dk)[kD / 8][4], int qBase, int kw, int seqLen, int key0,
                                                int r0, int t4, float sl2) {
  constexpr int NT = kBwdRows / 8;
  using W = wg::Wgmma<64, T>;          // dV, dK: N = head dim
  using WS = wg::Wgmma<kBwdRows, T>;   // S^T, dP^T: N = 128 queries
  const int key1 = key0 + 8;
  wg::fenceOperand(s);
  wg::fenceOperand(dp);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) WS::template ss<0, 0>(s, wg::kmajor(kg + kk * 16), wg::kmajor(q + kk * 16), kk);
  wg::commit();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) WS::template ss<0, 0>(dp, wg::kmajor(vg + kk * 16), wg::kmajor(gq + kk * 16), kk);
  wg::commit();
  // P^T = exp2(sl2 S - lse), zero where key > query or query >= T, while dP^T runs.
  wg::wait<1>();
  wg::fenceOperand(s);
  // Tiles wholly below the diagonal and before T (most of them) take the branch without the
  // per-element mask: its index arithmetic and selects were a fifth of the loop's instructions.
  const bool inside = qBase >= kw + 63 && qBase + kBwdRows <= seqLen;  // warpgroup-uniform
  uint32_t pa[kBwdRows / 16][4], sa[kBwdRows / 16][4];
  if (inside) {
    expTile<false, NT, T>(s, pa, lq, sl2, qBase, key0, key1, t4, seqLen);
  } else {
    expTile<true, NT, T>(s, pa, lq, sl2, qBase, key0, key1, t4, seqLen);
  }
  wg::fenceOperand(dv);
  wg::fence();
#pragma unroll
  for (int kq = 0; kq < kBwdRows / 16; ++kq) W::template rs<1>(dv, pa[kq], wg::mnmajor(gq + kq * 16 * kD), 1);
  wg::commit();
  // dS^T = P^T (dP^T - delta) with the 16-bit P^T that dV uses (0 where masked), while dV runs.
  wg::wait<1>();
  wg::fenceOperand(dp);
  if (inside) {
    dsTile<false, NT, T>(dp, pa, sa, dlq, t4);
  } else {
    dsTile<true, NT, T>(dp, pa, sa, dlq, t4);
  }
  wg::fenceOperand(dk);
  wg::fence();
#pragma unroll
  for (int kq = 0; kq < kBwdRows / 16; ++kq) W::template rs<1>(dk, sa[kq], wg::mnmajor(q + kq * 16 * kD), 1);
  wg::commit();
  // dS^T -> shared memory: key rows of this warpgroup, query half nt / 8.
  const int r1 = r0 + 8;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    T* half = sS + (nt / 8) * kBwdRows * 64;
    *reinterpret_cast<uint32_t*>(half + wg::swz(r0, nt % 8) + 2 * t4) = sa[nt / 2][(nt & 1) * 2];
    *reinterpret_cast<uint32_t*>(half + wg::swz(r1, nt % 8) + 2 * t4) = sa[nt / 2][(nt & 1) * 2 + 1];
  }
}

// dQ for 64 queries = dS k over the block's 128 keys (A = dS^T read M-major from sh, the query
// half's [128 keys][64] tile; B = k MN-major), committed, not waited for. acc is not initialised:
// the first product overwrites it, and a definition by ordinary instructions would make ptxas
// serialise the products in flight (C7515).
template <typename T>
__device__ __forceinline__ void dqProducts(float (&acc)[kD / 8][4], const T* sh, const T* sK) {
  wg::fenceOperand(acc);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < kBwdRows / 16; ++ks)
    wg::Wgmma<64, T>::template ss<1, 1>(acc, wg::mnmajor(sh + ks * 16 * 64), wg::mnmajor(sK + ks * 16 * kD), ks);
  wg::commit();
}
#endif

}  // namespace mt::cuda::flash::sm90
