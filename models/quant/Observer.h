#pragma once
// An activation observer: the range [lo, hi] a tensor's values are seen to take, from which the
// per-tensor uint8 quantization parameters follow (models/quant/Quantizer.h).
//   minmax      lo = min over every observed batch, hi = max (the calibration default)
//   ema         lo <- lo + a (min_b - lo), hi likewise, a = kEmaConstant; the first batch sets them
//               (PyTorch's MovingAverageMinMaxObserver): outliers of single batches fade
//   percentile  per batch the p-th and (100-p)-th percentiles of its values (nth_element on a host
//               copy), averaged over the batches: the tails beyond are clipped. Calibration only.
// The state (whether anything was seen, lo, hi, batches) is plain data: a checkpoint holds it
// bit-exactly (QuantizedModel::stateJson) so a resumed QAT run quantizes as the uninterrupted one.

#include <cstdint>
#include <string>

#include "core/Tensor.h"
#include "models/quant/Quantizer.h"

namespace mt {

enum class ObserverKind { kMinMax, kEma, kPercentile };
// "minmax" | "ema" | "percentile"; false for anything else.
bool parseObserverKind(const std::string& word, ObserverKind* out);
const char* observerKindName(ObserverKind k);

struct ObserverState {
  bool seen = false;
  float lo = 0.f, hi = 0.f;
  int64_t batches = 0;
};

class ActivationObserver {
 public:
  static constexpr float kEmaConstant = 0.01f;
  explicit ActivationObserver(ObserverKind kind = ObserverKind::kMinMax, double percentile = 99.99)
      : kind_(kind), percentile_(percentile) {}
  void observe(const Tensor& x);
  bool seen() const { return state_.seen; }
  ActivationQParams qparams() const { return activationQParams(state_.lo, state_.hi); }
  const ObserverState& state() const { return state_; }
  void setState(const ObserverState& s) { state_ = s; }

 private:
  std::pair<float, float> batchRange(const Tensor& x) const;
  ObserverKind kind_;
  double percentile_;
  ObserverState state_;
};

}  // namespace mt
