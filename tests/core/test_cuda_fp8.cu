// FP8 on the GPU (core/cuda/Fp8.cu) against the CPU emulation (core/Fp8.h):
//  - every one of the 2^32 f32 bit patterns: CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f)
//    (the hardware cvt on sm_89+) equals fp8FromFloat, in a device kernel (the same source the
//    host compiles), and on the host for all bf16/f16 values and a strided f32 sweep;
//  - the quantize kernels (cast + fused amax, transposed copy, scale updates, both recipes over
//    several steps): codes bitwise, scales within 1e-6 (they are expected bitwise too);
//  - the FP8 cuBLASLt GEMM (E4M3 x E4M3 -> bf16 with bias, E5M2 x E4M3 -> f32 accumulating)
//    against the CPU emulation, to f32 summation order and the bf16 output's rounding;
//  - its GELU epilogues (fp8GemmGelu: GELU_AUX_BIAS in forward, DGELU in backward) and a residual
//    read as C, against the emulated GEMM and the tanh GELU in double;
//  - the casts with the GELU inside (fp8QuantizeFrom, kGelu and kDGelu with its column sums)
//    against the emulation: the GPU's tanh.approx against std::tanh, so codes within one step.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <cuda_fp8.h>

#include "core/Fp8.h"
#include "core/cuda/CudaCheck.h"
#include "core/cuda/CudaRuntime.h"

namespace mt {
namespace {

Device gpu() {
  return Device::cuda(CudaRuntime::require().device());
}

__global__ void allFloatsKernel(uint64_t begin, uint64_t count, Fp8Format f, unsigned long long* bad,
                                unsigned int* firstBad) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = static_cast<uint32_t>(begin + i);
    const float x = __uint_as_float(u);
    const uint8_t hw = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2));
    if (hw != fp8FromFloat(x, f)) {
      if (atomicAdd(bad, 1ull) == 0) *firstBad = u;
    }
  }
}

TEST(CudaFp8, CastOfEveryFloatMatchesTheIntrinsic) {
  unsigned long long* bad;
  unsigned int* first;
  CUDA_CHECK(cudaMalloc(&bad, sizeof(*bad)));
  CUDA_CHECK(cudaMalloc(&first, sizeof(*first)));
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    CUDA_CHECK(cudaMemset(bad, 0, sizeof(*bad)));
    allFloatsKernel<<<4096, 256>>>(0, 1ull << 32, f, bad, first);
    CUDA_CHECK(cudaGetLastError());
    unsigned long long nBad = 0;
    unsigned int u = 0;
    CUDA_CHECK(cudaMemcpy(&nBad, bad, sizeof(nBad), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&u, first, sizeof(u), cudaMemcpyDeviceToHost));
    EXPECT_EQ(nBad, 0ull) << enumName(fp8Formats(), f) << ": first mismatch at f32 bits 0x" << std::hex << u;
  }
  CUDA_CHECK(cudaFree(bad));
  CUDA_CHECK(cudaFree(first));
}

TEST(CudaFp8, HostCastMatchesTheIntrinsic) {
  std::vector<float> xs;
  for (uint32_t b = 0; b < 65536; ++b) {
    xs.push_back(BFloat16::toFloat(static_cast<uint16_t>(b)));
    xs.push_back(Float16::toFloat(static_cast<uint16_t>(b)));
  }
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    float x;
    const uint32_t v = static_cast<uint32_t>(u);
    memcpy(&x, &v, 4);
    xs.push_back(x);
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor host = Tensor::fromBlob(xs.data(), {n}, DType::kF32);
  Tensor x = host.to(gpu());
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    Tensor q = Tensor::empty({n}, DType::kU8, gpu());
    cuda::fp8CastIntrinsic(q, x, f);
    Tensor qh = q.to(Device::cpu());
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (qh.data<uint8_t>()[i] != fp8FromFloat(xs[static_cast<size_t>(i)], f) && ++bad <= 5)
        ADD_FAILURE() << enumName(fp8Formats(), f) << " " << xs[static_cast<size_t>(i)] << ": intrinsic 0x"
                      << std::hex << int(qh.data<uint8_t>()[i]) << ", emulation 0x"
                      << int(fp8FromFloat(xs[static_cast<size_t>(i)], f));
    EXPECT_EQ(bad, 0);
  }
}

