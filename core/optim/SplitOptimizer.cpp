#include "core/optim/SplitOptimizer.h"

#include <algorithm>

#include "core/Check.h"

namespace mt {

namespace {

std::vector<OptimSegment> sliceOf(const std::vector<OptimSegment>& v, size_t first, size_t last) {
  return std::vector<OptimSegment>(v.begin() + static_cast<std::ptrdiff_t>(first),
                                   v.begin() + static_cast<std::ptrdiff_t>(last));
}

}  // namespace

SplitOptimizer::SplitOptimizer(const OptimConfig& cfg, std::vector<OptimSegment> segments,
                               const std::vector<size_t>& cuts)
    : Optimizer(std::move(segments)) {
  begin_.push_back(0);
  for (size_t c : cuts) {
    MT_CHECK(c > begin_.back() && c < segments_.size(), "split optimizer: cut ", c, " after ", begin_.back(),
             " of ", segments_.size(), " segments");
    begin_.push_back(c);
  }
  begin_.push_back(segments_.size());
  for (size_t p = 0; p + 1 < begin_.size(); ++p)
    parts_.push_back(makeSingleOptimizer(cfg, sliceOf(segments_, begin_[p], begin_[p + 1])));
}

size_t SplitOptimizer::partOf(size_t segment) const {
  MT_CHECK(segment < segments_.size(), "split optimizer: segment ", segment, " of ", segments_.size());
  return static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), segment) - begin_.begin()) - 1;
}

void SplitOptimizer::beginStep() {
  Optimizer::beginStep();
  for (auto& p : parts_)
    p->beginStep();
}

void SplitOptimizer::setStepCount(int64_t s) {
  Optimizer::setStepCount(s);
  for (auto& p : parts_)
    p->setStepCount(s);
}

void SplitOptimizer::updateSegments(float lr, size_t first, size_t last, float gradScale) {
  MT_CHECK(first <= last && last <= segments_.size(), "split optimizer: segments [", first, ", ", last,
           ") of ", segments_.size());
  for (size_t p = 0; p < parts_.size(); ++p) {
    const size_t a = std::max(first, begin_[p]), b = std::min(last, begin_[p + 1]);
    if (a < b) parts_[p]->stepSegments(lr, a - begin_[p], b - begin_[p], gradScale);
  }
}

std::vector<std::string> SplitOptimizer::stateNames() {
  return parts_.front()->stateNames();  // one type: the same names in every part
}

Tensor SplitOptimizer::stateSlice(size_t kind, size_t segment) {
  const size_t p = partOf(segment);
  return parts_[p]->stateSlice(kind, segment - begin_[p]);
}

std::vector<std::pair<std::string, Tensor>> SplitOptimizer::state() {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::vector<std::string> names = stateNames();
  for (size_t k = 0; k < names.size(); ++k) {
    Tensor all = Tensor::empty({stateNumel_}, DType::kF32);
    for (size_t i = 0; i < segments_.size(); ++i)
      all.flatSlice(stateOffsets_[i], segments_[i].value.numel()).copyFrom(stateSlice(k, i));
    out.emplace_back(names[k], all);
  }
  return out;
}

int64_t SplitOptimizer::stateBytes() {
  int64_t b = 0;
  for (auto& p : parts_)
    b += p->stateBytes();
  return b;
}

void SplitOptimizer::rebind(std::vector<OptimSegment> segs) {
  Optimizer::rebind(segs);
  for (size_t p = 0; p < parts_.size(); ++p)
    parts_[p]->rebind(sliceOf(segments_, begin_[p], begin_[p + 1]));
}

}  // namespace mt
