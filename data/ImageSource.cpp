#include "data/ImageSource.h"

namespace mt {

Batch ImageSource::collate(const std::vector<int64_t>& indices, ChunkCache* cache, Allocator& host) const {
  const int64_t B = static_cast<int64_t>(indices.size());
  const InputSpec s = ds_.spec();
  Batch b;
  b.inputs = Tensor::empty({B, s.height, s.width, s.channels}, DType::kU8, host);
  b.targets = Tensor::empty({B}, DType::kI64, host);
  uint8_t* img = b.inputs.data<uint8_t>();
  int64_t* lbl = b.targets.data<int64_t>();
  for (int64_t i = 0; i < B; ++i)
    ds_.read(indices[static_cast<size_t>(i)], img + static_cast<size_t>(i) * ds_.imageBytes(), lbl + i, cache);
  return b;
}

}  // namespace mt
