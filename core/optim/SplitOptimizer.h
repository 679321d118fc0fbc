#pragma once
// One optimizer over segments that live on more than one device: sharding's partial offload
// (sharding.offload_fraction, DeepSpeed ZeRO-Offload++'s "twin flow") keeps the first units'
// master shards and state on the GPU and steps them there, the rest in host memory on the CPU.
//
// The segments are cut into runs [cut_k, cut_k+1); each run is a part: an ordinary optimizer
// (AdamW, SGD) whose state lives on that run's device. Everything is in the parts' terms:
//   stepSegments(first, last)  each part steps its share of [first, last) (in any order and
//                              grouping, as Optimizer allows: offload's worker steps the host part
//                              unit by unit while the training thread stepped the device part)
//   beginStep, setStepCount    every part's step count moves with the whole's (Adam's bias
//                              correction reads it)
//   stateSlice, stateNames     the part's own state (checkpoints copy segment by segment)
//   state()                    host copies of the parts' buffers concatenated (tests; not cheap)
// Results are bitwise those of one optimizer over the same segments on one device kind: each
// element's update reads only its own value, gradient and state.

#include <memory>
#include <vector>

#include "core/optim/Optimizer.h"

namespace mt {

class SplitOptimizer final : public Optimizer {
 public:
  // cuts: strictly increasing segment indices in (0, segments.size()) where a new part starts.
  SplitOptimizer(const OptimConfig& cfg, std::vector<OptimSegment> segments, const std::vector<size_t>& cuts);

  void beginStep() override;
  void setStepCount(int64_t s) override;
  std::vector<std::pair<std::string, Tensor>> state() override;
  std::vector<std::string> stateNames() override;
  Tensor stateSlice(size_t kind, size_t segment) override;
  int64_t stateBytes() override;
  void rebind(std::vector<OptimSegment> segs) override;

  size_t parts() const { return parts_.size(); }
  // The first segment of part p (parts() + 1 entries: the last is segments().size()).
  size_t partBegin(size_t p) const { return begin_.at(p); }

 protected:
  void updateSegments(float lr, size_t first, size_t last, float gradScale) override;

 private:
  size_t partOf(size_t segment) const;
  std::vector<std::unique_ptr<Optimizer>> parts_;
  std::vector<size_t> begin_;
};

// One optimizer of the given type over segments on one device (makeOptimizer's parts).
std::unique_ptr<Optimizer> makeSingleOptimizer(const OptimConfig& cfg, std::vector<OptimSegment> segments);

}  // namespace mt
