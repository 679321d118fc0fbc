#include "models/layers/Conv2d.h"

#include <cmath>
#include <cstring>

#include "core/Parallel.h"
#include "models/Init.h"
#include "models/kernels/Dispatch.h"
#include "models/layers/Activation.h"
#include "core/Gemm.h"

namespace mt {

Conv2dGeometry Conv2dGeometry::make(Layout layout, const Shape& x, int64_t O, int64_t k, int64_t stride,
                                    int64_t pad) {
  MT_CHECK(x.size() == 4, "conv2d input must be 4-d, got ", shapeStr(x));
  Conv2dGeometry g;
  g.layout = layout;
  g.N = x[0];
  if (layout == Layout::kNCHW) {
    g.C = x[1], g.H = x[2], g.W = x[3];
  } else {
    g.H = x[1], g.W = x[2], g.C = x[3];
  }
  g.O = O, g.KH = k, g.KW = k, g.stride = stride, g.pad = pad;
  g.OH = (g.H + 2 * pad - k) / stride + 1;
  g.OW = (g.W + 2 * pad - k) / stride + 1;
  MT_CHECK(g.OH > 0 && g.OW > 0, "conv2d kernel ", k, " larger than padded input ", shapeStr(x));
  return g;
}

namespace {

// NCHW: col[k][n*OHW + p], k = (c*KH + kh)*KW + kw.
void im2colNchw(const float* x, float* col, const Conv2dGeometry& g) {
  const int64_t OHW = g.OH * g.OW, P = g.positions();
  parallelFor(g.K(), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t c = k / (g.KH * g.KW), kh = (k / g.KW) % g.KH, kw = k % g.KW;
      float* row = col + k * P;
      for (int64_t n = 0; n < g.N; ++n) {
        const float* plane = x + (n * g.C + c) * g.H * g.W;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.stride - g.pad + kh;
          float* out = row + n * OHW + oh * g.OW;
          if (ih < 0 || ih >= g.H) {
            std::memset(out, 0, sizeof(float) * static_cast<size_t>(g.OW));
            continue;
          }
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = ow * g.stride - g.pad + kw;
            out[ow] = (iw >= 0 && iw < g.W) ? plane[ih * g.W + iw] : 0.f;
          }
        }
      }
    }
  });
}

void col2imNchw(const float* col, float* dx, const Conv2dGeometry& g) {
  const int64_t OHW = g.OH * g.OW, P = g.positions();
  parallelFor(g.N * g.C, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t nc = lo; nc < hi; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      float* plane = dx + nc * g.H * g.W;
      std::memset(plane, 0, sizeof(float) * static_cast<size_t>(g.H * g.W));
      for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const float* row = col + ((c * g.KH + kh) * g.KW + kw) * P + n * OHW;
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            const int64_t ih = oh * g.stride - g.pad + kh;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t ow = 0; ow < g.OW; ++ow) {
              const int64_t iw = ow * g.stride - g.pad + kw;
              if (iw >= 0 && iw < g.W) plane[ih * g.W + iw] += row[oh * g.OW + ow];
            }
          }
        }
    }
  });
}

// NHWC: col[n*OHW + p][k], k = (kh*KW + kw)*C + c, so each (kh,kw) copies C contiguous floats.
void im2colNhwc(const float* x, float* col, const Conv2dGeometry& g) {
  const int64_t K = g.K();
  parallelFor(g.positions(), 64, [&](int64_t lo, int64_t hi) {
    for (int64_t pos = lo; pos < hi; ++pos) {
      const int64_t n = pos / (g.OH * g.OW), oh = (pos / g.OW) % g.OH, ow = pos % g.OW;
      float* out = col + pos * K;
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.stride - g.pad + kh;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = ow * g.stride - g.pad + kw;
          float* dst = out + (kh * g.KW + kw) * g.C;
          if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W)
            std::memset(dst, 0, sizeof(float) * static_cast<size_t>(g.C));
          else
            std::memcpy(dst, x + ((n * g.H + ih) * g.W + iw) * g.C, sizeof(float) * static_cast<size_t>(g.C));
        }
      }
    }
  });
}

