// The Linear layer on the GPU, on the cuBLASLt GEMM of core/cuda/CudaGemm.h (row-major; bias
// epilogues add one value per output feature).
//
// Linear: y = x W^T + b      -> gemm(no, trans, M=rows, N=out, K=in) with the BIAS epilogue
//         dx = dy W          -> gemm(no, no,   M=rows, N=in,  K=out)          (overwrites)
//         dW += dy^T x       -> gemm(trans, no, M=out, N=in,  K=rows, beta=1) (accumulates)
//         db += colsum(dy)   -> column-sum kernel                               (accumulates)
// Linear+GELU (GPT-2's MLP, tanh GELU): y = GELU(x W^T + b) with pre = x W^T + b kept, in one GEMM
// through the GELU_AUX_BIAS epilogue; its backward dpre = (dy W2) * GELU'(pre) in the DGELU
// epilogue of the next layer's input-gradient GEMM, which can also produce the fc layer's bias
// gradient colsum(dpre) (DGELU_BGRAD: the reduction runs over the GEMM's output rows, in the tile
// epilogue). Separate kernels where cuBLASLt has no algorithm for the epilogue (or
// MT_GEMM_EPILOGUES=0/1). Other bias gradients stay with our column-sum kernels: cuBLASLt's BGRADB
// epilogue (a reduction over the weight-gradient GEMM's k) ran as a separate kernel of its own,
// 4.3 ms per GPT-2 step against our 3.6 (H200, 2026-12-03).
// In bf16/f16 matmul precision, f32 operands are cast into scratch buffers (operands already in
// the matmul dtype are read as they are); y may be f32 or the matmul dtype, gradients are f32. An
// f32 bias is read as it is by a bf16/f16 GEMM where cuBLASLt allows (no cast of the bias).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/Convert.h"
#include "core/EnvParams.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/ElementConvert.cuh"
#include "core/cuda/CudaGemm.h"
#include "models/kernels/CudaLayers.h"

