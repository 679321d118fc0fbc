#pragma once
// Setup ends the same way on every rank. A setup step that one rank alone can fail (rank 0 taking
// and writing the run directory, a file only one node sees) is agreed on before the next
// collective: otherwise the failing rank waits in main's agreement while the others wait in that
// collective (the StopAgreement's MPI_Comm_dup, a communicator's first operation), forever.
// Both functions talk over raw MPI, so they work before any communicator exists.

#include <mpi.h>

#include <functional>
#include <string>

namespace mt {

// Runs `step` on this rank, then every rank learns whether it failed anywhere. When it did, every
// rank throws an Error with the exit code and message of the lowest failing rank (that rank its
// own exception). Collective over `comm`.
void agreeOnStep(MPI_Comm comm, const std::function<void()>& step);

// The end of setup in main: every rank's outcome (0, or an exit code and its message) is agreed
// on over MPI_COMM_WORLD and the worst code returned; the message is printed once when identical.
// A failing rank waits at most `patienceS` for the others: a rank still in a collective the failing
// one will never reach would wait forever, so the failing rank then prints its message and ends
// the job with its exit code (MPI_Abort) — the backstop for a failure no agreeOnStep guards.
int agreeOnSetup(int code, const std::string& message, int rank, int size, double patienceS = 30.0);

}  // namespace mt
