#pragma once
// Data parallelism over a Communicator (PyTorch DDP's reducer, in C++).
//
// Gradients live in flat buckets: the ParamTable's gradient buffer is laid out bucket by bucket,
// so each bucket is one contiguous slice and is reduced in place with no copy (with per-step
// gradients, core/ParamTable's GradLifetime::kPerStep, each bucket is a buffer of its own).
// Buckets are filled in reverse parameter order (the order backward produces gradients), the
// first capped at first_bucket_mb so communication starts early, the rest at bucket_cap_mb. A
// bucket is launched the moment its last gradient is ready — while backward still computes
// earlier layers — and buckets are launched strictly in index order, so every rank issues the same
// collectives in the same order even if its gradients become ready in another order. With
// rebuild_buckets the assignment is rebuilt after the first step from the ready order rank 0
// observed (broadcast, so identical everywhere).

#include <memory>
#include <vector>

#include "comm/BucketReducer.h"
#include "comm/Communicator.h"
#include "core/ModelHooks.h"

namespace mt {

struct DataParallelOptions {
  double bucketCapMb = 25.0;
  double firstBucketMb = 1.0;
  bool rebuildBuckets = false;
};

struct BucketTrace {
  int bucket = 0;
  int64_t bytes = 0;
  int64_t readyUs = 0;    // last gradient written, reduction launched
  int64_t startedUs = 0;  // communication began (progress thread)
  int64_t doneUs = 0;
  int64_t interStartedUs = 0, interDoneUs = 0;  // the inter-node phase (hierarchical), 0 if none
};

class DataParallel final : public ModelHooks {
 public:
  DataParallel(ParamTable& table, Communicator& comm, DataParallelOptions options);
  // Makes every replica's parameters equal to root's.
  void broadcastParameters(int root = 0);
  void setReducer(std::unique_ptr<BucketReducer> reducer);
  BucketReducer& reducer() { return *reducer_; }

  // Before each backward; sync=false accumulates locally (gradient accumulation micro-steps).
  void beginBackward(bool sync = true);
  void gradReady(Param& p) override;
  // After backward: launches what is left, waits for every bucket. Gradients are then averaged.
  void finishBackward();
  // After the optimizer step: applies a pending bucket rebuild. Returns true when the gradient
  // layout changed (whoever holds gradient views must rebind them).
  bool afterStep();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<BucketTrace>& lastTrace() const { return trace_; }
  int64_t backwardEndUs() const { return backwardEndUs_; }

 private:
  void assign(const std::vector<int>& order);
  void launch(int bucket);

  ParamTable& table_;
  Communicator& comm_;
  DataParallelOptions opt_;
  std::unique_ptr<BucketReducer> reducer_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucketOf_;        // param index -> bucket
  std::vector<int> pending_;         // per bucket: gradients not yet ready this backward
  std::vector<bool> ready_;
  std::vector<bool> seen_;           // per param: reported this backward
  int nextToLaunch_ = 0;
  bool sync_ = true;
  bool inBackward_ = false;
  bool rebuilt_ = false;
  bool rebuildPending_ = false;
  std::vector<int> readyOrder_;
  std::vector<BucketTrace> trace_;
  int64_t backwardEndUs_ = 0;
};

}  // namespace mt
