#include "core/optim/LrSchedule.h"

#include <algorithm>
#include <cmath>

namespace mt {

float LrSchedule::at(int64_t step) const {
  if (kind == "constant") {
    if (warmupSteps > 0 && step < warmupSteps)
      return baseLr * static_cast<float>(step + 1) / static_cast<float>(warmupSteps);
    return baseLr;
  }
  if (warmupSteps > 0 && step < warmupSteps)
    return baseLr * static_cast<float>(step + 1) / static_cast<float>(warmupSteps);
  const double span = std::max<int64_t>(1, totalSteps - warmupSteps);
  const double progress = std::min(1.0, static_cast<double>(step - warmupSteps) / span);
  if (kind == "cosine")
    return static_cast<float>(minLr + (baseLr - minLr) * 0.5 * (1.0 + std::cos(M_PI * progress)));
  return static_cast<float>(baseLr + (minLr - baseLr) * progress);  // linear
}

bool isValidScheduleKind(const std::string& kind) {
  return kind == "constant" || kind == "cosine" || kind == "linear";
}

}  // namespace mt