namespace mt::cuda {

namespace {

int gridFor(int64_t n, int block = 256) { return static_cast<int>(std::min<int64_t>((n + block - 1) / block, 65535 * 8)); }

// Column sums of dy [R, C] added to db [C], deterministic: partials over fixed row chunks, then a
// fixed tree over the partials (a 32 x 32 block per 32 columns: one thread per column looping over
// 256 partials was 32 us per call at GPT-2 size, a third of the whole column sum).
constexpr int kRowsPerChunk = 256;
template <typename T>
__global__ void colSumPartial(const T* dy, float* part, int64_t R, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (c >= C) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = min(R, r0 + kRowsPerChunk);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // independent loads in flight
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += toF32(dy[(r + i) * C + c]);
  for (; r < r1; ++r) acc[0] += toF32(dy[r * C + c]);
  part[chunk * C + c] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
}
constexpr int kColReduceRows = 32;
__global__ void colSumFinal(const float* part, float* db, int64_t chunks, int64_t C) {
  __shared__ float sh[kColReduceRows][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = blockIdx.x * 32 + tx;
  float acc = 0.f;
  if (c < C)
    for (int64_t k = ty; k < chunks; k += kColReduceRows) acc += part[k * C + c];
  sh[ty][tx] = acc;
  __syncthreads();
  for (int s = kColReduceRows / 2; s > 0; s >>= 1) {
    if (ty < s) sh[ty][tx] += sh[ty + s][tx];
    __syncthreads();
  }
  if (ty == 0 && c < C) db[c] += sh[0][tx];
}

// Operand in the matmul precision: the tensor itself (f32), or a cast copy.
Tensor asOperand(const Tensor& t, MatmulPrecision p) {
  if (p == MatmulPrecision::kF32 || t.dtype() != DType::kF32) return t;
  Tensor out = Tensor::empty(t.shape(), p == MatmulPrecision::kBF16 ? DType::kBF16 : DType::kF16, t.device());
  convertInto(out, t);
  return out;
}

cudaDataType_t cudaTypeOf(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

}  // namespace

namespace {
// The GELU epilogues are used in reduced precision (the f32 path keeps the accurate tanhf kernel
// that matches the CPU), when not switched off, and where the aux matrix's rows are 16-byte
// multiples (cuBLASLt's requirement on its leading dimension).
int epilogueLevel() {
  static const int level = static_cast<int>(envInt(EnvParam::kGemmEpilogues));
  return level;
}
bool geluEpilogueFor(DType out, int64_t width) { return epilogueLevel() >= 1 && out != DType::kF32 && width % 8 == 0; }

// g with a bias of another dtype than the output (an f32 bias under a bf16 GEMM): as it is where
// cuBLASLt has an algorithm for that bias type, else with the bias cast to the output's dtype.
bool tryGemmBias(GemmCall g, const Tensor* b, DType yType) {
  if (tryGemm(g)) return true;
  if (!b || g.biasType == kDefaultBiasType) return false;
  Tensor cast = Tensor::empty(b->shape(), yType, b->device());
  convertInto(cast, *b);
  g.bias = cast.rawData();
  g.biasType = kDefaultBiasType;
  return tryGemm(g);  // the cast is freed stream-ordered, after the GEMM has read it
}
void gemmBias(const GemmCall& g, const Tensor* b, DType yType) {
  if (!tryGemmBias(g, b, yType))
    throw CudaError("cuBLASLt has no algorithm for GEMM M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
                    " K=" + std::to_string(g.K) + " with a bias");
}

// y = x W^T (+ bias): the GEMM call without epilogue-specific fields (enqueue with gemmBias).
GemmCall forwardCall(Tensor& y, const Tensor& xo, const Tensor& wo, const Tensor* b) {
  const int64_t O = wo.dim(0), I = wo.dim(1), N = xo.numel() / I;
  MT_CHECK(xo.dtype() == wo.dtype(), "linear: x is ", dtypeName(xo.dtype()), ", W is ", dtypeName(wo.dtype()));
  GemmCall g;
  g.transA = Trans::kNo;
  g.transB = Trans::kYes;
  g.M = N, g.N = O, g.K = I;
  g.A = xo.rawData();
  g.B = wo.rawData();
  g.C = y.rawData();
  g.abType = cudaTypeOf(xo.dtype());
  g.cType = cudaTypeOf(y.dtype());
  if (b) {
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    g.bias = b->rawData();
    if (b->dtype() != y.dtype()) g.biasType = cudaTypeOf(b->dtype());
  }
  return g;
}

__global__ void addIntoKernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// db[O] += colsum(dy [N, O]).
void colSumInto(Tensor& db, const Tensor& dyRaw, int64_t N, int64_t O) {
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  Tensor part = Tensor::empty({chunks, O}, DType::kF32, dyRaw.device());
  dim3 grid(static_cast<unsigned>((O + 255) / 256), static_cast<unsigned>(chunks));
  dispatchFloat(dyRaw.dtype(), [&](auto t) {
    using T = decltype(t);
    colSumPartial<<<grid, 256, 0, currentStream()>>>(static_cast<const T*>(dyRaw.rawData()),
                                                     part.data<float>(), N, O);
  });
  colSumFinal<<<static_cast<unsigned>((O + 31) / 32), 32 * kColReduceRows, 0, currentStream()>>>(
      part.data<float>(), db.data<float>(), chunks, O);
  CUDA_CHECK(cudaGetLastError());
}

// dW += dy^T x and db += colsum(dy), dy and x already in the matmul dtype (dyRaw: dy as given, for
// the column sums, which read f32 gradients as they are); dyColSum: colsum(dy) already computed
// (f32 [O], by an earlier GEMM's epilogue).
void weightGrads(Tensor& dw, Tensor* db, const Tensor& dyo, const Tensor& dyRaw, const Tensor& xo, int64_t N,
                 int64_t O, int64_t I, const Tensor* dyColSum) {
  GemmCall g;
  g.transA = Trans::kYes;
  g.M = O, g.N = I, g.K = N;
  g.beta = 1.f;
  g.A = dyo.rawData();
  g.B = xo.rawData();
  g.C = dw.rawData();
  g.abType = cudaTypeOf(dyo.dtype());
  gemm(g);
  if (db && dyColSum) {
    MT_CHECK(dyColSum->dtype() == DType::kF32 && dyColSum->numel() == O, "linear backward: column sums ",
             dyColSum->str(), " for ", O, " outputs");
    addIntoKernel<<<gridFor(O), 256, 0, currentStream()>>>(db->data<float>(), dyColSum->data<float>(), O);
    CUDA_CHECK(cudaGetLastError());
  } else if (db) {
    colSumInto(*db, dyRaw, N, O);
  }
}
}  // namespace

void linearForward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* residual) {
  const MatmulPrecision prec = CudaRuntime::require().matmulPrecision();
  Tensor xo = asOperand(x, prec), wo = asOperand(w, prec);
  GemmCall g = forwardCall(y, xo, wo, b);
  if (residual) {  // y = x W^T + b + residual: the GEMM reads the residual as C (beta = 1)
    MT_CHECK(residual->dtype() == y.dtype() && residual->numel() == y.numel(), "linear residual ", residual->str(),
             " for ", y.str());
    g.beta = 1.f;
    g.Cin = residual->rawData();
  }
  gemmBias(g, b, y.dtype());
}

void linearBiasGrad(Tensor& db, const Tensor& dy) {
  const int64_t O = db.numel(), N = dy.numel() / O;
  if (N > 0 && O > 0) colSumInto(db, dy, N, O);
}

void linearGeluForward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor* b) {
  MT_CHECK(pre.dtype() == y.dtype() && pre.numel() == y.numel(), "linear+GELU: pre-activation ", pre.str(),
           " for ", y.str());
  const MatmulPrecision prec = CudaRuntime::require().matmulPrecision();
  Tensor xo = asOperand(x, prec), wo = asOperand(w, prec);
  if (geluEpilogueFor(y.dtype(), w.dim(0))) {
    GemmCall g = forwardCall(y, xo, wo, b);
    g.epilogue = b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    g.aux = pre.rawData();
    g.ldAux = w.dim(0);
    if (tryGemmBias(g, b, y.dtype())) return;
  }
  GemmCall g = forwardCall(pre, xo, wo, b);
  gemmBias(g, b, pre.dtype());
  cuda::geluForward(y, pre, GeluKind::kTanh);
}

void linearBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Tensor* dyColSum) {
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  const MatmulPrecision prec = CudaRuntime::require().matmulPrecision();
  Tensor dyo = asOperand(dy, prec), xo = asOperand(x, prec);
  MT_CHECK(dyo.dtype() == xo.dtype(), "linear backward: dy is ", dtypeName(dyo.dtype()), ", x is ",
           dtypeName(xo.dtype()));
  if (dx) {
    Tensor wo = asOperand(w, prec);
    MT_CHECK(wo.dtype() == dyo.dtype(), "linear backward: W is ", dtypeName(wo.dtype()), ", dy is ",
             dtypeName(dyo.dtype()));
    GemmCall g;
    g.M = N, g.N = I, g.K = O;
    g.A = dyo.rawData();
    g.B = wo.rawData();
    g.C = dx->rawData();
    g.abType = cudaTypeOf(dyo.dtype());
    g.cType = cudaTypeOf(dx->dtype());
    gemm(g);
  }
  weightGrads(dw, db, dyo, dy, xo, N, O, I, dyColSum);
}

