#include "core/ParamTable.h"

#include <algorithm>

namespace mt {

namespace {

// The group (ordered, contiguous from 0) whose range starts at or before `offset`: the one holding
// it if any does; groups.size() when offset is negative or there are none.
size_t groupAt(const std::vector<GradRange>& groups, int64_t offset) {
  auto it = std::upper_bound(groups.begin(), groups.end(), offset,
                             [](int64_t o, const GradRange& g) { return o < g.offset; });
  return it == groups.begin() ? groups.size() : static_cast<size_t>(std::prev(it) - groups.begin());
}

}  // namespace

Param& ParamTable::add(const std::string& name, const Shape& shape, bool decay) {
  MT_CHECK(!materialized(), "parameter ", name, " added after materialize()");
  MT_CHECK(find(name) == nullptr, "duplicate parameter name ", name);
  auto p = std::make_unique<Param>();
  p->name = name;
  p->shape = shape;
  p->decay = decay;
  p->unit = currentUnit_;
  p->index = static_cast<int>(params_.size());
  p->offset = numel_;
  numel_ += p->numel();
  p->storageOffset = storageNumel_;
  storageNumel_ = alignParam(storageNumel_ + p->numel());
  byName_.emplace(p->name, p.get());
  params_.push_back(std::move(p));
  return *params_.back();
}

void ParamTable::materialize(Device device, DType dtype, ParamStorage storage) {
  MT_CHECK(!materialized(), "materialize() called twice");
  device_ = device;
  dtype_ = dtype;
  const bool host = storage == ParamStorage::kHostValuesOnly;
  values_ = Tensor::zeros({storageNumel_}, dtype, host ? Device::cpu() : device);
  std::vector<int64_t> offsets;
  for (auto& p : params_) {
    p->value = values_.flatSlice(p->storageOffset, p->numel()).view(p->shape);
    offsets.push_back(p->storageOffset);
  }
  if (host) return;
  // A group per run of one unit's parameters (registration order keeps a unit's together).
  std::vector<GradRange> groups;
  for (size_t i = 0; i < params_.size(); ++i)
    if (i == 0 || params_[i]->unit != params_[i - 1]->unit) {
      if (!groups.empty()) groups.back().numel = offsets[i] - groups.back().offset;
      groups.push_back({offsets[i], 0});
    }
  if (!groups.empty()) groups.back().numel = storageNumel_ - groups.back().offset;
  setGradLayout(offsets, std::move(groups));
}

Param* ParamTable::find(const std::string& name) {
  const auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : it->second;
}

int ParamTable::numUnits() const {
  int n = 0;
  for (const auto& p : params_)
    n = std::max(n, p->unit + 1);
  return n;
}

std::vector<Param*> ParamTable::unitParams(int unit) {
  std::vector<Param*> out;
  for (auto& p : params_)
    if (p->unit == unit) out.push_back(p.get());
  return out;
}

void ParamTable::zeroGrads() {
  if (gradLifetime_ == GradLifetime::kPerStep)
    dropGrads();
  else if (grads_.defined())
    grads_.zero_();
}

void ParamTable::releaseStorage() {
  values_ = Tensor();
  grads_ = Tensor();
  for (auto& p : params_) {
    p->value = Tensor();
    p->grad = Tensor();
  }
  groupBuffers_.assign(groupBuffers_.size(), Tensor());
  released_ = true;
}

void ParamTable::setGradLayout(const std::vector<int64_t>& offsets, std::vector<GradRange> groups) {
  MT_CHECK(offsets.size() == params_.size(), "grad layout has ", offsets.size(), " offsets for ",
           params_.size(), " parameters");
  int64_t end = 0;
  for (const GradRange& g : groups) {
    MT_CHECK(g.offset == end && g.numel > 0, "grad group at ", g.offset, " of ", g.numel, " elements after ",
             end);
    end += g.numel;
  }
  groupParams_.assign(groups.size(), {});
  unitGroups_.assign(static_cast<size_t>(numUnits()), {});
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t off = offsets[i], n = params_[i]->numel();
    const size_t g = groupAt(groups, off);
    MT_CHECK(g < groups.size() && off + n <= groups[g].offset + groups[g].numel, "the gradient of ",
             params_[i]->name, " at ", off, " (", n, " elements) is not inside one grad group");
    groupParams_[g].push_back(i);
    auto& ug = unitGroups_[static_cast<size_t>(params_[i]->unit)];
    if (std::find(ug.begin(), ug.end(), g) == ug.end()) ug.push_back(g);
  }
  gradOffsets_ = offsets;
  gradGroups_ = std::move(groups);
  gradNumel_ = end;
  groupBuffers_.assign(gradGroups_.size(), Tensor());
  grads_ = Tensor();
  for (auto& p : params_)
    p->grad = Tensor();
  if (gradLifetime_ == GradLifetime::kPerStep) return;
  grads_ = Tensor::zeros({gradNumel_}, dtype_, device_);
  for (size_t g = 0; g < gradGroups_.size(); ++g)
    bindGroup(g, grads_, 0);
}

