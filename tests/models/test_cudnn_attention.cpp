// cuDNN's fused attention (models/kernels/CudnnAttention.h) on the GPU:
//  - forward and backward against a float64 CPU reference computed from the same rounded inputs,
//    fused qkv layout as the GPT's, T = 1, 17, 1000, 1024, head dims 64 and 128, bf16 and f16,
//    outputs, statistics and gradients poisoned with NaN before each call: relative L2 error of O,
//    dQ, dK, dV < 1e-2 (our flash kernels' bound), the saved statistics equal to the natural-log
//    log-sum-exp per row within 1e-3; our flash kernels on the same inputs for scale; the
//    deterministic backward bitwise equal over two runs;
//  - the layer: model.attention = cudnn / flash / auto take the path they say, a head dim neither
//    kernel runs is a ConfigError naming model.attention under cudnn and the reference path under auto;
//  - GPT training steps with model.attention = cudnn against flash within bf16/f16 tolerance.
// Every line printed says which backend ran, its error and its time (the device log is the record).

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/Parallel.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"
#include "core/cuda/CudaStream.h"
#include "models/kernels/AttentionChoice.h"
#include "models/kernels/CudnnAttention.h"
#include "models/kernels/FlashAttention.h"
#include "models/layers/Attention.h"
#include "tests/common/TestUtil.h"
#include "tests/models/GptTraining.h"

namespace mt {
namespace {

const Device kGpu = Device::cuda(0);

bool gpuHasFusedAttention() {
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 8;
}

class PrecisionScope {
 public:
  explicit PrecisionScope(MatmulPrecision p) : prev_(CudaRuntime::require().matmulPrecision()) {
    CudaRuntime::require().setMatmulPrecision(p);
  }
  ~PrecisionScope() { CudaRuntime::require().setMatmulPrecision(prev_); }

 private:
  MatmulPrecision prev_;
};

Tensor nanTensor(const Shape& shape, DType t) {
  Tensor f = Tensor::empty(shape, DType::kF32);
  f.fill_(NAN);
  return f.toDType(t).to(kGpu);
}
Tensor hostF32(const Tensor& t) {
  return t.to(Device::cpu()).toDType(DType::kF32);
}

// float64 causal attention of the fused [B, T, 3, H, D] qkv: o [B, T, H*D], lse [B, H, T]
// (natural log) and, given dO [B, T, H*D], dqkv [B, T, 3, H, D].
struct Reference {
  std::vector<double> o, lse, dqkv;
};
Reference reference(const float* qkv, const float* dO, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t C = H * D;
  Reference r;
  r.o.assign(B * T * C, 0), r.lse.assign(B * H * T, 0), r.dqkv.assign(B * T * 3 * C, 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  parallelFor(B * H, 1, [&](int64_t lo, int64_t hi) {
    std::vector<double> P(T * T), dP(T * T);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      auto at = [&](int which, int64_t t, int64_t j) {
        return qkv[((b * T + t) * 3 + which) * C + h * D + j];
      };
      auto g = [&](int64_t t, int64_t j) { return static_cast<double>(dO[(b * T + t) * C + h * D + j]); };
      for (int64_t t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          double acc = 0;
          for (int64_t j = 0; j < D; ++j)
            acc += static_cast<double>(at(0, t, j)) * at(1, s, j);
          P[t * T + s] = acc * scale;
          mx = std::max(mx, P[t * T + s]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s)
          sum += (P[t * T + s] = std::exp(P[t * T + s] - mx));
        for (int64_t s = 0; s <= t; ++s)
          P[t * T + s] /= sum;
        r.lse[bh * T + t] = mx + std::log(sum);
        for (int64_t j = 0; j < D; ++j) {
          double acc = 0;
          for (int64_t s = 0; s <= t; ++s)
            acc += P[t * T + s] * at(2, s, j);
          r.o[(b * T + t) * C + h * D + j] = acc;
        }
      }
      // dP = dO V^T; dS = P (dP - rowsum(P dP)); dq = dS K scale; dk = dS^T Q scale; dv = P^T dO.
      for (int64_t t = 0; t < T; ++t) {
        double dot = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double acc = 0;
          for (int64_t j = 0; j < D; ++j)
            acc += g(t, j) * at(2, s, j);
          dP[t * T + s] = acc;
          dot += P[t * T + s] * acc;
        }
        for (int64_t s = 0; s <= t; ++s)
          dP[t * T + s] = P[t * T + s] * (dP[t * T + s] - dot) * scale;
      }
      auto d = [&](int which, int64_t t, int64_t j) -> double& {
        return r.dqkv[((b * T + t) * 3 + which) * C + h * D + j];
      };
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s <= t; ++s) {
          const double ds = dP[t * T + s], p = P[t * T + s];
          for (int64_t j = 0; j < D; ++j) {
            d(0, t, j) += ds * at(1, s, j);
            d(1, s, j) += ds * at(0, t, j);
            d(2, s, j) += p * g(t, j);
          }
        }
    }
  });
  return r;
}

