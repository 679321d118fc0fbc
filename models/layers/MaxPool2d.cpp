#include "models/layers/MaxPool2d.h"

#include <cmath>
#include <cstring>

#include "core/Parallel.h"
#include "models/kernels/Dispatch.h"

namespace mt {

PoolGeometry PoolGeometry::make(Layout layout, const Shape& x, int64_t k, int64_t stride) {
  MT_CHECK(x.size() == 4, "maxpool2d input must be 4-d, got ", shapeStr(x));
  PoolGeometry g;
  g.layout = layout;
  g.N = x[0];
  if (layout == Layout::kNCHW) g.C = x[1], g.H = x[2], g.W = x[3];
  else g.H = x[1], g.W = x[2], g.C = x[3];
  g.k = k, g.stride = stride;
  g.OH = (g.H - k) / stride + 1;
  g.OW = (g.W - k) / stride + 1;
  MT_CHECK(g.OH > 0 && g.OW > 0, "maxpool2d kernel ", k, " larger than input ", shapeStr(x));
  return g;
}

void maxPool2dForward(Tensor& y, Tensor* argmax, const Tensor& x, const PoolGeometry& g) {
  MT_DISPATCH_CUDA(x, maxPool2dForward(y, argmax, x, g));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  int32_t* ap = argmax ? argmax->data<int32_t>() : nullptr;
  // Element strides of (h, w, c) and plane base for (n, c) in either layout.
  const bool nchw = g.layout == Layout::kNCHW;
  const int64_t sh = nchw ? g.W : g.W * g.C, sw = nchw ? 1 : g.C;
  const int64_t osh = nchw ? g.OW : g.OW * g.C, osw = nchw ? 1 : g.C;
  parallelFor(g.N * g.C, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t nc = lo; nc < hi; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      const int64_t base = nchw ? nc * g.H * g.W : n * g.H * g.W * g.C + c;
      const int64_t obase = nchw ? nc * g.OH * g.OW : n * g.OH * g.OW * g.C + c;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          float best = -INFINITY;
          int32_t bestIdx = static_cast<int32_t>((oh * g.stride) * g.W + ow * g.stride);
          bool sawNan = false;
          for (int64_t kh = 0; kh < g.k && !sawNan; ++kh)
            for (int64_t kw = 0; kw < g.k; ++kw) {
              const int64_t ih = oh * g.stride + kh, iw = ow * g.stride + kw;
              const float v = xp[base + ih * sh + iw * sw];
              if (v > best || std::isnan(v)) {
                best = v;
                bestIdx = static_cast<int32_t>(ih * g.W + iw);
                if (std::isnan(v)) {
                  sawNan = true;
                  break;
                }
              }
            }
          yp[obase + oh * osh + ow * osw] = best;
          if (ap) ap[obase + oh * osh + ow * osw] = bestIdx;
        }
    }
  });
}

void maxPool2dBackward(Tensor& dx, const Tensor& dy, const Tensor& argmax, const PoolGeometry& g) {
  MT_DISPATCH_CUDA(dy, maxPool2dBackward(dx, dy, argmax, g));
  const float* dyp = dy.data<float>();
  const int32_t* ap = argmax.data<int32_t>();
  float* dxp = dx.data<float>();
  const bool nchw = g.layout == Layout::kNCHW;
  const int64_t osh = nchw ? g.OW : g.OW * g.C, osw = nchw ? 1 : g.C;
  // NHWC planes interleave, so parallelise over samples; NCHW over planes. Each thread owns whole
  // planes, so overlapping windows accumulate deterministically.
  parallelFor(g.N, 1, [&](int64_t lo, int64_t hi) {
    std::memset(dxp + lo * g.C * g.H * g.W, 0, sizeof(float) * static_cast<size_t>((hi - lo) * g.C * g.H * g.W));
    for (int64_t n = lo; n < hi; ++n)
      for (int64_t c = 0; c < g.C; ++c) {
        const int64_t obase = nchw ? (n * g.C + c) * g.OH * g.OW : n * g.OH * g.OW * g.C + c;
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t o = obase + oh * osh + ow * osw;
            const int64_t idx = ap[o];
            const int64_t ih = idx / g.W, iw = idx % g.W;
            const int64_t xi = nchw ? ((n * g.C + c) * g.H + ih) * g.W + iw : ((n * g.H + ih) * g.W + iw) * g.C + c;
            dxp[xi] += dyp[o];
          }
      }
  });
}

Shape MaxPool2d::outputShape(const Shape& in) const {
  PoolGeometry g = PoolGeometry::make(layout_, in, k_, stride_);
  return layout_ == Layout::kNCHW ? Shape{g.N, g.C, g.OH, g.OW} : Shape{g.N, g.OH, g.OW, g.C};
}

Tensor MaxPool2d::forward(const Tensor& x, Context& ctx) {
  PoolGeometry g = PoolGeometry::make(layout_, x.shape(), k_, stride_);
  Shape os = outputShape(x.shape());
  Tensor y = Tensor::empty(os, DType::kF32, x.device());
  if (ctx.training) {
    argmax_ = Tensor::empty(os, DType::kI32, x.device());
    inShape_ = x.shape();
    geom_ = g;
    maxPool2dForward(y, &argmax_, x, g);
  } else {
    maxPool2dForward(y, nullptr, x, g);
  }
  return y;
}

Tensor MaxPool2d::backward(const Tensor& dy, Context& ctx) {
  MT_CHECK(argmax_.defined(), "MaxPool2d::backward without a training forward");
  Tensor dx = Tensor::empty(inShape_, DType::kF32, dy.device());
  maxPool2dBackward(dx, dy, argmax_, geom_);
  argmax_ = Tensor();
  return dx;
}

}  // namespace mt
