#pragma once
// CUDA side of comm/CompressionOps.h (comm/kernels/CompressionKernels.cu), on the current stream.

#include <cstdint>

namespace mt::cuda {

void axpy(float* y, const float* x, float a, int64_t n);
void orthonormalizeColumns(float* P, int64_t m, int64_t r);
void topkByMagnitude(const float* x, int64_t n, int64_t k, int32_t* idx, float* val, int64_t indexBase);
void scatterAdd(float* y, const int32_t* idx, const float* val, int64_t k, float scale);
void scatterZero(float* y, const int32_t* idx, int64_t k);

}  // namespace mt::cuda
