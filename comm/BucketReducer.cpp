#include "comm/BucketReducer.h"

namespace mt {

std::shared_ptr<Work> BucketReducer::lastWork(int bucket) const {
  return bucket >= 0 && static_cast<size_t>(bucket) < works_.size() ? works_[static_cast<size_t>(bucket)]
                                                                    : nullptr;
}

CompressionStats BucketReducer::takeStats() {
  CompressionStats s = stats_;
  stats_ = {};
  return s;
}

void BucketReducer::setWork(int bucket, std::shared_ptr<Work> work) {
  if (works_.size() <= static_cast<size_t>(bucket)) works_.resize(static_cast<size_t>(bucket) + 1);
  works_[static_cast<size_t>(bucket)] = std::move(work);
}

void AllReduceReducer::launch(const Bucket& bucket, Tensor grads) {
  setWork(bucket.index, comm_.allReduce(grads, ReduceOp::kAvg));
  const int64_t b = static_cast<int64_t>(grads.nbytes());
  stats_.bytesBefore += b;
  stats_.bytesAfter += b;
}

void AllReduceReducer::wait(const Bucket& bucket, Tensor) {
  lastWork(bucket.index)->wait(comm_.timeout());
}

}  // namespace mt
