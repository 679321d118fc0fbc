#pragma once
// Element conversions for kernels templated on storage type (f32 / bf16 / f16; arithmetic in f32),
// and a dispatcher from DType to the storage type.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/Check.h"
#include "core/DType.h"

namespace mt::cuda {

template <typename T>
__device__ __forceinline__ float toF32(T v);
template <>
__device__ __forceinline__ float toF32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float toF32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float toF32<__half>(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T fromF32(float v);
template <>
__device__ __forceinline__ float fromF32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 fromF32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half fromF32<__half>(float v) { return __float2half_rn(v); }

// Calls f(T{}) with T the storage type of a floating dtype (f32, bf16, f16).
template <typename F>
void dispatchFloat(DType d, F&& f) {
  switch (d) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(__nv_bfloat16{}); return;
    case DType::kF16: f(__half{}); return;
    default: MT_CHECK(false, "kernel needs f32, bf16 or f16, got ", dtypeName(d));
  }
}

}  // namespace mt::cuda
