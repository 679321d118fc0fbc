// Embedding lookup y[n,:] = W[idx[n],:] and its backward dW[idx[n],:] += dy[n,:] (accumulates).
// The backward uses float atomics: rows that share an index are summed in an unspecified order,
// so dW can differ in the last bits between runs (the CPU path is deterministic).

#include "models/kernels/CudaLayers.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {
template <typename I>
__global__ void embFwd(const float* w, const I* idx, float* y, int64_t N, int64_t D, int64_t V, int* bad) {
  MT_GRID_STRIDE(i, N * D) {
    const int64_t n = i / D, d = i % D;
    const int64_t k = static_cast<int64_t>(idx[n]);
    if (k < 0 || k >= V) {
      *bad = 1;
      y[i] = 0.f;
    } else {
      y[i] = w[k * D + d];
    }
  }
}
template <typename I>
__global__ void embBwd(float* dw, const I* idx, const float* dy, int64_t N, int64_t D) {
  MT_GRID_STRIDE(i, N * D) {
    const int64_t n = i / D, d = i % D;
    atomicAdd(&dw[static_cast<int64_t>(idx[n]) * D + d], dy[i]);
  }
}
}  // namespace

void embeddingForward(Tensor& y, const Tensor& idx, const Tensor& w) {
  const int64_t V = w.dim(0), D = w.dim(1), N = idx.numel();
  Tensor i = idx.device() == w.device() ? idx : idx.to(w.device());
  Tensor bad = Tensor::zeros({1}, DType::kI32, w.device());
  if (i.dtype() == DType::kI64)
    embFwd<<<gridFor1d(N * D), 256, 0, currentStream()>>>(w.data<float>(), i.data<int64_t>(), y.data<float>(), N, D,
                                                          V, bad.data<int32_t>());
  else
    embFwd<<<gridFor1d(N * D), 256, 0, currentStream()>>>(w.data<float>(), i.data<int32_t>(), y.data<float>(), N, D,
                                                          V, bad.data<int32_t>());
  checkLaunch();
  Tensor hostBad = bad.to(Device::cpu());
  if (hostBad.data<int32_t>()[0])
    throw DataError("embedding index out of range for vocabulary " + std::to_string(V));
}

void embeddingBackward(Tensor& dw, const Tensor& dy, const Tensor& idx) {
  const int64_t D = dw.dim(1), N = idx.numel();
  Tensor i = idx.device() == dw.device() ? idx : idx.to(dw.device());
  if (i.dtype() == DType::kI64)
    embBwd<<<gridFor1d(N * D), 256, 0, currentStream()>>>(dw.data<float>(), i.data<int64_t>(), dy.data<float>(), N, D);
  else
    embBwd<<<gridFor1d(N * D), 256, 0, currentStream()>>>(dw.data<float>(), i.data<int32_t>(), dy.data<float>(), N, D);
  checkLaunch();
}

}  // namespace mt::cuda
