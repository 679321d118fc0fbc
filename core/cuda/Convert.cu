// The CUDA half of convertInto (core/Convert.h): f32 <-> bf16 / f16, one grid-stride kernel per
// direction, on the current stream.

#include "core/Convert.h"
#include "core/cuda/ElementConvert.cuh"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

template <typename Src, typename Dst>
__global__ void convertKernel(const Src* in, Dst* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = fromF32<Dst>(toF32(in[i]));
}

template <typename Src, typename Dst>
void launch(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  convertKernel<<<gridFor1d(n), 256, 0, currentStream()>>>(static_cast<const Src*>(src.rawData()),
                                                            static_cast<Dst*>(dst.rawData()), n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void convertOnDevice(Tensor& dst, const Tensor& src) {
  if (src.numel() == 0) return;
  const DType s = src.dtype(), d = dst.dtype();
  if (s == DType::kF32 && d == DType::kBF16) launch<float, __nv_bfloat16>(src, dst);
  else if (s == DType::kF32 && d == DType::kF16) launch<float, __half>(src, dst);
  else if (s == DType::kBF16 && d == DType::kF32) launch<__nv_bfloat16, float>(src, dst);
  else if (s == DType::kF16 && d == DType::kF32) launch<__half, float>(src, dst);
  else MT_CHECK(false, "conversion ", dtypeName(s), " -> ", dtypeName(d), " not supported on the GPU");
}

}  // namespace mt::cuda