void col2imNhwc(const float* col, float* dx, const Conv2dGeometry& g) {
  const int64_t K = g.K(), OHW = g.OH * g.OW;
  parallelFor(g.N, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      float* img = dx + n * g.H * g.W * g.C;
      std::memset(img, 0, sizeof(float) * static_cast<size_t>(g.H * g.W * g.C));
      for (int64_t p = 0; p < OHW; ++p) {
        const int64_t oh = p / g.OW, ow = p % g.OW;
        const float* src = col + (n * OHW + p) * K;
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t ih = oh * g.stride - g.pad + kh;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t iw = ow * g.stride - g.pad + kw;
            if (iw < 0 || iw >= g.W) continue;
            float* dst = img + (ih * g.W + iw) * g.C;
            const float* s = src + (kh * g.KW + kw) * g.C;
            for (int64_t c = 0; c < g.C; ++c) dst[c] += s[c];
          }
        }
      }
    }
  });
}

}  // namespace

namespace {
void conv2dForwardCpu(Tensor& y, Tensor& col, const Tensor& x, const Tensor& w, const Tensor* b,
                      const Conv2dGeometry& g) {
  const int64_t K = g.K(), P = g.positions(), OHW = g.OH * g.OW;
  MT_CHECK(col.numel() >= P * K, "conv2d col buffer too small");
  float* colp = col.data<float>();
  float* yp = y.data<float>();
  const float* bp = b ? b->data<float>() : nullptr;
  if (g.layout == Layout::kNHWC) {
    im2colNhwc(x.data<float>(), colp, g);
    if (bp) {
      parallelFor(P, 256, [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) std::memcpy(yp + p * g.O, bp, sizeof(float) * static_cast<size_t>(g.O));
      });
    }
    gemmCpu(Trans::kNo, Trans::kYes, P, g.O, K, 1.f, colp, w.data<float>(), bp ? 1.f : 0.f, yp);
  } else {
    im2colNchw(x.data<float>(), colp, g);
    Tensor tmp = Tensor::empty({g.O, P}, DType::kF32);
    float* t = tmp.data<float>();
    gemmCpu(Trans::kNo, Trans::kNo, g.O, P, K, 1.f, w.data<float>(), colp, 0.f, t);
    parallelFor(g.N * g.O, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t no = lo; no < hi; ++no) {
        const int64_t n = no / g.O, o = no % g.O;
        const float bias = bp ? bp[o] : 0.f;
        const float* src = t + o * P + n * OHW;
        float* dst = yp + no * OHW;
        for (int64_t p = 0; p < OHW; ++p) dst[p] = src[p] + bias;
      }
    });
  }
}
}  // namespace

void conv2dForward(Tensor& y, Tensor& col, const Tensor& x, const Tensor& w, const Tensor* b,
                   const Conv2dGeometry& g, bool relu) {
  MT_CHECK(w.numel() == g.O * g.K(), "conv2d weight ", w.str(), " does not match geometry");
  MT_DISPATCH_CUDA(x, conv2dForward(y, col, x, w, b, g, relu));
  conv2dForwardCpu(y, col, x, w, b, g);
  if (relu) reluForward(y, y);  // in place, ReLU's own kernel
}

