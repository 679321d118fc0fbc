#include "launch/Architecture.h"

#include <set>

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

namespace mt {

namespace {

using Json = nlohmann::json;

std::string shown(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string differs(const std::string& path, const Json& stored, const Json& current) {
  return path + ": " + shown(stored) + " in the checkpoint, " + shown(current) + " in this model";
}

// Every difference below `path`, except the keys in `skip`, into `out`.
void diffInto(const Json& a, const Json& b, const std::string& path, const std::set<std::string>& skip,
              std::vector<std::string>& out) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& kv : a.items())
      keys.insert(kv.key());
    for (const auto& kv : b.items())
      keys.insert(kv.key());
    for (const auto& k : keys) {
      if (skip.count(k)) continue;
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!a.contains(k))
        out.push_back(sub + ": only in this model (" + shown(b[k]) + ")");
      else if (!b.contains(k))
        out.push_back(sub + ": only in the checkpoint (" + shown(a[k]) + ")");
      else
        diffInto(a[k], b[k], sub, skip, out);
    }
  } else if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i)
      diffInto(a[i], b[i], path + "[" + std::to_string(i) + "]", skip, out);
  } else if (a != b) {
    out.push_back(differs(path, a, b));
  }
}

bool isDropout(const Json& layer) {
  return layer.value("kind", "") == "dropout";
}

// The layers without dropout, and the dropout rates in order.
std::pair<Json, Json> splitDropout(const Json& arch) {
  Json layers = Json::array(), rates = Json::array();
  if (arch.contains("layers") && arch["layers"].is_array())
    for (const auto& l : arch["layers"])
      (isDropout(l) ? rates : layers).push_back(isDropout(l) ? l.value("p", Json()) : l);
  return {layers, rates};
}

std::string kinds(const Json& layers) {
  std::string s;
  for (const auto& l : layers)
    s += (s.empty() ? "" : " ") + l.value("kind", std::string("?"));
  return s;
}

}  // namespace

ArchitectureDiff compareArchitectures(const std::string& stored, const std::string& current) {
  ArchitectureDiff d;
  Json a = Json::parse(stored, nullptr, false), b = Json::parse(current, nullptr, false);
  if (!a.is_object() || !b.is_object()) {
    if (a != b) d.changes.push_back("architecture: unreadable record");
    return d;
  }
  const auto [la, ra] = splitDropout(a);
  const auto [lb, rb] = splitDropout(b);
  a.erase("layers");
  b.erase("layers");
  diffInto(a, b, "", {}, d.changes);
  if (ra != rb) d.notes.push_back(differs("dropout (p per layer)", ra, rb));
  if (la.size() != lb.size()) {
    d.changes.push_back("layers: " + std::to_string(la.size()) + " in the checkpoint (" + kinds(la) + "), " +
                        std::to_string(lb.size()) + " in this model (" + kinds(lb) + ")");
    return d;
  }
  for (size_t i = 0; i < la.size(); ++i) {
    const std::string label = "layers[" + lb[i].value("name", std::to_string(i)) + "]";
    if (la[i].value("kind", "") != lb[i].value("kind", "")) {
      d.changes.push_back(differs(label + ".kind", la[i].value("kind", Json()), lb[i].value("kind", Json())));
    } else if (lb[i].value("kind", "") == "image_input") {
      // The normalisation comes from the data (or model.input_mean/std): a note; the layout is not.
      diffInto(la[i], lb[i], label, {"name", "scale", "mean", "std"}, d.changes);
      diffInto(la[i], lb[i], label, {"name", "output"}, d.notes);
    } else {
      diffInto(la[i], lb[i], label, {"name", "params"}, d.changes);
    }
  }
  return d;
}

}  // namespace mt

namespace mt {

namespace {

using Json = nlohmann::json;

struct RecordReader {
  const std::string& where;
  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(where + ": architecture record: " + why);
  }
  int64_t integer(const Json& j, const char* key, int64_t lo = 1) const {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < lo ||
        j[key].get<int64_t>() > (int64_t{1} << 40))
      fail(std::string("'") + key + "' is not an integer in [" + std::to_string(lo) + ", 2^40]");
    return j[key].get<int64_t>();
  }
  float number(const Json& j, const char* key) const {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number()) fail(std::string("'") + key + "' is not a number");
    return j[key].get<float>();
  }
  std::string word(const Json& j, const char* key) const {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string()) fail(std::string("'") + key + "' is not a string");
    return j[key].get<std::string>();
  }
};

