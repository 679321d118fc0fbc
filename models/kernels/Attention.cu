// Causal self-attention on the GPU (math in models/layers/Attention.h). In bf16/f16 matmul
// precision, qkv is cast once to the matmul dtype (read in place when it arrives so) and handed as
// strided views (no split, nothing T x T) to the fused kernel models/kernels/AttentionChoice.h
// picks for the shape: our flash kernels (models/kernels/FlashAttention.h) or cuDNN's
// (models/kernels/CudnnAttention.h, which writes O, dO and dqkv in the operand dtype: those
// arriving otherwise go through a cast). Otherwise (f32, a head dim neither runs) the reference path: q, k, v are split out of the fused qkv
// tensor into [B*H, T, d] batches, S = q k^T / sqrt(d) and the outputs are strided batched
// cuBLASLt GEMMs, and the causal softmax and its backward are row kernels (one block per row);
// P [B, H, T, T] is kept for the backward. Also the residual add and positional embedding.

#include <cuda_bf16.h>

#include "core/Convert.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/CudaGemm.h"
#include "models/kernels/CudaLayers.h"
#include "models/kernels/AttentionChoice.h"
#include "models/kernels/CudnnAttention.h"
#include "models/kernels/FlashAttention.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

// qkv [B,T,3,H,d] -> q/k/v [B,H,T,d] (which = 0, 1, 2), or back (scatter).
__global__ void splitHeads(const float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t H, int64_t d) {
  const int64_t C = H * d, total = B * T * 3 * C;
  MT_GRID_STRIDE(i, total) {
    const int64_t c = i % C, which = (i / C) % 3, t = (i / (3 * C)) % T, b = i / (3 * C * T);
    const int64_t h = c / d, j = c % d;
    float* dst = which == 0 ? q : which == 1 ? k : v;
    dst[((b * H + h) * T + t) * d + j] = qkv[i];
  }
}
__global__ void mergeGrads(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t B, int64_t T,
                           int64_t H, int64_t d) {
  const int64_t C = H * d, total = B * T * 3 * C;
  MT_GRID_STRIDE(i, total) {
    const int64_t c = i % C, which = (i / C) % 3, t = (i / (3 * C)) % T, b = i / (3 * C * T);
    const int64_t h = c / d, j = c % d;
    const float* src = which == 0 ? dq : which == 1 ? dk : dv;
    dqkv[i] = src[((b * H + h) * T + t) * d + j];
  }
}
// [B,H,T,d] <-> [B,T,H*d]
__global__ void headsToRows(const float* o, float* y, int64_t B, int64_t T, int64_t H, int64_t d) {
  const int64_t total = B * T * H * d;
  MT_GRID_STRIDE(i, total) {
    const int64_t j = i % d, h = (i / d) % H, t = (i / (d * H)) % T, b = i / (d * H * T);
    y[i] = o[((b * H + h) * T + t) * d + j];
  }
}
__global__ void rowsToHeads(const float* y, float* o, int64_t B, int64_t T, int64_t H, int64_t d) {
  const int64_t total = B * T * H * d;
  MT_GRID_STRIDE(i, total) {
    const int64_t j = i % d, h = (i / d) % H, t = (i / (d * H)) % T, b = i / (d * H * T);
    o[((b * H + h) * T + t) * d + j] = y[i];
  }
}

// In place: row t of S (already scaled) -> causal softmax P; one block per row.
__global__ void causalSoftmax(float* S, int64_t T) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, t = row % T;
  float* r = S + row * T;
  float mx = -INFINITY;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) mx = fmaxf(mx, r[s]);
  mx = blockMax(mx, red);
  float sum = 0.f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) sum += expf(r[s] - mx);
  sum = blockSum(sum, red);
  const float inv = 1.f / sum;
  for (int64_t s = threadIdx.x; s < T; s += blockDim.x) r[s] = s <= t ? expf(r[s] - mx) * inv : 0.f;
}

// In place: dP -> dS = P * (dP - sum_s P dP) * scale.
__global__ void causalSoftmaxBackward(const float* P, float* dP, int64_t T, float scale) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, t = row % T;
  const float* p = P + row * T;
  float* g = dP + row * T;
  float dot = 0.f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) dot += p[s] * g[s];
  dot = blockSum(dot, red);
  for (int64_t s = threadIdx.x; s < T; s += blockDim.x) g[s] = s <= t ? p[s] * (g[s] - dot) * scale : 0.f;
}

