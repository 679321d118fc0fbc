#pragma once
// Faults the collective contract forbids, made on purpose so tests can show that they end a job
// instead of hanging it (testing only; never set in production):
//   MT_TEST_FAULT=<action>:<rank>:<communicator>:<op>
// makes rank <rank> of communicator <communicator> (its name: world, world.intra, ...) do <action>
// to its op number <op> (the op's sequence number, as failure messages and traces print it):
//   skip    issue nothing and report the op complete (a rank that skipped one collective);
//   resize  issue it with half the count (a rank that issued a different size).
// Backends ask faultFor(seq) as they issue each op: the NCCL backend honours both actions, the MPI
// backend `skip` (its staged ops fix their count when issued).

#include <cstdint>
#include <string>

namespace mt {

enum class InjectedFault : uint8_t { kNone, kSkip, kResize };

struct FaultPlan {
  InjectedFault action = InjectedFault::kNone;
  int rank = -1;
  std::string comm;
  int64_t op = -1;
  // MT_TEST_FAULT, parsed; throws ConfigError naming the variable when malformed.
  static FaultPlan fromEnvironment();
  static FaultPlan parse(const std::string& spec);
  InjectedFault at(const std::string& commName, int rank, int64_t seq) const {
    return action != InjectedFault::kNone && rank == this->rank && seq == op && commName == comm
               ? action
               : InjectedFault::kNone;
  }
};

}  // namespace mt
