// Max pooling. Forward: one thread per output, first maximum in (kh, kw) order wins (PyTorch's
// rule), NaN propagates; the flat H*W index of the winner is kept. Backward gathers instead of
// scattering: one thread per input element sums dy over the windows that chose it, so
// overlapping windows need no atomics and the result is deterministic.

#include "models/kernels/CudaLayers.h"
#include "models/kernels/KernelUtil.cuh"

namespace mt::cuda {

namespace {
struct Geo {
  int64_t N, C, H, W, k, s, OH, OW;
  bool nchw;
  __device__ int64_t xIndex(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return nchw ? ((n * C + c) * H + h) * W + w : ((n * H + h) * W + w) * C + c;
  }
  __device__ int64_t yIndex(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return nchw ? ((n * C + c) * OH + h) * OW + w : ((n * OH + h) * OW + w) * C + c;
  }
};

Geo geo(const PoolGeometry& g) {
  return {g.N, g.C, g.H, g.W, g.k, g.stride, g.OH, g.OW, g.layout == Layout::kNCHW};
}

__global__ void poolFwd(const float* x, float* y, int32_t* arg, Geo g) {
  const int64_t total = g.N * g.C * g.OH * g.OW;
  MT_GRID_STRIDE(i, total) {
    int64_t n, c, oh, ow;
    if (g.nchw) {
      ow = i % g.OW, oh = (i / g.OW) % g.OH, c = (i / (g.OW * g.OH)) % g.C, n = i / (g.OW * g.OH * g.C);
    } else {
      c = i % g.C, ow = (i / g.C) % g.OW, oh = (i / (g.C * g.OW)) % g.OH, n = i / (g.C * g.OW * g.OH);
    }
    float best = -INFINITY;
    int32_t bi = static_cast<int32_t>(oh * g.s * g.W + ow * g.s);
    bool nan = false;
    for (int64_t kh = 0; kh < g.k && !nan; ++kh)
      for (int64_t kw = 0; kw < g.k; ++kw) {
        const int64_t ih = oh * g.s + kh, iw = ow * g.s + kw;
        const float v = x[g.xIndex(n, c, ih, iw)];
        if (v > best || isnan(v)) {
          best = v;
          bi = static_cast<int32_t>(ih * g.W + iw);
          if (isnan(v)) {
            nan = true;
            break;
          }
        }
      }
    y[i] = best;
    if (arg) arg[i] = bi;
  }
}

__global__ void poolBwd(const float* dy, const int32_t* arg, float* dx, Geo g) {
  const int64_t total = g.N * g.C * g.H * g.W;
  MT_GRID_STRIDE(i, total) {
    int64_t n, c, ih, iw;
    if (g.nchw) {
      iw = i % g.W, ih = (i / g.W) % g.H, c = (i / (g.W * g.H)) % g.C, n = i / (g.W * g.H * g.C);
    } else {
      c = i % g.C, iw = (i / g.C) % g.W, ih = (i / (g.C * g.W)) % g.H, n = i / (g.C * g.W * g.H);
    }
    const int32_t self = static_cast<int32_t>(ih * g.W + iw);
    // Windows oh with oh*s <= ih < oh*s + k.
    const int64_t oh0 = ih >= g.k ? (ih - g.k) / g.s + 1 : 0, oh1 = min(g.OH - 1, ih / g.s);
    const int64_t ow0 = iw >= g.k ? (iw - g.k) / g.s + 1 : 0, ow1 = min(g.OW - 1, iw / g.s);
    float acc = 0.f;
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = g.yIndex(n, c, oh, ow);
        if (arg[o] == self) acc += dy[o];
      }
    dx[i] = acc;
  }
}
}  // namespace

void maxPool2dForward(Tensor& y, Tensor* argmax, const Tensor& x, const PoolGeometry& g) {
  poolFwd<<<gridFor1d(y.numel()), 256, 0, currentStream()>>>(x.data<float>(), y.data<float>(),
                                                              argmax ? argmax->data<int32_t>() : nullptr, geo(g));
  checkLaunch();
}

void maxPool2dBackward(Tensor& dx, const Tensor& dy, const Tensor& argmax, const PoolGeometry& g) {
  poolBwd<<<gridFor1d(dx.numel()), 256, 0, currentStream()>>>(dy.data<float>(), argmax.data<int32_t>(),
                                                               dx.data<float>(), geo(g));
  checkLaunch();
}

}  // namespace mt::cuda
