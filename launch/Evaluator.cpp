#include "launch/Evaluator.h"

#include <algorithm>

namespace mt {

LossStats sumOverRanks(Communicator& comm, const LossStats& local) {
  // Counts travel as doubles, exact below 2^53.
  Tensor t = Tensor::empty({3}, DType::kF64);
  t.data<double>()[0] = local.lossSum;
  t.data<double>()[1] = static_cast<double>(local.correct);
  t.data<double>()[2] = static_cast<double>(local.count);
  comm.allReduceSync(t, ReduceOp::kSum);
  LossStats g;
  g.lossSum = t.data<double>()[0];
  g.correct = static_cast<int64_t>(t.data<double>()[1]);
  g.count = static_cast<int64_t>(t.data<double>()[2]);
  return g;
}

EvalResult evalResult(const LossStats& g) {
  EvalResult e;
  e.count = g.count;
  e.loss = g.count ? g.lossSum / static_cast<double>(g.count) : 0.0;
  e.accuracy = g.count ? static_cast<double>(g.correct) / static_cast<double>(g.count) : 0.0;
  return e;
}

Evaluator::Evaluator(const Task& task, const LoaderOptions& loader, Allocator& host, Device device, FeedMode feed,
                     int rank, int worldSize, int64_t localBatch, int64_t microBatch)
    : device_(device) {
  std::vector<std::vector<int64_t>> schedule = task.evalSchedule(rank, worldSize, localBatch, microBatch);
  batches_ = static_cast<int64_t>(schedule.size());
  // Every rank runs as many forwards as the rank with the most batches: a sharded forward
  // all-gathers every unit, so a rank with one batch more than the others would wait for them
  // forever (test examples r, r+W, ... are not a multiple of W in general: 10,000 over 24 ranks).
  // The extra batches are one example each, whose figures are dropped.
  size_t most = schedule.size();
  for (int r = 0; r < worldSize; ++r)
    if (r != rank) most = std::max(most, task.evalSchedule(r, worldSize, localBatch, microBatch).size());
  const std::vector<int64_t> padding{schedule.empty() || schedule[0].empty() ? int64_t{0} : schedule[0][0]};
  schedule.resize(most, padding);
  forwards_ = static_cast<int64_t>(most);
  LoaderOptions lo = loader;
  if (device.isCuda() && feed == FeedMode::kDevice) lo.numWorkers = 0;  // the GPU gathers
  loader_ = std::make_unique<Loader>(task.testSource(), std::move(schedule), lo, host);
  if (device.isCuda()) feed_ = std::make_unique<DeviceFeed>(feed, *loader_, device, &task.testSplit());
}

Evaluator::~Evaluator() {
  feed_.reset();
  loader_.reset();
}

EvalResult Evaluator::run(Model& model, Parallelism& parallelism, Communicator& world,
                          const std::function<bool()>& stopNow) {
  Context ctx;
  ctx.training = false;
  ctx.device = device_;
  LossStats total;
  bool stopped = false;
  for (int64_t k = 0; k < forwards_; ++k) {
    if (stopNow && stopNow()) {
      stopped = true;
      break;
    }
    const Batch b = feed_ ? feed_->next() : loader_->next();
    LossStats s = model.forward(b, ctx);
    parallelism.afterEvalForward();
    if (k >= batches_) continue;  // padding: the forward only keeps the collectives in step
    total.lossSum += s.lossSum;
    total.correct += s.correct;
    total.count += s.count;
  }
  EvalResult e = evalResult(sumOverRanks(world, total));
  e.stopped = stopped;
  return e;
}

}  // namespace mt