Tensor wave(int64_t R, int64_t C, float amp, int seed, DType t) {
  Tensor f = Tensor::empty({R, C}, DType::kF32);
  for (int64_t i = 0; i < R * C; ++i)
    f.data<float>()[i] = amp * std::sin(0.013f * static_cast<float>(i * (seed + 3))) *
                         std::exp(std::cos(0.7f * static_cast<float>(i + seed)));
  return f.toDType(t);
}

void expectStatesEqual(const Fp8State& cpu, const Fp8State& dev, const std::string& what) {
  const std::vector<float> a = cpu.read(), b = dev.read();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(b[i], a[i], std::fabs(a[i]) * 1e-6) << what << " state[" << i << "]";
  EXPECT_EQ(cpu.casts(), dev.casts());
}

TEST(CudaFp8, QuantizeKernelsMatchTheEmulation) {
  // 333 x 77: the one-element-per-thread kernel (C not a multiple of 8), not a multiple of its 32 x
  // 32 tiles; 208 x 200 and 256 x 768: the vectorized one (C % 8 == 0, R % 16 == 0), a partial and
  // whole 64 x 64 tiles; 160 x 136: a partial last row tile and a partial column tile at once.
  // History 4: the delayed cast in one kernel (the last block writes the state); 40 (160 x 136):
  // past the 32 one warp reads, the scale and history kernels around the cast.
  for (const auto& [R, C] : {std::pair<int64_t, int64_t>{333, 77}, {208, 200}, {256, 768}, {160, 136}})
  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kDelayed})
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (DType t : {DType::kF32, DType::kBF16}) {
        Fp8Options o;
        o.recipe = recipe;
        o.historyLength = R == 160 ? 40 : 4;
        o.margin = f == Fp8Format::kE5M2 ? 1 : 0;
        Fp8State sc(f, o, Device::cpu()), sg(f, o, gpu());
        const float amps[] = {1.f, 30.f, 0.01f, 5.f, 0.f, 200.f};
        for (int step = 0; step < 6; ++step) {
          const std::string what = std::to_string(R) + "x" + std::to_string(C) + " " +
                                   enumName(fp8Recipes(), recipe) + " " +
                                   enumName(fp8Formats(), f) + " " + dtypeName(t) + " step " +
                                   std::to_string(step);
          Tensor x = wave(R, C, amps[step], step, t);
          Tensor qc = Tensor::empty({R, C}, DType::kU8), qtc = Tensor::empty({C, R}, DType::kU8);
          fp8Quantize(qc, x, sc, &qtc);
          Tensor xg = x.to(gpu());
          Tensor qg = Tensor::empty({R, C}, DType::kU8, gpu()),
                 qtg = Tensor::empty({C, R}, DType::kU8, gpu());
          fp8Quantize(qg, xg, sg, &qtg);
          Tensor a = qg.to(Device::cpu()), b = qtg.to(Device::cpu());
          int64_t bad = 0;
          for (int64_t i = 0; i < R * C; ++i) {
            bad += a.data<uint8_t>()[i] != qc.data<uint8_t>()[i];
            bad += b.data<uint8_t>()[i] != qtc.data<uint8_t>()[i];
          }
          EXPECT_EQ(bad, 0) << what;
          expectStatesEqual(sc, sg, what);
          // The replay (activation checkpointing's recomputation) makes the same codes, state untouched.
          Tensor rg = Tensor::empty({R, C}, DType::kU8, gpu()),
                 rtg = Tensor::empty({C, R}, DType::kU8, gpu());
          fp8QuantizeReplay(rg, xg, sg, &rtg);
          Tensor ra = rg.to(Device::cpu()), rb = rtg.to(Device::cpu());
          EXPECT_EQ(memcmp(ra.rawData(), a.rawData(), R * C), 0) << what;
          EXPECT_EQ(memcmp(rb.rawData(), b.rawData(), R * C), 0) << what;
          expectStatesEqual(sc, sg, what + " after replay");
        }
      }
}

