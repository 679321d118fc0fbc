#pragma once
// A strided n-d view of typed memory on one device. Storage is shared and reference-counted, so
// views (view/narrow/flatSlice) are cheap and keep their buffer alive; parameters and gradients
// are such views into flat buffers owned by the ParamTable or a gradient bucket.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/Allocator.h"
#include "core/Check.h"
#include "core/DType.h"
#include "core/Device.h"

namespace mt {

using Shape = std::vector<int64_t>;

int64_t shapeNumel(const Shape& shape);
std::string shapeStr(const Shape& shape);

class Storage {
 public:
  Storage(size_t bytes, Allocator& allocator);
  Storage(void* external, size_t bytes, Device device);  // non-owning
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // null for external memory
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor empty(const Shape& shape, DType dtype, Allocator& allocator);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Wraps memory the caller keeps alive for the tensor's lifetime.
  static Tensor fromBlob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + ndim() : i)); }
  int64_t numel() const { return shapeNumel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  bool isContiguous() const;

  void* rawData() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtypeSize(dtype_))
                    : nullptr;
  }
  template <typename T>
  T* data() const {
    MT_CHECK(DTypeOf<T>::value == dtype_, "tensor is ", dtypeName(dtype_), ", accessed as ",
             dtypeName(DTypeOf<T>::value));
    return static_cast<T*>(rawData());
  }

  // Contiguous reshape; one dimension may be -1.
  Tensor view(const Shape& shape) const;
  // Sub-range along a dimension (a view, contiguous only when dim == 0 or the leading dims are 1).
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  // 1-d view of count elements starting at offset of a contiguous tensor.
  Tensor flatSlice(int64_t offset, int64_t count) const;
  // Same storage reinterpreted (no conversion), for sending raw bytes.
  Tensor flat() const { return view({numel()}); }

  void zero_();
  void fill_(float value);  // floating tensors only
  // Element-wise copy between contiguous tensors of the same dtype and numel, across devices.
  void copyFrom(const Tensor& src);
  Tensor to(Device device) const;
  Tensor clone() const;
  // Converting copy into a new contiguous tensor (f32 <-> bf16/f16, integer widths), on the CPU.
  Tensor toDType(DType dtype) const;

  std::string str() const;
  bool sharesStorageWith(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::kF32;
};

Shape contiguousStrides(const Shape& shape);

// Copies/zeroes raw bytes on any device pair (CUDA paths go to core/cuda when built with CUDA).
void copyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes);
void zeroBytes(void* dst, Device device, size_t bytes);

}  // namespace mt
