#include "models/kernels/AttentionChoice.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/Log.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaStream.h"

namespace mt::cuda {

namespace {

struct ShapeKey {
  int64_t B, T, H, D;
  int dtype;
  AttentionBackend requested;
  bool operator<(const ShapeKey& o) const {
    return std::tie(B, T, H, D, dtype, requested) < std::tie(o.B, o.T, o.H, o.D, o.dtype, o.requested);
  }
};

// The decisions of one runtime (device).
struct AttentionChoices {
  std::mutex mutex;
  std::map<ShapeKey, AttentionChoice> chosen;
};

std::string shapeName(const FlashProblem& p, DType t) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "B=%lld,T=%lld,H=%lld,D=%lld %s", static_cast<long long>(p.B),
                static_cast<long long>(p.T), static_cast<long long>(p.H), static_cast<long long>(p.D),
                dtypeName(t));
  return buf;
}

// Median milliseconds of `reps` runs of f on the current stream, after one warm-up run.
template <typename F>
double medianMs(F&& f, int reps) {
  cudaStream_t s = currentStream();
  f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, s));
    f();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Forward + backward of each candidate on the layer's real shape, in milliseconds.
struct Timings {
  double cudnn = 0, cudnnDeterministic = 0, flash = 0;  // a candidate that cannot run: infinity
};

Timings measure(CudaRuntime& rt, const Tensor& qkvLow, int64_t heads, bool deterministicOk, bool flashOk) {
  const FlashProblem p = problemOf(qkvLow, heads);
  const DType low = qkvLow.dtype();
  const Device dev = qkvLow.device();
  const int64_t C = p.H * p.D;
  Tensor y = Tensor::empty({p.B, p.T, C}, low, dev), dqkv = Tensor::empty({p.B, p.T, 3 * C}, low, dev);
  Tensor lse = Tensor::empty({flashLseElements(p)}, DType::kF32, dev);
  Tensor stats = Tensor::empty({CudnnAttention::statsElements(p)}, DType::kF32, dev);
  const CudnnAttentionViews v = layerViews(qkvLow, y, y, dqkv, heads);  // dO = O: any values will do
  CudnnAttention& cudnn = cudnnAttentionOf(rt);
  cudnnHandle_t h = rt.cudnn();
  const size_t fws = cudnn.forwardWorkspaceBytes(h, p, v), bws = cudnn.backwardWorkspaceBytes(h, p, v, false),
               bwsDet = deterministicOk ? cudnn.backwardWorkspaceBytes(h, p, v, true) : 0,
               flashWs = flashOk ? flashBackwardWorkspaceBytes(p, low, v.dO, v.dq) : 0;
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max({fws, bws, bwsDet, flashWs, size_t{1}}))},
                            DType::kU8, dev);
  cudaStream_t s = currentStream();
  auto cudnnMs = [&](bool deterministic) {
    return medianMs(
        [&] {
          cudnn.forward(h, p, v, stats.data<float>(), ws.rawData(), fws, s);
          cudnn.backward(h, p, v, stats.data<float>(), deterministic, ws.rawData(), deterministic ? bwsDet : bws, s);
        },
        kTimedReps);
  };
  Timings t;
  t.cudnn = cudnnMs(false);
  t.cudnnDeterministic = deterministicOk ? cudnnMs(true) : HUGE_VAL;
  t.flash = !flashOk ? HUGE_VAL : medianMs(
      [&] {
        flashAttentionForward(p, v.q, v.k, v.v, v.o, lse.data<float>(), s);
        flashAttentionBackward(p, v.q, v.k, v.v, v.o, v.dO, lse.data<float>(), v.dq, v.dk, v.dv, ws.rawData(),
                               flashWs, s);
      },
      kTimedReps);
  return t;
}

AttentionChoice choice(AttentionPath path, bool deterministic = false) {
  AttentionChoice c;
  c.path = path;
  c.cudnnDeterministicBackward = deterministic;
  return c;
}

