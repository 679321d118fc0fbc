#pragma once
// How a job ends when something goes wrong. Only launch/ decides this: library code throws.
//  - setup errors (bad config or data): every rank learns the worst exit code through one
//    agreement all-reduce and exits with it (2 for bad input) — the message is printed once;
//  - errors during training (timeout, lost peer, CUDA/NCCL/MPI failure): the rank logs the error
//    and its communicators' last collectives, then aborts the whole job (MPI_Abort);
//  - a lost peer reported by the health monitor: log which rank and why, dump, exit at once.

#include <string>
#include <vector>

#include "comm/Communicator.h"
#include "comm/HealthMonitor.h"
#include "core/Error.h"

namespace mt {

// Logs the last collectives of `comm` (seq, op, bytes, state) at error level.
void dumpCollectives(Communicator& comm);
// Called from the health monitor thread: never returns. peerExitCode: the code the lost rank ended
// the job with when it announced an abort (this rank exits with it too), else 0 (exit 3).
[[noreturn]] void onPeerLost(Communicator& world, int lostRank, const std::string& why, int peerExitCode);
// Logs and ends the job from a training-time error; never returns.
[[noreturn]] void abortJob(const std::string& message, ExitCode code, Communicator* world, HealthMonitor* health);

}  // namespace mt
