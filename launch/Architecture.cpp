#include "launch/Architecture.h"

#include <nlohmann/json.hpp>

#include "models/gpt/Gpt.h"

namespace mt {

namespace {
nlohmann::json layerJson(const std::string& label, const Module& m) {
  nlohmann::json j = {{"name", label}, {"kind", m.kind()}};
  for (const LayerAttribute& a : m.attributes()) {
    if (!a.word.empty()) j[a.key] = a.word;
    else if (a.number == static_cast<double>(static_cast<int64_t>(a.number))) j[a.key] = static_cast<int64_t>(a.number);
    else j[a.key] = a.number;
  }
  nlohmann::json params = nlohmann::json::array();
  for (Param* p : const_cast<Module&>(m).params()) params.push_back({{"name", p->name}, {"shape", p->shape}});
  if (!params.empty()) j["params"] = params;
  return j;
}
}  // namespace

std::string describeArchitecture(const Model& model, const InputSpec* images, const GptConfig* gpt) {
  nlohmann::json j;
  j["format"] = "meshtrain-architecture";
  j["version"] = 1;
  j["type"] = model.name();
  if (const auto* seq = dynamic_cast<const Sequential*>(&model)) {
    if (images)
      j["input"] = {{"dtype", "u8"},
                    {"layout", "nhwc"},
                    {"height", images->height},
                    {"width", images->width},
                    {"channels", images->channels},
                    {"classes", images->numClasses}};
    nlohmann::json layers = nlohmann::json::array();
    for (size_t i = 0; i < seq->numModules(); ++i) layers.push_back(layerJson(seq->label(i), seq->module(i)));
    j["layers"] = layers;
    j["output"] = "logits";
  } else if (gpt) {
    // GPT-2 as in models/gpt/Gpt.h: pre-LayerNorm blocks, tanh GELU, tied wte / classifier, the
    // padded vocabulary rows outside the softmax. Linear weights are [out, in] (torch.nn.Linear),
    // not Hugging Face's Conv1D [in, out]; c_attn's output is q, k, v in that order.
    j["n_layer"] = gpt->layers;
    j["n_head"] = gpt->heads;
    j["n_embd"] = gpt->channels;
    j["vocab_size"] = gpt->vocab;
    j["padded_vocab_size"] = gpt->paddedVocab;
    j["block_size"] = gpt->maxT;
    j["layernorm_eps"] = 1e-5;
    j["gelu"] = "tanh";
    j["tied_embeddings"] = true;
    j["input"] = {{"dtype", "token ids"}, {"shape", "[batch, sequence <= block_size]"}};
    j["output"] = "logits over the first vocab_size entries";
  }
  return j.dump();
}

}  // namespace mt
