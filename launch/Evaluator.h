#pragma once
// Evaluation on the test split: the task's fixed batches (the same every time), built by a Loader
// and sent to the device by a DeviceFeed exactly as training's batches are (pinned, managed or
// resident), forwarded without gradients, and their loss statistics summed over the ranks.

#include <functional>
#include <memory>

#include "comm/Communicator.h"
#include "core/Allocator.h"
#include "data/DeviceFeed.h"
#include "data/Loader.h"
#include "launch/Parallelism.h"
#include "launch/Task.h"
#include "models/Model.h"

namespace mt {

// (loss sum, correct, count) summed over the ranks: the figures one process would compute over the
// global batch or the whole test set. Collective.
LossStats sumOverRanks(Communicator& comm, const LossStats& local);
EvalResult evalResult(const LossStats& global);

class Evaluator {
 public:
  // loader: the training loader's options (workers, prefetch, worker init); host: where workers
  // collate (pinned or managed memory for a GPU); feed: how batches reach a CUDA device.
  Evaluator(const Task& task, const LoaderOptions& loader, Allocator& host, Device device, FeedMode feed, int rank,
            int worldSize, int64_t localBatch, int64_t microBatch);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // One pass over this rank's batches; collective (the sums over ranks). stopNow (optional) is
  // asked before each forward and must answer the same on every rank (the trainer's stop
  // agreement): true ends the pass there, stopped set, so a SIGTERM is not held up by a long test
  // set. The pass is then abandoned (the run ends; the loader is not rewound).
  EvalResult run(Model& model, Parallelism& parallelism, Communicator& world,
                 const std::function<bool()>& stopNow = {});
  int64_t batchesPerRank() const { return batches_; }
  // Forwards per pass: the same on every rank (batchesPerRank() plus padding).
  int64_t forwardsPerPass() const { return forwards_; }

 private:
  Device device_;
  int64_t batches_ = 0, forwards_ = 0;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<DeviceFeed> feed_;
};

}  // namespace mt
