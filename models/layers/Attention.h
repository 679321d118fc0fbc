#pragma once
// Causal multi-head self-attention on a fused qkv tensor (GPT-2 layout):
//   qkv [B, T, 3, H, d]  ->  q, k, v [B, H, T, d]
//   S = q k^T / sqrt(d) with S[t, s] = -inf for s > t,   P = softmax_s(S),   y = P v  -> [B, T, H, d]
// Backward:
//   dv = P^T dy,   dP = dy v^T,   dS = P * (dP - rowsum(P * dP)) / sqrt(d),   dq = dS k,   dk = dS^T q
// (rowsum(P * dP) = rowsum(dy * y), which is how the flash path gets it without P.)
// dqkv is overwritten. Two implementations:
//   reference (CPU; CUDA in f32 matmul precision or an unsupported head dim): P [B, H, T, T] is
//     materialised and kept for backward (per (b, h) GEMMs through OpenBLAS; strided batched
//     cuBLASLt GEMMs with row-wise softmax kernels on the GPU, models/kernels/Attention.cu);
//   flash (CUDA in bf16/f16 matmul precision, head dim 32/64/128): models/kernels/FlashAttention.h,
//     keeps qkv in the matmul dtype and one log-sum-exp per row; nothing T x T.

#include "core/Tensor.h"

namespace mt {

// What backward needs from a training forward; filled by attentionForward.
struct AttentionSaved {
  Tensor qkv;     // reference: the input
  Tensor probs;   // reference: P [B, H, T, T]
  Tensor qkvLow;  // flash: the input in the matmul dtype
  Tensor lse;     // flash: per-row log-sum-exp (log2 domain)
  Tensor y;       // flash: the output (also the projection's cached input: not counted again)
  bool flash() const { return lse.defined(); }
  int64_t bytes() const;
  void clear() { *this = AttentionSaved(); }
};

// y [B,T,C] from qkv [B,T,3C]; saved (training) receives what backward needs, null for inference.
void attentionForward(Tensor& y, const Tensor& qkv, int64_t heads, AttentionSaved* saved);
void attentionBackward(Tensor& dqkv, const Tensor& dy, const AttentionSaved& saved, int64_t heads);

// y += x (element-wise, same shape): residual connections.
void addInPlace(Tensor& y, const Tensor& x);
// x[b, t, :] += wpe[t, :] (wpe holds the first T positions); backward dwpe[t] += sum_b dx[b, t].
void addPositional(Tensor& x, const Tensor& wpe);
void positionalBackward(Tensor& dwpe, const Tensor& dx);

}  // namespace mt
