// gtest main for tests that run under mpiexec: every rank runs every test; only rank 0 prints;
// the process fails on every rank when any rank failed, so mpiexec's exit code is honest.

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/MpiEnvironment.h"

int main(int argc, char** argv) {
  mt::MpiEnvironment mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && !failed && mpi.rank() == 0) std::fprintf(stderr, "a test failed on another rank\n");
  return any;
}
