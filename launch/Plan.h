#pragma once
// `trainer plan --config X [--ranks N] [--gpu-memory GIB] [--gpus-per-node G] [--json] [--key=value ...]`:
// the per-rank memory of a configuration before anything is allocated: parameters, gradients,
// optimizer state, gathered units (sharding), activations by layer kind and the largest backward
// transient, buffers; and whether it fits a GPU of the given memory. Reads only the data file's
// shapes (image size and classes, or the vocabulary).

#include <string>
#include <vector>

namespace mt {

extern const char* const kPlanUsage;
int planCommand(const std::vector<std::string>& args);

}  // namespace mt
