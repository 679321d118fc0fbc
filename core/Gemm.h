#pragma once
// Row-major GEMM: C[M,N] = alpha * op(A) * op(B) + beta * C, the one matrix multiply every layer
// uses. CPU goes to OpenBLAS (cblas_sgemm); CUDA to cuBLASLt (core/cuda/CudaGemm.h).

#include "core/Tensor.h"

namespace mt {

enum class Trans { kNo, kYes };

// A is [M,K] (or [K,M] when transA), B is [K,N] (or [N,K] when transB), all contiguous f32 on CPU.
// lda/ldb/ldc default to the contiguous row length.
void gemmCpu(Trans transA, Trans transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
             const float* B, float beta, float* C);

}  // namespace mt
