#include "comm/NcclCommunicator.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "comm/MpiCheck.h"
#include "core/Log.h"
#include "core/Timer.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"

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

double seconds(std::chrono::milliseconds t) {
  return std::chrono::duration<double>(t).count();
}

std::string secondsText(std::chrono::milliseconds t) {
  std::ostringstream os;
  os << seconds(t);
  return os.str();
}

// Polling back-off: a group enqueue usually settles within microseconds, a split or a peer's
// first connection within milliseconds; neither should burn a core the training thread needs.
void backoff(int spin) {
  if (spin < 64) {
    sched_yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (spin - 63))));
}

// A Work whose start and completion are CUDA events on the comm stream, around its kernel.
class NcclWork final : public Work {
 public:
  NcclWork(int64_t seq, CollectiveOp op, size_t bytes, DType dtype, std::string comm)
      : Work(seq, op, bytes, dtype, std::move(comm)) {}
  void wait(std::chrono::milliseconds timeout) override {
    if (host_) {  // staged host buffers completed synchronously
      waitHost(timeout);
      return;
    }
    if (std::exception_ptr e = error()) std::rethrow_exception(e);
    CUDA_CHECK(cudaStreamWaitEvent(currentStream(), done.get(), 0));
  }
  void setHost() { host_ = true; }
  CudaEvent started, done;

 private:
  bool host_ = false;
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
  bool started = false;
};

struct NcclCommunicator::SplitSlot {
  ncclComm_t child = nullptr;
  std::shared_ptr<const std::string> name;
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

// Before the watchdog exists: this thread alone uses comm_.
void NcclCommunicator::waitForCompletionOfInit(const char* what) {
  Stopwatch sw;
  ncclResult_t state = ncclInProgress;
  for (int spin = 0;; ++spin) {
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclInProgress) break;
    if (sw.elapsed() > seconds(timeout())) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw TimeoutError(std::string("NCCL ") + what + " on communicator '" + name() +
                         "' did not finish within " + secondsText(timeout()) + " s (a rank never joined?)");
    }
    backoff(spin);
  }
  if (state != ncclSuccess) {
    const std::string detail = ncclGetLastError(comm_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw NcclError(std::string("NCCL ") + what + " of communicator '" + name() +
                    "' failed: " + ncclGetErrorString(state) + ": " + detail);
  }
}

NcclCommunicator::NcclCommunicator(MPI_Comm bootstrap, CommOptions options, FatalHandler onFatal)
    : Communicator(std::move(options)),
      device_(CudaRuntime::require().device()),
      onFatal_(std::move(onFatal)) {
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
    : Communicator(std::move(options)),
      comm_(comm),
      ncclName_(std::move(ncclName)),
      device_(CudaRuntime::require().device()),
      onFatal_(std::move(onFatal)) {
  NCCL_CHECK(ncclCommCount(comm_, &size_));
  NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

NcclCommunicator::~NcclCommunicator() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  try {
    finalizeOrAbort();
  } catch (...) {
    // A destructor does not throw; what failed was reported when it failed.
  }
}

// Flushes this rank's queued ops and destroys the communicator; aborts it when it failed, when its
// stream does not drain within the timeout (a peer stopped), or when finalizing does not finish.
void NcclCommunicator::finalizeOrAbort() {
  bool drained = !failed_;
  if (drained) {
    CudaEvent flushed;
    flushed.record(stream_.get());
    Stopwatch sw;
    for (int spin = 0; !flushed.query(); ++spin) {
      if (sw.elapsed() > seconds(timeout())) {
        drained = false;
        break;
      }
      backoff(spin);
    }
  }
  std::lock_guard<std::mutex> lock(ncclMutex_);
  if (!comm_) return;
  ncclResult_t state = drained ? ncclCommFinalize(comm_) : ncclInternalError;
  Stopwatch sw;
  for (int spin = 0; state == ncclInProgress; ++spin) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || sw.elapsed() > seconds(timeout())) break;
    if (state == ncclInProgress) backoff(spin);
  }
  if (state == ncclSuccess)
    ncclCommDestroy(comm_);
  else
    ncclCommAbort(comm_);
  comm_ = nullptr;
}

