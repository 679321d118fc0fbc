#pragma once
// The plain types the layers hand their kernels (CPU in models/layers, CUDA in models/kernels):
// convolution and pooling geometry, the GELU form, the image input's output layout. Kept apart
// from the layer classes so the kernels' header (models/kernels/CudaLayers.h) needs no Module.

#include <cstdint>

#include "core/Fp8.h"
#include "core/Tensor.h"
#include "models/layers/Layout.h"

namespace mt {

// Conv2d: x [N,C,H,W] (or NHWC), O filters of KH x KW, square stride and zero padding.
struct Conv2dGeometry {
  Layout layout = Layout::kNHWC;
  int64_t N = 0, C = 0, H = 0, W = 0, O = 0, KH = 0, KW = 0, stride = 1, pad = 0, OH = 0, OW = 0;
  static Conv2dGeometry make(Layout layout, const Shape& x, int64_t O, int64_t k, int64_t stride,
                             int64_t pad);
  int64_t K() const { return C * KH * KW; }
  int64_t positions() const { return N * OH * OW; }
};

// MaxPool2d: kernel k, stride, no padding.
struct PoolGeometry {
  Layout layout = Layout::kNHWC;
  int64_t N = 0, C = 0, H = 0, W = 0, k = 2, stride = 2, OH = 0, OW = 0;
  static PoolGeometry make(Layout layout, const Shape& x, int64_t k, int64_t stride);
};

enum class GeluKind { kTanh, kErf };

// Where a producing kernel writes FP8 codes instead of its output (LayerNorm into an FP8 GEMM):
// q [R, C] and qt [C, R] (u8), cast with st's scale; replay: st's scale as it is and st left
// alone (activation checkpointing's recomputation), otherwise st updated as fp8Quantize would.
struct LayerNormFp8Out {
  Tensor* q = nullptr;
  Tensor* qt = nullptr;
  Fp8State* st = nullptr;
  bool replay = false;
};

enum class ImageOutput { kNHWC, kNCHW, kFlat };

}  // namespace mt