__global__ void addKernel(float* y, const float* x, int64_t n) {
  MT_GRID_STRIDE(i, n) { y[i] += x[i]; }
}
__global__ void posAdd(float* x, const float* wpe, int64_t B, int64_t T, int64_t C) {
  MT_GRID_STRIDE(i, B * T * C) { x[i] += wpe[i % (T * C)]; }
}
__global__ void posBackward(float* dwpe, const float* dx, int64_t B, int64_t T, int64_t C) {
  MT_GRID_STRIDE(i, T * C) {
    float acc = 0.f;
    for (int64_t b = 0; b < B; ++b) acc += dx[b * T * C + i];
    dwpe[i] += acc;
  }
}

// Batched row-major GEMM over B*H heads, in the runtime's matmul precision.
void batchedGemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A, const Tensor& Bm,
                 Tensor& C, int64_t batch) {
  const MatmulPrecision prec = CudaRuntime::require().matmulPrecision();
  Tensor a = A, b = Bm;
  cudaDataType_t type = CUDA_R_32F;
  if (prec != MatmulPrecision::kF32) {
    const DType low = prec == MatmulPrecision::kBF16 ? DType::kBF16 : DType::kF16;
    a = Tensor::empty(A.shape(), low, A.device());
    b = Tensor::empty(Bm.shape(), low, Bm.device());
    convertInto(a, A);
    convertInto(b, Bm);
    type = low == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  GemmCall g;
  g.transA = ta;
  g.transB = tb;
  g.M = M, g.N = N, g.K = K;
  g.alpha = alpha;
  g.A = a.rawData();
  g.B = b.rawData();
  g.C = C.rawData();
  g.abType = type;
  g.batch = batch;
  g.strideA = M * K;
  g.strideB = K * N;
  g.strideC = M * N;
  gemm(g);
}

void referenceForward(Tensor& y, const Tensor& qkv, int64_t heads, AttentionSaved* saved) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = heads, d = C / H, BH = B * H;
  cudaStream_t s = currentStream();
  Device dev = qkv.device();
  Tensor att = Tensor::empty({B, H, T, T}, DType::kF32, dev);
  if (saved) {
    saved->qkv = qkv;
    saved->probs = att;
  }
  Tensor q = Tensor::empty({BH, T, d}, DType::kF32, dev), k = Tensor::empty({BH, T, d}, DType::kF32, dev),
         v = Tensor::empty({BH, T, d}, DType::kF32, dev), o = Tensor::empty({BH, T, d}, DType::kF32, dev);
  splitHeads<<<gridFor1d(qkv.numel()), 256, 0, s>>>(qkv.data<float>(), q.data<float>(), k.data<float>(),
                                                     v.data<float>(), B, T, H, d);
  batchedGemm(Trans::kNo, Trans::kYes, T, T, d, 1.f / std::sqrt(static_cast<float>(d)), q, k, att, BH);
  causalSoftmax<<<static_cast<unsigned>(BH * T), 256, 0, s>>>(att.data<float>(), T);
  batchedGemm(Trans::kNo, Trans::kNo, T, d, T, 1.f, att, v, o, BH);
  headsToRows<<<gridFor1d(o.numel()), 256, 0, s>>>(o.data<float>(), y.data<float>(), B, T, H, d);
  checkLaunch();
}

