#include "models/quant/Observer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/Check.h"

namespace mt {

bool parseObserverKind(const std::string& word, ObserverKind* out) {
  if (word == "minmax")
    *out = ObserverKind::kMinMax;
  else if (word == "ema")
    *out = ObserverKind::kEma;
  else if (word == "percentile")
    *out = ObserverKind::kPercentile;
  else
    return false;
  return true;
}

const char* observerKindName(ObserverKind k) {
  switch (k) {
    case ObserverKind::kMinMax:
      return "minmax";
    case ObserverKind::kEma:
      return "ema";
    case ObserverKind::kPercentile:
      return "percentile";
  }
  return "?";
}

std::pair<float, float> ActivationObserver::batchRange(const Tensor& x) const {
  if (kind_ != ObserverKind::kPercentile) return tensorRange(x);
  const Tensor h = x.device().isCpu() ? x : x.to(Device::cpu());
  std::vector<float> v;
  v.reserve(static_cast<size_t>(h.numel()));
  const float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i)
    if (!std::isnan(p[i])) v.push_back(p[i]);
  if (v.empty()) return {1.f, -1.f};
  // Rank of the p-th percentile among n values (nearest rank, 0-based).
  auto at = [&](double pct) {
    const auto k = static_cast<size_t>(std::llround(pct / 100.0 * static_cast<double>(v.size() - 1)));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  };
  const float hi = at(percentile_);
  const float lo = at(100.0 - percentile_);
  return {lo, hi};
}

void ActivationObserver::observe(const Tensor& x) {
  const auto [lo, hi] = batchRange(x);
  if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi))
    return;  // empty, all-NaN or inf: nothing learnt
  const auto b = static_cast<float>(state_.batches);
  if (!state_.seen) {
    state_.lo = lo, state_.hi = hi;
  } else if (kind_ == ObserverKind::kMinMax) {
    state_.lo = std::min(state_.lo, lo), state_.hi = std::max(state_.hi, hi);
  } else if (kind_ == ObserverKind::kEma) {
    state_.lo += kEmaConstant * (lo - state_.lo);
    state_.hi += kEmaConstant * (hi - state_.hi);
  } else {  // running mean of the batches' percentiles
    state_.lo += (lo - state_.lo) / (b + 1.f);
    state_.hi += (hi - state_.hi) / (b + 1.f);
  }
  state_.seen = true;
  ++state_.batches;
}

}  // namespace mt
