// Element-wise kernels: ReLU, GELU (tanh and erf), dropout (Philox mask, the same numbers as the
// CPU path) and the image input normalisation. One thread per element, grid-stride loops.
// Math as in models/layers/Activation.h, Dropout.h and ImageInput.h.

#include <algorithm>
#include <type_traits>

#include "core/GeluMath.h"
#include "core/Random.h"
#include "core/cuda/CudaRuntime.h"

#include "core/cuda/ElementConvert.cuh"
#include "models/kernels/CudaLayers.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

__global__ void reluFwd(const float* x, float* y, int64_t n) {
  MT_GRID_STRIDE(i, n) { y[i] = x[i] > 0.f ? x[i] : (isnan(x[i]) ? x[i] : 0.f); }
}
__global__ void reluBwd(const float* dy, const float* y, float* dx, int64_t n) {
  MT_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.f ? dy[i] : 0.f; }
}
// tanh for GELU: the hardware approximation (relative error ~2^-11) where the result is stored in
// bf16/f16 anyway (rounding 2^-9 or coarser), the accurate tanhf where it is stored in f32 (the
// f32 path matches the CPU to 1e-4). tanhf was 0.6 ms per GPT-2 GELU call.
template <typename Tout>
__device__ __forceinline__ float geluTanh(float u) {
  if constexpr (std::is_same_v<Tout, float>) {
    return tanhf(u);
  } else {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
    return t;
  }
}

// x and y in f32, bf16 or f16 (reduced-precision activations between GEMMs); math in f32.
template <typename Tin, typename Tout>
__global__ void geluFwd(const Tin* x, Tout* y, int64_t n, bool tanhForm) {
  MT_GRID_STRIDE(i, n) {
    const float v = toF32(x[i]);
    if (tanhForm)
      y[i] = fromF32<Tout>(geluFromTanh(v, geluTanh<Tout>(geluTanhArg(v))));
    else y[i] = fromF32<Tout>(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
  }
}
template <typename Tdy, typename Tin, typename Tdx>
__global__ void geluBwd(const Tdy* dy, const Tin* x, Tdx* dx, int64_t n, bool tanhForm) {
  MT_GRID_STRIDE(i, n) {
    const float v = toF32(x[i]);
    float g;
    if (tanhForm) {
      g = geluGradFromTanh(v, geluTanh<Tdx>(geluTanhArg(v)));
    } else {
      g = 0.5f * (1.f + erff(v * 0.70710678118654752f)) + v * expf(-0.5f * v * v) * 0.3989422804014327f;
    }
    dx[i] = fromF32<Tdx>(toF32(dy[i]) * g);
  }
}
__global__ void dropoutFwd(const float* x, float* y, uint8_t* mask, int64_t n, float p, float scale, uint64_t seed,
                           uint64_t stream, const int64_t* rowIds, int64_t F) {
  MT_GRID_STRIDE(i, n) {
    const uint64_t c = rowIds ? static_cast<uint64_t>(rowIds[i / F] * F + i % F) : static_cast<uint64_t>(i);
    const uint8_t keep = philoxUniform(seed, stream, c) >= p ? 1 : 0;
    mask[i] = keep;
    y[i] = keep ? x[i] * scale : 0.f;
  }
}
__global__ void dropoutBwd(const float* dy, const uint8_t* mask, float* dx, int64_t n, float scale) {
  MT_GRID_STRIDE(i, n) { dx[i] = mask[i] ? dy[i] * scale : 0.f; }
}
template <typename In>
__global__ void imageIn(const In* x, float* y, int64_t N, int64_t H, int64_t W, int64_t C, float a, float c0,
                        int out, bool normalise) {
  const int64_t per = H * W * C, total = N * per;
  MT_GRID_STRIDE(idx, total) {
    const int64_t n = idx / per, i = idx % per;
    const float v = normalise ? static_cast<float>(x[idx]) * a + c0 : static_cast<float>(x[idx]);
    if (out == static_cast<int>(ImageOutput::kNCHW)) {
      const int64_t h = i / (W * C), w = (i / C) % W, c = i % C;
      y[n * per + (c * H + h) * W + w] = v;
    } else {
      y[idx] = v;
    }
  }
}
}  // namespace

