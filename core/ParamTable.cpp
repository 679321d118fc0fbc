#include "core/ParamTable.h"

#include <algorithm>

namespace mt {

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
  setGradLayout(offsets, Tensor::zeros({storageNumel_}, dtype, device));
}

Param* ParamTable::find(const std::string& name) {
  for (auto& p : params_)
    if (p->name == name) return p.get();
  return nullptr;
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
  if (grads_.defined()) grads_.zero_();
}

void ParamTable::releaseStorage() {
  values_ = Tensor();
  grads_ = Tensor();
  for (auto& p : params_) {
    p->value = Tensor();
    p->grad = Tensor();
  }
  released_ = true;
}

void ParamTable::setGradLayout(const std::vector<int64_t>& offsets, Tensor buffer) {
  MT_CHECK(offsets.size() == params_.size(), "grad layout has ", offsets.size(), " offsets for ",
           params_.size(), " parameters");
  for (size_t i = 0; i < params_.size(); ++i)
    MT_CHECK(offsets[i] + params_[i]->numel() <= buffer.numel(), "grad buffer of ", buffer.numel(),
             " elements too small for ", params_[i]->name, " at ", offsets[i]);
  grads_ = buffer;
  gradOffsets_ = offsets;
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i]->grad = buffer.flatSlice(offsets[i], params_[i]->numel()).view(params_[i]->shape);
}

}  // namespace mt
