#pragma once
// Learning-rate schedules, a pure function of the step (so a resumed run continues exactly):
//   constant: lr
//   cosine:   step < warmup: lr · (step + 1) / warmup
//             else minLr + (lr - minLr) · 0.5 · (1 + cos(pi · (step - warmup) / (total - warmup)))
//   linear:   warmup as above, then linear decay from lr to minLr at total

#include <cstdint>
#include <string>

namespace mt {

struct LrSchedule {
  std::string kind = "constant";  // constant | cosine | linear
  float baseLr = 1e-3f;
  float minLr = 0.f;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 1;
  float at(int64_t step) const;
};

bool isValidScheduleKind(const std::string& kind);

}  // namespace mt
