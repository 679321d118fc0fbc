#include "models/layers/Precision.h"

#include "core/Convert.h"
#include "models/Module.h"

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaRuntime.h"
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
  Tensor out = Tensor::empty(t.shape(), d, t.device());
  convertInto(out, t);
  return out;
}

DType Module::outputDType(Device d) const { return lowOutput_ ? matmulDType(d) : DType::kF32; }

}  // namespace mt
