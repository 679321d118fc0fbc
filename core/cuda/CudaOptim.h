#pragma once
// CUDA optimizer and gradient utilities (multi-tensor: one launch covers many segments).

#include <vector>

#include "core/optim/Optimizer.h"

namespace mt::cuda {

void adamwMultiTensor(const std::vector<OptimSegment>& segs, const std::vector<int64_t>& stateOffsets, Tensor& m,
                      Tensor& v, float lr, float wd, float beta1, float beta2, float eps, int64_t step);
void sgdMultiTensor(const std::vector<OptimSegment>& segs, const std::vector<int64_t>& stateOffsets, Tensor& buf,
                    float lr, float wd, float momentum, bool nesterov, bool firstStep);
// Sum of squares of a flat f32 device tensor, in f64, deterministic (fixed reduction tree).
double sumOfSquares(const Tensor& t);
// The same sum written to *out (device memory) on the current stream, with no host synchronisation.
void sumOfSquaresInto(const Tensor& t, double* out);
// Over every segment's gradient in a few multi-tensor launches and one host synchronisation.
double sumOfSquares(const std::vector<OptimSegment>& segments);
void scaleGrads(const std::vector<OptimSegment>& segments, float factor);
// clipGradNorm without reading the norm back: the factor is computed and applied on the device.
void clipGradNormOnDevice(const std::vector<OptimSegment>& segments, float maxNorm);
void scaleInPlace(const Tensor& t, float factor);
// Whether any element of the f32 device tensors is inf or nan.
bool anyNonFinite(const std::vector<Tensor>& ts);

}  // namespace mt::cuda