void referenceBackward(Tensor& dqkv, const Tensor& dy, const Tensor& qkv, const Tensor& att, int64_t heads) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = heads, d = C / H, BH = B * H;
  cudaStream_t s = currentStream();
  Device dev = qkv.device();
  auto heads3 = [&] { return Tensor::empty({BH, T, d}, DType::kF32, dev); };
  Tensor q = heads3(), k = heads3(), v = heads3(), dO = heads3(), dq = heads3(), dk = heads3(), dv = heads3();
  splitHeads<<<gridFor1d(qkv.numel()), 256, 0, s>>>(qkv.data<float>(), q.data<float>(), k.data<float>(),
                                                     v.data<float>(), B, T, H, d);
  rowsToHeads<<<gridFor1d(dy.numel()), 256, 0, s>>>(dy.data<float>(), dO.data<float>(), B, T, H, d);
  Tensor dP = Tensor::empty({BH, T, T}, DType::kF32, dev);
  batchedGemm(Trans::kYes, Trans::kNo, T, d, T, 1.f, att, dO, dv, BH);  // dv = P^T dO
  batchedGemm(Trans::kNo, Trans::kYes, T, T, d, 1.f, dO, v, dP, BH);    // dP = dO v^T
  causalSoftmaxBackward<<<static_cast<unsigned>(BH * T), 256, 0, s>>>(att.data<float>(), dP.data<float>(), T,
                                                                      1.f / std::sqrt(static_cast<float>(d)));
  batchedGemm(Trans::kNo, Trans::kNo, T, d, T, 1.f, dP, k, dq, BH);   // dq = dS k
  batchedGemm(Trans::kYes, Trans::kNo, T, d, T, 1.f, dP, q, dk, BH);  // dk = dS^T q
  mergeGrads<<<gridFor1d(dqkv.numel()), 256, 0, s>>>(dqkv.data<float>(), dq.data<float>(), dk.data<float>(),
                                                      dv.data<float>(), B, T, H, d);
  checkLaunch();
}


// The matmul dtype of the fused paths, or kF32 in f32 precision (the reference path).
DType lowDType() {
  const MatmulPrecision prec = CudaRuntime::require().matmulPrecision();
  if (prec == MatmulPrecision::kF32) return DType::kF32;
  return prec == MatmulPrecision::kBF16 ? DType::kBF16 : DType::kF16;
}

// t itself when it has dtype `low`, else a fresh tensor of t's shape in `low` (holding t's values
// when `copy`).
Tensor inDType(const Tensor& t, DType low, bool copy) {
  if (t.dtype() == low) return t;
  Tensor out = Tensor::empty(t.shape(), low, t.device());
  if (copy) convertInto(out, t);
  return out;
}

void cudnnForward(Tensor& y, const Tensor& qkvLow, int64_t heads, bool deterministicBackward, AttentionSaved* saved) {
  CudaRuntime& rt = CudaRuntime::require();
  const FlashProblem p = problemOf(qkvLow, heads);
  Tensor yLow = inDType(y, qkvLow.dtype(), false);  // cuDNN writes O in the operand dtype
  Tensor stats = Tensor::empty({CudnnAttention::statsElements(p)}, DType::kF32, qkvLow.device());
  const CudnnAttentionViews v = layerViews(qkvLow, yLow, Tensor(), Tensor(), heads);
  CudnnAttention& c = cudnnAttentionOf(rt);
  cudnnHandle_t h = rt.cudnn();
  const size_t wsBytes = c.forwardWorkspaceBytes(h, p, v);
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<size_t>(wsBytes, 1))}, DType::kU8, qkvLow.device());
  c.forward(h, p, v, stats.data<float>(), ws.rawData(), wsBytes, currentStream());
  if (!yLow.sharesStorageWith(y)) convertInto(y, yLow);
  if (saved) {
    saved->path = AttentionPath::kCudnn;
    saved->cudnnDeterministicBackward = deterministicBackward;
    saved->qkvLow = qkvLow;
    saved->lse = stats;
    saved->y = yLow;
  }
}

void cudnnBackward(Tensor& dqkv, const Tensor& dy, const AttentionSaved& saved, int64_t heads) {
  CudaRuntime& rt = CudaRuntime::require();
  const Tensor& qkvLow = saved.qkvLow;
  const FlashProblem p = problemOf(qkvLow, heads);
  const Tensor dyLow = inDType(dy, qkvLow.dtype(), true);
  Tensor dqkvLow = inDType(dqkv, qkvLow.dtype(), false);
  const CudnnAttentionViews v = layerViews(qkvLow, saved.y, dyLow, dqkvLow, heads);
  CudnnAttention& c = cudnnAttentionOf(rt);
  cudnnHandle_t h = rt.cudnn();
  const bool det = saved.cudnnDeterministicBackward;
  const size_t wsBytes = c.backwardWorkspaceBytes(h, p, v, det);
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<size_t>(wsBytes, 1))}, DType::kU8, qkvLow.device());
  c.backward(h, p, v, saved.lse.data<float>(), det, ws.rawData(), wsBytes, currentStream());
  if (!dqkvLow.sharesStorageWith(dqkv)) convertInto(dqkv, dqkvLow);
}

}  // namespace

