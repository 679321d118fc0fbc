// gtest main for GPU tests: exits 77 (ctest SKIP_RETURN_CODE: reported as skipped) when no CUDA
// device is visible; otherwise creates the process's CudaRuntime on device 0 for all tests.

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "comm/MpiEnvironment.h"
#include "core/cuda/CudaMemory.h"
#include "core/cuda/CudaRuntime.h"

int main(int argc, char** argv) {
  mt::MpiEnvironment mpi(&argc, &argv);  // NCCL tests bootstrap over MPI (a singleton world here)
  ::testing::InitGoogleTest(&argc, argv);
  if (mt::cudaDeviceCountOrZero() == 0) {
    std::printf("no CUDA device visible: GPU tests skipped\n");
    return 77;
  }
  auto runtime = std::make_unique<mt::CudaRuntime>(mpi.localRank() % mt::cudaDeviceCountOrZero());
  std::printf("GPU tests on %s (%d SMs)\n", runtime->deviceName().c_str(), runtime->smCount());
  int rc = RUN_ALL_TESTS();
  runtime->synchronize();
  return rc;
}
