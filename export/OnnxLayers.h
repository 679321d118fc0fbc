#pragma once
// What the model writers of export/ share (internal to export/): the architecture record's fields,
// parameters checked against their expected shapes, and the layers that appear in several models
// (Linear as MatMul + bias, the tanh / erf GELU, LayerNormalization), each with the same float
// operations in the same order as the trainer's CPU kernels (models/layers/*).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "export/OnnxExport.h"

namespace mt {

// The walk through one model: the graph, the parameters, the hooks, and the checkpoint to name.
struct OnnxWriter {
  OnnxGraph& g;
  const ParamMap& params;
  OnnxExportHooks& hooks;
  std::string where;

  // Parameter `name`, which must exist with `shape` (a CheckpointError naming both otherwise).
  const Tensor& param(const std::string& name, const Shape& shape) const;
  // A field of the record: an integer >= lo, a number, a word (CheckpointError when absent or bad).
  int64_t integer(const nlohmann::json& j, const std::string& key, int64_t lo) const;
  double number(const nlohmann::json& j, const std::string& key) const;
  std::string word(const nlohmann::json& j, const std::string& key) const;
  [[noreturn]] void fail(const std::string& what) const;

  // An f32 scalar initializer (shared per value would save nothing measurable).
  std::string scalar(float v, const std::string& name) { return g.addScalar(name, v); }
  // y = x · W^T + b for x [..., in] and W [out, in] (the trainer's layout): W is written transposed
  // [in, out] for MatMul, which takes any leading dims; `site` names the nodes.
  std::string linear(const std::string& x, const std::string& weightName, const std::string& biasName,
                     const std::string& site);
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), or with approximate = "none" 0.5 x (1 + erf(x/sqrt 2)).
  std::string gelu(const std::string& x, bool tanh, const std::string& site);
  // LayerNormalization over the last axis with the parameters <prefix>weight / <prefix>bias.
  std::string layerNorm(const std::string& x, const std::string& prefix, int64_t channels, float eps,
                        const std::string& site);
};

// The host tensor `t` [rows, cols] transposed to [cols, rows] (f32).
Tensor transposed2d(const Tensor& t);

void addSequentialGraph(OnnxWriter& w, const nlohmann::json& arch);
void addGptGraph(OnnxWriter& w, const nlohmann::json& arch);

}  // namespace mt
