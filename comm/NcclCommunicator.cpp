#include "comm/NcclCommunicator.h"

#include <chrono>

#include "core/Log.h"
#include "comm/MpiCheck.h"
#include "core/Timer.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"

namespace mt {

namespace {

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// A Work whose completion is a CUDA event on the comm stream.
class NcclWork final : public Work {
 public:
  NcclWork(int64_t seq, CollectiveOp op, size_t bytes, DType dtype, std::string comm)
      : Work(seq, op, bytes, dtype, std::move(comm)) {}
  void wait(std::chrono::milliseconds timeout) override {
    if (host_) {  // staged host buffers completed synchronously
      waitHost(timeout);
      return;
    }
    if (error_) std::rethrow_exception(error_);
    CUDA_CHECK(cudaStreamWaitEvent(currentStream(), done.get(), 0));
  }
  void setHost() { host_ = true; }
  void setError(std::exception_ptr e) {
    error_ = e;
    markFailed(e);
  }
  CudaEvent done;

 private:
  bool host_ = false;
  std::exception_ptr error_;
};

}  // namespace

// The ncclConfig_t of a communicator with `o`. netName points into `o`, which must outlive the init
// or split call (NCCL copies it); commName must outlive the communicator (NCCL keeps the pointer).
ncclConfig_t ncclConfigOf(const CommOptions& o, const char* commName) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;  // polled, so that a rank that never joins ends in a TimeoutError
  // NCCL's log then names the communicator ("world.inter").
  c.commName = commName;
  const CommTuning& t = o.tuning;
  if (t.cgaClusterSize >= 0) c.cgaClusterSize = t.cgaClusterSize;
  if (t.minCtas >= 0) c.minCTAs = t.minCtas;
  if (t.maxCtas >= 0) c.maxCTAs = t.maxCtas;
  // NCCL 2.28 rejects minCTAs > maxCTAs before it fills in the unset maxCTAs (INT_MIN): give it
  // the most channels there are (it caps the value to its MAXCHANNELS).
  if (t.minCtas >= 0 && t.maxCtas < 0) c.maxCTAs = 64;
  if (!t.netName.empty()) c.netName = t.netName.c_str();
  if (t.splitShare >= 0) c.splitShare = t.splitShare;
  if (t.trafficClass >= 0) c.trafficClass = t.trafficClass;
  return c;
}

struct NcclCommunicator::Pending {
  std::shared_ptr<NcclWork> work;
  double enqueued;
};

ncclDataType_t ncclType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

void NcclCommunicator::waitForCompletionOfInit(const char* what) {
  Stopwatch sw;
  const double limit = std::chrono::duration<double>(timeout()).count();
  ncclResult_t state = ncclInProgress;
  while (true) {
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclInProgress) break;
    if (sw.elapsed() > limit) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw TimeoutError(std::string("NCCL ") + what + " on communicator '" + name() + "' did not finish within " +
                         std::to_string(limit) + " s (a rank never joined?)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (state != ncclSuccess)
    throw NcclError(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(state) + ": " +
                    ncclGetLastError(comm_));
}

NcclCommunicator::NcclCommunicator(MPI_Comm bootstrap, CommOptions options, FatalHandler onFatal)
    : Communicator(std::move(options)), onFatal_(std::move(onFatal)) {
  MPI_CHECK(MPI_Comm_rank(bootstrap, &rank_));
  MPI_CHECK(MPI_Comm_size(bootstrap, &size_));
  ncclUniqueId id;
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap));
  ncclName_ = std::make_shared<const std::string>(name());
  ncclConfig_t config = ncclConfigOf(this->options(), ncclName_->c_str());
  NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
  waitForCompletionOfInit("initialisation");
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, CommOptions options, FatalHandler onFatal,
                                   std::shared_ptr<const std::string> ncclName)
    : Communicator(std::move(options)), comm_(comm), ncclName_(std::move(ncclName)), onFatal_(std::move(onFatal)) {
  NCCL_CHECK(ncclCommCount(comm_, &size_));
  NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

NcclCommunicator::~NcclCommunicator() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  if (comm_) {
    if (failed_) {
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_.get());
      // ncclCommFinalize flushes outstanding work (non-blocking: poll, bounded); destroy frees.
      ncclResult_t r = ncclCommFinalize(comm_);
      ncclResult_t state = r;
      for (int i = 0; i < 200000 && state == ncclInProgress; ++i) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (state == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
  }
}

void NcclCommunicator::fail(const std::string& reason, bool timeout) {
  if (failed_.exchange(true)) return;
  failure_ = reason;
  std::deque<std::shared_ptr<Pending>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(inflight_);
  }
  ncclCommAbort(comm_);  // unblocks the kernels stuck waiting on peers
  comm_ = nullptr;
  std::exception_ptr e = timeout ? std::make_exception_ptr(TimeoutError(reason)) : std::make_exception_ptr(NcclError(reason));
  for (auto& p : pending) p->work->setError(e);
  if (onFatal_) onFatal_(reason);
}

