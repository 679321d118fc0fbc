#pragma once
// Device dispatch for layer functions: CPU code follows the macro in the layer's .cpp, CUDA code is
// the same-named function in namespace mt::cuda (models/kernels/*.cu), compiled only with CUDA.

#include "core/Error.h"

#ifdef MT_WITH_CUDA
#include "models/kernels/CudaLayers.h"
#define MT_DISPATCH_CUDA(tensor, call)  \
  do {                                  \
    if ((tensor).device().isCuda()) {   \
      ::mt::cuda::call;                 \
      return;                           \
    }                                   \
  } while (0)
#else
#define MT_DISPATCH_CUDA(tensor, call)                                                        \
  do {                                                                                        \
    if ((tensor).device().isCuda())                                                           \
      throw ::mt::InternalError(std::string(__func__) + " on CUDA in a build without CUDA");  \
  } while (0)
#endif
