#pragma once
// Int8 quantization of a sequential model (mlp, cnn): every Linear and Conv2d wrapped in a
// FakeQuantized layer (models/quant/FakeQuantized.h), and the observers' state as one unit:
//   - the activation quantization parameters by site, as the quantized ONNX export names them:
//     "<label>" the input of layer <label> (a MatMul's or Conv's activation), "<label>/out" a
//     convolution's output;
//   - the observers' state as JSON, floats as their exact bit patterns, for checkpoints (a resumed
//     QAT run continues bit-identically) and the export of a QAT checkpoint;
//   - the observed ranges packed [sites] low and high, for the trainer to reduce over data-parallel
//     ranks (minmax: min and max; ema: the mean) so that every rank quantizes alike.
// GPT has no int8 path: wrapping anything but a Sequential is a ConfigError.

#include <map>
#include <string>
#include <vector>

#include "models/Model.h"
#include "models/quant/FakeQuantized.h"

namespace mt {

class QuantizedModel {
 public:
  // Wraps the layers of `model` (which must outlive this object and keep its modules).
  QuantizedModel(Model& model, const QuantOptions& options);
  const QuantOptions& options() const { return options_; }
  size_t numSites() const { return sites_.size(); }
  // Site name -> parameters, for every observer that has seen data.
  std::map<std::string, ActivationQParams> activationParams() const;
  // Sites whose observer has seen nothing (a calibration that never reached them).
  std::vector<std::string> unobservedSites() const;

  std::string stateJson() const;
  // CheckpointError naming `where` for JSON of another model (other sites) or malformed values.
  void loadState(const std::string& json, const std::string& where);

  Tensor packedLows() const;
  Tensor packedHighs() const;
  void setPacked(const Tensor& lows, const Tensor& highs);

 private:
  struct Site {
    std::string name;
    ActivationObserver* observer;
  };
  QuantOptions options_;
  std::vector<Site> sites_;
};

}  // namespace mt
