#include "models/layers/Attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/Parallel.h"
#include "models/kernels/Dispatch.h"
#include "core/Gemm.h"

namespace mt {

namespace {
// Gathers q, k or v (which = 0, 1, 2) of head h for sample b into dst [T, d].
void gatherHead(const float* qkv, float* dst, int64_t b, int64_t h, int which, int64_t T, int64_t H, int64_t d) {
  const int64_t C = H * d;
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(dst + t * d, qkv + ((b * T + t) * 3 + which) * C + h * d, sizeof(float) * static_cast<size_t>(d));
}
void scatterHead(float* qkv, const float* src, int64_t b, int64_t h, int which, int64_t T, int64_t H, int64_t d) {
  const int64_t C = H * d;
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(qkv + ((b * T + t) * 3 + which) * C + h * d, src + t * d, sizeof(float) * static_cast<size_t>(d));
}
}  // namespace

const EnumTable<AttentionBackend>& attentionBackends() {
  static const EnumTable<AttentionBackend> kTable = {
      {AttentionBackend::kAuto, "auto",
       "per shape, the faster of flash and cudnn, measured once at its first use (flash where cuDNN cannot run it, "
       "and in f16, where cuDNN's backward loses precision f16 should keep)"},
      {AttentionBackend::kFlash, "flash",
       "our kernels (models/kernels/FlashAttention.h): FlashAttention-2's algorithm, on sm_90a with wgmma and, "
       "for the bf16 backward, warp-specialized TMA kernels"},
      {AttentionBackend::kCudnn, "cudnn", "cuDNN's fused attention (cuDNN 9 graph API); a shape it cannot run is an error"},
  };
  return kTable;
}

int64_t AttentionSaved::bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&qkv, &probs, &qkvLow, &lse})
    if (t->defined()) b += static_cast<int64_t>(t->nbytes());
  return b;
}

void attentionForward(Tensor& y, const Tensor& qkv, int64_t heads, AttentionSaved* saved, AttentionBackend backend) {
  MT_DISPATCH_CUDA(qkv, attentionForward(y, qkv, heads, saved, backend));
  (void)backend;  // the CPU has one implementation
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = heads, d = C / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const float* in = qkv.data<float>();
  float* out = y.data<float>();
  // Inference keeps one head's P at a time; training keeps all of it for backward.
  Tensor att = Tensor::empty({saved ? B : 1, saved ? H : 1, T, T}, DType::kF32);
  if (saved) {
    saved->clear();
    saved->qkv = qkv;
    saved->probs = att;
  }
  float* P = att.data<float>();
  std::vector<float> q(static_cast<size_t>(T * d)), k(q.size()), v(q.size()), o(q.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      gatherHead(in, q.data(), b, h, 0, T, H, d);
      gatherHead(in, k.data(), b, h, 1, T, H, d);
      gatherHead(in, v.data(), b, h, 2, T, H, d);
      float* S = saved ? P + (b * H + h) * T * T : P;
      gemmCpu(Trans::kNo, Trans::kYes, T, T, d, scale, q.data(), k.data(), 0.f, S);
      for (int64_t t = 0; t < T; ++t) {
        float* row = S + t * T;
        float mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) mx = std::max(mx, row[s]);
        double sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = std::exp(row[s] - mx);
          sum += row[s];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t s = 0; s <= t; ++s) row[s] *= inv;
        for (int64_t s = t + 1; s < T; ++s) row[s] = 0.f;
      }
      gemmCpu(Trans::kNo, Trans::kNo, T, d, T, 1.f, S, v.data(), 0.f, o.data());
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(out + (b * T + t) * C + h * d, o.data() + t * d, sizeof(float) * static_cast<size_t>(d));
    }
}

void attentionBackward(Tensor& dqkv, const Tensor& dy, const AttentionSaved& saved, int64_t heads) {
  MT_DISPATCH_CUDA(dy, attentionBackward(dqkv, dy, saved, heads));
  MT_CHECK(saved.probs.defined(), "attention backward without a training forward");
  const Tensor& qkv = saved.qkv;
  const Tensor& att = saved.probs;
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = heads, d = C / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const float* in = qkv.data<float>();
  const float* gy = dy.data<float>();
  const float* P = att.data<float>();
  float* gout = dqkv.data<float>();
  std::vector<float> q(static_cast<size_t>(T * d)), k(q.size()), v(q.size()), g(q.size()), dq(q.size()), dk(q.size()),
      dv(q.size()), dS(static_cast<size_t>(T * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      gatherHead(in, q.data(), b, h, 0, T, H, d);
      gatherHead(in, k.data(), b, h, 1, T, H, d);
      gatherHead(in, v.data(), b, h, 2, T, H, d);
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(g.data() + t * d, gy + (b * T + t) * C + h * d, sizeof(float) * static_cast<size_t>(d));
      const float* Ph = P + (b * H + h) * T * T;
      gemmCpu(Trans::kYes, Trans::kNo, T, d, T, 1.f, Ph, g.data(), 0.f, dv.data());        // dv = P^T dy
      gemmCpu(Trans::kNo, Trans::kYes, T, T, d, 1.f, g.data(), v.data(), 0.f, dS.data());  // dP = dy v^T
      for (int64_t t = 0; t < T; ++t) {
        const float* p = Ph + t * T;
        float* r = dS.data() + t * T;
        double dot = 0.0;
        for (int64_t s = 0; s <= t; ++s) dot += static_cast<double>(p[s]) * r[s];
        for (int64_t s = 0; s < T; ++s) r[s] = s <= t ? p[s] * (r[s] - static_cast<float>(dot)) * scale : 0.f;
      }
      gemmCpu(Trans::kNo, Trans::kNo, T, d, T, 1.f, dS.data(), k.data(), 0.f, dq.data());  // dq = dS k
      gemmCpu(Trans::kYes, Trans::kNo, T, d, T, 1.f, dS.data(), q.data(), 0.f, dk.data());  // dk = dS^T q
      scatterHead(gout, dq.data(), b, h, 0, T, H, d);
      scatterHead(gout, dk.data(), b, h, 1, T, H, d);
      scatterHead(gout, dv.data(), b, h, 2, T, H, d);
    }
}

void addInPlace(Tensor& y, const Tensor& x) {
  MT_CHECK(y.numel() == x.numel(), "addInPlace ", y.str(), " += ", x.str());
  MT_DISPATCH_CUDA(y, addInPlace(y, x));
  float* a = y.data<float>();
  const float* b = x.data<float>();
  parallelFor(y.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] += b[i];
  });
}

}  // namespace mt

namespace mt {

void addPositional(Tensor& x, const Tensor& wpe) {
  MT_DISPATCH_CUDA(x, addPositional(x, wpe));
  const int64_t B = x.dim(0), TC = x.dim(1) * x.dim(2);
  float* p = x.data<float>();
  const float* w = wpe.data<float>();
  parallelFor(B, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b)
      for (int64_t i = 0; i < TC; ++i) p[b * TC + i] += w[i];
  });
}

void positionalBackward(Tensor& dwpe, const Tensor& dx) {
  MT_DISPATCH_CUDA(dx, positionalBackward(dwpe, dx));
  const int64_t B = dx.dim(0), TC = dx.dim(1) * dx.dim(2);
  const float* g = dx.data<float>();
  float* w = dwpe.data<float>();
  parallelFor(TC, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float acc = 0.f;
      for (int64_t b = 0; b < B; ++b) acc += g[b * TC + i];
      w[i] += acc;
    }
  });
}

}  // namespace mt
