#pragma once
// Causal multi-head self-attention on a fused qkv tensor (GPT-2 layout):
//   qkv [B, T, 3, H, d]  ->  q, k, v [B, H, T, d]
//   S = q k^T / sqrt(d) with S[t, s] = -inf for s > t,   P = softmax_s(S),   y = P v  -> [B, T, H, d]
// Backward (P kept from forward):
//   dv = P^T dy,   dP = dy v^T,   dS = P * (dP - rowsum(P * dP)) / sqrt(d),   dq = dS k,   dk = dS^T q
// dqkv is overwritten. CPU: per (b, h) GEMMs through OpenBLAS; CUDA: strided batched cuBLASLt GEMMs
// with row-wise softmax kernels (models/kernels/Attention.cu).

#include "core/Tensor.h"

namespace mt {

// y [B,T,C]; att receives P [B,H,T,T] (needed by backward).
void attentionForward(Tensor& y, Tensor& att, const Tensor& qkv, int64_t heads);
void attentionBackward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& att, int64_t heads);

// y += x (element-wise, same shape): residual connections.
void addInPlace(Tensor& y, const Tensor& x);
// x[b, t, :] += wpe[t, :] (wpe holds the first T positions); backward dwpe[t] += sum_b dx[b, t].
void addPositional(Tensor& x, const Tensor& wpe);
void positionalBackward(Tensor& dwpe, const Tensor& dx);

}  // namespace mt
