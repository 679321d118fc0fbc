#include "comm/Communicator.h"

#include "core/Check.h"

namespace mt {

std::vector<CollectiveRecord> Communicator::recentOps() {
  std::lock_guard<std::mutex> lock(historyMutex_);
  std::vector<CollectiveRecord> out;
  for (auto& w : history_) out.push_back(w->record());
  return out;
}

int64_t Communicator::opsIssued() {
  std::lock_guard<std::mutex> lock(historyMutex_);
  return nextSeq_;
}

std::shared_ptr<Work> Communicator::allReduce(Tensor& t, ReduceOp op) {
  MT_CHECK(t.isContiguous(), "allReduce of non-contiguous ", t.str());
  auto w = allReduce(t.rawData(), static_cast<size_t>(t.numel()), t.dtype(), op, t.device());
  w->retain(t);
  return w;
}

std::shared_ptr<Work> Communicator::reduceScatter(const Tensor& in, Tensor& out, ReduceOp op) {
  MT_CHECK(in.isContiguous() && out.isContiguous() && in.numel() == out.numel() * size(), "reduceScatter of ",
           in.str(), " into ", out.str(), " on ", size(), " ranks");
  auto w = reduceScatter(in.rawData(), out.rawData(), static_cast<size_t>(out.numel()), out.dtype(), op, out.device());
  w->retain(in);
  w->retain(out);
  return w;
}

std::shared_ptr<Work> Communicator::allGather(const Tensor& in, Tensor& out) {
  MT_CHECK(in.isContiguous() && out.isContiguous() && out.numel() == in.numel() * size(), "allGather of ",
           in.str(), " into ", out.str(), " on ", size(), " ranks");
  auto w = allGather(in.rawData(), out.rawData(), static_cast<size_t>(in.numel()), in.dtype(), in.device());
  w->retain(in);
  w->retain(out);
  return w;
}

std::shared_ptr<Work> Communicator::allReduce(Tensor& t, ReduceOp op, const std::shared_ptr<Work>& after) {
  if (!after) return allReduce(t, op);
  return issueAfter(after, [&] { return allReduce(t, op); });
}

std::shared_ptr<Work> Communicator::allGather(const Tensor& in, Tensor& out, const std::shared_ptr<Work>& after) {
  if (!after) return allGather(in, out);
  return issueAfter(after, [&] { return allGather(in, out); });
}

namespace {
thread_local const std::shared_ptr<Work>* tlPendingAfter = nullptr;
}  // namespace

std::shared_ptr<Work> Communicator::issueWithPendingAfter(const std::shared_ptr<Work>& dep,
                                                          const std::function<std::shared_ptr<Work>()>& issue) {
  tlPendingAfter = &dep;
  try {
    auto w = issue();
    tlPendingAfter = nullptr;
    return w;
  } catch (...) {
    tlPendingAfter = nullptr;
    throw;
  }
}

std::shared_ptr<Work> Communicator::takePendingAfter() {
  if (!tlPendingAfter) return nullptr;
  std::shared_ptr<Work> dep = *tlPendingAfter;
  tlPendingAfter = nullptr;  // one op per issueAfter
  return dep;
}

std::shared_ptr<Work> Communicator::issueAfter(const std::shared_ptr<Work>& dep,
                                               const std::function<std::shared_ptr<Work>()>& issue) {
  dep->wait(timeout());
  return issue();
}

std::shared_ptr<Work> Communicator::broadcast(Tensor& t, int root) {
  MT_CHECK(t.isContiguous(), "broadcast of non-contiguous ", t.str());
  auto w = broadcast(t.rawData(), static_cast<size_t>(t.numel()), t.dtype(), root, t.device());
  w->retain(t);
  return w;
}

void Communicator::allReduceSync(Tensor& t, ReduceOp op) { allReduce(t, op)->wait(timeout()); }

double Communicator::allReduceScalar(double v, ReduceOp op) {
  if (size() == 1) return v;
  Tensor t = Tensor::empty({1}, DType::kF64);
  t.data<double>()[0] = v;
  allReduceSync(t, op);
  return t.data<double>()[0];
}

void Communicator::barrierSync() { barrier()->wait(timeout()); }

std::shared_ptr<Work> LocalCommunicator::done(CollectiveOp op, size_t bytes, DType dtype) {
  auto w = newWork(op, bytes, dtype);
  w->markStarted();
  w->markCompleted();
  return w;
}

std::shared_ptr<Work> LocalCommunicator::allReduce(void*, size_t count, DType dtype, ReduceOp, Device) {
  return done(CollectiveOp::kAllReduce, count * dtypeSize(dtype), dtype);
}

std::shared_ptr<Work> LocalCommunicator::reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp,
                                                       Device device) {
  copyBytes(out, device, in, device, count * dtypeSize(dtype));
  return done(CollectiveOp::kReduceScatter, count * dtypeSize(dtype), dtype);
}

std::shared_ptr<Work> LocalCommunicator::allGather(const void* in, void* out, size_t count, DType dtype,
                                                   Device device) {
  copyBytes(out, device, in, device, count * dtypeSize(dtype));
  return done(CollectiveOp::kAllGather, count * dtypeSize(dtype), dtype);
}

std::shared_ptr<Work> LocalCommunicator::broadcast(void*, size_t count, DType dtype, int root, Device) {
  MT_CHECK(root == 0, "broadcast root ", root, " on a world of 1");
  return done(CollectiveOp::kBroadcast, count * dtypeSize(dtype), dtype);
}

std::shared_ptr<Work> LocalCommunicator::barrier() { return done(CollectiveOp::kBarrier, 0, DType::kU8); }

std::shared_ptr<Work> LocalCommunicator::send(const void*, size_t, DType, int peer, Device) {
  throw InternalError("send to rank " + std::to_string(peer) + " on a world of 1");
}

std::shared_ptr<Work> LocalCommunicator::recv(void*, size_t, DType, int peer, Device) {
  throw InternalError("recv from rank " + std::to_string(peer) + " on a world of 1");
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int, CommOptions options) {
  if (color < 0) return nullptr;
  return std::make_unique<LocalCommunicator>(std::move(options));
}

}  // namespace mt
