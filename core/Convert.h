#pragma once
// The one element-wise dtype conversion of the tree: dst <- src, same number of elements, same
// device. CPU: between f32, f64, bf16 and f16 (round to nearest even), i32 <-> i64 and u8 -> f32.
// CUDA: f32 <-> bf16 / f16, on the current stream. Equal dtypes copy. Anything else is an
// InternalError naming both dtypes. Tensor::toDType, the gradient compressors' casts, sharding's
// gather and reduce dtypes and the layers' matmul-precision operands all go through it.

#include "core/Tensor.h"

namespace mt {

void convertInto(Tensor& dst, const Tensor& src);

namespace cuda {
// The CUDA half of convertInto (core/cuda/Convert.cu), in CUDA builds.
void convertOnDevice(Tensor& dst, const Tensor& src);
}  // namespace cuda

}  // namespace mt
