#include "core/Convert.h"

#include "core/Check.h"
#include "core/Parallel.h"

namespace mt {

namespace {

constexpr int64_t kGrain = 1 << 15;

template <typename Src, typename Dst>
void convertLoop(const Src* s, Dst* d, int64_t n) {
  parallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) d[i] = static_cast<Dst>(static_cast<float>(s[i]));
  });
}
template <typename Src>
bool convertFloatFrom(const Src* s, Tensor& dst, int64_t n) {
  switch (dst.dtype()) {
    case DType::kF32: convertLoop(s, dst.data<float>(), n); return true;
    case DType::kBF16: convertLoop(s, dst.data<BFloat16>(), n); return true;
    case DType::kF16: convertLoop(s, dst.data<Float16>(), n); return true;
    default: return false;
  }
}
template <typename Src, typename Dst>
void convertExact(const Src* s, Dst* d, int64_t n) {
  parallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) d[i] = static_cast<Dst>(s[i]);
  });
}

bool convertCpu(Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  const DType s = src.dtype(), d = dst.dtype();
  // f64 converts exactly to and from f64 (not through float).
  if (s == DType::kF64 && d == DType::kF32) return convertExact(src.data<double>(), dst.data<float>(), n), true;
  if (d == DType::kF64) {
    switch (s) {
      case DType::kF32: convertExact(src.data<float>(), dst.data<double>(), n); return true;
      case DType::kBF16: convertLoop(src.data<BFloat16>(), dst.data<double>(), n); return true;
      case DType::kF16: convertLoop(src.data<Float16>(), dst.data<double>(), n); return true;
      default: return false;
    }
  }
  switch (s) {
    case DType::kF32: return convertFloatFrom(src.data<float>(), dst, n);
    case DType::kBF16: return convertFloatFrom(src.data<BFloat16>(), dst, n);
    case DType::kF16: return convertFloatFrom(src.data<Float16>(), dst, n);
    case DType::kF64: return convertFloatFrom(src.data<double>(), dst, n);
    case DType::kI32:
      if (d == DType::kI64) return convertExact(src.data<int32_t>(), dst.data<int64_t>(), n), true;
      return false;
    case DType::kI64:
      if (d == DType::kI32) return convertExact(src.data<int64_t>(), dst.data<int32_t>(), n), true;
      return false;
    case DType::kU8:
      if (d == DType::kF32) return convertExact(src.data<uint8_t>(), dst.data<float>(), n), true;
      return false;
  }
  return false;
}

}  // namespace

void convertInto(Tensor& dst, const Tensor& src) {
  MT_CHECK(dst.numel() == src.numel(), "conversion of ", src.str(), " into ", dst.str());
  if (dst.dtype() == src.dtype()) {
    dst.copyFrom(src);
    return;
  }
  MT_CHECK(dst.device() == src.device(), "conversion across devices: ", src.str(), " -> ", dst.str());
  if (dst.device().isCuda()) {
#ifdef MT_WITH_CUDA
    cuda::convertOnDevice(dst, src);
    return;
#endif
  }
  MT_CHECK(src.isContiguous() && dst.isContiguous(), "conversion of a non-contiguous tensor: ", src.str(), " -> ",
           dst.str());
  MT_CHECK(convertCpu(dst, src), "conversion ", dtypeName(src.dtype()), " -> ", dtypeName(dst.dtype()),
           " not supported");
}

}  // namespace mt
