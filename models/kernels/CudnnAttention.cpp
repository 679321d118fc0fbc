#include "models/kernels/CudnnAttention.h"

#include <cuda_runtime.h>

#include <limits>
#include <tuple>
#include <vector>

#include "core/Check.h"
#include "core/cuda/CudaCheck.h"

namespace mt::cuda {

namespace {

// Unique ids of the tensors bound at execution.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV, kDQAccum, kRowSum };

using Dims = std::vector<int64_t>;

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

// Our views are (sb, st, sh) of [B, T, H, D]; cuDNN's tensors are [B, H, T, D].
Dims bhtd(const int64_t* s) {
  return {s[0], s[2], s[1], 1};
}
Dims transposed(const int64_t* s) {
  return {s[0], s[2], 1, s[1]};
}  // [B, H, D, T]

struct Shapes {
  int64_t B, H, T, D;
  Dims bhtdDims() const { return {B, H, T, D}; }
  Dims tt() const { return {B, H, T, T}; }
  Dims ttStrides() const { return {H * T * T, T * T, T, 1}; }
  Dims ttTransposed() const { return {H * T * T, T * T, 1, T}; }  // the same matrix read as [.., s, t]
  Dims row() const { return {B, H, T, 1}; }
  Dims rowStrides() const { return {H * T, T, 1, 1}; }
};

cudnnDataType_t cudnnType(int dtype) {
  return static_cast<DType>(dtype) == DType::kBF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// Scores with the causal mask applied: x where row >= column, -inf elsewhere (cuDNN before 9.1
// wanted the lowest finite float, as the frontend does).
int64_t causalMask(CudnnGraph& g, const Shapes& s, int64_t x) {
  const int64_t row = g.virt(s.tt(), s.ttStrides(), CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, row, -1, -1, CUDNN_DATA_FLOAT, 2);
  const int64_t col = g.virt(s.tt(), s.ttStrides(), CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, col, -1, -1, CUDNN_DATA_FLOAT, 3);
  const int64_t keep = g.virt(s.tt(), s.ttStrides(), CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, -1, CUDNN_DATA_BOOLEAN);
  const float negInf = cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                                 : -std::numeric_limits<float>::infinity();
  const int64_t y = g.virt(s.tt(), s.ttStrides(), CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, y, g.constant(negInf), keep);
  return y;
}

void buildForward(CudnnGraph& g, const Shapes& s, const int64_t* st, cudnnDataType_t io) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  g.io(kQ, s.bhtdDims(), bhtd(st), io);
  g.io(kK, {s.B, s.H, s.D, s.T}, transposed(st + 3), io);
  g.io(kV, s.bhtdDims(), bhtd(st + 6), io);
  g.io(kO, s.bhtdDims(), bhtd(st + 9), io);
  g.io(kStats, s.row(), s.rowStrides(), f32);
  g.byValue(kScale);
  auto scores = [&](cudnnDataType_t t) { return g.virt(s.tt(), s.ttStrides(), t); };
  const int64_t qk = scores(f32);
  g.matmul(kQ, kK, qk);
  const int64_t scaled = scores(f32);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, scaled, kScale);
  const int64_t masked = causalMask(g, s, scaled);
  // Softmax with its statistics, in the frontend's order: max, sub, exp, sum, log, add, div.
  const int64_t mx = g.virt(s.row(), s.rowStrides(), f32);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, mx);
  const int64_t shifted = scores(f32);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, mx);
  const int64_t e = scores(f32);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, e);
  const int64_t sum = g.virt(s.row(), s.rowStrides(), f32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const int64_t logSum = g.virt(s.row(), s.rowStrides(), f32);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, logSum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, kStats, logSum);
  const int64_t probs = scores(io);  // P in the operand dtype: the second GEMM's A
  g.pointwise(CUDNN_POINTWISE_DIV, e, probs, sum);
  g.matmul(probs, kV, kO);
}

