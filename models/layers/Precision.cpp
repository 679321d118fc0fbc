#include "models/layers/Precision.h"

#include "models/Module.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaRuntime.h"
#include "models/kernels/CudaLayers.h"
#endif

namespace mt {

DType matmulDType(Device device) {
#ifdef MT_WITH_CUDA
  if (device.isCuda()) {
    switch (CudaRuntime::require().matmulPrecision()) {
      case MatmulPrecision::kBF16: return DType::kBF16;
      case MatmulPrecision::kF16: return DType::kF16;
      default: return DType::kF32;
    }
  }
#endif
  return DType::kF32;
}

Tensor castTo(const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
#ifdef MT_WITH_CUDA
  if (t.device().isCuda()) {
    Tensor out = Tensor::empty(t.shape(), d, t.device());
    cuda::castTensor(out, t);
    return out;
  }
#endif
  return t.toDType(d);
}

DType Module::outputDType(Device d) const { return lowOutput_ ? matmulDType(d) : DType::kF32; }

}  // namespace mt