// ||gpu - ref|| / max(||ref||, floor) over the elements [part*w, (part+1)*w) of each row of `parts`.
double relL2(const Tensor& gpu, const std::vector<double>& ref, int64_t parts, int64_t part,
             double floor = 0) {
  const Tensor h = hostF32(gpu);
  const float* a = h.data<float>();
  const int64_t n = h.numel(), row = h.dim(-1), w = row / parts;
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if ((i % row) / w != part) continue;
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, std::max(floor * floor, 1e-300)));
}

std::vector<double> asDouble(const Tensor& t) {
  const Tensor h = hostF32(t);
  return std::vector<double>(h.data<float>(), h.data<float>() + h.numel());
}

bool bitwiseEqual(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.rawData(), hb.rawData(), ha.nbytes()) == 0;
}

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double ms() const {
    CudaRuntime::require().synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

void kernelCase(int64_t T, int64_t D, DType dt, uint64_t seed) {
  const int64_t B = 2, H = 2, C = H * D;
  CudaRuntime& rt = CudaRuntime::require();
  Tensor qkv32 = test::randomTensor({B, T, 3 * C}, seed, 2.f), dO32 = test::randomTensor({B, T, C}, seed + 1);
  // The reference sees the operands as rounded to the operand dtype.
  Tensor qkvLow = qkv32.toDType(dt), dOLow = dO32.toDType(dt);
  const Tensor qkvR = qkvLow.toDType(DType::kF32), dOR = dOLow.toDType(DType::kF32);
  const Reference ref = reference(qkvR.data<float>(), dOR.data<float>(), B, T, H, D);
  Tensor gqkv = qkvLow.to(kGpu), gdO = dOLow.to(kGpu);
  Tensor o = nanTensor({B, T, C}, dt), dqkv = nanTensor({B, T, 3 * C}, dt);
  Tensor stats = nanTensor({cuda::CudnnAttention::statsElements(cuda::problemOf(gqkv, H))}, DType::kF32);
  const cuda::FlashProblem p = cuda::problemOf(gqkv, H);
  const cuda::CudnnAttentionViews v = cuda::layerViews(gqkv, o, gdO, dqkv, H);
  cuda::CudnnAttention& att = cuda::cudnnAttentionOf(rt);
  cudnnHandle_t h = rt.cudnn();
  for (bool det : {false, true}) {
    const std::string why = att.unsupported(h, p, v, det);
    ASSERT_EQ(why, "") << "cuDNN cannot run T=" << T << " D=" << D << " " << dtypeName(dt) << " det=" << det;
    o.copyFrom(nanTensor(o.shape(), dt));
    dqkv.copyFrom(nanTensor(dqkv.shape(), dt));
    stats.copyFrom(nanTensor(stats.shape(), DType::kF32));
    const size_t fws = att.forwardWorkspaceBytes(h, p, v), bws = att.backwardWorkspaceBytes(h, p, v, det);
    Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<size_t>({fws, bws, 1}))}, DType::kU8, kGpu);
    CUDA_CHECK(cudaMemsetAsync(ws.rawData(), 0xFF, ws.nbytes(), currentStream()));  // NaN patterns
    Timer tf;
    att.forward(h, p, v, stats.data<float>(), ws.rawData(), fws, currentStream());
    const double fwdMs = tf.ms();
    Timer tb;
    att.backward(h, p, v, stats.data<float>(), det, ws.rawData(), bws, currentStream());
    const double bwdMs = tb.ms();
    const double floor = 1e-4 * std::sqrt(static_cast<double>(dO32.numel()) / 3.0);
    const double eo = relL2(o, ref.o, 1, 0), eq = relL2(dqkv, ref.dqkv, 3, 0, floor),
                 ek = relL2(dqkv, ref.dqkv, 3, 1, floor), ev = relL2(dqkv, ref.dqkv, 3, 2, floor);
    const Tensor hs = stats.to(Device::cpu());
    double es = 0;
    for (int64_t i = 0; i < hs.numel(); ++i)
      es = std::isfinite(hs.data<float>()[i]) ? std::max(es, std::fabs(hs.data<float>()[i] - ref.lse[i]))
                                              : INFINITY;
    std::printf(
        "cudnn T=%-4lld D=%-3lld %s %s: o %.2e dq %.2e dk %.2e dv %.2e stats max abs %.2e | %s | "
        "first-call fwd %.2f ms bwd %.2f ms (plans built before)\n",
        static_cast<long long>(T), static_cast<long long>(D), dtypeName(dt),
        det ? "deterministic" : "atomic dq", eo, eq, ek, ev, es, att.engines(h, p, v, det).c_str(), fwdMs,
        bwdMs);
    const std::string where = "T=" + std::to_string(T) + " D=" + std::to_string(D) + " " + dtypeName(dt) +
                              (det ? " deterministic" : "");
    EXPECT_LT(eo, 1e-2) << where;
    EXPECT_LT(eq, 1e-2) << where;
    EXPECT_LT(ek, 1e-2) << where;
    EXPECT_LT(ev, 1e-2) << where;
    EXPECT_LT(es, 1e-3) << where << ": the statistics are not the natural-log log-sum-exp per row";
    if (det) {  // bitwise repeatable: the same call again into fresh NaN buffers
      Tensor first = dqkv.to(Device::cpu());
      dqkv.copyFrom(nanTensor(dqkv.shape(), dt));
      att.backward(h, p, v, stats.data<float>(), true, ws.rawData(), bws, currentStream());
      EXPECT_TRUE(bitwiseEqual(first, dqkv)) << where << ": deterministic backward not bitwise repeatable";
    }
  }
  // Our flash kernels on the same inputs (fresh buffers), for scale.
  if (cuda::flashSupported(D, dt)) {
    Tensor fo = nanTensor({B, T, C}, dt), fd = nanTensor({B, T, 3 * C}, dt);
    Tensor lse = Tensor::empty({cuda::flashLseElements(p)}, DType::kF32, kGpu);
    const cuda::CudnnAttentionViews f = cuda::layerViews(gqkv, fo, gdO, fd, H);
    const size_t ws = cuda::flashBackwardWorkspaceBytes(p, dt, f.dO, f.dq);
    Tensor w = Tensor::empty({static_cast<int64_t>(ws)}, DType::kU8, kGpu);
    cuda::flashAttentionForward(p, f.q, f.k, f.v, f.o, lse.data<float>(), currentStream());
    cuda::flashAttentionBackward(p, f.q, f.k, f.v, f.o, f.dO, lse.data<float>(), f.dq, f.dk, f.dv,
                                 w.rawData(), ws, currentStream());
    std::printf("flash T=%-4lld D=%-3lld %s: o %.2e dq %.2e (same inputs, for scale)\n",
                static_cast<long long>(T), static_cast<long long>(D), dtypeName(dt), relL2(fo, ref.o, 1, 0),
                relL2(fd, ref.dqkv, 3, 0));
  }
}

