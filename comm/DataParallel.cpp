#include "comm/DataParallel.h"

#include <algorithm>

#include "core/Log.h"
#include "core/Timer.h"

namespace mt {

DataParallel::DataParallel(ParamTable& table, Communicator& comm, DataParallelOptions options)
    : table_(table), comm_(comm), opt_(options), reducer_(std::make_unique<AllReduceReducer>(comm)) {
  MT_CHECK(table_.materialized(), "DataParallel over a table that is not materialized");
  std::vector<int> order;
  for (size_t i = table_.size(); i-- > 0;) order.push_back(static_cast<int>(i));
  assign(order);
}

void DataParallel::setReducer(std::unique_ptr<BucketReducer> reducer) { reducer_ = std::move(reducer); }

void DataParallel::assign(const std::vector<int>& order) {
  const size_t es = dtypeSize(table_.dtype());
  buckets_.clear();
  bucketOf_.assign(table_.size(), -1);
  std::vector<int64_t> offsets(table_.size(), 0);
  int64_t cursor = 0;
  Bucket current;
  int64_t currentBytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    current.index = static_cast<int>(buckets_.size());
    buckets_.push_back(current);
    current = Bucket();
    current.offset = cursor;
    currentBytes = 0;
  };
  for (int pi : order) {
    const Param& p = table_[static_cast<size_t>(pi)];
    const double cap = (buckets_.empty() ? opt_.firstBucketMb : opt_.bucketCapMb) * 1024.0 * 1024.0;
    current.params.push_back(pi);
    offsets[static_cast<size_t>(pi)] = cursor;
    bucketOf_[static_cast<size_t>(pi)] = static_cast<int>(buckets_.size());
    const int64_t span = alignParam(p.numel());  // keeps every gradient 256-byte aligned
    cursor += span;
    current.numel += span;
    currentBytes += span * static_cast<int64_t>(es);
    if (static_cast<double>(currentBytes) >= cap) close();
  }
  close();
  std::vector<GradRange> groups;  // a bucket is one gradient buffer where gradients live per step
  for (const Bucket& b : buckets_)
    groups.push_back({b.offset, b.numel});
  table_.setGradLayout(offsets, std::move(groups));
  pending_.assign(buckets_.size(), 0);
  ready_.assign(buckets_.size(), false);
  seen_.assign(table_.size(), false);
}

void DataParallel::broadcastParameters(int root) {
  if (comm_.size() == 1) return;
  Tensor v = table_.flatValues();
  comm_.broadcast(v, root)->wait(comm_.timeout());
}

void DataParallel::beginBackward(bool sync) {
  sync_ = sync;
  inBackward_ = true;
  nextToLaunch_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = static_cast<int>(buckets_[b].params.size());
    ready_[b] = false;
  }
  std::fill(seen_.begin(), seen_.end(), false);
  readyOrder_.clear();
  trace_.assign(buckets_.size(), BucketTrace());
}

void DataParallel::gradReady(Param& p) {
  if (!inBackward_) return;
  const size_t pi = static_cast<size_t>(p.index);
  MT_CHECK(!seen_[pi], "gradient of ", p.name, " reported ready twice in one backward");
  seen_[pi] = true;
  if (!rebuilt_ && opt_.rebuildBuckets) readyOrder_.push_back(p.index);
  if (!sync_) return;
  const int b = bucketOf_[pi];
  if (--pending_[static_cast<size_t>(b)] == 0) {
    ready_[static_cast<size_t>(b)] = true;
    while (nextToLaunch_ < static_cast<int>(buckets_.size()) && ready_[static_cast<size_t>(nextToLaunch_)])
      launch(nextToLaunch_++);
  }
}

void DataParallel::launch(int b) {
  const Bucket& bucket = buckets_[static_cast<size_t>(b)];
  BucketTrace& t = trace_[static_cast<size_t>(b)];
  t.bucket = b;
  t.bytes = bucket.numel * static_cast<int64_t>(dtypeSize(table_.dtype()));
  t.readyUs = wallMicros();
  reducer_->launch(bucket, table_.gradSlice(bucket.offset, bucket.numel));
}

void DataParallel::finishBackward() {
  MT_CHECK(inBackward_, "finishBackward() without beginBackward()");
  backwardEndUs_ = wallMicros();
  inBackward_ = false;
  if (!sync_) return;
  // Parameters that got no gradient this step (unused in forward) still take part, with zeros,
  // so that every rank launches every bucket (per-step gradient buffers made for them now).
  table_.needAllGrads();
  while (nextToLaunch_ < static_cast<int>(buckets_.size())) launch(nextToLaunch_++);
  for (const Bucket& bucket : buckets_) {
    reducer_->wait(bucket, table_.gradSlice(bucket.offset, bucket.numel));
    BucketTrace& t = trace_[static_cast<size_t>(bucket.index)];
    if (auto w = reducer_->firstWork(bucket.index)) t.startedUs = w->record().startedUs;
    if (auto w = reducer_->lastWork(bucket.index)) t.doneUs = w->record().completedUs;
    if (auto w = reducer_->interWork(bucket.index)) {
      CollectiveRecord r = w->record();
      t.interStartedUs = r.startedUs;
      t.interDoneUs = r.completedUs;
    }
  }
  if (opt_.rebuildBuckets && !rebuilt_) rebuildPending_ = true;
}

bool DataParallel::afterStep() {
  if (!rebuildPending_) return false;
  rebuildPending_ = false;
  rebuilt_ = true;
  // Rank 0's observed order, completed with any parameter it did not see, then made common.
  std::vector<int> order = readyOrder_;
  std::vector<bool> present(table_.size(), false);
  for (int i : order) present[static_cast<size_t>(i)] = true;
  for (size_t i = table_.size(); i-- > 0;)
    if (!present[i]) order.push_back(static_cast<int>(i));
  Tensor t = Tensor::empty({static_cast<int64_t>(order.size())}, DType::kI32);
  std::copy(order.begin(), order.end(), t.data<int32_t>());
  if (comm_.size() > 1) comm_.broadcast(t, 0)->wait(comm_.timeout());
  order.assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  const size_t before = buckets_.size();
  assign(order);
  MT_LOG_DEBUG << "buckets rebuilt from the observed gradient order: " << before << " -> " << buckets_.size();
  return true;
}

}  // namespace mt
