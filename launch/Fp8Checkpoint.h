#pragma once
// The FP8 scaling states of a model (Model::fp8States, core/Fp8.h) in a checkpoint's TrainState:
// packed on save, restored on resume, so a resumed FP8 run casts with exactly the scales and amax
// histories the uninterrupted one would (and, with the delayed recipe, steps the same histories).

#include <string>

#include "launch/CheckpointMeta.h"
#include "models/Model.h"

namespace mt {

// st.fp8Names / st.fp8 from the model's states (nothing when it has none). A device-to-host copy
// per state: checkpoint time only.
void packFp8States(Model& model, TrainState& st);
// The states of st into the model. A checkpoint without FP8 state, or with states that do not fit
// (another fp8.layers or fp8.amax_history), leaves the model's states fresh, with a warning from
// `lead` naming `path`.
void restoreFp8States(Model& model, const TrainState& st, bool lead, const std::string& path);

}  // namespace mt
