#pragma once
// The tanh GELU (GPT-2's) as one set of expressions for every kernel that computes it: the CPU and
// CUDA GELU layers (models/layers/Activation, models/kernels/Elementwise.cu) and the FP8 casts that
// take GELU(pre) or dy * GELU'(pre) as their input (core/Fp8.h). The tanh itself is the caller's:
// std::tanh on the CPU, tanhf or the hardware approximation on the GPU, so these functions take
// t = tanh(geluTanhArg(v)).
//   y  = 0.5 v (1 + t),                      t = tanh(u),  u = sqrt(2/pi) (v + 0.044715 v^3)
//   y' = 0.5 (1 + t) + 0.5 v (1 - t^2) du,   du = sqrt(2/pi) (1 + 3 * 0.044715 v^2)
// The same f32 operations in the same order everywhere, so a CPU emulation and a GPU kernel with
// the same tanh give the same bits.

#ifdef __CUDACC__
#define MT_GELU_HD __host__ __device__ __forceinline__
#else
#define MT_GELU_HD inline
#endif

namespace mt {

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

MT_GELU_HD float geluTanhArg(float v) { return kGeluSqrt2OverPi * (v + kGeluCoeff * v * v * v); }

MT_GELU_HD float geluFromTanh(float v, float t) { return 0.5f * v * (1.f + t); }

MT_GELU_HD float geluGradFromTanh(float v, float t) {
  const float du = kGeluSqrt2OverPi * (1.f + 3.f * kGeluCoeff * v * v);
  return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * du;
}

}  // namespace mt
