#pragma once
// A trained model as an ONNX model (opset 17; docs/data-format.md, "ONNX models"), from what a
// checkpoint holds: the architecture record (launch/Architecture's JSON) and every parameter whole,
// in f32. The graph computes exactly the trainer's inference forward (models/), layer by layer:
//
//   mlp, cnn   input  "images"  uint8 [batch, H, W, C]   the data file's pixels, NHWC
//              output "logits"  float [batch, classes]
//     Cast -> (x · 1/(255 std) - mean/std) as ImageInput computes it; Linear -> Gemm(transB); ReLU;
//     GELU (tanh: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), or erf) from elementwise ops (opset
//     17 has no Gelu); Dropout -> nothing (inference); Conv2d / MaxPool2d -> Conv / MaxPool in NCHW:
//     an NHWC model's activations are transposed into NCHW before its first convolution and back
//     before its Flatten (which flattens H, W, C like the trainer), and its [O, KH, KW, C] filters
//     are written [O, C, KH, KW].
//   gpt        input  "tokens"  int64 [batch, sequence]   sequence <= block_size (a longer one fails
//                                                         in the position Gather)
//              output "logits"  float [batch, sequence, vocab_size]   the real vocabulary: the
//                                                         padded rows take no part, as in training
//     x = Gather(wte, tokens) + Gather(wpe, Range(0, sequence)); per block LayerNormalization
//     (eps from the record, 1e-5), qkv MatMul + bias, heads split [B, T, 3, H, d], scores
//     q k^T / sqrt(d) with the causal mask (Where(s <= t, S, lowest float)), Softmax, · v, proj +
//     residual, LayerNormalization, fc, tanh GELU, fc proj + residual; final LayerNormalization;
//     logits = x · wte[:vocab_size]^T (the tied embedding, read from the one wte initializer).
//
// Variants of the export (a quantized QDQ model) reuse the walk through the layers by passing
// OnnxExportHooks: they decide what a weight and an activation read by a MatMul/Gemm/Conv become.

#include <map>
#include <string>

#include "core/Tensor.h"
#include "export/OnnxGraph.h"

namespace mt {

// Parameters by name, each a contiguous host f32 tensor of its checkpoint shape.
using ParamMap = std::map<std::string, Tensor>;

class OnnxExportHooks {
 public:
  virtual ~OnnxExportHooks() = default;
  // The graph tensor a MatMul/Gemm/Conv reads for parameter `name` holding `w` as the graph lays it
  // out (channelAxis: its output-channel axis there, for per-channel quantization). Default: an f32
  // initializer of `w`.
  virtual std::string weight(OnnxGraph& g, const std::string& name, const Tensor& w, int channelAxis);
  // The tensor a MatMul/Gemm/Conv of layer `site` reads as its input `x`. Default: `x` itself.
  virtual std::string activation(OnnxGraph& g, const std::string& x, const std::string& site) { return x; }
  // The bias a Conv of layer `site` reads (after weight() and activation() of that layer, so a
  // quantized export can write it as int32 with scale s_x · s_w[c]). Default: an f32 initializer.
  virtual std::string bias(OnnxGraph& g, const std::string& name, const Tensor& b, const std::string& site) {
    return g.addInitializer(name, b);
  }
  // What the rest of the graph reads of a Conv's output `y` of layer `site`. Default: `y` itself.
  virtual std::string output(OnnxGraph& g, const std::string& y, const std::string& site) { return y; }
  // The output `y` of a MaxPool of layer `site`: a pooling keeps its input's values, so a quantized
  // export may mark it as still on the last output()'s grid (lets the pooling run on integers).
  virtual std::string pooled(OnnxGraph& g, const std::string& y, const std::string& site) { return y; }
};

struct OnnxExportOptions {
  int64_t opset = 17;
  std::string source;                // recorded in the model's metadata (the checkpoint)
  int64_t step = -1;                 // recorded when >= 0
  OnnxExportHooks* hooks = nullptr;  // null: the plain f32 model
};

// The graph of the model `architecture` describes with the values of `params`. `where` (the
// checkpoint) is named in a CheckpointError (exit 2) for a record this exporter cannot write (an
// unknown model type or layer kind) or a parameter that is missing or of another shape.
OnnxGraph buildOnnxModel(const std::string& architecture, const ParamMap& params,
                         const OnnxExportOptions& options, const std::string& where);

}  // namespace mt