TEST(CudnnAttention, ForwardBackwardMatchFloat64) {
  if (!gpuHasFusedAttention()) GTEST_SKIP() << "cuDNN's fused attention needs compute capability 8.0+";
  std::printf("cuDNN %zu (built with %d.%d.%d)\n", cudnnGetVersion(), CUDNN_MAJOR, CUDNN_MINOR,
              CUDNN_PATCHLEVEL);
  const uint64_t seed = std::random_device{}();
  std::printf("cudnn attention: seed %llu\n", static_cast<unsigned long long>(seed));
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t D : {64, 128})
      for (int64_t T : {1, 17, 1000, 1024})
        kernelCase(T, D, dt, seed + T * 7 + D);
}

// Through the layer, f32 y and dqkv as the parity tests pass them (the cuDNN path casts).
TEST(CudnnAttention, LayerBackendsTakeTheirPath) {
  if (!gpuHasFusedAttention()) GTEST_SKIP() << "cuDNN's fused attention needs compute capability 8.0+";
  PrecisionScope scope(MatmulPrecision::kBF16);
  const int64_t B = 2, T = 200, H = 2, D = 64, C = H * D;
  Tensor qkv = test::randomTensor({B, T, 3 * C}, 11, 2.f), dy = test::randomTensor({B, T, C}, 12);
  Tensor y = Tensor::empty({B, T, C}, DType::kF32), dqkv = Tensor::empty({B, T, 3 * C}, DType::kF32);
  AttentionSaved cpu;
  attentionForward(y, qkv, H, &cpu);
  attentionBackward(dqkv, dy, cpu, H);
  for (AttentionBackend b : {AttentionBackend::kCudnn, AttentionBackend::kFlash, AttentionBackend::kAuto}) {
    Tensor gy = nanTensor(y.shape(), DType::kF32), gd = nanTensor(dqkv.shape(), DType::kF32);
    AttentionSaved s;
    attentionForward(gy, qkv.to(kGpu), H, &s, b);
    attentionBackward(gd, dy.to(kGpu), s, H);
    const char* ran = s.cudnn() ? (s.cudnnDeterministicBackward ? "cudnn (deterministic dQ)" : "cudnn")
                      : s.flash() ? "flash"
                                  : "reference";
    const double ey = relL2(gy, asDouble(y), 1, 0), ed = relL2(gd, asDouble(dqkv), 1, 0);
    std::printf("layer model.attention=%s ran %s: y %.2e dqkv %.2e (relative L2), saved %lld bytes\n",
                enumName(attentionBackends(), b), ran, ey, ed, static_cast<long long>(s.bytes()));
    if (b == AttentionBackend::kCudnn) EXPECT_TRUE(s.cudnn());
    if (b == AttentionBackend::kFlash) EXPECT_TRUE(s.flash());
    if (b == AttentionBackend::kAuto) EXPECT_TRUE(s.cudnn() || s.flash());
    if (s.cudnn()) EXPECT_EQ(s.lse.numel(), B * H * T);
    EXPECT_LT(ey, 2e-2);
    EXPECT_LT(ed, 2e-2);
    if (b == AttentionBackend::kCudnn) EXPECT_FALSE(s.cudnnDeterministicBackward);  // cudnn: cuDNN's default
    if (s.cudnn() && s.cudnnDeterministicBackward) {  // auto chose it: the layer's backward repeats bitwise
      Tensor again = nanTensor(dqkv.shape(), DType::kF32);
      attentionBackward(again, dy.to(kGpu), s, H);
      Tensor a = gd.to(Device::cpu()), c = again.to(Device::cpu());
      EXPECT_EQ(std::memcmp(a.rawData(), c.rawData(), a.nbytes()), 0);
    }
  }
  // Head dim 20: neither kernel runs it (cuDNN wants a multiple of 8; ours are built for 32/64/128).
  const int64_t D2 = 20, C2 = H * D2;
  Tensor q2 = test::randomTensor({B, 16, 3 * C2}, 13).to(kGpu),
         y2 = Tensor::empty({B, 16, C2}, DType::kF32, kGpu);
  AttentionSaved s2;
  try {
    attentionForward(y2, q2, H, &s2, AttentionBackend::kCudnn);
    ADD_FAILURE() << "model.attention = cudnn with head dim 20 did not fail";
  } catch (const ConfigError& e) {
    std::printf("model.attention=cudnn, head dim 20: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("model.attention"), std::string::npos) << e.what();
  }
  attentionForward(y2, q2, H, &s2, AttentionBackend::kAuto);
  EXPECT_EQ(s2.path, AttentionPath::kReference);
}

// GPT training: model.attention = cudnn against flash, bf16 and f16, head dim 64.
TEST(CudnnAttention, GptTrainingMatchesFlash) {
  if (!gpuHasFusedAttention()) GTEST_SKIP() << "cuDNN's fused attention needs compute capability 8.0+";
  for (MatmulPrecision prec : {MatmulPrecision::kBF16, MatmulPrecision::kF16}) {
    PrecisionScope scope(prec);
    GptConfig c;
    c.vocab = 200, c.paddedVocab = 256, c.maxT = 128, c.layers = 2, c.heads = 2, c.channels = 128;
    c.attention = AttentionBackend::kFlash;
    const test::GptRun flash = test::trainGpt(c, kGpu, true, 5, 4);
    c.attention = AttentionBackend::kCudnn;
    const test::GptRun cudnn = test::trainGpt(c, kGpu, true, 5, 4);
    double worst = 0;
    for (size_t i = 0; i < flash.losses.size(); ++i) {
      worst = std::max(worst, std::fabs(cudnn.losses[i] - flash.losses[i]) / flash.losses[i]);
      std::printf("gpt %s step %zu: loss flash %.6f cudnn %.6f\n",
                  prec == MatmulPrecision::kBF16 ? "bf16" : "f16", i, flash.losses[i], cudnn.losses[i]);
    }
    std::printf(
        "gpt %s: worst loss relative difference cudnn vs flash over 5 steps %.2e; kept activation bytes "
        "flash %lld cudnn %lld\n",
        prec == MatmulPrecision::kBF16 ? "bf16" : "f16", worst, static_cast<long long>(flash.keptBytes),
        static_cast<long long>(cudnn.keptBytes));
    EXPECT_LT(worst, 2e-2);
    EXPECT_LE(cudnn.keptBytes, flash.keptBytes);  // [B, H, T] statistics against flash's rounded rows
  }
}

}  // namespace
}  // namespace mt
