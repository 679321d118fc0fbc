#pragma once
// A dataset split as the device feed (data.feed = device) holds it: copied to the GPU once, then
// gathered from by index. Its examples in host memory either as fixed-size rows (an image and its
// label per example) or as one token stream read in windows of T + 1 tokens. ImageDataset and
// TokenDataset implement it, so DeviceFeed takes any split without knowing its kind.

#include <cstdint>

#include "core/Tensor.h"

namespace mt {

struct ResidentData {
  // Rows: inputs [N, ...] and targets [N] (host views of the split's memory), or undefined.
  Tensor rowInputs, rowTargets;
  // Token windows: tokens [numTokens] i32, sample i = tokens [i*T, i*T + T + 1), or undefined.
  Tensor tokens;
  int64_t window = 0;  // T
};

class ResidentSplit {
 public:
  virtual ~ResidentSplit() = default;
  // Host views of the split held in memory (valid while the dataset lives); ConfigError when it
  // was not loaded into memory (data.mode = stream).
  virtual ResidentData resident() const = 0;
};

}  // namespace mt
