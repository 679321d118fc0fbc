// Convolutions through cuDNN (math in models/layers/Conv2d.h), NCHW (filter KCRS) or NHWC (filter
// KRSC) to match the layer's weight layout. The algorithm for each (geometry, precision) is chosen
// once and cached: by cuDNN's heuristic order or, with MT_CONV_ALGO=1, by measurement (cudnnFind*,
// the fastest deterministic one); either skips algorithms whose workspace exceeds kMaxWorkspace.
// Heuristics won on the H200 (fashion_cnn bf16, batch 1024: 655K against 501K samples/s): their
// weight-gradient pick (algo 0) accumulates with atomics, which the deterministic filter excludes,
// and Find's one-shot timings vary by 2x between runs. The workspace comes from the caching pool.
// In f32 precision cuDNN is held to FMA math (no TF32) so results match the CPU within 1e-4; in
// bf16/f16 precision tensor-core math (TF32) is allowed.
// Backward accumulates dW and db (beta = 1) and overwrites dx. The NHWC bias gradient is our own
// column-sum kernel: cudnnConvolutionBackwardBias took 2.1 ms per call on a [1024,28,28,32] f32
// gradient on the H200 (calc_bias_diff_nhwc_packed), 40 times its byte floor.

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "core/EnvParams.h"
#include "core/Log.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/PlanCache.h"
#include "models/kernels/CudaLayers.h"
#include "core/cuda/KernelUtil.cuh"

namespace mt::cuda {

namespace {

constexpr size_t kMaxWorkspace = 512u << 20;

struct ConvKey {
  int64_t N, C, H, W, O, KH, KW, s, p;
  int layout, precision;
  bool operator<(const ConvKey& o) const {
    return std::tie(N, C, H, W, O, KH, KW, s, p, layout, precision) <
           std::tie(o.N, o.C, o.H, o.W, o.O, o.KH, o.KW, o.s, o.p, o.layout, o.precision);
  }
};

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t relu = nullptr;  // for a fused ReLU (NaN propagates, as our ReLU)
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwdData{};
  cudnnConvolutionBwdFilterAlgo_t bwdFilter{};
  size_t fwdWs = 0, bwdDataWs = 0, bwdFilterWs = 0;
  void release() noexcept {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (relu) cudnnDestroyActivationDescriptor(relu);
  }
};

// The plans of one CudaRuntime (its cuDNN handle chose their algorithms).
using ConvPlans = PlanCache<ConvKey, ConvPlan>;

// The first usable entry: results come fastest first (Find) or in heuristic order. Measured
// choices are held to deterministic algorithms so that two runs of one configuration give the
// same losses.
template <typename Perf>
const Perf* pickAlgo(const Perf* perfs, int n, bool measured) {
  for (int i = 0; i < n; ++i)
    if (perfs[i].status == CUDNN_STATUS_SUCCESS && perfs[i].memory <= kMaxWorkspace &&
        (!measured || perfs[i].determinism == CUDNN_DETERMINISTIC))
      return &perfs[i];
  return nullptr;
}

ConvPlan& planFor(const Conv2dGeometry& g, CudaRuntime& rt) {
  const int prec = static_cast<int>(rt.matmulPrecision());
  ConvKey key{g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.stride, g.pad, static_cast<int>(g.layout), prec};
  ConvPlans& cache = rt.components().get<ConvPlans>();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return it->second;
  ConvPlan p;
  const cudnnTensorFormat_t fmt = g.layout == Layout::kNCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.bias));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
  CUDNN_CHECK(cudnnCreateActivationDescriptor(&p.relu));
  CUDNN_CHECK(cudnnSetActivationDescriptor(p.relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.x, fmt, CUDNN_DATA_FLOAT, static_cast<int>(g.N), static_cast<int>(g.C),
                                         static_cast<int>(g.H), static_cast<int>(g.W)));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.y, fmt, CUDNN_DATA_FLOAT, static_cast<int>(g.N), static_cast<int>(g.O),
                                         static_cast<int>(g.OH), static_cast<int>(g.OW)));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.bias, fmt, CUDNN_DATA_FLOAT, 1, static_cast<int>(g.O), 1, 1));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w, CUDNN_DATA_FLOAT, fmt, static_cast<int>(g.O), static_cast<int>(g.C),
                                         static_cast<int>(g.KH), static_cast<int>(g.KW)));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv, static_cast<int>(g.pad), static_cast<int>(g.pad),
                                              static_cast<int>(g.stride), static_cast<int>(g.stride), 1, 1,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(
      p.conv, prec == static_cast<int>(MatmulPrecision::kF32) ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  cudnnHandle_t h = rt.cudnn();
  constexpr int kMax = 16;
  static const bool measured = envInt(EnvParam::kConvAlgo) == 1;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
  cudnnConvolutionBwdDataAlgoPerf_t bd[kMax];
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kMax];
  // Find runs every algorithm on scratch buffers it allocates itself (once per geometry, before
  // the first step's convolution of that shape).
  if (measured) CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, p.x, p.w, p.conv, p.y, kMax, &n, fwd));
  else CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, kMax, &n, fwd));
  const auto* f = pickAlgo(fwd, n, measured);
  if (measured) CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, p.w, p.y, p.conv, p.x, kMax, &n, bd));
  else CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, kMax, &n, bd));
  const auto* d = pickAlgo(bd, n, measured);
  if (measured) CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, p.x, p.y, p.conv, p.w, kMax, &n, bf));
  else CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, kMax, &n, bf));
  const auto* w = pickAlgo(bf, n, measured);
  if (!f || !d || !w) throw CudaError("cuDNN found no convolution algorithm within the workspace limit");
  MT_LOG_DEBUG << "conv plan N=" << g.N << " C=" << g.C << " H=" << g.H << " W=" << g.W << " O=" << g.O << " k=" << g.KH
               << (measured ? " (measured)" : " (heuristic)") << ": fwd algo " << f->algo << " " << f->time
               << " ms, bwd data algo " << d->algo << " " << d->time << " ms, bwd filter algo " << w->algo << " "
               << w->time << " ms";
  p.fwd = f->algo;
  p.bwdData = d->algo;
  p.bwdFilter = w->algo;
  CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, p.fwd, &p.fwdWs));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, p.bwdData, &p.bwdDataWs));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w, p.bwdFilter, &p.bwdFilterWs));
  return cache.plans.emplace(key, p).first->second;
}

