#pragma once
// One batch as the data path hands it to a model: inputs, targets and the rows' dataset indices
// (data/ builds it, models/ consumes it; neither owns the vocabulary).

#include <cstdint>
#include <vector>

#include "core/Tensor.h"

namespace mt {

struct Batch {
  Tensor inputs;   // images u8 [N,H,W,C] or tokens [N,T]
  Tensor targets;  // labels i64 [N] or next tokens [N,T]
  // Dataset index of each row (host): per-sample randomness (dropout) keyed by it is the same
  // whichever rank, world size or batch position the sample lands in.
  std::vector<int64_t> sampleIds;
  // Targets that are not the ignore index, when known (-1: the model counts them).
  int64_t validTargets = -1;
  int64_t size() const { return inputs.defined() ? inputs.dim(0) : 0; }
};

}  // namespace mt
