#pragma once
// Causal multi-head self-attention on a fused qkv tensor (GPT-2 layout):
//   qkv [B, T, 3, H, d]  ->  q, k, v [B, H, T, d]
//   S = q k^T / sqrt(d) with S[t, s] = -inf for s > t,   P = softmax_s(S),   y = P v  -> [B, T, H, d]
// Backward:
//   dv = P^T dy,   dP = dy v^T,   dS = P * (dP - rowsum(P * dP)) / sqrt(d),   dq = dS k,   dk = dS^T q
// (rowsum(P * dP) = rowsum(dy * y), which is how the flash path gets it without P.)
// dqkv is overwritten. Three implementations:
//   reference (CPU; CUDA in f32 matmul precision or an unsupported head dim): P [B, H, T, T] is
//     materialised and kept for backward (per (b, h) GEMMs through OpenBLAS; strided batched
//     cuBLASLt GEMMs with row-wise softmax kernels on the GPU, models/kernels/Attention.cu);
//   flash (CUDA in bf16/f16 matmul precision, head dim 32/64/128): our kernels,
//     models/kernels/FlashAttention.h; keep qkv in the matmul dtype and one log2-domain
//     log-sum-exp per row; nothing T x T;
//   cudnn (the same conditions, where cuDNN's fused attention runs the shape):
//     models/kernels/CudnnAttention.h; keeps the same, with cuDNN's natural-log statistics.
// Which fused kernel runs is AttentionBackend (model.attention): auto measures both once per shape
// (models/kernels/AttentionChoice.h). The CPU ignores it.

#include "core/EnumTable.h"
#include "core/Tensor.h"

namespace mt {

// model.attention: what the GPU runs in bf16/f16 matmul precision.
enum class AttentionBackend { kAuto, kFlash, kCudnn };
const EnumTable<AttentionBackend>& attentionBackends();

// The implementation a forward ran; its backward must run the same one.
enum class AttentionPath { kReference, kFlash, kCudnn };

// What backward needs from a training forward; filled by attentionForward.
struct AttentionSaved {
  AttentionPath path = AttentionPath::kReference;
  Tensor qkv;     // reference: the input
  Tensor probs;   // reference: P [B, H, T, T]
  Tensor qkvLow;  // flash, cudnn: the input in the matmul dtype
  Tensor lse;     // flash: log2-domain log-sum-exp [B*H][roundUp(T, 4)]; cudnn: natural-log [B, H, T]
  Tensor y;       // flash, cudnn: the output in the matmul dtype (when it is the projection's
                  // input, as in the GPT, it is not counted again)
  bool cudnnDeterministicBackward = false;  // cudnn: which backward the choice timed fastest
  bool flash() const { return path == AttentionPath::kFlash; }
  bool cudnn() const { return path == AttentionPath::kCudnn; }
  int64_t bytes() const;
  void clear() { *this = AttentionSaved(); }
};

// y [B,T,C] from qkv [B,T,3C]; saved (training) receives what backward needs, null for inference.
// backend: which fused kernel the GPU runs in reduced precision (kCudnn on a shape cuDNN cannot
// run is a ConfigError naming model.attention).
void attentionForward(Tensor& y, const Tensor& qkv, int64_t heads, AttentionSaved* saved,
                      AttentionBackend backend = AttentionBackend::kAuto);
void attentionBackward(Tensor& dqkv, const Tensor& dy, const AttentionSaved& saved, int64_t heads);

// y += x (element-wise, same shape): residual connections.
void addInPlace(Tensor& y, const Tensor& x);
// x[b, t, :] += wpe[t, :] (wpe holds the first T positions); backward dwpe[t] += sum_b dx[b, t].
void addPositional(Tensor& x, const Tensor& wpe);
void positionalBackward(Tensor& dwpe, const Tensor& dx);

}  // namespace mt
