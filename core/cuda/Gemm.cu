// cuBLASLt GEMM with plans cached per CudaRuntime (core/cuda/CudaGemm.h).
//
// Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T, so cuBLASLt is called
// with the operands swapped: its "A" is our B, its "B" is our A, m = N, n = M. A bias epilogue then
// adds bias[i] to column-major row i, i.e. to row-major column i: one value per output feature.

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/EnvParams.h"
#include "core/Log.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaGemm.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/CudaStream.h"
#include "core/cuda/PlanCache.h"

namespace mt::cuda {

namespace {

constexpr size_t kGemmWorkspace = 32u << 20;

struct PlanKey {
  int ta, tb;
  int64_t M, N, K;
  int ab, bt, c, epi, biasType;
  bool hasBeta, scaled, fastAccum;
  int64_t batch, sA, sB, sC, ldAux;
  uint32_t alignA, alignB, alignC, alignBias;  // algorithms differ by operand alignment
  bool operator<(const PlanKey& o) const {
    return std::tie(ta, tb, M, N, K, ab, bt, c, epi, biasType, hasBeta, scaled, fastAccum, batch, sA, sB, sC,
                    ldAux, alignA, alignB, alignC,
                    alignBias) < std::tie(o.ta, o.tb, o.M, o.N, o.K, o.ab, o.bt, o.c, o.epi, o.biasType,
                                          o.hasBeta, o.scaled, o.fastAccum, o.batch, o.sA, o.sB, o.sC,
                                          o.ldAux, o.alignA, o.alignB, o.alignC, o.alignBias);
  }
};

constexpr int kAlgoCandidates = 8;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  // The heuristic's candidates, best first; `current` is the one in use. A candidate cublasLtMatmul
  // refuses with NOT_SUPPORTED (the heuristic offers FP8 algorithms that cuBLAS 13 then refuses for
  // some shapes) is dropped for the next, once, on its first call.
  cublasLtMatmulAlgo_t algos[kAlgoCandidates]{};
  int count = 0, current = 0;
  bool ok = false;  // an algorithm is left (kept when not, so the query is not repeated)
  bool tune = false;  // MT_GEMM_AUTOTUNE: time the candidates on the first call (then cleared)
  void release() noexcept {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The plans of one CudaRuntime (its cuBLASLt handle chose their algorithms).
using GemmPlans = PlanCache<PlanKey, Plan>;

void setBatch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  int32_t b = static_cast<int32_t>(batch);
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof(stride)));
}

// FP8 scales: Lt's A is our B, so our B's scale is its A scale.
void setScalePointers(cublasLtMatmulDesc_t op, const GemmCall& g) {
  if (g.scaleB)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.scaleB,
                                                sizeof(g.scaleB)));
  if (g.scaleA)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.scaleA,
                                                sizeof(g.scaleA)));
}

uint32_t alignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0)
    al /= 2;
  return al;
}

// The cache key: everything that selects a cuBLASLt plan, the pointers' alignments included.
PlanKey keyOf(const GemmCall& g) {
  // Epilogues with an aux matrix: its type is the output's (bf16/f16/f32, as GELU_AUX and DGELU need).
  return PlanKey{static_cast<int>(g.transA),
                 static_cast<int>(g.transB),
                 g.M,
                 g.N,
                 g.K,
                 static_cast<int>(g.abType),
                 static_cast<int>(g.bType == kSameAsA ? g.abType : g.bType),
                 static_cast<int>(g.cType),
                 static_cast<int>(g.epilogue),
                 static_cast<int>(g.biasType),
                 g.beta != 0.f,
                 g.scaleA != nullptr || g.scaleB != nullptr,
                 g.fastAccum,
                 g.batch,
                 g.strideA,
                 g.strideB,
                 g.strideC,
                 g.ldAux,
                 alignmentOf(g.A),
                 alignmentOf(g.B),
                 alignmentOf(g.C),
                 g.bias ? alignmentOf(g.bias) : 256u};
}

// The operation: transposes, epilogue, aux leading dimension, fast accumulation, FP8 scales, bias type.
void describeOp(const GemmCall& g, Plan& p) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Lt's A is our B, Lt's B is our A.
  cublasOperation_t opA = g.transB == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = g.transA == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof(g.epilogue)));
  if (g.ldAux)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.ldAux,
                                                sizeof(g.ldAux)));
  if (g.fastAccum) {
    const int8_t fast = 1;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  setScalePointers(p.op, g);
  if (g.biasType != kDefaultBiasType) {
    const int32_t bt = static_cast<int32_t>(g.biasType);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
}

// The matrix layouts (column-major, as cuBLASLt stores them), batched where asked.
void describeLayouts(const GemmCall& g, Plan& p) {
  // Stored shapes (column-major): our B is [K,N] row-major (or [N,K] when transposed).
  const uint64_t aRows = g.transB == Trans::kYes ? g.K : g.N, aCols = g.transB == Trans::kYes ? g.N : g.K;
  const uint64_t bRows = g.transA == Trans::kYes ? g.M : g.K, bCols = g.transA == Trans::kYes ? g.K : g.M;
  // Lt's A is our B: B's type.
  const cudaDataType_t bType = g.bType == kSameAsA ? g.abType : g.bType;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, bType, aRows, aCols, static_cast<int64_t>(aRows)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, g.abType, bRows, bCols, static_cast<int64_t>(bRows)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, g.cType, g.N, g.M, g.N));
  setBatch(p.a, g.batch, g.strideB);
  setBatch(p.b, g.batch, g.strideA);
  setBatch(p.c, g.batch, g.strideC);
}

