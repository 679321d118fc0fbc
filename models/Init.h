#pragma once
// Parameter initialisation. Values are drawn on the host from the model's Rng in registration order
// and copied to the parameter's device, so a model starts from identical weights on CPU and GPU.

#include "core/Random.h"
#include "core/Tensor.h"

namespace mt {

void initUniform(Tensor& dst, Rng& rng, float lo, float hi);
void initNormal(Tensor& dst, Rng& rng, float mean, float stddev);
void initConstant(Tensor& dst, float value);

}  // namespace mt