void ParamTable::setGradLifetime(GradLifetime lifetime) {
  if (lifetime == gradLifetime_) return;
  gradLifetime_ = lifetime;
  if (released_ || gradOffsets_.empty()) return;  // sharded, or no gradients (host values only)
  std::vector<int64_t> offsets = gradOffsets_;
  setGradLayout(offsets, gradGroups_);
}

void ParamTable::bindGroup(size_t g, const Tensor& buffer, int64_t bufferStart) {
  for (size_t i : groupParams_[g]) {
    Param& p = *params_[i];
    p.grad = buffer.flatSlice(gradOffsets_[i] - bufferStart, p.numel()).view(p.shape);
  }
}

void ParamTable::makeGroup(size_t g) {
  Tensor buffer = Tensor::zeros({gradGroups_[g].numel}, dtype_, device_);
  groupBuffers_[g] = buffer;
  bindGroup(g, buffer, gradGroups_[g].offset);
}

void ParamTable::needGrads(int unit) {
  if (gradLifetime_ != GradLifetime::kPerStep || released_ || unitGroups_.empty()) return;
  MT_CHECK(unit >= 0 && static_cast<size_t>(unit) < unitGroups_.size(), "needGrads(", unit, ") of ",
           unitGroups_.size(), " units");
  for (size_t g : unitGroups_[static_cast<size_t>(unit)])
    if (!groupBuffers_[g].defined()) makeGroup(g);
}

void ParamTable::needAllGrads() {
  if (gradLifetime_ != GradLifetime::kPerStep || released_) return;
  for (size_t g = 0; g < gradGroups_.size(); ++g)
    if (!groupBuffers_[g].defined()) makeGroup(g);
}

void ParamTable::dropGrads() {
  if (gradLifetime_ != GradLifetime::kPerStep || released_) return;
  groupBuffers_.assign(groupBuffers_.size(), Tensor());
  for (auto& p : params_)
    p->grad = Tensor();
}

Tensor ParamTable::gradSlice(int64_t offset, int64_t numel) const {
  if (gradLifetime_ == GradLifetime::kPersistent) {
    MT_CHECK(grads_.defined(), "gradSlice on a table without gradient storage");
    return grads_.flatSlice(offset, numel);
  }
  const size_t g = groupAt(gradGroups_, offset);
  MT_CHECK(g < gradGroups_.size(), "gradSlice at ", offset);
  const GradRange& r = gradGroups_[g];
  MT_CHECK(offset + numel <= r.offset + r.numel, "gradSlice [", offset, ", ", offset + numel,
           ") crosses the end of its grad group at ", r.offset + r.numel);
  MT_CHECK(groupBuffers_[g].defined(), "gradSlice at ", offset, ": its grad group was not made this step");
  return groupBuffers_[g].flatSlice(offset - r.offset, numel);
}

int64_t ParamTable::residentGradBytes() const {
  if (gradLifetime_ == GradLifetime::kPersistent)
    return grads_.defined() ? static_cast<int64_t>(grads_.nbytes()) : 0;
  int64_t b = 0;
  for (const Tensor& t : groupBuffers_)
    if (t.defined()) b += static_cast<int64_t>(t.nbytes());
  return b;
}

}  // namespace mt