void conv2dBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& col,
                    const Tensor& w, const Conv2dGeometry& g) {
  MT_DISPATCH_CUDA(x, conv2dBackward(dx, dw, db, dy, x, col, w, g));
  const int64_t K = g.K(), P = g.positions(), OHW = g.OH * g.OW;
  const float* colp = col.data<float>();
  const float* dyp = dy.data<float>();
  Tensor dcol = dx ? Tensor::empty({P * K}, DType::kF32) : Tensor();
  if (g.layout == Layout::kNHWC) {
    gemmCpu(Trans::kYes, Trans::kNo, g.O, K, P, 1.f, dyp, colp, 1.f, dw.data<float>());
    if (db) {
      float* dbp = db->data<float>();
      parallelFor(g.O, 8, [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          double acc = 0.0;
          for (int64_t p = 0; p < P; ++p) acc += dyp[p * g.O + o];
          dbp[o] += static_cast<float>(acc);
        }
      });
    }
    if (dx) {
      gemmCpu(Trans::kNo, Trans::kNo, P, K, g.O, 1.f, dyp, w.data<float>(), 0.f, dcol.data<float>());
      col2imNhwc(dcol.data<float>(), dx->data<float>(), g);
    }
  } else {
    // Gather dy [N,O,OHW] into [O, N*OHW] to match col's column order.
    Tensor dyT = Tensor::empty({g.O, P}, DType::kF32);
    float* t = dyT.data<float>();
    parallelFor(g.N * g.O, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t no = lo; no < hi; ++no) {
        const int64_t n = no / g.O, o = no % g.O;
        std::memcpy(t + o * P + n * OHW, dyp + no * OHW, sizeof(float) * static_cast<size_t>(OHW));
      }
    });
    gemmCpu(Trans::kNo, Trans::kYes, g.O, K, P, 1.f, t, colp, 1.f, dw.data<float>());
    if (db) {
      float* dbp = db->data<float>();
      parallelFor(g.O, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          double acc = 0.0;
          for (int64_t p = 0; p < P; ++p) acc += t[o * P + p];
          dbp[o] += static_cast<float>(acc);
        }
      });
    }
    if (dx) {
      gemmCpu(Trans::kYes, Trans::kNo, K, P, g.O, 1.f, w.data<float>(), t, 0.f, dcol.data<float>());
      col2imNchw(dcol.data<float>(), dx->data<float>(), g);
    }
  }
}

void Conv2d::registerParams(ParamTable& table, const std::string& prefix) {
  Shape ws = layout_ == Layout::kNCHW ? Shape{out_, in_, k_, k_} : Shape{out_, k_, k_, in_};
  w_ = &table.add(prefix + "weight", ws, true);
  if (hasBias_) b_ = &table.add(prefix + "bias", {out_}, false);
}

void Conv2d::initParams(Rng& rng) {
  const float bound = 1.f / std::sqrt(static_cast<float>(in_ * k_ * k_));
  initUniform(w_->value, rng, -bound, bound);
  if (b_) initUniform(b_->value, rng, -bound, bound);
}

Shape Conv2d::outputShape(const Shape& in) const {
  Conv2dGeometry g = Conv2dGeometry::make(layout_, in, out_, k_, stride_, pad_);
  return layout_ == Layout::kNCHW ? Shape{g.N, g.O, g.OH, g.OW} : Shape{g.N, g.OH, g.OW, g.O};
}

Tensor Conv2d::forward(const Tensor& x, Context& ctx) {
  Conv2dGeometry g = Conv2dGeometry::make(layout_, x.shape(), out_, k_, stride_, pad_);
  MT_CHECK(g.C == in_, "conv2d expects ", in_, " input channels, got ", x.str());
  Tensor y = Tensor::empty(outputShape(x.shape()), DType::kF32, x.device());
  // cuDNN needs no im2col buffer; the CPU path keeps it for backward.
  Tensor col = x.device().isCpu() ? Tensor::empty({g.positions() * g.K()}, DType::kF32) : Tensor();
  conv2dForward(y, col, x, w_->value, b_ ? &b_->value : nullptr, g, fusedRelu_);
  if (ctx.training) {
    x_ = x;
    col_ = col;
    geom_ = g;
  }
  return y;
}

Tensor Conv2d::backward(const Tensor& dy, Context& ctx) {
  MT_CHECK(x_.defined(), "Conv2d::backward without a training forward");
  Tensor dx = needsInputGrad_ ? Tensor::empty(x_.shape(), DType::kF32, x_.device()) : Tensor();
  conv2dBackward(dx.defined() ? &dx : nullptr, w_->grad, b_ ? &b_->grad : nullptr, dy, x_, col_, w_->value, geom_);
  clearCache();
  return dx;
}

void Conv2d::clearCache() {
  x_ = Tensor();
  col_ = Tensor();
}

int64_t Conv2d::cachedBytes() const {
  return static_cast<int64_t>((x_.defined() ? x_.nbytes() : 0) + (col_.defined() ? col_.nbytes() : 0));
}

std::vector<Param*> Conv2d::params() {
  if (b_) return {w_, b_};
  return {w_};
}

}  // namespace mt
