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
  int64_t classes = file.readIntAttribute(lblName, "num_classes", -1);
  if (classes <= 0) classes = file.readIntAttribute("/", "num_classes", -1);
  if (classes <= 0) {  // derive from the labels themselves
    std::vector<char> all(static_cast<size_t>(n_) * labels_->rowBytes());
    labels_->readRows(0, n_, all.data());
    int64_t mx = 0;
    for (int64_t i = 0; i < n_; ++i) mx = std::max(mx, widenLabel(all.data() + i * labels_->rowBytes(), labelType_));
    classes = mx + 1;
  }
  spec_.numClasses = classes;
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

}  // namespace mt