std::string NcclCommunicator::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void NcclCommunicator::throwIfFailed() {
  if (failed_.load(std::memory_order_acquire))
    throw CommError("communicator '" + name() + "' has failed: " + failure());
}

// The one writer of failed_ and failure_ (under mutex_, message first), and of comm_'s abort.
void NcclCommunicator::fail(const std::string& reason, bool timeout) {
  std::deque<std::shared_ptr<Pending>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load(std::memory_order_relaxed)) return;
    failure_ = reason;
    failed_.store(true, std::memory_order_release);
    pending.swap(inflight_);
  }
  {
    std::lock_guard<std::mutex> lock(ncclMutex_);
    if (comm_) ncclCommAbort(comm_);  // unblocks the kernels stuck waiting on peers
    comm_ = nullptr;
  }
  std::exception_ptr e =
      timeout ? std::make_exception_ptr(TimeoutError(reason)) : std::make_exception_ptr(NcclError(reason));
  for (auto& p : pending)
    p->work->markFailed(e);
  if (onFatal_) onFatal_(reason);
}

void NcclCommunicator::failAndThrow(const std::string& reason) {
  fail(reason, false);
  throw NcclError(reason);
}

void NcclCommunicator::abort(const std::string& reason) { fail(reason, false); }

void NcclCommunicator::watchdogLoop() {
  const double limit = seconds(timeout());
  try {
    bindThreadToDevice(device_);  // it frees finished ops' buffers and queries their events
    while (!stop_ && !failed_) {
      if (watchOnce(limit)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& e) {
    fail(std::string("the watchdog of NCCL communicator '") + name() + "' failed: " + e.what(), false);
  }
}

bool NcclCommunicator::watchOnce(double limit) {
  std::shared_ptr<Pending> oldest;
  std::vector<std::shared_ptr<NcclWork>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& p : inflight_) {
      if (p->started || !p->work->started.query()) continue;
      p->work->markStarted();
      p->started = true;
    }
    while (!inflight_.empty() && inflight_.front()->work->done.query()) {
      finished.push_back(inflight_.front()->work);
      inflight_.pop_front();
    }
    if (!inflight_.empty()) oldest = inflight_.front();
  }
  for (auto& w : finished)
    w->markCompleted();  // releases the op's buffers: outside the lock
  ncclResult_t async = ncclSuccess;
  std::string detail;
  if (size_ > 1) {
    std::lock_guard<std::mutex> lock(ncclMutex_);
    if (comm_ && ncclCommGetAsyncError(comm_, &async) != ncclSuccess) async = ncclSuccess;
    if (comm_ && async != ncclSuccess && async != ncclInProgress) detail = ncclGetLastError(comm_);
  }
  if (async != ncclSuccess && async != ncclInProgress) {
    fail(std::string("NCCL asynchronous error on communicator '") + name() +
             "': " + ncclGetErrorString(async) + ": " + detail,
         false);
    return true;
  }
  if (oldest && nowSeconds() - oldest->enqueued > limit) {
    fail(oldest->work->timeoutMessage(timeout()) + "; NCCL communicator aborted", true);
    return true;
  }
  return false;
}

