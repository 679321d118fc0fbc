// Where a rank sits under MT_NODE_SPLIT=2 on one machine (registered with that environment): its
// emulated node is a block of 2 ranks, but its place on the machine, which chooses its GPU, is its
// place among all the machine's ranks (ranks 0 and 2 were both local rank 0 and took GPU 0).

#include <gtest/gtest.h>

#include "comm/MpiEnvironment.h"

namespace mt {
namespace {

TEST(MpiEnvironment, EmulatedNodesKeepTheMachinesPlace) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The test main's environment is not reachable; a second one reads the same MPI state.
  MpiEnvironment mpi(nullptr, nullptr);
  ASSERT_EQ(mpi.emulatedNodeSize(), 2) << "run with MT_NODE_SPLIT=2";
  EXPECT_EQ(mpi.localRank(), rank % 2);
  EXPECT_EQ(mpi.localSize(), 2);
  EXPECT_EQ(mpi.nodeIndex(), rank / 2);
  EXPECT_EQ(mpi.numNodes(), size / 2);
  // One machine (the test runs under one mpiexec on this host).
  EXPECT_EQ(mpi.machineLocalRank(), rank);
  EXPECT_EQ(mpi.machineLocalSize(), size);
  EXPECT_EQ(mpi.machineIndex(), 0);
}

}  // namespace
}  // namespace mt
