#pragma once
// The model's architecture as JSON, recorded in every checkpoint's meta.json and written by
// `trainer export` beside the weights, so that a reader (h5py, PyTorch) rebuilds the model from the
// exported file alone (docs/data-format.md, "Exported models").

#include <string>

#include "models/Model.h"
#include "models/ModelConfig.h"

namespace mt {

struct GptConfig;

// Sequential models (mlp, cnn): the input (image shape, classes) and every layer in order with its
// kind, attributes and parameter names. GPT: its hyper-parameters and parameter naming.
std::string describeArchitecture(const Model& model, const InputSpec* images, const GptConfig* gpt);

}  // namespace mt
