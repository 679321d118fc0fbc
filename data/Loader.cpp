#include "data/Loader.h"

#include "core/Check.h"
#include "core/Timer.h"

namespace mt {

Loader::Loader(const BatchSource& source, LoaderOptions options, int rank, int worldSize, Allocator& host)
    : source_(source),
      opt_(options),
      sampler_(std::make_unique<DistributedSampler>(source.size(), rank, worldSize, options.shuffle, options.seed,
                                                    /*dropLast=*/options.dropLast)),
      host_(host) {
  MT_REQUIRE(opt_.batchSize > 0, ConfigError, "batch size per rank must be positive, got ", opt_.batchSize);
  const int64_t per = sampler_->samplesPerRank();
  batchesPerEpoch_ = opt_.dropLast ? per / opt_.batchSize : (per + opt_.batchSize - 1) / opt_.batchSize;
  MT_REQUIRE(batchesPerEpoch_ > 0, DataError, "dataset of ", source.size(), " samples gives ", per,
             " per rank, fewer than one batch of ", opt_.batchSize);
  startWorkers();
}

Loader::Loader(const BatchSource& source, std::vector<std::vector<int64_t>> schedule, LoaderOptions options,
               Allocator& host)
    : source_(source), opt_(std::move(options)), schedule_(std::move(schedule)), host_(host) {
  MT_REQUIRE(!schedule_.empty(), InternalError, "a loader schedule needs at least one batch");
  for (const auto& batch : schedule_)
    for (int64_t i : batch)
      MT_REQUIRE(i >= 0 && i < source.size(), InternalError, "schedule index ", i, " outside a source of ",
                 source.size());
  batchesPerEpoch_ = static_cast<int64_t>(schedule_.size());
  startWorkers();
}

Loader::~Loader() { stopWorkers(); }

LoaderPosition Loader::positionOf(int64_t seq) const { return {seq / batchesPerEpoch_, seq % batchesPerEpoch_}; }

std::vector<int64_t> Loader::batchIndices(int64_t seq) {
  LoaderPosition p = positionOf(seq);
  if (!sampler_) return schedule_[static_cast<size_t>(p.batchInEpoch)];
  const int64_t lo = p.batchInEpoch * opt_.batchSize;
  const int64_t hi = std::min<int64_t>(lo + opt_.batchSize, sampler_->samplesPerRank());
  return sampler_->indices(p.epoch, lo, hi);
}

Batch Loader::build(int64_t seq, ChunkCache* cache) {
  std::vector<int64_t> idx = batchIndices(seq);
  Batch b = source_.collate(idx, cache, host_);
  b.sampleIds = std::move(idx);
  return b;
}

void Loader::startWorkers() {
  stop_ = false;
  nextToClaim_ = consumed_;
  for (int w = 0; w < opt_.numWorkers; ++w) workers_.emplace_back([this, w] { workerLoop(w); });
}

void Loader::stopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  consumedCv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  ready_.clear();
  failed_.clear();
}

void Loader::seek(int64_t seq) {
  stopWorkers();
  consumed_ = seq;
  startWorkers();
}

void Loader::workerLoop(int) {
  if (opt_.workerInit) opt_.workerInit();
  ChunkCache cache;
  const int64_t window = static_cast<int64_t>(opt_.numWorkers) * opt_.prefetchFactor;
  while (true) {
    int64_t seq;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      consumedCv_.wait(lock, [&] { return stop_ || nextToClaim_ < consumed_ + window; });
      if (stop_) return;
      seq = nextToClaim_++;
    }
    try {
      Batch b = build(seq, &cache);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(seq, std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      failed_.emplace(seq, std::current_exception());
    }
    produced_.notify_all();
  }
}

void Loader::advance() {
  MT_CHECK(opt_.numWorkers == 0, "Loader::advance() with worker threads");
  ++consumed_;
}

Batch Loader::next() {
  Stopwatch wait;
  Batch b;
  if (opt_.numWorkers == 0) {
    b = build(consumed_, &inlineCache_);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    produced_.wait(lock, [&] { return ready_.count(consumed_) || failed_.count(consumed_); });
    auto f = failed_.find(consumed_);
    if (f != failed_.end()) {
      std::exception_ptr e = f->second;
      failed_.erase(f);
      std::rethrow_exception(e);
    }
    auto it = ready_.find(consumed_);
    b = std::move(it->second);
    ready_.erase(it);
  }
  lastWait_ = wait.elapsed();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++consumed_;
  }
  consumedCv_.notify_all();
  return b;
}

}  // namespace mt
