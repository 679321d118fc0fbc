#pragma once
// Row-major GEMM on the GPU through cuBLASLt: C[M,N] = alpha * op(A) * op(B) + beta * C, with
// optional fused epilogues (bias, GELU, bias gradient). Inputs f32/bf16/f16, or FP8 (E4M3/E5M2, TN
// only, with A/B scale pointers: core/Fp8.h), f32 accumulate.
// Plans (descriptors + heuristic algorithm) are cached per shape, so a training step spends no
// time in cublasLtMatmulAlgoGetHeuristic after the first.

#include <cublasLt.h>

#include "core/Gemm.h"

namespace mt::cuda {

// cuBLASLt's default bias type: the output's.
constexpr cudaDataType_t kDefaultBiasType = static_cast<cudaDataType_t>(-1);
// GemmCall::bType's default: B has A's type.
constexpr cudaDataType_t kSameAsA = static_cast<cudaDataType_t>(-1);

struct GemmCall {
  Trans transA = Trans::kNo, transB = Trans::kNo;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.f, beta = 0.f;
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;                 // D, and C unless Cin is set
  const void* Cin = nullptr;         // C (read when beta != 0) when it is not D
  cudaDataType_t abType = CUDA_R_32F;
  cudaDataType_t bType = kSameAsA;  // B's type when it is not A's (FP8: E5M2 x E4M3)
  const float* scaleA = nullptr;    // FP8: device pointers to A's / B's dequantization scales,
  const float* scaleB = nullptr;    // which multiply the f32 accumulator
  bool fastAccum = false;           // FP8: CUBLASLT_MATMUL_DESC_FAST_ACCUM
  cudaDataType_t cType = CUDA_R_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;        // [N] (per output column of C): BIAS/GELU_BIAS input, BGRAD output
  cudaDataType_t biasType = kDefaultBiasType;  // the bias vector's type when it is not C's
  void* aux = nullptr;               // GELU input: written by GELU_AUX, read by DGELU
  int64_t ldAux = 0;
  int64_t batch = 1;                 // strided batched GEMM
  int64_t strideA = 0, strideB = 0, strideC = 0;
};

// Enqueues the call on the current stream; false (nothing enqueued) when cuBLASLt has no algorithm
// for it (an epilogue or bias type this cuBLASLt lacks), so the caller can fall back.
bool tryGemm(const GemmCall& call);
// As tryGemm, throwing CudaError naming the shape when there is no algorithm.
void gemm(const GemmCall& call);

}  // namespace mt::cuda
