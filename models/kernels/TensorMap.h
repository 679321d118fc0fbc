#pragma once
// Tensor maps (CUtensorMap) for Hopper's tensor copies (models/kernels/Tma.cuh): a 4-D strided
// tensor and the box one copy moves. Encoded on the host through the driver's
// cuTensorMapEncodeTiled, reached via the runtime's entry-point query, so nothing links libcuda.

#include <cuda.h>

#include <cstdint>

namespace mt::cuda {

struct TensorMapShape {
  const void* base = nullptr;  // 16-byte aligned
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  int elementBytes = 2;
  uint64_t dims[4] = {1, 1, 1, 1};  // innermost first; dim 0 contiguous
  uint64_t strides[3] = {0, 0, 0};  // elements between consecutive indices of dims 1..3
  uint32_t box[4] = {1, 1, 1, 1};   // elements a copy moves per dim
  bool swizzle128 = true;           // 128-byte swizzle (box[0] * elementBytes <= 128)
};

// Throws (MT_CHECK) naming the shape when the driver refuses it (alignment, strides, box limits).
CUtensorMap encodeTensorMap(const TensorMapShape& s, const char* what);

}  // namespace mt::cuda
