#include "launch/Failure.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "core/Log.h"
#include "launch/RunDirectory.h"
#include "launch/RunMetrics.h"

namespace mt {

void dumpCollectives(Communicator& comm) {
  auto ops = comm.recentOps();
  const size_t kShown = 10;
  if (ops.size() > kShown) ops.erase(ops.begin(), ops.end() - kShown);
  MT_LOG_ERROR << "last " << ops.size() << " ops on communicator '" << comm.name() << "' (" << comm.backend()
               << ", rank " << comm.rank() << "/" << comm.size() << "):";
  for (const auto& r : ops) MT_LOG_ERROR << "  " << r.str();
}

void onPeerLost(Communicator& world, int lostRank, const std::string& why, int peerExitCode) {
  MT_LOG_ERROR << "rank " << lostRank << " lost: " << why << "; ending this rank";
  dumpCollectives(world);
  // Rank 0's Prometheus endpoint shows the cause (a launcher ending the job may cut the wait short).
  finishActiveRunMetrics(exitCauseOf(peerExitCode > 0 ? peerExitCode : static_cast<int>(ExitCode::kCommFailure), false));
  releaseRunDirLockBeforeExit();
  std::fflush(stdout);
  std::fflush(stderr);
  // The peer is gone, so no collective (not even MPI_Abort's) can be trusted to complete. A peer
  // that ended the job itself named its exit code (2 for bad input): every rank exits with it,
  // whichever reaches the launcher first.
  std::_Exit(peerExitCode > 0 ? peerExitCode : static_cast<int>(ExitCode::kCommFailure));
}

void abortJob(const std::string& message, ExitCode code, Communicator* world, HealthMonitor* health) {
  MT_LOG_ERROR << "error: " << message;
  if (world) dumpCollectives(*world);
  // Before the peers learn of the abort (and the launcher ends the job): rank 0's Prometheus
  // endpoint shows the exit cause to a last scrape (bounded by run.metrics_linger_s).
  finishActiveRunMetrics(exitCauseOf(static_cast<int>(code), false));
  if (health) health->announceAbort(static_cast<int>(code));
  releaseRunDirLockBeforeExit();
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized && (!world || world->size() > 1))
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  std::_Exit(static_cast<int>(code));
}

}  // namespace mt
