// HealthMonitor on 3 ranks: a rank that announces an abort with an exit code is reported to every
// other rank with that code (so bad input ends the job with exit 2 on every rank, whichever rank
// reaches the launcher first), and a clean shutdown reports nothing.

#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/HealthMonitor.h"

namespace mt {
namespace {

struct Seen {
  std::atomic<int> rank{-1}, code{-1};
};

bool waitFor(const Seen& s, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (s.rank.load() < 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return s.rank.load() >= 0;
}

TEST(HealthMonitor, AnnouncedAbortCarriesItsExitCode) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 3);
  Seen seen;
  HealthMonitor monitor(MPI_COMM_WORLD, [&](int lost, const std::string&, int code) {
    seen.code = code;
    seen.rank = lost;
  });
  ASSERT_TRUE(monitor.active());
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 2) {
    monitor.announceAbort(2);
  } else {
    ASSERT_TRUE(waitFor(seen, 20.0)) << "rank " << rank << " was not told of rank 2's abort";
    EXPECT_EQ(seen.rank.load(), 2);
    EXPECT_EQ(seen.code.load(), 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  monitor.shutdown();
  if (rank == 2) EXPECT_EQ(seen.rank.load(), -1) << "the aborting rank reported a peer";
}

TEST(HealthMonitor, CleanShutdownReportsNothing) {
  Seen seen;
  {
    HealthMonitor monitor(MPI_COMM_WORLD, [&](int lost, const std::string&, int code) {
      seen.code = code;
      seen.rank = lost;
    });
    MPI_Barrier(MPI_COMM_WORLD);
    monitor.shutdown();
    MPI_Barrier(MPI_COMM_WORLD);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(seen.rank.load(), -1);
}

}  // namespace
}  // namespace mt
