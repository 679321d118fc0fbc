#pragma once
// MPI backend. One progress thread per communicator runs the ops in issue order: collectives as
// blocking MPI calls (Open MPI's tuned algorithms, which its non-blocking libnbc versions do not
// match for large buffers), point-to-point as MPI_Isend/Irecv polled between ops so a send and a
// recv queued in opposite orders on two ranks cannot deadlock. The caller's thread never blocks in
// MPI, so backward keeps computing while buckets are reduced, and a Work can time out.
//
// bf16/f16 are reduced by user-defined MPI ops (f32 arithmetic per element). kAvg is a sum
// followed by a division by size() in the progress thread. Device buffers are staged through
// host memory (CUDA builds).

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/Communicator.h"

namespace mt {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm`, so this communicator's traffic never matches anyone else's.
  MpiCommunicator(MPI_Comm comm, CommOptions options);
  ~MpiCommunicator() override;

  // The Tensor conveniences of the base class stay visible next to the overrides.
  using Communicator::allGather;
  using Communicator::allReduce;
  using Communicator::broadcast;
  using Communicator::reduceScatter;
  using Communicator::split;
  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::shared_ptr<Work> allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Device device) override;
  std::shared_ptr<Work> reduceScatter(const void* in, void* out, size_t countPerRank, DType dtype, ReduceOp op,
                                      Device device) override;
  std::shared_ptr<Work> allGather(const void* in, void* out, size_t countPerRank, DType dtype,
                                  Device device) override;
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Device device) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const void* buf, size_t count, DType dtype, int peer, Device device) override;
  std::shared_ptr<Work> recv(void* buf, size_t count, DType dtype, int peer, Device device) override;
  std::unique_ptr<Communicator> split(int color, int key, CommOptions options) override;
  void abort(const std::string& reason) override;

  MPI_Comm mpiComm() const { return comm_; }

 private:
  struct Descriptor {  // what the fingerprint check compares across ranks
    int64_t op, count, dtype, extra;
  };
  struct Task {
    std::shared_ptr<Work> work;
    Descriptor desc;
    bool p2p = false;
    std::function<void(Task&)> run;        // collectives: blocking; p2p: posts and sets `request`
    MPI_Request request = MPI_REQUEST_NULL;
    std::function<void()> finish;          // after completion (avg division, unstaging)
    std::shared_ptr<void> deviceReady;     // CUDA event on the caller's stream (device buffers)
    std::shared_ptr<Work> after;           // chained op: the progress thread waits for it first
  };
  std::shared_ptr<Work> issueAfter(const std::shared_ptr<Work>& dep,
                                   const std::function<std::shared_ptr<Work>()>& issue) override;

  std::shared_ptr<Work> enqueue(CollectiveOp op, size_t bytes, DType dtype, Descriptor desc,
                                std::function<void(Task&)> run, std::function<void()> finish = nullptr,
                                bool p2p = false, Device device = Device::cpu());
  void progressLoop();
  bool pollPointToPoint();
  void checkFingerprint(const Descriptor& d, int64_t seq);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm fingerprintComm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Task>> queue_;
  std::deque<std::unique_ptr<Task>> pending_;  // posted p2p, progress thread only
  bool stop_ = false;
  std::string abortReason_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> exited_{false};
  std::thread thread_;
};

MPI_Datatype mpiType(DType t);

}  // namespace mt
