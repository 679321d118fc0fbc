#include "models/Init.h"

namespace mt {

namespace {
// fill(p, n) writes the n values of dst in host memory (dst's own when it lives there).
template <typename F>
void fillHost(Tensor& dst, F&& fill) {
  MT_CHECK(dst.dtype() == DType::kF32, "initialising ", dst.str());
  Tensor host = dst.device().isCpu() ? dst : Tensor::empty(dst.shape(), DType::kF32);
  fill(host.data<float>(), host.numel());
  if (!host.sharesStorageWith(dst)) dst.copyFrom(host);
}
template <typename G>
void fillEach(Tensor& dst, G&& gen) {
  fillHost(dst, [&](float* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      p[i] = gen();
  });
}
}  // namespace

void initUniform(Tensor& dst, Rng& rng, float lo, float hi) {
  fillEach(dst, [&] { return rng.uniform(lo, hi); });
}
void initNormal(Tensor& dst, Rng& rng, float mean, float stddev) {
  // In parallel, the values normal() would draw one by one.
  fillHost(dst, [&](float* p, int64_t n) { rng.fillNormal(p, n, mean, stddev); });
}
void initConstant(Tensor& dst, float value) {
  fillEach(dst, [&] { return value; });
}

}  // namespace mt
