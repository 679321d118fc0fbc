#pragma once
// What the [model] section of a config describes, and the builder that turns it into a Model.

#include <memory>
#include <string>
#include <vector>

#include "core/InputSpec.h"
#include "models/Model.h"
#include "models/layers/Layout.h"

namespace mt {

struct ModelConfig {
  std::string type = "mlp";             // mlp | cnn | gpt
  std::vector<int64_t> hidden = {256, 128, 100};  // mlp hidden widths
  std::string activation = "relu";      // mlp: relu | gelu
  float dropout = 0.f;
  Layout layout = Layout::kNHWC;        // cnn activation layout
  std::vector<int64_t> convChannels = {32, 64};
  int64_t kernel = 3;
  int64_t fc = 128;                     // cnn hidden fully-connected width
  float inputMean = 0.2860f;            // Fashion-MNIST pixel statistics
  float inputStd = 0.3530f;
};

// MLP: flatten -> [Linear -> act -> Dropout] per hidden width -> Linear(numClasses).
std::unique_ptr<Sequential> buildMlp(const ModelConfig& cfg, const InputSpec& in);
// CNN: [Conv(k, pad k/2) -> ReLU -> MaxPool2] per conv channel -> Flatten -> Linear(fc) -> ReLU ->
//      Dropout -> Linear(numClasses).
std::unique_ptr<Sequential> buildCnn(const ModelConfig& cfg, const InputSpec& in);
// Builds by cfg.type (mlp, cnn); throws ConfigError for an unknown type.
std::unique_ptr<Model> buildImageModel(const ModelConfig& cfg, const InputSpec& in);

}  // namespace mt
