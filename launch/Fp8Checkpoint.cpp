#include "launch/Fp8Checkpoint.h"

#include <cstring>

#include "core/Log.h"

namespace mt {

void packFp8States(Model& model, TrainState& st) {
  st.fp8Names.clear();
  st.fp8.clear();
  for (auto& [name, state] : model.fp8States()) {
    st.fp8Names.push_back(name);
    st.fp8.push_back(state->casts());
    for (float v : state->read()) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      st.fp8.push_back(bits);
    }
  }
}

void restoreFp8States(Model& model, const TrainState& st, bool lead, const std::string& path) {
  auto states = model.fp8States();
  if (states.empty()) return;
  size_t need = 0;
  std::vector<std::string> names;
  for (auto& [name, state] : states) {
    names.push_back(name);
    need += 1 + static_cast<size_t>(state->values().numel());
  }
  if (names != st.fp8Names || st.fp8.size() != need) {
    if (lead)
      MT_LOG_WARN << "checkpoint " << path
                  << (st.fp8Names.empty() ? " holds no FP8 scaling state"
                                          : " holds FP8 scaling states of other layers or history lengths")
                  << ": the FP8 scales start afresh (the first casts use current scaling)";
    return;
  }
  size_t k = 0;
  for (auto& [name, state] : states) {
    state->setCasts(st.fp8[k++]);
    std::vector<float> v(static_cast<size_t>(state->values().numel()));
    for (float& x : v) {
      const uint32_t bits = static_cast<uint32_t>(st.fp8[k++]);
      std::memcpy(&x, &bits, 4);
    }
    state->write(v);
  }
}

}  // namespace mt
