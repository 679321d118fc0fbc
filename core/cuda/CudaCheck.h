#pragma once
// CUDA_CHECK, CUBLAS_CHECK, CUDNN_CHECK and NCCL_CHECK: file:line, the expression, the rank and
// the library's own error string, thrown as CudaError / NcclError (only launch/ catches).

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "core/Check.h"

namespace mt {
namespace detail {
[[noreturn]] void throwCudaError(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void throwCublasError(cublasStatus_t s, const char* expr, const char* file, int line);
[[noreturn]] void throwCudnnError(cudnnStatus_t s, const char* expr, const char* file, int line);
[[noreturn]] void throwNcclError(ncclResult_t r, const char* expr, const char* file, int line);
}  // namespace detail
}  // namespace mt

#define CUDA_CHECK(expr)                                                                     \
  do {                                                                                       \
    cudaError_t mt_cuda_e_ = (expr);                                                         \
    if (mt_cuda_e_ != cudaSuccess) ::mt::detail::throwCudaError(mt_cuda_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                              \
  do {                                                                                                  \
    cublasStatus_t mt_cublas_s_ = (expr);                                                               \
    if (mt_cublas_s_ != CUBLAS_STATUS_SUCCESS) ::mt::detail::throwCublasError(mt_cublas_s_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUDNN_CHECK(expr)                                                                              \
  do {                                                                                                 \
    cudnnStatus_t mt_cudnn_s_ = (expr);                                                                \
    if (mt_cudnn_s_ != CUDNN_STATUS_SUCCESS) ::mt::detail::throwCudnnError(mt_cudnn_s_, #expr, __FILE__, __LINE__); \
  } while (0)

// ncclInProgress is not an error: non-blocking communicators return it while work is pending.
#define NCCL_CHECK(expr)                                                                                  \
  do {                                                                                                    \
    ncclResult_t mt_nccl_r_ = (expr);                                                                     \
    if (mt_nccl_r_ != ncclSuccess && mt_nccl_r_ != ncclInProgress)                                        \
      ::mt::detail::throwNcclError(mt_nccl_r_, #expr, __FILE__, __LINE__);                               \
  } while (0)