void NcclCommunicator::abort(const std::string& reason) { fail(reason, false); }

void NcclCommunicator::watchdogLoop() {
  const double limit = std::chrono::duration<double>(timeout()).count();
  while (!stop_ && !failed_) {
    std::shared_ptr<Pending> oldest;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!inflight_.empty()) {
        auto& p = inflight_.front();
        cudaError_t q = cudaEventQuery(p->work->done.get());
        if (q == cudaSuccess) {
          p->work->markCompleted();
          inflight_.pop_front();
        } else {
          if (q != cudaErrorNotReady) cudaGetLastError();
          oldest = p;
          break;
        }
      }
    }
    ncclResult_t async = ncclSuccess;
    if (comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      fail(std::string("NCCL asynchronous error on communicator '") + name() + "': " + ncclGetErrorString(async) +
               ": " + ncclGetLastError(comm_),
           false);
      return;
    }
    if (oldest && nowSeconds() - oldest->enqueued > limit) {
      fail(oldest->work->timeoutMessage(timeout()) + "; NCCL communicator aborted", true);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::shared_ptr<Work> NcclCommunicator::issueAfter(const std::shared_ptr<Work>& dep,
                                                 const std::function<std::shared_ptr<Work>()>& issue) {
  return issueWithPendingAfter(dep, issue);
}

std::shared_ptr<Work> NcclCommunicator::run(CollectiveOp op, size_t bytes, DType dtype,
                                            const std::vector<const void*>& buffers,
                                            const std::function<void(cudaStream_t)>& issue) {
  if (failed_) throw CommError("communicator '" + name() + "' has failed: " + failure_);
  auto work = newWork<NcclWork>(op, bytes, dtype);
  cudaStream_t caller = currentStream();
  streamWaitStream(stream_.get(), caller);
  if (auto dep = takePendingAfter()) {  // chained: this comm's stream waits for it, not the caller
    StreamGuard g(stream_.get());
    dep->wait(timeout());
  }
  CudaRuntime& rt = CudaRuntime::require();
  for (const void* b : buffers) rt.allocator().recordStream(b, stream_.get());
  work->markStarted();
  NCCL_CHECK(ncclGroupStart());
  issue(stream_.get());
  ncclResult_t r = ncclGroupEnd();
  if (r == ncclInProgress) {  // non-blocking communicator: wait for the enqueue itself
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    r = state;
  }
  if (r != ncclSuccess) NCCL_CHECK(r);
  work->done.record(stream_.get());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inflight_.push_back(std::make_shared<Pending>(Pending{work, nowSeconds()}));
  }
  return work;
}

std::shared_ptr<Work> NcclCommunicator::runHost(CollectiveOp op, size_t inBytes, size_t outBytes, DType dtype,
                                                const void* in, void* out,
                                                const std::function<void(const void*, void*, cudaStream_t)>& issue) {
  CudaRuntime& rt = CudaRuntime::require();
  Tensor dIn = Tensor::empty({static_cast<int64_t>(std::max<size_t>(inBytes, 1))}, DType::kU8, rt.dev());
  Tensor dOut = Tensor::empty({static_cast<int64_t>(std::max<size_t>(outBytes, 1))}, DType::kU8, rt.dev());
  if (inBytes) CUDA_CHECK(cudaMemcpyAsync(dIn.rawData(), in, inBytes, cudaMemcpyHostToDevice, currentStream()));
  auto w = run(op, std::max(inBytes, outBytes), dtype, {dIn.rawData(), dOut.rawData()},
               [&](cudaStream_t s) { issue(dIn.rawData(), dOut.rawData(), s); });
  w->wait(timeout());
  if (outBytes) CUDA_CHECK(cudaMemcpyAsync(out, dOut.rawData(), outBytes, cudaMemcpyDeviceToHost, currentStream()));
  CUDA_CHECK(cudaStreamSynchronize(currentStream()));
  return w;
}

// A communicator of one rank (one GPU per node: its intra-node group; a rail of one node) reduces
// nothing: a copy on the comm stream, ordered and traced like the collective. NCCL's own one-rank
// kernel for reductions drops the buffer's last elements for ncclAvg (PreMulSum) when the count is
// not a multiple of its block split (NVIDIA/nccl#1950, fixed in 2.29.7): measured here with NCCL
// 2.28 on the H200 as 14 zeroed gradient elements at the end of a sharding unit, which sent a
// one-rank NCCL full_shard run off the CPU curve (docs/performance.md).
void NcclCommunicator::oneRankCopy(const void* in, void* out, size_t bytes, cudaStream_t s) {
  if (in != out && bytes) CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, s));
}