ncclResult_t NcclCommunicator::issueGroup(const std::function<void()>& calls) {
  std::lock_guard<std::mutex> lock(ncclMutex_);
  if (!comm_) throw CommError("communicator '" + name() + "' has failed: " + failure());
  NCCL_CHECK(ncclGroupStart());
  try {
    calls();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  return ncclGroupEnd();
}

ncclResult_t NcclCommunicator::awaitState(const std::string& what) {
  Stopwatch sw;
  for (int spin = 0;; ++spin) {
    ncclResult_t state = ncclInProgress;
    {
      std::lock_guard<std::mutex> lock(ncclMutex_);
      if (!comm_) throw CommError("communicator '" + name() + "' has failed: " + failure());
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
    }
    if (state != ncclInProgress) return state;
    if (sw.elapsed() > seconds(timeout())) {
      const std::string message =
          "NCCL " + what + " on communicator '" + name() + "' did not finish within " +
          secondsText(timeout()) +
          " s: a peer never issued the matching op (a different order, or stuck elsewhere)";
      fail(message, true);
      throw TimeoutError(message);
    }
    backoff(spin);
  }
}

void NcclCommunicator::issueAndSettle(const std::string& what, const std::function<void()>& calls) {
  ncclResult_t r = issueGroup(calls);
  if (r == ncclInProgress) r = awaitState(what);
  if (r == ncclSuccess) return;
  std::string detail;
  {
    std::lock_guard<std::mutex> lock(ncclMutex_);
    if (comm_) detail = ncclGetLastError(comm_);
  }
  failAndThrow("NCCL " + what + " on communicator '" + name() + "' failed: " + ncclGetErrorString(r) + ": " +
               detail);
}

void NcclCommunicator::hostWait(cudaStream_t s, const std::string& what) {
  CudaEvent done;
  done.record(s);
  Stopwatch sw;
  for (int spin = 0; !done.query(); ++spin) {
    throwIfFailed();  // the watchdog aborted the communicator: the event may never fire
    if (sw.elapsed() > seconds(timeout())) {
      const std::string message = "NCCL " + what + " on communicator '" + name() +
                                  "' did not complete within " + secondsText(timeout()) + " s";
      fail(message, true);
      throw TimeoutError(message);
    }
    backoff(spin);
  }
}

void NcclCommunicator::checkFingerprint(const OpDesc& d, size_t count, int64_t seq) {
  constexpr int kFields = 5;  // op, count, dtype, arg, then this rank's op number (not compared)
  const int64_t mine[kFields] = {static_cast<int64_t>(d.op), static_cast<int64_t>(count),
                                 static_cast<int64_t>(d.dtype), d.arg, seq};
  int64_t host[8];
  for (int i = 0; i < 4; ++i)
    host[i] = mine[i], host[i + 4] = -mine[i];
  CudaRuntime& rt = CudaRuntime::require();
  const int64_t need = 8 + kFields * (1 + static_cast<int64_t>(size_));
  if (!fingerprint_.defined() || fingerprint_.numel() < need)
    fingerprint_ = Tensor::empty({need}, DType::kI64, rt.dev());
  auto* dev = static_cast<int64_t*>(fingerprint_.rawData());
  cudaStream_t s = stream_.get();
  rt.allocator().recordStream(dev, s);
  CUDA_CHECK(cudaMemcpyAsync(dev, host, sizeof(host), cudaMemcpyHostToDevice, s));
  const std::string what = std::string("fingerprint of ") + collectiveName(d.op) + " #" + std::to_string(seq);
  issueAndSettle(what, [&] { NCCL_CHECK(ncclAllReduce(dev, dev, 8, ncclInt64, ncclMin, comm_, s)); });
  hostWait(s, what);  // bounded; the copy to pageable memory below would wait without bound
  int64_t agg[8];
  CUDA_CHECK(cudaMemcpyAsync(agg, dev, sizeof(agg), cudaMemcpyDeviceToHost, s));
  bool same = true;
  for (int i = 0; i < 4; ++i)
    same = same && agg[i] == -agg[i + 4];
  if (same) return;
  int64_t* mineDev = dev + 8;
  int64_t* allDev = mineDev + kFields;
  std::vector<int64_t> all(static_cast<size_t>(kFields * size_));
  CUDA_CHECK(cudaMemcpyAsync(mineDev, mine, sizeof(mine), cudaMemcpyHostToDevice, s));
  issueAndSettle(what, [&] { NCCL_CHECK(ncclAllGather(mineDev, allDev, kFields, ncclInt64, comm_, s)); });
  hostWait(s, what);
  CUDA_CHECK(cudaMemcpyAsync(all.data(), allDev, all.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  std::ostringstream os;
  os << "collective mismatch on communicator '" << name() << "' (dist.fingerprint):";
  for (int r = 0; r < size_; ++r) {
    const int64_t* e = &all[static_cast<size_t>(kFields * r)];
    os << " rank " << r << " op #" << e[4] << "=" << collectiveName(static_cast<CollectiveOp>(e[0]))
       << "(count " << e[1] << ", " << dtypeName(static_cast<DType>(e[2])) << ", arg " << e[3] << ")";
  }
  throw CommError(os.str());
}

std::shared_ptr<Work> NcclCommunicator::issueAfter(const std::shared_ptr<Work>& dep,
                                                 const std::function<std::shared_ptr<Work>()>& issue) {
  return issueWithPendingAfter(dep, issue);
}

std::shared_ptr<Work> NcclCommunicator::run(const OpDesc& d, const std::vector<const void*>& buffers,
                                            const Issue& issue) {
  std::shared_ptr<Work> dep = takePendingAfter();  // first: a skipped op must not leave it to the next
  throwIfFailed();
  auto work = newWork<NcclWork>(d.op, d.bytes, d.dtype);
  size_t count = d.count;
  switch (faultFor(work->seq())) {
    case InjectedFault::kSkip:
      MT_LOG_WARN << "MT_TEST_FAULT: rank " << rank_ << " skips " << collectiveName(d.op) << " #"
                  << work->seq() << " on communicator '" << name() << "'";
      work->markStarted();
      work->markCompleted();
      return work;
    case InjectedFault::kResize:
      count = std::max<size_t>(1, count / 2);
      MT_LOG_WARN << "MT_TEST_FAULT: rank " << rank_ << " issues " << collectiveName(d.op) << " #"
                  << work->seq() << " on communicator '" << name() << "' with " << count
                  << " elements instead of " << d.count;
      break;
    case InjectedFault::kNone:
      break;
  }
  if (options().fingerprint && size_ > 1 && !d.p2p) checkFingerprint(d, count, work->seq());
  cudaStream_t s = stream_.get();
  streamWaitStream(s, currentStream());
  if (dep) {  // chained: this comm's stream waits for it, not the caller
    StreamGuard g(s);
    dep->wait(timeout());
  }
  CudaRuntime& rt = CudaRuntime::require();
  for (const void* b : buffers)
    rt.allocator().recordStream(b, s);
  work->started.record(s);
  if (size_ == 1) {
    issue(s, count);
  } else {
    issueAndSettle(std::string("enqueue of ") + collectiveName(d.op) + " #" + std::to_string(work->seq()),
                   [&] { issue(s, count); });
  }
  work->done.record(s);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inflight_.push_back(std::make_shared<Pending>(Pending{work, nowSeconds()}));
  }
  return work;
}

std::shared_ptr<Work> NcclCommunicator::runHost(
    const OpDesc& d, size_t inBytes, size_t outBytes, const void* in, void* out,
    const std::function<void(const void*, void*, cudaStream_t, size_t)>& issue) {
  CudaRuntime& rt = CudaRuntime::require();
  Tensor dIn = Tensor::empty({static_cast<int64_t>(std::max<size_t>(inBytes, 1))}, DType::kU8, rt.dev());
  Tensor dOut = Tensor::empty({static_cast<int64_t>(std::max<size_t>(outBytes, 1))}, DType::kU8, rt.dev());
  if (inBytes) CUDA_CHECK(cudaMemcpyAsync(dIn.rawData(), in, inBytes, cudaMemcpyHostToDevice, currentStream()));
  auto w = run(d, {dIn.rawData(), dOut.rawData()},
               [&](cudaStream_t s, size_t count) { issue(dIn.rawData(), dOut.rawData(), s, count); });
  w->wait(timeout());
  // Bounded first: a copy into pageable memory would wait for the op without bound.
  const std::string what =
      std::string("host-staged ") + collectiveName(d.op) + " #" + std::to_string(w->seq());
  hostWait(currentStream(), what);
  if (outBytes) CUDA_CHECK(cudaMemcpyAsync(out, dOut.rawData(), outBytes, cudaMemcpyDeviceToHost, currentStream()));
  hostWait(currentStream(), what);
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
  const OpDesc d{CollectiveOp::kAllReduce, count, dtype, static_cast<int64_t>(op), bytes};
  auto issue = [=](const void* in, void* out, cudaStream_t s, size_t n) {
    if (size_ == 1) return oneRankCopy(in, out, n * dtypeSize(dtype), s);
    NCCL_CHECK(ncclAllReduce(in, out, n, ncclType(dtype), ncclOp(op), comm_, s));
  };
  if (device.isCpu()) return runHost(d, bytes, bytes, buf, buf, issue);
  return run(d, {buf}, [&](cudaStream_t s, size_t n) { issue(buf, buf, s, n); });
}

std::shared_ptr<Work> NcclCommunicator::reduceScatter(const void* in, void* out, size_t countPerRank, DType dtype,
                                                      ReduceOp op, Device device) {
  const size_t outBytes = countPerRank * dtypeSize(dtype), inBytes = outBytes * static_cast<size_t>(size_);
  const OpDesc d{CollectiveOp::kReduceScatter, countPerRank, dtype, static_cast<int64_t>(op), inBytes};
  auto issue = [=](const void* i, void* o, cudaStream_t s, size_t n) {
    if (size_ == 1) return oneRankCopy(i, o, n * dtypeSize(dtype), s);
    NCCL_CHECK(ncclReduceScatter(i, o, n, ncclType(dtype), ncclOp(op), comm_, s));
  };
  if (device.isCpu()) return runHost(d, inBytes, outBytes, in, out, issue);
  return run(d, {in, out}, [&](cudaStream_t s, size_t n) { issue(in, out, s, n); });
}

std::shared_ptr<Work> NcclCommunicator::allGather(const void* in, void* out, size_t countPerRank, DType dtype,
                                                  Device device) {
  const size_t inBytes = countPerRank * dtypeSize(dtype), outBytes = inBytes * static_cast<size_t>(size_);
  const OpDesc d{CollectiveOp::kAllGather, countPerRank, dtype, -1, outBytes};
  auto issue = [=](const void* i, void* o, cudaStream_t s, size_t n) {
    if (size_ == 1) return oneRankCopy(i, o, n * dtypeSize(dtype), s);
    NCCL_CHECK(ncclAllGather(i, o, n, ncclType(dtype), comm_, s));
  };
  if (device.isCpu()) return runHost(d, inBytes, outBytes, in, out, issue);
  return run(d, {in, out}, [&](cudaStream_t s, size_t n) { issue(in, out, s, n); });
}

std::shared_ptr<Work> NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Device device) {
  const size_t bytes = count * dtypeSize(dtype);
  const OpDesc d{CollectiveOp::kBroadcast, count, dtype, root, bytes};
  auto issue = [=](const void* i, void* o, cudaStream_t s, size_t n) {
    if (size_ == 1) return oneRankCopy(i, o, n * dtypeSize(dtype), s);
    NCCL_CHECK(ncclBroadcast(i, o, n, ncclType(dtype), root, comm_, s));
  };
  if (device.isCpu()) return runHost(d, bytes, bytes, buf, buf, issue);
  return run(d, {buf}, [&](cudaStream_t s, size_t n) { issue(buf, buf, s, n); });
}

std::shared_ptr<Work> NcclCommunicator::barrier() {
  // A one-element all-reduce is NCCL's barrier; the host waits for it.
  int32_t dummy = 0;
  const OpDesc d{CollectiveOp::kBarrier, 1, DType::kI32, -1, 4};
  return runHost(d, 4, 4, &dummy, &dummy, [=](const void* i, void* o, cudaStream_t s, size_t) {
    if (size_ == 1) return;
    NCCL_CHECK(ncclAllReduce(i, o, 1, ncclInt32, ncclSum, comm_, s));
  });
}

std::shared_ptr<Work> NcclCommunicator::send(const void* buf, size_t count, DType dtype, int peer, Device device) {
  MT_CHECK(device.isCuda(), "NCCL send needs a device buffer");
  const OpDesc d{CollectiveOp::kSend, count, dtype, peer, count * dtypeSize(dtype), true};
  return run(d, {buf}, [&](cudaStream_t s, size_t n) {
    NCCL_CHECK(ncclSend(buf, n, ncclType(dtype), peer, comm_, s));
  });
}

std::shared_ptr<Work> NcclCommunicator::recv(void* buf, size_t count, DType dtype, int peer, Device device) {
  MT_CHECK(device.isCuda(), "NCCL recv needs a device buffer");
  const OpDesc d{CollectiveOp::kRecv, count, dtype, peer, count * dtypeSize(dtype), true};
  return run(d, {buf}, [&](cudaStream_t s, size_t n) {
    NCCL_CHECK(ncclRecv(buf, n, ncclType(dtype), peer, comm_, s));
  });
}

// ncclCommSplit on a non-blocking communicator: the parent's state settles when the split's job
// is done (the child's handle is written by NCCL's thread then, into a slot this communicator
// keeps), and the child's own state when its init is. Both bounded; a failure at either aborts
// what exists and throws, so no half-built child is ever handed out.
std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, CommOptions options) {
  hostWait(stream_.get(), "flush before ncclCommSplit");
  auto slot = std::make_shared<SplitSlot>();
  slot->name = std::make_shared<const std::string>(options.name);
  splitSlots_.push_back(slot);
  ncclConfig_t config = ncclConfigOf(options, slot->name->c_str());
  const std::string what = "ncclCommSplit into '" + options.name + "' (color " + std::to_string(color) + ")";
  ncclResult_t r;
  std::string detail;
  {
    std::lock_guard<std::mutex> lock(ncclMutex_);
    if (!comm_) throw CommError("communicator '" + name() + "' has failed: " + failure());
    r = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &slot->child, &config);
    if (r != ncclSuccess && r != ncclInProgress) detail = ncclGetLastError(comm_);
  }
  // Refused at the call (a bad config): the parent is unchanged.
  if (r != ncclSuccess && r != ncclInProgress)
    throw NcclError("NCCL " + what + " on communicator '" + name() + "' refused: " + ncclGetErrorString(r) +
                    ": " + detail);
  // NCCL 2.28 returns ncclSuccess with the split still running as the parent's async job: the
  // parent's state says when it is done (bounded; a timeout fails the parent).
  r = awaitState(what);
  if (r != ncclSuccess) {
    ncclComm_t partial = __atomic_load_n(&slot->child, __ATOMIC_ACQUIRE);
    if (partial) ncclCommAbort(partial);
    slot->child = nullptr;
    failAndThrow("NCCL " + what + " on communicator '" + name() + "' failed: " + ncclGetErrorString(r));
  }
  if (color < 0) return nullptr;
  // The job stores the child's handle last (an atomic release store), once the child is built.
  ncclComm_t child = nullptr;
  Stopwatch waited;
  for (int spin = 0; !(child = __atomic_load_n(&slot->child, __ATOMIC_ACQUIRE)); ++spin) {
    if (waited.elapsed() > seconds(timeout())) {
      const std::string message = "NCCL " + what + " on communicator '" + name() +
                                  "' gave no communicator within " + secondsText(timeout()) + " s";
      fail(message, true);
      throw TimeoutError(message);
    }
    backoff(spin);
  }
  Stopwatch sw;
  ncclResult_t state = ncclInProgress;
  for (int spin = 0; state == ncclInProgress; ++spin) {
    if (ncclCommGetAsyncError(child, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclInProgress && sw.elapsed() > seconds(timeout())) break;
    if (state == ncclInProgress) backoff(spin);
  }
  if (state != ncclSuccess) {
    const std::string why = state == ncclInProgress
                                ? "did not finish within " + secondsText(timeout()) + " s"
                                : std::string(ncclGetErrorString(state)) + ": " + ncclGetLastError(child);
    ncclCommAbort(child);
    slot->child = nullptr;
    if (state == ncclInProgress)
      throw TimeoutError("NCCL " + what + " on communicator '" + name() + "' " + why);
    throw NcclError("NCCL " + what + " on communicator '" + name() + "' failed: " + why);
  }
  slot->child = nullptr;  // owned by the new communicator from here
  return std::unique_ptr<Communicator>(new NcclCommunicator(child, std::move(options), onFatal_, slot->name));
}

}  // namespace mt