// db[c] += sum over rows r of dy[r, c] (NHWC: rows are the N*OH*OW positions), deterministic:
// each of a fixed number of blocks sums a fixed strided set of rows, VEC channels per thread with
// VEC-wide loads, threads of one channel group combined in shared memory in a fixed order; a second
// kernel (addBlockPartials, also the stem gradient's) adds the per-block partials in block order.
constexpr int kBiasBlocks = 264, kBiasThreads = 256;
bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.rawData()) % 16 == 0; }
template <int VEC>
__global__ void biasGradPartial(const float* __restrict__ dy, float* __restrict__ part, int64_t R, int C) {
  extern __shared__ float sh[];  // [kBiasThreads][VEC]
  const int groups = C / VEC, rowsPerPass = kBiasThreads / groups;
  const int tid = threadIdx.x, cg = tid % groups, lane = tid / groups;
  float acc[VEC] = {};
  if (lane < rowsPerPass) {
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * rowsPerPass + lane; r < R;
         r += static_cast<int64_t>(gridDim.x) * rowsPerPass) {
      const float* src = dy + r * C + cg * VEC;
      if constexpr (VEC == 4) {
        const float4 v = *reinterpret_cast<const float4*>(src);
        acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
      } else {
        acc[0] += src[0];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) sh[tid * VEC + i] = acc[i];
  __syncthreads();
  if (tid < groups) {
    float s[VEC] = {};
    for (int l = 0; l < rowsPerPass; ++l)
#pragma unroll
      for (int i = 0; i < VEC; ++i) s[i] += sh[(l * groups + tid) * VEC + i];
#pragma unroll
    for (int i = 0; i < VEC; ++i) part[static_cast<int64_t>(blockIdx.x) * C + tid * VEC + i] = s[i];
  }
}
// dst[c] += sum over b < blocks of part[b * ld + c], for c < C, in block order.
__global__ void addBlockPartials(const float* __restrict__ part, float* __restrict__ dst, int blocks, int C, int ld) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int b = 0; b < blocks; ++b) acc += part[static_cast<int64_t>(b) * ld + c];
  dst[c] += acc;
}
void addBlockPartialsLaunch(const float* part, float* dst, int blocks, int C, int ld) {
  addBlockPartials<<<(C + 127) / 128, 128, 0, currentStream()>>>(part, dst, blocks, C, ld);
  checkLaunch();
}

