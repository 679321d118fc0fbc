#include "core/cuda/CudaCheck.h"

#include <string>

namespace mt {
namespace detail {

void throwCudaError(cudaError_t e, const char* expr, const char* file, int line) {
  std::string msg = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) throw OutOfMemoryError(checkMessage(file, line, expr, msg));
  throw CudaError(checkMessage(file, line, expr, msg));
}

void throwCublasError(cublasStatus_t s, const char* expr, const char* file, int line) {
  throw CudaError(checkMessage(file, line, expr, std::string("cuBLAS: ") + cublasLtGetStatusName(s) + ": " +
                                                     cublasLtGetStatusString(s)));
}

void throwCudnnError(cudnnStatus_t s, const char* expr, const char* file, int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  throw CudaError(checkMessage(file, line, expr, std::string("cuDNN: ") + cudnnGetErrorString(s) +
                                                     (last[0] ? std::string(" (") + last + ")" : "")));
}

void throwNcclError(ncclResult_t r, const char* expr, const char* file, int line) {
  throw NcclError(checkMessage(file, line, expr, std::string("NCCL: ") + ncclGetErrorString(r)));
}

}  // namespace detail
}  // namespace mt
