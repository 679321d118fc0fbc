#include "export/OnnxQuantize.h"

#include <cmath>

#include "core/Check.h"

namespace mt {

std::string QdqHooks::weight(OnnxGraph& g, const std::string& name, const Tensor& w, int channelAxis) {
  QuantizedWeight qw = quantizeWeight(w, channelAxis);
  const std::vector<int64_t> dims(w.shape().begin(), w.shape().end());
  const int64_t C = w.dim(channelAxis);
  const std::string s = g.addInitializer(name + "_scale", OnnxType::kFloat, {C}, qw.scales.data(),
                                         qw.scales.size() * sizeof(float));
  std::string q, z;
  if (weightType_ == WeightType::kInt8) {
    q = g.addInitializer(name + "_quantized", OnnxType::kInt8, dims, qw.q.data(), qw.q.size());
    const std::vector<int8_t> zeros(static_cast<size_t>(C), 0);
    z = g.addInitializer(name + "_zero_point", OnnxType::kInt8, {C}, zeros.data(), zeros.size());
  } else {
    // The symmetric codes q in [-127, 127] stored as uint8 q + 128 with zero point 128: the same
    // values (q + 128 - 128) * s, run by ONNX Runtime's u8 x u8 kernels (see the header for why).
    std::vector<uint8_t> shifted(qw.q.size());
    for (size_t i = 0; i < shifted.size(); ++i) shifted[i] = static_cast<uint8_t>(qw.q[i] + kWeightZeroPoint);
    q = g.addInitializer(name + "_quantized", OnnxType::kUint8, dims, shifted.data(), shifted.size());
    const std::vector<uint8_t> zeros(static_cast<size_t>(C), static_cast<uint8_t>(kWeightZeroPoint));
    z = g.addInitializer(name + "_zero_point", OnnxType::kUint8, {C}, zeros.data(), zeros.size());
  }
  lastWeightScales_ = qw.scales;
  return g.add("DequantizeLinear", {q, s, z}, name + "/dequantize", {OnnxAttr::integer("axis", channelAxis)});
}

std::string QdqHooks::quantizeDequantize(OnnxGraph& g, const std::string& x, ActivationQParams p,
                                         const std::string& site) {
  const std::string s = g.addScalar(site + "/x_scale", p.scale);
  const uint8_t zp = static_cast<uint8_t>(p.zeroPoint);
  const std::string z = g.addInitializer(site + "/x_zero_point", OnnxType::kUint8, {}, &zp, 1);
  const std::string q = g.add("QuantizeLinear", {x, s, z}, site + "/quantize");
  return g.add("DequantizeLinear", {q, s, z}, site + "/dequantize");
}

std::string QdqHooks::activation(OnnxGraph& g, const std::string& x, const std::string& site) {
  const auto it = sites_.find(site);
  if (it == sites_.end())
    throw CheckpointError("export: " + where_ + ": no activation range for the input of layer " + site +
                          " (the calibration or QAT state never observed it)");
  inputScale_[site] = it->second.scale;
  onGrid_ = false;
  return quantizeDequantize(g, x, it->second, site + "/input");
}

std::string QdqHooks::bias(OnnxGraph& g, const std::string& name, const Tensor& b, const std::string& site) {
  const auto in = inputScale_.find(site);
  MT_CHECK(in != inputScale_.end() && static_cast<int64_t>(lastWeightScales_.size()) == b.numel(),
           "QdqHooks::bias of ", site, " before its input and weight");
  const int64_t C = b.numel();
  std::vector<int32_t> q(static_cast<size_t>(C));
  std::vector<float> scales(static_cast<size_t>(C));
  const float* bp = b.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    scales[c] = in->second * lastWeightScales_[c];
    const double v = std::nearbyint(static_cast<double>(bp[c]) / scales[c]);
    MT_REQUIRE(std::fabs(v) < 2147483647.0, CheckpointError, "export: ", where_, ": bias ", name, "[", c,
               "] = ", bp[c], " does not fit int32 at scale ", scales[c]);
    q[c] = static_cast<int32_t>(v);
  }
  const std::string qn = g.addInitializer(name + "_quantized", OnnxType::kInt32, {C}, q.data(), q.size() * 4);
  const std::string sn =
      g.addInitializer(name + "_scale", OnnxType::kFloat, {C}, scales.data(), scales.size() * 4);
  const std::vector<int32_t> zeros(static_cast<size_t>(C), 0);
  const std::string zn =
      g.addInitializer(name + "_zero_point", OnnxType::kInt32, {C}, zeros.data(), zeros.size() * 4);
  return g.add("DequantizeLinear", {qn, sn, zn}, name + "/dequantize", {OnnxAttr::integer("axis", 0)});
}

std::string QdqHooks::output(OnnxGraph& g, const std::string& y, const std::string& site) {
  const auto it = sites_.find(site + "/out");
  if (it == sites_.end())
    throw CheckpointError("export: " + where_ + ": no activation range for the output of layer " + site +
                          " (the calibration or QAT state never observed it)");
  onGrid_ = true;
  gridParams_ = it->second;
  return quantizeDequantize(g, y, it->second, site + "/output");
}

std::string QdqHooks::pooled(OnnxGraph& g, const std::string& y, const std::string& site) {
  return onGrid_ ? quantizeDequantize(g, y, gridParams_, site + "/output") : y;
}

}  // namespace mt