void biasGradNhwc(const Tensor& dy, Tensor& db, int64_t rows, int64_t C) {
  const bool vec = C % 4 == 0 && C / 4 <= kBiasThreads && aligned16(dy);
  const int blocks = static_cast<int>(std::min<int64_t>(kBiasBlocks, std::max<int64_t>(1, rows / 64)));
  Tensor part = Tensor::empty({blocks, C}, DType::kF32, dy.device());
  const size_t smem = kBiasThreads * (vec ? 4 : 1) * sizeof(float);
  if (vec)
    biasGradPartial<4><<<blocks, kBiasThreads, smem, currentStream()>>>(dy.data<float>(), part.data<float>(), rows,
                                                                        static_cast<int>(C));
  else
    biasGradPartial<1><<<blocks, kBiasThreads, smem, currentStream()>>>(dy.data<float>(), part.data<float>(), rows,
                                                                        static_cast<int>(C));
  checkLaunch();
  addBlockPartialsLaunch(part.data<float>(), db.data<float>(), blocks, static_cast<int>(C), static_cast<int>(C));
}

// ---- single-channel stem convolution (NHWC, C = 1, stride 1, k = 3 or 5) ----------------------
// The first layer of a grayscale CNN: cuDNN's NHWC kernels for C = 1 (a legacy direct forward
// and a weight-gradient kernel) took 0.12 and 0.20 ms for fashion_cnn's conv1 at batch 1024 on the
// H200, four to six times the bytes of its output gradient. Ours: forward, one thread per (output
// pixel, 4 output channels), taps from shared memory, bias and the optional ReLU fused; weight and
// bias gradients in one pass over dy, deterministic like biasGradNhwc (fixed blocks, partials added
// in block order). The input gradient (never needed for a first layer) stays with cuDNN.
bool stemPath(const Conv2dGeometry& g) {
  return g.layout == Layout::kNHWC && g.C == 1 && g.stride == 1 && g.KH == g.KW && (g.KH == 3 || g.KH == 5) &&
         g.O % 4 == 0 && g.O <= 256 && g.positions() * g.O < (int64_t{1} << 31) &&
         g.N * g.H * g.W < (int64_t{1} << 31);
}

struct StemGeo {
  int N, H, W, O, pad, OH, OW;
};

template <int K>
__global__ void stemForward(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                            float* __restrict__ y, StemGeo g, bool relu) {
  extern __shared__ float sw[];  // [K*K][O]: a thread's 4 channels of one tap are adjacent
  for (int i = threadIdx.x; i < K * K * g.O; i += blockDim.x) sw[i] = w[(i % g.O) * K * K + i / g.O];
  __syncthreads();
  const int O4 = g.O / 4, total = g.N * g.OH * g.OW * O4;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int o4 = i % O4, pos = i / O4, ow = pos % g.OW, oh = (pos / g.OW) % g.OH, n = pos / (g.OW * g.OH);
    float4 acc = b ? make_float4(b[4 * o4], b[4 * o4 + 1], b[4 * o4 + 2], b[4 * o4 + 3]) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
      const int ih = oh - g.pad + kh;
      if (ih < 0 || ih >= g.H) continue;
#pragma unroll
      for (int kw = 0; kw < K; ++kw) {
        const int iw = ow - g.pad + kw;
        if (iw < 0 || iw >= g.W) continue;
        const float v = __ldg(x + (n * g.H + ih) * g.W + iw);
        const float4 t = *reinterpret_cast<const float4*>(sw + (kh * K + kw) * g.O + 4 * o4);
        acc.x = fmaf(v, t.x, acc.x), acc.y = fmaf(v, t.y, acc.y), acc.z = fmaf(v, t.z, acc.z), acc.w = fmaf(v, t.w, acc.w);
      }
    }
    if (relu) {  // NaN propagates, as ReLU does
      acc.x = acc.x > 0.f || isnan(acc.x) ? acc.x : 0.f, acc.y = acc.y > 0.f || isnan(acc.y) ? acc.y : 0.f;
      acc.z = acc.z > 0.f || isnan(acc.z) ? acc.z : 0.f, acc.w = acc.w > 0.f || isnan(acc.w) ? acc.w : 0.f;
    }
    reinterpret_cast<float4*>(y)[i] = acc;
  }
}