// Element i of a host f32 or bf16 tensor.
double valueAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? static_cast<float>(t.data<BFloat16>()[i]) : t.data<float>()[i];
}

double maxAbs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    m = std::max(m, std::fabs(valueAt(t, i)));
  return m;
}

TEST(CudaFp8, GemmMatchesTheEmulation) {
  struct Case {
    Fp8Format fa, fb;
    DType out;
    bool bias;
    float beta;
  };
  const Case cases[] = {{Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kBF16, true, 0.f},
                        {Fp8Format::kE4M3, Fp8Format::kE4M3, DType::kF32, true, 1.f},
                        {Fp8Format::kE5M2, Fp8Format::kE4M3, DType::kBF16, false, 0.f},
                        {Fp8Format::kE5M2, Fp8Format::kE4M3, DType::kF32, false, 1.f},
                        {Fp8Format::kE4M3, Fp8Format::kE5M2, DType::kF32, false, 0.f}};
  const int64_t M = 96, N = 160, K = 256;
  for (const Case& c : cases) {
    Fp8Options o;
    o.recipe = Fp8Recipe::kCurrent;
    Fp8State sa(c.fa, o, Device::cpu()), sb(c.fb, o, Device::cpu());
    Fp8State ga(c.fa, o, gpu()), gb(c.fb, o, gpu());
    Tensor a = wave(M, K, 2.f, 1, DType::kF32), b = wave(N, K, 0.3f, 2, DType::kF32);
    Tensor qa = Tensor::empty({M, K}, DType::kU8), qb = Tensor::empty({N, K}, DType::kU8);
    fp8Quantize(qa, a, sa, nullptr);
    fp8Quantize(qb, b, sb, nullptr);
    Tensor qag = Tensor::empty({M, K}, DType::kU8, gpu()), qbg = Tensor::empty({N, K}, DType::kU8, gpu());
    fp8Quantize(qag, a.to(gpu()), ga, nullptr);
    fp8Quantize(qbg, b.to(gpu()), gb, nullptr);
    Tensor bias = wave(1, N, 1.f, 3, DType::kF32).view({N});
    Tensor init = wave(M, N, 4.f, 4, c.out);
    Tensor dc = init.clone(), dg = init.to(gpu());
    Tensor biasG = bias.to(gpu());
    Fp8GemmArgs g;
    g.M = M, g.N = N, g.K = K, g.fa = c.fa, g.fb = c.fb, g.beta = c.beta;
    g.A = &qa, g.B = &qb, g.sa = &sa, g.sb = &sb, g.D = &dc, g.bias = c.bias ? &bias : nullptr;
    fp8Gemm(g);
    g.A = &qag, g.B = &qbg, g.sa = &ga, g.sb = &gb, g.D = &dg, g.bias = c.bias ? &biasG : nullptr;
    fp8Gemm(g);
    Tensor got = dg.to(Device::cpu());
    const double scale = maxAbs(dc);
    double worst = 0;
    for (int64_t i = 0; i < M * N; ++i) {
      worst = std::max(worst, std::fabs(valueAt(got, i) - valueAt(dc, i)) / scale);
    }
    std::printf("fp8 gemm %s x %s -> %s: worst |gpu - emulation| / max = %.3g\n",
                enumName(fp8Formats(), c.fa), enumName(fp8Formats(), c.fb), dtypeName(c.out), worst);
    // bf16: one output rounding apart where the f32 sums straddle it. f32: Hopper's FP8 tensor
    // cores keep partial sums in fewer than f32's bits between cuBLASLt's promotions to the f32
    // accumulator, so the sums differ by more than a summation order (H100, cuBLAS 13.1: 5.4e-4 to
    // 6.5e-4 of the largest output, 2026-12-05); 2e-3 still catches a wrong scale or layout.
    EXPECT_LT(worst, c.out == DType::kBF16 ? 1.0 / 128 : 2e-3);
  }
}

