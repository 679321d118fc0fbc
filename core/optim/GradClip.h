#pragma once
// Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_):
//   norm = sqrt(sum over all gradients of g²);  if maxNorm / (norm + 1e-6) < 1: g *= that factor
// With sharded gradients each rank holds part of the sum: `allReduceSum` adds the ranks' partial
// sums of squares (identity for replicated gradients).

#include <functional>
#include <vector>

#include "core/optim/Optimizer.h"

namespace mt {

double sumOfSquares(const std::vector<OptimSegment>& segments);
void scaleGrads(const std::vector<OptimSegment>& segments, float factor);
// Returns the norm before clipping. maxNorm <= 0 only measures.
// The factor gradients of global norm `norm` are scaled by to clip them to maxNorm (PyTorch's
// clip_grad_norm_: maxNorm / (norm + 1e-6) when below 1); 1 when maxNorm <= 0 or no clip is due.
float clipFactor(double norm, float maxNorm);
double clipGradNorm(const std::vector<OptimSegment>& segments, float maxNorm,
                    const std::function<double(double)>& allReduceSum = nullptr);
// The same clipping of replicated gradients (no cross-rank sum) without returning the norm: on the
// GPU the norm never leaves the device, so the step has no host synchronisation here (reading it
// back made the CPU wait for backward and the GPU then wait for the CPU: 17 ms of a 134 ms GPT-2
// step on the H200, 2026-12-03).
void clipGradNormInPlace(const std::vector<OptimSegment>& segments, float maxNorm);

}  // namespace mt
