#pragma once
// Helpers shared by the tests.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/Tensor.h"

namespace mt::test {

// max|a - b| / max|b| over two f32 tensors of equal size (any device; copied to the host).
inline double relErr(const Tensor& a, const Tensor& b) {
  Tensor ha = a.device().isCpu() ? a : a.to(Device::cpu());
  Tensor hb = b.device().isCpu() ? b : b.to(Device::cpu());
  if (ha.dtype() != DType::kF32) ha = ha.toDType(DType::kF32);
  if (hb.dtype() != DType::kF32) hb = hb.toDType(DType::kF32);
  EXPECT_EQ(ha.numel(), hb.numel());
  const float* x = ha.data<float>();
  const float* y = hb.data<float>();
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < std::min(ha.numel(), hb.numel()); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(y[i])));
  }
  return diff / std::max(ref, 1e-30);
}

inline Tensor fromVector(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

inline Tensor randomTensor(const Shape& shape, uint64_t seed, float scale = 1.f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = scale * (static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.f * 2.f - 1.f);
  }
  return t;
}

// Path of a file the test fixture generated, from an environment variable ctest sets.
inline std::string fixturePath(const char* var) {
  const char* v = std::getenv(var);
  return v ? v : "";
}

}  // namespace mt::test
