#include "launch/SetupAgreement.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "comm/MpiEnvironment.h"
#include "core/Error.h"
#include "core/Log.h"
#include "launch/Agreement.h"

namespace mt {

namespace {

constexpr int kMessageBytes = 2048;

// The lowest rank whose `failed` is set (size when none): MPI_MINLOC would need a pair type.
int firstFailingRank(MPI_Comm comm, bool failed, int rank, int size) {
  int mine = failed ? rank : size, first = size;
  MpiCallGuard g;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  return first;
}

}  // namespace

void agreeOnStep(MPI_Comm comm, const std::function<void()>& step) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::optional<AgreedFailure> mine = captureFailure(rank, step);
  const int first = size > 1 ? firstFailingRank(comm, mine.has_value(), rank, size) : (mine ? rank : size);
  if (first == size) return;
  int code = mine ? static_cast<int>(mine->code) : 0;
  std::string message = mine ? mine->message : std::string();
  if (size > 1) {
    // The failing rank's exit code in the first 4 bytes, its message after them.
    char buf[kMessageBytes] = {0};
    if (rank == first) {
      std::memcpy(buf, &code, sizeof(code));
      std::memcpy(buf + sizeof(code), message.data(),
                  std::min<size_t>(message.size(), kMessageBytes - sizeof(code) - 1));
    }
    MpiCallGuard g;
    MPI_Bcast(buf, kMessageBytes, MPI_CHAR, first, comm);
    std::memcpy(&code, buf, sizeof(code));
    message = buf + sizeof(code);
  }
  throw Error(rank == first ? mine->message : message, static_cast<ExitCode>(code));
}

int agreeOnSetup(int code, const std::string& message, int rank, int size, double patienceS) {
  if (size == 1) {
    if (code) writeLine(message);
    return code;
  }
  int worst = 0;
  {
    MPI_Request req = MPI_REQUEST_NULL;
    {
      MpiCallGuard g;
      MPI_Iallreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(patienceS);
    for (int done = 0; !done;) {
      {
        MpiCallGuard g;
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      }
      if (done) break;
      if (code && std::chrono::steady_clock::now() > deadline) {
        writeLine("[r" + std::to_string(rank) + "] " + message);
        writeLine("[r" + std::to_string(rank) +
                  "] error: the other ranks did not reach the end of setup within " +
                  std::to_string(static_cast<int>(patienceS)) + " s; ending the job with exit code " +
                  std::to_string(code));
        MPI_Abort(MPI_COMM_WORLD, code);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(code ? 5 : 20));
    }
  }
  if (!worst) return 0;
  char rootMsg[1024] = {0};
  if (rank == 0) std::snprintf(rootMsg, sizeof(rootMsg), "%s", message.c_str());
  {
    MpiCallGuard g;
    MPI_Bcast(rootMsg, sizeof(rootMsg), MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  if (code && (rank == 0 || message != rootMsg)) writeLine("[r" + std::to_string(rank) + "] " + message);
  if (!code && rank == 0) writeLine("[r0] error: another rank failed during setup (see its message above)");
  return worst;
}

}  // namespace mt
