#include "models/kernels/TensorMap.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/Check.h"

namespace mt::cuda {

namespace {
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  // Per process: the driver does not change under a running job.
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    MT_CHECK(e == cudaSuccess && q == cudaDriverEntryPointSuccess && p != nullptr,
             "the CUDA driver has no cuTensorMapEncodeTiled (", cudaGetErrorString(e), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
}  // namespace

CUtensorMap encodeTensorMap(const TensorMapShape& s, const char* what) {
  CUtensorMap map{};
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4], elementStrides[4] = {1, 1, 1, 1};
  for (int i = 0; i < 4; ++i)
    dims[i] = s.dims[i], box[i] = s.box[i];
  for (int i = 0; i < 3; ++i)
    strides[i] = s.strides[i] * static_cast<uint64_t>(s.elementBytes);  // bytes
  const CUresult r = encoder()(&map, s.type, 4, const_cast<void*>(s.base), dims, strides, box, elementStrides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE,
                               s.swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "tensor map for ", what, ": cuTensorMapEncodeTiled returned ",
           static_cast<int>(r), " (dims ", s.dims[0], " x ", s.dims[1], " x ", s.dims[2], " x ", s.dims[3],
           ", strides ", s.strides[0], " / ", s.strides[1], " / ", s.strides[2], " elements, box ", s.box[0],
           " x ", s.box[1], ", base ", s.base, ")");
  return map;
}

}  // namespace mt::cuda
