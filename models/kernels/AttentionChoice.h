#pragma once
// Which fused kernel runs causal attention on the GPU in bf16/f16 matmul precision
// (model.attention, AttentionBackend), decided once per (B, T, H, D, dtype) and device and kept in
// the CudaRuntime's components:
//   flash : our kernels (models/kernels/FlashAttention.h), where built for the head dim;
//   cudnn : cuDNN's fused attention (models/kernels/CudnnAttention.h); a shape it cannot run is a
//           ConfigError naming model.attention (exit 2), with cuDNN's reason;
//   auto  : the one that runs where only one does (cuDNN's reason is logged once); where both do,
//           each runs forward + backward on the real shape (the layer's own qkv as input, scratch
//           outputs) once to warm up and kTimedReps times under CUDA events — cuDNN with each of its
//           two backwards, the default (dQ accumulated in f32 with atomics, as PyTorch's) and the
//           deterministic one (one CTA per dQ tile; faster at head dim 128 on short sequences, H100
//           2026-12-05) — and the lowest median wins, logged once:
//             attention: cudnn chosen for B=64,T=1024,H=12,D=64 bf16 (cudnn 1.571 ms, cudnn with
//             deterministic dQ 1.650 ms, flash 1.665 ms forward+backward, median of 5; ...)
//   In f16 auto runs ours where built (cuDNN's f16 backward is less accurate, docs/performance.md).
//   cudnn runs cuDNN's default backward.
// Neither: the f32 reference path (AttentionPath::kReference). Each rank measures for itself (the
// all-reduce keeps the weights identical whichever kernel a rank runs). The measurement allocates
// one block's attention output, qkv gradient and workspaces once, at the shape's first forward.
//
// Also the layer's operand layouts: views of the fused GPT tensors without copies.

#include "core/Tensor.h"
#include "core/cuda/CudaRuntime.h"
#include "models/kernels/CudnnAttention.h"
#include "models/kernels/FlashAttention.h"
#include "models/layers/Attention.h"

namespace mt::cuda {

constexpr int kTimedReps = 5;

// What runs a shape: the path, and with cuDNN which of its backwards.
struct AttentionChoice {
  AttentionPath path = AttentionPath::kReference;
  bool cudnnDeterministicBackward = false;
};

// q, k, v (which = 0, 1, 2) of the fused [B, T, 3, H, d] tensor.
FlashView qkvView(const Tensor& t, int which, int64_t H, int64_t d);
// A [B, T, H*d] tensor as [B, T, H, d].
FlashView rowsView(const Tensor& t, int64_t d);
FlashProblem problemOf(const Tensor& qkv, int64_t heads);
// The views of one layer call: q, k, v in qkvLow; o, dO in [B, T, C] tensors; dq, dk, dv in a
// [B, T, 3C] one. Undefined tensors give null pointers (enough to ask whether a layout runs).
CudnnAttentionViews layerViews(const Tensor& qkvLow, const Tensor& y, const Tensor& dy, const Tensor& dqkv,
                               int64_t heads);

// This runtime's cuDNN attention plans.
CudnnAttention& cudnnAttentionOf(CudaRuntime& rt);

// The implementation for qkvLow (the input in the matmul dtype) with `heads` heads.
AttentionChoice chooseAttention(AttentionBackend requested, const Tensor& qkvLow, int64_t heads);

}  // namespace mt::cuda
