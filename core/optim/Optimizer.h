#pragma once
// Optimizers update flat f32 segments: a parameter, or the part of a parameter that lies in this
// rank's shard. The optimizer's state (momentum, Adam moments) is one flat buffer per kind laid out
// in segment order, so a sharded optimizer holds exactly its shard of the state and checkpoints
// are plain flat arrays.
//
// SGD (PyTorch semantics):   g' = g + wd·p;  b = g' (first step) else mu·b + g';
//                            p -= lr · (nesterov ? g' + mu·b : b)
// AdamW (PyTorch semantics): p *= 1 - lr·wd (decayed segments only);
//                            m = b1·m + (1-b1)·g;  v = b2·v + (1-b2)·g²
//                            p -= (lr / (1-b1^t)) · m / (sqrt(v) / sqrt(1-b2^t) + eps)
// On the CPU, AdamW runs core/optim/CpuAdam's fused SIMD pass (bitwise its scalar reference).
// A segment may carry a bf16 copy of its value (ZeRO-Offload's upload stage): a CPU step writes it
// from the updated value (AdamW in the same pass, SGD right after).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/Tensor.h"
#include "core/optim/CpuAdam.h"

namespace mt {

struct OptimSegment {
  Tensor value;  // flat f32
  Tensor grad;   // flat f32 or bf16 (sharding's low-precision gradient shards), same size and device
  bool decay = true;
  int64_t globalOffset = -1;  // where value starts in the model's flat parameter vector (checkpoints)
  Tensor copy{};              // optional, CPU only: bf16 [numel] that each step sets to the updated value
};

struct OptimConfig {
  std::string type = "adamw";  // sgd | adamw
  float weightDecay = 0.f;
  float momentum = 0.9f;  // sgd
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One step over every segment: beginStep() then stepSegments(lr, 0, segments().size()).
  void step(float lr);
  // The step in pieces (sharding's offload steps unit by unit, as each unit's gradients reach the
  // host): beginStep() counts the step once, then stepSegments updates segments [first, last),
  // each segment exactly once per step, in any order and grouping.
  // gradScale multiplies every gradient as the step reads it (a clip factor applied in the update's
  // own pass; the host only: the device path scales in place, clipGradNormOnDevice).
  virtual void beginStep() { ++steps_; }
  void stepSegments(float lr, size_t first, size_t last, float gradScale = 1.f) {
    checkGrads(first, last);
    updateSegments(lr, first, last, gradScale);
  }
  // Named flat state buffers, same order on every rank (a SplitOptimizer's: host copies).
  virtual std::vector<std::pair<std::string, Tensor>> state() = 0;
  // What checkpoints read and write: the state's names, and the view of kind k's state for
  // segment i (on the device that state lives on).
  virtual std::vector<std::string> stateNames();
  virtual Tensor stateSlice(size_t kind, size_t segment);
  int64_t stepCount() const { return steps_; }
  virtual void setStepCount(int64_t s) { steps_ = s; }
  virtual int64_t stateBytes();
  // New views for the same segments (sizes unchanged; state kept), after a gradient re-layout or
  // once per step where gradients live per step (their grad undefined between steps).
  virtual void rebind(std::vector<OptimSegment> segs);
  const std::vector<OptimSegment>& segments() const { return segments_; }
  // Offset of segment i in each flat state buffer.
  int64_t stateOffset(size_t i) const { return stateOffsets_.at(i); }

 protected:
  explicit Optimizer(std::vector<OptimSegment> segs);
  virtual void updateSegments(float lr, size_t first, size_t last, float gradScale) = 0;
  void checkGrads(size_t first, size_t last) const;
  std::vector<OptimSegment> segments_;
  std::vector<int64_t> stateOffsets_;  // start of each segment in the flat state
  int64_t stateNumel_ = 0;
  int64_t steps_ = 0;
};

// Throws ConfigError for an unknown type. State lives on the segments' device; segments on more
// than one device (sharding's partial offload: the first units on the GPU, the rest on the host)
// get a SplitOptimizer (core/optim/SplitOptimizer.h), one optimizer per run of one device.
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<OptimSegment> segments);

// One segment per parameter of the table, in registration order.
std::vector<OptimSegment> segmentsOf(class ParamTable& table);

// The AdamW and SGD update of one segment, shared by the CPU optimizer and the offloaded (host)
// optimizer of sharding; exposed for the kernel tests.
// g is the segment's gradient tensor (f32 or bf16); copy (may be null) receives bf16(p) in the same
// pass; isa: the CpuAdam variant (each gives bitwise the same results).
void adamwUpdateCpu(float* p, const Tensor& g, float gradScale, float* m, float* v, int64_t n, float lr, float wd, float beta1,
                    float beta2, float eps, int64_t step, CpuAdamIsa isa, BFloat16* copy = nullptr);
void sgdUpdateCpu(float* p, const Tensor& g, float gradScale, float* buf, int64_t n, float lr, float wd, float momentum,
                  bool nesterov, bool firstStep);

}  // namespace mt
