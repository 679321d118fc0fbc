#pragma once
// An image-classification split of a meshtrain HDF5 file (docs/data-format.md):
//   /<split>/images  u8 [N,H,W,C] (or [N,H,W], read as C = 1)
//   /<split>/labels  integer [N]  (any width; widened to i64)
// Validated at open: a missing dataset, wrong type or rank, mismatched counts or too few samples
// for the world size is a DataError naming the file and dataset.

#include <memory>
#include <string>

#include "data/H5File.h"
#include "data/ResidentSplit.h"
#include "data/RowReader.h"
#include "core/InputSpec.h"

namespace mt {

class ImageDataset final : public ResidentSplit {
 public:
  // `file` must outlive the dataset. minSamples: the world size (each rank needs one).
  ImageDataset(const H5File& file, const std::string& split, int64_t minSamples);
  int64_t size() const { return n_; }
  InputSpec spec() const { return spec_; }
  const std::string& split() const { return split_; }
  size_t imageBytes() const { return images_->rowBytes(); }
  // Copies example `index` into img (imageBytes()) and its label. `cache` is the calling thread's.
  void read(int64_t index, uint8_t* img, int64_t* label, ChunkCache* cache) const;
  // Loads the whole split into host memory (the `memory` loader mode); later reads come from RAM.
  void loadIntoMemory();
  bool inMemory() const { return !memImages_.empty(); }
  const std::vector<uint8_t>& memoryImages() const { return memImages_; }  // [N,H,W,C] after loadIntoMemory
  const std::vector<int64_t>& memoryLabels() const { return memLabels_; }
  // Images u8 [N,H,W,C] and labels i64 [N] in memory (after loadIntoMemory).
  ResidentData resident() const override;

 private:
  std::string file_, split_;
  int64_t n_ = 0;
  InputSpec spec_;
  std::unique_ptr<RowReader> images_, labels_;
  std::string labelType_;
  std::vector<uint8_t> memImages_;
  std::vector<int64_t> memLabels_;
};

}  // namespace mt
