#include "core/optim/LossScaler.h"

#include <cmath>

#include "core/optim/GradClip.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaOptim.h"
#endif

namespace mt {

bool anyNonFiniteGrad(const std::vector<OptimSegment>& segs) {
  std::vector<Tensor> device;
  bool found = false;
  for (const auto& s : segs) {
    if (!s.grad.device().isCpu()) {
      device.push_back(s.grad);
      continue;
    }
    if (s.grad.dtype() == DType::kBF16) {
      const BFloat16* g = s.grad.data<BFloat16>();
      for (int64_t i = 0; i < s.grad.numel() && !found; ++i) found = !std::isfinite(static_cast<float>(g[i]));
      continue;
    }
    const float* g = s.grad.data<float>();
    for (int64_t i = 0; i < s.grad.numel() && !found; ++i) found = !std::isfinite(g[i]);
  }
#ifdef MT_WITH_CUDA
  if (!found && !device.empty()) found = cuda::anyNonFinite(device);
#else
  MT_CHECK(device.empty(), "device gradients in a build without CUDA");
#endif
  return found;
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
