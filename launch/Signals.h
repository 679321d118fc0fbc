#pragma once
// Preemption: SIGTERM, SIGUSR1 (Slurm's --signal) and SIGINT set a flag; the training loop asks
// every step whether ANY rank got one (a non-blocking MPI all-reduce started one step and finished
// the next, so the loop never stalls on it) and then all ranks write the checkpoint and leave
// together. A second SIGINT ends the process at once.

#include <mpi.h>

namespace mt {

void installStopSignals();
bool stopSignalled();  // this process
int stopSignalNumber();
int stopSignalCount();  // stop signals received so far: a wait after the stop ends on the next one

class StopAgreement {
 public:
  explicit StopAgreement(MPI_Comm world);
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;
  // Call once per step (and per evaluation forward): true when some rank was signalled (the same
  // answer on every rank, one call after the signal arrived), and from then on.
  bool poll();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request req_ = MPI_REQUEST_NULL;
  int send_ = 0, recv_ = 0;
  bool agreed_ = false;
};

}  // namespace mt
