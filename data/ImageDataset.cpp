#include "data/ImageDataset.h"

#include <algorithm>
#include <cstring>

namespace mt {

namespace {
[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw DataError("data file " + file + ": " + what);
}

int64_t widenLabel(const char* p, const std::string& type) {
  if (type == "i64") return *reinterpret_cast<const int64_t*>(p);
  if (type == "u64") return static_cast<int64_t>(*reinterpret_cast<const uint64_t*>(p));
  if (type == "i32") return *reinterpret_cast<const int32_t*>(p);
  if (type == "u32") return *reinterpret_cast<const uint32_t*>(p);
  if (type == "i16") return *reinterpret_cast<const int16_t*>(p);
  if (type == "u16") return *reinterpret_cast<const uint16_t*>(p);
  if (type == "i8") return *reinterpret_cast<const int8_t*>(p);
  return *reinterpret_cast<const uint8_t*>(p);
}
}  // namespace

ImageDataset::ImageDataset(const H5File& file, const std::string& split, int64_t minSamples)
    : file_(file.path()), split_(split) {
  const std::string imgName = "/" + split + "/images", lblName = "/" + split + "/labels";
  H5DatasetInfo img = file.describe(imgName);
  H5DatasetInfo lbl = file.describe(lblName);
  if (img.type != "u8") bad(file_, "dataset " + imgName + " has type " + img.type + ", expected u8");
  if (img.shape.size() != 4 && img.shape.size() != 3)
    bad(file_, "dataset " + imgName + " has shape " + shapeStr(img.shape) + ", expected [N,H,W,C] or [N,H,W]");
  if (lbl.type.empty() || (lbl.type[0] != 'i' && lbl.type[0] != 'u'))
    bad(file_, "dataset " + lblName + " has type " + lbl.type + ", expected an integer type");
  if (lbl.shape.size() != 1) bad(file_, "dataset " + lblName + " has shape " + shapeStr(lbl.shape) + ", expected [N]");
  if (lbl.shape[0] != img.shape[0])
    bad(file_, "dataset " + lblName + " has " + std::to_string(lbl.shape[0]) + " labels for " +
                   std::to_string(img.shape[0]) + " images in " + imgName);
  n_ = img.shape[0];
  if (n_ < std::max<int64_t>(1, minSamples))
    bad(file_, "dataset " + imgName + " has " + std::to_string(n_) + " samples, fewer than the " +
                   std::to_string(minSamples) + " ranks that each need one");
  spec_.height = img.shape[1];
  spec_.width = img.shape[2];
  spec_.channels = img.shape.size() == 4 ? img.shape[3] : 1;
  labelType_ = lbl.type;
  images_ = std::make_unique<RowReader>(file, std::move(img));
  labels_ = std::make_unique<RowReader>(file, std::move(lbl));
  // A header may declare far more rows than the file holds (1e9 images in 4 MB): refuse before
  // anything is sized from the declared extent.
  for (const RowReader* r : {images_.get(), labels_.get()}) {
    const std::string gap = r->storageGap();
    if (!gap.empty())
      bad(file_, "dataset " + r->info().name + " declares " + shapeStr(r->info().shape) + " but " + gap +
                     " (truncated or incompletely written file)");
  }
  // A zero, negative, fractional or huge num_classes is a broken file, not "none given".
  const int64_t classes = file.readCountAttribute(lblName, "num_classes", kMaxIdCount);
  // Every label is checked once here (labels are small; read in bounded blocks), so a bad one is
  // reported with its file, dataset and index instead of failing a training step later.
  const int64_t declared = classes;
  int64_t mx = 0;
  constexpr int64_t kBlock = 1 << 20;
  std::vector<char> block(static_cast<size_t>(std::min(n_, kBlock)) * labels_->rowBytes());
  for (int64_t b0 = 0; b0 < n_; b0 += kBlock) {
    const int64_t cnt = std::min(kBlock, n_ - b0);
    labels_->readRows(b0, cnt, block.data());
    for (int64_t i = 0; i < cnt; ++i) {
      const int64_t l = widenLabel(block.data() + i * labels_->rowBytes(), labelType_);
      if (l < 0 || l >= (declared > 0 ? declared : kMaxIdCount))
        bad(file_, "dataset " + lblName + "[" + std::to_string(b0 + i) + "] = " + std::to_string(l) +
                       (declared > 0
                            ? " is outside [0, " + std::to_string(declared) + ") (its num_classes attribute)"
                        : l < 0 ? " is negative"
                                : " is outside [0, " + std::to_string(kMaxIdCount) + ") (labels are int32)"));
      mx = std::max(mx, l);
    }
  }
  spec_.numClasses = declared > 0 ? declared : mx + 1;
}

void ImageDataset::read(int64_t index, uint8_t* img, int64_t* label, ChunkCache* cache) const {
  if (inMemory()) {
    std::memcpy(img, memImages_.data() + static_cast<size_t>(index) * imageBytes(), imageBytes());
    *label = memLabels_[static_cast<size_t>(index)];
    return;
  }
  images_->readRows(index, 1, img, cache);
  char buf[8];
  labels_->readRows(index, 1, buf, cache);
  *label = widenLabel(buf, labelType_);
}

void ImageDataset::loadIntoMemory() {
  if (inMemory()) return;
  memImages_.resize(static_cast<size_t>(n_) * imageBytes());
  images_->readRows(0, n_, memImages_.data());
  std::vector<char> raw(static_cast<size_t>(n_) * labels_->rowBytes());
  labels_->readRows(0, n_, raw.data());
  memLabels_.resize(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i)
    memLabels_[static_cast<size_t>(i)] = widenLabel(raw.data() + i * labels_->rowBytes(), labelType_);
}

ResidentData ImageDataset::resident() const {
  if (!inMemory())
    throw ConfigError("data.feed = device needs data.mode = memory (the split is loaded once, then copied)");
  ResidentData r;
  r.rowInputs = Tensor::fromBlob(const_cast<uint8_t*>(memImages_.data()), {n_, spec_.height, spec_.width, spec_.channels},
                                 DType::kU8);
  r.rowTargets = Tensor::fromBlob(const_cast<int64_t*>(memLabels_.data()), {n_}, DType::kI64);
  return r;
}

}  // namespace mt