// The ModelConfig buildImageModel turns back into the layers the record lists.
ModelConfig imageModelConfig(const Json& a, const std::string& type, const RecordReader& rd) {
  ModelConfig mc;
  mc.type = type;
  mc.hidden.clear();
  mc.convChannels.clear();
  if (!a.contains("layers") || !a["layers"].is_array()) rd.fail("no layers");
  std::vector<int64_t> linears;
  bool activationSeen = false, dropoutSeen = false;
  for (const Json& l : a["layers"]) {
    const std::string kind = rd.word(l, "kind");
    if (kind == "image_input") {
      mc.inputMean = rd.number(l, "mean");
      mc.inputStd = rd.number(l, "std");
      if (!parseLayout(rd.word(l, "output"), &mc.layout)) mc.layout = Layout::kNHWC;  // flat_hwc: an MLP
    } else if (kind == "linear") {
      linears.push_back(rd.integer(l, "out_features"));
    } else if ((kind == "relu" || kind == "gelu") && !activationSeen && !linears.empty()) {
      mc.activation = kind;
      activationSeen = true;
    } else if (kind == "dropout" && !dropoutSeen) {
      mc.dropout = rd.number(l, "p");
      dropoutSeen = true;
    } else if (kind == "conv2d") {
      mc.convChannels.push_back(rd.integer(l, "out_channels"));
      mc.kernel = rd.integer(l, "kernel");
    }
  }
  if (linears.empty()) rd.fail("no linear layer");
  if (type == "mlp") mc.hidden.assign(linears.begin(), linears.end() - 1);
  else mc.fc = linears.front();
  return mc;
}

}  // namespace

RebuiltModel rebuildFromArchitecture(const std::string& architecture, const std::string& where) {
  const RecordReader rd{where};
  if (architecture.empty())
    throw CheckpointError(where + ": the checkpoint records no architecture (written by an older build); "
                                  "only `--format h5` exports it");
  const Json a = Json::parse(architecture, nullptr, false);
  if (!a.is_object() || a.value("format", "") != "meshtrain-architecture") rd.fail("not meshtrain-architecture JSON");
  RebuiltModel r;
  r.type = a.value("type", "");
  std::string current;
  try {
    if (r.type == "gpt") {
      GptConfig& g = r.gpt;
      g.layers = rd.integer(a, "n_layer");
      g.heads = rd.integer(a, "n_head");
      g.channels = rd.integer(a, "n_embd");
      g.vocab = rd.integer(a, "vocab_size");
      g.paddedVocab = rd.integer(a, "padded_vocab_size");
      g.maxT = rd.integer(a, "block_size");
      r.model = std::make_unique<Gpt>(g);
      current = describeArchitecture(*r.model, nullptr, &g);
    } else if (r.type == "mlp" || r.type == "cnn") {
      const Json in = a.value("input", Json());
      r.images.height = rd.integer(in, "height");
      r.images.width = rd.integer(in, "width");
      r.images.channels = rd.integer(in, "channels");
      r.images.numClasses = rd.integer(in, "classes");
      r.model = buildImageModel(imageModelConfig(a, r.type, rd), r.images);
      current = describeArchitecture(*r.model, &r.images, nullptr);
    } else {
      rd.fail("model type '" + r.type + "' (expected mlp, cnn or gpt)");
    }
  } catch (const ConfigError& e) {  // a builder refusing the sizes
    rd.fail(e.what());
  }
  const ArchitectureDiff d = compareArchitectures(architecture, current);
  std::vector<std::string> all = d.changes;
  all.insert(all.end(), d.notes.begin(), d.notes.end());
  if (!all.empty()) {
    std::string text;
    for (const auto& line : all) text += (text.empty() ? "" : "; ") + line;
    rd.fail("the trainer's builders do not make this model (" + text + ")");
  }
  return r;
}

}  // namespace mt
