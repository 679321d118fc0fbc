#include "launch/RunGuard.h"

#include "comm/MpiCheck.h"
#include "comm/MpiEnvironment.h"
#include "core/Check.h"

namespace mt {

RunGuard::RunGuard(MPI_Comm world, int64_t divergenceSteps) : limit_(divergenceSteps) {
  MT_CHECK(divergenceSteps >= 1, "train.divergence_steps must be at least 1, got ", divergenceSteps);
  if (world == MPI_COMM_NULL) return;
  MpiCallGuard g;
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
}

RunGuard::~RunGuard() {
  if (comm_ == MPI_COMM_NULL) return;
  MpiCallGuard g;
  if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  MPI_Comm_free(&comm_);
}

void RunGuard::submit(int64_t step, bool lossNonFinite, bool recordsFailed) {
  const int flags = (lossNonFinite ? kLossNonFinite : 0) | (recordsFailed ? kRecordsFailed : 0);
  if (comm_ == MPI_COMM_NULL) {
    apply(step, flags);
    return;
  }
  flush();
  MpiCallGuard g;
  send_ = flags;
  inFlightStep_ = step;
  MPI_CHECK(MPI_Iallreduce(&send_, &recv_, 1, MPI_INT, MPI_BOR, comm_, &req_));
}

void RunGuard::flush() {
  if (req_ == MPI_REQUEST_NULL) return;
  {
    MpiCallGuard g;
    MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
  }
  apply(inFlightStep_, recv_);
}

void RunGuard::apply(int64_t step, int flags) {
  MT_CHECK(step > agreedStep_, "run guard: step ", step, " submitted after step ", agreedStep_);
  agreedStep_ = step;
  if (flags & kRecordsFailed) recordsFailed_ = true;
  if (!(flags & kLossNonFinite)) {
    streak_ = 0;
    streakStart_ = -1;
    return;
  }
  if (streak_++ == 0) streakStart_ = step;
}

}  // namespace mt
