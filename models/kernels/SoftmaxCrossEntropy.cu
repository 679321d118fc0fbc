// Fused softmax + cross-entropy: one block per row computes max, log-sum-exp, the row's loss and
// whether argmax == target, and writes dlogits = scale * (softmax - onehot) / valid directly, so
// the probabilities are never stored. Per-row results are reduced on the device and three numbers
// (loss sum, correct, count) come back to the host.

#include "models/kernels/CudaLayers.h"
#include "models/kernels/KernelUtil.cuh"

namespace mt::cuda {

namespace {

template <typename T>
__global__ void ceRows(const float* z, const T* targets, float* dz, double* rowLoss, int* rowCorrect, int* rowValid,
                       int* badTarget, int64_t C, int64_t stride, float inv) {
  __shared__ float red[32];
  __shared__ int argShared;
  const int64_t r = blockIdx.x;
  const float* zr = z + r * stride;
  const int64_t t = static_cast<int64_t>(targets[r]);
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, zr[c]);
  mx = blockMax(mx, red);
  // First index of the maximum (PyTorch's argmax): smallest c with zr[c] == mx.
  if (threadIdx.x == 0) argShared = static_cast<int>(C);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    if (zr[c] == mx) atomicMin(&argShared, static_cast<int>(c));
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(zr[c] - mx);
  s = blockSum(s, red);
  const float logSum = logf(s);
  const bool valid = t != -100;
  if (valid && (t < 0 || t >= C)) {
    if (threadIdx.x == 0) atomicExch(badTarget, 1);
    return;
  }
  // zr[t] is read before the gradient may overwrite it (dz can alias z).
  const float zt = valid ? zr[t] : 0.f;
  __syncthreads();
  if (dz) {
    float* dr = dz + r * stride;
    for (int64_t c = threadIdx.x; c < stride; c += blockDim.x) {
      const float p = c < C ? expf(zr[c] - mx - logSum) : 0.f;
      dr[c] = valid && c < C ? (p - (c == t ? 1.f : 0.f)) * inv : 0.f;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    rowLoss[r] = valid ? static_cast<double>(logSum) - static_cast<double>(zt - mx) : 0.0;
    rowCorrect[r] = valid && argShared == t ? 1 : 0;
    rowValid[r] = valid ? 1 : 0;
  }
}

__global__ void ceReduce(const double* rowLoss, const int* rowCorrect, const int* rowValid, int64_t N, double* out) {
  __shared__ double sl[256];
  __shared__ double sc[256], sv[256];
  double l = 0, c = 0, v = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    l += rowLoss[i];
    c += rowCorrect[i];
    v += rowValid[i];
  }
  sl[threadIdx.x] = l, sc[threadIdx.x] = c, sv[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sl[threadIdx.x] += sl[threadIdx.x + s];
      sc[threadIdx.x] += sc[threadIdx.x + s];
      sv[threadIdx.x] += sv[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = sl[0], out[1] = sc[0], out[2] = sv[0];
}

__global__ void countValid(const int64_t* t64, const int32_t* t32, int64_t N, int* out) {
  int v = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) v += (t64 ? t64[i] : static_cast<int64_t>(t32[i])) != -100;
  atomicAdd(out, v);
}

}  // namespace

LossStats softmaxCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits, float scale,
                              int64_t validForMean, int64_t validClasses) {
  const int64_t stride = logits.dim(-1), N = logits.numel() / stride;
  const int64_t C = validClasses > 0 ? validClasses : stride;
  Device d = logits.device();
  Tensor tgt = targets.device() == d ? targets : targets.to(d);
  const int64_t* t64 = tgt.dtype() == DType::kI64 ? tgt.data<int64_t>() : nullptr;
  const int32_t* t32 = tgt.dtype() == DType::kI32 ? tgt.data<int32_t>() : nullptr;
  cudaStream_t s = currentStream();
  Tensor ints = Tensor::zeros({2 * N + 2}, DType::kI32, d);  // correct[N], valid[N], bad, validCount
  int* correct = ints.data<int32_t>();
  int* valid = correct + N;
  int* bad = valid + N;
  int* validCount = bad + 1;
  int64_t mean = validForMean;
  if (mean < 0) {
    countValid<<<1, 256, 0, s>>>(t64, t32, N, validCount);
    int hostCount = 0;
    CUDA_CHECK(cudaMemcpyAsync(&hostCount, validCount, sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    mean = hostCount;
  }
  const float inv = mean > 0 ? scale / static_cast<float>(mean) : 0.f;
  Tensor rowLoss = Tensor::empty({N}, DType::kF64, d);
  Tensor out = Tensor::empty({3}, DType::kF64, d);
  const int threads = C >= 1024 ? 1024 : C >= 256 ? 256 : 64;
  if (N > 0) {
    if (t64)
      ceRows<<<static_cast<unsigned>(N), threads, 0, s>>>(logits.data<float>(), t64,
                                                           dlogits ? dlogits->data<float>() : nullptr,
                                                           rowLoss.data<double>(), correct, valid, bad, C, stride, inv);
    else
      ceRows<<<static_cast<unsigned>(N), threads, 0, s>>>(logits.data<float>(), t32,
                                                           dlogits ? dlogits->data<float>() : nullptr,
                                                           rowLoss.data<double>(), correct, valid, bad, C, stride, inv);
  }
  ceReduce<<<1, 256, 0, s>>>(rowLoss.data<double>(), correct, valid, N, out.data<double>());
  checkLaunch();
  double host[3];
  int hostBad = 0;
  CUDA_CHECK(cudaMemcpyAsync(host, out.data<double>(), sizeof(host), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(&hostBad, bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (hostBad) throw DataError("a target is out of range for " + std::to_string(C) + " classes");
  LossStats st;
  st.lossSum = host[0];
  st.correct = static_cast<int64_t>(host[1]);
  st.count = static_cast<int64_t>(host[2]);
  return st;
}

}  // namespace mt::cuda