// part[block][o*K*K + t] (dw's layout) for the K*K taps, then part[block][K*K*O + o] the bias sums.
template <int K>
__global__ void stemGradPartial(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ part,
                                StemGeo g) {
  __shared__ float sh[kBiasThreads * 4];
  constexpr int kTaps = K * K;
  const int O4 = g.O / 4, lanes = kBiasThreads / O4, tid = threadIdx.x, cg = tid % O4, lane = tid / O4;
  const int P = g.N * g.OH * g.OW;
  float acc[kTaps + 1][4] = {};
  if (lane < lanes) {
    for (int pos = blockIdx.x * lanes + lane; pos < P; pos += gridDim.x * lanes) {
      const int ow = pos % g.OW, oh = (pos / g.OW) % g.OH, n = pos / (g.OW * g.OH);
      const float4 d = *reinterpret_cast<const float4*>(dy + static_cast<int64_t>(pos) * g.O + 4 * cg);
#pragma unroll
      for (int kh = 0; kh < K; ++kh) {
        const int ih = oh - g.pad + kh;
        const bool rowIn = ih >= 0 && ih < g.H;
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
          const int iw = ow - g.pad + kw;
          const float v = rowIn && iw >= 0 && iw < g.W ? __ldg(x + (n * g.H + ih) * g.W + iw) : 0.f;
          float* a = acc[kh * K + kw];
          a[0] = fmaf(v, d.x, a[0]), a[1] = fmaf(v, d.y, a[1]), a[2] = fmaf(v, d.z, a[2]), a[3] = fmaf(v, d.w, a[3]);
        }
      }
      acc[kTaps][0] += d.x, acc[kTaps][1] += d.y, acc[kTaps][2] += d.z, acc[kTaps][3] += d.w;
    }
  }
  // One tap at a time through shared memory: the lanes of each channel group added in lane order.
  float* out = part + static_cast<int64_t>(blockIdx.x) * (kTaps + 1) * g.O;
#pragma unroll
  for (int t = 0; t <= kTaps; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sh[tid * 4 + e] = acc[t][e];
    __syncthreads();
    if (tid < O4) {
      float r[4] = {0.f, 0.f, 0.f, 0.f};
      for (int l = 0; l < lanes; ++l)
#pragma unroll
        for (int e = 0; e < 4; ++e) r[e] += sh[(l * O4 + tid) * 4 + e];
#pragma unroll
      for (int e = 0; e < 4; ++e) out[t < kTaps ? (4 * tid + e) * kTaps + t : kTaps * g.O + 4 * tid + e] = r[e];
    }
    __syncthreads();
  }
}

StemGeo stemGeo(const Conv2dGeometry& g) {
  return {static_cast<int>(g.N), static_cast<int>(g.H), static_cast<int>(g.W), static_cast<int>(g.O),
          static_cast<int>(g.pad), static_cast<int>(g.OH), static_cast<int>(g.OW)};
}

void stemForwardLaunch(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                       bool relu) {
  const int total = static_cast<int>(g.positions() * g.O / 4);
  const size_t smem = static_cast<size_t>(g.KH * g.KW * g.O) * sizeof(float);
  const float* bp = b ? b->data<float>() : nullptr;
  if (g.KH == 3)
    stemForward<3><<<gridFor1d(total), 256, smem, currentStream()>>>(x.data<float>(), w.data<float>(), bp,
                                                                      y.data<float>(), stemGeo(g), relu);
  else
    stemForward<5><<<gridFor1d(total), 256, smem, currentStream()>>>(x.data<float>(), w.data<float>(), bp,
                                                                      y.data<float>(), stemGeo(g), relu);
  checkLaunch();
}