void linearBackwardDGelu(Tensor& dpre, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         const Tensor& pre, Tensor* dpreColSum) {
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  MT_CHECK(pre.numel() == N * I && dpre.numel() == N * I, "linear+dGELU: pre-activation ", pre.str(), ", its gradient ",
           dpre.str(), " for input ", x.str());
  const MatmulPrecision prec = CudaRuntime::require().matmulPrecision();
  Tensor dyo = asOperand(dy, prec), xo = asOperand(x, prec), wo = asOperand(w, prec);
  GemmCall g;
  g.M = N, g.N = I, g.K = O;
  g.A = dyo.rawData();
  g.B = wo.rawData();
  g.abType = cudaTypeOf(dyo.dtype());
  bool fused = false;
  if (geluEpilogueFor(dpre.dtype(), I) && pre.dtype() == dpre.dtype()) {
    // dpre = (dy W) * GELU'(pre) in the GEMM's epilogue.
    g.C = dpre.rawData();
    g.cType = cudaTypeOf(dpre.dtype());
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.aux = const_cast<void*>(pre.rawData());
    g.ldAux = I;
    if (dpreColSum && epilogueLevel() >= 2) {
      // The same GEMM also writes colsum(dpre) (the previous layer's bias gradient), in f32 where
      // cuBLASLt allows, else in the output's dtype and widened.
      GemmCall gb = g;
      gb.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
      Tensor sum = Tensor::empty({I}, DType::kF32, dpre.device());
      gb.bias = sum.rawData();
      gb.biasType = CUDA_R_32F;
      if (tryGemm(gb)) {
        *dpreColSum = sum;
        fused = true;
      } else {
        Tensor low = Tensor::empty({I}, dpre.dtype(), dpre.device());
        gb.bias = low.rawData();
        gb.biasType = kDefaultBiasType;
        if (tryGemm(gb)) {
          convertInto(sum, low);
          *dpreColSum = sum;
          fused = true;
        }
      }
    }
    if (!fused) fused = tryGemm(g);
  }
  if (!fused) {
    Tensor dg = Tensor::empty(dpre.shape(), dpre.dtype(), dpre.device());
    g.C = dg.rawData();
    g.cType = cudaTypeOf(dg.dtype());
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    g.aux = nullptr;
    g.ldAux = 0;
    gemm(g);
    cuda::geluBackward(dpre, dg, pre, GeluKind::kTanh);
  }
  weightGrads(dw, db, dyo, dy, xo, N, O, I, nullptr);
}

}  // namespace mt::cuda
