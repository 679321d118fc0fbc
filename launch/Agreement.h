#pragma once
// Agreeing on an error across ranks: every rank runs its part of a collective step, then all learn
// whether any rank failed and, if one did, all fail the same way — the lowest failing rank's
// message and exit code — instead of the failing rank leaving while the others wait for it in the
// next collective. Every wait is bounded by the timeout the caller gives (checkpoint I/O is not a
// training step: launch/Checkpoint passes checkpoint.timeout_s).

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "comm/Communicator.h"
#include "core/Error.h"

namespace mt {

struct AgreedFailure {
  int rank = 0;  // the lowest rank that failed
  ExitCode code = ExitCode::kFailure;
  std::string message;
};

// Runs `body` on this rank alone: its failure as an AgreedFailure of rank `rank` (an mt::Error keeps
// its exit code, any other exception is internal), nullopt when it succeeded. Both agreements
// (this one over a Communicator, launch/SetupAgreement's over raw MPI before any exists) use it.
std::optional<AgreedFailure> captureFailure(int rank, const std::function<void()>& body);

// Runs `body` (an mt::Error keeps its exit code, any other exception is internal) and agrees:
// nullopt when every rank succeeded, else the same failure on every rank. `onFailure` then runs on
// every rank before the failure's message is exchanged (rank 0 removing a half-written checkpoint
// before any rank can leave and end the job).
std::optional<AgreedFailure> agreeOnFailure(Communicator& comm, std::chrono::milliseconds timeout,
                                            const std::function<void()>& body,
                                            const std::function<void()>& onFailure = nullptr);

// The same, throwing the agreed failure on every rank as an mt::Error with its exit code; with a
// non-empty `what` the message reads "<what> failed on rank N: <message>".
void agreeOrThrow(Communicator& comm, std::chrono::milliseconds timeout, const std::string& what,
                  const std::function<void()>& body, const std::function<void()>& onFailure = nullptr);

// `text` of rank `root` on every rank (any length).
std::string broadcastString(Communicator& comm, std::chrono::milliseconds timeout, const std::string& text,
                            int root);

}  // namespace mt
