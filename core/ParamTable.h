#pragma once
// The parameter table: every trainable tensor of a model, registered by name in a fixed order that
// is identical on all ranks (it is the model's construction order). Values live in one flat buffer
// in registration order; gradients live in a flat buffer whose layout the data-parallel buckets may
// change (reverse order, observed ready order), so buckets are contiguous slices of it. Optimizers,
// buckets, sharding and checkpoints all walk this table instead of the model.

#include <functional>
#include <string>
#include <vector>

#include "core/Tensor.h"

namespace mt {

struct Param {
  std::string name;
  Shape shape;
  bool decay = true;          // weight decay applies (matrices, embeddings) or not (biases, norm gains)
  int unit = 0;               // sharding unit (a layer group gathered and freed together)
  int index = 0;              // registration order
  int64_t offset = 0;         // position in the model's packed flat parameter vector (checkpoints)
  int64_t storageOffset = 0;  // element offset in the flat value buffer (aligned, see kParamAlign)
  Tensor value;               // view; sharding rebinds it to a gathered unit buffer
  Tensor grad;                // view into the gradient buffer under the current layout
  int64_t numel() const { return shapeNumel(shape); }
};

// Every parameter (value and gradient) starts at a multiple of this many elements in its flat
// buffer: 256 bytes for f32, what cuDNN/cuBLASLt's vectorised kernels want and what CUDA
// allocations give. The gaps are zero and reduce to zero.
constexpr int64_t kParamAlign = 64;
inline int64_t alignParam(int64_t n) {
  return (n + kParamAlign - 1) / kParamAlign * kParamAlign;
}

// Where materialize() puts the model's flat buffers.
enum class ParamStorage {
  kDevice,         // values and gradients on the training device
  kHostValuesOnly  // values in host memory, no gradients: a sharded engine copies each rank's shards
                   // out and hands out gradient buffers unit by unit, so the whole model never sits
                   // on the GPU (it would add 8 bytes a parameter to the engine's construction peak)
};

class ParamTable {
 public:
  ParamTable() = default;
  ParamTable(const ParamTable&) = delete;
  ParamTable& operator=(const ParamTable&) = delete;

  // Registration happens before materialize(); names must be unique.
  Param& add(const std::string& name, const Shape& shape, bool decay = true);
  // Parameters added from now on belong to this sharding unit.
  void beginUnit(int unit) { currentUnit_ = unit; }

  // Allocates the flat value and gradient buffers and binds every Param's views. device() is
  // `device` either way; with kHostValuesOnly the values are host tensors until releaseStorage().
  void materialize(Device device, DType dtype = DType::kF32, ParamStorage storage = ParamStorage::kDevice);
  bool materialized() const { return values_.defined() || released_; }

  size_t size() const { return params_.size(); }
  Param& operator[](size_t i) { return *params_[i]; }
  const Param& operator[](size_t i) const { return *params_[i]; }
  Param* find(const std::string& name);
  int64_t numel() const { return numel_; }                // parameters (packed)
  int64_t storageNumel() const { return storageNumel_; }  // elements of the flat buffers
  int numUnits() const;
  std::vector<Param*> unitParams(int unit);
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

  Tensor flatValues() const { return values_; }  // storage layout (aligned, with zero gaps)
  // The gradient buffer of the current layout (all gradients, contiguous).
  Tensor flatGrads() const { return grads_; }
  void zeroGrads();

  // Sharding keeps parameters in per-unit buffers instead: drops the flat buffers (Param::value
  // and ::grad become whatever the sharding engine binds, undefined between uses).
  void releaseStorage();
  bool storageReleased() const { return released_; }

  // Re-lays the gradients out: param i's gradient starts at offsets[i] in `buffer`. Used by the
  // bucket builder; the old gradient values are not carried over (call between steps).
  void setGradLayout(const std::vector<int64_t>& offsets, Tensor buffer);
  const std::vector<int64_t>& gradOffsets() const { return gradOffsets_; }

 private:
  std::vector<std::unique_ptr<Param>> params_;
  int currentUnit_ = 0;
  int64_t numel_ = 0;
  int64_t storageNumel_ = 0;
  Device device_;
  DType dtype_ = DType::kF32;
  Tensor values_;
  Tensor grads_;
  std::vector<int64_t> gradOffsets_;
  bool released_ = false;
};

}  // namespace mt
