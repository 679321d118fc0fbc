#pragma once
// The int8 QDQ variant of the ONNX export (export/OnnxExport's walk with these hooks): ONNX
// Runtime's graph optimizer fuses the QuantizeLinear / DequantizeLinear pairs into integer kernels
// (Conv -> QLinearConv, MatMul -> MatMulIntegerToFloat), and other runtimes (TensorRT) read the
// same format. Arithmetic: core/Int8.h.
//   weights   uint8 initializers "<param>_quantized" = q + 128 for the symmetric int8 codes q of
//             core/Int8.h (WeightType::kUint8, the default; kInt8: int8 q with zero points 0, for
//             CPUs with VNNI, where ORT's uint8 x int8 kernels are exact), f32 scales [C],
//             uint8 zero points [C] (128) -> DequantizeLinear(axis =
//             the graph's output-channel axis: 1 for a MatMul's [in, out] weight, 0 for a Conv's
//             [O, C, KH, KW]). The values are those of int8 weights with zero point 0, but ONNX
//             Runtime then multiplies uint8 activations by uint8 weights, which its x86 kernels
//             widen to 16 bits before multiplying. With int8 weights it picks u8 x s8 kernels, and
//             on CPUs without VNNI (AVX2, AVX-512 before Cascade Lake; AMD before Zen 4) those add
//             pairs of products in 16-bit saturating arithmetic (vpmaddubsw): 255 x 127 x 2
//             overflows, so results depend on the CPU (measured on an AVX2 EPYC: a QAT CNN's ORT
//             logits 12 % of their range off the trainer's fake-quantized forward; 0.12 % with
//             uint8 weights, as on the Xeon of earlier CI runs with int8 ones).
//   inputs    x -> QuantizeLinear(s, z uint8) -> DequantizeLinear -> MatMul / Conv, (s, z) per layer
//             from the observed range of that layer's input (site "<label>")
//   conv bias int32 b_q = round(b / (s_x s_w[c])) -> DequantizeLinear(scale s_x s_w[c], axis 0),
//             the form QLinearConv takes
//   conv out  QuantizeLinear / DequantizeLinear with the range observed at site "<label>/out", and
//             the same pair after a MaxPool of it (an identity on that grid)
// Linear biases stay f32 (added after the MatMul). A site without a range is a CheckpointError
// naming it: a calibration or QAT state that never reached that layer exports nothing.

#include <map>
#include <string>
#include <vector>

#include "core/Int8.h"
#include "export/OnnxExport.h"

namespace mt {

constexpr int kWeightZeroPoint = 128;
enum class WeightType { kUint8, kInt8 };

class QdqHooks : public OnnxExportHooks {
 public:
  // sites: activation parameters by site ("<label>" inputs, "<label>/out" conv outputs); where:
  // what to name in an error (the checkpoint and the calibration); weights: how codes are stored.
  QdqHooks(std::map<std::string, ActivationQParams> sites, std::string where,
           WeightType weights = WeightType::kUint8)
      : sites_(std::move(sites)), where_(std::move(where)), weightType_(weights) {}
  std::string weight(OnnxGraph& g, const std::string& name, const Tensor& w, int channelAxis) override;
  std::string activation(OnnxGraph& g, const std::string& x, const std::string& site) override;
  std::string bias(OnnxGraph& g, const std::string& name, const Tensor& b, const std::string& site) override;
  std::string output(OnnxGraph& g, const std::string& y, const std::string& site) override;
  // Q/DQ with the parameters of the last convolution output when only ReLU / MaxPool lie between
  // (exact: their outputs are values of that grid), so ORT pools and reshapes uint8 tensors.
  std::string pooled(OnnxGraph& g, const std::string& y, const std::string& site) override;

 private:
  std::string quantizeDequantize(OnnxGraph& g, const std::string& x, ActivationQParams p,
                                 const std::string& site);
  std::map<std::string, ActivationQParams> sites_;
  std::string where_;
  WeightType weightType_;
  // The layer being written: its input's scale and its weight's per-channel scales (for the bias).
  std::map<std::string, float> inputScale_;
  std::vector<float> lastWeightScales_;
  bool onGrid_ = false;  // the current activation is on gridParams_ (a conv output, pooled)
  ActivationQParams gridParams_;
};

}  // namespace mt
