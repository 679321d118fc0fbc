// cuBLASLt GEMM plans (core/cuda/Gemm.cu) with MT_GEMM_AUTOTUNE=1: the timed runs of each candidate
// algorithm must leave the call's result as one run makes it: an accumulating GEMM (beta = 1) adds
// its product once, not once per timed run, and a plain one writes the product.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/Tensor.h"
#include "core/cuda/CudaGemm.h"
#include "core/cuda/CudaRuntime.h"

namespace mt {
namespace {

// C [M,N] (f32) = A [M,K] . B [N,K]^T + beta * C0 on the GPU, A and B f32 with small integers (exact
// in every accumulation order), against the host.
void checkGemm(int64_t M, int64_t N, int64_t K, float beta) {
  std::vector<float> a(M * K), b(N * K), c0(M * N);
  for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<float>((i * 7) % 5) - 2.f;
  for (int64_t i = 0; i < N * K; ++i) b[i] = static_cast<float>((i * 3) % 7) - 3.f;
  for (int64_t i = 0; i < M * N; ++i) c0[i] = static_cast<float>(i % 11);
  const Device g = Device::cuda(CudaRuntime::require().device());
  Tensor ta = Tensor::fromBlob(a.data(), {M, K}, DType::kF32).to(g);
  Tensor tb = Tensor::fromBlob(b.data(), {N, K}, DType::kF32).to(g);
  Tensor tc = Tensor::fromBlob(c0.data(), {M, N}, DType::kF32).to(g);
  cuda::GemmCall call;
  call.transB = Trans::kYes;
  call.M = M, call.N = N, call.K = K, call.beta = beta;
  call.A = ta.rawData(), call.B = tb.rawData(), call.C = tc.rawData();
  cuda::gemm(call);
  const Tensor got = tc.to(Device::cpu());
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double want = beta * c0[m * N + n];
      for (int64_t k = 0; k < K; ++k) want += static_cast<double>(a[m * K + k]) * b[n * K + k];
      bad += std::fabs(got.data<float>()[m * N + n] - want) > 1e-3;
    }
  EXPECT_EQ(bad, 0) << M << "x" << N << "x" << K << " beta " << beta;
}

TEST(CudaGemm, AutotunedPlansGiveOneRunsResult) {
  CudaRuntime& rt = CudaRuntime::require();
  (void)rt;
  setenv("MT_GEMM_AUTOTUNE", "1", 1);
  // Shapes no other test of this binary uses, so their plans are made (and tuned) here.
  checkGemm(272, 208, 96, 1.f);
  checkGemm(272, 208, 96, 1.f);  // the tuned plan's second call
  checkGemm(304, 176, 112, 0.f);
  unsetenv("MT_GEMM_AUTOTUNE");
}

}  // namespace
}  // namespace mt
