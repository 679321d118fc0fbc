#include "launch/Signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "comm/MpiEnvironment.h"
#include "comm/MpiCheck.h"

namespace mt {

namespace {
volatile sig_atomic_t gStop = 0;
volatile sig_atomic_t gSignal = 0;
volatile sig_atomic_t gCount = 0;

void onSignal(int sig) {
  if (sig == SIGINT && gStop) _exit(130);  // second Ctrl-C: now
  gSignal = sig;
  gStop = 1;
  gCount = gCount + 1;  // the only writer (handlers of these signals do not nest: sa_mask)
}
}  // namespace

void installStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGUSR1, SIGINT}) sigaddset(&sa.sa_mask, s);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGTERM, SIGUSR1, SIGINT}) sigaction(s, &sa, nullptr);
}

bool stopSignalled() { return gStop != 0; }
int stopSignalNumber() { return gSignal; }
int stopSignalCount() { return gCount; }

StopAgreement::StopAgreement(MPI_Comm world) {
  MpiCallGuard g;
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
}

StopAgreement::~StopAgreement() {
  MpiCallGuard g;
  if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

bool StopAgreement::poll() {
  if (agreed_) return true;
  MpiCallGuard g;
  bool stop = false;
  if (req_ != MPI_REQUEST_NULL) {
    MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    stop = recv_ != 0;
  }
  if (!stop) {
    send_ = gStop ? 1 : 0;
    MPI_CHECK(MPI_Iallreduce(&send_, &recv_, 1, MPI_INT, MPI_MAX, comm_, &req_));
  }
  agreed_ = stop;
  return stop;
}

}  // namespace mt
