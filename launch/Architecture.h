#pragma once
// The model's architecture as JSON, recorded in every checkpoint's meta.json and written by
// `trainer export` beside the weights, so that a reader (h5py, PyTorch) rebuilds the model from the
// exported file alone (docs/data-format.md, "Exported models").

#include <memory>
#include <string>
#include <vector>

#include "models/Model.h"
#include "models/ModelConfig.h"
#include "models/gpt/Gpt.h"

namespace mt {

// Sequential models (mlp, cnn): the input (image shape, classes) and every layer in order with its
// kind, attributes and parameter names. GPT: its hyper-parameters and parameter naming.
std::string describeArchitecture(const Model& model, const InputSpec* images, const GptConfig* gpt);

// How a checkpoint's architecture (`stored`) differs from this model's (`current`), one line per
// difference ("layers[fc1].out_features: 256 in the checkpoint, 238 in this model"). `changes`:
// another model (layers, kinds, sizes, activations, GPT hyper-parameters), which no resume may
// load; `notes`: what a resume may change (dropout, which is not part of the model at inference,
// and image_input's normalisation, which comes from the data). Parameter lists are left to the
// caller's comparison of shapes.
struct ArchitectureDiff {
  std::vector<std::string> changes, notes;
};
ArchitectureDiff compareArchitectures(const std::string& stored, const std::string& current);

// The model a record describes, built by the trainer's own builders (buildImageModel, Gpt) and
// checked to describe itself as the record does; parameters registered, not materialised.
// CheckpointError naming `where` for a record it cannot rebuild (no record: a checkpoint of an
// older build; another type; a layer sequence the builders do not make).
struct RebuiltModel {
  std::unique_ptr<Model> model;
  std::string type;  // mlp | cnn | gpt
  InputSpec images;  // mlp, cnn
  GptConfig gpt;     // gpt
};
RebuiltModel rebuildFromArchitecture(const std::string& architecture, const std::string& where);

}  // namespace mt
