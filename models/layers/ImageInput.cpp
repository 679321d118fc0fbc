#include "models/layers/ImageInput.h"

#include "core/Parallel.h"
#include "models/kernels/Dispatch.h"

namespace mt {

void imageInputForward(Tensor& y, const Tensor& x, float mean, float stddev, ImageOutput out) {
  MT_CHECK(x.ndim() == 4, "image input must be [N,H,W,C], got ", x.str());
  MT_DISPATCH_CUDA(x, imageInputForward(y, x, mean, stddev, out));
  const int64_t N = x.dim(0), H = x.dim(1), W = x.dim(2), C = x.dim(3);
  const int64_t per = H * W * C;
  float* yp = y.data<float>();
  const bool isU8 = x.dtype() == DType::kU8;
  const uint8_t* xu = isU8 ? x.data<uint8_t>() : nullptr;
  const float* xf = isU8 ? nullptr : x.data<float>();
  const float a = 1.f / (255.f * stddev), c0 = -mean / stddev;
  parallelFor(N, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n)
      for (int64_t i = 0; i < per; ++i) {
        const float v = isU8 ? static_cast<float>(xu[n * per + i]) * a + c0 : xf[n * per + i];
        if (out == ImageOutput::kNCHW) {
          const int64_t h = i / (W * C), w = (i / C) % W, c = i % C;
          yp[n * per + (c * H + h) * W + w] = v;
        } else {
          yp[n * per + i] = v;
        }
      }
  });
}

Shape ImageInput::outputShape(const Shape& in) const {
  MT_CHECK(in.size() == 4, "image input must be [N,H,W,C], got ", shapeStr(in));
  if (out_ == ImageOutput::kFlat) return {in[0], in[1] * in[2] * in[3]};
  if (out_ == ImageOutput::kNCHW) return {in[0], in[3], in[1], in[2]};
  return in;
}

Tensor ImageInput::forward(const Tensor& x, Context& ctx) {
  Tensor y = Tensor::empty(outputShape(x.shape()), DType::kF32, x.device());
  imageInputForward(y, x, mean_, std_, out_);
  return y;
}

Shape Flatten::outputShape(const Shape& in) const {
  int64_t rest = 1;
  for (size_t i = 1; i < in.size(); ++i) rest *= in[i];
  return {in[0], rest};
}

Tensor Flatten::forward(const Tensor& x, Context& ctx) {
  inShape_ = x.shape();
  return x.view(outputShape(x.shape()));
}

Tensor Flatten::backward(const Tensor& dy, Context& ctx) { return dy.view(inShape_); }

}  // namespace mt
