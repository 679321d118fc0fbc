#include "comm/CompressionOps.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/Parallel.h"

#ifdef MT_WITH_CUDA
#include "comm/kernels/CudaCompression.h"
#include "core/cuda/CudaGemm.h"
#include "core/cuda/CudaOptim.h"
#endif

namespace mt {

namespace {

constexpr int64_t kGrain = 1 << 15;

void checkF32(const Tensor& t, const char* what) {
  MT_CHECK(t.dtype() == DType::kF32 && t.isContiguous(), what, ": needs a contiguous f32 tensor, got ", t.str());
}

}  // namespace

void scaleTensor(Tensor& x, float a) {
  checkF32(x, "scaleTensor");
#ifdef MT_WITH_CUDA
  if (x.device().isCuda()) {
    cuda::scaleInPlace(x, a);
    return;
  }
#endif
  float* p = x.data<float>();
  parallelFor(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) p[i] *= a;
  });
}

namespace {

// y += alpha * x (f32, same device): error feedback's add and subtract.
void axpyInto(Tensor& y, const Tensor& x, float alpha, const char* who) {
  checkF32(y, who);
  checkF32(x, who);
  MT_CHECK(y.numel() == x.numel() && y.device() == x.device(), who, " ", x.str(), " and ", y.str());
#ifdef MT_WITH_CUDA
  if (y.device().isCuda()) {
    cuda::axpy(y.data<float>(), x.data<float>(), alpha, y.numel());
    return;
  }
#endif
  float* py = y.data<float>();
  const float* px = x.data<float>();
  parallelFor(y.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) py[i] += alpha * px[i];
  });
}

}  // namespace

void addInto(Tensor& y, const Tensor& x) { axpyInto(y, x, 1.f, "addInto"); }

void subtractFrom(Tensor& y, const Tensor& x) { axpyInto(y, x, -1.f, "subtractFrom"); }

void matmulF32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float beta,
               float* C, Device device) {
#ifdef MT_WITH_CUDA
  if (device.isCuda()) {
    cuda::GemmCall g;
    g.transA = ta;
    g.transB = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.beta = beta;
    g.A = A;
    g.B = B;
    g.C = C;
    cuda::gemm(g);
    return;
  }
#endif
  gemmCpu(ta, tb, M, N, K, 1.f, A, B, beta, C);
}

void orthonormalizeColumns(float* P, int64_t m, int64_t r, Device device) {
#ifdef MT_WITH_CUDA
  if (device.isCuda()) {
    cuda::orthonormalizeColumns(P, m, r);
    return;
  }
#endif
  for (int64_t i = 0; i < r; ++i) {
    double ss = 0.0;
    for (int64_t k = 0; k < m; ++k) ss += static_cast<double>(P[k * r + i]) * P[k * r + i];
    const double norm = std::sqrt(ss);
    const float inv = norm > 1e-30 ? static_cast<float>(1.0 / norm) : 0.f;
    for (int64_t k = 0; k < m; ++k) P[k * r + i] *= inv;
    for (int64_t j = i + 1; j < r; ++j) {
      double dot = 0.0;
      for (int64_t k = 0; k < m; ++k) dot += static_cast<double>(P[k * r + i]) * P[k * r + j];
      const float d = static_cast<float>(dot);
      for (int64_t k = 0; k < m; ++k) P[k * r + j] -= d * P[k * r + i];
    }
  }
}

void topkByMagnitude(const Tensor& x, int64_t k, Tensor& idx, Tensor& val, int64_t indexBase) {
  checkF32(x, "topkByMagnitude");
  const int64_t n = x.numel();
  MT_CHECK(k > 0 && k <= n, "top-k of ", k, " from ", n, " elements");
  MT_CHECK(n + indexBase <= INT32_MAX, "top-k over ", n, " elements exceeds 32-bit indices");
  MT_CHECK(idx.dtype() == DType::kI32 && idx.numel() == k && val.dtype() == DType::kF32 && val.numel() == k,
           "top-k outputs ", idx.str(), ", ", val.str());
#ifdef MT_WITH_CUDA
  if (x.device().isCuda()) {
    cuda::topkByMagnitude(x.data<float>(), n, k, idx.data<int32_t>(), val.data<float>(), indexBase);
    return;
  }
#endif
  const float* px = x.data<float>();
  // The k-th largest magnitude, then every element above it and the first ones equal to it.
  std::vector<float> mag(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mag[static_cast<size_t>(i)] = std::fabs(px[i]);
  std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
  const float kth = mag[static_cast<size_t>(k - 1)];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += std::fabs(px[i]) > kth;
  int64_t equalNeeded = k - above;
  int32_t* pi = idx.data<int32_t>();
  float* pv = val.data<float>();
  int64_t j = 0;
  for (int64_t i = 0; i < n && j < k; ++i) {
    const float a = std::fabs(px[i]);
    if (a > kth || (a == kth && equalNeeded-- > 0)) {
      pi[j] = static_cast<int32_t>(i + indexBase);
      pv[j] = px[i];
      ++j;
    }
  }
  MT_CHECK(j == k, "top-k selected ", j, " of ", k, " (NaN gradients?)");
}

void scatterAdd(Tensor& y, const Tensor& idx, const Tensor& val, float scale) {
  checkF32(y, "scatterAdd");
  const int64_t k = idx.numel();
#ifdef MT_WITH_CUDA
  if (y.device().isCuda()) {
    cuda::scatterAdd(y.data<float>(), idx.data<int32_t>(), val.data<float>(), k, scale);
    return;
  }
#endif
  float* py = y.data<float>();
  const int32_t* pi = idx.data<int32_t>();
  const float* pv = val.data<float>();
  const int64_t n = y.numel();
  for (int64_t j = 0; j < k; ++j) {
    MT_CHECK(pi[j] >= 0 && pi[j] < n, "scatter index ", pi[j], " outside ", n);
    py[pi[j]] += scale * pv[j];
  }
}

void scatterZero(Tensor& y, const Tensor& idx) {
  checkF32(y, "scatterZero");
  const int64_t k = idx.numel();
#ifdef MT_WITH_CUDA
  if (y.device().isCuda()) {
    cuda::scatterZero(y.data<float>(), idx.data<int32_t>(), k);
    return;
  }
#endif
  float* py = y.data<float>();
  const int32_t* pi = idx.data<int32_t>();
  for (int64_t j = 0; j < k; ++j) py[pi[j]] = 0.f;
}

}  // namespace mt
