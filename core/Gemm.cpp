#include "core/Gemm.h"

#include <cblas.h>

namespace mt {

void gemmCpu(Trans transA, Trans transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
             const float* B, float beta, float* C) {
  if (M == 0 || N == 0) return;
  const blasint lda = static_cast<blasint>(transA == Trans::kNo ? K : M);
  const blasint ldb = static_cast<blasint>(transB == Trans::kNo ? N : K);
  cblas_sgemm(CblasRowMajor, transA == Trans::kNo ? CblasNoTrans : CblasTrans,
              transB == Trans::kNo ? CblasNoTrans : CblasTrans, static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, A, lda, B, ldb, beta, C, static_cast<blasint>(N));
}

}  // namespace mt
