#pragma once
// The hand-over between the training thread and ZeRO-Offload's CPU worker (sharding/
// ShardedOffload.cpp): one optimizer job at a time, its progress unit by unit, and its error. All of
// it under one mutex, every wait on one condition variable.
//
//   kIdle --submit--> kQueued --take--> kRunning --finish--> kIdle
//   kIdle | kQueued --stop--> kStopped      (a queued job nobody started is dropped)
//   kRunning --stop--> kStopping --finish--> kStopped
//
// The training thread submits, waits for the whole job (settle) or for one unit of it (awaitUnit)
// and stops; the worker takes, reports units done and finishes. A job's error is rethrown on the
// training thread by the next settle or awaitUnit. An edge taken from a state it does not leave
// throws InternalError naming the state and the edge.

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <initializer_list>
#include <mutex>

#include "core/EnumTable.h"

namespace mt {

struct OffloadJob {
  float lr = 0.f;
  bool upload = true;  // the worker uploads each unit's parameters behind its update (not with DPU)
  float gradScale = 1.f;  // the gradient clip's factor, applied by the update's own pass
};

class OffloadQueue {
 public:
  enum class State { kIdle, kQueued, kRunning, kStopping, kStopped };
  static const EnumTable<State>& states();

  // Training thread.
  void submit(const OffloadJob& job);  // kIdle -> kQueued
  // Waits until no job is queued or running; rethrows the last job's error (once).
  void settle();
  // Waits until the current job (if any, and if it uploads) has done units 0..unit; rethrows its
  // error.
  void awaitUnit(size_t unit);
  // No new job runs after this; a running one ends first (its results are not waited for).
  void stop() noexcept;

  // Worker thread: waits for a queued job (kQueued -> kRunning) and returns true with it, or false
  // once stopped.
  bool take(OffloadJob* job);
  void unitsDone(size_t n);               // units 0..n-1 of the running job are done
  void finish(std::exception_ptr error);  // kRunning -> kIdle, kStopping -> kStopped

  State state() const;

 private:
  void edge(State to, const char* name, std::initializer_list<State> from);  // under mutex_
  void rethrowLocked(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  State state_ = State::kIdle;
  OffloadJob job_;
  size_t unitsDone_ = 0;
  std::exception_ptr error_;
};

}  // namespace mt