// Quantizes a (f32 [R,C]) with current scaling on the CPU and on the GPU (same codes and scale).
struct QuantPair {
  Fp8State cpuState, gpuState;
  Tensor codesCpu, codesGpu;
  QuantPair(const Tensor& a, Fp8Format f, const Fp8Options& o)
      : cpuState(f, o, Device::cpu()),
        gpuState(f, o, gpu()),
        codesCpu(Tensor::empty(a.shape(), DType::kU8)),
        codesGpu(Tensor::empty(a.shape(), DType::kU8, gpu())) {
    fp8Quantize(codesCpu, a, cpuState, nullptr);
    fp8Quantize(codesGpu, a.to(gpu()), gpuState, nullptr);
  }
};

double geluTanh(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
double geluTanhGrad(double v) {
  const double t = std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}

// worst |got - want| / max |want| over the elements (got on the GPU; want a host vector).
double worstRelative(const Tensor& gotDevice, const std::vector<double>& want) {
  const Tensor got = gotDevice.to(Device::cpu());
  double scale = 0, worst = 0;
  for (double w : want)
    scale = std::max(scale, std::fabs(w));
  for (int64_t i = 0; i < got.numel(); ++i)
    worst = std::max(worst, std::fabs(valueAt(got, i) - want[static_cast<size_t>(i)]) / scale);
  return worst;
}

TEST(CudaFp8, GeluEpiloguesAndResidualMatchTheEmulation) {
  const int64_t M = 96, N = 160, K = 256;
  Fp8Options o;
  o.recipe = Fp8Recipe::kCurrent;
  const Tensor a = wave(M, K, 2.f, 1, DType::kF32), b = wave(N, K, 0.3f, 2, DType::kF32);
  QuantPair qa(a, Fp8Format::kE4M3, o), qb(b, Fp8Format::kE4M3, o), qd(a, Fp8Format::kE5M2, o);
  const Tensor bias = wave(1, N, 1.f, 3, DType::kF32).view({N}), biasG = bias.to(gpu());
  auto args = [&](QuantPair& x, bool onGpu, Tensor* d) {
    Fp8GemmArgs g;
    g.M = M, g.N = N, g.K = K, g.fa = x.cpuState.format(), g.fb = Fp8Format::kE4M3, g.D = d;
    g.A = onGpu ? &x.codesGpu : &x.codesCpu, g.B = onGpu ? &qb.codesGpu : &qb.codesCpu;
    g.sa = onGpu ? &x.gpuState : &x.cpuState, g.sb = onGpu ? &qb.gpuState : &qb.cpuState;
    return g;
  };
  // Forward: y = GELU(A B^T + bias), pre = A B^T + bias (bf16), in the epilogue.
  Tensor pre = Tensor::empty({M, N}, DType::kBF16);
  Fp8GemmArgs c = args(qa, false, &pre);
  c.bias = &bias;
  fp8Gemm(c);
  Tensor yCpu = pre.clone();
  Fp8GemmArgs ce = c;
  ce.D = &yCpu, ce.geluPre = &pre;
  EXPECT_FALSE(fp8GemmGelu(ce)) << "the CPU emulation has no GELU epilogue: the layer runs the GEMM, then the GELU kernel";
  Tensor yG = Tensor::empty({M, N}, DType::kBF16, gpu()), preG = Tensor::empty({M, N}, DType::kBF16, gpu());
  Fp8GemmArgs g = args(qa, true, &yG);
  g.bias = &biasG;
  g.geluPre = &preG;
  if (!fp8GemmGelu(g)) GTEST_SKIP() << "this cuBLASLt has no FP8 GELU_AUX_BIAS kernel (the layer falls back)";
  std::vector<double> wantPre(static_cast<size_t>(M * N)), wantY(wantPre.size());
  for (int64_t i = 0; i < M * N; ++i) {
    wantPre[static_cast<size_t>(i)] = valueAt(pre, i);
    wantY[static_cast<size_t>(i)] = geluTanh(valueAt(pre, i));
  }
  const double ePre = worstRelative(preG, wantPre), eY = worstRelative(yG, wantY);
  // DGELU: dx = (dy W) * GELU'(pre), dy in E5M2.
  Tensor prod = Tensor::empty({M, N}, DType::kF32);
  Fp8GemmArgs cd = args(qd, false, &prod);
  fp8Gemm(cd);
  Tensor dxG = Tensor::empty({M, N}, DType::kBF16, gpu());
  Fp8GemmArgs gd = args(qd, true, &dxG);
  const Tensor preForBackward = pre.to(gpu());
  gd.dgeluPre = &preForBackward;
  const bool dgelu = fp8GemmGelu(gd);
  double eD = 0;
  if (dgelu) {
    std::vector<double> want(wantPre.size());
    for (int64_t i = 0; i < M * N; ++i)
      want[static_cast<size_t>(i)] = prod.data<float>()[i] * geluTanhGrad(valueAt(pre, i));
    eD = worstRelative(dxG, want);
  }
  // A residual read as C, D left as garbage: D = A B^T + bias + C.
  const Tensor res = wave(M, N, 4.f, 4, DType::kBF16);
  Tensor dr = Tensor::empty({M, N}, DType::kBF16);
  Fp8GemmArgs cr = args(qa, false, &dr);
  cr.bias = &bias, cr.C = &res, cr.beta = 1.f;
  fp8Gemm(cr);
  Tensor drG = Tensor::empty({M, N}, DType::kBF16, gpu()), resG = res.to(gpu());
  Fp8GemmArgs gr = args(qa, true, &drG);
  gr.bias = &biasG, gr.C = &resG, gr.beta = 1.f;
  fp8Gemm(gr);
  std::vector<double> wantR(wantPre.size());
  for (int64_t i = 0; i < M * N; ++i)
    wantR[static_cast<size_t>(i)] = valueAt(dr, i);
  const double eR = worstRelative(drG, wantR);
  std::printf("fp8 gemm epilogues: GELU_AUX_BIAS pre %.3g, GELU %.3g; DGELU %s %.3g; residual as C %.3g "
              "(worst |gpu - emulation| / max)\n",
              ePre, eY, dgelu ? "fused" : "absent (the layer falls back)", eD, eR);
  // One bf16 rounding apart where the f32 sums straddle it (the GEMM above); cuBLASLt's GELU is
  // its own tanh approximation in f32, well inside that.
  EXPECT_LT(ePre, 1.0 / 128);
  EXPECT_LT(eY, 1.0 / 128);
  EXPECT_LT(eD, 1.0 / 128);
  EXPECT_LT(eR, 1.0 / 128);
}

// Codes a (GPU) and b (emulation) of format f, both made with scale `scale` from values whose
// largest magnitude is amax: how many differ, and the worst excess of |decoded a - decoded b| over
// what the GPU's tanh.approx explains: one code step at the larger value plus `slack` x amax (the
// error of the GELU or GELU' itself; GELU' near its zero at x ~ -0.75 is a difference of two O(1)
// terms, so there a value of ~1e-3 amax may move by several of its own small steps, or change sign).
std::pair<int64_t, double> codeExcess(const Tensor& a, const Tensor& b, Fp8Format f, float scale, double amax,
                                      double slack) {
  int64_t diff = 0;
  double worst = 0;
  const int mbits = f == Fp8Format::kE4M3 ? 3 : 2;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const uint8_t x = a.data<uint8_t>()[i], y = b.data<uint8_t>()[i];
    if (x == y) continue;
    ++diff;
    const double vx = fp8ToFloat(x, f) / scale, vy = fp8ToFloat(y, f) / scale;
    const double big = std::max(std::fabs(vx), std::fabs(vy));
    const double step = big * std::ldexp(1.0, -mbits);  // a code step at the larger magnitude (or above)
    worst = std::max(worst, std::fabs(vx - vy) - step - slack * amax);
  }
  return {diff, worst};
}