std::shared_ptr<Work> NcclCommunicator::allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Device device) {
  const size_t bytes = count * dtypeSize(dtype);
  auto issue = [=](const void* in, void* out, cudaStream_t s) {
    if (size_ == 1) return oneRankCopy(in, out, bytes, s);
    NCCL_CHECK(ncclAllReduce(in, out, count, ncclType(dtype), ncclOp(op), comm_, s));
  };
  if (device.isCpu()) return runHost(CollectiveOp::kAllReduce, bytes, bytes, dtype, buf, buf, issue);
  return run(CollectiveOp::kAllReduce, bytes, dtype, {buf}, [&](cudaStream_t s) { issue(buf, buf, s); });
}

std::shared_ptr<Work> NcclCommunicator::reduceScatter(const void* in, void* out, size_t countPerRank, DType dtype,
                                                      ReduceOp op, Device device) {
  const size_t outBytes = countPerRank * dtypeSize(dtype), inBytes = outBytes * static_cast<size_t>(size_);
  auto issue = [=](const void* i, void* o, cudaStream_t s) {
    if (size_ == 1) return oneRankCopy(i, o, outBytes, s);
    NCCL_CHECK(ncclReduceScatter(i, o, countPerRank, ncclType(dtype), ncclOp(op), comm_, s));
  };
  if (device.isCpu()) return runHost(CollectiveOp::kReduceScatter, inBytes, outBytes, dtype, in, out, issue);
  return run(CollectiveOp::kReduceScatter, inBytes, dtype, {in, out}, [&](cudaStream_t s) { issue(in, out, s); });
}

std::shared_ptr<Work> NcclCommunicator::allGather(const void* in, void* out, size_t countPerRank, DType dtype,
                                                  Device device) {
  const size_t inBytes = countPerRank * dtypeSize(dtype), outBytes = inBytes * static_cast<size_t>(size_);
  auto issue = [=](const void* i, void* o, cudaStream_t s) {
    if (size_ == 1) return oneRankCopy(i, o, outBytes, s);
    NCCL_CHECK(ncclAllGather(i, o, countPerRank, ncclType(dtype), comm_, s));
  };
  if (device.isCpu()) return runHost(CollectiveOp::kAllGather, inBytes, outBytes, dtype, in, out, issue);
  return run(CollectiveOp::kAllGather, outBytes, dtype, {in, out}, [&](cudaStream_t s) { issue(in, out, s); });
}

std::shared_ptr<Work> NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Device device) {
  const size_t bytes = count * dtypeSize(dtype);
  auto issue = [=](const void* i, void* o, cudaStream_t s) {
    if (size_ == 1) return oneRankCopy(i, o, bytes, s);
    NCCL_CHECK(ncclBroadcast(i, o, count, ncclType(dtype), root, comm_, s));
  };
  if (device.isCpu()) return runHost(CollectiveOp::kBroadcast, bytes, bytes, dtype, buf, buf, issue);
  return run(CollectiveOp::kBroadcast, bytes, dtype, {buf}, [&](cudaStream_t s) { issue(buf, buf, s); });
}

std::shared_ptr<Work> NcclCommunicator::barrier() {
  // A one-element all-reduce is NCCL's barrier; the host waits for it.
  int32_t dummy = 0;
  return runHost(CollectiveOp::kBarrier, 4, 4, DType::kI32, &dummy, &dummy, [=](const void* i, void* o, cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(i, o, 1, ncclInt32, ncclSum, comm_, s));
  });
}

std::shared_ptr<Work> NcclCommunicator::send(const void* buf, size_t count, DType dtype, int peer, Device device) {
  MT_CHECK(device.isCuda(), "NCCL send needs a device buffer");
  return run(CollectiveOp::kSend, count * dtypeSize(dtype), dtype, {buf}, [&](cudaStream_t s) {
    NCCL_CHECK(ncclSend(buf, count, ncclType(dtype), peer, comm_, s));
  });
}

std::shared_ptr<Work> NcclCommunicator::recv(void* buf, size_t count, DType dtype, int peer, Device device) {
  MT_CHECK(device.isCuda(), "NCCL recv needs a device buffer");
  return run(CollectiveOp::kRecv, count * dtypeSize(dtype), dtype, {buf}, [&](cudaStream_t s) {
    NCCL_CHECK(ncclRecv(buf, count, ncclType(dtype), peer, comm_, s));
  });
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, CommOptions options) {
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  auto childName = std::make_shared<const std::string>(options.name);
  ncclConfig_t config = ncclConfigOf(options, childName->c_str());
  ncclComm_t sub = nullptr;
  NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config));
  ncclResult_t state = ncclInProgress;
  Stopwatch sw;
  while (state == ncclInProgress) {
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (sw.elapsed() > std::chrono::duration<double>(timeout()).count())
      throw TimeoutError("ncclCommSplit on communicator '" + name() + "' timed out");
  }
  if (sub) {
    state = ncclInProgress;
    while (state == ncclInProgress) NCCL_CHECK(ncclCommGetAsyncError(sub, &state));
    NCCL_CHECK(state);
  }
  if (!sub) return nullptr;
  return std::unique_ptr<Communicator>(new NcclCommunicator(sub, std::move(options), onFatal_, std::move(childName)));
}

}  // namespace mt
