#pragma once
// The batch loader: persistent worker threads (num_workers, prefetch_factor batches each, like
// PyTorch's DataLoader with persistent_workers) build batches ahead of the model into a bounded
// reorder window, and next() hands them out strictly in order. Batch number `seq` counts from the
// start of training across epochs, so the loader's whole state is (seed, seq): a checkpoint stores
// the batches the model consumed — not those prefetched — and a resumed run sees the same batches.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/Allocator.h"
#include "data/RowReader.h"
#include "data/Sampler.h"
#include "core/Batch.h"

namespace mt {

// What the loader batches: a dataset that can gather examples by index. collate() is called from
// several worker threads at once, each with its own chunk cache.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t size() const = 0;
  virtual Batch collate(const std::vector<int64_t>& indices, ChunkCache* cache, Allocator& host) const = 0;
};

struct LoaderOptions {
  int64_t batchSize = 64;  // per rank
  int numWorkers = 2;      // 0: batches are built by next() in the calling thread
  int prefetchFactor = 2;  // batches in flight per worker
  bool shuffle = true;
  bool dropLast = true;    // drop the epoch's last incomplete batch
  uint64_t seed = 0;
  // Run first on every worker thread (the trainer selects its GPU there: pinned and managed
  // allocations from the workers belong to that device's context).
  std::function<void()> workerInit;
};

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batchInEpoch = 0;
};

class Loader {
 public:
  Loader(const BatchSource& source, LoaderOptions options, int rank, int worldSize,
         Allocator& host = cpuAllocator());
  // A fixed list of index batches handed out cyclically (batch seq is schedule[seq % size]), built
  // ahead by the workers like training's: the passes over a test set, the same every time.
  // options.batchSize, shuffle, dropLast and seed are not used; an epoch is the whole list.
  Loader(const BatchSource& source, std::vector<std::vector<int64_t>> schedule, LoaderOptions options,
         Allocator& host = cpuAllocator());
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batchesPerEpoch() const { return batchesPerEpoch_; }
  LoaderPosition positionOf(int64_t seq) const;
  // The next batch next() returns will be batch `seq`. Discards prefetched batches.
  void seek(int64_t seq);
  // Batch number position(); blocks until built. Rethrows an error raised while building it.
  Batch next();
  int64_t position() const { return consumed_; }
  // Consumes batch position() without building it (a caller that gathers by batchIndices itself;
  // only without workers).
  void advance();
  int numWorkers() const { return opt_.numWorkers; }
  // Seconds the last next() waited for its batch (the step's data-wait time).
  double lastWaitSeconds() const { return lastWait_; }
  // The sample indices of batch `seq` on this rank (tests, resume checks).
  std::vector<int64_t> batchIndices(int64_t seq);

 private:
  void startWorkers();
  void stopWorkers();
  void workerLoop(int worker);
  Batch build(int64_t seq, ChunkCache* cache);

  const BatchSource& source_;
  LoaderOptions opt_;
  std::unique_ptr<DistributedSampler> sampler_;      // training: the epoch's order
  std::vector<std::vector<int64_t>> schedule_;       // or a fixed, cyclic list of batches
  Allocator& host_;
  int64_t batchesPerEpoch_ = 0;

  std::mutex mutex_;
  std::condition_variable produced_, consumedCv_;
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> failed_;
  int64_t nextToClaim_ = 0;
  int64_t consumed_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
  ChunkCache inlineCache_;

  double lastWait_ = 0.0;
};

}  // namespace mt