void buildBackward(CudnnGraph& g, const Shapes& s, const int64_t* st, cudnnDataType_t io,
                   bool deterministic) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  g.io(kQ, s.bhtdDims(), bhtd(st), io);
  g.io(kK, {s.B, s.H, s.D, s.T}, transposed(st + 3), io);  // K^T
  g.io(kV, {s.B, s.H, s.D, s.T}, transposed(st + 6), io);  // V^T
  g.io(kO, s.bhtdDims(), bhtd(st + 9), io);
  g.io(kDO, s.bhtdDims(), bhtd(st + 12), io);
  g.io(kDQ, s.bhtdDims(), bhtd(st + 15), io);
  g.io(kDK, s.bhtdDims(), bhtd(st + 18), io);
  g.io(kDV, s.bhtdDims(), bhtd(st + 21), io);
  g.io(kStats, s.row(), s.rowStrides(), f32);
  g.byValue(kScale);
  auto scores = [&](cudnnDataType_t t) { return g.virt(s.tt(), s.ttStrides(), t); };
  // Dsum = rowsum(dO * O), kept in the workspace (the frontend's "softmax_sum").
  const int64_t prod = g.virt(s.bhtdDims(), {s.H * s.T * s.D, s.T * s.D, s.H * s.D, 1}, f32);
  g.pointwise(CUDNN_POINTWISE_MUL, kDO, prod, kO);
  const int64_t red = g.virt(s.row(), s.rowStrides(), f32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, red);
  g.io(kRowSum, s.row(), s.rowStrides(), f32);
  g.pointwise(CUDNN_POINTWISE_MUL, red, kRowSum, g.constant(1.f));
  // P again from the saved statistics.
  const int64_t qk = scores(f32);
  g.matmul(kQ, kK, qk);
  const int64_t scaled = scores(f32);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, scaled, kScale);
  const int64_t centred = scores(f32);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, centred, kStats);
  const int64_t masked = causalMask(g, s, centred);
  const int64_t p = scores(f32);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, p);
  // dV = P^T dO.
  const int64_t pT = g.virt(s.tt(), s.ttTransposed(), io);
  g.reshape(p, pT);
  g.matmul(pT, kDO, kDV);
  // dS = P (dO V^T - Dsum) scale; dK = dS^T Q.
  const int64_t dP = scores(f32);
  g.matmul(kDO, kV, dP);
  const int64_t dPc = scores(f32);
  g.pointwise(CUDNN_POINTWISE_SUB, dP, dPc, kRowSum);
  const int64_t dS0 = scores(f32);
  g.pointwise(CUDNN_POINTWISE_MUL, dPc, dS0, p);
  const int64_t dS = scores(f32);
  g.pointwise(CUDNN_POINTWISE_MUL, dS0, dS, kScale);
  const int64_t dST = g.virt(s.tt(), s.ttTransposed(), io);
  g.reshape(dS, dST);
  g.matmul(dST, kQ, kDK);
  // dQ = dS K, K read back as [B, H, T, D] from the K^T tensor.
  const int64_t kRows = g.virt(s.bhtdDims(), bhtd(st + 3), io);
  g.reshape(kK, kRows);
  if (deterministic) {
    g.matmul(dS, kRows, kDQ);
  } else {
    g.io(kDQAccum, s.bhtdDims(), {s.H * s.T * s.D, s.T * s.D, s.D, 1}, f32);
    g.matmul(dS, kRows, kDQAccum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, kDQAccum, kDQ);
  }
}

