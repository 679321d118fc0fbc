#pragma once
// Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_):
//   norm = sqrt(sum over all gradients of g²);  if maxNorm / (norm + 1e-6) < 1: g *= that factor
// With sharded gradients each rank holds part of the sum: `allReduceSum` adds the ranks' partial
// sums of squares (identity for replicated gradients).

#include <functional>
#include <vector>

#include "models/optim/Optimizer.h"

namespace mt {

double sumOfSquares(const std::vector<OptimSegment>& segments);
void scaleGrads(const std::vector<OptimSegment>& segments, float factor);
// Returns the norm before clipping. maxNorm <= 0 only measures.
double clipGradNorm(const std::vector<OptimSegment>& segments, float maxNorm,
                    const std::function<double(double)>& allReduceSum = nullptr);

}  // namespace mt
