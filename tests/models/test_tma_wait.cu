// Tma.cuh's bounded mbarrier wait (sm_90a): a phase that completes lets the wait return; one that
// never completes makes the kernel trap, so the launch fails with an error where it used to spin
// on the GPU for ever. The trap corrupts the CUDA context, so those cases run as gtest death tests
// (a child process each). TMA_WAIT_FULL_BOUND=1 also times the production bound (kWaitTries).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/cuda/CudaCheck.h"
#include "models/kernels/FlashCommon.cuh"
#include "models/kernels/Tma.cuh"

namespace mt::cuda {
namespace {

// One thread: a barrier expecting one arrival, arrived on or not, then a wait on its first phase.
template <uint32_t kTries>
__global__ void waitKernel(int arrive, int* done) {
#if MT_WGMMA
  __shared__ uint64_t bar;
  tma::barrierInit(&bar, 1);
  tma::fenceBarrierInit();
  if (arrive) tma::arrive(&bar);
  tma::wait<kTries>(&bar, 0);
  *done = 1;
#endif
}

// Launches a wait that never completes; exits 0 when the launch failed (what the bound promises),
// 1 when it returned success, printing the error and the time it took.
template <uint32_t kTries>
[[noreturn]] void waitForever() {
  int* done = nullptr;
  if (cudaMalloc(&done, sizeof(int)) != cudaSuccess) std::_Exit(3);
  const auto t0 = std::chrono::steady_clock::now();
  waitKernel<kTries><<<1, 1>>>(0, done);
  const cudaError_t e = cudaDeviceSynchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wait of %u tries ended after %.2f s: %s\n", kTries, s, cudaGetErrorString(e));
  std::_Exit(e == cudaSuccess ? 1 : 0);
}

class TmaWait : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!flash::sm90KernelsUsable()) GTEST_SKIP() << "needs sm_90a code on a compute capability 9.0 device";
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-executes: a fresh CUDA context
  }
};

TEST_F(TmaWait, CompletedPhaseReturns) {
  int* done = nullptr;
  CUDA_CHECK(cudaMalloc(&done, sizeof(int)));
  CUDA_CHECK(cudaMemset(done, 0, sizeof(int)));
  waitKernel<tma::kWaitTries><<<1, 1>>>(1, done);
  CUDA_CHECK(cudaGetLastError());
  int h = 0;
  CUDA_CHECK(cudaMemcpy(&h, done, sizeof(int), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(done));
  EXPECT_EQ(h, 1);
}

TEST_F(TmaWait, PhaseThatNeverCompletesFailsTheLaunch) {
  EXPECT_EXIT(waitForever<1u << 12>(), ::testing::ExitedWithCode(0), "wait of 4096 tries ended");
}

TEST_F(TmaWait, ProductionBoundEnds) {
  if (std::getenv("TMA_WAIT_FULL_BOUND") == nullptr) GTEST_SKIP() << "TMA_WAIT_FULL_BOUND=1 times kWaitTries";
  EXPECT_EXIT(waitForever<tma::kWaitTries>(), ::testing::ExitedWithCode(0), "ended after");
}

}  // namespace
}  // namespace mt::cuda