void attentionForward(Tensor& y, const Tensor& qkv, int64_t heads, AttentionSaved* saved, AttentionBackend backend) {
  if (saved) saved->clear();
  const int64_t d = qkv.dim(2) / 3 / heads;
  const DType low = lowDType();
  // The input in the matmul dtype: read in place when the qkv GEMM already wrote it.
  const Tensor qkvLow = low == DType::kF32 ? Tensor() : inDType(qkv, low, true);
  const AttentionChoice choice = low == DType::kF32 ? AttentionChoice() : chooseAttention(backend, qkvLow, heads);
  const AttentionPath path = choice.path;
  if (path == AttentionPath::kReference) {
    // Reference path (f32 throughout): activations that arrive in reduced precision are widened.
    const Tensor q32 = inDType(qkv, DType::kF32, true);
    Tensor y32 = inDType(y, DType::kF32, false);
    referenceForward(y32, q32, heads, saved);
    if (!y32.sharesStorageWith(y)) convertInto(y, y32);
    return;
  }
  if (path == AttentionPath::kCudnn) {
    cudnnForward(y, qkvLow, heads, choice.cudnnDeterministicBackward, saved);
    return;
  }
  const FlashProblem p = problemOf(qkv, heads);
  Tensor lse = Tensor::empty({flashLseElements(p)}, DType::kF32, qkv.device());
  flashAttentionForward(p, qkvView(qkvLow, 0, p.H, d), qkvView(qkvLow, 1, p.H, d), qkvView(qkvLow, 2, p.H, d),
                        rowsView(y, d), lse.data<float>(), currentStream());
  if (saved) {
    saved->path = AttentionPath::kFlash;
    saved->qkvLow = qkvLow;
    saved->lse = lse;
    saved->y = y;
  }
}

void attentionBackward(Tensor& dqkv, const Tensor& dy, const AttentionSaved& saved, int64_t heads) {
  if (saved.path == AttentionPath::kReference) {
    MT_CHECK(saved.probs.defined(), "attention backward without a training forward");
    Tensor d32 = inDType(dqkv, DType::kF32, false);
    const Tensor dy32 = inDType(dy, DType::kF32, true);
    referenceBackward(d32, dy32, saved.qkv, saved.probs, heads);
    if (!d32.sharesStorageWith(dqkv)) convertInto(dqkv, d32);
    return;
  }
  if (saved.path == AttentionPath::kCudnn) {
    cudnnBackward(dqkv, dy, saved, heads);
    return;
  }
  const Tensor& qkvLow = saved.qkvLow;
  const FlashProblem p = problemOf(qkvLow, heads);
  const int64_t d = p.D;
  const FlashView dO = rowsView(dy, d), dq = qkvView(dqkv, 0, p.H, d);
  const size_t wsBytes = flashBackwardWorkspaceBytes(p, qkvLow.dtype(), dO, dq);
  Tensor ws = Tensor::empty({static_cast<int64_t>(wsBytes)}, DType::kU8, qkvLow.device());
  flashAttentionBackward(p, qkvView(qkvLow, 0, p.H, d), qkvView(qkvLow, 1, p.H, d), qkvView(qkvLow, 2, p.H, d),
                         rowsView(saved.y, d), dO, saved.lse.data<float>(), dq, qkvView(dqkv, 1, p.H, d),
                         qkvView(dqkv, 2, p.H, d), ws.rawData(), wsBytes, currentStream());
}

void addInPlace(Tensor& y, const Tensor& x) {
  addKernel<<<gridFor1d(y.numel()), 256, 0, currentStream()>>>(y.data<float>(), x.data<float>(), y.numel());
  checkLaunch();
}

void addPositional(Tensor& x, const Tensor& wpe) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  posAdd<<<gridFor1d(x.numel()), 256, 0, currentStream()>>>(x.data<float>(), wpe.data<float>(), B, T, C);
  checkLaunch();
}

void positionalBackward(Tensor& dwpe, const Tensor& dx) {
  const int64_t B = dx.dim(0), T = dx.dim(1), C = dx.dim(2);
  posBackward<<<gridFor1d(T * C), 256, 0, currentStream()>>>(dwpe.data<float>(), dx.data<float>(), B, T, C);
  checkLaunch();
}

}  // namespace mt::cuda
