// A C ABI over models/kernels/FlashAttention.h and models/kernels/CudnnAttention.h for the kernel
// lab (scripts/bench/attention_lab.py loads it with ctypes and drives it with PyTorch tensors, so
// our kernels, cuDNN's through our graphs and PyTorch's SDPA run on the same buffers, on the same
// stream, in one process). cuDNN needs a handle and a plan cache: mt_cudnn_create() makes one
// context, which the caller owns and frees with mt_cudnn_destroy(). Views are (ptr, sb, st, sh) of
// [B, T, H, D]-shaped operands; dtype codes: 0 f32, 1 bf16, 2 f16. Every function returns 0 on
// success and -1 with mt_flash_last_error() set otherwise (no exception crosses the ABI).

#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "core/cuda/CudaCheck.h"
#include "models/kernels/CudnnAttention.h"
#include "models/kernels/FlashAttention.h"

namespace {

thread_local std::string lastError;

mt::DType dtypeOf(int code) {
  switch (code) {
    case 0: return mt::DType::kF32;
    case 1: return mt::DType::kBF16;
    case 2: return mt::DType::kF16;
    default: throw std::invalid_argument("dtype code " + std::to_string(code));
  }
}
mt::cuda::FlashView viewOf(void* ptr, int dtype, const int64_t* s) {
  mt::cuda::FlashView v;
  v.ptr = ptr;
  v.dtype = dtypeOf(dtype);
  v.sb = s[0], v.st = s[1], v.sh = s[2];
  return v;
}
mt::cuda::FlashProblem problemOf(int64_t B, int64_t T, int64_t H, int64_t D, float scale, int fwdVar, int bwdVar) {
  mt::cuda::FlashProblem p;
  p.B = B, p.T = T, p.H = H, p.D = D, p.scale = scale, p.fwdVariant = fwdVar, p.bwdVariant = bwdVar;
  return p;
}
// A cuDNN handle and the plans built with it (destroyed first: declared last).
struct CudnnContext {
  cudnnHandle_t handle = nullptr;
  mt::cuda::CudnnAttention attention;
  CudnnContext() { CUDNN_CHECK(cudnnCreate(&handle)); }
  ~CudnnContext() = default;
};
void destroyContext(CudnnContext* c) {
  cudnnHandle_t h = c->handle;
  delete c;  // the plans go before their handle
  if (h) cudnnDestroy(h);
}
// views: q, k, v, o, dO, dq, dk, dv (24 strides, 8 dtypes); forward reads only the first four.
mt::cuda::CudnnAttentionViews cudnnViews(void* const* ptrs, const int* dtypes, const int64_t* strides, int n);

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    lastError = e.what();
    return -1;
  }
}

mt::cuda::CudnnAttentionViews cudnnViews(void* const* ptrs, const int* dtypes, const int64_t* strides, int n) {
  mt::cuda::CudnnAttentionViews v;
  mt::cuda::FlashView* all[] = {&v.q, &v.k, &v.v, &v.o, &v.dO, &v.dq, &v.dk, &v.dv};
  for (int i = 0; i < n; ++i) *all[i] = viewOf(ptrs[i], dtypes[i], strides + 3 * i);
  return v;
}

}  // namespace

extern "C" {

const char* mt_flash_last_error() { return lastError.c_str(); }

int mt_flash_supported(int64_t D, int dtype) { return mt::cuda::flashSupported(D, dtypeOf(dtype)) ? 1 : 0; }

int mt_flash_variant_count(int64_t D, int dtype, int backward) {
  return mt::cuda::flashVariantCount(D, dtypeOf(dtype), backward != 0);
}
int mt_flash_default_variant(int64_t D, int dtype, int backward, int64_t T) {
  return mt::cuda::flashDefaultVariant(D, dtypeOf(dtype), backward != 0, T);
}
const char* mt_flash_variant_name(int64_t D, int dtype, int backward, int variant) {
  return mt::cuda::flashVariantName(D, dtypeOf(dtype), backward != 0, variant);
}

int64_t mt_flash_lse_elements(int64_t B, int64_t T, int64_t H, int64_t D) {
  return mt::cuda::flashLseElements(problemOf(B, T, H, D, 1.f, 0, 0));
}

int64_t mt_flash_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D, int inDtype, void* dO, int dODtype,
                                 const int64_t* dOStrides, void* dq, int dqDtype, const int64_t* dqStrides) {
  int64_t bytes = -1;
  guarded([&] {
    bytes = static_cast<int64_t>(mt::cuda::flashBackwardWorkspaceBytes(problemOf(B, T, H, D, 1.f, 0, 0), dtypeOf(inDtype),
                                                                       viewOf(dO, dODtype, dOStrides),
                                                                       viewOf(dq, dqDtype, dqStrides)));
  });
  return bytes;
}

