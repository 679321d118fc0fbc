#include "comm/MpiCommunicator.h"

#include <sched.h>

#include <cstring>
#include <sstream>
#include <vector>

#include "comm/MpiEnvironment.h"
#include "core/Log.h"
#include "comm/MpiCheck.h"
#include "core/Timer.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/DeviceBinding.h"
#endif

namespace mt {

namespace {

template <typename T, typename F>
void reduce16(void* in, void* inout, int* len, F&& f) {
  T* a = static_cast<T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

void bf16Sum(void* a, void* b, int* n, MPI_Datatype*) { reduce16<BFloat16>(a, b, n, [](float x, float y) { return x + y; }); }
void bf16Max(void* a, void* b, int* n, MPI_Datatype*) { reduce16<BFloat16>(a, b, n, [](float x, float y) { return x > y ? x : y; }); }
void bf16Min(void* a, void* b, int* n, MPI_Datatype*) { reduce16<BFloat16>(a, b, n, [](float x, float y) { return x < y ? x : y; }); }
void f16Sum(void* a, void* b, int* n, MPI_Datatype*) { reduce16<Float16>(a, b, n, [](float x, float y) { return x + y; }); }
void f16Max(void* a, void* b, int* n, MPI_Datatype*) { reduce16<Float16>(a, b, n, [](float x, float y) { return x > y ? x : y; }); }
void f16Min(void* a, void* b, int* n, MPI_Datatype*) { reduce16<Float16>(a, b, n, [](float x, float y) { return x < y ? x : y; }); }

// User ops are created once per process (they live until MPI_Finalize).
MPI_Op userOp(MPI_User_function* fn) {
  static std::mutex m;
  static std::vector<std::pair<MPI_User_function*, MPI_Op>> ops;
  std::lock_guard<std::mutex> lock(m);
  for (auto& p : ops)
    if (p.first == fn) return p.second;
  MPI_Op op;
  MPI_CHECK(MPI_Op_create(fn, /*commute=*/1, &op));
  ops.emplace_back(fn, op);
  return op;
}

MPI_Op mpiOp(ReduceOp op, DType t) {
  const bool sumLike = op == ReduceOp::kSum || op == ReduceOp::kAvg;
  if (t == DType::kBF16) return userOp(sumLike ? bf16Sum : op == ReduceOp::kMax ? bf16Max : bf16Min);
  if (t == DType::kF16) return userOp(sumLike ? f16Sum : op == ReduceOp::kMax ? f16Max : f16Min);
  return sumLike ? MPI_SUM : op == ReduceOp::kMax ? MPI_MAX : MPI_MIN;
}

void divideInPlace(void* buf, size_t count, DType t, int by) {
  switch (t) {
    case DType::kF32: {
      float* p = static_cast<float*>(buf);
      const float inv = 1.f / static_cast<float>(by);
      for (size_t i = 0; i < count; ++i) p[i] *= inv;
      break;
    }
    case DType::kF64: {
      double* p = static_cast<double*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= by;
      break;
    }
    case DType::kBF16: {
      BFloat16* p = static_cast<BFloat16*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = BFloat16(static_cast<float>(p[i]) / static_cast<float>(by));
      break;
    }
    case DType::kF16: {
      Float16* p = static_cast<Float16*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = Float16(static_cast<float>(p[i]) / static_cast<float>(by));
      break;
    }
    case DType::kI32: {
      int32_t* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= by;
      break;
    }
    case DType::kI64: {
      int64_t* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= by;
      break;
    }
    case DType::kU8: {
      uint8_t* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = static_cast<uint8_t>(p[i] / by);
      break;
    }
  }
}

// MPI counts are int; larger buffers go in pieces (collectives are then several MPI calls, issued
// identically on every rank because the split depends only on the count).
constexpr size_t kMaxMpiCount = size_t{1} << 30;

// Host staging of device buffers: a host copy made before the op and copied back after.
struct Staging {
  std::vector<char> host;
  void* device = nullptr;
  Device dev;
};

}  // namespace

MPI_Datatype mpiType(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options) : Communicator(std::move(options)) {
  {
    MpiCallGuard g;
    MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    if (this->options().fingerprint) MPI_CHECK(MPI_Comm_dup(comm_, &fingerprintComm_));
  }
  thread_ = std::thread([this] { progressLoop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  // A progress thread stuck in a collective whose peer is gone never returns; do not hang the
  // process on it (it is aborting anyway).
  for (int i = 0; i < 200 && !exited_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (exited_) {
    thread_.join();
    MpiCallGuard g;
    if (fingerprintComm_ != MPI_COMM_NULL) MPI_Comm_free(&fingerprintComm_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  } else {
    thread_.detach();
  }
}

std::shared_ptr<Work> MpiCommunicator::issueAfter(const std::shared_ptr<Work>& dep,
                                                const std::function<std::shared_ptr<Work>()>& issue) {
  return issueWithPendingAfter(dep, issue);
}

std::shared_ptr<Work> MpiCommunicator::enqueue(CollectiveOp op, size_t bytes, DType dtype, Descriptor desc,
                                               std::function<void(Task&)> run, std::function<void()> finish,
                                               bool p2p, Device device) {
  auto task = std::make_unique<Task>();
  if (device.isCuda()) {
#ifdef MT_WITH_CUDA
    // The progress thread copies the buffer to the host once the caller's stream has produced it.
    auto ev = std::make_shared<CudaEvent>();
    ev->record(currentStream());
    task->deviceReady = ev;
#else
    throw InternalError("device buffer on the MPI backend in a build without CUDA");
#endif
  }
  task->work = newWork(op, bytes, dtype);
  task->after = takePendingAfter();  // a chained op (issueAfter): the progress thread waits for it
  if (faultFor(task->work->seq()) == InjectedFault::kSkip) {  // testing only (FaultInjection.h)
    MT_LOG_WARN << "MT_TEST_FAULT: rank " << rank_ << " skips " << collectiveName(op) << " #"
                << task->work->seq() << " on communicator '" << name() << "'";
    task->work->markStarted();
    task->work->markCompleted();
    return task->work;
  }
  task->desc = desc;
  task->desc.op = static_cast<int64_t>(op);
  task->p2p = p2p;
  task->run = std::move(run);
  task->finish = std::move(finish);
  std::shared_ptr<Work> w = task->work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) {
      w->markFailed(std::make_exception_ptr(PeerLostError(abortReason_)));
      return w;
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return w;
}

void MpiCommunicator::checkFingerprint(const Descriptor& d, int64_t seq) {
  int64_t mine[8] = {d.op, d.count, d.dtype, d.extra, -d.op, -d.count, -d.dtype, -d.extra};
  int64_t agg[8];
  {
    MpiCallGuard g;
    MPI_CHECK(MPI_Allreduce(mine, agg, 8, MPI_INT64_T, MPI_MIN, fingerprintComm_));
  }
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && agg[i] == -agg[i + 4];
  if (same) return;
  std::vector<int64_t> all(static_cast<size_t>(4 * size_));
  {
    MpiCallGuard g;
    MPI_CHECK(MPI_Allgather(mine, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, fingerprintComm_));
  }
  std::ostringstream os;
  os << "collective mismatch on communicator '" << name() << "' at op #" << seq << ":";
  for (int r = 0; r < size_; ++r) {
    const int64_t* e = &all[static_cast<size_t>(4 * r)];
    os << " rank " << r << "=" << collectiveName(static_cast<CollectiveOp>(e[0]))
       << "(count " << e[1] << ", " << dtypeName(static_cast<DType>(e[2])) << ", arg " << e[3] << ")";
  }
  throw CommError(os.str());
}

bool MpiCommunicator::pollPointToPoint() {
  bool any = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    int done = 0;
    {
      MpiCallGuard g;
      MPI_Test(&(*it)->request, &done, MPI_STATUS_IGNORE);
    }
    if (done) {
      try {
        if ((*it)->finish) (*it)->finish();
        (*it)->work->markCompleted();
      } catch (...) {
        (*it)->work->markFailed(std::current_exception());
      }
      it = pending_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

void MpiCommunicator::progressLoop() {
  int idleSpins = 0;
#ifdef MT_WITH_CUDA
  std::unique_ptr<CudaStream> staging;  // this thread's stream for host staging copies
#endif
  while (true) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (pending_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      }
      if (stop_ && queue_.empty() && pending_.empty()) break;
      if (stop_ && queue_.empty() && aborted_) break;
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (task) {
      idleSpins = 0;
      if (aborted_) {
        task->work->markFailed(std::make_exception_ptr(PeerLostError(abortReason_)));
        continue;
      }
      try {
        // A chained op waits for its predecessor (another communicator's progress thread) here,
        // so its own start time is when it could run.
        if (task->after) task->after->wait(timeout());
        task->work->markStarted();
#ifdef MT_WITH_CUDA
        if (task->deviceReady) {
          if (!staging) {
            bindThreadToDevice(CudaRuntime::require().device());
            staging = std::make_unique<CudaStream>();
            setCurrentStream(staging->get());
          }
          static_cast<CudaEvent*>(task->deviceReady.get())->synchronize();
        }
#endif
        // Point-to-point ops involve two ranks only, so they cannot be compared across all.
        if (fingerprintComm_ != MPI_COMM_NULL && !task->p2p) checkFingerprint(task->desc, task->work->seq());
        task->run(*task);
        if (task->request != MPI_REQUEST_NULL) {
          pending_.push_back(std::move(task));
        } else {
          if (task->finish) task->finish();
          task->work->markCompleted();
        }
      } catch (...) {
        task->work->markFailed(std::current_exception());
      }
      continue;
    }
    // Only point-to-point in flight: poll, backing off so an idle rank does not burn a core.
    if (!pollPointToPoint()) {
      if (++idleSpins < 200) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      idleSpins = 0;
    }
    if (aborted_) {
      for (auto& t : pending_) t->work->markFailed(std::make_exception_ptr(PeerLostError(abortReason_)));
      pending_.clear();
    }
  }
  exited_ = true;
}

void MpiCommunicator::abort(const std::string& reason) {
  std::deque<std::unique_ptr<Task>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    abortReason_ = reason;
    aborted_ = true;
    dropped.swap(queue_);
  }
  for (auto& t : dropped) t->work->markFailed(std::make_exception_ptr(PeerLostError(reason)));
  cv_.notify_all();
}

namespace {

// Host memory a device buffer is staged through: pinned blocks of the runtime's caching pinned
// allocator, reused from one collective to the next (no cudaHostAlloc, page locking or zeroing per
// op), so the copies run at pinned speed. A std::vector per op zeroed its bytes and copied through
// pageable memory: GPT d24 full_shard on one rank spent most of its 7.2 s step there (2026-12-02).
class HostStage {
 public:
  explicit HostStage(size_t bytes) : bytes_(bytes) {
#ifdef MT_WITH_CUDA
    alloc_ = &CudaRuntime::require().pinned();
    ptr_ = alloc_->allocate(bytes);
#else
    throw InternalError("device buffer on the MPI backend in a build without CUDA");
#endif
  }
  ~HostStage() {
    if (alloc_ && ptr_) alloc_->deallocate(ptr_, bytes_);  // reused once this stream's copies are done
  }
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t bytes_;
  Allocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
};

// Runs fn(hostPtr) with the buffer visible on the host: directly for CPU buffers, through a pinned
// host copy for device buffers (copied in before when `in`, back after when `out`; both copies
// synchronous on the progress thread's staging stream).
template <typename F>
void withHost(void* buf, size_t bytes, Device device, bool in, bool out, F&& fn) {
  if (device.isCpu()) {
    fn(buf);
    return;
  }
  HostStage host(bytes);
  if (in) copyBytes(host.get(), Device::cpu(), buf, device, bytes);
  fn(host.get());
  if (out) copyBytes(buf, device, host.get(), Device::cpu(), bytes);
}

// A collective over one rank is a copy (or nothing): done where the buffer lives, without MPI or
// a trip through the host, and complete (synchronised) before the Work is.
void copyLocal(void* dst, const void* src, size_t bytes, Device device) {
  if (dst == src || bytes == 0) return;
  copyBytes(dst, device, src, device, bytes);
#ifdef MT_WITH_CUDA
  if (device.isCuda()) CUDA_CHECK(cudaStreamSynchronize(currentStream()));
#endif
}

}  // namespace

std::shared_ptr<Work> MpiCommunicator::allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Device device) {
  const size_t bytes = count * dtypeSize(dtype);
  MPI_Comm comm = comm_;
  const int n = size_;
  return enqueue(
      CollectiveOp::kAllReduce, bytes, dtype,
      {0, static_cast<int64_t>(count), static_cast<int64_t>(dtype), static_cast<int64_t>(op)}, [=](Task&) {
        if (n == 1) return;  // sum, average, max or min over one rank: the buffer as it is
        withHost(buf, bytes, device, true, true, [&](void* p) {
          MpiCallGuard g;
          char* c = static_cast<char*>(p);
          for (size_t off = 0; off < count; off += kMaxMpiCount) {
            const int len = static_cast<int>(std::min(kMaxMpiCount, count - off));
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, c + off * dtypeSize(dtype), len, mpiType(dtype), mpiOp(op, dtype), comm));
          }
          if (op == ReduceOp::kAvg) divideInPlace(p, count, dtype, n);
        });
      },
      nullptr, false, device);
}

std::shared_ptr<Work> MpiCommunicator::reduceScatter(const void* in, void* out, size_t countPerRank, DType dtype,
                                                     ReduceOp op, Device device) {
  const size_t es = dtypeSize(dtype), outBytes = countPerRank * es, inBytes = outBytes * static_cast<size_t>(size_);
  MT_CHECK(countPerRank <= kMaxMpiCount, "reduceScatter of ", countPerRank, " elements per rank");
  MPI_Comm comm = comm_;
  const int n = size_;
  return enqueue(CollectiveOp::kReduceScatter, inBytes, dtype,
                 {0, static_cast<int64_t>(countPerRank), static_cast<int64_t>(dtype), static_cast<int64_t>(op)}, [=](Task&) {
                   if (n == 1) return copyLocal(out, in, outBytes, device);
                   withHost(const_cast<void*>(in), inBytes, device, true, false, [&](void* hin) {
                     withHost(out, outBytes, device, false, true, [&](void* hout) {
                       MpiCallGuard g;
                       MPI_CHECK(MPI_Reduce_scatter_block(hin, hout, static_cast<int>(countPerRank), mpiType(dtype),
                                                          mpiOp(op, dtype), comm));
                       if (op == ReduceOp::kAvg) divideInPlace(hout, countPerRank, dtype, n);
                     });
                   });
                 },
                 nullptr, false, device);
}

std::shared_ptr<Work> MpiCommunicator::allGather(const void* in, void* out, size_t countPerRank, DType dtype,
                                                 Device device) {
  const size_t es = dtypeSize(dtype), inBytes = countPerRank * es, outBytes = inBytes * static_cast<size_t>(size_);
  MT_CHECK(countPerRank <= kMaxMpiCount, "allGather of ", countPerRank, " elements per rank");
  MPI_Comm comm = comm_;
  const int n = size_;
  return enqueue(CollectiveOp::kAllGather, outBytes, dtype,
                 {0, static_cast<int64_t>(countPerRank), static_cast<int64_t>(dtype), 0}, [=](Task&) {
                   if (n == 1) return copyLocal(out, in, outBytes, device);
                   withHost(const_cast<void*>(in), inBytes, device, true, false, [&](void* hin) {
                     withHost(out, outBytes, device, false, true, [&](void* hout) {
                       MpiCallGuard g;
                       MPI_CHECK(MPI_Allgather(hin, static_cast<int>(countPerRank), mpiType(dtype), hout,
                                               static_cast<int>(countPerRank), mpiType(dtype), comm));
                     });
                   });
                 },
                 nullptr, false, device);
}

std::shared_ptr<Work> MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Device device) {
  MT_CHECK(root >= 0 && root < size_, "broadcast root ", root, " of ", size_);
  const size_t bytes = count * dtypeSize(dtype);
  MPI_Comm comm = comm_;
  const bool isRoot = rank_ == root;
  const int n = size_;
  return enqueue(CollectiveOp::kBroadcast, bytes, dtype,
                 {0, static_cast<int64_t>(count), static_cast<int64_t>(dtype), root}, [=](Task&) {
                   if (n == 1) return;  // the root's buffer is everyone's
                   withHost(buf, bytes, device, isRoot, !isRoot, [&](void* p) {
                     MpiCallGuard g;
                     char* c = static_cast<char*>(p);
                     for (size_t off = 0; off < count; off += kMaxMpiCount) {
                       const int len = static_cast<int>(std::min(kMaxMpiCount, count - off));
                       MPI_CHECK(MPI_Bcast(c + off * dtypeSize(dtype), len, mpiType(dtype), root, comm));
                     }
                   });
                 },
                 nullptr, false, device);
}

std::shared_ptr<Work> MpiCommunicator::barrier() {
  MPI_Comm comm = comm_;
  return enqueue(CollectiveOp::kBarrier, 0, DType::kU8, {0, 0, 0, 0}, [=](Task&) {
    MpiCallGuard g;
    MPI_CHECK(MPI_Barrier(comm));
  });
}

std::shared_ptr<Work> MpiCommunicator::send(const void* buf, size_t count, DType dtype, int peer, Device device) {
  MT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send to rank ", peer, " of ", size_);
  MT_CHECK(count <= kMaxMpiCount, "send of ", count, " elements");
  const size_t bytes = count * dtypeSize(dtype);
  auto staging = std::make_shared<std::unique_ptr<HostStage>>();
  MPI_Comm comm = comm_;
  return enqueue(
      CollectiveOp::kSend, bytes, dtype, {0, static_cast<int64_t>(count), static_cast<int64_t>(dtype), peer},
      [=](Task& t) {
        const void* p = buf;
        if (!device.isCpu()) {
          *staging = std::make_unique<HostStage>(bytes);
          copyBytes((*staging)->get(), Device::cpu(), buf, device, bytes);
          p = (*staging)->get();
        }
        MpiCallGuard g;
        MPI_CHECK(MPI_Isend(p, static_cast<int>(count), mpiType(dtype), peer, /*tag=*/7, comm, &t.request));
      },
      [staging] { staging->reset(); }, /*p2p=*/true, device);
}

std::shared_ptr<Work> MpiCommunicator::recv(void* buf, size_t count, DType dtype, int peer, Device device) {
  MT_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv from rank ", peer, " of ", size_);
  MT_CHECK(count <= kMaxMpiCount, "recv of ", count, " elements");
  const size_t bytes = count * dtypeSize(dtype);
  auto staging = std::make_shared<std::unique_ptr<HostStage>>();
  MPI_Comm comm = comm_;
  return enqueue(
      CollectiveOp::kRecv, bytes, dtype, {0, static_cast<int64_t>(count), static_cast<int64_t>(dtype), peer},
      [=](Task& t) {
        void* p = buf;
        if (!device.isCpu()) {
          *staging = std::make_unique<HostStage>(bytes);
          p = (*staging)->get();
        }
        MpiCallGuard g;
        MPI_CHECK(MPI_Irecv(p, static_cast<int>(count), mpiType(dtype), peer, /*tag=*/7, comm, &t.request));
      },
      [=] {
        if (!device.isCpu()) {
          copyBytes(buf, device, (*staging)->get(), Device::cpu(), bytes);
          staging->reset();
        }
      },
      /*p2p=*/true, device);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, CommOptions options) {
  auto result = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  MPI_Comm comm = comm_;
  auto w = enqueue(CollectiveOp::kSplit, 0, DType::kI32, {0, color < 0 ? -1 : 0, 0, 0}, [=](Task&) {
    MpiCallGuard g;
    MPI_CHECK(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, result.get()));
  });
  w->wait(timeout());
  if (*result == MPI_COMM_NULL) return nullptr;
  auto sub = std::make_unique<MpiCommunicator>(*result, std::move(options));
  MpiCallGuard g;
  MPI_Comm_free(result.get());  // the new communicator holds its own duplicate
  return sub;
}

}  // namespace mt
