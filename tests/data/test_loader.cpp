#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "data/Loader.h"

namespace mt {
namespace {

// A source whose examples are their own index, with an optional delay and a poisoned index.
class CountingSource : public BatchSource {
 public:
  explicit CountingSource(int64_t n, int64_t poison = -1) : n_(n), poison_(poison) {}
  int64_t size() const override { return n_; }
  Batch collate(const std::vector<int64_t>& idx, ChunkCache*, Allocator& host) const override {
    calls++;
    Batch b;
    b.inputs = Tensor::empty({static_cast<int64_t>(idx.size())}, DType::kI64, host);
    b.targets = b.inputs;
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] == poison_) throw DataError("poisoned sample " + std::to_string(idx[i]));
      b.inputs.data<int64_t>()[i] = idx[i];
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return b;
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_, poison_;
};

std::vector<int64_t> contents(const Batch& b) {
  return std::vector<int64_t>(b.inputs.data<int64_t>(), b.inputs.data<int64_t>() + b.inputs.numel());
}

TEST(Loader, WorkersDeliverBatchesInOrderAcrossEpochs) {
  CountingSource src(100);
  for (int workers : {0, 1, 3}) {
    LoaderOptions o;
    o.batchSize = 8;
    o.numWorkers = workers;
    o.seed = 5;
    Loader loader(src, o, 0, 1);
    EXPECT_EQ(loader.batchesPerEpoch(), 12);  // 100 / 8, last partial batch dropped
    for (int64_t seq = 0; seq < 30; ++seq) {
      Batch b = loader.next();
      EXPECT_EQ(contents(b), loader.batchIndices(seq)) << "workers " << workers << " batch " << seq;
    }
    EXPECT_EQ(loader.position(), 30);
  }
}

TEST(Loader, SeekResumesTheSameSequence) {
  CountingSource src(64);
  LoaderOptions o;
  o.batchSize = 4;
  o.numWorkers = 2;
  std::vector<std::vector<int64_t>> straight;
  {
    Loader l(src, o, 1, 2);
    for (int i = 0; i < 20; ++i) straight.push_back(contents(l.next()));
  }
  Loader resumed(src, o, 1, 2);
  for (int i = 0; i < 3; ++i) resumed.next();  // prefetches well past batch 3
  resumed.seek(11);
  for (int i = 11; i < 20; ++i) EXPECT_EQ(contents(resumed.next()), straight[static_cast<size_t>(i)]);
}

TEST(Loader, PrefetchIsBounded) {
  CountingSource src(1000);
  LoaderOptions o;
  o.batchSize = 1;
  o.numWorkers = 2;
  o.prefetchFactor = 3;
  Loader l(src, o, 0, 1);
  l.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(src.calls.load(), 1 + 2 * 3);
}

TEST(Loader, WorkerErrorsReachTheConsumer) {
  CountingSource src(40, /*poison=*/7);
  LoaderOptions o;
  o.batchSize = 4;
  o.numWorkers = 2;
  o.shuffle = false;
  Loader l(src, o, 0, 1);
  l.next();  // 0..3
  EXPECT_THROW(l.next(), DataError);  // 4..7
}

TEST(Loader, ScheduleIsHandedOutCyclically) {
  CountingSource src(50);
  const std::vector<std::vector<int64_t>> schedule = {{3, 1, 4}, {15, 9}, {26, 5, 35, 8}};
  for (int workers : {0, 2}) {
    LoaderOptions opt;
    opt.numWorkers = workers;
    opt.prefetchFactor = 2;
    Loader loader(src, schedule, opt);
    EXPECT_EQ(loader.batchesPerEpoch(), 3);
    // Two passes: the same batches in the same order, sizes as listed; sampleIds are the indices.
    for (int pass = 0; pass < 2; ++pass)
      for (size_t k = 0; k < schedule.size(); ++k) {
        Batch b = loader.next();
        EXPECT_EQ(contents(b), schedule[k]) << "workers " << workers << " pass " << pass << " batch " << k;
        EXPECT_EQ(b.sampleIds, schedule[k]);
      }
    EXPECT_EQ(loader.position(), 6);
    EXPECT_EQ(loader.batchIndices(7), schedule[1]);
    loader.seek(2);
    EXPECT_EQ(contents(loader.next()), schedule[2]);
  }
  LoaderOptions opt;
  EXPECT_THROW(Loader(src, std::vector<std::vector<int64_t>>{{1, 50}}, opt), InternalError);
  EXPECT_THROW(Loader(src, std::vector<std::vector<int64_t>>{}, opt), InternalError);
}

TEST(Loader, TooSmallForOneBatch) {
  CountingSource src(10);
  LoaderOptions o;
  o.batchSize = 8;
  EXPECT_THROW(Loader(src, o, 0, 4), DataError);
}

}  // namespace
}  // namespace mt
