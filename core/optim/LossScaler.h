#pragma once
// Dynamic loss scaling for f16 training (as torch.cuda.amp.GradScaler):
//   the loss gradient is multiplied by `scale` (Context::lossScale); after backward, if any
//   gradient on ANY rank is inf/nan the step is skipped and scale *= backoff (0.5); otherwise the
//   gradients are unscaled (x 1/scale), the step is taken, and after `growthInterval` (2000)
//   clean steps in a row scale *= growth (2). Initial scale 65536.
// All ranks agree because the found-inf flag is combined with `anyRank` (a max all-reduce) —
// so every rank skips the same steps and keeps the same scale.

#include <functional>
#include <vector>

#include "core/optim/Optimizer.h"

namespace mt {

struct LossScalerOptions {
  float initScale = 65536.f;
  float growthFactor = 2.f;
  float backoffFactor = 0.5f;
  int64_t growthInterval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions o = {}) : opt_(o), scale_(o.initScale) {}
  float scale() const { return scale_; }
  // Checks and unscales the gradients. Returns false when the step must be skipped (the scale has
  // then been reduced). `anyRank` maps this rank's flag to "some rank found one".
  bool unscaleAndCheck(const std::vector<OptimSegment>& segs, const std::function<bool(bool)>& anyRank);
  // After a step that was taken.
  void update();
  // Steps skipped so far: this scaler's, plus those restored by setState (a resumed run's).
  int64_t skippedSteps() const { return skipped_; }
  int64_t cleanSteps() const { return clean_; }
  void setState(float scale, int64_t clean, int64_t skipped = 0) {
    scale_ = scale;
    clean_ = clean;
    skipped_ = skipped;
  }

 private:
  LossScalerOptions opt_;
  float scale_;
  int64_t clean_ = 0;
  int64_t skipped_ = 0;
};

// Whether any element of the tensors (f32 or bf16, any device) is inf or nan (this rank only).
bool anyNonFinite(const std::vector<Tensor>& ts);
// Whether any gradient element of the segments is inf or nan (this rank only).
bool anyNonFiniteGrad(const std::vector<OptimSegment>& segs);

}  // namespace mt
