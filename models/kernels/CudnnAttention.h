#pragma once
// Causal self-attention through cuDNN's fused attention engines (cuDNN 9's graph API, built with
// models/kernels/CudnnGraph.h; bf16/f16 operands, f32 softmax and accumulation). Same problem,
// views and math as our own kernels (models/kernels/FlashAttention.h):
//   forward : S = scale q k^T, S[t, s] = -inf for s > t (GEN_INDEX rows and columns, CMP_GE,
//             BINARY_SELECT), m = rowmax S, l = rowsum exp(S - m), P = exp(S - m) / l, O = P v;
//             saves stats = m + ln l per row: a NATURAL-log log-sum-exp, [B, H, T] f32 (our flash
//             kernels save a log2-domain one in their own layout; neither reads the other's).
//   backward: Dsum = rowsum(dO * O); P = exp(mask(scale q k^T) - stats); dV = P^T dO; dP = dO v^T;
//             dS = P * (dP - Dsum) * scale; dK = dS^T q; dQ = dS k. dQ accumulates in an f32
//             buffer in the workspace (cuDNN's atomics; run-to-run bits may differ) unless
//             `deterministic`, where one CTA owns each dQ tile.
// The graphs follow NVIDIA's cudnn-frontend (CompositeSDPANode / CompositeSDPABackwardNode: the
// form it builds for a causal mask on cuDNN < 9.21, which the runtime-fusion engines recognise),
// written against the backend API directly. Plans are built once per (B, T, H, D, dtype, strides)
// and kept by the CudnnAttention object (one per device: CudaRuntime's components hold the
// training path's); a shape cuDNN cannot run is reported with cuDNN's reason, never thrown.

#include <cudnn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "models/kernels/CudnnGraph.h"
#include "models/kernels/FlashAttention.h"

namespace mt::cuda {

// The operands of one problem; forward reads q, k, v and writes o; backward also reads o, dO and
// overwrites dq, dk, dv. All eight in one dtype (bf16 or f16).
struct CudnnAttentionViews {
  FlashView q, k, v, o, dO, dq, dk, dv;
};

class CudnnAttention {
 public:
  CudnnAttention() = default;
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Floats of the stats buffer: [B, H, T].
  static int64_t statsElements(const FlashProblem& p) { return p.B * p.H * p.T; }
  // "" when cuDNN builds both the forward and the backward plan for these views on the current
  // GPU (they are built now and kept); otherwise why not, in cuDNN's words where it has them.
  std::string unsupported(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                          bool deterministic);
  // Device workspace each call needs (plan workspace; backward adds its f32 row sums and, unless
  // deterministic, the f32 dQ accumulator).
  size_t forwardWorkspaceBytes(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v);
  size_t backwardWorkspaceBytes(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                                bool deterministic);
  // The engines cuDNN chose ("fwd engine 8, bwd engine 9"), for logs and the benchmark.
  std::string engines(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                      bool deterministic);

  // Run on `stream` (the handle is bound to it). Unsupported shapes are an error here: callers ask
  // unsupported() first.
  void forward(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v, float* stats,
               void* workspace, size_t workspaceBytes, cudaStream_t stream);
  void backward(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v, const float* stats,
                bool deterministic, void* workspace, size_t workspaceBytes, cudaStream_t stream);

 private:
  struct Key {
    int64_t B, T, H, D;
    int dtype;
    bool backward, deterministic;
    std::array<int64_t, 24> strides;  // sb, st, sh of q, k, v, o (forward), then dO, dq, dk, dv
    bool operator<(const Key& o) const;
  };
  struct Entry {
    std::unique_ptr<CudnnPlan> plan;
    std::string whyNot;
  };
  static Key keyOf(const FlashProblem& p, const CudnnAttentionViews& v, bool backward, bool deterministic);
  // The plan for key (built on first use); null with *whyNot when cuDNN cannot run it.
  const CudnnPlan* plan(cudnnHandle_t h, const Key& key, std::string* whyNot);

  std::mutex mutex_;
  std::map<Key, Entry> plans_;
};

}  // namespace mt::cuda
