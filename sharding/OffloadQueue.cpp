#include "sharding/OffloadQueue.h"

#include <algorithm>

#include "core/Check.h"

namespace mt {

const EnumTable<OffloadQueue::State>& OffloadQueue::states() {
  static const EnumTable<State> kTable = {{State::kIdle, "idle"},
                                          {State::kQueued, "queued"},
                                          {State::kRunning, "running"},
                                          {State::kStopping, "stopping"},
                                          {State::kStopped, "stopped"}};
  return kTable;
}

void OffloadQueue::edge(State to, const char* name, std::initializer_list<State> from) {
  MT_CHECK(std::find(from.begin(), from.end(), state_) != from.end(), "offload worker: illegal edge ", name,
           " from state ", enumName(states(), state_));
  state_ = to;
}

void OffloadQueue::rethrowLocked(std::unique_lock<std::mutex>& lock) {
  if (!error_) return;
  std::exception_ptr e = error_;
  error_ = nullptr;
  lock.unlock();
  std::rethrow_exception(e);  // the CPU step's error, on the training thread
}

void OffloadQueue::submit(const OffloadJob& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    edge(State::kQueued, "submit", {State::kIdle});
    job_ = job;
    unitsDone_ = 0;
  }
  cv_.notify_all();
}

void OffloadQueue::settle() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return state_ == State::kIdle || state_ == State::kStopped; });
  rethrowLocked(lock);
}

void OffloadQueue::awaitUnit(size_t unit) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] {
    if (error_ || !job_.upload) return true;
    return state_ == State::kIdle || state_ == State::kStopped ||
           (state_ != State::kQueued && unitsDone_ > unit);
  });
  if (error_) {
    // The job's error surfaces once the job is over (settle's contract: nothing runs after it).
    cv_.wait(lock, [&] { return state_ == State::kIdle || state_ == State::kStopped; });
    rethrowLocked(lock);
  }
}

void OffloadQueue::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::kIdle || state_ == State::kQueued)
      state_ = State::kStopped;
    else if (state_ == State::kRunning)
      state_ = State::kStopping;
  }
  cv_.notify_all();
}

bool OffloadQueue::take(OffloadJob* job) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return state_ == State::kQueued || state_ == State::kStopped; });
  if (state_ == State::kStopped) return false;
  edge(State::kRunning, "take", {State::kQueued});
  *job = job_;
  return true;
}

void OffloadQueue::unitsDone(size_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unitsDone_ = n;
  }
  cv_.notify_all();
}

void OffloadQueue::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    edge(state_ == State::kStopping ? State::kStopped : State::kIdle, "finish",
         {State::kRunning, State::kStopping});
    unitsDone_ = static_cast<size_t>(-1);
    if (error && !error_) error_ = error;
  }
  cv_.notify_all();
}

OffloadQueue::State OffloadQueue::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

}  // namespace mt