// GELU(x) and dy * GELU'(pre) computed inside the cast kernels (the GPT MLP's fused casts) against
// the emulation, which computes them with std::tanh in f32 and casts: the GPU's tanh.approx is
// within ~2^-11 relative, so a code may be one step off where a value lands that close to a
// rounding boundary (E4M3's steps are 2^-4 relative; measured 0.1-0.3 % of the codes for GELU,
// 1.1-1.5 % for dGELU on the H100), or further where GELU' is near zero (codeExcess); the scale to ~1e-3,
// the column sums (fc's bias gradient, f32 in another order) to 1e-3 of each column's |sum|. The
// transposed copy is checked bitwise against the GPU's own codes. 256 x 768: the vectorized
// kernel; 40 x 72 (R not a multiple of 16 with the transpose): the one-element kernel; 160 x 136:
// the vectorized kernel with partial row and column tiles (column sums of a half tile).
TEST(CudaFp8, GeluInsideTheCastsMatchesTheEmulation) {
  for (const auto& [R, C] : {std::pair<int64_t, int64_t>{256, 768}, {40, 72}, {160, 136}})
    for (Fp8CastOp op : {Fp8CastOp::kGelu, Fp8CastOp::kDGelu})
      for (DType t : {DType::kBF16, DType::kF32}) {
        const bool dgelu = op == Fp8CastOp::kDGelu;
        const std::string what = std::to_string(R) + "x" + std::to_string(C) + (dgelu ? " dgelu " : " gelu ") +
                                 dtypeName(t);
        const Fp8Format f = dgelu ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
        Fp8Options o;
        o.recipe = Fp8Recipe::kCurrent;
        Fp8State sc(f, o, Device::cpu()), sg(f, o, gpu());
        const Tensor x = wave(R, C, dgelu ? 1e-2f : 4.f, 1, t), pre = wave(R, C, 4.f, 2, DType::kBF16);
        const Tensor xg = x.to(gpu()), preg = pre.to(gpu());
        Tensor qc = Tensor::empty({R, C}, DType::kU8), qtc = Tensor::empty({C, R}, DType::kU8);
        Tensor qg = Tensor::empty({R, C}, DType::kU8, gpu()), qtg = Tensor::empty({C, R}, DType::kU8, gpu());
        Tensor cc = Tensor::empty({C}, DType::kF32), cg = Tensor::empty({C}, DType::kF32, gpu());
        fp8QuantizeFrom(qc, Fp8CastInput{&x, op, dgelu ? &pre : nullptr, dgelu ? &cc : nullptr}, sc, &qtc);
        fp8QuantizeFrom(qg, Fp8CastInput{&xg, op, dgelu ? &preg : nullptr, dgelu ? &cg : nullptr}, sg, &qtg);
        const Tensor a = qg.to(Device::cpu()), at = qtg.to(Device::cpu());
        const std::vector<float> vc = sc.read(), vg = sg.read();
        const auto [diff, excess] = codeExcess(a, qc, f, vc[Fp8State::kScale], vc[Fp8State::kAmax], 2e-3);
        int64_t transposeBad = 0;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c)
            transposeBad += at.data<uint8_t>()[c * R + r] != a.data<uint8_t>()[r * C + c];
        std::printf("%s: %lld of %lld codes differ from the emulation, worst excess %.3g of amax\n", what.c_str(),
                    static_cast<long long>(diff), static_cast<long long>(R * C), excess / vc[Fp8State::kAmax]);
        EXPECT_LE(excess, 0.0) << what;
        EXPECT_LT(diff, R * C / 20) << what;
        EXPECT_EQ(transposeBad, 0) << what;
        EXPECT_NEAR(vg[Fp8State::kScale], vc[Fp8State::kScale], 1e-3 * vc[Fp8State::kScale]) << what;
        if (!dgelu) continue;
        const Tensor cgh = cg.to(Device::cpu());
        for (int64_t c = 0; c < C; ++c) {
          double absSum = 0;
          for (int64_t r = 0; r < R; ++r)
            absSum += std::fabs(valueAt(x, r * C + c) * geluTanhGrad(valueAt(pre, r * C + c)));
          EXPECT_NEAR(cgh.data<float>()[c], cc.data<float>()[c], 1e-3 * absSum + 1e-30) << what << " column " << c;
        }
      }
}

}  // namespace
}  // namespace mt