AttentionChoice decide(CudaRuntime& rt, AttentionBackend requested, const Tensor& qkvLow, int64_t heads) {
  const FlashProblem p = problemOf(qkvLow, heads);
  const DType low = qkvLow.dtype();
  const bool flashOk = flashSupported(p.D, low);
  const AttentionPath fallback = flashOk ? AttentionPath::kFlash : AttentionPath::kReference;
  if (requested == AttentionBackend::kFlash) return choice(fallback);
  CudnnAttention& cudnn = cudnnAttentionOf(rt);
  const CudnnAttentionViews v = layerViews(qkvLow, Tensor(), Tensor(), Tensor(), heads);
  const std::string why = cudnn.unsupported(rt.cudnn(), p, v, false);
  if (requested == AttentionBackend::kCudnn) {
    MT_REQUIRE(why.empty(), ConfigError, "model.attention = cudnn: cuDNN's fused attention cannot run ",
               shapeName(p, low), " on this GPU: ", why,
               " (model.attention = auto or flash runs our kernels)");
    MT_LOG_INFO << "attention: cudnn for " << shapeName(p, low) << " (model.attention = cudnn; "
                << cudnn.engines(rt.cudnn(), p, v, false) << ")";
    return choice(AttentionPath::kCudnn);
  }
  if (!why.empty()) {
    MT_LOG_INFO << "attention: " << (flashOk ? "flash" : "reference") << " for " << shapeName(p, low)
                << ": cuDNN's fused attention cannot run it: " << why;
    return choice(fallback);
  }
  if (low == DType::kF16 && flashOk) {
    // cuDNN's f16 backward loses what f16 should keep over bf16 in the gradients that pass through
    // attention (GptF16GradientsCloserThanBf16AtGpt2Width: f16/bf16 error ~1.0 against ~0.27 with
    // ours) and cost +0.078 nats at d12 over 800 steps where ours cost +0.021 (H100, 2026-12-06).
    MT_LOG_INFO << "attention: flash for " << shapeName(p, low)
                << " (f16: cuDNN's f16 backward is less accurate; model.attention = cudnn runs it)";
    return choice(AttentionPath::kFlash);
  }
  const bool deterministicOk = cudnn.unsupported(rt.cudnn(), p, v, true).empty();
  if (!flashOk && !deterministicOk) {
    MT_LOG_INFO << "attention: cudnn for " << shapeName(p, low) << " (our kernels are not built for head dim "
                << p.D << ")";
    return choice(AttentionPath::kCudnn);
  }
  const Timings t = measure(rt, qkvLow, heads, deterministicOk, flashOk);
  const double flashMs = t.flash;
  AttentionChoice c = choice(AttentionPath::kCudnn, t.cudnnDeterministic < t.cudnn);
  if (flashMs < std::min(t.cudnn, t.cudnnDeterministic)) c = choice(AttentionPath::kFlash);
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                " (cudnn %.3f ms, cudnn with deterministic dQ %.3f ms, flash %.3f ms forward+backward, median of %d; ",
                t.cudnn, t.cudnnDeterministic, flashMs, kTimedReps);
  MT_LOG_INFO << "attention: "
              << (c.path == AttentionPath::kFlash ? "flash"
                  : c.cudnnDeterministicBackward  ? "cudnn with deterministic dQ"
                                                  : "cudnn")
              << " chosen for " << shapeName(p, low) << buf
              << cudnn.engines(rt.cudnn(), p, v, c.cudnnDeterministicBackward) << ")";
  return c;
}

}  // namespace

FlashView qkvView(const Tensor& t, int which, int64_t H, int64_t d) {
  FlashView v;
  v.dtype = t.defined() ? t.dtype() : DType::kBF16;
  const int64_t T = t.defined() ? t.dim(1) : 0, C3 = t.defined() ? t.dim(2) : 3 * H * d;
  v.ptr = t.defined()
              ? static_cast<char*>(t.rawData()) + static_cast<size_t>(which * H * d) * dtypeSize(t.dtype())
              : nullptr;
  v.sb = T * C3, v.st = C3, v.sh = d;
  return v;
}

FlashView rowsView(const Tensor& t, int64_t d) {
  FlashView v;
  v.ptr = t.defined() ? t.rawData() : nullptr;
  v.dtype = t.defined() ? t.dtype() : DType::kBF16;
  v.sb = t.defined() ? t.dim(1) * t.dim(2) : 0, v.st = t.defined() ? t.dim(2) : 0, v.sh = d;
  return v;
}

FlashProblem problemOf(const Tensor& qkv, int64_t heads) {
  FlashProblem p;
  p.B = qkv.dim(0), p.T = qkv.dim(1), p.H = heads, p.D = qkv.dim(2) / 3 / heads;
  p.scale = 1.f / std::sqrt(static_cast<float>(p.D));
  return p;
}

CudnnAttentionViews layerViews(const Tensor& qkvLow, const Tensor& y, const Tensor& dy, const Tensor& dqkv,
                               int64_t heads) {
  const int64_t T = qkvLow.dim(1), C = qkvLow.dim(2) / 3, d = C / heads;
  CudnnAttentionViews v;
  v.q = qkvView(qkvLow, 0, heads, d), v.k = qkvView(qkvLow, 1, heads, d), v.v = qkvView(qkvLow, 2, heads, d);
  // Layouts of tensors not made yet: what the layer will allocate ([B, T, C] and [B, T, 3C]).
  auto rows = [&](const Tensor& t) {
    FlashView r = rowsView(t, d);
    if (!t.defined()) r.dtype = qkvLow.dtype(), r.sb = T * C, r.st = C;
    return r;
  };
  v.o = rows(y), v.dO = rows(dy);
  for (int which = 0; which < 3; ++which) {
    FlashView g = qkvView(dqkv, which, heads, d);
    if (!dqkv.defined()) g.dtype = qkvLow.dtype(), g.sb = T * 3 * C, g.st = 3 * C;
    (which == 0 ? v.dq : which == 1 ? v.dk : v.dv) = g;
  }
  return v;
}

CudnnAttention& cudnnAttentionOf(CudaRuntime& rt) {
  return rt.components().get<CudnnAttention>();
}

AttentionChoice chooseAttention(AttentionBackend requested, const Tensor& qkvLow, int64_t heads) {
  CudaRuntime& rt = CudaRuntime::require();
  const FlashProblem p = problemOf(qkvLow, heads);
  const ShapeKey key{p.B, p.T, p.H, p.D, static_cast<int>(qkvLow.dtype()), requested};
  AttentionChoices& choices = rt.components().get<AttentionChoices>();
  {
    std::lock_guard<std::mutex> lock(choices.mutex);
    auto it = choices.chosen.find(key);
    if (it != choices.chosen.end()) return it->second;
  }
  // Decided outside the lock (a measurement runs kernels); two threads deciding the same shape at
  // once would both measure and keep the first answer.
  const AttentionChoice c = decide(rt, requested, qkvLow, heads);
  std::lock_guard<std::mutex> lock(choices.mutex);
  return choices.chosen.emplace(key, c).first->second;
}

}  // namespace mt::cuda