// views: q, k, v, o, each 3 strides in `strides` (12 values); dtypes[4].
int mt_flash_forward(int64_t B, int64_t T, int64_t H, int64_t D, float scale, void* const* ptrs, const int* dtypes,
                     const int64_t* strides, float* lse, int variant, void* stream) {
  return guarded([&] {
    mt::cuda::flashAttentionForward(problemOf(B, T, H, D, scale, variant, 0), viewOf(ptrs[0], dtypes[0], strides),
                                    viewOf(ptrs[1], dtypes[1], strides + 3), viewOf(ptrs[2], dtypes[2], strides + 6),
                                    viewOf(ptrs[3], dtypes[3], strides + 9), lse, static_cast<cudaStream_t>(stream));
  });
}

// views: q, k, v, o, dO, dq, dk, dv (24 strides); dtypes[8].
int mt_flash_backward(int64_t B, int64_t T, int64_t H, int64_t D, float scale, void* const* ptrs, const int* dtypes,
                      const int64_t* strides, const float* lse, void* workspace, int64_t workspaceBytes, int variant,
                      void* stream) {
  return guarded([&] {
    mt::cuda::FlashView v[8];
    for (int i = 0; i < 8; ++i) v[i] = viewOf(ptrs[i], dtypes[i], strides + 3 * i);
    mt::cuda::flashAttentionBackward(problemOf(B, T, H, D, scale, 0, variant), v[0], v[1], v[2], v[3], v[4], lse, v[5],
                                     v[6], v[7], workspace, static_cast<size_t>(workspaceBytes),
                                     static_cast<cudaStream_t>(stream));
  });
}

// ---- cuDNN's fused attention through models/kernels/CudnnAttention.h

int64_t mt_cudnn_version() { return static_cast<int64_t>(cudnnGetVersion()); }

void* mt_cudnn_create() {
  CudnnContext* c = nullptr;
  guarded([&] { c = new CudnnContext(); });
  return c;
}
void mt_cudnn_destroy(void* ctx) {
  if (ctx) destroyContext(static_cast<CudnnContext*>(ctx));
}

// "" when cuDNN runs forward and backward for these eight views (plans built now), else why not.
const char* mt_cudnn_unsupported(void* ctx, int64_t B, int64_t T, int64_t H, int64_t D, void* const* ptrs,
                                 const int* dtypes, const int64_t* strides, int deterministic) {
  guarded([&] {  // an exception's message is a reason as well
    auto* c = static_cast<CudnnContext*>(ctx);
    lastError = c->attention.unsupported(c->handle, problemOf(B, T, H, D, 1.f, 0, 0),
                                         cudnnViews(ptrs, dtypes, strides, 8), deterministic != 0);
  });
  return lastError.c_str();
}

const char* mt_cudnn_engines(void* ctx, int64_t B, int64_t T, int64_t H, int64_t D, void* const* ptrs, const int* dtypes,
                             const int64_t* strides, int deterministic) {
  guarded([&] {
    auto* c = static_cast<CudnnContext*>(ctx);
    lastError = c->attention.engines(c->handle, problemOf(B, T, H, D, 1.f, 0, 0), cudnnViews(ptrs, dtypes, strides, 8),
                                     deterministic != 0);
  });
  return lastError.c_str();
}

// Workspace bytes of the forward (backward = 0) or backward; -1 on error.
int64_t mt_cudnn_workspace_bytes(void* ctx, int64_t B, int64_t T, int64_t H, int64_t D, void* const* ptrs,
                                 const int* dtypes, const int64_t* strides, int backward, int deterministic) {
  int64_t bytes = -1;
  guarded([&] {
    auto* c = static_cast<CudnnContext*>(ctx);
    const auto p = problemOf(B, T, H, D, 1.f, 0, 0);
    const auto v = cudnnViews(ptrs, dtypes, strides, 8);
    bytes = static_cast<int64_t>(backward ? c->attention.backwardWorkspaceBytes(c->handle, p, v, deterministic != 0)
                                          : c->attention.forwardWorkspaceBytes(c->handle, p, v));
  });
  return bytes;
}

// views: q, k, v, o (12 strides); stats: [B, H, T] f32.
int mt_cudnn_forward(void* ctx, int64_t B, int64_t T, int64_t H, int64_t D, float scale, void* const* ptrs,
                     const int* dtypes, const int64_t* strides, float* stats, void* workspace, int64_t workspaceBytes,
                     void* stream) {
  return guarded([&] {
    auto* c = static_cast<CudnnContext*>(ctx);
    c->attention.forward(c->handle, problemOf(B, T, H, D, scale, 0, 0), cudnnViews(ptrs, dtypes, strides, 4), stats,
                         workspace, static_cast<size_t>(workspaceBytes), static_cast<cudaStream_t>(stream));
  });
}

// views: q, k, v, o, dO, dq, dk, dv (24 strides).
int mt_cudnn_backward(void* ctx, int64_t B, int64_t T, int64_t H, int64_t D, float scale, void* const* ptrs,
                      const int* dtypes, const int64_t* strides, const float* stats, int deterministic, void* workspace,
                      int64_t workspaceBytes, void* stream) {
  return guarded([&] {
    auto* c = static_cast<CudnnContext*>(ctx);
    c->attention.backward(c->handle, problemOf(B, T, H, D, scale, 0, 0), cudnnViews(ptrs, dtypes, strides, 8), stats,
                          deterministic != 0, workspace, static_cast<size_t>(workspaceBytes),
                          static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
