#include "models/quant/QuantizedModel.h"

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/Check.h"
#include "models/layers/Conv2d.h"
#include "models/layers/Linear.h"

namespace mt {

using Json = nlohmann::json;

namespace {

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

QuantizedModel::QuantizedModel(Model& model, const QuantOptions& options) : options_(options) {
  auto* seq = dynamic_cast<Sequential*>(&model);
  if (!seq) throw ConfigError("int8 quantization supports the mlp and cnn models, not " + model.name());
  for (size_t i = 0; i < seq->numModules(); ++i) {
    Module& m = seq->module(i);
    Param* weight = nullptr;
    bool conv = false;
    if (auto* l = dynamic_cast<Linear*>(&m)) weight = l->weight();
    if (auto* c = dynamic_cast<Conv2d*>(&m)) weight = c->weight(), conv = true;
    if (!weight) continue;
    seq->wrapModule(i, [&](std::unique_ptr<Module> inner) {
      return std::make_unique<FakeQuantized>(std::move(inner), weight, conv, options_);
    });
    auto& fq = static_cast<FakeQuantized&>(seq->module(i));
    sites_.push_back({seq->label(i), &fq.inputObserver()});
    if (conv) sites_.push_back({seq->label(i) + "/out", fq.outputObserver()});
  }
  if (sites_.empty())
    throw ConfigError("int8 quantization: model " + model.name() + " has no linear or conv2d layer");
}

std::map<std::string, ActivationQParams> QuantizedModel::activationParams() const {
  std::map<std::string, ActivationQParams> out;
  for (const Site& s : sites_)
    if (s.observer->seen()) out[s.name] = s.observer->qparams();
  return out;
}

std::vector<std::string> QuantizedModel::unobservedSites() const {
  std::vector<std::string> out;
  for (const Site& s : sites_)
    if (!s.observer->seen()) out.push_back(s.name);
  return out;
}

std::string QuantizedModel::stateJson() const {
  Json j;
  j["observer"] = observerKindName(options_.observer);
  j["freeze_step"] = options_.freezeStep;
  Json sites = Json::array();
  for (const Site& s : sites_) {
    const ObserverState& st = s.observer->state();
    // lo/hi: the exact bits (a resume must quantize bit-identically); lo_value/hi_value: readable.
    sites.push_back({{"name", s.name},
                     {"seen", st.seen},
                     {"batches", st.batches},
                     {"lo", bitsOf(st.lo)},
                     {"hi", bitsOf(st.hi)},
                     {"lo_value", st.lo},
                     {"hi_value", st.hi}});
  }
  j["sites"] = sites;
  return j.dump();
}

void QuantizedModel::loadState(const std::string& json, const std::string& where) {
  const Json j = Json::parse(json, nullptr, false);
  auto fail = [&](const std::string& what) {
    throw CheckpointError(where + ": quantization state: " + what);
  };
  if (!j.is_object() || !j.contains("sites") || !j["sites"].is_array())
    fail("not an object with a 'sites' array");
  const Json& sites = j["sites"];
  if (sites.size() != sites_.size())
    fail(std::to_string(sites.size()) + " observed sites, this model has " + std::to_string(sites_.size()));
  std::vector<ObserverState> states(sites_.size());
  for (size_t i = 0; i < sites_.size(); ++i) {
    const Json& s = sites[i];
    if (!s.is_object() || s.value("name", std::string()) != sites_[i].name)
      fail("site " + std::to_string(i) + " is " + (s.is_object() ? s.value("name", std::string("?")) : "?") +
           ", this model's is " + sites_[i].name);
    auto bits = [&](const char* key) {
      if (!s.contains(key) || !s[key].is_number_unsigned() || s[key].get<uint64_t>() > 0xffffffffull)
        fail("site " + sites_[i].name + ": '" + key + "' must be a float's 32-bit pattern");
      return floatOf(static_cast<uint32_t>(s[key].get<uint64_t>()));
    };
    ObserverState& st = states[i];
    if (!s.contains("seen") || !s["seen"].is_boolean())
      fail("site " + sites_[i].name + ": 'seen' must be a boolean");
    if (!s.contains("batches") || !s["batches"].is_number_integer() || s["batches"].get<int64_t>() < 0)
      fail("site " + sites_[i].name + ": 'batches' must be an integer >= 0");
    st.seen = s["seen"].get<bool>();
    st.batches = s["batches"].get<int64_t>();
    st.lo = bits("lo");
    st.hi = bits("hi");
    if (st.seen && !(std::isfinite(st.lo) && std::isfinite(st.hi) && st.lo <= st.hi))
      fail("site " + sites_[i].name + ": range [" + std::to_string(st.lo) + ", " + std::to_string(st.hi) +
           "]");
  }
  for (size_t i = 0; i < sites_.size(); ++i)
    sites_[i].observer->setState(states[i]);
}

Tensor QuantizedModel::packedLows() const {
  Tensor t = Tensor::empty({static_cast<int64_t>(sites_.size())}, DType::kF32);
  for (size_t i = 0; i < sites_.size(); ++i)
    t.data<float>()[i] = sites_[i].observer->state().lo;
  return t;
}

Tensor QuantizedModel::packedHighs() const {
  Tensor t = Tensor::empty({static_cast<int64_t>(sites_.size())}, DType::kF32);
  for (size_t i = 0; i < sites_.size(); ++i)
    t.data<float>()[i] = sites_[i].observer->state().hi;
  return t;
}

void QuantizedModel::setPacked(const Tensor& lows, const Tensor& highs) {
  MT_CHECK(lows.numel() == static_cast<int64_t>(sites_.size()) && highs.numel() == lows.numel(),
           "QuantizedModel::setPacked: ", lows.str(), ", ", highs.str(), " for ", sites_.size(), " sites");
  for (size_t i = 0; i < sites_.size(); ++i) {
    ObserverState st = sites_[i].observer->state();
    st.lo = lows.data<float>()[i];
    st.hi = highs.data<float>()[i];
    sites_[i].observer->setState(st);
  }
}

}  // namespace mt
