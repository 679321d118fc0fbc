#pragma once
// BatchSource over an ImageDataset: images u8 [B,H,W,C] and labels i64 [B] in host memory from the
// given allocator (pinned when the batch goes on to a GPU).

#include "data/ImageDataset.h"
#include "data/Loader.h"

namespace mt {

class ImageSource : public BatchSource {
 public:
  explicit ImageSource(const ImageDataset& ds) : ds_(ds) {}
  int64_t size() const override { return ds_.size(); }
  Batch collate(const std::vector<int64_t>& indices, ChunkCache* cache, Allocator& host) const override;

 private:
  const ImageDataset& ds_;
};

}  // namespace mt
