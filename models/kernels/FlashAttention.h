#pragma once
// Causal self-attention without a T x T matrix (FlashAttention-2, Dao 2023), our own CUDA kernels
// on the tensor cores, bf16 or f16 operands, f32 accumulation: warpgroup MMA (wgmma) at head dim 64
// on sm_90a devices (models/kernels/FlashAttentionSm90.cu, the default there), mma.sync m16n8k16
// everywhere else and for head dims 32 / 128 (models/kernels/FlashAttention.cu).
//   S = scale q k^T (causal: key s <= query t),  P = softmax_s(S),  O = P v
//   forward : per tile of queries, stream tiles of k/v through shared memory with an online softmax
//             (running row max m and sum l); tiles above the diagonal are skipped, the diagonal one
//             masked. Saves O and lse = log2-domain log-sum-exp per row; nothing T x T.
//   backward: D = rowsum(dO * O) first (pre-pass), then per tile of keys, for every later tile of
//             queries: recompute P = exp2(scale' S - lse), dV += P^T dO, dP = dO v^T,
//             dS = P * (dP - D), dK += dS^T q, dQ += dS k (f32 atomics; zeroed by the pre-pass).
// dq, dk, dv are overwritten. Layout: element (b, t, h, j) of a [B, T, H, D]-shaped operand is at
// ptr + b*sb + t*st + h*sh + j (element strides, j contiguous), so the fused GPT qkv tensor
// [B, T, 3, H, D] is three views without a copy. Head dims 32, 64, 128; any T, B, H.
// The lab and the benchmark against PyTorch SDPA: scripts/bench/attention_bench.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/DType.h"

namespace mt::cuda {

struct FlashView {
  void* ptr = nullptr;
  DType dtype = DType::kBF16;
  int64_t sb = 0, st = 0, sh = 0;
};

// A variant argument naming the default for the problem's shape (D, dtype and T: see
// FlashAttention.cu's tables) instead of an index of flashVariantName's list.
constexpr int kFlashDefaultVariant = -1;

struct FlashProblem {
  int64_t B = 0, T = 0, H = 0, D = 0;
  float scale = 0.f;  // softmax scale, usually 1/sqrt(D)
  // Tile configuration (kernel lab): an index of flashVariantName's list, or kFlashDefaultVariant.
  int fwdVariant = kFlashDefaultVariant, bwdVariant = kFlashDefaultVariant;
};

// q, k, v in bf16 or f16 and a head dim the kernels are built for.
bool flashSupported(int64_t headDim, DType inputDType);
// Number of tile variants usable on the current device for (D, dtype), and a short name
// ("fwd w4 bc64", "bwd wgmma x2"), and the index of the default at sequence length T. Lab use.
int flashVariantCount(int64_t headDim, DType inputDType, bool backward);
const char* flashVariantName(int64_t headDim, DType inputDType, bool backward, int variant);
int flashDefaultVariant(int64_t headDim, DType inputDType, bool backward, int64_t T);
// Floats of the lse buffer: [B*H][roundUp(T, 4)], written by forward, read by backward.
int64_t flashLseElements(const FlashProblem& p);
// Workspace backward needs (delta, dO in the input dtype when it arrives otherwise, an f32 dq
// accumulator when dq is not f32).
size_t flashBackwardWorkspaceBytes(const FlashProblem& p, DType inputDType, const FlashView& dO, const FlashView& dq);

// q, k, v: same dtype (bf16/f16), rows 16-byte aligned. o: f32, bf16 or f16, even strides.
void flashAttentionForward(const FlashProblem& p, const FlashView& q, const FlashView& k, const FlashView& v,
                           const FlashView& o, float* lse, cudaStream_t stream);
// dO and o: any floating dtype; dq, dk, dv: f32, bf16 or f16.
void flashAttentionBackward(const FlashProblem& p, const FlashView& q, const FlashView& k, const FlashView& v,
                            const FlashView& o, const FlashView& dO, const float* lse, const FlashView& dq,
                            const FlashView& dk, const FlashView& dv, void* workspace, size_t workspaceBytes,
                            cudaStream_t stream);

}  // namespace mt::cuda