void stemGradLaunch(Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Conv2dGeometry& g) {
  const int taps = static_cast<int>(g.KH * g.KW);
  const int blocks = static_cast<int>(std::min<int64_t>(kBiasBlocks, std::max<int64_t>(1, g.positions() / 64)));
  Tensor part = Tensor::empty({blocks, (taps + 1) * g.O}, DType::kF32, dy.device());
  if (g.KH == 3)
    stemGradPartial<3><<<blocks, kBiasThreads, 0, currentStream()>>>(x.data<float>(), dy.data<float>(),
                                                                     part.data<float>(), stemGeo(g));
  else
    stemGradPartial<5><<<blocks, kBiasThreads, 0, currentStream()>>>(x.data<float>(), dy.data<float>(),
                                                                     part.data<float>(), stemGeo(g));
  checkLaunch();
  const int O = static_cast<int>(g.O), row = (taps + 1) * O;
  addBlockPartialsLaunch(part.data<float>(), dw.data<float>(), blocks, taps * O, row);
  if (db) addBlockPartialsLaunch(part.data<float>() + taps * O, db->data<float>(), blocks, O, row);
}

}  // namespace

void conv2dForward(Tensor& y, Tensor&, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                   bool relu) {
  if (stemPath(g) && aligned16(y) && aligned16(x)) {
    stemForwardLaunch(y, x, w, b, g, relu);
    return;
  }
  CudaRuntime& rt = CudaRuntime::require();
  ConvPlan& p = planFor(g, rt);
  cudnnHandle_t h = rt.cudnn();
  const float one = 1.f, zero = 0.f;
  void* ws = p.fwdWs ? rt.workspace(p.fwdWs) : nullptr;
  if (relu && b) {
    // y = relu(conv(x) + b) in one call; alpha2 = 0: z (here y itself) is not read.
    CUDNN_CHECK(cudnnConvolutionBiasActivationForward(h, &one, p.x, x.rawData(), p.w, w.rawData(), p.conv, p.fwd, ws,
                                                      p.fwdWs, &zero, p.y, y.rawData(), p.bias, b->rawData(), p.relu,
                                                      p.y, y.rawData()));
    return;
  }
  CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, x.rawData(), p.w, w.rawData(), p.conv, p.fwd, ws, p.fwdWs, &zero,
                                      p.y, y.rawData()));
  if (b) CUDNN_CHECK(cudnnAddTensor(h, &one, p.bias, b->rawData(), &one, p.y, y.rawData()));
  if (relu) mt::cuda::reluForward(y, y);
}

void conv2dBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor&,
                    const Tensor& w, const Conv2dGeometry& g) {
  const bool stem = stemPath(g) && aligned16(dy);
  if (stem) {
    stemGradLaunch(dw, db, dy, x, g);
    if (!dx) return;
  }
  CudaRuntime& rt = CudaRuntime::require();
  ConvPlan& p = planFor(g, rt);
  cudnnHandle_t h = rt.cudnn();
  const float one = 1.f, zero = 0.f;
  if (stem) {
    void* wsD = p.bwdDataWs ? rt.workspace(p.bwdDataWs) : nullptr;
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, w.rawData(), p.y, dy.rawData(), p.conv, p.bwdData, wsD,
                                             p.bwdDataWs, &zero, p.x, dx->rawData()));
    return;
  }
  if (db && g.layout == Layout::kNHWC && g.O <= kBiasThreads) biasGradNhwc(dy, *db, g.positions(), g.O);
  else if (db) CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, p.y, dy.rawData(), &one, p.bias, db->rawData()));
  void* wsF = p.bwdFilterWs ? rt.workspace(p.bwdFilterWs) : nullptr;
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, x.rawData(), p.y, dy.rawData(), p.conv, p.bwdFilter, wsF,
                                             p.bwdFilterWs, &one, p.w, dw.rawData()));
  if (dx) {
    void* wsD = p.bwdDataWs ? rt.workspace(p.bwdDataWs) : nullptr;
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, w.rawData(), p.y, dy.rawData(), p.conv, p.bwdData, wsD,
                                             p.bwdDataWs, &zero, p.x, dx->rawData()));
  }
}

}  // namespace mt::cuda
