#include "comm/BucketReducer.h"

namespace mt {

void AllReduceReducer::launch(const Bucket& bucket, Tensor grads) {
  if (works_.size() <= static_cast<size_t>(bucket.index)) works_.resize(static_cast<size_t>(bucket.index) + 1);
  works_[static_cast<size_t>(bucket.index)] = comm_.allReduce(grads, ReduceOp::kAvg);
  const int64_t b = static_cast<int64_t>(grads.nbytes());
  stats_.bytesBefore += b;
  stats_.bytesAfter += b;
}

void AllReduceReducer::wait(const Bucket& bucket, Tensor) {
  works_.at(static_cast<size_t>(bucket.index))->wait(comm_.timeout());
}

std::shared_ptr<Work> AllReduceReducer::lastWork(int bucket) {
  return static_cast<size_t>(bucket) < works_.size() ? works_[static_cast<size_t>(bucket)] : nullptr;
}

CompressionStats AllReduceReducer::takeStats() {
  CompressionStats s = stats_;
  stats_ = {};
  return s;
}

}  // namespace mt
