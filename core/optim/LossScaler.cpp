#include "core/optim/LossScaler.h"

#include <cmath>

#include "core/optim/GradClip.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaOptim.h"
#endif

namespace mt {

bool anyNonFinite(const std::vector<Tensor>& ts) {
  std::vector<Tensor> device;
  bool found = false;
  for (const Tensor& t : ts) {
    if (!t.device().isCpu()) {
      device.push_back(t);
      continue;
    }
    if (t.dtype() == DType::kBF16) {
      const BFloat16* g = t.data<BFloat16>();
      for (int64_t i = 0; i < t.numel() && !found; ++i) found = !std::isfinite(static_cast<float>(g[i]));
      continue;
    }
    const float* g = t.data<float>();
    for (int64_t i = 0; i < t.numel() && !found; ++i) found = !std::isfinite(g[i]);
  }
#ifdef MT_WITH_CUDA
  if (!found && !device.empty()) found = cuda::anyNonFinite(device);
#else
  MT_CHECK(device.empty(), "device tensors in a build without CUDA");
#endif
  return found;
}

bool anyNonFiniteGrad(const std::vector<OptimSegment>& segs) {
  std::vector<Tensor> grads;
  grads.reserve(segs.size());
  for (const auto& s : segs) grads.push_back(s.grad);
  return anyNonFinite(grads);
}

bool LossScaler::unscaleAndCheck(const std::vector<OptimSegment>& segs, const std::function<bool(bool)>& anyRank) {
  bool found = anyNonFiniteGrad(segs);
  if (anyRank) found = anyRank(found);
  if (found) {
    scale_ *= opt_.backoffFactor;
    clean_ = 0;
    ++skipped_;
    return false;
  }
  scaleGrads(segs, 1.f / scale_);
  return true;
}

void LossScaler::update() {
  if (++clean_ >= opt_.growthInterval) {
    scale_ *= opt_.growthFactor;
    clean_ = 0;
  }
}

}  // namespace mt
