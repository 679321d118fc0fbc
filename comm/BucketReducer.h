#pragma once
// How one gradient bucket is reduced across data-parallel ranks. The default averages it with one
// all-reduce; compression hooks (fp16/bf16 casts, PowerSGD, top-k) implement the same interface.
// launch() is called during backward, in bucket order (identical on all ranks), as soon as the
// bucket's last gradient is written; wait() is called before the optimizer step, in bucket order,
// and must leave the bucket holding the average gradient over ranks.

#include <memory>
#include <string>
#include <vector>

#include "comm/Communicator.h"

namespace mt {

struct Bucket {
  int index = 0;
  std::vector<int> params;  // parameter indices in layout order
  int64_t offset = 0;       // first element in the flat gradient buffer
  int64_t numel = 0;
};

struct CompressionStats {
  int64_t bytesBefore = 0;  // bytes an uncompressed all-reduce would send this step
  int64_t bytesAfter = 0;   // bytes actually reduced
  double seconds = 0.0;     // time spent compressing and decompressing
};

class BucketReducer {
 public:
  virtual ~BucketReducer() = default;
  virtual std::string name() const = 0;
  // The training step whose gradients the next launches carry (0-based; resumed runs start later).
  virtual void beginStep(int64_t step) {}
  virtual void launch(const Bucket& bucket, Tensor grads) = 0;
  virtual void wait(const Bucket& bucket, Tensor grads) = 0;
  // The Work of the bucket's (last) collective, for traces; null before its first launch.
  std::shared_ptr<Work> lastWork(int bucket) const;
  // The bucket's first collective (its start in traces) where it has several; else lastWork.
  virtual std::shared_ptr<Work> firstWork(int bucket) const { return lastWork(bucket); }
  // The bucket's inter-node phase where the reducer has one (hierarchical), for traces.
  virtual std::shared_ptr<Work> interWork(int bucket) const { return nullptr; }
  // Totals since the last call (metrics).
  CompressionStats takeStats();
  // This rank's state that a checkpoint keeps so that a resumed run continues exactly (error
  // feedback, PowerSGD's Q), by name, as host copies; empty for stateless reducers.
  virtual std::vector<std::pair<std::string, Tensor>> checkpointState() const { return {}; }
  // Puts back one entry of checkpointState(); false when this reducer has no such entry (another
  // model, method or compression.rank), which leaves it to start from scratch.
  virtual bool restoreCheckpointState(const std::string& name, const Tensor& value) { return false; }

 protected:
  void setWork(int bucket, std::shared_ptr<Work> work);
  CompressionStats stats_;

 private:
  std::vector<std::shared_ptr<Work>> works_;
};

// One all-reduce (average) per bucket.
class AllReduceReducer final : public BucketReducer {
 public:
  explicit AllReduceReducer(Communicator& comm) : comm_(comm) {}
  std::string name() const override { return "none"; }
  void launch(const Bucket& bucket, Tensor grads) override;
  void wait(const Bucket& bucket, Tensor grads) override;

 private:
  Communicator& comm_;
};

}  // namespace mt
