#pragma once
// What a model needs to know of an image dataset before it is built: one example's shape and the
// number of classes (data/ImageDataset reports it, models/ModelConfig builds from it).

#include <cstdint>

namespace mt {

// Shape of one example and the number of classes, from the dataset.
struct InputSpec {
  int64_t height = 28, width = 28, channels = 1;
  int64_t numClasses = 10;
};

}  // namespace mt
