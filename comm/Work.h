#pragma once
// An asynchronous collective (c10d's Work). Every op a communicator issues gets the next sequence
// number of that communicator; a wait that times out names the op, so a hang shows which
// collective, how large, and how far each rank got.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

#include <vector>

#include "core/DType.h"
#include "core/Tensor.h"

namespace mt {

enum class CollectiveOp : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kSend, kRecv, kSplit };
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

const char* collectiveName(CollectiveOp op);
const char* reduceOpName(ReduceOp op);

struct CollectiveRecord {
  int64_t seq = -1;
  CollectiveOp op = CollectiveOp::kBarrier;
  size_t bytes = 0;
  DType dtype = DType::kF32;
  int64_t enqueuedUs = 0, startedUs = 0, completedUs = 0;  // wall-clock micros; 0 = not yet
  std::string str() const;
};

class Work {
 public:
  Work(int64_t seq, CollectiveOp op, size_t bytes, DType dtype, std::string commName);
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  bool isCompleted();
  // Blocks until done. Throws TimeoutError naming the op when `timeout` passes first, or the
  // error the op failed with (a lost peer, an MPI/NCCL error). Device-stream backends (NCCL)
  // override it to order the caller's current stream after the op instead (see Communicator.h).
  virtual void wait(std::chrono::milliseconds timeout);
  // Called by the backend.
  void markStarted();
  void markCompleted();
  void markFailed(std::exception_ptr error);
  // The error it failed with, if it failed (null otherwise).
  std::exception_ptr error();
  CollectiveRecord record();
  int64_t seq() const { return seq_; }
  CollectiveOp op() const { return op_; }
  size_t bytes() const { return bytes_; }
  const std::string& commName() const { return comm_; }
  // The message a timeout of this op reports.
  std::string timeoutMessage(std::chrono::milliseconds timeout);
  // Keeps a buffer the op reads or writes alive for as long as the backend holds the op, so a
  // caller that gives up (a timeout unwinding its stack) never frees memory MPI still writes.
  void retain(const Tensor& t);

 protected:
  // Host wait for completion (the base behaviour of wait()).
  void waitHost(std::chrono::milliseconds timeout);

 private:
  const int64_t seq_;
  const CollectiveOp op_;
  const size_t bytes_;
  const DType dtype_;
  const std::string comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  int64_t enqueuedUs_ = 0, startedUs_ = 0, completedUs_ = 0;
  std::vector<Tensor> retained_;
};

}  // namespace mt
