#pragma once
// The dtype matrix products take on a device: f32 on the CPU and in f32 matmul precision; bf16 or
// f16 on CUDA in reduced matmul precision (CudaRuntime::matmulPrecision). Layers that produce
// activations in that dtype let the next GEMM read them without a cast.

#include "core/Tensor.h"

namespace mt {

DType matmulDType(Device device);
// t in dtype d (the tensor itself when it already is); device-side conversion on CUDA.
Tensor castTo(const Tensor& t, DType d);

}  // namespace mt
