#pragma once
// NCCL backend, bootstrapped over MPI: rank 0's ncclUniqueId is sent with MPI_Bcast, and the
// communicator is created non-blocking (ncclCommInitRankConfig with blocking = 0) and polled, so a
// rank that never arrives ends in a TimeoutError instead of a hang.
//
// Every op runs on the communicator's own stream, ordered after the caller's current stream by an
// event (never a host sync), inside ncclGroupStart/End. wait() orders the caller's current stream
// after the op and returns at once; a watchdog thread completes Works as their events fire and
// polls ncclCommGetAsyncError: on an NCCL error, or an op older than the timeout, it aborts the
// communicator (ncclCommAbort, so no kernel spins forever), fails the outstanding Works and calls
// CommOptions' fatal handler (launch/ ends the job). Buffers handed to an op are recorded on the
// comm stream with the caching allocator, so freeing them early is safe.
//
// Host buffers are accepted for small metadata (loss statistics): staged through device memory
// and completed synchronously.

#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/Communicator.h"
#include "core/cuda/CudaStream.h"

namespace mt {

class NcclCommunicator final : public Communicator {
 public:
  using FatalHandler = std::function<void(const std::string&)>;
  // Collective over `bootstrap`. The CudaRuntime of `device` must exist.
  NcclCommunicator(MPI_Comm bootstrap, CommOptions options, FatalHandler onFatal = nullptr);
  ~NcclCommunicator() override;

  using Communicator::allGather;
  using Communicator::allReduce;
  using Communicator::broadcast;
  using Communicator::reduceScatter;
  using Communicator::split;
  const char* backend() const override { return "nccl"; }
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

  cudaStream_t stream() const { return stream_.get(); }
  ncclComm_t nccl() const { return comm_; }

 private:
  NcclCommunicator(ncclComm_t comm, CommOptions options, FatalHandler onFatal,
                   std::shared_ptr<const std::string> ncclName);
  struct Pending;
  // Runs `issue` (NCCL calls) on the comm stream after the current stream's work.
  std::shared_ptr<Work> run(CollectiveOp op, size_t bytes, DType dtype, const std::vector<const void*>& buffers,
                            const std::function<void(cudaStream_t)>& issue);
  std::shared_ptr<Work> runHost(CollectiveOp op, size_t inBytes, size_t outBytes, DType dtype, const void* in, void* out,
                                const std::function<void(const void*, void*, cudaStream_t)>& issue);
  // The collective of a one-rank communicator: a device copy on `s` (NCCL 2.28's one-rank
  // reduction loses elements, see the .cpp).
  void oneRankCopy(const void* in, void* out, size_t bytes, cudaStream_t s);
  std::shared_ptr<Work> issueAfter(const std::shared_ptr<Work>& dep,
                                   const std::function<std::shared_ptr<Work>()>& issue) override;
  void waitForCompletionOfInit(const char* what);
  void watchdogLoop();
  void fail(const std::string& reason, bool timeout);

  ncclComm_t comm_ = nullptr;
  // ncclConfig_t::commName: NCCL keeps the pointer for the communicator's life.
  std::shared_ptr<const std::string> ncclName_;
  int rank_ = 0, size_ = 1;
  CudaStream stream_;
  FatalHandler onFatal_;
  std::mutex mutex_;
  std::deque<std::shared_ptr<Pending>> inflight_;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

ncclDataType_t ncclType(DType t);
ncclConfig_t ncclConfigOf(const CommOptions& options, const char* commName);

}  // namespace mt
