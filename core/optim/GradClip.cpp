#include "core/optim/GradClip.h"

#include <cmath>

#include "core/Parallel.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaOptim.h"
#endif

namespace mt {

#ifdef MT_WITH_CUDA
namespace {
// Every segment on the GPU: the multi-tensor kernels take them all at once.
bool allCuda(const std::vector<OptimSegment>& segments) {
  if (segments.empty()) return false;
  for (const auto& s : segments)
    if (!s.grad.device().isCuda() || !s.value.device().isCuda()) return false;
  return true;
}
}  // namespace
#endif

double sumOfSquares(const std::vector<OptimSegment>& segments) {
#ifdef MT_WITH_CUDA
  if (allCuda(segments)) return cuda::sumOfSquares(segments);
#endif
  double total = 0.0;
  for (const auto& s : segments) {
#ifdef MT_WITH_CUDA
    if (s.grad.device().isCuda()) {
      total += cuda::sumOfSquares(s.grad);
      continue;
    }
#endif
    const bool bf = s.grad.dtype() == DType::kBF16;
    const float* g = bf ? nullptr : s.grad.data<float>();
    const BFloat16* gb = bf ? s.grad.data<BFloat16>() : nullptr;
    const int64_t n = s.grad.numel();
    const int64_t blocks = (n + 4095) / 4096;
    std::vector<double> part(static_cast<size_t>(blocks), 0.0);
    parallelFor(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        double acc = 0.0;
        const int64_t e = std::min(n, (b + 1) * 4096);
        for (int64_t i = b * 4096; i < e; ++i) {
          const double x = bf ? static_cast<double>(static_cast<float>(gb[i])) : static_cast<double>(g[i]);
          acc += x * x;
        }
        part[static_cast<size_t>(b)] = acc;
      }
    });
    for (double p : part) total += p;
  }
  return total;
}

void scaleGrads(const std::vector<OptimSegment>& segments, float factor) {
#ifdef MT_WITH_CUDA
  if (allCuda(segments)) return cuda::scaleGrads(segments, factor);
#endif
  for (const auto& s : segments) {
#ifdef MT_WITH_CUDA
    if (s.grad.device().isCuda()) {
      cuda::scaleInPlace(s.grad, factor);
      continue;
    }
#endif
    if (s.grad.dtype() == DType::kBF16) {
      BFloat16* g = s.grad.data<BFloat16>();
      parallelFor(s.grad.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) g[i] = BFloat16(static_cast<float>(g[i]) * factor);
      });
      continue;
    }
    float* g = s.grad.data<float>();
    parallelFor(s.grad.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) g[i] *= factor;
    });
  }
}

void clipGradNormInPlace(const std::vector<OptimSegment>& segments, float maxNorm) {
#ifdef MT_WITH_CUDA
  if (allCuda(segments) && maxNorm > 0.f) {
    cuda::clipGradNormOnDevice(segments, maxNorm);
    return;
  }
#endif
  clipGradNorm(segments, maxNorm);
}

float clipFactor(double norm, float maxNorm) {
  if (maxNorm <= 0.f) return 1.f;
  const double coef = static_cast<double>(maxNorm) / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.f;
}

double clipGradNorm(const std::vector<OptimSegment>& segments, float maxNorm,
                    const std::function<double(double)>& allReduceSum) {
  double sq = sumOfSquares(segments);
  if (allReduceSum) sq = allReduceSum(sq);
  const double norm = std::sqrt(sq);
  const float coef = clipFactor(norm, maxNorm);
  if (coef != 1.f) scaleGrads(segments, coef);
  return norm;
}

}  // namespace mt
