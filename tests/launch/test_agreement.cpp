// launch/Agreement over MPI: a failure on some ranks becomes the lowest failing rank's failure, with
// its message and exit code, on every rank; no failure is nullopt everywhere.

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/MpiCommunicator.h"
#include "core/Error.h"
#include "launch/Agreement.h"

namespace mt {
namespace {

constexpr std::chrono::milliseconds kTimeout{30000};

TEST(Agreement, LowestFailingRankIsEveryRanksError) {
  MpiCommunicator world(MPI_COMM_WORLD, CommOptions{});
  const int r = world.rank(), W = world.size();
  ASSERT_GE(W, 2);
  EXPECT_FALSE(agreeOnFailure(world, kTimeout, [] {}));
  int cleanups = 0;
  const auto f = agreeOnFailure(
      world, kTimeout,
      [&] {
        if (r == W - 1) throw DataError("bad data on the last rank");
        if (r == 1) throw std::runtime_error("surprise");
      },
      [&] { ++cleanups; });
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(cleanups, 1);
  if (W == 2) {
    EXPECT_EQ(f->code, ExitCode::kBadInput);
    EXPECT_EQ(f->message, "bad data on the last rank");
  } else {
    EXPECT_EQ(f->code, ExitCode::kFailure);
    EXPECT_EQ(f->message, "internal: surprise");
  }
  try {
    agreeOrThrow(world, kTimeout, "saving", [&] {
      if (r == 0) throw CheckpointError(std::string(100000, 'x'));  // longer than any fixed buffer
    });
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.exitCode(), ExitCode::kBadInput);
    EXPECT_EQ(std::string(e.what()), "saving failed on rank 0: " + std::string(100000, 'x'));
  }
  EXPECT_EQ(broadcastString(world, kTimeout, r == 1 ? "from one" : "", 1), "from one");
}

}  // namespace
}  // namespace mt
