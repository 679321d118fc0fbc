#include "models/Init.h"

namespace mt {

namespace {
template <typename F>
void fillHost(Tensor& dst, F&& gen) {
  MT_CHECK(dst.dtype() == DType::kF32, "initialising ", dst.str());
  Tensor host = dst.device().isCpu() ? dst : Tensor::empty(dst.shape(), DType::kF32);
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = gen();
  if (!host.sharesStorageWith(dst)) dst.copyFrom(host);
}
}  // namespace

void initUniform(Tensor& dst, Rng& rng, float lo, float hi) {
  fillHost(dst, [&] { return rng.uniform(lo, hi); });
}
void initNormal(Tensor& dst, Rng& rng, float mean, float stddev) {
  MT_CHECK(dst.dtype() == DType::kF32, "initialising ", dst.str());
  Tensor host = dst.device().isCpu() ? dst : Tensor::empty(dst.shape(), DType::kF32);
  rng.fillNormal(host.data<float>(), host.numel(), mean, stddev);  // in parallel, the values of normal()
  if (!host.sharesStorageWith(dst)) dst.copyFrom(host);
}
void initConstant(Tensor& dst, float value) {
  fillHost(dst, [&] { return value; });
}

}  // namespace mt
