#pragma once
// What ends a run early besides a stop signal, agreed by every rank without stalling the step:
//  - divergence: the training loss (over the global batch) was not finite for
//    train.divergence_steps consecutive steps;
//  - a failed write of the run's records on some rank (metrics.jsonl on rank 0: a full disk).
// Each step's flags travel in one non-blocking MPI all-reduce (bitwise or) on a duplicate of the
// world communicator, started when the step is submitted and completed at the next submission (as
// StopAgreement does for signals): every rank sees the same agreed steps at the same loop
// iteration, so all stop after the same step, and the step never waits for it.

#include <mpi.h>

#include <cstdint>

namespace mt {

class RunGuard {
 public:
  // world: MPI_COMM_NULL for a job of one process (nothing to agree on). divergenceSteps >= 1.
  RunGuard(MPI_Comm world, int64_t divergenceSteps);
  ~RunGuard();
  RunGuard(const RunGuard&) = delete;
  RunGuard& operator=(const RunGuard&) = delete;

  // Step `step`'s flags on this rank; steps are submitted in order, each once. Collective.
  void submit(int64_t step, bool lossNonFinite, bool recordsFailed);
  // Waits for the agreement in flight: what follows then covers every submitted step. Collective.
  void flush();

  bool diverged() const { return streak_ >= limit_; }
  int64_t limit() const { return limit_; }
  // Consecutive steps, up to the last agreed one, whose loss was not finite on some rank; the
  // first of them (-1: none).
  int64_t streak() const { return streak_; }
  int64_t streakStart() const { return streakStart_; }
  int64_t lastAgreedStep() const { return agreedStep_; }
  bool recordsFailed() const { return recordsFailed_; }

 private:
  enum Flag : int { kLossNonFinite = 1, kRecordsFailed = 2 };
  void apply(int64_t step, int flags);
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request req_ = MPI_REQUEST_NULL;
  int send_ = 0, recv_ = 0;
  int64_t inFlightStep_ = -1;
  int64_t limit_;
  int64_t streak_ = 0, streakStart_ = -1, agreedStep_ = -1;
  bool recordsFailed_ = false;
};

}  // namespace mt
