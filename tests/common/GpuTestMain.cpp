// gtest main for GPU tests: exits 77 (ctest SKIP_RETURN_CODE: reported as skipped) when no CUDA
// device is visible; otherwise creates the process's CudaRuntime on device 0 for all tests.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "comm/MpiEnvironment.h"
#include "core/EnvParams.h"
#include "core/cuda/CudaMemory.h"
#include "core/cuda/CudaRuntime.h"

int main(int argc, char** argv) {
  mt::MpiEnvironment mpi(&argc, &argv);  // NCCL tests bootstrap over MPI (a singleton world here)
  // Several ranks on one GPU (the multi-rank NCCL suite on a one-GPU machine): each its own NCCL
  // host identity over sockets, as the trainer does under MT_NCCL_SHARE_GPU_FOR_TESTS.
  if (mt::envInt(mt::EnvParam::kNcclShareGpu) != 0) {
    setenv("NCCL_HOSTID", (mpi.hostname() + "-mt-rank" + std::to_string(mpi.rank())).c_str(), 1);
    setenv("NCCL_IB_DISABLE", "1", 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (mt::cudaDeviceCountOrZero() == 0) {
    std::printf("no CUDA device visible: GPU tests skipped\n");
    return 77;
  }
  auto runtime = std::make_unique<mt::CudaRuntime>(mpi.machineLocalRank() % mt::cudaDeviceCountOrZero());
  std::printf("GPU tests on %s (%d SMs)\n", runtime->deviceName().c_str(), runtime->smCount());
  int rc = RUN_ALL_TESTS();
  runtime->synchronize();
  return rc;
}