// Why these views cannot go to cuDNN at all, before any graph is built; "" when they may.
std::string precheck(const FlashProblem& p, const CudnnAttentionViews& v, bool backward) {
  const size_t version = cudnnGetVersion();
  if (version < 90000) return "needs cuDNN 9 (loaded: " + std::to_string(version) + ")";
  if (version >= 91000 && version < 91002)
    return "cuDNN 9.10.0/9.10.1 have known bf16/f16 attention forward bugs (loaded: " +
           std::to_string(version) + ")";
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 8)
    return "cuDNN's fused attention needs compute capability 8.0 or newer (this GPU: " +
           std::to_string(major) + ".x)";
  if (p.B <= 0 || p.T <= 0 || p.H <= 0) return "empty problem";
  if (p.D % 8 != 0 || p.D > (major >= 9 ? 256 : 128))
    return "head dim " + std::to_string(p.D) + " (cuDNN: a multiple of 8, at most " +
           (major >= 9 ? "256" : "128") + ")";
  const FlashView* all[] = {&v.q, &v.k, &v.v, &v.o, &v.dO, &v.dq, &v.dk, &v.dv};
  const int n = backward ? 8 : 4;
  const DType t = v.q.dtype;
  if (t != DType::kBF16 && t != DType::kF16)
    return std::string("operands in ") + dtypeName(t) + " (bf16 or f16 only)";
  for (int i = 0; i < n; ++i) {
    const FlashView& x = *all[i];
    if (x.dtype != t) return "operands of mixed dtypes";
    // 16-byte rows: cuDNN's tensors are declared 16-byte aligned.
    if (x.sb % 8 || x.st % 8 || x.sh % 8 || reinterpret_cast<uintptr_t>(x.ptr) % 16)
      return "an operand not 16-byte aligned (strides " + std::to_string(x.sb) + "/" + std::to_string(x.st) +
             "/" + std::to_string(x.sh) + ")";
  }
  return "";
}

}  // namespace

bool CudnnAttention::Key::operator<(const Key& o) const {
  return std::tie(B, T, H, D, dtype, backward, deterministic, strides) <
         std::tie(o.B, o.T, o.H, o.D, o.dtype, o.backward, o.deterministic, o.strides);
}

CudnnAttention::Key CudnnAttention::keyOf(const FlashProblem& p, const CudnnAttentionViews& v, bool backward,
                                          bool deterministic) {
  Key k{p.B, p.T, p.H, p.D, static_cast<int>(v.q.dtype), backward, backward && deterministic, {}};
  const FlashView* all[] = {&v.q, &v.k, &v.v, &v.o, &v.dO, &v.dq, &v.dk, &v.dv};
  for (int i = 0; i < (backward ? 8 : 4); ++i) {
    k.strides[3 * i] = all[i]->sb, k.strides[3 * i + 1] = all[i]->st, k.strides[3 * i + 2] = all[i]->sh;
  }
  return k;
}

const CudnnPlan* CudnnAttention::plan(cudnnHandle_t h, const Key& key, std::string* whyNot) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Entry e;
    CudnnGraph g(h);
    const Shapes s{key.B, key.H, key.T, key.D};
    if (key.backward)
      buildBackward(g, s, key.strides.data(), cudnnType(key.dtype), key.deterministic);
    else
      buildForward(g, s, key.strides.data(), cudnnType(key.dtype));
    e.plan = g.build(&e.whyNot);
    it = plans_.emplace(key, std::move(e)).first;
  }
  if (!it->second.plan && whyNot)
    *whyNot = std::string(key.backward ? "backward" : "forward") + " graph: " + it->second.whyNot;
  return it->second.plan.get();
}

std::string CudnnAttention::unsupported(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                                        bool deterministic) {
  std::string why = precheck(p, v, true);
  if (!why.empty()) return why;
  if (!plan(h, keyOf(p, v, false, false), &why) || !plan(h, keyOf(p, v, true, deterministic), &why))
    return why;
  return "";
}

size_t CudnnAttention::forwardWorkspaceBytes(cudnnHandle_t h, const FlashProblem& p,
                                             const CudnnAttentionViews& v) {
  std::string why;
  const CudnnPlan* f = plan(h, keyOf(p, v, false, false), &why);
  MT_CHECK(f, "cuDNN attention: ", why);
  return static_cast<size_t>(f->workspaceBytes());
}

