#pragma once
// Device-generic primitives of the gradient compression hooks (comm/Compression.h). Every function
// takes contiguous tensors on one device; CPU code runs here, CUDA code in comm/kernels on the
// current stream (no host synchronisation). Results are identical on every rank given identical
// inputs: no atomics, fixed reduction orders.

#include <cstdint>

#include "core/Convert.h"  // convertInto: the casts around a 16-bit all-reduce
#include "core/Tensor.h"
#include "core/Gemm.h"

namespace mt {

// x *= a (f32).
void scaleTensor(Tensor& x, float a);
// y += x (f32, equal numel).
void addInto(Tensor& y, const Tensor& x);
// y -= x (f32, equal numel).
void subtractFrom(Tensor& y, const Tensor& x);
// Row-major f32 C[M,N] = op(A) op(B) + beta C on the tensors' device.
void matmulF32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float beta,
               float* C, Device device);
// Gram-Schmidt on the r columns of the row-major m x r matrix P (PowerSGD's orthogonalisation):
// each column is normalised, then removed from the later ones. A column that is (numerically)
// zero becomes zero instead of noise.
void orthonormalizeColumns(float* P, int64_t m, int64_t r, Device device);
// The k entries of x (f32, n) largest in magnitude: idx (i32, k) ascending, val (f32, k) = x[idx].
// Ties are broken by position, so the choice is the same on every run. indexBase is added to
// every index written (positions in an enclosing buffer).
void topkByMagnitude(const Tensor& x, int64_t k, Tensor& idx, Tensor& val, int64_t indexBase = 0);
// y[idx[j]] += scale * val[j] for j < k (indices unique within one call).
void scatterAdd(Tensor& y, const Tensor& idx, const Tensor& val, float scale);
// y[idx[j]] = 0 for j < k.
void scatterZero(Tensor& y, const Tensor& idx);

}  // namespace mt
