#pragma once
// The parameter table: every trainable tensor of a model, registered by name in a fixed order that
// is identical on all ranks (it is the model's construction order). Values live in one flat buffer
// in registration order. Gradients have a flat layout (an offset per parameter) that the
// data-parallel buckets may change (reverse order, observed ready order), cut into groups (a unit's
// run of parameters, or a bucket) so that a bucket is one contiguous slice. How long gradient
// memory lives is the table's GradLifetime: one buffer for the run, or one buffer per group made
// when backward first reaches the group and dropped after the optimizer step. Optimizers, buckets,
// sharding and checkpoints all walk this table instead of the model.

#include <functional>
#include <string>
#include <unordered_map>
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

// How long gradient memory lives (train.gradient_buffers).
enum class GradLifetime {
  kPersistent,  // one buffer for the run, zeroed before each step
  kPerStep      // one buffer per group, made (zeroed) when backward first needs one of its
                // parameters' gradients and dropped after the optimizer step, as PyTorch's
                // zero_grad(set_to_none=True): at the start of backward, where activations peak,
                // the gradients of the units backward has not reached take no memory
};

// A contiguous range of the gradient layout, in elements.
struct GradRange {
  int64_t offset = 0;
  int64_t numel = 0;
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
  // The gradient buffer of the current layout (all gradients, contiguous); kPersistent only
  // (undefined with per-step gradients: use gradSlice).
  Tensor flatGrads() const { return grads_; }
  // [offset, offset + numel) of the gradient layout, inside one group whose buffer exists.
  Tensor gradSlice(int64_t offset, int64_t numel) const;
  // Bytes of every gradient of the layout (what the gradients take once all exist).
  int64_t gradBytes() const { return gradNumel_ * static_cast<int64_t>(dtypeSize(dtype_)); }
  // Bytes of the gradient buffers that exist now.
  int64_t residentGradBytes() const;
  // Before a step: kPersistent zeroes the buffer; kPerStep drops the groups (made zeroed again
  // when needed), as dropGrads().
  void zeroGrads();

  // Per-step gradients (no-ops with kPersistent and after releaseStorage): needGrads makes the
  // groups holding `unit`'s gradients (zeroed) and binds their Param::grad views; the models call
  // it before a unit's backward (and GPT before its forward writes the classifier's gradient).
  // needAllGrads makes the rest (parameters that got no gradient take part as zeros). dropGrads
  // releases every group: Param::grad is undefined until the next needGrads, and whoever kept
  // views (optimizer segments) must drop them for the memory to go.
  GradLifetime gradLifetime() const { return gradLifetime_; }
  void setGradLifetime(GradLifetime lifetime);  // re-lays the gradients out (values not kept)
  void needGrads(int unit);
  void needAllGrads();
  void dropGrads();

  // Sharding keeps parameters in per-unit buffers instead: drops the flat buffers (Param::value
  // and ::grad become whatever the sharding engine binds, undefined between uses).
  void releaseStorage();
  bool storageReleased() const { return released_; }

  // Re-lays the gradients out: param i's gradient starts at offsets[i] of the layout, which
  // `groups` cut into contiguous ranges (in order, from 0, each parameter inside one). Used by the
  // bucket builder (a group per bucket); the old gradient values are not carried over (call
  // between steps). kPersistent allocates one zeroed buffer for the layout.
  void setGradLayout(const std::vector<int64_t>& offsets, std::vector<GradRange> groups);
  const std::vector<int64_t>& gradOffsets() const { return gradOffsets_; }
  const std::vector<GradRange>& gradGroups() const { return gradGroups_; }

 private:
  void makeGroup(size_t g);  // group g's buffer, zeroed, and its parameters' views
  void bindGroup(size_t g, const Tensor& buffer, int64_t bufferStart);

  std::vector<std::unique_ptr<Param>> params_;
  std::unordered_map<std::string, Param*> byName_;  // find() and add()'s duplicate check, O(1) each
  int currentUnit_ = 0;
  int64_t numel_ = 0;
  int64_t storageNumel_ = 0;
  Device device_;
  DType dtype_ = DType::kF32;
  Tensor values_;
  Tensor grads_;  // kPersistent: the whole layout
  std::vector<int64_t> gradOffsets_;
  std::vector<GradRange> gradGroups_;
  std::vector<Tensor> groupBuffers_;              // kPerStep: per group, undefined until needed
  std::vector<std::vector<size_t>> groupParams_;  // per group: its parameters
  std::vector<std::vector<size_t>> unitGroups_;   // per unit: the groups holding its gradients
  int64_t gradNumel_ = 0;
  GradLifetime gradLifetime_ = GradLifetime::kPersistent;
  bool released_ = false;
};

}  // namespace mt
