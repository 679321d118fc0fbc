#include "core/Convert.h"
#include "core/Tensor.h"

#include <cstring>
#include <sstream>

#ifdef MT_WITH_CUDA
#include "core/cuda/CudaMemory.h"
#endif

namespace mt {

int64_t shapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shapeStr(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

Shape contiguousStrides(const Shape& shape) {
  Shape s(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = stride;
    stride *= shape[i];
  }
  return s;
}

Storage::Storage(size_t bytes, Allocator& allocator)
    : bytes_(bytes), device_(allocator.device()), allocator_(&allocator) {
  data_ = allocator.allocate(bytes);
}

Storage::Storage(void* external, size_t bytes, Device device) : data_(external), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_, bytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, allocatorFor(device));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& allocator) {
  for (int64_t d : shape) MT_CHECK(d >= 0, "negative dimension in shape ", shapeStr(shape));
  Tensor t;
  size_t bytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  t.storage_ = std::make_shared<Storage>(bytes, allocator);
  t.shape_ = shape;
  t.strides_ = contiguousStrides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::fromBlob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  size_t bytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  t.storage_ = std::make_shared<Storage>(data, bytes, device);
  t.shape_ = shape;
  t.strides_ = contiguousStrides(shape);
  t.dtype_ = dtype;
  return t;
}

bool Tensor::isContiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  MT_CHECK(isContiguous(), "view of a non-contiguous tensor ", str());
  Shape s = shape;
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MT_CHECK(inferred < 0, "more than one -1 in view shape ", shapeStr(shape));
      inferred = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (inferred >= 0) {
    MT_CHECK(known > 0 && numel() % known == 0, "cannot view ", str(), " as ", shapeStr(shape));
    s[static_cast<size_t>(inferred)] = numel() / known;
  }
  MT_CHECK(shapeNumel(s) == numel(), "cannot view ", str(), " as ", shapeStr(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguousStrides(s);
  return t;
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  if (dim < 0) dim += ndim();
  MT_CHECK(dim >= 0 && dim < ndim(), "narrow dim ", dim, " of ", str());
  MT_CHECK(start >= 0 && length >= 0 && start + length <= shape_[static_cast<size_t>(dim)], "narrow [", start,
           ", ", start + length, ") out of range for ", str());
  Tensor t = *this;
  t.offset_ += start * strides_[static_cast<size_t>(dim)];
  t.shape_[static_cast<size_t>(dim)] = length;
  return t;
}

Tensor Tensor::flatSlice(int64_t offset, int64_t count) const {
  MT_CHECK(isContiguous(), "flatSlice of non-contiguous ", str());
  MT_CHECK(offset >= 0 && count >= 0 && offset + count <= numel(), "flatSlice [", offset, ", ", offset + count,
           ") out of range for ", str());
  Tensor t = *this;
  t.offset_ += offset;
  t.shape_ = {count};
  t.strides_ = {1};
  return t;
}

void Tensor::zero_() {
  MT_CHECK(isContiguous(), "zero_ of non-contiguous ", str());
  zeroBytes(rawData(), device(), nbytes());
}

void Tensor::fill_(float value) {
  MT_CHECK(isContiguous() && device().isCpu(), "fill_ needs a contiguous CPU tensor: ", str());
  int64_t n = numel();
  switch (dtype_) {
    case DType::kF32: {
      float* p = data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case DType::kBF16: {
      BFloat16* p = data<BFloat16>();
      for (int64_t i = 0; i < n; ++i) p[i] = BFloat16(value);
      break;
    }
    case DType::kF16: {
      Float16* p = data<Float16>();
      for (int64_t i = 0; i < n; ++i) p[i] = Float16(value);
      break;
    }
    case DType::kF64: {
      double* p = data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    default: MT_CHECK(false, "fill_ on ", dtypeName(dtype_));
  }
}

void Tensor::copyFrom(const Tensor& src) {
  MT_CHECK(dtype_ == src.dtype_ && numel() == src.numel(), "copyFrom ", src.str(), " into ", str());
  MT_CHECK(isContiguous() && src.isContiguous(), "copyFrom needs contiguous tensors");
  copyBytes(rawData(), device(), src.rawData(), src.device(), nbytes());
}

Tensor Tensor::to(Device d) const {
  Tensor t = empty(shape_, dtype_, d);
  t.copyFrom(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

Tensor Tensor::toDType(DType dtype) const {
  MT_CHECK(device().isCpu() && isContiguous(), "toDType needs a contiguous CPU tensor: ", str());
  if (dtype == dtype_) return clone();
  Tensor out = empty(shape_, dtype, Device::cpu());
  convertInto(out, *this);
  return out;
}

std::string Tensor::str() const {
  return std::string("Tensor(") + dtypeName(dtype_) + shapeStr(shape_) + ", " + device().str() + ")";
}

void copyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (dstDevice.isCpu() && srcDevice.isCpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef MT_WITH_CUDA
  cudaCopyBytes(dst, dstDevice, src, srcDevice, bytes);
#else
  throw InternalError("copy involving " + (dstDevice.isCpu() ? srcDevice : dstDevice).str() +
                      " in a build without CUDA");
#endif
}

void zeroBytes(void* dst, Device device, size_t bytes) {
  if (bytes == 0) return;
  if (device.isCpu()) {
    std::memset(dst, 0, bytes);
    return;
  }
#ifdef MT_WITH_CUDA
  cudaZeroBytes(dst, device, bytes);
#else
  throw InternalError("memset on " + device.str() + " in a build without CUDA");
#endif
}

}  // namespace mt