size_t CudnnAttention::backwardWorkspaceBytes(cudnnHandle_t h, const FlashProblem& p,
                                              const CudnnAttentionViews& v, bool deterministic) {
  std::string why;
  const CudnnPlan* b = plan(h, keyOf(p, v, true, deterministic), &why);
  MT_CHECK(b, "cuDNN attention: ", why);
  const size_t rows = static_cast<size_t>(p.B * p.H * p.T);
  return align256(static_cast<size_t>(b->workspaceBytes())) + align256(rows * 4) +
         (deterministic ? 0 : rows * static_cast<size_t>(p.D) * 4);
}

std::string CudnnAttention::engines(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                                    bool deterministic) {
  const CudnnPlan* f = plan(h, keyOf(p, v, false, false), nullptr);
  const CudnnPlan* b = plan(h, keyOf(p, v, true, deterministic), nullptr);
  return "fwd engine " + (f ? std::to_string(f->engineId()) : std::string("none")) + ", bwd engine " +
         (b ? std::to_string(b->engineId()) : std::string("none"));
}

void CudnnAttention::forward(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                             float* stats, void* workspace, size_t workspaceBytes, cudaStream_t stream) {
  std::string why = precheck(p, v, false);
  MT_CHECK(why.empty(), "cuDNN attention forward: ", why);
  const CudnnPlan* f = plan(h, keyOf(p, v, false, false), &why);
  MT_CHECK(f, "cuDNN attention: ", why);
  MT_CHECK(workspaceBytes >= static_cast<size_t>(f->workspaceBytes()), "cuDNN attention forward: workspace ",
           workspaceBytes, " < ", f->workspaceBytes());
  float scale = p.scale;
  CUDNN_CHECK(cudnnSetStream(h, stream));
  f->execute(h,
             {{kQ, v.q.ptr}, {kK, v.k.ptr}, {kV, v.v.ptr}, {kO, v.o.ptr}, {kStats, stats}, {kScale, &scale}},
             workspace);
}

void CudnnAttention::backward(cudnnHandle_t h, const FlashProblem& p, const CudnnAttentionViews& v,
                              const float* stats, bool deterministic, void* workspace, size_t workspaceBytes,
                              cudaStream_t stream) {
  std::string why = precheck(p, v, true);
  MT_CHECK(why.empty(), "cuDNN attention backward: ", why);
  const CudnnPlan* b = plan(h, keyOf(p, v, true, deterministic), &why);
  MT_CHECK(b, "cuDNN attention: ", why);
  const size_t need = backwardWorkspaceBytes(h, p, v, deterministic);
  MT_CHECK(workspaceBytes >= need, "cuDNN attention backward: workspace ", workspaceBytes, " < ", need);
  // Layout: [plan workspace][row sums][dQ accumulator].
  char* ws = static_cast<char*>(workspace);
  const size_t rows = static_cast<size_t>(p.B * p.H * p.T),
               planBytes = align256(static_cast<size_t>(b->workspaceBytes()));
  void* rowSum = ws + planBytes;
  void* dqAccum = ws + planBytes + align256(rows * 4);
  CUDNN_CHECK(cudnnSetStream(h, stream));
  // cuDNN zeroes the dQ accumulator itself from 9.6 on; before, its caller had to.
  if (!deterministic && cudnnGetVersion() < 90600)
    CUDA_CHECK(cudaMemsetAsync(dqAccum, 0, rows * static_cast<size_t>(p.D) * 4, stream));
  float scale = p.scale;
  std::vector<std::pair<int64_t, void*>> io = {
      {kQ, v.q.ptr},    {kK, v.k.ptr},    {kV, v.v.ptr},
      {kO, v.o.ptr},    {kDO, v.dO.ptr},  {kDQ, v.dq.ptr},
      {kDK, v.dk.ptr},  {kDV, v.dv.ptr},  {kStats, const_cast<float*>(stats)},
      {kScale, &scale}, {kRowSum, rowSum}};
  if (!deterministic) io.emplace_back(kDQAccum, dqAccum);
  b->execute(h, io, ws);
}

}  // namespace mt::cuda