// The heuristic's algorithms for the plan (none: the caller falls back).
void findAlgos(const GemmCall& g, const PlanKey& key, Plan& p, CudaRuntime& rt) {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kGemmWorkspace;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Lt's A/B are our B/A.
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.alignB, 4));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.alignA, 4));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.alignC, 4));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.alignC, 4));
  // Heuristics need representative pointers' alignment; the bias pointer must be set to query.
  const void* dummyBias = g.bias;
  if (dummyBias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dummyBias,
                                                sizeof(dummyBias)));
  cublasLtMatmulHeuristicResult_t heur[kAlgoCandidates]{};
  int found = 0;
  // NOT_SUPPORTED or INVALID_VALUE (an epilogue or bias type this cuBLASLt has no kernel for; the
  // H200's cuBLAS 13 answers the latter for an f32 bias under bf16) mean "no algorithm": the
  // caller falls back, and gemm() still names the shape if nothing runs it.
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(rt.cublasLt(), p.op, p.a, p.b, p.c, p.c, pref, kAlgoCandidates, heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_NOT_SUPPORTED && hs != CUBLAS_STATUS_INVALID_VALUE) CUBLAS_CHECK(hs);
  if (hs == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (heur[i].state == CUBLAS_STATUS_SUCCESS) p.algos[p.count++] = heur[i].algo;
  p.ok = p.count > 0;
  p.tune = p.count > 1 && envInt(EnvParam::kGemmAutotune) == 1;
}

Plan& planFor(const GemmCall& g, CudaRuntime& rt) {
  const PlanKey key = keyOf(g);
  GemmPlans& cache = rt.components().get<GemmPlans>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return it->second;
  Plan p;
  describeOp(g, p);
  describeLayouts(g, p);
  findAlgos(g, key, p, rt);
  return cache.plans.emplace(key, p).first->second;
}

cublasStatus_t runAlgo(const GemmCall& g, Plan& p, int i, CudaRuntime& rt, void* ws, void* d) {
  return cublasLtMatmul(rt.cublasLt(), p.op, &g.alpha, g.B, p.a, g.A, p.b, &g.beta, g.Cin ? g.Cin : g.C, p.c, d,
                        p.c, &p.algos[i], ws, kGemmWorkspace, currentStream());
}

size_t elementBytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 1;
  }
}

// MT_GEMM_AUTOTUNE=1, a plan's first call: each of the heuristic's candidates runs once to warm up
// and three times between two events; the fastest becomes the plan's first. With beta != 0 the
// timed runs write a scratch D (the real one would accumulate four times); with beta = 0 they
// write D, the same values each time, and the epilogue outputs (GELU's aux, a bias gradient) the
// same way. Not while the stream is being captured into a graph (no synchronisation there).
void autotune(const GemmCall& g, Plan& p, CudaRuntime& rt, void* ws) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(currentStream(), &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  Tensor scratch;
  void* d = g.C;
  if (g.beta != 0.f) {
    const int64_t elems = (g.batch > 1 ? (g.batch - 1) * g.strideC : 0) + g.M * g.N;
    scratch = Tensor::empty({elems * static_cast<int64_t>(elementBytes(g.cType))}, DType::kU8, rt.dev());
    d = scratch.rawData();
  }
  CudaEvent start(true), end(true);
  float best = 0.f, first = 0.f;
  int bestAt = -1;
  for (int i = p.current; i < p.count; ++i) {
    const cublasStatus_t st = runAlgo(g, p, i, rt, ws, d);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) continue;
    CUBLAS_CHECK(st);
    start.record(currentStream());
    for (int r = 0; r < 3; ++r) CUBLAS_CHECK(runAlgo(g, p, i, rt, ws, d));
    end.record(currentStream());
    end.synchronize();
    const float ms = end.elapsedMs(start) / 3.f;
    if (bestAt < 0) first = ms;
    if (bestAt < 0 || ms < best) best = ms, bestAt = i;
  }
  if (bestAt > p.current) std::swap(p.algos[p.current], p.algos[bestAt]);
  MT_LOG_DEBUG << "gemm autotune M=" << g.M << " N=" << g.N << " K=" << g.K << ": candidate " << bestAt + 1 << " of "
               << p.count << ", " << best << " ms against the heuristic's first " << first << " ms";
}

}  // namespace

bool tryGemm(const GemmCall& g) {
  if (g.M == 0 || g.N == 0) return true;
  CudaRuntime& rt = CudaRuntime::require();
  Plan& p = planFor(g, rt);
  if (!p.ok) return false;
  if (g.bias)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  if (g.aux)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                sizeof(g.aux)));
  setScalePointers(p.op, g);
  void* ws = rt.workspace(kGemmWorkspace);
  if (p.tune) {
    std::lock_guard<std::mutex> lock(rt.components().get<GemmPlans>().mutex);
    if (p.tune) autotune(g, p, rt, ws);
    p.tune = false;
  }
  for (; p.current < p.count; ++p.current) {
    const cublasStatus_t st = runAlgo(g, p, p.current, rt, ws, g.C);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
      CUBLAS_CHECK(st);
      return true;
    }
  }
  p.ok = false;  // no candidate runs it: the caller's fallback, or gemm()'s error naming the shape
  return false;
}

void gemm(const GemmCall& g) {
  if (!tryGemm(g))
    throw CudaError("cuBLASLt has no algorithm for GEMM M=" + std::to_string(g.M) +
                    " N=" + std::to_string(g.N) + " K=" + std::to_string(g.K));
}

}  // namespace mt::cuda