void reluForward(Tensor& y, const Tensor& x) {
  reluFwd<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(x.data<float>(), y.data<float>(), x.numel());
  checkLaunch();
}
void reluBackward(Tensor& dx, const Tensor& dy, const Tensor& y) {
  reluBwd<<<gridFor1d(dy.numel()), 256, 0, currentStream()>>>(dy.data<float>(), y.data<float>(), dx.data<float>(),
                                                               dy.numel());
  checkLaunch();
}
void geluForward(Tensor& y, const Tensor& x, GeluKind kind) {
  dispatchFloat(x.dtype(), [&](auto tin) {
    using Tin = decltype(tin);
    dispatchFloat(y.dtype(), [&](auto tout) {
      using Tout = decltype(tout);
      geluFwd<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(static_cast<const Tin*>(x.rawData()),
                                                                  static_cast<Tout*>(y.rawData()), x.numel(),
                                                                  kind == GeluKind::kTanh);
    });
  });
  checkLaunch();
}
void geluBackward(Tensor& dx, const Tensor& dy, const Tensor& x, GeluKind kind) {
  dispatchFloat(x.dtype(), [&](auto tin) {
    using Tin = decltype(tin);
    dispatchFloat(dx.dtype(), [&](auto tdx) {
      using Tdx = decltype(tdx);
      dispatchFloat(dy.dtype(), [&](auto tdy) {
        using Tdy = decltype(tdy);
        geluBwd<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(static_cast<const Tdy*>(dy.rawData()),
                                                                    static_cast<const Tin*>(x.rawData()),
                                                                    static_cast<Tdx*>(dx.rawData()), x.numel(),
                                                                    kind == GeluKind::kTanh);
      });
    });
  });
  checkLaunch();
}
void dropoutForward(Tensor& y, Tensor& mask, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                    const int64_t* rowIds) {
  const int64_t N = std::max<int64_t>(1, x.dim(0)), F = x.numel() / N;
  Tensor ids;
  if (rowIds) {
    // N ids, a few KB, uploaded through pinned memory on the compute stream: asynchronous (the
    // pageable copy it replaces synchronised the stream in every training step, so the host's
    // launches of the next layers no longer overlapped the GPU). The pinned block returns to its
    // cache behind an event on this stream.
    Tensor host = Tensor::empty({N}, DType::kI64, CudaRuntime::require().pinned());
    std::copy(rowIds, rowIds + N, host.data<int64_t>());
    ids = Tensor::empty({N}, DType::kI64, x.device());
    CUDA_CHECK(cudaMemcpyAsync(ids.rawData(), host.rawData(), host.nbytes(), cudaMemcpyHostToDevice, currentStream()));
  }
  dropoutFwd<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(
      x.data<float>(), y.data<float>(), mask.data<uint8_t>(), x.numel(), p, 1.f / (1.f - p), seed, stream,
      ids.defined() ? ids.data<int64_t>() : nullptr, F);
  checkLaunch();
}
void dropoutBackward(Tensor& dx, const Tensor& dy, const Tensor& mask, float p) {
  dropoutBwd<<<gridFor1d(dy.numel()), 256, 0, currentStream()>>>(dy.data<float>(), mask.data<uint8_t>(),
                                                                  dx.data<float>(), dy.numel(), 1.f / (1.f - p));
  checkLaunch();
}
void imageInputForward(Tensor& y, const Tensor& x, float mean, float stddev, ImageOutput out) {
  const int64_t N = x.dim(0), H = x.dim(1), W = x.dim(2), C = x.dim(3);
  const float a = 1.f / (255.f * stddev), c0 = -mean / stddev;
  if (x.dtype() == DType::kU8)
    imageIn<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(x.data<uint8_t>(), y.data<float>(), N, H, W, C, a,
                                                                c0, static_cast<int>(out), true);
  else
    imageIn<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(x.data<float>(), y.data<float>(), N, H, W, C, a, c0,
                                                                static_cast<int>(out), false);
  checkLaunch();
}

}  // namespace mt::cuda
