#pragma once
// CUDA versions of the layer functions (same names and contracts as the CPU ones in
// models/layers/*.h, which dispatch here for CUDA tensors). Launchers run on the current stream.

#include "core/Tensor.h"
#include "models/layers/Attention.h"            // AttentionSaved
#include "models/layers/KernelTypes.h"          // geometry, GeluKind, ImageOutput
#include "models/layers/SoftmaxCrossEntropy.h"  // LossStats, LossSink

namespace mt::cuda {

void linearForward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* residual);
void linearBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Tensor* dyColSum);
// db[O] += colsum(dy [N,O]) (dy f32/bf16/f16): the deterministic column-sum kernels of linearBackward.
void linearBiasGrad(Tensor& db, const Tensor& dy);
void linearGeluForward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor* b);
void linearBackwardDGelu(Tensor& dpre, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         const Tensor& pre, Tensor* dpreColSum);
void conv2dForward(Tensor& y, Tensor& col, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                   bool relu);
void conv2dBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& col,
                    const Tensor& w, const Conv2dGeometry& g);
void maxPool2dForward(Tensor& y, Tensor* argmax, const Tensor& x, const PoolGeometry& g);
void maxPool2dBackward(Tensor& dx, const Tensor& dy, const Tensor& argmax, const PoolGeometry& g);
void reluForward(Tensor& y, const Tensor& x);
void reluBackward(Tensor& dx, const Tensor& dy, const Tensor& y);
void geluForward(Tensor& y, const Tensor& x, GeluKind kind);
void geluBackward(Tensor& dx, const Tensor& dy, const Tensor& x, GeluKind kind);
void dropoutForward(Tensor& y, Tensor& mask, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                    const int64_t* rowIds);
void dropoutBackward(Tensor& dx, const Tensor& dy, const Tensor& mask, float p);
void layerNormForward(Tensor& y, Tensor* mean, Tensor* rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                      float eps);
void layerNormBackward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                       const Tensor& mean, const Tensor& rstd, const Tensor* residual, Tensor* dxLow);
// layerNormForward's y (of dtype yType), not written: cast to FP8 codes by the same kernel (models/layers/LayerNorm.h).
bool layerNormForwardFp8(const Tensor& x, const Tensor& w, const Tensor& b, Tensor* mean, Tensor* rstd, float eps,
                         DType yType, const LayerNormFp8Out& out);
LossStats softmaxCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                              int64_t validForMean, int64_t validClasses, LossSink* sink);
void attentionForward(Tensor& y, const Tensor& qkv, int64_t heads, AttentionSaved* saved,
                      AttentionBackend backend);
void attentionBackward(Tensor& dqkv, const Tensor& dy, const AttentionSaved& saved, int64_t heads);
void addInPlace(Tensor& y, const Tensor& x);
void addPositional(Tensor& x, const Tensor& wpe);
void positionalBackward(Tensor& dwpe, const Tensor& dx);
void embeddingForward(Tensor& y, const Tensor& idx, const Tensor& w);
void embeddingBackward(Tensor& dw, const Tensor& dy, const Tensor& idx);
void imageInputForward(Tensor& y, const Tensor& x, float mean, float stddev, ImageOutput out);


}  // namespace mt::cuda
