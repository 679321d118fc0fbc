#pragma once
// NCCL backend, bootstrapped over MPI: rank 0's ncclUniqueId is sent with MPI_Bcast, and the
// communicator is created non-blocking (ncclCommInitRankConfig with blocking = 0) and polled, so a
// rank that never arrives ends in a TimeoutError instead of a hang.
//
// Every op runs on the communicator's own stream, ordered after the caller's current stream by an
// event (never a host sync), inside ncclGroupStart/End. wait() orders the caller's current stream
// after the op and returns at once. Buffers handed to an op are recorded on the comm stream with
// the caching allocator, so freeing them early is safe.
//
// Threads. NCCL lets one thread at a time use a communicator, and in 2.28 ncclCommGetAsyncError is
// not a read: it joins and frees the communicator's finished group job (with a non-blocking
// communicator every collective makes one). So every NCCL call on comm_ (the training thread's
// issue and its poll of a group in progress, the watchdog's error poll, a split, the abort) is made
// under ncclMutex_, and comm_ is read only under it (the abort nulls it). Beyond that the watchdog
// thread, bound to the communicator's GPU, only reads CUDA events: it marks each Work started and
// completed as the events recorded before and after its kernel fire, fails the communicator on an
// NCCL error or an op older than the timeout (ncclCommAbort, so no kernel spins forever; the
// outstanding Works fail; CommOptions' fatal handler ends the job).
//
// Waits. Every wait is bounded by the communicator's timeout: init, the enqueue of a group (NCCL
// connects peers on their first op, so a peer that never issues the matching op keeps it in
// progress), a split, the fingerprint exchange, host-staged ops and the destructor's flush. A wait
// that runs out aborts the communicator and throws TimeoutError naming the op.
//
// dist.fingerprint: before every collective the ranks all-reduce (min) its (op, count, dtype, arg)
// and the negation on the comm stream and compare on the host; a mismatch gathers every rank's
// descriptor and op number and throws CommError naming them (slow: a host round trip per op).
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
#include <vector>

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
  // The raw handle, for tests that call NCCL themselves. Not synchronised with the watchdog: the
  // caller must hold no expectation of thread safety (tests only, between ops).
  ncclComm_t nccl() const { return comm_; }
  int device() const { return device_; }

 private:
  NcclCommunicator(ncclComm_t comm, CommOptions options, FatalHandler onFatal,
                   std::shared_ptr<const std::string> ncclName);
  struct Pending;
  struct SplitSlot;
  // What an op is, for the fingerprint check and the injected faults.
  struct OpDesc {
    CollectiveOp op;
    size_t count;  // elements (per rank for reduce-scatter and all-gather)
    DType dtype;
    int64_t arg;   // reduce op or root; -1 when none
    size_t bytes;  // what the Work reports
    bool p2p = false;
  };
  // Issues the op's NCCL calls (or the one-rank copy) on stream s with `count` elements.
  using Issue = std::function<void(cudaStream_t s, size_t count)>;
  // Runs `issue` on the comm stream after the current stream's work.
  std::shared_ptr<Work> run(const OpDesc& d, const std::vector<const void*>& buffers, const Issue& issue);
  std::shared_ptr<Work> runHost(const OpDesc& d, size_t inBytes, size_t outBytes, const void* in, void* out,
                                const std::function<void(const void*, void*, cudaStream_t, size_t)>& issue);
  // The collective of a one-rank communicator: a device copy on `s` (NCCL 2.28's one-rank
  // reduction loses elements, see the .cpp).
  void oneRankCopy(const void* in, void* out, size_t bytes, cudaStream_t s);
  std::shared_ptr<Work> issueAfter(const std::shared_ptr<Work>& dep,
                                   const std::function<std::shared_ptr<Work>()>& issue) override;

  // NCCL calls `calls` inside ncclGroupStart/End under ncclMutex_; returns ncclGroupEnd's result.
  ncclResult_t issueGroup(const std::function<void()>& calls);
  // Polls comm_'s asynchronous state (under ncclMutex_) until it is not ncclInProgress and returns
  // it; past the timeout, fails the communicator and throws TimeoutError naming `what`.
  ncclResult_t awaitState(const std::string& what);
  // issueGroup, then awaitState, then an NcclError (the communicator failed) if it did not succeed.
  void issueAndSettle(const std::string& what, const std::function<void()>& calls);
  // Waits on the host, bounded, for the work queued on `s` so far.
  void hostWait(cudaStream_t s, const std::string& what);
  void checkFingerprint(const OpDesc& d, size_t count, int64_t seq);
  void waitForCompletionOfInit(const char* what);
  void watchdogLoop();
  bool watchOnce(double limitSeconds);  // true: the communicator failed
  void fail(const std::string& reason, bool timeout);
  [[noreturn]] void failAndThrow(const std::string& reason);
  std::string failure();
  void throwIfFailed();
  void finalizeOrAbort();

  std::mutex ncclMutex_;  // every NCCL call on comm_, and comm_ itself
  ncclComm_t comm_ = nullptr;
  // ncclConfig_t::commName: NCCL keeps the pointer for the communicator's life.
  std::shared_ptr<const std::string> ncclName_;
  int rank_ = 0, size_ = 1, device_ = 0;
  CudaStream stream_;
  FatalHandler onFatal_;
  std::mutex mutex_;  // inflight_, failure_ and the transition of failed_
  std::deque<std::shared_ptr<Pending>> inflight_;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::atomic<bool> stop_{false};
  // Splits in progress write the child's handle here from NCCL's thread: kept for this
  // communicator's life, so a split that times out never has NCCL write into a freed slot.
  std::vector<std::shared_ptr<SplitSlot>> splitSlots_;
  Tensor fingerprint_;  // device scratch of the fingerprint exchange
  std::thread watchdog_;
};

ncclDataType_t ncclType(DType t);
ncclConfig_t ncclConfigOf(const CommOptions& options, const char* commName);

}  // namespace mt
