#include "comm/Work.h"

#include <sstream>

#include "core/Error.h"
#include "core/Timer.h"

namespace mt {

const char* collectiveName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "allreduce";
    case CollectiveOp::kReduceScatter: return "reducescatter";
    case CollectiveOp::kAllGather: return "allgather";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
    case CollectiveOp::kSplit: return "split";
  }
  return "?";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

std::string CollectiveRecord::str() const {
  std::ostringstream os;
  os << "#" << seq << " " << collectiveName(op) << " " << bytes << " bytes " << dtypeName(dtype);
  if (completedUs) os << " done in " << (completedUs - startedUs) << " us";
  else if (startedUs) os << " RUNNING for " << (wallMicros() - startedUs) / 1000 << " ms";
  else os << " QUEUED for " << (wallMicros() - enqueuedUs) / 1000 << " ms";
  return os.str();
}

Work::Work(int64_t seq, CollectiveOp op, size_t bytes, DType dtype, std::string commName)
    : seq_(seq), op_(op), bytes_(bytes), dtype_(dtype), comm_(std::move(commName)), enqueuedUs_(wallMicros()) {}

bool Work::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::string Work::timeoutMessage(std::chrono::milliseconds timeout) {
  bool started;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started = startedUs_ != 0;
  }
  std::ostringstream os;
  os << "collective timeout on communicator '" << comm_ << "': " << collectiveName(op_) << " #" << seq_ << " of "
     << bytes_ << " bytes (" << dtypeName(dtype_) << ") did not complete within "
     << std::chrono::duration<double>(timeout).count() << " s ("
     << (started ? "started, waiting for peers" : "never started: an earlier op is stuck") << ")";
  return os.str();
}

void Work::wait(std::chrono::milliseconds timeout) { waitHost(timeout); }

void Work::waitHost(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    lock.unlock();
    throw TimeoutError(timeoutMessage(timeout));
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::markStarted() {
  std::lock_guard<std::mutex> lock(mutex_);
  startedUs_ = wallMicros();
}

void Work::markCompleted() {
  std::vector<Tensor> release;  // the backend is done with the buffers (freed outside the lock)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completedUs_ = wallMicros();
    done_ = true;
    release.swap(retained_);
  }
  cv_.notify_all();
}

void Work::retain(const Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) retained_.push_back(t);  // completed ops (kept in the history) hold nothing
}

void Work::markFailed(std::exception_ptr error) {
  std::vector<Tensor> release;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completedUs_ = wallMicros();
    error_ = error;
    done_ = true;
    release.swap(retained_);
  }
  cv_.notify_all();
}

std::exception_ptr Work::error() {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

CollectiveRecord Work::record() {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord r;
  r.seq = seq_;
  r.op = op_;
  r.bytes = bytes_;
  r.dtype = dtype_;
  r.enqueuedUs = enqueuedUs_;
  r.startedUs = startedUs_;
  r.completedUs = completedUs_;
  return r;
}

}  // namespace mt
