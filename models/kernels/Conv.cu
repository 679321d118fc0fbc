// Convolutions through cuDNN (math in models/layers/Conv2d.h), NCHW (filter KCRS) or NHWC (filter
// KRSC) to match the layer's weight layout. The algorithm for each (geometry, precision) is chosen
// once by cuDNN's heuristics, skipping any whose workspace exceeds kMaxWorkspace, and cached; the
// workspace comes from the caching pool. In f32 precision cuDNN is held to FMA math (no TF32) so
// results match the CPU within 1e-4; in bf16/f16 precision tensor-core math (TF32) is allowed.
// Backward accumulates dW and db (beta = 1) and overwrites dx.

#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda/CudaRuntime.h"
#include "models/kernels/CudaLayers.h"
#include "models/kernels/KernelUtil.cuh"

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
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwdData{};
  cudnnConvolutionBwdFilterAlgo_t bwdFilter{};
  size_t fwdWs = 0, bwdDataWs = 0, bwdFilterWs = 0;
};

std::mutex gMutex;
std::map<ConvKey, ConvPlan> gPlans;

template <typename Perf>
const Perf* pickAlgo(const Perf* perfs, int n) {
  for (int i = 0; i < n; ++i)
    if (perfs[i].status == CUDNN_STATUS_SUCCESS && perfs[i].memory <= kMaxWorkspace) return &perfs[i];
  return nullptr;
}

ConvPlan& planFor(const Conv2dGeometry& g, CudaRuntime& rt) {
  const int prec = static_cast<int>(rt.matmulPrecision());
  ConvKey key{g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.stride, g.pad, static_cast<int>(g.layout), prec};
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gPlans.find(key);
  if (it != gPlans.end()) return it->second;
  ConvPlan p;
  const cudnnTensorFormat_t fmt = g.layout == Layout::kNCHW ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.bias));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
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
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, kMax, &n, fwd));
  const auto* f = pickAlgo(fwd, n);
  cudnnConvolutionBwdDataAlgoPerf_t bd[kMax];
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, kMax, &n, bd));
  const auto* d = pickAlgo(bd, n);
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kMax];
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, kMax, &n, bf));
  const auto* w = pickAlgo(bf, n);
  if (!f || !d || !w) throw CudaError("cuDNN found no convolution algorithm within the workspace limit");
  p.fwd = f->algo;
  p.bwdData = d->algo;
  p.bwdFilter = w->algo;
  CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, p.fwd, &p.fwdWs));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, p.bwdData, &p.bwdDataWs));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w, p.bwdFilter, &p.bwdFilterWs));
  return gPlans.emplace(key, p).first->second;
}

}  // namespace

void conv2dForward(Tensor& y, Tensor&, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g) {
  CudaRuntime& rt = CudaRuntime::require();
  ConvPlan& p = planFor(g, rt);
  cudnnHandle_t h = rt.cudnn();
  const float one = 1.f, zero = 0.f;
  void* ws = p.fwdWs ? rt.workspace(p.fwdWs) : nullptr;
  CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, x.rawData(), p.w, w.rawData(), p.conv, p.fwd, ws, p.fwdWs, &zero,
                                      p.y, y.rawData()));
  if (b) CUDNN_CHECK(cudnnAddTensor(h, &one, p.bias, b->rawData(), &one, p.y, y.rawData()));
}

void conv2dBackward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor&,
                    const Tensor& w, const Conv2dGeometry& g) {
  CudaRuntime& rt = CudaRuntime::require();
  ConvPlan& p = planFor(g, rt);
  cudnnHandle_t h = rt.cudnn();
  const float one = 1.f, zero = 0.f;
  if (db) CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, p.y, dy.rawData(), &one, p.bias, db->rawData()));
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
